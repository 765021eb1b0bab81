"""The commands of signing in with the identity provider: ``login --issuer``, ``credential``, ``whoami``, ``logout``.

The flow and what is kept are :mod:`.oidc_login`'s; here they meet the gateway: the ID token
is checked against it (``/rest/whoami``), and every Kubernetes cluster the user may use gets a
kube context whose user is an exec plugin (``bcs-middleware credential``), so no token is
ever written into the kubeconfig.

Every client command imports this module (the saved sign-in's token is :func:`current_token`);
the flow itself (a loopback HTTP server, the browser, the provider's endpoints) is imported only
by the functions that run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import urllib.parse
from pathlib import Path
from typing import Any

import yaml

from ...core.printable import escape
from . import kubeconfig, settings
from .output import emit
from .rest import ClientError, GatewayClient


def current_token() -> str:
    """The sign-in's ID token, refreshed when about to expire (for the REST commands)."""
    from . import oidc_login

    return oidc_login.fresh_id_token()[0]


def _kubeconfig_path(args: argparse.Namespace) -> Path:
    return Path(args.kubeconfig) if args.kubeconfig else kubeconfig.default_path()


#: Where ``login --issuer`` reads a confidential client's secret (never a flag: command lines are public).
ENV_CLIENT_SECRET = "BCS_OIDC_CLIENT_SECRET"


def _exec_user(server: str) -> dict[str, Any]:
    """The kubeconfig user whose token kubectl asks ``bcs-middleware credential`` for (no token in the file)."""
    from . import oidc_login

    return {"name": f"bcs-oidc@{urllib.parse.urlsplit(server).netloc}", "user": {"exec": {
        "apiVersion": oidc_login.EXEC_API_VERSION, "command": shutil.which("bcs-middleware") or sys.argv[0],
        "args": ["credential"], "interactiveMode": "Never", "provideClusterInfo": False,
        "installHint": "bcs-middleware signs you in: run bcs-middleware login --issuer ..."}}}


def _merge_exec_contexts(client: GatewayClient, clusters: list[str], path: Path) -> list[str]:
    document = kubeconfig.load(path)
    user = _exec_user(client.connection.server)
    names: list[str] = []
    for cluster in clusters:
        path_of = f"/rest/clusters/{urllib.parse.quote(cluster, safe='')}/kubeconfig"
        fragment = yaml.safe_load(client.call("GET", path_of, expect_json=False))
        if client.connection.ca_file:
            kubeconfig.add_ca(fragment, Path(client.connection.ca_file).read_bytes())
        fragment["users"] = [user]
        for context in fragment.get("contexts") or []:
            context["context"]["user"] = user["name"]
        names += kubeconfig.merge(document, fragment)
    kubeconfig.save(path, document)
    return names


def oidc_login_cmd(args: argparse.Namespace) -> int:
    """``login --issuer``: sign in at the identity provider, then keep the gateway and write exec contexts."""
    from . import oidc_login

    try:
        credentials = oidc_login.sign_in(
            issuer=args.issuer, client_id=args.client_id, client_secret=os.environ.get(ENV_CLIENT_SECRET),
            ca_file=args.issuer_ca_file and str(Path(args.issuer_ca_file).absolute()), scopes=args.scopes,
            open_browser=not args.no_browser)
        connection = settings.resolve(args.server, args.ca_file, credentials["id_token"], args.timeout)
        client = GatewayClient(connection)
        me = client.call("GET", "/rest/whoami")  # proves the gateway accepts the token
        clusters = client.call("GET", "/rest/clusters/")
        credentials["server"] = connection.server
        stored = oidc_login.save(credentials)
        settings.write_config(settings.config_path(), server=connection.server, token="",
                              ca_file=connection.ca_file, auth="oidc")
        result: dict[str, Any] = {"server": connection.server, "user": me.get("user_name"),
                                  "groups": ",".join(me.get("groups") or []), "credentials": str(stored)}
        if not args.no_kubeconfig:
            path = _kubeconfig_path(args)
            usable = [c["id"] for c in clusters if c.get("cluster_type") == "k8s"]
            result.update(kubeconfig=str(path), contexts=_merge_exec_contexts(client, usable, path))
        emit(result, args.output)
        return 0
    except ClientError as exc:
        print(f"bcs-middleware: error: {escape(exc)}", file=sys.stderr)
        return exc.exit_code


def credential_cmd(args: argparse.Namespace) -> int:
    """kubectl's exec credential plugin: the ExecCredential of the current sign-in, on stdout."""
    from . import oidc_login

    try:
        print(json.dumps(oidc_login.exec_credential()))
        return 0
    except ClientError as exc:
        print(f"bcs-middleware: error: {escape(exc)}", file=sys.stderr)
        return exc.exit_code


def whoami(client: GatewayClient, args: argparse.Namespace) -> int:
    me = client.call("GET", "/rest/whoami")
    if me.get("expires_at") is not None:
        me["expires_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(float(me["expires_at"])))
    me["groups"] = ",".join(me.get("groups") or [])
    me.pop("extra", None) if args.output == "table" else None
    emit(me, args.output)
    return 0


def logout_cmd(args: argparse.Namespace) -> int:
    """Forget the sign-in and remove the kube contexts ``login`` wrote (those using its exec user)."""
    from . import oidc_login

    saved = settings.read_config(settings.config_path())
    forgotten = oidc_login.forget()
    removed: list[str] = []
    path = _kubeconfig_path(args)
    if saved.get("server") and path.exists():
        user = _exec_user(str(saved["server"]))["name"]
        document = kubeconfig.load(path)
        removed = kubeconfig.remove_user(document, user)
        kubeconfig.save(path, document)
    if saved.get("auth") == "oidc":
        settings.config_path().unlink(missing_ok=True)
    emit({"signed_out": forgotten, "contexts_removed": ",".join(removed)}, args.output)
    return 0

"""What the client subcommands of ``bcs-middleware`` do: one handler per subcommand.

Their command line (names, arguments, ``--help``) is :mod:`.arguments`. Every subcommand
talks to one gateway (``--server``, ``--ca-file``, ``--token``, or
``BCS_SERVER``/``BCS_CA_FILE``/``BCS_TOKEN``, or the config file ``login`` writes),
prints a table or ``-o json|yaml``, and exits 0 on success, 1 on an error (the
server's message on stderr), 2 on a usage error, 3/4/5/6 when the server answered
401/403/404/409.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from . import kubeconfig, settings
from .output import emit
from .rest import EXIT_USAGE, ClientError, GatewayClient

USER_COLUMNS = ("name", "id", "is_super_user", "created_at")
TOKEN_COLUMNS = ("id", "type", "created_at", "expires_at", "last_used_at", "revoked_at")
CLUSTER_COLUMNS = ("id", "project_id", "cluster_type", "permission", "created_at")
PERMISSION_COLUMNS = ("user_name", "permission", "updated_at")
K8S_KINDS = {"mutating": "mutatingwebhookconfigurations", "validating": "validatingwebhookconfigurations"}

Handler = Callable[[GatewayClient, argparse.Namespace], int]


def _q(value: str) -> str:
    return quote(value, safe="")


# -- users and tokens ------------------------------------------------------------------


def _user_id(client: GatewayClient, name: str) -> int:
    return int(client.call("GET", f"/rest/users/{_q(name)}")["id"])


def users_create(client: GatewayClient, args: argparse.Namespace) -> int:
    user = client.call("POST", "/rest/users/", {"user_name": args.name})
    if args.superuser:
        user = client.call("PUT", f"/rest/users/{_q(args.name)}", {"is_super_user": True})
    emit(user, args.output, USER_COLUMNS)
    return 0


def users_get(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("GET", f"/rest/users/{_q(args.name)}"), args.output, USER_COLUMNS)
    return 0


def users_list(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("GET", "/rest/users/"), args.output, USER_COLUMNS)
    return 0


def users_delete(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("DELETE", f"/rest/users/{_q(args.name)}"), args.output,
         (*USER_COLUMNS, "tokens_revoked", "permissions_removed"))
    return 0


def set_superuser(flag: bool) -> Handler:
    def handler(client: GatewayClient, args: argparse.Namespace) -> int:
        emit(client.call("PUT", f"/rest/users/{_q(args.name)}", {"is_super_user": flag}), args.output, USER_COLUMNS)
        return 0

    return handler


def tokens_create(client: GatewayClient, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {}
    if args.expires_in is not None:
        body["expires_in"] = args.expires_in
    token = client.call("POST", f"/rest/users/{_user_id(client, args.user)}/tokens", body)
    # The one time the server hands the value out: print it where it was asked for.
    emit(token, args.output, ("id", "user_token", "expires_at"))
    return 0


def tokens_list(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("GET", f"/rest/users/{_user_id(client, args.user)}/tokens"), args.output, TOKEN_COLUMNS)
    return 0


def tokens_revoke(client: GatewayClient, args: argparse.Namespace) -> int:
    path = f"/rest/users/{_user_id(client, args.user)}/tokens/{args.token_id}"
    emit(client.call("DELETE", path), args.output, TOKEN_COLUMNS)
    return 0


# -- clusters and permissions ----------------------------------------------------------------


def clusters_create(client: GatewayClient, args: argparse.Namespace) -> int:
    body = {"id": args.cluster, "project_id": args.project, "cluster_type": args.type}
    emit(client.call("POST", "/rest/clusters/bcs", body), args.output, (*CLUSTER_COLUMNS[:3], "created_at"))
    return 0


def clusters_get(client: GatewayClient, args: argparse.Namespace) -> int:
    cluster = client.call("GET", f"/rest/clusters/{_q(args.cluster)}")
    if args.output == "table":
        cluster = {**cluster, "credentials": _credential_summary(client, args.cluster)}
    emit(cluster, args.output)
    return 0


def _credential_summary(client: GatewayClient, cluster: str) -> str:
    try:
        status = client.call("GET", f"/rest/clusters/{_q(cluster)}/credentials")
    except ClientError as exc:
        if exc.status == 403:
            return "(needs edit)"
        raise
    if not status.get("reported"):
        return "not reported yet (is its kube-agent running?)"
    return f"reported {status.get('updated_at')}: {', '.join(status.get('server_addresses') or [])}"


def clusters_list(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("GET", "/rest/clusters/"), args.output, CLUSTER_COLUMNS)
    return 0


def clusters_delete(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("DELETE", f"/rest/clusters/{_q(args.cluster)}"), args.output,
         ("id", "project_id", "cluster_type", "deleted"))
    return 0


def permissions_list(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("GET", f"/rest/clusters/{_q(args.cluster)}/permissions"), args.output, PERMISSION_COLUMNS)
    return 0


def permissions_set(client: GatewayClient, args: argparse.Namespace) -> int:
    path = f"/rest/clusters/{_q(args.cluster)}/permissions/{_q(args.user)}"
    emit(client.call("PUT", path, {"permission": args.permission}), args.output, PERMISSION_COLUMNS)
    return 0


def permissions_remove(client: GatewayClient, args: argparse.Namespace) -> int:
    path = f"/rest/clusters/{_q(args.cluster)}/permissions/{_q(args.user)}"
    emit(client.call("DELETE", path), args.output, PERMISSION_COLUMNS)
    return 0


# -- register tokens -----------------------------------------------------------------------------


def _register_path(args: argparse.Namespace) -> str:
    return f"/rest/clusters/{_q(args.cluster)}/register_tokens"


def register_create(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("POST", _register_path(args)), args.output, ("cluster_id", "token"))
    return 0


def register_rotate(client: GatewayClient, args: argparse.Namespace) -> int:
    # Revoke first: the old token must stop working whatever happens next.
    client.call("DELETE", _register_path(args))
    emit(client.call("POST", _register_path(args)), args.output, ("cluster_id", "token"))
    return 0


def register_get(client: GatewayClient, args: argparse.Namespace) -> int:
    found = client.call("GET", _register_path(args))
    if not args.show_token:
        found = {k: v for k, v in found.items() if k != "token"}
    emit(found, args.output)
    return 0


def register_revoke(client: GatewayClient, args: argparse.Namespace) -> int:
    emit(client.call("DELETE", _register_path(args)), args.output)
    return 0


# -- admission webhooks ------------------------------------------------------------------------------


def _documents(path: str) -> list[Any]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as exc:
        raise ClientError(f"cannot read {path}: {exc.strerror}", exit_code=EXIT_USAGE) from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError:
        raise ClientError(f"{path}: not valid JSON or YAML", exit_code=EXIT_USAGE) from None
    # The admission filter's definitions file ({"admissionwebhooks": [...], "clusters": {...}}, or a
    # list) holds the same definitions: take them from it as they are.
    expanded: list[Any] = []
    for document in documents:
        if isinstance(document, list):
            expanded.extend(document)
        elif isinstance(document, dict) and "apiVersion" not in document and "admissionwebhooks" in document:
            expanded.extend(document.get("admissionwebhooks") or [])
        else:
            expanded.append(document)
    if not expanded or not all(isinstance(d, dict) for d in expanded):
        raise ClientError(f"{path}: expected one or more definition objects", exit_code=EXIT_USAGE)
    return expanded


def _k8s_item(args: argparse.Namespace) -> str:
    kind, sep, name = args.name.partition("/")
    resource = K8S_KINDS.get(kind.lower().removesuffix("webhookconfigurations").removesuffix("webhookconfiguration"))
    if not sep or not name or resource is None:
        raise ClientError("with --cluster, name a configuration as mutating/NAME or validating/NAME",
                          exit_code=EXIT_USAGE)
    return f"/rest/clusters/{_q(args.cluster)}/admissionwebhookconfigurations/{resource}/{_q(name)}"


def _webhook_rows(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for item in items:
        meta = item.get("metadata") or {}
        hooks = item.get("webhooks") or item.get("admissionWebhooks") or []
        ref = item.get("resourcesRef") or {}
        rows.append({"kind": item.get("kind"), "name": meta.get("name"),
                     "applies_to": f"{ref.get('operation')} {ref.get('kind')}" if ref else "rules",
                     "webhooks": ", ".join(str(h.get("name")) for h in hooks if isinstance(h, dict))})
    return rows


def webhooks_list(client: GatewayClient, args: argparse.Namespace) -> int:
    path = (f"/rest/clusters/{_q(args.cluster)}/admissionwebhookconfigurations" if args.cluster
            else "/rest/admissionwebhooks")
    items = client.call("GET", path)["items"]
    emit(_webhook_rows(items) if args.output == "table" else items, args.output)
    return 0


def webhooks_get(client: GatewayClient, args: argparse.Namespace) -> int:
    path = _k8s_item(args) if args.cluster else f"/rest/admissionwebhooks/{_q(args.name)}"
    found = client.call("GET", path)
    emit(found, "yaml" if args.output == "table" else args.output)
    return 0


def webhooks_create(client: GatewayClient, args: argparse.Namespace) -> int:
    path = (f"/rest/clusters/{_q(args.cluster)}/admissionwebhookconfigurations" if args.cluster
            else "/rest/admissionwebhooks")
    created = [client.call("POST", path, document) for document in _documents(args.filename)]
    emit(_webhook_rows(created) if args.output == "table" else created, args.output)
    return 0


def webhooks_delete(client: GatewayClient, args: argparse.Namespace) -> int:
    path = _k8s_item(args) if args.cluster else f"/rest/admissionwebhooks/{_q(args.name)}"
    emit(_webhook_rows([client.call("DELETE", path)]), args.output)
    return 0


# -- kubeconfig and login ----------------------------------------------------------------------------


def _merge_clusters(client: GatewayClient, clusters: list[str], path: Path) -> list[str]:
    document = kubeconfig.load(path)
    names: list[str] = []
    for cluster in clusters:
        fragment = yaml.safe_load(client.call("GET", f"/rest/clusters/{_q(cluster)}/kubeconfig", expect_json=False))
        if client.connection.ca_file:
            kubeconfig.add_ca(fragment, Path(client.connection.ca_file).read_bytes())
        names += kubeconfig.merge(document, fragment)
    kubeconfig.save(path, document)
    return names


def _kubeconfig_path(args: argparse.Namespace) -> Path:
    return Path(args.kubeconfig) if args.kubeconfig else kubeconfig.default_path()


def kubeconfig_cmd(client: GatewayClient, args: argparse.Namespace) -> int:
    path = _kubeconfig_path(args)
    names = _merge_clusters(client, [args.cluster], path)
    emit({"kubeconfig": str(path), "contexts": names}, args.output)
    return 0


def login(client: GatewayClient, args: argparse.Namespace) -> int:
    clusters = client.call("GET", "/rest/clusters/")  # also proves the server, CA and token work
    conn = client.connection
    config = settings.config_path()
    settings.write_config(config, server=conn.server, token=conn.token, ca_file=conn.ca_file)
    result: dict[str, Any] = {"server": conn.server, "config": str(config)}
    if not args.no_kubeconfig:
        path = _kubeconfig_path(args)
        usable = [c["id"] for c in clusters if c.get("cluster_type") == "k8s"]
        result.update(kubeconfig=str(path), contexts=_merge_clusters(client, usable, path))
    emit(result, args.output)
    return 0

"""The client subcommands of ``bcs-middleware`` and their ``--help``.

Every subcommand talks to one gateway (``--server``, ``--ca-file``, ``--token``, or
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

from ...core.printable import escape
from . import kubeconfig, sessions, settings, signin
from .output import FORMATS, emit
from .rest import EXIT_USAGE, ClientError, GatewayClient

USER_COLUMNS = ("name", "id", "is_super_user", "created_at")
TOKEN_COLUMNS = ("id", "type", "created_at", "expires_at", "last_used_at", "revoked_at")
CLUSTER_COLUMNS = ("id", "project_id", "cluster_type", "permission", "created_at")
PERMISSION_COLUMNS = ("user_name", "permission", "updated_at")
K8S_KINDS = {"mutating": "mutatingwebhookconfigurations", "validating": "validatingwebhookconfigurations"}

Handler = Callable[[GatewayClient, argparse.Namespace], int]


def _q(value: str) -> str:
    return quote(value, safe="")


def _connection_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("gateway connection")
    group.add_argument("--server", metavar="URL",
                       help=f"the gateway's https:// URL (default: ${settings.ENV_SERVER}, then the login config)")
    group.add_argument("--ca-file", metavar="PEM",
                       help=f"the CA the gateway's certificate chains to (default: ${settings.ENV_CA_FILE}, then "
                            "the login config, then the system CAs)")
    group.add_argument("--token", help=f"your bearer token (default: ${settings.ENV_TOKEN}, then the login config; "
                                       "prefer the environment: command lines are visible to other users)")
    group.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS",
                       help="give up on a call after this long (default 30)")
    group.add_argument("-o", "--output", choices=FORMATS, default="table",
                       help="table (default), json or yaml")
    return common


def _run(handler: Handler) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        try:
            connection = settings.resolve(args.server, args.ca_file, args.token, args.timeout,
                                          signed_in=signin.current_token)
            return handler(GatewayClient(connection), args)
        except ClientError as exc:
            print(f"bcs-middleware: error: {escape(exc)}", file=sys.stderr)  # the server's words: no escapes
            return exc.exit_code

    return run


def _leaf(sub: Any, name: str, handler: Handler, help_text: str, common: argparse.ArgumentParser,
          **kw: Any) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text[0].upper()
                                                     + help_text[1:] + ".", parents=[common], **kw)
    parser.set_defaults(func=_run(handler))
    return parser


def _group(sub: Any, name: str, help_text: str) -> Any:
    parser = sub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
    return parser.add_subparsers(dest=f"{name}_command", required=True, metavar="COMMAND")


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


def _set_superuser(flag: bool) -> Handler:
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


def _login_dispatch(args: argparse.Namespace) -> int:
    return signin.oidc_login_cmd(args) if args.issuer else _run(login)(args)


def register(sub: Any) -> None:
    """Add the client subcommands to the ``bcs-middleware`` parser's subparsers."""
    common = _connection_options()
    _register_users(sub, common)
    _register_tokens(sub, common)
    _register_clusters(sub, common)
    sessions.register(sub, _leaf, _group, common)
    _register_register_token(sub, common)
    _register_webhooks(sub, common)
    _register_kubeconfig_and_login(sub, common)


def _register_users(sub: Any, common: argparse.ArgumentParser) -> None:
    """``users``: create, get, list, delete, promote, demote."""
    users = _group(sub, "users", "manage gateway users (superusers only)")
    p = _leaf(users, "create", users_create, "create a user", common)
    p.add_argument("name", help="the user name (letters, digits, '.', '_', '@', '-')")
    p.add_argument("--superuser", action="store_true", help="make the new user a superuser")
    p = _leaf(users, "get", users_get, "show a user", common)
    p.add_argument("name", help="the user name")
    _leaf(users, "list", users_list, "list every user", common)
    p = _leaf(users, "delete", users_delete, "delete a user, their tokens and their cluster permissions", common)
    p.add_argument("name", help="the user name")
    p = _leaf(users, "promote", _set_superuser(True), "make a user a superuser", common)
    p.add_argument("name", help="the user name")
    p = _leaf(users, "demote", _set_superuser(False), "make a superuser an ordinary user", common)
    p.add_argument("name", help="the user name")


def _register_tokens(sub: Any, common: argparse.ArgumentParser) -> None:
    """``tokens``: create, list, revoke."""
    tokens = _group(sub, "tokens", "manage users' API tokens (superusers only)")
    p = _leaf(tokens, "create", tokens_create, "issue a token for a user; its value is shown this once", common)
    p.add_argument("user", help="the user name")
    p.add_argument("--expires-in", type=int, metavar="SECONDS", help="the token expires after this long")
    p = _leaf(tokens, "list", tokens_list, "list a user's tokens (never their values)", common)
    p.add_argument("user", help="the user name")
    p = _leaf(tokens, "revoke", tokens_revoke, "revoke one of a user's tokens", common)
    p.add_argument("user", help="the user name")
    p.add_argument("token_id", type=int, help="the token's id (see tokens list)")


def _register_clusters(sub: Any, common: argparse.ArgumentParser) -> None:
    """``clusters``: create, get, list, delete, and ``permissions`` list, set, remove."""
    clusters = _group(sub, "clusters", "register, inspect and delete clusters")
    p = _leaf(clusters, "create", clusters_create, "register a cluster; you get edit on it", common)
    p.add_argument("cluster", help="the cluster id, e.g. BCS-K8S-001")
    p.add_argument("--project", required=True, help="the project id it belongs to")
    p.add_argument("--type", choices=("k8s", "mesos"), default="k8s", help="k8s (default) or mesos")
    p = _leaf(clusters, "get", clusters_get, "show a cluster (and, with edit, its kube-agent's last report)", common)
    p.add_argument("cluster", help="the cluster id")
    _leaf(clusters, "list", clusters_list, "list the clusters you may use, with your permission on each", common)
    p = _leaf(clusters, "delete", clusters_delete, "delete a cluster with its register token, credentials, "
              "permissions and admission configurations (needs edit)", common)
    p.add_argument("cluster", help="the cluster id")
    perms = clusters.add_parser("permissions", help="who may use (view) or manage (edit) a cluster",
                                description="Who may use (view) or manage (edit) a cluster; needs edit.")
    perms_sub = perms.add_subparsers(dest="permissions_command", required=True, metavar="COMMAND")
    p = _leaf(perms_sub, "list", permissions_list, "list the permissions on a cluster", common)
    p.add_argument("cluster", help="the cluster id")
    p = _leaf(perms_sub, "set", permissions_set, "give a user view or edit on a cluster", common)
    p.add_argument("cluster", help="the cluster id")
    p.add_argument("user", help="the user name")
    p.add_argument("permission", choices=("view", "edit"), help="view: use the cluster; edit: also manage it")
    p = _leaf(perms_sub, "remove", permissions_remove, "take a user's permission on a cluster away", common)
    p.add_argument("cluster", help="the cluster id")
    p.add_argument("user", help="the user name")


def _register_register_token(sub: Any, common: argparse.ArgumentParser) -> None:
    """``register-token``: create, rotate, get, revoke."""
    reg = _group(sub, "register-token", "the token a cluster's kube-agent reports with (needs edit)")
    p = _leaf(reg, "create", register_create, "create the cluster's register token and print it", common)
    p.add_argument("cluster", help="the cluster id")
    p = _leaf(reg, "rotate", register_rotate,
              "revoke the register token and create a new one (update the kube-agent with it)", common)
    p.add_argument("cluster", help="the cluster id")
    p = _leaf(reg, "get", register_get, "show when the register token was created", common)
    p.add_argument("cluster", help="the cluster id")
    p.add_argument("--show-token", action="store_true", help="print the token itself too")
    p = _leaf(reg, "revoke", register_revoke, "revoke the register token; the kube-agent can no longer report",
              common)
    p.add_argument("cluster", help="the cluster id")


def _register_webhooks(sub: Any, common: argparse.ArgumentParser) -> None:
    """``webhooks``: list, get, create, delete (with ``--cluster``: a cluster's configurations)."""
    hooks = _group(sub, "webhooks", "admission webhook definitions: gateway-wide bcs definitions (superusers), "
                   "or with --cluster a cluster's Kubernetes webhook configurations (edit on it)")
    cluster_help = ("a cluster's Kubernetes Mutating/ValidatingWebhookConfigurations instead of the "
                    "gateway-wide bcs definitions")
    p = _leaf(hooks, "list", webhooks_list, "list definitions", common)
    p.add_argument("--cluster", help=cluster_help)
    p = _leaf(hooks, "get", webhooks_get, "show one definition", common)
    p.add_argument("name", help="a bcs definition's name; with --cluster, mutating/NAME or validating/NAME")
    p.add_argument("--cluster", help=cluster_help)
    p = _leaf(hooks, "create", webhooks_create, "create definitions from a JSON or YAML file", common)
    p.add_argument("-f", "--filename", required=True, metavar="FILE",
                   help="the file ('-' for stdin); YAML may hold several documents, and an admission "
                        "definitions file ('admissionwebhooks:' list) is read as its definitions")
    p.add_argument("--cluster", help=cluster_help)
    p = _leaf(hooks, "delete", webhooks_delete, "delete one definition", common)
    p.add_argument("name", help="a bcs definition's name; with --cluster, mutating/NAME or validating/NAME")
    p.add_argument("--cluster", help=cluster_help)


def _register_kubeconfig_and_login(sub: Any, common: argparse.ArgumentParser) -> None:
    """``kubeconfig``, ``login``, ``whoami``, ``logout`` and the ``credential`` plugin."""
    kube_help = ("the kubeconfig file to merge into (default: the first file of $KUBECONFIG, "
                 "else ~/.kube/config); other contexts are kept")
    p = _leaf(sub, "kubeconfig", kubeconfig_cmd,
              "merge a context bcs-CLUSTER for one cluster into your kubeconfig", common)
    p.add_argument("cluster", help="the cluster id")
    p.add_argument("--kubeconfig", metavar="FILE", help=kube_help)
    p = _leaf(sub, "login", login, "check and save the gateway, CA and token (or, with --issuer, sign in at the "
              "identity provider), and merge a kubeconfig context bcs-CLUSTER for every Kubernetes cluster you "
              "may use", common)
    p.set_defaults(func=_login_dispatch)
    p.add_argument("--kubeconfig", metavar="FILE", help=kube_help)
    p.add_argument("--no-kubeconfig", action="store_true", help="only save the gateway, CA and token")
    sign_in = p.add_argument_group("sign in with the identity provider (OpenID Connect, PKCE)")
    sign_in.add_argument("--issuer", metavar="URL", help="the provider's issuer URL (one of the gateway's "
                         "authentication configuration); contexts then get tokens from 'bcs-middleware credential'")
    sign_in.add_argument("--client-id", default="bcs-middleware", help="the client id registered at the provider "
                         f"(an audience the gateway accepts); a secret, if any, from ${signin.ENV_CLIENT_SECRET}")
    sign_in.add_argument("--issuer-ca-file", metavar="PEM", help="the CA of the provider's certificate")
    sign_in.add_argument("--scopes", default="openid email profile offline_access",
                         help="the scopes asked for (default: openid email profile offline_access)")
    sign_in.add_argument("--no-browser", action="store_true", help="print the sign-in URL instead of opening it")
    _leaf(sub, "whoami", signin.whoami,
          "show who the gateway says you are: name, groups, how you signed in, until when", common)
    p = sub.add_parser("logout", help="forget the identity-provider sign-in and remove the contexts login wrote",
                       description="Forget the identity-provider sign-in and remove the contexts login wrote.")
    p.add_argument("--kubeconfig", metavar="FILE", help=kube_help)
    p.add_argument("-o", "--output", choices=FORMATS, default="table", help="table (default), json or yaml")
    p.set_defaults(func=signin.logout_cmd)
    p = sub.add_parser("credential", help="kubectl exec credential plugin: print the current sign-in's token",
                       description="kubectl exec credential plugin (client.authentication.k8s.io/v1): print an "
                                   "ExecCredential with the current ID token, refreshed when it is about to expire.")
    p.set_defaults(func=signin.credential_cmd)

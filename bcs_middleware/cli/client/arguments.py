"""The client subcommands' command line: their names, arguments and ``--help``, one function per group.

What each subcommand does is in :mod:`.commands` (the handlers); here each is given its place in
the ``bcs-middleware`` parser, with the gateway connection options every one of them takes
(:func:`_connection_options`) and the wrapper that runs it (:func:`_run`: resolve the connection,
call the handler, turn a :class:`~.rest.ClientError` into its exit code).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

from ...core.printable import escape
from . import sessions, settings, signin
from .commands import (
    Handler,
    clusters_create,
    clusters_delete,
    clusters_get,
    clusters_list,
    kubeconfig_cmd,
    login,
    permissions_list,
    permissions_remove,
    permissions_set,
    register_create,
    register_get,
    register_revoke,
    register_rotate,
    set_superuser,
    tokens_create,
    tokens_list,
    tokens_revoke,
    users_create,
    users_delete,
    users_get,
    users_list,
    webhooks_create,
    webhooks_delete,
    webhooks_get,
    webhooks_list,
)
from .output import FORMATS
from .rest import ClientError, GatewayClient


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
    p = _leaf(users, "promote", set_superuser(True), "make a user a superuser", common)
    p.add_argument("name", help="the user name")
    p = _leaf(users, "demote", set_superuser(False), "make a superuser an ordinary user", common)
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

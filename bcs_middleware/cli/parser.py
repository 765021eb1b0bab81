"""The ``bcs-middleware`` command line: its sub-commands and their flags (nothing runs here).

A command line builds only the parser of its own command (:data:`FAMILIES`): a client command
never imports the server, the kube-agent, the certificate tools, nor the identity-provider sign-in
it does not run; ``--help``, a bare or an unknown command build them all.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .. import __version__

Subparsers = argparse._SubParsersAction

#: The registration that adds each top-level command (``tests/cli/test_help.py`` checks it
#: against the whole parser, so a new command cannot be left out).
FAMILIES: dict[str, str] = {
    "serve": "serve", "certs": "certs", "kube-agent": "kube-agent", "keygen": "keygen",
    "rotate-admin-token": "instances", "set-shared-ca": "instances",
    **dict.fromkeys(("users", "tokens", "clusters", "sessions", "register-token", "webhooks", "kubeconfig",
                     "login", "whoami", "logout", "credential"), "client"),
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``command`` alone (a name of :data:`FAMILIES`), or of every command (``None``)."""
    parser = argparse.ArgumentParser(prog="bcs-middleware", description="Multi-cluster container API gateway.")
    parser.add_argument("--version", action="version", version=f"bcs-middleware {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    family = FAMILIES.get(command or "")
    for name, add in _REGISTRATIONS.items():
        if family is None or family == name:
            add(sub)
    return parser


def _add_serve(sub: Subparsers) -> None:
    from . import serve_arguments

    serve_arguments.register(sub)


def _add_certs(sub: Subparsers) -> None:
    from . import certs as cli_certs

    certs = sub.add_parser("certs", help="write TLS certificates (gateway, webhook service, client)",
                           description="Write TLS certificates signed by a CA: for the gateway, for an admission "
                                       "webhook's Service (prints its caBundle), or a client certificate.")
    cli_certs.configure_parser(certs)
    certs.set_defaults(func=cli_certs.run)


def _add_kube_agent(sub: Subparsers) -> None:
    from . import kube_agent

    agent = sub.add_parser("kube-agent", help="report this cluster's apiserver credentials to a gateway",
                           description=kube_agent.DESCRIPTION, epilog=kube_agent.ENVIRONMENT,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    kube_agent.configure_parser(agent)
    agent.set_defaults(func=kube_agent.run)


def _add_keygen(sub: Subparsers) -> None:
    from .keygen import cmd_keygen

    keygen = sub.add_parser("keygen", help="print a new secret key (for BCS_SECRET_KEY / secret_key)",
                            description="Print a new Fernet key. Credentials are encrypted at rest with it "
                                        "(env BCS_SECRET_KEY or the ini's secret_key; several comma-separated "
                                        "keys: the first encrypts, all decrypt, for rotation).")
    keygen.set_defaults(func=cmd_keygen)


def _add_instances(sub: Subparsers) -> None:
    from . import instances

    instances.register(sub)


def _add_client(sub: Subparsers) -> None:
    from .client import arguments

    arguments.register(sub)


#: In the order ``--help`` lists them.
_REGISTRATIONS: dict[str, Callable[[Subparsers], None]] = {
    "serve": _add_serve, "certs": _add_certs, "kube-agent": _add_kube_agent, "keygen": _add_keygen,
    "instances": _add_instances, "client": _add_client,
}

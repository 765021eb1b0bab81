"""A command imports what it runs: a client command never loads the server, the agent or the sign-in flow.

Measured with ``python -X importtime`` in a fresh interpreter, as a person's shell starts it.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bcs_middleware.cli.parser import FAMILIES, build_parser

#: What a REST client command has no use for: the identity-provider sign-in flow (and what it
#: brings: a loopback HTTP server, the browser), the server and its configuration, the kube-agent
#: and its tunnel, the certificate tools, the JWT/CEL machinery, the server's libraries.
NOT_FOR_A_CLIENT_COMMAND = (
    "bcs_middleware.cli.client.oidc_login", "webbrowser", "http.server",
    "bcs_middleware.cli.serve", "bcs_middleware.cli.serve_arguments", "bcs_middleware.cli.serve_config",
    "bcs_middleware.cli.kube_agent", "bcs_middleware.cli.certs", "bcs_middleware.cli.instances",
    "bcs_middleware.pki", "bcs_middleware.agent_tunnel", "bcs_middleware.authn", "bcs_middleware.compose",
    "bcs_middleware.serving", "bcs_middleware.audit", "gunicorn", "gevent", "jwt", "cel_expr_python", "sqlalchemy",
    "cryptography", "paste",
)


@pytest.fixture()
def refused_port() -> Iterator[int]:
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))  # bound, never listening: a connection is refused at once
        yield bound.getsockname()[1]


def _imported(args: list[str], home: Path) -> set[str]:
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "bcs_middleware.cli.main", *args],
                          capture_output=True, text=True, timeout=60, cwd=home,
                          env={**os.environ, "HOME": str(home), "BCS_TOKEN": "", "BCS_SERVER": ""})
    return {m.group(1) for m in re.finditer(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)$", done.stderr, re.M)}


def _loaded(modules: set[str], name: str) -> bool:
    return any(m == name or m.startswith(name + ".") for m in modules)


@pytest.mark.parametrize("command", [["clusters", "list"], ["users", "get", "alice"], ["whoami"],
                                     ["webhooks", "list"], ["sessions", "list"]])
def test_a_client_command_imports_no_sign_in_flow_and_no_server(command: list[str], refused_port: int,
                                                                tmp_path: Path) -> None:
    modules = _imported([*command, "--server", f"https://127.0.0.1:{refused_port}", "--token", "x"], tmp_path)
    assert "bcs_middleware.cli.client.commands" in modules  # the command did run
    loaded = [name for name in NOT_FOR_A_CLIENT_COMMAND if _loaded(modules, name)]
    assert not loaded, f"{' '.join(command)} imported {loaded}"


def test_the_commands_that_sign_in_do_import_the_flow(tmp_path: Path) -> None:
    # The other side of the check above: the flow is imported where it runs.
    assert "bcs_middleware.cli.client.oidc_login" in _imported(["credential"], tmp_path)
    assert "bcs_middleware.cli.client.oidc_login" in _imported(["logout"], tmp_path)


def test_the_command_table_names_every_command_of_the_whole_parser() -> None:
    def choices(parser: argparse.ArgumentParser) -> set[str]:
        found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return set(found[0].choices)

    assert choices(build_parser()) == set(FAMILIES)
    for command, family in FAMILIES.items():
        alone = choices(build_parser(command))
        assert command in alone
        assert alone == {name for name, other in FAMILIES.items() if other == family}

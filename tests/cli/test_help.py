"""`bcs-middleware --help` and every subcommand's: each command is described, each option explained."""

from __future__ import annotations

import argparse
import subprocess
from collections.abc import Iterator

import pytest

from bcs_middleware.cli.parser import build_parser
from tests.support.servers import BIN


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _walk(child, f"{path} {name}")


def test_every_command_server_and_client_has_a_description_and_every_option_help() -> None:
    missing = []
    paths = []
    for path, parser in _walk(build_parser(), "bcs-middleware"):
        paths.append(path)
        if not parser.description:
            missing.append(f"{path}: no description")
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            if not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)
    # The server side too, not only the client.
    for command in ("serve", "kube-agent", "certs", "keygen"):
        assert f"bcs-middleware {command}" in paths, command


def test_help_runs_for_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    """What a person types: each `--help` exits 0 and shows the command's description."""
    for path, parser in _walk(build_parser(), "bcs-middleware"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*path.split()[1:], "--help"])
        assert exited.value.code == 0, path
        shown = " ".join(capsys.readouterr().out.split())
        assert " ".join((parser.description or "").split())[:40] in shown, path


def test_the_installed_command_shows_help() -> None:
    result = subprocess.run([str(BIN / "bcs-middleware"), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "serve" in result.stdout and "login" in result.stdout


def test_a_bare_command_prints_the_help_and_the_usage_status() -> None:
    """`bcs-middleware` alone: what it can do (every command), not a traceback or one terse line."""
    result = subprocess.run([str(BIN / "bcs-middleware")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result
    assert result.stderr.startswith("usage: bcs-middleware")
    for command in ("serve", "kube-agent", "certs", "keygen", "login", "rotate-admin-token", "set-shared-ca"):
        assert command in result.stderr, command
    assert "Multi-cluster container API gateway" in result.stderr and "Traceback" not in result.stderr

"""The ``bcs-middleware`` command: ``serve``, ``certs``, ``kube-agent``, ``keygen`` and the client
commands (:mod:`.parser` has them all; ``serve`` is :mod:`.serve`).

This module is the entry point only: it decides whether the command runs on gevent and, if so,
patches before anything else is imported, then parses and dispatches.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ..core.errors import ConfigError


def runs_on_gevent(argv: Sequence[str]) -> bool:
    """Will this command line run ``serve`` on the gevent worker (the default), or a tunnelling
    ``kube-agent`` on gevent (its default ``--io``)?"""
    if argv and argv[0] == "kube-agent":
        return "--tunnel" in argv and not any(
            arg == "--io=threads" or (arg == "--io" and argv[i + 1:i + 2] == ["threads"])
            for i, arg in enumerate(argv))
    if not argv or argv[0] != "serve":
        return False
    from . import serve_config

    chosen = serve_config.option_value(argv, "--worker-class") or serve_config.ini_worker_class(argv)
    return (chosen or "gevent") == "gevent"


def patch_for_gevent() -> None:
    """Monkey-patch now, in the master, before the application's modules are imported.

    gunicorn's gevent worker patches only in each worker, after the master has imported
    the application (the gateway is built once in the master): a module that took
    ``ssl.SSLContext`` by name by then (urllib3) keeps the unpatched class, and building a
    context with it recurses forever. Patched here, every module sees gevent's classes;
    the worker's own patching then changes nothing.
    """
    from gevent import monkey

    monkey.patch_all()


def main(argv: Sequence[str] | None = None) -> int:
    if runs_on_gevent(sys.argv[1:] if argv is None else argv):
        patch_for_gevent()  # before the parser imports the commands (and urllib3)
    from .parser import build_parser

    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)  # only what this command runs is imported
    args = parser.parse_args(argv)
    if args.command is None:
        # A bare command: what it can do, on stderr, and the usage-error status (as argparse's own).
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args.func(args))
    except ConfigError as exc:
        print(f"bcs-middleware: configuration error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

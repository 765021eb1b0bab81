"""The outbound stack sits below the layers: nothing under ``upstream/`` imports from above it.

``bcs_middleware/upstream/`` (transport, codec, pool, address policy, cluster reads) is
used by the middleware layers, the admission client, the RBAC sync and the gateway
assembly; an import the other way (say ``upstream/cluster_api.py`` taking
``CachedDirectory`` from ``middleware/routing.py``) ties the stack to one of its users.
The cluster directory lives in ``bcs_middleware/clusters.py`` for that reason.
"""

from __future__ import annotations

import ast
from pathlib import Path

import bcs_middleware

PACKAGE = Path(bcs_middleware.__file__).resolve().parent
UPSTREAM = PACKAGE / "upstream"
#: Packages and modules of ``bcs_middleware`` that sit above the outbound stack.
ABOVE = ("middleware", "admission", "rbac", "api", "gateway", "cli", "mesos", "scheduler", "client",
         "kube_agent", "driver")


def _imported(source: str, module: str) -> list[tuple[int, str]]:
    """``(line, absolute module)`` of every ``bcs_middleware`` import in the source of
    ``module`` (dotted), lazy ones inside functions included."""
    parts = module.split(".")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(parts[: len(parts) - node.level])
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.append((node.lineno, name))
            # ``from .. import middleware`` names the module in the alias
            found += [(node.lineno, f"{name}.{alias.name}") for alias in node.names]
    return [(line, name) for line, name in found if name.startswith("bcs_middleware")]


def _upward(name: str) -> bool:
    head = name.split(".")[1] if "." in name else ""
    return head in ABOVE


def test_no_module_under_upstream_imports_from_above() -> None:
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {name}"
        for path in sorted(UPSTREAM.rglob("*.py"))
        for line, name in _imported(path.read_text(), _module(path))
        if _upward(name)
    ]
    assert offenders == []


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_the_walk_sees_relative_and_lazy_imports() -> None:
    # The check must be able to fail: the import this package used to have, made lazily.
    source = "from ..errors import BadGateway\n\ndef f():\n    from ..middleware.routing import CachedDirectory\n"
    upward = [name for _, name in _imported(source, "bcs_middleware.upstream.cluster_api") if _upward(name)]
    assert upward == ["bcs_middleware.middleware.routing", "bcs_middleware.middleware.routing.CachedDirectory"]

"""The package's layers only point down, and no modules import each other in a circle.

Every module of ``bcs_middleware`` has a floor in :data:`FLOORS` (a test fails for a module
that has none, so a new module is placed deliberately). A module may import modules on its
own floor or below, never above; lazy imports inside functions count, and so does
``from package import module``. Package faces (``__init__.py``) import nothing.

=====  ==========================================================================
floor  what
=====  ==========================================================================
0      ``core``, ``telemetry``: values and pure decisions; no I/O of their own
1      models: admission definitions and reviews, the RBAC grant model, the bcs v4
       conversion, the audit policy (pure, on ``core``)
2      adapters: ``store`` (SQL), ``outbound`` (HTTP client), ``discovery``
       (ZooKeeper), ``pki`` (certificates), ``agent_tunnel`` (agent connections)
3      services: the admission engine and webhook client, the RBAC sync, clusters
       (directory, reads, permissions)
4      ``layers`` (WSGI middleware) and ``apps`` (terminal WSGI applications)
5      ``serving``: gunicorn workers and hooks
6      ``compose``: the gateway and driver compositions
7      ``cli``: the command
=====  ==========================================================================
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bcs_middleware

PACKAGE = Path(bcs_middleware.__file__).resolve().parent

#: Module (or package prefix) -> floor; the longest matching prefix wins.
FLOORS: dict[str, int] = {
    "bcs_middleware": 0,
    "bcs_middleware.core": 0,
    "bcs_middleware.telemetry": 0,
    "bcs_middleware.admission.answers": 1,
    "bcs_middleware.admission.definitions": 1,
    "bcs_middleware.admission.equivalence": 1,
    "bcs_middleware.admission.matching": 1,
    "bcs_middleware.admission.options": 1,
    "bcs_middleware.admission.outcome": 1,
    "bcs_middleware.admission.review": 1,
    "bcs_middleware.admission.webhook_failure": 1,
    "bcs_middleware.rbac.model": 1,
    "bcs_middleware.scheduler": 1,
    "bcs_middleware.audit": 1,
    "bcs_middleware.authn": 1,
    "bcs_middleware.authn.claim_sources": 2,
    "bcs_middleware.authn.fetch": 2,
    "bcs_middleware.authn.keys": 2,
    "bcs_middleware.authn.service": 3,
    "bcs_middleware.audit.sink": 2,
    # Session recording (issue 28): asciicast and the stream decoders are pure, the stores
    # adapters, the recorder (policy, bounded buffer, writer) a service the WSGI layer uses.
    "bcs_middleware.recording": 1,
    "bcs_middleware.recording.directory": 2,
    "bcs_middleware.recording.recorder": 3,
    # Per-user limits: the settings and fair queuing are pure models; the table shared by a
    # server's workers is a file they map (I/O).
    "bcs_middleware.limits": 1,
    "bcs_middleware.limits.table": 2,
    "bcs_middleware.audit.export": 2,
    "bcs_middleware.store": 2,
    "bcs_middleware.outbound": 2,
    "bcs_middleware.discovery": 2,
    "bcs_middleware.pki": 2,
    "bcs_middleware.agent_tunnel": 2,
    "bcs_middleware.admission": 3,
    "bcs_middleware.rbac": 3,
    "bcs_middleware.clusters": 3,
    "bcs_middleware.layers": 4,
    "bcs_middleware.apps": 4,
    "bcs_middleware.serving": 5,
    "bcs_middleware.compose": 6,
    "bcs_middleware.cli": 7,
}

#: Imports that still run upward, each to be removed by the redesign (issue 26); the list
#: only shrinks. ``(importer, imported)``.
KNOWN_UPWARD: set[tuple[str, str]] = set()
#: Circles still to open (issue 26); the list only shrinks.
KNOWN_CYCLES: list[list[str]] = []


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations" not in p.parts}


def floor_of(module: str) -> int | None:
    best = max((prefix for prefix in FLOORS if module == prefix or module.startswith(prefix + ".")),
               key=len, default=None)
    return FLOORS[best] if best is not None else None


def module_imports(module: str) -> set[str]:
    """Every module of the package ``module`` imports, lazily or not, ``from pkg import mod`` included."""
    path = MODULES[module]
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            parent = base[: len(base) - (node.level - 1)] if node.level else []
            target = ".".join([*parent, *([node.module] if node.module else [])]) if node.level else node.module or ""
            names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        for name in names:
            while name and name not in MODULES:
                name = name.rpartition(".")[0]
            if name and name != module and name.startswith("bcs_middleware"):
                found.add(name)
    return found


IMPORTS = {module: module_imports(module) for module in MODULES}


def test_every_module_has_a_floor() -> None:
    assert [m for m in MODULES if floor_of(m) is None] == []


def test_package_faces_import_nothing() -> None:
    faces = [m for m, p in MODULES.items() if p.name == "__init__.py" and IMPORTS[m]]
    assert faces == []


def test_no_module_imports_from_a_floor_above_its_own() -> None:
    upward = {(m, i) for m, imported in IMPORTS.items() for i in imported
              if (floor_of(i) or 0) > (floor_of(m) or 0)}
    assert sorted(upward - KNOWN_UPWARD) == []
    assert sorted(KNOWN_UPWARD - upward) == [], "fixed: take these off KNOWN_UPWARD"


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_modules_import_each_other_in_a_circle() -> None:
    assert _cycles(IMPORTS) == KNOWN_CYCLES


@pytest.mark.parametrize(("source", "module", "expected"), [
    pytest.param("def f():\n    from ..layers.kubernetes_route import X\n", "bcs_middleware.clusters.reader",
                 {"bcs_middleware.layers.kubernetes_route"}, id="a-lazy-relative-import"),
    pytest.param("from ..core import environ as env\n", "bcs_middleware.clusters.reader",
                 {"bcs_middleware.core", "bcs_middleware.core.environ"}, id="from-a-package-import-a-module"),
    pytest.param("import bcs_middleware.cli.main\n", "bcs_middleware.core.errors",
                 {"bcs_middleware.cli.main"}, id="an-absolute-import"),
])
def test_the_walk_sees_every_kind_of_import(source: str, module: str, expected: set[str],
                                            monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The check must be able to fail: the reader is run on a source written for the purpose.
    fake = tmp_path / "m.py"
    fake.write_text(source)
    monkeypatch.setitem(MODULES, module, fake)
    assert module_imports(module) == expected


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]

"""The import graph of ``src/hybridkv``: no circle, imports point down, test infrastructure apart.

Edges come from every ``import`` / ``from ... import`` statement of a module, read with ``ast``
(nothing is imported): statements under ``TYPE_CHECKING`` and inside functions count too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PKG = SRC / "hybridkv"


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for path in PKG.rglob("*.py"):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        mods[".".join(parts)] = (path, is_pkg)
    return mods


def import_graph() -> dict[str, set[str]]:
    """Module -> the hybridkv modules it imports (``from pkg import name`` names the submodule
    when ``name`` is one, else the package)."""
    mods = _modules()

    def known(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, (path, is_pkg) in mods.items():
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            targets: list[str | None] = []
            if isinstance(node, ast.Import):
                targets = [known(a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module or ""
                targets = [f"{source}.{a.name}" if f"{source}.{a.name}" in mods else known(source)
                           for a in node.names]
            graph[mod].update(t for t in targets if t and t != mod)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle() -> None:
    graph = import_graph()
    assert "hybridkv.engine.drafters" in graph and "hybridkv.engine.runner" in graph
    assert cycles(graph) == []


@pytest.mark.parametrize("layer, forbidden", [
    ("hybridkv.core", ("hybridkv.sched", "hybridkv.sim", "hybridkv.engine", "hybridkv.connectors",
                       "hybridkv.testing", "hybridkv.cli", "hybridkv.events", "hybridkv.tiers")),
    ("hybridkv.tiers", ("hybridkv.core", "hybridkv.sched", "hybridkv.sim", "hybridkv.engine",
                        "hybridkv.connectors", "hybridkv.testing", "hybridkv.cli", "hybridkv.events")),
    ("hybridkv.events", ("hybridkv.sched", "hybridkv.sim", "hybridkv.engine", "hybridkv.connectors",
                         "hybridkv.testing", "hybridkv.cli")),
    ("hybridkv.sched", ("hybridkv.sim", "hybridkv.engine", "hybridkv.connectors", "hybridkv.testing")),
    ("hybridkv.connectors", ("hybridkv.sim", "hybridkv.engine", "hybridkv.testing")),
    ("hybridkv.engine", ("hybridkv.sim", "hybridkv.testing")),
    ("hybridkv.sim", ("hybridkv.engine", "hybridkv.connectors", "hybridkv.testing", "hybridkv.profiling")),
    ("hybridkv.cost", ("hybridkv.sim", "hybridkv.sched", "hybridkv.engine", "hybridkv.connectors",
                       "hybridkv.testing", "hybridkv.profiling", "hybridkv.cli", "hybridkv.events",
                       "hybridkv.tiers")),
    ("hybridkv.profiling", ("hybridkv.cli", "hybridkv.engine", "hybridkv.connectors", "hybridkv.testing")),
])
def test_imports_point_down(layer: str, forbidden: tuple[str, ...]) -> None:
    bad = sorted((m, t) for m, targets in import_graph().items() if m.startswith(layer)
                 for t in targets if t.startswith(forbidden))
    assert bad == []


def test_core_never_imports_torch() -> None:
    for path in (PKG / "core").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path


def test_sim_never_imports_torch() -> None:
    """The simulator and the cost model run without PyTorch (only ``hybridkv profile`` needs it)."""
    for path in [*(PKG / "sim").rglob("*.py"), *(PKG / "cost").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] == "torch" for n in names), path


def test_the_simulators_rooms_keep_its_top_level_small() -> None:
    """``sim/`` is rooms (packages, each behind its ``__init__``) plus at most 12 modules of its
    own; no module of the package is over 600 lines."""
    top = sorted(p.name for p in (PKG / "sim").glob("*.py"))
    assert len(top) <= 12, top
    long = sorted((str(p.relative_to(PKG)), n) for p in PKG.rglob("*.py")
                  if (n := len(p.read_text().splitlines())) > 600)
    assert long == [], long


def _public_callables_over(limit: int) -> list[tuple[str, int]]:
    """Public functions and methods (``__init__`` included; modules, folders and names starting
    with ``_`` left out) taking more than ``limit`` parameters: ``self``/``cls`` not counted,
    ``*args`` and ``**kwargs`` one each. A dataclass's generated constructor is no function here."""
    out = []
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG)
        if any(part.startswith("_") and part != "__init__.py" for part in rel.parts):
            continue

        def visit(body: list, owner: str = "") -> None:
            for node in body:
                if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                    visit(node.body, f"{node.name}.")
                elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                        (not node.name.startswith("_") or node.name == "__init__"):
                    a = node.args
                    names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs]
                    n = len(names) - (names[:1] in (["self"], ["cls"])) + (a.vararg is not None) \
                        + (a.kwarg is not None)
                    if n > limit:
                        out.append((f"{rel}:{node.lineno} {owner}{node.name}", n))

        visit(ast.parse(path.read_text()).body)
    return sorted(out)


def test_no_public_callable_takes_more_than_six_parameters() -> None:
    """Options travel as one record (``CacheOptions``, ``TransferOptions``, the workload shapes,
    ...), built once where they come in, not as long keyword lists spelled at every layer."""
    assert _public_callables_over(6) == []


def test_each_room_of_the_simulator_opens_its_names_on_first_use() -> None:
    """Every name a room's ``__init__`` exports loads from its submodule (the same object), and
    an unknown name is an AttributeError naming the room and the name."""
    import importlib
    for room in ("traffic", "bounds", "tiers", "cluster", "report", "plan"):
        pkg = importlib.import_module(f"hybridkv.sim.{room}")
        for name in pkg.__all__:
            module = importlib.import_module(f"hybridkv.sim.{room}.{pkg._EXPORTS[name]}")
            assert getattr(pkg, name) is getattr(module, name)
    with pytest.raises(AttributeError, match=r"^module 'hybridkv\.sim\.bounds' has no attribute 'Belady'$"):
        importlib.import_module("hybridkv.sim.bounds").Belady

"""docs/extending.md's examples run as written: each on a private copy of the registry it adds
to, so the suite's registries are untouched (the page's promise: one module, one registration).
Every page under docs/ stays under 400 lines, and every relative link of the top-level and docs/
pages names a file that exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hybridkv.core.eviction.base import EVICTION_POLICIES
from hybridkv.core.rules import RULES
from hybridkv.sim.cluster.routing import ROUTERS

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "extending.md"
MAX_DOC_LINES = 400


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.S)


def test_the_page_has_one_example_per_runnable_kind() -> None:
    assert len(_blocks()) == 3


@pytest.mark.parametrize("index", range(3))
def test_each_example_runs_and_registers_its_kind(index: int, monkeypatch) -> None:
    for reg in (EVICTION_POLICIES, ROUTERS, RULES):
        monkeypatch.setattr(reg, "_table", dict(reg._table))
    before = {id(reg): reg.names() for reg in (EVICTION_POLICIES, ROUTERS, RULES)}
    exec(compile(_blocks()[index], f"{PAGE.name}[{index}]", "exec"), {"__name__": "docs_example"})
    grown = [reg for reg in (EVICTION_POLICIES, ROUTERS, RULES) if reg.names() != before[id(reg)]]
    assert len(grown) == 1                          # one registration line, one registry


def test_a_registered_example_router_routes_a_cluster(monkeypatch) -> None:
    """The router of the page is known by name to the cluster simulator and its rule decides:
    requests arriving together (1000/s) spread over the instances, never two to one instance
    while another holds none."""
    from hybridkv.sim import SimConfig, items_from_trace
    from hybridkv.sim.cluster.loop import ClusterSimulator
    from hybridkv.cost.presets import get_gpu, get_preset
    from hybridkv.sim.traffic.workloads import get_workload
    monkeypatch.setattr(ROUTERS, "_table", dict(ROUTERS._table))
    exec(compile(_blocks()[1], "router", "exec"), {"__name__": "docs_example"})
    cfg = SimConfig(get_preset("llama-3.1-8b"), get_gpu("h100"), num_blocks=4000)
    items = items_from_trace(get_workload("chat", num_conversations=6, turns=1, seed=1,
                                                  arrival_rate=1000.0))
    res = ClusterSimulator(cfg, 3, "emptiest").run(items)
    assert res.routed_requests == [2, 2, 2]


def test_no_page_under_docs_is_over_the_line_limit() -> None:
    pages = sorted((REPO / "docs").rglob("*.md"))
    assert pages
    long = {p.name: n for p in pages if (n := len(p.read_text().splitlines())) > MAX_DOC_LINES}
    assert long == {}


def test_relative_links_of_the_pages_name_files_that_exist() -> None:
    pages = sorted([*REPO.glob("*.md"), *(REPO / "docs").rglob("*.md")])
    missing = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            path = target.split("#")[0]
            if path and not re.match(r"[a-z]+:", path) and not (page.parent / path).exists():
                missing.append(f"{page.relative_to(REPO)} -> {target}")
    assert missing == []

"""Replay vLLM 0.33's recorded parity results against hybridkv (vllm_compat=True), without vLLM.

``tests/parity/fixtures/vllm_0_33.json.gz`` holds, per case of the parity matrix
(``benchmarks/parity_harness.py``), the case config, the trace's generator seed and a
fingerprint, and vLLM's per-request hit tokens at every admission plus its preemption,
re-admission, eviction and step counts (written by
``.venv-vllm/bin/python benchmarks/bench_vs_vllm.py --record``). Each test regenerates the
trace, drives hybridkv through the same scheduler loop and compares.

Cases hybridkv does not reproduce yet are strict xfails whose reason names the diagnosis
(docs/parity.md): the day one becomes exact, its xfail fails and must be removed.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import parity_harness as P  # noqa: E402
import parity_repros as R  # noqa: E402

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "vllm_0_33.json.gz"

# Cases hybridkv does not reproduce yet (name -> diagnosis). Empty: every case is exact.
KNOWN: dict[str, str] = {}


def _load() -> list[dict]:
    with gzip.open(FIXTURE, "rb") as fh:
        doc = json.loads(fh.read())
    assert doc["format"] == 1
    return doc["cases"]


CASES = _load()


def _params():
    for rec in CASES:
        name = rec["case"]["name"]
        marks = ()
        if name in KNOWN:
            marks = (pytest.mark.xfail(strict=True, reason=KNOWN[name]),)
        yield pytest.param(rec, id=name.replace(" ", "_"), marks=marks)


def test_fixture_covers_every_matrix_case():
    """The fixture was recorded from the current matrix (same names, configs, traces)."""
    recorded = {r["case"]["name"]: r["case"] for r in CASES}
    matrix = {c.name: c.to_json() for c in P.build_matrix()}
    assert recorded == matrix
    assert set(KNOWN) <= set(recorded)


def test_trace_generation_is_deterministic():
    """The generators depend on nothing but integer arithmetic: two runs agree exactly."""
    a = P.gen_tree(7, roots=2)
    b = P.gen_tree(7, roots=2)
    assert [(i.prompt, i.answer, i.chunks) for i in a] == [(i.prompt, i.answer, i.chunks) for i in b]
    assert P.Rng(1, 2).next() == 16070507698326878125  # pinned: splitmix64, no library RNG


@pytest.mark.parametrize("rec", list(_params()))
def test_replay_matches_vllm(rec):
    case = P.Case.from_json(rec["case"])
    trace = case.trace()
    assert P.trace_fingerprint(trace) == rec["trace"]["fingerprint"], "trace generator drifted"
    geo = P.geometry(case, trace)
    assert (geo.num_blocks, geo.max_model_len) == (rec["geometry"]["num_blocks"],
                                                   rec["geometry"]["max_model_len"])
    side = P.HybridkvSide(case, geo, compat=True, reserve="api")
    res = P.run_case(case, trace, side)
    side.kv.check_integrity()
    ref = rec["vllm"]
    ref_hits = {it.rid: h for it, h in zip(trace, ref["hits"]) if h}
    diff = P.compare(res, ref_hits, ref)
    shown = [f"{what}: hybridkv {a}, vLLM {b}" for what, a, b in diff.counts]
    shown += [f"{rid}: hybridkv {a}, vLLM {b}" for rid, a, b in diff.requests[:6]]
    assert diff.exact, f"{case.name} differs from vLLM 0.33:\n" + "\n".join(shown)


# vLLM 0.33's hit tokens per admission on the minimal repros (``python
# benchmarks/parity_repros.py`` in the vLLM venv prints them).
REPRO_VLLM = {
    "D1": {"A": [0], "B": [112]},
    "D3": {"R1": [0], "X": [0], "R2": [32], "F": [0], "R3": [32]},
    "D4": {"A": [0], "F": [0]},
    "D5": {"A": [0], "B": [0], "C": [0]},
}
# vLLM's eviction counts where the hits alone do not show the difference.
REPRO_VLLM_EVICTIONS = {"D1": 0, "D3": 4, "D4": 1, "D5": 0}


@pytest.mark.parametrize("repro", [
    pytest.param(r, id=r.diagnosis) for r in R.REPROS])
def test_minimal_repro_matches_vllm(repro):
    res = repro.run(lambda c, g: P.HybridkvSide(c, g))
    assert (res.hits, res.evictions) == (REPRO_VLLM[repro.diagnosis],
                                         REPRO_VLLM_EVICTIONS[repro.diagnosis])

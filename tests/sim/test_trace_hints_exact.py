"""Hints a trace carries, served block by block: a token trace's ``"hint"`` objects reach the
pool (session from the line), an ending session's blocks go first, an empty or all-false hint
object changes nothing, and a trace with hints is refused unless they are asked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.core.eviction.hint_layer import HintLayer
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.traffic.traces import load_token_trace

H100 = get_gpu("h100")
T0 = 1.0e6


@pytest.fixture
def honour_always(monkeypatch):
    """The layer honours both kinds from the first release (its test of the hints aside)."""
    real_test, real_hint = HintLayer._test, HintLayer.hint

    def test(self, sample, now):
        real_test(self, sample, now)
        self.honour = [True, True]

    def hint(self, *a):
        self.honour = [True, True]
        real_hint(self, *a)
    monkeypatch.setattr(HintLayer, "_test", test)
    monkeypatch.setattr(HintLayer, "hint", hint)


def _trace(tmp_path: Path, a_hint) -> Path:
    """B (64 tokens), then A (64 tokens, session "a", ``a_hint``), then C (64 unrelated), then
    B again; 10 s apart from T0; one output token each."""
    lines = []
    for i, (rid, base, session, hint) in enumerate([("b", 1000, "b", None), ("a", 2000, "a", a_hint),
                                                    ("c", 3000, None, None), ("b2", 1000, "b", None)]):
        obj = {"prompt_token_ids": list(range(base, base + 64)), "output_len": 1,
               "arrival_s": T0 + 10 * i, "request_id": rid}
        if session:
            obj["session"] = session
        if hint is not None:
            obj["hint"] = hint
        lines.append(json.dumps(obj))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _run(path: Path, trace_hints: bool = True, sequential: bool = True):
    preset = get_preset("llama-3.1-8b")                        # 16-token blocks
    sim = Simulator(SimConfig(preset, H100, 10, sequential=sequential, trace_hints=trace_hints,
                              optimum=False))                  # 9 usable blocks
    res = sim.run(items_from_trace(load_token_trace(path)))
    return sim, res


@pytest.mark.parametrize("sequential", [True, False])
def test_an_ending_session_from_the_trace_goes_first(tmp_path, honour_always, sequential) -> None:
    """9 blocks: B's 4, A's 4, then C needs 4: 1 free + 3 evicted. A ended: a3, a2, a1 go
    (demoted, tail first) and B's return hits 48 tokens (3 blocks; the last is recomputed).
    Without the hint LRU takes B's b3, b2, b1 and B hits 16."""
    trace = load_token_trace(_trace(tmp_path, {"last_turn": True}))
    assert trace[1].hint.session == "a" and trace[1].hint.last_turn
    sim, res = _run(_trace(tmp_path, {"last_turn": True}), sequential=sequential)
    assert res.hit_tokens == 48
    st = sim.kv.hint_stats()
    assert (st.releases, st.demoted, st.pinned) == (1, 4, 0)
    from hybridkv.sim.report.hints import hint_summary
    lines = hint_summary(res, None).splitlines()
    assert lines[0] == "hints trace: 1 requests hinted (1 last turns, 0 pins, 0 resume times)"
    assert lines[1] == ("  pool: 4 blocks demoted, 0 pinned; ignored 0 demotions and 0 pins while "
                        "honouring them did not pay; 0 pinned blocks evicted early so a request "
                        "could run, 0 pins lapsed")
    _, plain = _run(_trace(tmp_path, None), trace_hints=False, sequential=sequential)
    assert plain.hit_tokens == 16


@pytest.mark.parametrize("hint", [{}, {"last_turn": False}, {"continues": 0.5}, {"continues": 1}])
def test_an_empty_or_false_hint_object_changes_nothing(tmp_path, honour_always, hint) -> None:
    sim, res = _run(_trace(tmp_path, hint))
    assert res.hit_tokens == 16
    st = sim.kv.hint_stats()
    assert (st.releases, st.demoted, st.pinned) == (0, 0, 0)


def test_a_pin_from_the_trace_holds_at_a_clock_far_from_zero(tmp_path, honour_always) -> None:
    """A pinned 300 s at T0 + 10 is still pinned at T0 + 20 (C takes B's blocks, LRU: b3, b2,
    b1; B's return hits 16); pinned 5 s it has lapsed by then (A's blocks go first: 48)."""
    for pin_s, hits in ((300, 16), (5, 48)):
        sim, res = _run(_trace(tmp_path, {"pin_s": pin_s}))
        assert res.hit_tokens == hits, pin_s
        st = sim.kv.hint_stats()
        assert st.pinned == 4 and st.pins_lapsed == (0 if pin_s == 300 else 4)


def test_a_trace_with_hints_is_refused_unless_they_are_asked_for(tmp_path) -> None:
    with pytest.raises((ValueError, RuntimeError), match="trace_hints=True"):
        _run(_trace(tmp_path, {"last_turn": True}), trace_hints=False)

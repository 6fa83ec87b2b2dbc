"""Hints in the simulator: trace fields, synthesis from the trace's future, session recovery,
the runs with and without hints, and the non-anticipative reference.

* a trace line's ``"hint"`` (both formats) is parsed; a malformed one names its line;
* synthesised hints are right with the asked probability (exactly at 1, independent of the
  truth at 0.5);
* sessions recovered by hash-chain continuation equal the generators' named sessions, and a
  hand-made branch and a shared system prompt fall where the documented rule says;
* on a multi-turn workload, perfect end hints hit more than none; coin flips are never
  honoured (the same hits as without);
* the hazard-rate reference: 0 at no capacity, the unlimited cache's reuse at full capacity,
  monotone between, its leading count below its relaxed one.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest

from hybridkv.core.hints import Hint
from hybridkv.sim.bounds.hazard import hazard_bound, hazard_table, hazard_uses
from hybridkv.sim.traffic.hint_synthesis import (HintSpec, session_truth, sessions_from_chains,
                                         synthesize_hints, workload_sessions)
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.simulator import SimConfig, Simulator
from hybridkv.sim.traffic.traces import iter_mooncake_records, load_token_trace
from hybridkv.sim.traffic.workitems import items_from_trace
from hybridkv.sim.traffic.workloads import get_workload


# ---- trace fields ------------------------------------------------------------------------------


def test_token_trace_hint_is_parsed(tmp_path: Path):
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"prompt_token_ids": [1, 2, 3, 4], "output_len": 2, "session": "s1",
                             "hint": {"last_turn": True}}) + "\n"
                 + json.dumps({"prompt_token_ids": [5, 6], "output_len": 1,
                               "hint": {"pin_s": 30, "pin_tokens": 2}}) + "\n")
    a, b = load_token_trace(p)
    assert a.hint == Hint(session="s1", last_turn=True)
    assert b.hint == Hint(pin_s=30, pin_tokens=2)


def test_mooncake_line_hint_and_session(tmp_path: Path):
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 3,
                             "hash_ids": [1, 2], "session": "c", "hint": {"continues": 0.9}}) + "\n")
    (rec,) = iter_mooncake_records(p)
    assert rec.session == "c" and rec.hint == Hint(session="c", continues=0.9)


@pytest.mark.parametrize("hint, names", [
    ({"pin_s": -5}, "-5"),
    ({"continues": 1.5}, "1.5"),
    ({"ttl": 3}, "'ttl'"),
    ("soon", "'soon'"),
    ({"pin_s": 5, "pin_tokens": 99}, "pin_tokens=99"),
])
def test_malformed_hint_names_the_line(tmp_path: Path, hint, names):
    ok = json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 1})
    bad = json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 1, "hint": hint})
    p = tmp_path / "t.jsonl"
    p.write_text(ok + "\n" + ok.replace("1, 2, 3", "4, 5, 6") + "\n" + bad + "\n")
    with pytest.raises(ValueError) as exc:
        load_token_trace(p)
    msg = str(exc.value)
    assert msg.startswith(f"{p}:3: ") and names in msg and "\n" not in msg
    m = tmp_path / "m.jsonl"
    line = {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [7], "hint": hint}
    m.write_text(json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=rf"^{m}:1: "):
        list(iter_mooncake_records(m))


def test_mooncake_load_keeps_the_lines_session_and_hint(tmp_path: Path):
    """The loaded requests carry their line's session and hint (the hint's session is the
    line's); a non-string session names the file and line."""
    from hybridkv.sim.traffic.traces import load_mooncake_trace
    p = tmp_path / "m.jsonl"
    p.write_text(json.dumps({"timestamp": 0, "input_length": 40, "output_length": 2, "hash_ids": [1],
                             "session": "c", "hint": {"pin_s": 5, "pin_tokens": 40}}) + "\n"
                 + json.dumps({"timestamp": 5, "input_length": 8, "output_length": 1, "hash_ids": [2]})
                 + "\n")
    a, b = load_mooncake_trace(p)
    assert (a.session, a.hint) == ("c", Hint(session="c", pin_s=5, pin_tokens=40))
    assert (b.session, b.hint) == (None, None)
    p.write_text(json.dumps({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1],
                             "session": 7}) + "\n")
    with pytest.raises(ValueError, match=rf"^{p}:1: 'session' must be a string, got 7$"):
        load_mooncake_trace(p)


def test_malformed_hint_messages_word_for_word(tmp_path: Path):
    """Each refusal names the line, what is wrong and the valid fields or range: not an
    object, the first unknown field in sorted order, a pin past the prompt (3 tokens on the
    token line, ``input_length`` 20 on the Mooncake line)."""
    fields = "last_turn, continues, pin_s, pin_tokens, resume_s"
    pin = "bad 'hint': prompt: hint pin_tokens=25 lies outside the prompt ({n} tokens); valid: 1 <= pin_tokens <= {n}"
    for hint, want in (("soon", f"'hint' must be an object with fields among {fields}, got 'soon'"),
                       ({"zz": 1, "ttl": 3}, f"unknown 'hint' field 'ttl'; valid: {fields}"),
                       ({"pin_s": 5, "pin_tokens": 25}, pin)):
        t = tmp_path / "t.jsonl"
        t.write_text(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 1, "hint": hint}) + "\n")
        with pytest.raises(ValueError) as exc:
            load_token_trace(t)
        assert str(exc.value) == f"{t}:1: " + want.format(n=3)
        m = tmp_path / "m.jsonl"
        m.write_text(json.dumps({"timestamp": 0, "input_length": 20, "output_length": 1,
                                 "hash_ids": [7], "hint": hint}) + "\n")
        with pytest.raises(ValueError) as exc:
            list(iter_mooncake_records(m))
        assert str(exc.value) == f"{m}:1: " + want.format(n=20)


def test_a_trace_request_checks_its_hint():
    """A TraceRequest's hint is a Hint whose pin lies within the prompt; anything else is
    refused, naming the request."""
    from hybridkv.sim.traffic.traces import TraceRequest
    ok = TraceRequest("q", 0.0, np.arange(4), 1, hint=Hint(pin_s=5, pin_tokens=4))
    assert ok.hint == Hint(pin_s=5, pin_tokens=4)
    with pytest.raises(ValueError) as exc:
        TraceRequest("q", 0.0, np.arange(4), 1, hint="last")
    assert str(exc.value) == "TraceRequest 'q': hint must be a Hint or None, got 'last'"
    with pytest.raises(ValueError) as exc:
        TraceRequest("q", 0.0, np.arange(4), 1, hint=Hint(pin_s=5, pin_tokens=5))
    assert str(exc.value) == ("TraceRequest 'q': hint pin_tokens=5 lies outside the prompt (4 tokens); "
                              "valid: 1 <= pin_tokens <= 4")


# ---- synthesis ---------------------------------------------------------------------------------


@pytest.mark.parametrize("text, names", [("session-end:1.5", "1.5"), ("sessionend", "'sessionend'"),
                                         ("ttl=-5", "-5"), ("ttl=abc:1", "'abc'"),
                                         ("resume=3", "'resume'"), ("session-end:x", "'x'")])
def test_bad_hint_spec_names_the_value(text, names):
    with pytest.raises(ValueError) as exc:
        HintSpec.parse(text)
    assert names in str(exc.value) and "\n" not in str(exc.value)


def test_force_is_a_third_part_of_the_spelling():
    spec = HintSpec.parse("session-end:1:force")
    assert spec == HintSpec("session-end", 1.0, None, True) and str(spec) == "session-end:1:force"
    assert HintSpec.parse(str(spec)) == spec
    assert HintSpec.parse("ttl=60:0.9:force") == HintSpec("ttl", 0.9, 60.0, True)
    assert HintSpec.parse("session-end:0.8").force is False
    with pytest.raises(ValueError) as exc:
        HintSpec.parse("session-end:1:always")
    assert str(exc.value) == ("hint mode must be 'force' (follow every hint untested), got 'always' "
                              "(spelling: KIND[=SECONDS][:ACCURACY][:force], e.g. session-end:1:force)")
    with pytest.raises(ValueError, match="hint force must be True or False, got 'yes'"):
        HintSpec("session-end", 1.0, None, "yes")
    base = SimConfig(get_preset("llama-3.1-8b"), get_gpu("h100"), num_blocks=100)
    assert base.manager_hints is False
    assert dataclasses.replace(base, hints=HintSpec("session-end")).manager_hints is True
    assert dataclasses.replace(base, hints=spec).manager_hints == "force"
    assert dataclasses.replace(base, trace_hints=True).manager_hints is True


def test_synthesised_hints_are_right_with_the_asked_probability():
    rng = np.random.default_rng(3)
    sessions = rng.integers(0, 4000, 20000).tolist()
    arrivals = np.arange(20000, dtype=float).tolist()
    continues, gap = session_truth(sessions, arrivals)
    for acc in (1.0, 0.8, 0.5):
        hints = synthesize_hints(HintSpec("session-end", acc), sessions, arrivals, seed=1)
        right = np.mean([h.last_turn != c for h, c in zip(hints, continues)])
        assert right == pytest.approx(acc, abs=0.015)
        if acc == 0.5:              # independent of the truth: "last" as often either way
            says = np.array([h.last_turn for h in hints])
            c = np.array(continues)
            assert says[c].mean() == pytest.approx(says[~c].mean(), abs=0.03)
    ttl = synthesize_hints(HintSpec("ttl", 1.0, 60.0), sessions, arrivals)
    assert all((h.pin_s == 60.0) == c for h, c in zip(ttl, continues))
    res = synthesize_hints(HintSpec("resume"), sessions, arrivals)
    assert all((h.resume_s == g) if c else h.resume_s is None for h, c, g in zip(res, continues, gap))


def test_session_truth_by_brute_force():
    sessions = ["a", "b", "a", "c", "b", "a"]
    arrivals = [0.0, 1.0, 2.5, 3.0, 7.0, 9.0]
    cont, gap = session_truth(sessions, arrivals)
    for i, s in enumerate(sessions):
        later = [j for j in range(i + 1, len(sessions)) if sessions[j] == s]
        assert cont[i] == bool(later)
        assert gap[i] == (arrivals[later[0]] - arrivals[i] if later else math.inf)


def test_chain_rule_on_a_branch_and_a_shared_prompt():
    hub = "sys"
    chains = [[hub, f"u{i}"] for i in range(10)]          # 10 sessions share one first block
    chains.append([hub, "u0", "a0"])                       # 10: continues session 0
    chains.append([hub, "u0", "a0", "q1"])                 # 11: continues it again
    chains.append([hub, "u3", "b0"])                       # 12: continues session 3
    chains.append([hub, "u0x"])                            # 13: re-reads only the shared block
    chains.append([hub])                                   # 14: shared content only
    got = sessions_from_chains(chains)
    assert got[:10] == list(range(10))
    assert got[10] == got[11] == got[0] and got[12] == got[3]
    assert got[13] not in got[:13] and got[14] not in got[:14]


@pytest.mark.parametrize("name", ["chat", "agentic"])
def test_chain_recovery_matches_the_generators_sessions(name):
    items = items_from_trace(get_workload(name))
    named = [it.session for it in items]
    hidden = [dataclasses.replace(it, source=dataclasses.replace(it.source, session=None)) for it in items]
    recovered = workload_sessions(hidden, 16)
    arrivals = [it.arrival_s for it in items]
    assert session_truth(recovered, arrivals)[0] == session_truth(named, arrivals)[0]
    assert len(set(recovered)) == len(set(named))


# ---- runs ------------------------------------------------------------------------------------


#: 300 three-turn conversations, 40 at a time: enough releases for the layer's test of the hints.
CHAT = {"num_conversations": 300, "turns": 3, "concurrency": 40, "user_tokens": (64, 256),
        "answer_tokens": (64, 256), "system_tokens": 256}


def _run(hints=None, cache_tokens: int = 16000, **kw):
    preset = get_preset("llama-3.1-8b")
    items = items_from_trace(get_workload("chat", **CHAT))
    cfg = SimConfig(preset, get_gpu("h100"), cache_tokens // preset.block_size + 1, sequential=True,
                    hints=hints, parallel_optimum=False, **kw)
    return Simulator(cfg).run(items).to_json()


def test_perfect_end_hints_hit_more_coin_flips_change_nothing():
    none = _run()
    right = _run(HintSpec("session-end", 1.0))
    coin = _run(HintSpec("session-end", 0.5))
    assert none["hints"] is None and right["hints"]["requests"] == right["requests"]
    assert right["block_hit_rate"] > 1.05 * none["block_hit_rate"]
    assert right["hints"]["honour_demotions"] and right["hints"]["demoted"] > 0
    assert coin["hints"]["demoted"] == 0
    assert coin["block_hit_rate"] == none["block_hit_rate"]
    assert right["config"]["hints"] == "session-end:1"


def test_trace_hints_need_trace_hints(tmp_path: Path):
    items = items_from_trace(get_workload("chat"))
    hinted = [dataclasses.replace(it, source=dataclasses.replace(it.source, hint=Hint(last_turn=True)))
              for it in items]
    preset = get_preset("llama-3.1-8b")
    cfg = SimConfig(preset, get_gpu("h100"), 400, sequential=True, optimum=False)
    with pytest.raises(ValueError, match="carry hints; serve them with SimConfig\\(trace_hints=True\\)"):
        Simulator(cfg).run(hinted)
    d = Simulator(dataclasses.replace(cfg, trace_hints=True)).run(hinted).to_json()
    assert d["hints"]["last_turn_hints"] == len(items) and d["config"]["hints"] == "trace"


# ---- the non-anticipative reference -------------------------------------------------------------


def test_hazard_reference_bounds():
    rng = np.random.default_rng(0)
    keys, limits = [], []
    for _ in range(300):                 # prefixes of 12 chains, read to random depths
        c = int(rng.integers(12))
        n = int(rng.integers(1, 8))
        keys.append([(c, k) for k in range(n)])
        limits.append(n)
    uses = hazard_uses(keys)
    table = hazard_table(keys, limits, uses)
    seen: set = set()
    reuse = 0
    for ks, lim in zip(keys, limits):
        reuse += sum(1 for k in ks[:lim] if k in seen)
        seen.update(ks)
    prev = -1.0
    for cap in (0, 5, 20, 40, len(seen)):
        hz = hazard_bound(keys, limits, cap, table, uses)
        assert hz.leading_hits <= hz.relaxed_hits + 1e-9
        assert hz.relaxed_hits >= prev - 1e-9
        prev = hz.relaxed_hits
        if cap == 0:
            assert hz.relaxed_hits == 0
    assert prev == pytest.approx(reuse)


def test_reference_in_the_json_and_the_table():
    d = _run()
    hz = d["hazard_bound_block_hit_rate"]
    assert hz is not None and 0 < hz <= d["unlimited_cache_block_hit_rate"] + 1e-12
    assert d["fraction_of_hazard_bound"] == pytest.approx(d["block_hit_rate"] / hz)


def test_a_hinted_run_is_reproducible_across_processes():
    """The hint layer samples blocks by their hash; the simulator's hashes are seeded the same
    in every process (xxh3's default seed is random per hasher), so two processes running the
    same hinted configuration print the same numbers."""
    code = ("from hybridkv.sim.traffic.hint_synthesis import HintSpec; from hybridkv.cost.presets import get_gpu, get_preset; "
            "from hybridkv.sim.simulator import SimConfig, Simulator; from hybridkv.sim.traffic.workitems import items_from_trace; "
            "from hybridkv.sim.traffic.workloads import get_workload; "
            "r = Simulator(SimConfig(get_preset('llama-3.1-8b'), get_gpu('h100'), num_blocks=9000, sequential=True, "
            "optimum=False, eviction_policy='recommended', hints=HintSpec('session-end', 0.8))).run("
            "items_from_trace(get_workload('chat'))); print(r.hit_blocks, r.evictions, r.hints['shadow_plain_hits'])")
    import subprocess
    import sys
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(3)}
    assert len(outs) == 1, outs

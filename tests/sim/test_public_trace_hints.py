"""The public APIs' cache fields on trace lines (Anthropic ``cache_control``, OpenAI
``prompt_cache_key`` / ``prompt_cache_retention``, Dynamo ``nvext``): parsed onto the line's
hint, honoured by the pool block by block, a malformed one named by file and line, and
``--pins hard,soft`` comparing both pin kinds on the same trace in one sweep table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.core.hints import Hint
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.traffic.traces import load_mooncake_trace, load_token_trace
from tests.sim.test_trace_hints_exact import T0, honour_always  # noqa: F401 (a fixture)

H100 = get_gpu("h100")


def _trace(tmp_path: Path, a_fields: dict) -> Path:
    """A (64 tokens, session "a", ``a_fields``), then B (64), then C (64, unrelated), then A
    again; 10 s apart from T0; one output token each."""
    lines = []
    for i, (rid, base, fields) in enumerate([("a", 2000, a_fields), ("b", 1000, {}), ("c", 3000, {}),
                                             ("a2", 2000, {})]):
        obj = {"prompt_token_ids": list(range(base, base + 64)), "output_len": 1,
               "arrival_s": T0 + 10 * i, "request_id": rid, "session": rid[0], **fields}
        lines.append(json.dumps(obj))
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def _hits(path: Path, trace_hints: bool = True) -> int:
    sim = Simulator(SimConfig(get_preset("llama-3.1-8b"), H100, 10, sequential=True,
                              trace_hints=trace_hints, optimum=False))        # 9 usable blocks
    return sim.run(items_from_trace(load_token_trace(path))).hit_tokens


@pytest.mark.parametrize("fields", [
    {"cache_control": {"type": "ephemeral", "ttl": "1h"}},
    {"cache_control": {"type": "ephemeral"}},
    {"prompt_cache_retention": "in_memory"},
    {"nvext": {"cache_control": {"type": "ephemeral", "ttl": "30s"}}},
])
def test_a_public_ttl_on_a_trace_line_pins_the_prompt(tmp_path, honour_always, fields) -> None:
    """9 blocks: A's 4 (pinned), B's 4, then C needs 4: 1 free + 3 evicted. Pinned, A's
    blocks stay and LRU takes B's b3, b2, b1: A's return hits 48 tokens (its last block is
    recomputed: the hit stops one token short). Without the field LRU takes A's a3, a2, a1
    and A hits 16."""
    assert _hits(_trace(tmp_path, fields)) == 48
    assert _hits(_trace(tmp_path, {}), trace_hints=False) == 16


def test_the_fields_parse_onto_the_lines_hint(tmp_path) -> None:
    trace = load_token_trace(_trace(tmp_path, {"cache_control": {"type": "ephemeral", "ttl": "1h"},
                                               "hint": {"continues": 0.9}}))
    assert trace[0].hint == Hint(session="a", continues=0.9, pin_s=3600.0, soft=True)
    assert [t.hint for t in trace[1:]] == [None, None, None]
    moon = tmp_path / "m.jsonl"
    moon.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 2,
                                "hash_ids": [1, 2], "prompt_cache_key": "user-9",
                                "prompt_cache_retention": "24h"}) + "\n")
    assert load_mooncake_trace(moon)[0].hint == Hint(session="user-9", pin_s=86400.0, soft=True)


@pytest.mark.parametrize("fields, message", [
    ({"cache_control": {"type": "ephemeral", "ttl": "2h"}},
     "cache_control ttl must be one of '5m', '1h', got '2h'"),
    ({"prompt_cache_retention": "forever"},
     "prompt_cache_retention must be one of 'in_memory', '24h', got 'forever'"),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "soon"}}}, "got 'soon'"),
    ({"cache_control": {"type": "ephemeral"}, "hint": {"pin_s": 5}}, "hint.pin_s and cache_control"),
])
def test_a_malformed_public_field_names_file_and_line(tmp_path, fields, message) -> None:
    path = tmp_path / "t.jsonl"
    good = {"prompt_token_ids": [1, 2, 3], "output_len": 1}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, **fields}) + "\n")
    with pytest.raises(ValueError) as exc:
        load_token_trace(path)
    assert str(exc.value).startswith(f"{path}:2: ") and message in str(exc.value)


def test_sweep_pins_hard_and_soft_in_one_table(tmp_path, capsys) -> None:
    """The trace's own soft pins and the same pins made hard, beside no hints, in one table
    and in the JSON rows (``pins``)."""
    path = tmp_path / "t.jsonl"
    lines = [{"prompt_token_ids": list(range(100 * (i % 4), 100 * (i % 4) + 40)), "output_len": 4,
              "arrival_s": float(i), "session": f"s{i % 4}",
              "cache_control": {"type": "ephemeral"}} for i in range(8)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    js = tmp_path / "s.json"
    assert main(["sweep", "--trace", str(path), "--no-progress", "--preset", "llama-3.1-8b",
                 "--sequential", "--cache-tokens-list", "2k", "--pins", "hard,soft",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "hints of the trace, pins hard,soft and none" in out
    table = out[out.index("hit rate / of optimum"):]
    for label in ("none", "trace hard", "trace soft"):
        assert f"\n{label:>18} " in table
    rows = json.loads(js.read_text())
    assert [(r["hints"], r["pins"]) for r in rows] == [(None, None), (None, "hard"), (None, "soft")]


def test_pins_refuse_a_cluster_and_a_workload_without_hints(capsys) -> None:
    chat = ["--workload", "chat", "--no-progress", "--preset", "llama-3.1-8b", "--sequential"]
    try:
        code = main(["sweep", *chat, "--cache-tokens-list", "20k", "--pins", "hard,soft"])
    except SystemExit as exc:
        code = exc.code
    assert code != 0 and "--pins compares pin kinds of hints" in capsys.readouterr().err
    try:
        code = main(["simulate", *chat, "--pins", "soft", "--instances", "2"])
    except SystemExit as exc:
        code = exc.code
    assert code != 0 and "--pins applies to hints" in capsys.readouterr().err
    assert main(["simulate", *chat, "--pins", "soft"]) == 2
    assert "--pins soft sets the kind of the hints' pins" in capsys.readouterr().err


def test_simulate_pins_soft_makes_every_pin_soft(tmp_path, capsys) -> None:
    js = tmp_path / "s.json"
    chat = ["--workload", "chat", "--no-progress", "--preset", "llama-3.1-8b", "--sequential",
            "--workload-param", "num_conversations=8", "--cache-tokens", "20k", "--no-baseline"]
    assert main(["simulate", *chat, "--hints", "ttl=60:1:force", "--pins", "soft", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["config"]["retention"] == "soft" and d["hints"]["soft_pin_hints"] == d["hints"]["pin_hints"] > 0
    assert "soft pins, refreshed" in capsys.readouterr().out

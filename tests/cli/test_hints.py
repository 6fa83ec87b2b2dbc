"""``--hints`` on `hybridkv simulate` and `sweep`: the with/without report, the accuracy sweep's
table, JSON and plot, and one-line errors for bad values and combinations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.cli.hint_options import parse_hint_sweep

CHAT = ["--workload", "chat", "--no-progress", "--preset", "llama-3.1-8b", "--sequential"]


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_simulate_with_hints_prints_the_run_without(tmp_path: Path, capsys):
    js = tmp_path / "h.json"
    assert main(["simulate", *CHAT, "--cache-tokens", "40k", "--hints", "session-end:0.8",
                 "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "hints session-end:0.8: 384 requests hinted" in out
    assert "without hints ->" in out and "non-anticipative (hazard)" in out
    d = json.loads(js.read_text())
    assert d["hints"]["source"] == "session-end:0.8" and d["config"]["hints"] == "session-end:0.8"
    assert set(d["without_hints"]) >= {"hit_rate", "block_hit_rate", "ttft_p50_s"}
    assert d["hazard_bound_block_hit_rate"] is not None


def test_forced_hints_are_followed_untested_and_say_so(tmp_path: Path, capsys):
    """The same run with the hints tested and forced, twice in one process: the forced one
    says so, runs no shadow, and hits at least as much with right hints; the JSON names it."""
    js = tmp_path / "f.json"
    assert main(["simulate", *CHAT, "--cache-tokens", "40k", "--hints", "session-end:1:force",
                 "--json", str(js), "--no-optimum"]) == 0
    out = capsys.readouterr().out
    assert "every hint followed untested (:force): no shadow caches ran" in out
    assert "shadow caches' recent hits" not in out
    d = json.loads(js.read_text())
    assert d["config"]["hints"] == "session-end:1:force" and d["hints"]["forced"] is True
    assert d["hints"]["ignored_demotions"] == 0
    assert main(["simulate", *CHAT, "--cache-tokens", "40k", "--hints", "session-end:1",
                 "--json", str(js), "--no-optimum"]) == 0
    tested = json.loads(js.read_text())
    assert tested["hints"]["forced"] is False and "shadow caches' recent hits" in capsys.readouterr().out
    assert d["block_hit_rate"] >= tested["block_hit_rate"]
    assert d["without_hints"] == tested["without_hints"]
    assert str(parse_hint_sweep("session-end:0.5,1:force")) == "session-end:0.5,1:force"
    assert [s.force for s in parse_hint_sweep("session-end:0.5,1:force").specs] == [True, True]


def test_simulate_without_hints_keeps_the_keys(tmp_path: Path):
    js = tmp_path / "h.json"
    assert main(["simulate", *CHAT, "--cache-tokens", "40k", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["hints"] is None and "without_hints" not in d and d["config"]["hints"] is None


def test_sweep_over_accuracy_table_json_and_plot(tmp_path: Path, capsys):
    js, png = tmp_path / "s.json", tmp_path / "s.png"
    assert main(["sweep", *CHAT, "--cache-tokens-list", "20k,40k", "--hints", "session-end:0.5,1",
                 "--json", str(js), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    for label in ("none", "session-end:0.5", "session-end:1", "optimum (Belady)", "non-anticipative"):
        assert label in out
    rows = json.loads(js.read_text())
    assert [r["hints"] for r in rows] == [None, "session-end:0.5", "session-end:1"] * 2
    assert png.stat().st_size > 1000


@pytest.mark.parametrize("cmd, value, names", [
    ("simulate", "session-end:1.5", "1.5"),
    ("simulate", "ttl=-5", "-5"),
    ("simulate", "end", "'end'"),
    ("sweep", "session-end:0.5,,1", "accuracy 2"),
    ("sweep", "session-end:0.5,2", "2"),
])
def test_bad_hint_value_is_a_usage_error_naming_it(capsys, cmd, value, names):
    assert run_main([cmd, *CHAT, "--hints", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--hints" in err and names in err


@pytest.mark.parametrize("extra, names", [
    (["--vllm-compat"], "--vllm-compat"),
    (["--instances", "2"], "--instances"),
])
def test_hints_refuse_what_they_cannot_run_with(capsys, extra, names):
    assert run_main(["simulate", *CHAT, "--hints", "session-end", *extra]) != 0
    err = capsys.readouterr().err
    assert names in err and "--hints" in err


def test_sweep_hints_one_thing_at_a_time(capsys):
    assert run_main(["sweep", *CHAT, "--hints", "session-end:1", "--eviction-policies", "lru,arc"]) != 0
    assert "sweep one thing at a time" in capsys.readouterr().err


def test_trace_hints_are_served_and_a_bad_one_names_its_line(tmp_path: Path, capsys):
    good, bad = tmp_path / "g.jsonl", tmp_path / "b.jsonl"
    lines = [{"prompt_token_ids": list(range(100 * i, 100 * i + 40)), "output_len": 4,
              "session": f"s{i % 3}", "hint": {"last_turn": i >= 6}} for i in range(9)]
    good.write_text("".join(json.dumps(x) + "\n" for x in lines))
    js = tmp_path / "t.json"
    assert main(["simulate", "--trace", str(good), "--no-progress", "--preset", "llama-3.1-8b",
                 "--sequential", "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["hints"]["source"] == "trace" and d["hints"]["last_turn_hints"] == 3
    assert "without_hints" in d
    lines[4]["hint"] = {"continues": 2}
    bad.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert run_main(["simulate", "--trace", str(bad), "--no-progress", "--sequential"]) != 0
    err = capsys.readouterr().err
    assert f"{bad}:5:" in err and "got 2" in err

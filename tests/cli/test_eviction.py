"""`--eviction-policy` / `--eviction-policies` on `hybridkv simulate` and `sweep`."""

from __future__ import annotations

import json

import pytest

from hybridkv.cli import main
from hybridkv.core.eviction import RECOMMENDED

BASE = ["--workload", "chat", "--preset", "llama-3.1-8b", "--sequential", "--limit", "40",
        "--no-progress"]


@pytest.mark.parametrize("name,resolved", [("s3fifo", "s3fifo"), ("recommended", RECOMMENDED),
                                           ("lru", "lru")])
def test_simulate_json_carries_the_resolved_policy(tmp_path, capsys, name, resolved):
    out = tmp_path / "r.json"
    assert main(["simulate", *BASE, "--cache-tokens", "20k", "--eviction-policy", name,
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["config"]["eviction_policy"] == resolved


def test_sweep_policies_table_and_rows(tmp_path, capsys):
    out = tmp_path / "rows.json"
    assert main(["sweep", *BASE, "--cache-tokens-list", "20k,60k", "--eviction-policies", "lru,lfu",
                 "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["config"]["eviction_policy"], r["value"]) for r in rows] == \
        [("lru", 20000), ("lru", 60000), ("lfu", 20000), ("lfu", 60000)]
    text = capsys.readouterr().out
    assert "hit rate / of optimum" in text and "\n     lfu " in text and "op cost" in text


def test_a_sweep_computes_each_bound_once_per_size(tmp_path, capsys):
    """Three sizes x two policies: the first policy's rows compute the bounds (bounds_s names
    each) and the second policy's rows at the same sizes reuse them (only the gap report is
    made), with equal values; --no-optimum computes none."""
    out = tmp_path / "rows.json"
    small = [*BASE[:-2], "12", "--no-progress"]
    assert main(["sweep", *small, "--cache-tokens-list", "5k,10k,20k", "--eviction-policies",
                 "lru,lfu", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [r["bounds_reused"] for r in rows] == [False] * 3 + [True] * 3
    every = {"keys", "optimum", "unlimited", "hazard", "lru", "lru_2x", "optimum_2x",
             "shared_prefix", "gap"}
    assert all(set(r["bounds_s"]) == every for r in rows[:3])
    assert all(set(r["bounds_s"]) == {"gap"} for r in rows[3:])
    for first, again in zip(rows[:3], rows[3:]):
        for key in ("optimal_block_hit_rate", "hazard_bound_block_hit_rate",
                    "unlimited_cache_block_hit_rate", "what_if"):
            assert first[key] == again[key] is not None
    assert main(["sweep", *small, "--cache-tokens-list", "5k", "--no-optimum", "--json",
                 str(out)]) == 0
    row, = json.loads(out.read_text())
    assert (row["bounds_s"], row["bounds_reused"], row["optimal_block_hit_rate"]) == ({}, False, None)


def test_sweep_policies_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    png = tmp_path / "p.png"
    assert main(["sweep", *BASE, "--cache-tokens-list", "20k,60k", "--eviction-policies",
                 "lru,arc,adaptive", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "wrote " + str(png) in capsys.readouterr().out


@pytest.mark.parametrize("argv,msg", [
    (["simulate", "--eviction-policy", "fifo"], "unknown eviction policy 'fifo'; valid: lru, s3fifo"),
    (["sweep", "--eviction-policies", "lru,mru"], "unknown eviction policy 'mru'"),
    (["simulate", "--eviction-policy", "lfu", "--vllm-compat"], "--vllm-compat pins vLLM's LRU order"),
    (["sweep", "--eviction-policies", "all", "--retention-intervals", "0,none", "--cache-tokens", "1M"],
     "--eviction-policies sweeps cache sizes"),
])
def test_bad_policy_options(capsys, argv, msg):
    try:                              # argparse errors exit; option-rule errors return 2
        rc = main([*argv, "--no-progress"])
    except SystemExit as exc:
        rc = exc.code
    assert rc == 2
    err = capsys.readouterr().err
    assert msg in err and "Traceback" not in err


def test_sweep_policies_rows_name_their_policy(tmp_path, capsys):
    """Issue #44: the printed rows of --eviction-policies said only the size, so two policies'
    rows at one size could not be told apart; a failed row (500 tokens hold no request) had
    no policy in the JSON."""
    js = tmp_path / "p.json"
    assert main(["sweep", "--workload", "chat", "--limit", "20", "--preset", "llama-3.1-8b",
                 "--gpus", "1", "--eviction-policies", "lru,s3fifo", "--cache-tokens-list",
                 "20k,500", "--no-progress", "--no-optimum", "--json", str(js)]) == 1
    out, err = capsys.readouterr()
    started = [line.split(":")[0].strip() for line in out.splitlines() if ": block hit rate" in line]
    assert started == ["lru @ 20000", "s3fifo @ 20000"]
    failed = [line.split(": error")[0].strip() for line in err.splitlines() if ": error: " in line]
    assert failed == ["lru @ 500", "s3fifo @ 500"]
    rows = json.loads(js.read_text())
    assert [(r["eviction_policy"], r["value"], "error" in r) for r in rows] == [
        ("lru", 20_000, False), ("lru", 500, True), ("s3fifo", 20_000, False), ("s3fifo", 500, True)]

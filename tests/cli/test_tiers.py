"""The tier options of `hybridkv simulate` and `sweep`: results, tables, plots, bad settings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.cli import main

FAST = ["--workload", "replay", "--no-progress", "--preset", "gemma-3-27b"]


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def test_simulate_with_a_cpu_tier_reports_each_tier_and_the_run_without(tmp_path: Path, capsys) -> None:
    js = tmp_path / "t.json"
    rc = main(["simulate", *FAST, "--cache-tokens", "14000", "--cpu-cache-tokens", "1M", "--json", str(js)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "KV tiers (write-through" in out and "without tiers: token hit rate" in out
    d = json.loads(js.read_text())
    assert set(d["hit_rate_by_tier"]) == {"gpu", "cpu"} and d["hit_rate_by_tier"]["cpu"] > 0
    assert d["hit_rate"] == pytest.approx(sum(d["hit_rate_by_tier"].values()))
    assert d["load_s_total"] > 0 and d["tiers"]["loaded_tokens"]["cpu"] == 8192 - 16
    assert d["without_tiers"]["hit_rate"] < d["hit_rate"]
    assert d["without_tiers"]["ttft_p50_s"] >= d["ttft_p50_s"]
    assert d["config"]["tiers"]["tiers"]["cpu"]["capacity_tokens"] == 10**6


def test_simulate_without_tiers_keeps_the_keys(tmp_path: Path) -> None:
    js = tmp_path / "t.json"
    assert main(["simulate", *FAST, "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["hit_rate_by_tier"] == {"gpu": d["hit_rate"]} and d["load_s_total"] == 0.0
    assert d["tiers"] is None and "without_tiers" not in d


def test_free_transfers_and_offload_on_evict_from_the_command_line(tmp_path: Path) -> None:
    js = tmp_path / "t.json"
    assert main(["simulate", *FAST, "--cache-tokens", "14000", "--disk-cache-tokens", "1M",
                 "--tier-policy", "offload-on-evict", "--free-transfers", "--no-baseline",
                 "--json", str(js)]) == 0
    d = json.loads(js.read_text())
    assert d["load_s_total"] == 0 and d["tiers"]["policy"] == "offload-on-evict"
    assert d["hit_rate_by_tier"]["disk"] > 0 and d["without_tiers"] is None
    assert d["tiers"]["tiers"]["disk"]["link"]["h2d_bw"] is None      # unlimited


def test_link_overrides_reach_the_run(tmp_path: Path) -> None:
    js = tmp_path / "t.json"
    assert main(["simulate", *FAST, "--cache-tokens", "14000", "--cpu-cache-tokens", "1M",
                 "--cpu-bandwidth", "5", "--cpu-latency-us", "20", "--no-baseline",
                 "--json", str(js)]) == 0
    link = json.loads(js.read_text())["tiers"]["cpu_link"]
    assert link["h2d_bw"] == link["d2h_bw"] == 5e9 and link["latency_s"] == pytest.approx(20e-6)
    assert "given: bandwidth 5 GB/s, latency 20 us" in link["source"]


def test_sweep_over_cpu_tier_sizes_prints_the_table_and_draws_it(tmp_path: Path, capsys) -> None:
    png, js = tmp_path / "s.png", tmp_path / "s.json"
    assert main(["sweep", *FAST, "--cache-tokens", "14000", "--cpu-cache-tokens-list", "0,4k,1M",
                 "--plot", str(png), "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "token hit rate: all" in out and "TTFT p50" in out
    rows = json.loads(js.read_text())
    assert [r["value"] for r in rows] == [0, 4000, 10**6]
    assert rows[0]["hit_rate_by_tier"] == {"gpu": rows[0]["hit_rate"]}
    assert rows[0]["hit_rate"] < rows[2]["hit_rate"]
    assert rows[2]["hit_rate_by_tier"]["cpu"] > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--cpu-cache-tokens", "-5"], "argument --cpu-cache-tokens: not a non-negative whole count: '-5'"),
    (["simulate", "--disk-cache-tokens", "1.5"], "argument --disk-cache-tokens: not a non-negative whole count: '1.5'"),
    (["simulate", "--preset", "llama-3.1-8b", "--cpu-cache-tokens", "2G"],
     "--cpu-cache-tokens 2000000000 is larger than host memory can address: 2,000,000,000 tokens x "
     "131,072 B of llama-3.1-8b KV per token"),
    (["simulate", "--disk-cache-tokens", "1M", "--disk-bandwidth", "0"],
     "argument --disk-bandwidth: a tier needs a bandwidth > 0 GB/s (inf: free), got '0'"),
    (["simulate", "--remote-cache-tokens", "1M", "--remote-bandwidth", "nan"], "got 'nan'"),
    (["simulate", "--cpu-cache-tokens", "1M", "--cpu-latency-us", "-1"],
     "argument --cpu-latency-us: must be in [0, 1000000) microseconds, got '-1'"),
    (["simulate", "--disk-bandwidth", "3"], "--disk-bandwidth has no effect without --disk-cache-tokens N"),
    (["simulate", "--cpu-cache-tokens", "0", "--cpu-latency-us", "3"], "--cpu-latency-us has no effect"),
    (["simulate", "--free-transfers"], "--free-transfers has no effect without a tier"),
    (["simulate", "--tier-policy", "offload-on-evict"], "--tier-policy has no effect without a tier"),
    (["simulate", "--tier-policy", "write-back"], "invalid choice: 'write-back'"),
    (["simulate", "--cpu-cache-tokens", "1M", "--cpu-bandwidth", "5", "--free-transfers"],
     "--cpu-bandwidth and --free-transfers: give one"),
    (["simulate", "--preset", "qwen3-next-80b-a3b", "--cpu-cache-tokens", "1M"],
     "qwen3-next-80b-a3b has recurrent-state groups"),
    (["sweep", "--cpu-cache-tokens-list", "0,,1M"], "item 2 of '0,,1M' is empty"),
    (["sweep", "--cpu-cache-tokens-list", "0,-1M"], "argument --cpu-cache-tokens-list"),
    (["sweep", "--cpu-cache-tokens-list", "0,1M", "--cache-tokens-list", "1M"], "sweep one thing at a time"),
    (["sweep", "--cpu-cache-tokens-list", "0,1M", "--cpu-cache-tokens", "1M"], "give one"),
    (["sweep", "--preset", "llama-3.1-8b", "--cpu-cache-tokens-list", "0,2G"],
     "--cpu-cache-tokens 2000000000 is larger than host memory can address"),
])
def test_bad_tier_settings_get_one_line_naming_the_value_before_the_trace_is_read(argv, message, capsys) -> None:
    rc = run_main([*argv, "--trace", "/nonexistent/t.jsonl", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err, err
    assert "nonexistent" not in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_tier_sizes_in_gb_per_gpu(tmp_path: Path, capsys) -> None:
    """Issue #44: --cpu-cache-gb / --disk-cache-gb size a tier in GB per GPU. Llama-3.1-8B's KV
    is 32 layers x 8 heads x 128 x 2 (K, V) x 2 bytes = 131,072 B per token, so 10 GB per GPU
    on 2 GPUs is floor(20e9 / 131,072) = 152,587 tokens, and 1.5 GB of disk per GPU
    floor(3e9 / 131,072) = 22,888."""
    js = tmp_path / "t.json"
    assert main(["simulate", "--workload", "chat", "--limit", "10", "--preset", "llama-3.1-8b",
                 "--gpus", "2", "--cpu-cache-gb", "10", "--disk-cache-gb", "1.5", "--no-progress",
                 "--no-optimum", "--no-baseline", "--json", str(js)]) == 0
    tiers = json.loads(js.read_text())["config"]["tiers"]["tiers"]
    assert (tiers["cpu"]["capacity_tokens"], tiers["disk"]["capacity_tokens"]) == (152_587, 22_888)


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--cpu-cache-tokens", "1M", "--cpu-cache-gb", "10"],
     "--cpu-cache-tokens 1000000 and --cpu-cache-gb 10: give one"),
    (["sweep", "--cpu-cache-tokens-list", "0,1M", "--cpu-cache-gb", "10"],
     "--cpu-cache-gb 10 and --cpu-cache-tokens-list: give one"),
    (["simulate", "--cpu-bandwidth", "20"], "--cpu-bandwidth has no effect without --cpu-cache-tokens N (N > 0) or --cpu-cache-gb G"),
])
def test_bad_gb_tier_settings(argv, message, capsys) -> None:
    assert run_main([*argv, "--workload", "chat", "--limit", "2", "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--cpu-cache-gb", "-1"])
    assert "--cpu-cache-gb: must be a finite number >= 0, got '-1'" in capsys.readouterr().err

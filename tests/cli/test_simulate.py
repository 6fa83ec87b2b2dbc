"""`hybridkv simulate`, `sweep` and `presets` from the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.sim.traffic.traces import open_trace_text

JSON_KEYS = {"requests", "prompt_tokens", "hit_tokens", "hit_rate", "block_hit_rate",
             "optimal_block_hit_rate", "ttft_p50_s", "ttft_p99_s", "throughput_tok_s",
             "preemptions", "wall_s"}


def test_simulate_without_arguments_prints_a_summary() -> None:
    out = subprocess.run([sys.executable, "-m", "hybridkv.cli", "simulate", "--no-progress"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "token hit rate" in out.stdout and "offline optimum" in out.stdout
    assert "TTFT p50 / p90 / p99" in out.stdout
    # the default shows the product: a hybrid model with speculative decoding, on the cache the
    # GPUs leave (vLLM's rule), with why online < optimum and what to do next
    assert "deepseek-v4-style" in out.stdout and "spec mtp:1" in out.stdout
    # deployed as SGLang and vLLM serve DeepSeek-class models: 16 data-parallel attention ranks,
    # experts sharded over all 16 (a rank: the dense weights whole, 1/16 of the experts, FP8)
    assert "16 x deepseek-v4-style on 1 x h100 each" in out.stdout
    assert "deployment: DP-16 attention + EP-16 on 16 GPUs (DeepSeek-class" in out.stdout
    experts = 3 * 7168 * 2048 * 256 * 58
    weights = (671e9 - experts + experts / 16) / 1e9
    assert (f"what its GPUs leave: 0.9 x 1 x h100 (76.5 GB) - weights {weights:.1f} GB - activation "
            "reserve 6.4 GB = 12.1 GB") in out.stdout
    assert "DP-16 attention + EP-16, communication from published collectives" in out.stdout
    assert "retained blocks per group  mla=" in out.stdout and "swa512=" in out.stdout
    assert "why online < optimum" in out.stdout and "timing:" in out.stdout
    assert "next steps:" in out.stdout and "instances: 16 instances keep up" in out.stdout


def test_simulate_json_and_plot(tmp_path: Path, trace_dir: Path) -> None:
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = main(["simulate", "--trace", str(trace_dir / "mooncake_synthetic.jsonl.xz"), "--limit", "60",
               "--preset", "gemma-3-27b", "--cache-tokens", "200k", "--spec", "eagle:3",
               "--json", str(js), "--plot", str(png), "--no-progress"])
    assert rc == 0
    d = json.loads(js.read_text())
    assert JSON_KEYS <= d.keys()
    assert d["requests"] == 60 and 0 <= d["hit_rate"] <= 1
    assert d["block_hit_rate"] <= d["optimal_block_hit_rate"]
    assert d["config"]["spec"] == "eagle:3" and set(d["retained_blocks"]) == {"full", "swa"}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sequential_mode_reports_no_latency(tmp_path: Path) -> None:
    js = tmp_path / "r.json"
    assert main(["simulate", "--preset", "llama-3.1-8b", "--workload", "replay", "--sequential", "--json", str(js),
                 "--no-progress"]) == 0
    d = json.loads(js.read_text())
    assert d["requests"] == 3 and d["ttft_p50_s"] is None and d["hit_tokens"] == 8192 - 16
    assert d["peak_cache_usage"] > 0


def test_verbose_prints_the_seconds_of_each_bound_and_the_json_has_them(tmp_path: Path, capsys) -> None:
    """bounds_s names every bound the run computed (the what-if's too), --verbose prints them,
    and a run without --verbose does not."""
    js = tmp_path / "r.json"
    argv = ["simulate", "--preset", "llama-3.1-8b", "--workload", "replay", "--sequential",
            "--json", str(js), "--no-progress"]
    assert main(argv) == 0
    assert "bounds (seconds)" not in capsys.readouterr().out
    assert main([*argv, "--verbose"]) == 0
    d = json.loads(js.read_text())
    line = next(x for x in capsys.readouterr().out.splitlines() if "bounds (seconds)" in x)
    names = set(d["bounds_s"])
    assert "gap" in names and all(f"{k} " in line for k in names)
    assert names == {"gap"} if d["bounds_reused"] else names == {
        "keys", "optimum", "unlimited", "hazard", "lru", "lru_2x", "optimum_2x", "shared_prefix", "gap"}


def test_sweep_over_capacities_and_retention(tmp_path: Path, capsys) -> None:
    png, js = tmp_path / "s.png", tmp_path / "s.json"
    assert main(["sweep", "--preset", "llama-3.1-8b", "--workload", "system-prompt", "--cache-tokens-list", "20k,80k,300k",
                 "--plot", str(png), "--json", str(js), "--no-progress"]) == 0
    rows = json.loads(js.read_text())
    assert [r["value"] for r in rows] == [20_000, 80_000, 300_000]
    rates = [r["block_hit_rate"] for r in rows]
    assert rates == sorted(rates) and all(r["block_hit_rate"] <= r["optimal_block_hit_rate"] for r in rows)
    assert png.stat().st_size > 1000
    assert main(["sweep", "--workload", "replay", "--preset", "gemma-3-27b",
                 "--retention-intervals", "none,0,1024", "--cache-tokens", "40k", "--no-progress"]) == 0
    assert "1024: block hit rate" in capsys.readouterr().out


def test_presets_lists_kv_bytes_per_token(capsys) -> None:
    assert main(["presets", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["models"]["llama-3.1-8b"]["kv_bytes_per_token"] == 131072  # 32 layers x 2 x 8 x 128 x 2 B
    assert {"h100", "h200", "b200"} <= d["gpus"].keys()
    assert main(["presets"]) == 0
    assert "deepseek-v4-style" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--preset", "llama-9"], "unknown model preset 'llama-9'; valid presets: llama-3.1-8b"),
    (["simulate", "--workload", "chat", "--num-blocks", "20", "--preset", "llama-3.1-8b"], "cannot hold request"),
    (["simulate", "--gpu-memory-fraction", "0.5", "--gpus", "8", "--preset", "deepseek-v3"],
     "deepseek-v3 does not fit 8 x h100: 0.5 x 8 x h100 (340.1 GB) - weights 671.0 GB - activation "
     "reserve 51.5 GB = -382.5 GB; use --gpus 32 (the fewest that hold it)"),
    (["simulate", "--gpu-memory-fraction", "0.2", "--gpus", "1", "--preset", "llama-3.1-8b"],
     "use --gpus 2 (the fewest that hold it) or --gpu-memory-fraction 0.27 or more"),
    (["simulate", "--trace", "/nonexistent.jsonl"], "does not exist"),
])
def test_errors_are_clear(argv, message, capsys) -> None:
    assert main(argv + ["--no-progress"]) == 2
    assert message in capsys.readouterr().err


def test_a_bad_trace_line_is_named(tmp_path: Path, capsys, trace_dir: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    with open_trace_text(trace_dir / "mooncake_conversation.jsonl.xz") as f:
        lines = [next(f).rstrip("\n") for _ in range(3)]
    bad.write_text("\n".join(lines + ['{"timestamp": 5, "input_length": 10}']) + "\n")
    assert main(["simulate", "--trace", str(bad), "--no-progress"]) == 2
    assert f"{bad}:4: missing field 'output_length'" in capsys.readouterr().err


def test_the_presets_speculative_method_is_the_default(tmp_path: Path) -> None:
    js = tmp_path / "r.json"
    assert main(["simulate", "--preset", "deepseek-v4-style", "--workload", "replay", "--json", str(js),
                 "--no-progress"]) == 0
    assert json.loads(js.read_text())["config"]["spec"] == "mtp:1"
    assert main(["simulate", "--preset", "deepseek-v4-style", "--workload", "replay", "--spec", "none",
                 "--json", str(js), "--no-progress"]) == 0
    assert json.loads(js.read_text())["config"]["spec"] is None


def test_a_progress_bar_starts_over_when_its_count_falls_back(capsys) -> None:
    """A bar whose count falls back (a caller reporting a new run on the same bar) starts
    over: its count, clock and rate, so the ETA is the new run's."""
    pytest.importorskip("tqdm")
    from hybridkv.cli.output import progress_bar
    update, close = progress_bar(True, "sweep", tty=True)
    bar = update.__closure__[0].cell_contents
    clock = [1000.0]
    bar._time = lambda: clock[0]                       # tqdm's clock, made ours
    update(0, 100)
    clock[0] = 1100.0
    update(90, 100)
    clock[0] = 1200.0
    update(5, 100)                                     # the next configuration
    assert bar.n == 5 and bar.total == 100
    assert bar.format_dict["elapsed"] == 0             # 200 s if the clock kept running
    close()


def test_no_progress_bar_when_stderr_is_redirected(capsys) -> None:
    """Issue #44: redirected (``> out 2>&1``), the bar's carriage returns overwrote the
    report's first line in the file. Off a terminal there is no bar at all."""
    from hybridkv.cli.output import progress_bar
    update, close = progress_bar(True, "simulate", tty=False)
    assert update is None
    close()
    assert main(["simulate", "--workload", "chat", "--limit", "5", "--preset", "llama-3.1-8b",
                 "--no-optimum"]) == 0                     # progress on, stderr captured
    out, err = capsys.readouterr()
    assert "\r" not in err and "\r" not in out and out.startswith("hybridkv simulate: llama-3.1-8b")


def test_workload_params_configure_the_built_in_agentic_workload(tmp_path: Path, capsys) -> None:
    """Issue #44: the built-in agentic workload could not be configured from the command line.
    4 agents x 3 steps = 12 requests; every tool output within 512-4096 tokens makes each step's
    prompt grow by at least 512 + the action."""
    js = tmp_path / "a.json"
    argv = ["simulate", "--workload", "agentic", "--workload-param", "num_agents=4",
            "--workload-param", "steps=3", "--workload-param", "tool_tokens=512-4096",
            "--preset", "llama-3.1-8b", "--gpus", "1", "--no-progress", "--no-optimum"]
    assert main([*argv, "--json", str(js)]) == 0
    assert "on workload agentic (12 requests)" in capsys.readouterr().out
    assert json.loads(js.read_text())["requests"] == 12
    from hybridkv.cli.sim_options import parse_workload_param, workload_params
    assert [parse_workload_param(t) for t in ("num-agents=4", "tool_tokens=512-4096", "zipf_s=1.5",
                                              "arrival_rate=none")] == [
        ("num_agents", 4), ("tool_tokens", (512, 4096)), ("zipf_s", 1.5), ("arrival_rate", None)]
    assert workload_params("agentic", [("steps", 3)]) == {"steps": 3}


@pytest.mark.parametrize("argv, message", [
    (["--workload", "agentic", "--workload-param", "agents=4"],
     "hybridkv simulate: error: --workload-param agents: workload 'agentic' has no such parameter "
     "(valid: num_agents, steps, system_tokens, task_tokens, tool_tokens, action_tokens, "
     "concurrency, arrival_rate, vocab_size)"),
    (["--workload", "chat", "--workload-param", "seed=3"],
     "hybridkv simulate: error: --workload-param seed: workload 'chat' has no such parameter "
     "(--seed sets it)"),
    (["--trace", "mooncake-conversation", "--workload-param", "steps=3"],
     "hybridkv simulate: error: --workload-param sets a built-in --workload's parameters; a "
     "--trace has none"),
])
def test_bad_workload_params_are_named(argv, message, capsys) -> None:
    assert main(["simulate", *argv, "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == message
    with pytest.raises(SystemExit):
        main(["simulate", "--workload-param", "steps"])
    assert "expected KEY=VALUE, got 'steps' (e.g. num_agents=64)" in capsys.readouterr().err


def test_deepseek_v4_flash_is_listed_and_simulates(tmp_path: Path, capsys) -> None:
    """presets; simulate --preset deepseek-v4-flash — listed with its five groups; the
    #43447 replay (A 8,192 tokens, B, A again) hits 8,191 rounded down to the 256-token
    alignment = 7,936 tokens, and each group's own hit is that many tokens in its blocks
    (31, 124, 124, 1,984, 992 of 3 x (8,191 // bs) queried)."""
    assert main(["presets"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "deepseek-v4-flash" in x)
    assert all(f"{g} " in line for g in ("compressed SparseMLA x41 bs256", "swa_a SlidingWindow x22 bs64",
                                         "swa_b SlidingWindow x22 bs64", "c4_state CompressorState x21 bs4",
                                         "c128_state CompressorState x20 bs8"))
    js = tmp_path / "r.json"
    assert main(["simulate", "--preset", "deepseek-v4-flash", "--workload", "replay", "--sequential",
                 "--no-optimum", "--json", str(js), "--no-progress"]) == 0
    d = json.loads(js.read_text())
    assert d["hit_tokens"] == 7936 and d["config"]["spec"] == "mtp:1"
    hit = {"compressed": 31, "swa_a": 124, "swa_b": 124, "c4_state": 1984, "c128_state": 992}
    asked = {"compressed": 31, "swa_a": 127, "swa_b": 127, "c4_state": 2047, "c128_state": 1023}
    assert d["block_hit_rate_by_group"] == {g: hit[g] / (3 * asked[g]) for g in hit}


@pytest.mark.parametrize("argv", [
    ["--preset", "llama-3.1-8b", "--drafter-group", "shared"],
    ["--preset", "gemma-3-27b", "--spec", "eagle3:2", "--drafter-group", "own"],
])
def test_drafter_group_needs_a_recorded_eagle3_drafter(argv, capsys) -> None:
    """--drafter-group without --spec eagle3:K, or on a preset with no recorded drafter, is
    refused before the run, naming the presets that record one."""
    assert main(["simulate", *argv, "--workload", "replay", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert ("places the EAGLE-3 drafter's KV: it needs --spec eagle3:K and a preset that records "
            "the drafter (llama-3.1-8b)") in err
    assert ("--spec the preset default" in err) == ("--spec" not in argv)


def test_drafter_group_shared_puts_the_drafter_in_the_target_group(tmp_path: Path) -> None:
    """simulate --spec eagle3:1 --drafter-group shared: one group, 33 layers (the JSON's
    retained blocks and per-group rates name only "full")."""
    js = tmp_path / "r.json"
    assert main(["simulate", "--preset", "llama-3.1-8b", "--spec", "eagle3:1", "--drafter-group", "shared",
                 "--workload", "replay", "--sequential", "--no-optimum", "--json", str(js),
                 "--no-progress"]) == 0
    d = json.loads(js.read_text())
    assert list(d["block_hit_rate_by_group"]) == ["full"] and d["hit_tokens"] == 8192 - 16

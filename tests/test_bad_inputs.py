"""Bad input, CLI and API: each case gets a clear error naming the value (or a documented
behaviour), an exit status (2: bad input, 1: failure while running), and never a traceback."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.cli import COMMANDS, main, options, output, sim_options
from hybridkv.cli.base import build_parser
from hybridkv.cost.presets import get_preset
from hybridkv.sim.traffic.traces import BUNDLED_TRACES, resolve_trace

REPO = Path(__file__).resolve().parents[1]
FAST = ["--workload", "replay", "--no-progress"]   # 3 requests: any run ends in a second


def run_main(argv: list[str]) -> int:
    """``main``'s exit status; argparse reports a bad value itself with SystemExit(2)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


@pytest.mark.parametrize("argv, message", [
    # sizes: 0, negative, non-numeric, NaN, infinite, fractional, a fixed cost that cannot fit
    (["simulate", "--cache-tokens", "0"], "--cache-tokens: must be >= 1, got '0'"),
    (["simulate", "--cache-tokens", "-5"], "not a non-negative whole count: '-5'"),
    (["simulate", "--cache-tokens", "abc"], "not a count: 'abc'"),
    (["simulate", "--cache-tokens", "nan"], "not a finite count: 'nan'"),
    (["simulate", "--cache-tokens", "inf"], "not a finite count: 'inf'"),
    (["simulate", "--cache-tokens", "1.5"], "not a non-negative whole count: '1.5'"),
    (["simulate", "--cache-tokens", "10", "--preset", "deepseek-v4-style"], "holds no block"),
    (["simulate", "--num-blocks", "1"], "--num-blocks must be >= 2, got 1"),
    (["simulate", "--num-blocks", "0"], "--num-blocks: must be >= 1, got '0'"),
    (["simulate", "--gpus", "0"], "--gpus: must be an integer [1, 1024], got '0'"),
    (["simulate", "--gpus", "two"], "--gpus: not an integer: 'two'"),
    (["simulate", "--block-size", "12"], "power of two in [1, 4096]"),
    (["simulate", "--block-size", "0"], "must be an integer [1, 4096], got '0'"),
    (["simulate", "--block-size", "8192"], "must be an integer [1, 4096], got '8192'"),
    (["simulate", "--gpu-memory-fraction", "0"], "must be in (0, 1], got '0'"),
    (["simulate", "--gpu-memory-fraction", "1.5"], "must be in (0, 1], got '1.5'"),
    (["simulate", "--max-num-seqs", "0"], "--max-num-seqs: must be an integer >= 1"),
    (["simulate", "--max-num-batched-tokens", "-1"], "--max-num-batched-tokens: must be an integer >= 1"),
    (["simulate", "--max-model-len", "1"], "--max-model-len: must be an integer >= 2"),
    (["simulate", "--limit", "0"], "--limit: must be >= 1, got '0'"),
    (["simulate", "--seed", "-1"], "--seed: must be an integer >= 0"),
    (["simulate", "--retention-interval", "-1"], "'none' or an integer >= 0, got '-1'"),
    # speculative decoding
    (["simulate", "--spec", "eagle:1000000000000"], "K (speculative tokens per step) must be in [1, 64]"),
    (["simulate", "--spec", "eagle:0"], "must be an integer >= 1, got 0"),
    (["simulate", "--spec", "eagle"], "speculative decoding is METHOD:K"),
    (["simulate", "--spec", "magic:3"], "magic"),
    (["simulate", "--spec", "eagle:64", "--num-blocks", "4"], "one request's lookahead needs"),
    (["simulate", "--spec", "eagle:8", "--max-model-len", "9"], "needs more than --max-model-len 9"),
    (["simulate", "--acceptance-rate", "0.5", "--preset", "llama-3.1-8b"],
     "--acceptance-rate 0.5 has no effect without speculative decoding (llama-3.1-8b has no default method)"),
    (["simulate", "--acceptance-rate", "0.5", "--spec", "none"], "--spec none turns it off"),
    (["simulate", "--acceptance-rate", "2"], "--acceptance-rate: must be in [0, 1], got '2'"),
    (["simulate", "--acceptance-rate", "nan"], "must be in [0, 1], got 'nan'"),
    # workloads and traces
    (["simulate", "--trace", "nope"], "trace file 'nope' does not exist (bundled traces: mooncake-conversation"),
    (["simulate", "--workload", "nope"], "unknown workload 'nope'"),
    (["simulate", "--preset", "llama-9"], "unknown model preset 'llama-9'"),
    (["simulate", "--gpu", "tpu"], "tpu"),
    # outputs, checked before running
    (["simulate", "--json", "/nonexistent/x.json"], "--json '/nonexistent/x.json': folder '/nonexistent' does not exist"),
    (["simulate", "--plot", "/nonexistent/p.png"], "--plot '/nonexistent/p.png': folder '/nonexistent' does not exist"),
    (["simulate", "--json", "/"], "is a folder"),
    # sweeps
    (["sweep", "--cache-tokens-list", "1M,,3M"], "item 2 of '1M,,3M' is empty"),
    (["sweep", "--cache-tokens-list", "1M,0"], "item 2 of '1M,0': must be >= 1"),
    (["sweep", "--cache-tokens", "3M"], "--cache-tokens sets the cache size of a retention, instances or CPU-tier sweep"),
    (["sweep", "--retention-intervals", "none,,0"], "item 2 of 'none,,0' is empty"),
    (["sweep", "--retention-intervals", "0", "--cache-tokens-list", "1M"], "sweep one thing at a time"),
    (["sweep", "--instances-list", "1,4", "--cache-tokens-list", "1M"], "sweep one thing at a time"),
    (["sweep", "--instances-list", "1,0"], "item 2 of '1,0': must be an integer [1, 1024], got '0'"),
    (["sweep", "--instances-list", "2", "--instances", "2"], "--instances-list sweeps the instance count; drop --instances"),
    (["sweep", "--num-blocks", "4000"], "--num-blocks sets the cache size of a retention, instances or CPU-tier sweep"),
    # hardware: impossible hardware is refused before any run, always
    (["simulate", "--preset", "qwen3-next-80b-a3b", "--gpus", "1"],
     "qwen3-next-80b-a3b does not fit 1 x h100: 0.9 x 1 x h100 (76.5 GB) - weights 160.0 GB - "
     "activation reserve 6.4 GB = -89.9 GB; use --gpus 4 (the fewest that hold it)"),
    (["sweep", "--preset", "qwen3-next-80b-a3b", "--gpus", "2", "--cache-tokens-list", "1M"],
     "qwen3-next-80b-a3b does not fit 2 x h100"),
    (["simulate", "--preset", "llama-3.1-8b", "--gpus", "1", "--cache-tokens", "1M"],
     "--cache-tokens 1,000,000 needs 131.1 GB of KV memory but --gpus 1 leave 54.0 GB (412,098 "
     "tokens: 0.9 x 1 x h100 (76.5 GB) - weights 16.1 GB - activation reserve 6.4 GB = 54.0 GB); "
     "use --gpus 4 or a smaller size"),
    (["simulate", "--preset", "llama-3.1-8b", "--gpus", "1", "--num-blocks", "30000"],
     "--num-blocks 30,000 needs 62.9 GB of KV memory but --gpus 1 leave 54.0 GB"),
    (["sweep", "--cache-tokens-list", "1M,1G"],
     "--cache-tokens-list item 1,000,000,000 needs 98,304.0 GB of KV memory: even 1024 x h100 leave"),
    (["sweep", "--retention-intervals", "0", "--preset", "llama-3.1-8b", "--gpus", "1",
      "--cache-tokens", "1M"], "--cache-tokens 1,000,000 needs 131.1 GB of KV memory but --gpus 1 leave"),
    # plots and JSON, checked before the run
    (["simulate", "--plot", "out.txt"], "--plot 'out.txt': matplotlib cannot write '.txt' files; use one of"),
    (["simulate", "--plot", "same.json", "--json", "same.json"], "matplotlib cannot write '.json' files"),
    (["simulate", "--plot", "same.png", "--json", "./same.png"],
     "--plot 'same.png' is also the --json path; give them different files"),
    (["simulate", "--plot", "/proc/version"], "--plot '/proc/version' is not writable"),
    (["simulate", "--plot", "-"], "--plot '-': this output is a file, not standard output; give a file name"),
    (["simulate", "--json", ""], "--json '': give a file name"),
    (["sweep", "--plot", "p.txt"], "--plot 'p.txt': matplotlib cannot write '.txt' files"),
    # clusters: options that would be ignored, sizes that print a wall of rows
    (["simulate", "--router-overlap-weight", "2"],
     "--router-overlap-weight 2 is read only by --router kv-aware or approximate or tier-aware with --instances N; got one instance"),
    (["simulate", "--router-overlap-weight", "2", "--instances", "2", "--router", "round-robin"],
     "--router-overlap-weight 2 is read only by --router kv-aware or approximate or tier-aware with --instances N; "
     "got --router round-robin"),
    (["sweep", "--router-overlap-weight", "2"], "--router-overlap-weight 2 is read only by --router kv-aware"),
    (["simulate", "--instances", "100000"], "--instances: must be an integer [1, 1024], got '100000'"),
    (["sweep", "--instances", "2", "--sequential"], "--sequential has no clock: it does not apply to a cluster"),
    # eviction policies on presets with recurrent-state groups: refused, naming the one that works
    (["simulate", "--preset", "qwen3-next-80b-a3b", "--eviction-policy", "recommended"],
     "--eviction-policy recommended (= adaptive): qwen3-next-80b-a3b has recurrent-state groups and "
     "its checkpoints are extents of 66 blocks, evicted whole in LRU order (vLLM's); the other "
     "policies rank single blocks and are not defined on them; use --eviction-policy lru"),
    (["sweep", "--preset", "nemotron-h-8b", "--eviction-policies", "lru,s3fifo"],
     "--eviction-policies s3fifo: nemotron-h-8b has recurrent-state groups"),
])
def test_bad_options_get_one_clear_line(argv, message, capsys) -> None:
    rc = run_main(argv + (["--no-progress"] if {"--trace", "--workload"} & set(argv) else FAST))
    out, err = capsys.readouterr()
    assert rc == 2
    assert message in err, err
    assert "Traceback" not in err and "hybridkv simulate: " not in out  # nothing ran


@pytest.mark.parametrize("name, data, message", [
    ("t.jsonl.xz", b"not xz at all", "cannot read the trace"),
    ("t.jsonl.gz", b"not gzip", "cannot read the trace"),
    ("t.jsonl", b"", "the trace is empty"),
    ("t.jsonl", b'{"prompt_token_ids": [1, 2], "output_len": -1}\n', "'output_len' must be an integer >= 0, got -1"),
    ("t.jsonl", b'{"prompt_token_ids": "abc\n', "t.jsonl:1: bad JSON (Unterminated string starting at column 22)"),
    ("t.jsonl", b'{"prompt_token_ids": [1, 2]\n', "t.jsonl:1: bad JSON (Expecting ',' delimiter at column 28)"),
])
def test_unreadable_traces_are_named(tmp_path: Path, name, data, message, capsys) -> None:
    path = tmp_path / name
    path.write_bytes(data)
    assert run_main(["simulate", "--trace", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and message in err and "Traceback" not in err


def test_no_traceback_reaches_the_user_of_the_command() -> None:
    for argv in (["simulate", "--cache-tokens", "nan"], ["simulate", "--json", "/nonexistent/x.json"],
                 ["sweep", "--cache-tokens-list", "1M,,3M"], ["simulate", "--max-model-len", "100"]):
        res = subprocess.run([sys.executable, "-m", "hybridkv.cli", *argv, *FAST],
                             capture_output=True, text=True, timeout=120)
        assert "Traceback" not in res.stderr, (argv, res.stderr)
        assert res.returncode == (0 if "--max-model-len" in argv else 2), (argv, res.stderr)


def test_max_model_len_below_every_prompt_rejects_all_and_says_so(tmp_path: Path, capsys) -> None:
    js = tmp_path / "r.json"
    assert main(["simulate", "--max-model-len", "100", "--json", str(js), *FAST]) == 0
    d = json.loads(js.read_text())
    assert d["requests"] == d["rejected"] == 3 and d["prompt_tokens"] == 0
    assert "all 3 requests were rejected (prompt >= --max-model-len 100)" in capsys.readouterr().err


def test_a_given_zero_is_never_replaced_by_the_default() -> None:
    args = argparse.Namespace(num_blocks=None, gpu_memory_fraction=None, cache_tokens=0)
    with pytest.raises(ValueError, match=">= 1 token, got 0"):
        sim_options.capacity_blocks(args, get_preset("llama-3.1-8b"))


def test_generate_without_the_engine_extras_says_what_to_install(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # torch is not importable
    assert main(["generate", "--model", "DIR", "--prompt", "Hello"]) == 2
    assert 'pip install "hybridkv[engine]"' in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "generate" in capsys.readouterr().out


def test_internal_errors_and_memory_errors_are_one_line(monkeypatch, capsys) -> None:
    def boom(args):
        raise KeyError("x")

    def oom(args):
        raise MemoryError

    presets = COMMANDS.get("presets")
    monkeypatch.setitem(COMMANDS._table, "presets", dataclasses.replace(presets, run=boom))
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert "internal error KeyError" in err and "Traceback" not in err
    monkeypatch.setitem(COMMANDS._table, "presets", dataclasses.replace(presets, run=oom))
    assert main(["presets"]) == 1
    assert "out of memory" in capsys.readouterr().err


def test_a_finished_result_is_never_lost(tmp_path: Path, capsys) -> None:
    calls = []

    def write(path: str) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise PermissionError(13, "Permission denied")
        Path(path).write_text("result")

    saved = output.write_output(str(tmp_path / "r.json"), write, "the JSON result")
    assert saved != str(tmp_path / "r.json") and Path(saved).read_text() == "result"
    assert f"saved it to {saved}" in capsys.readouterr().err
    Path(saved).unlink()


def test_bundled_traces_by_name_from_any_folder(tmp_path: Path) -> None:
    res = subprocess.run([sys.executable, "-m", "hybridkv.cli", "simulate", "--trace", "mooncake-synthetic",
                          "--limit", "20", "--preset", "llama-3.1-8b", "--no-progress", "--json", "r.json"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "r.json").read_text())["requests"] == 20
    with pytest.raises(ValueError, match="bundled traces: mooncake-conversation, mooncake-synthetic"):
        resolve_trace("mooncake-chat")


def test_traces_command_lists_names_counts_sizes_and_licence(capsys) -> None:
    assert main(["traces", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows.keys() == BUNDLED_TRACES.keys()
    for name, r in rows.items():
        assert r["licence"] == "Apache-2.0" and r["bytes"] > 10_000 and "Mooncake" in r["source"]
    assert rows["mooncake-conversation"]["requests"] == 12_031
    assert all(r["block_tokens"] == 512 for r in rows.values())     # issue #44: the granularity
    assert main(["traces"]) == 0
    out = capsys.readouterr().out
    assert "mooncake-synthetic" in out
    assert ("granularity: one hash id per 512 prompt tokens (no tokens): a --block-size below 512 "
            "cuts the ids and is warned about (README: Granularity of a Mooncake trace)") in out


def test_bundled_request_counts_are_the_files(trace_dir_any) -> None:
    from hybridkv.sim.traffic.traces import open_trace_text
    for t in BUNDLED_TRACES.values():
        with open_trace_text(t.path) as f:
            assert sum(1 for line in f if line.strip()) == t.requests


@pytest.fixture
def trace_dir_any() -> None:
    for t in BUNDLED_TRACES.values():
        assert t.path.is_file(), f"bundled trace missing: {t.path}"


def test_the_wheel_ships_the_traces(tmp_path: Path) -> None:
    """package-data: a plain (non-editable) install carries the compressed traces, and every
    ``.pxd`` (C types the compiled build's manifest lists: one missing would make the installed
    build stale, so it would run the pure-Python source) and native ``.pyx`` source."""
    res = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                          "-q", "-w", str(tmp_path), str(REPO)], capture_output=True, text=True,
                         timeout=600)
    if res.returncode != 0 and "No module named" in res.stderr:
        pytest.skip(f"cannot build a wheel here: {res.stderr.strip()[-200:]}")
    assert res.returncode == 0, res.stderr
    import zipfile
    (wheel,) = tmp_path.glob("hybridkv-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for t in BUNDLED_TRACES.values():
        assert f"hybridkv/sim/traffic/data/{t.file}" in names
    assert "hybridkv/sim/traffic/data/README.md" in names
    assert "hybridkv/cost/data/h100-llama-3.1-8b.profile.json" in names
    src = REPO / "src"
    pxds = sorted(p.relative_to(src).as_posix() for p in (src / "hybridkv").rglob("*.pxd"))
    assert len(pxds) >= 10 and "hybridkv/core/pool.pxd" in pxds
    assert [p for p in pxds if p not in names] == []
    assert "hybridkv/core/hash_index_native.pyx" in names      # the native modules' sources
    assert "hybridkv/core/free_queue_native.pyx" in names


# ---- a workload the cache cannot hold, generate's options, checks before the trace ----------


def test_the_default_cache_names_the_gpus_a_trace_needs(capsys) -> None:
    """The cache 1 x H100 leaves Llama-3.1-8B at 29% of its memory (85.0 GB x 0.29 - 16.1 GB of
    weights - 6.4 GB reserve = 2.15 GB: 1,026 blocks of 2 MiB, the null block one of them)
    cannot hold the conversation trace's
    longest request: the run is refused before it starts, with the --gpus to give."""
    assert run_main(["simulate", "--trace", "mooncake-conversation", "--preset", "llama-3.1-8b",
                     "--gpu-memory-fraction", "0.29", "--no-progress"]) == 2
    out, err = capsys.readouterr()
    assert "the default cache (16,400 tokens, 1,025 blocks) is too small for this workload" in err
    assert "request 'mooncake_conversation-11192' (126,527 tokens with its output)" in err
    assert "give --gpus 2 (the fewest h100 that hold it)" in err
    # one error line, after the warning that block 16 cuts the trace's 512-token ids
    warning, error = err.splitlines()
    assert warning.startswith("hybridkv simulate: warning: Mooncake hash ids cover 512 tokens")
    assert error.startswith("hybridkv simulate: error: ")
    assert err.count("\n") == 2 and "Traceback" not in err and "hybridkv simulate: " not in out


def test_the_size_it_names_is_enough_and_a_given_size_only_warns(capsys) -> None:
    """The bound errs high only: a pool of its size runs the longest request alone, and a size
    the user gives below it is warned about, not refused (175k runs; 1,857 blocks suffice)."""
    import dataclasses

    from hybridkv.sim.traffic import workload_fit
    from hybridkv.sim import Simulator, items_from_mooncake
    items = items_from_mooncake(str(resolve_trace("mooncake-conversation")), 12)
    parser = build_parser("")
    cfg = sim_options.build_config(parser.parse_args(["simulate", "--no-optimum"]))
    need = workload_fit.largest_need(cfg, items)
    assert need.request_id == "mooncake_conversation-11" and need.blocks == 1902
    assert workload_fit.round_up(need.cache_tokens) == "180k"
    longest = [it for it in items if it.request_id == need.request_id]
    Simulator(dataclasses.replace(cfg, num_blocks=need.blocks + 1)).run(longest)  # fits
    assert run_main(["simulate", "--trace", "mooncake-conversation", "--limit", "12",
                     "--cache-tokens", "175k", "--no-progress", "--no-optimum"]) == 0
    err = capsys.readouterr().err
    assert "warning: request 'mooncake_conversation-11'" in err and "--cache-tokens 180k" in err


def test_a_cache_too_small_for_one_request_is_told_in_options(capsys) -> None:
    """The scheduler names its config fields; the simulate command turns them into options."""
    assert run_main(["simulate", "--workload", "chat", "--cache-tokens", "2k", "--no-progress",
                     "--no-optimum"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert err.startswith("hybridkv simulate: error: the KV cache cannot hold request")
    assert "give a larger cache (--num-blocks or --cache-tokens)" in err
    assert "a smaller --max-num-batched-tokens" in err and "a smaller --max-model-len" in err
    assert "max_num_batched_tokens" not in err and "max_model_len" not in err


@pytest.mark.parametrize("n, text", [(999, "999"), (1000, "1k"), (177_123, "180k"),
                                     (1_234_567, "1.3M"), (3_000_000, "3M"), (10**12 + 1, "1.1T")])
def test_sizes_round_up_to_what_cache_tokens_takes(n: int, text: str) -> None:
    from hybridkv.sim.traffic.workload_fit import round_up
    assert round_up(n) == text and options.parse_count(text) >= n


@pytest.mark.parametrize("argv, message", [
    (["--max-tokens", "0"], "argument --max-tokens: must be an integer >= 1, got '0'"),
    (["--block-size", "0"], "argument --block-size: must be an integer >= 1, got '0'"),
    (["--block-size", "full=0"], "argument --block-size: N or KIND=N,... with KIND in full, sliding, mla"),
    (["--block-size", "foo=16"], "got 'foo=16'"),
    (["--num-blocks", "1"], "argument --num-blocks: must be an integer >= 2, got '1'"),
    (["--max-model-len", "1"], "argument --max-model-len: must be an integer >= 2, got '1'"),
    (["--max-num-batched-tokens", "0"], "argument --max-num-batched-tokens: must be an integer >= 1"),
    (["--retention", "-1"], "argument --retention: retention interval must be 'none' or an integer >= 0"),
    (["--spec", "eagle:3"], "argument --spec: METHOD:K with METHOD in ngram, draft_model, dflash"),
    (["--spec", "ngram:0"], "and K an integer >= 1, or none, got 'ngram:0'"),
    (["--device", "tpu"], "--device 'tpu' is not a torch device"),
    (["--prompt-ids", "5,-1"], "--prompt-ids: token ids are >= 0 (below the model's vocabulary size), got -1"),
])
def test_generate_errors_name_the_option_and_its_range(argv, message, capsys) -> None:
    pytest.importorskip("torch")
    rc = run_main(["generate", "--model", "/nonexistent", "--prompt-ids", "1,2", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err, err
    assert "CacheConfig" not in err and "max_model_len" not in err


def test_engine_errors_are_told_in_the_options_of_generate() -> None:
    pytest.importorskip("torch")
    from hybridkv.cli.generate import OPTION_NAMES
    from hybridkv.cli.options import name_options

    def named(message: str) -> str:
        return name_options(message, OPTION_NAMES)
    assert named("request 'r' has 3 prompt tokens; max_model_len=3 leaves no room") == \
        "request 'r' has 3 prompt tokens; --max-model-len 3 leaves no room"
    assert named("speculative method 'dflash' needs draft_model=DIR") == \
        "speculative method 'dflash' needs --draft-model DIR"
    assert named("CacheConfig.num_blocks must be None or an integer >= 2, got 1") == \
        "--num-blocks must be None or an integer >= 2, got 1"
    assert named("a smaller max_num_batched_tokens") == "a smaller --max-num-batched-tokens"
    assert named("block_sizes and num_blocks_total") == "block_sizes and num_blocks_total"


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--instances", "0"], "argument --instances: must be an integer [1, 1024], got '0'"),
    (["simulate", "--router-overlap-weight", "nan"], "must be a finite number >= 0, got 'nan'"),
    (["simulate", "--router-overlap-weight", "-1"], "must be a finite number >= 0, got '-1'"),
    (["simulate", "--kv-events-endpoint", "tcp://nowhere"],
     "--kv-events-endpoint: malformed KV events endpoint 'tcp://nowhere'"),
    (["simulate", "--kv-events-endpoint", "tcp://*:5557", "--kv-events-replay-endpoint", "tcp://h:5558"],
     "--kv-events-replay-endpoint: replay_endpoint 'tcp://h:5558' must be one this process can bind"),
    (["simulate", "--num-blocks", "1"], "--num-blocks must be >= 2, got 1"),
    (["simulate", "--kv-events-endpoint", ""], "--kv-events-endpoint: malformed KV events endpoint ''"),
    (["simulate", "--kv-events-endpoint", "tcp://no-such-host.invalid:5557"],
     "--kv-events-endpoint 'tcp://no-such-host.invalid:5557': cannot resolve host 'no-such-host.invalid'"),
    (["simulate", "--preset", "qwen3-next-80b-a3b", "--gpus", "2"], "qwen3-next-80b-a3b does not fit 2 x h100"),
    (["simulate", "--plot", "out.txt"], "matplotlib cannot write '.txt' files"),
    (["sweep", "--workers", "2"], "--workers 2 needs --executor processes or ray"),
    (["sweep", "--ray-address", "auto"], "--ray-address auto needs --executor ray"),
])
def test_options_are_checked_before_the_trace_is_read(argv, message, capsys) -> None:
    """A trace that does not exist would be the error if the options were checked after it."""
    pytest.importorskip("zmq") if "--kv-events-endpoint" in argv else None
    rc = run_main([*argv, "--trace", "/nonexistent/t.jsonl", "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "nonexistent" not in err, err


def test_kv_events_without_the_events_extras_say_what_to_install(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "zmq", None)                  # import zmq -> ImportError
    monkeypatch.delitem(sys.modules, "hybridkv.events.publisher", raising=False)
    rc = run_main(["simulate", "--kv-events-endpoint", "tcp://*:5557", "--trace", "/nonexistent"])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip() == ('hybridkv simulate: error: --kv-events-endpoint needs the '
                                       'events extras (missing: zmq): pip install "hybridkv[events]"')


def test_the_ray_executor_without_ray_says_what_to_install(monkeypatch, capsys) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else find_spec(name, *a))
    assert run_main(["sweep", "--executor", "ray", "--trace", "/nonexistent"]) == 2
    assert '--executor ray needs Ray: pip install "hybridkv[ray]"' in capsys.readouterr().err


@pytest.mark.parametrize("make, message", [
    (lambda: __import__("hybridkv.sched", fromlist=["x"]).EngineRequest(
        __import__("hybridkv").Request("r", [1]), True), "request 'r': max_tokens must be an integer >= 1, got True"),
    (lambda: __import__("hybridkv.sched", fromlist=["x"]).AcceptanceModel(2.0, rate=0.5),
     "num_speculative_tokens must be an integer >= 1, got 2.0"),
    (lambda: __import__("hybridkv.sim.bounds.optimal", fromlist=["x"]).belady_block_hit_rate([], -1),
     "capacity_blocks must be an integer >= 0, got -1"),
    (lambda: __import__("hybridkv.cost.presets", fromlist=["x"]).get_preset("llama-3.1-8b").with_block_size(16.0),
     "block_size must be an integer >= 1, got 16.0"),
    (lambda: __import__("hybridkv.sim.cluster.routing", fromlist=["x"]).make_router(
        "approximate", __import__("hybridkv.sim.cluster.routing", fromlist=["x"]).RouterSetup(1, 16, 0)),
     "capacity_blocks must be an integer >= 1, got 0"),
    (lambda: list(__import__("hybridkv.sim.traffic.traces", fromlist=["x"]).iter_mooncake_records("x", limit=-1)),
     "limit must be None or an integer >= 0, got -1"),
    (lambda: __import__("hybridkv.connectors.kernel_blocks", fromlist=["x"]).KernelBlockMap(16, True),
     "KernelBlockMap.kernel_block_size must be an integer >= 1, got True"),
])
def test_integer_arguments_outside_core_use_the_one_check(make, message) -> None:
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == message


def test_traces_and_sweep_labels(capsys) -> None:
    res = subprocess.run([sys.executable, "-c", "import sys; from hybridkv.cli import main; "
                          "main(['traces']); assert 'torch' not in sys.modules, 'torch loaded'"],
                         capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PYTHONPATH": str(REPO / "src")})
    assert res.returncode == 0, res.stderr
    assert main(["sweep", "--retention-intervals", "none,0", "--cache-tokens", "150k", *FAST]) == 0
    assert "      none: block hit rate" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["simulate", "--gpus", "0"], ["sweep", "--workers", "x"],
                                  ["simulate", "--bogus"], ["nope"]])
def test_a_bad_option_is_one_line_not_a_usage_block(argv, capsys) -> None:
    assert run_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and ": error: " in err and "--help)" in err, err


@pytest.mark.parametrize("argv, message", [
    (["simulate", "--bogus"], "hybridkv simulate: error: unrecognized arguments: --bogus (see hybridkv simulate --help)"),
    (["sweep", "--cache-token-lists", "1M"],
     "hybridkv sweep: error: unrecognized arguments: --cache-token-lists 1M (--cache-token-lists: did "
     "you mean --cache-tokens-list?) (see hybridkv sweep --help)"),
])
def test_an_unknown_option_points_at_its_commands_help(argv, message, capsys) -> None:
    assert run_main(argv) == 2
    assert capsys.readouterr().err.strip() == message


def test_no_file_is_left_when_the_fallback_write_fails_too(tmp_path: Path, monkeypatch) -> None:
    """A write that fails at the path and again at the temporary file leaves no empty file."""
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def write(path: str) -> None:
        raise OSError(5, "Input/output error")
    with pytest.raises(OSError):
        output.write_output(str(tmp_path / "x.png"), write, "the plot")
    assert list(tmp_path.iterdir()) == []


def test_the_output_checks_change_nothing(tmp_path: Path) -> None:
    """Checking an output path before a run creates nothing and leaves an existing file as it is."""
    existing = tmp_path / "r.json"
    existing.write_text("keep")
    output.check_output_path(str(existing), "--json")
    output.check_output_path(str(tmp_path / "new.json"), "--json")
    output.check_plot_path(str(tmp_path / "p.png"), {"--json": str(existing)})
    assert existing.read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["r.json"]

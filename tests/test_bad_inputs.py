"""Bad input, CLI and API: each case gets a clear error naming the value (or a documented
behaviour), an exit status (2: bad input, 1: failure while running), and never a traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.sim import commands
from hybridkv.sim.traces import BUNDLED_TRACES, resolve_trace

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
    (["sweep", "--cache-tokens", "3M"], "--cache-tokens sets the cache size of a retention sweep"),
    (["sweep", "--retention-intervals", "none,,0"], "item 2 of 'none,,0' is empty"),
    (["sweep", "--retention-intervals", "0", "--cache-tokens-list", "1M"], "sweep one thing at a time"),
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
    ("t.jsonl", b'{"prompt_token_ids": [1, 2], "output_len": -1}\n', "'output_len' must be >= 0"),
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
    args = commands.argparse.Namespace(num_blocks=None, gpu_memory_fraction=None, cache_tokens=0)
    with pytest.raises(ValueError, match=">= 1 token, got 0"):
        commands.capacity_blocks(args, commands.get_preset("llama-3.1-8b"))


def test_generate_without_the_engine_extras_says_what_to_install(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "hybridkv.engine.generate_cli", None)  # import -> ImportError
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

    monkeypatch.setattr(commands, "cmd_presets", boom)
    assert main(["presets"]) == 1
    err = capsys.readouterr().err
    assert "internal error KeyError" in err and "Traceback" not in err
    monkeypatch.setattr(commands, "cmd_presets", oom)
    assert main(["presets"]) == 1
    assert "out of memory" in capsys.readouterr().err


def test_a_finished_result_is_never_lost(tmp_path: Path, capsys) -> None:
    calls = []

    def write(path: str) -> None:
        calls.append(path)
        if len(calls) == 1:
            raise PermissionError(13, "Permission denied")
        Path(path).write_text("result")

    saved = commands.write_output(str(tmp_path / "r.json"), write, "the JSON result")
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
    assert main(["traces"]) == 0
    assert "mooncake-synthetic" in capsys.readouterr().out


def test_bundled_request_counts_are_the_files(trace_dir_any) -> None:
    from hybridkv.sim.traces import open_trace_text
    for t in BUNDLED_TRACES.values():
        with open_trace_text(t.path) as f:
            assert sum(1 for line in f if line.strip()) == t.requests


@pytest.fixture
def trace_dir_any() -> None:
    for t in BUNDLED_TRACES.values():
        assert t.path.is_file(), f"bundled trace missing: {t.path}"


def test_the_wheel_ships_the_traces(tmp_path: Path) -> None:
    """package-data: a plain (non-editable) install carries the compressed traces."""
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
        assert f"hybridkv/sim/data/{t.file}" in names
    assert "hybridkv/sim/data/README.md" in names

"""The command line called as a function, twice in one interpreter: nothing leaks from one
call into the next (the SIGINT handler, warning filters, module-level caches), a Ctrl-C
during the first leaves the second unchanged, and the second call's output equals the first's.
"""

from __future__ import annotations

import json
import signal
import sys
import warnings
from pathlib import Path

import pytest

from hybridkv.cli import main

CHAT = ["--workload", "chat", "--no-progress", "--preset", "llama-3.1-8b"]


def _state() -> tuple:
    """What a command must leave as it found it."""
    return (signal.getsignal(signal.SIGINT), list(warnings.filters), sys.getrecursionlimit(),
            signal.getsignal(signal.SIGTERM))


def _strip_volatile(d: dict) -> dict:
    """A result without what differs between two equal runs: the keys that measure the process
    (:data:`~hybridkv.sim.result.TIMING_KEYS`: wall-clock times, whether the bounds were reused)."""
    from hybridkv.sim.result import TIMING_KEYS
    drop = {*TIMING_KEYS, "optimum_s"}
    if isinstance(d, dict):
        return {k: _strip_volatile(v) for k, v in d.items() if k not in drop}
    if isinstance(d, list):
        return [_strip_volatile(v) for v in d]
    return d


def _run_json(argv: list[str], js: Path, capsys) -> tuple[int, dict, str]:
    rc = main([*argv, "--json", str(js)])
    out = capsys.readouterr().out
    return rc, json.loads(js.read_text()), out


@pytest.mark.parametrize("extra", [
    ["--sequential", "--cache-tokens", "40k", "--hints", "session-end:0.8"],
    ["--cache-tokens", "40k", "--hints", "session-end:1:force", "--no-optimum"],
    ["--cache-tokens", "14000", "--cpu-cache-tokens", "200k", "--no-optimum"],
])
def test_simulate_twice_in_one_process_gives_the_same_result(extra, tmp_path: Path, capsys) -> None:
    before = _state()
    rc1, d1, out1 = _run_json(["simulate", *CHAT, *extra], tmp_path / "a.json", capsys)
    assert rc1 == 0 and _state() == before
    rc2, d2, out2 = _run_json(["simulate", *CHAT, *extra], tmp_path / "b.json", capsys)
    assert rc2 == 0 and _state() == before
    assert _strip_volatile(d1) == _strip_volatile(d2)
    assert d1["requests"] == d2["requests"] > 0


def test_cost_twice_and_between_two_presets_prints_the_same(capsys) -> None:
    """A model's cached constants (weights by token count, hit rules) must not carry over to
    another preset or GPU count: a, then b, then a again gives a's output."""
    before = _state()
    a = ["cost", "--preset", "deepseek-v4-style", "--step", "1@4096x64", "--step", "2048@0", "--json"]
    b = ["cost", "--preset", "gemma-3-27b", "--gpus", "2", "--step", "1@4096x64", "--step", "2048@0",
         "--json"]
    outs = []
    for argv in (a, b, a, b):
        assert main(argv) == 0
        outs.append(json.loads(capsys.readouterr().out))
        assert _state() == before
    assert outs[0] == outs[2] and outs[1] == outs[3] and outs[0] != outs[1]
    # deepseek-v4-style's default deployment: DP-16 attention + EP-16 (one rank's step: 1 GPU)
    assert outs[0]["num_gpus"] == 1 and outs[0]["deployment"]["gpus"] == 16
    assert outs[1]["num_gpus"] == 2


def test_a_bad_option_then_a_good_run(capsys) -> None:
    before = _state()
    with pytest.raises(SystemExit) as exc:
        main(["cost", "--step", "1@4096", "--gpus", "0"])
    assert exc.value.code == 2
    assert main(["cost", "--step", "1@4096", "--json"]) == 0
    capsys.readouterr()
    assert main(["simulate", "--trace", "/nonexistent.jsonl", "--cpu-bandwidth", "3"]) == 2
    assert "has no effect without --cpu-cache-tokens" in capsys.readouterr().err
    assert _state() == before


def test_ctrl_c_in_process_restores_the_handler_and_the_next_run_is_whole(tmp_path: Path, capsys,
                                                                          monkeypatch) -> None:
    """SIGINT raised for real (through the command's own handler) at the 40th step of a
    simulation: exit 130, the result written partial, the handler that was there before back in
    place (not "ignore", which would swallow the user's next Ctrl-C), and a second run in the
    same process equal to an uninterrupted one."""
    from hybridkv.sim.simulator import Simulator
    argv = ["simulate", *CHAT, "--cache-tokens", "40k", "--no-optimum"]
    before = _state()
    rc, whole, _ = _run_json(argv, tmp_path / "w.json", capsys)
    assert rc == 0 and whole["partial"] is False
    real = Simulator.step
    calls = {"n": 0}

    def step(self, res, clock):
        calls["n"] += 1
        if calls["n"] == 40:
            signal.raise_signal(signal.SIGINT)
        return real(self, res, clock)

    monkeypatch.setattr(Simulator, "step", step)
    js = tmp_path / "p.json"
    rc = main([*argv, "--json", str(js)])
    captured = capsys.readouterr()
    assert rc == 130 and captured.err.rstrip().endswith("error: interrupted")
    assert signal.getsignal(signal.SIGINT) == before[0] and _state() == before
    part = json.loads(js.read_text())
    assert part["partial"] is True and 0 < part["requests"] < whole["requests"]
    monkeypatch.setattr(Simulator, "step", real)
    rc, again, _ = _run_json(argv, tmp_path / "w2.json", capsys)
    assert rc == 0 and _strip_volatile(again) == _strip_volatile(whole)
    assert _state() == before


def test_a_second_ctrl_c_while_stopping_is_ignored_then_the_handler_comes_back(tmp_path: Path,
                                                                                monkeypatch,
                                                                                capsys) -> None:
    """Two SIGINTs in a row: the first stops the run, the second (delivered while it stops)
    is ignored; afterwards a third reaches the previous handler again. Python's own handler is
    put in place first (a process started in the background inherits SIGINT ignored, where no
    handler would raise) and the inherited one is restored at the end."""
    from hybridkv.sim.simulator import Simulator
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        before = _state()
        real = Simulator.step
        calls = {"n": 0}

        def step(self, res, clock):
            calls["n"] += 1
            if calls["n"] == 10:
                try:
                    signal.raise_signal(signal.SIGINT)
                except KeyboardInterrupt:
                    signal.raise_signal(signal.SIGINT)      # the handler now ignores it
                    raise
            return real(self, res, clock)

        monkeypatch.setattr(Simulator, "step", step)
        assert main(["simulate", *CHAT, "--cache-tokens", "40k", "--no-optimum"]) == 130
        capsys.readouterr()
        assert _state() == before
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)             # the handler before the run is back
    finally:
        signal.signal(signal.SIGINT, inherited)


@pytest.mark.parametrize("argv", [
    ["sweep", "--workload", "replay", "--no-progress", "--preset", "gemma-3-27b", "--cache-tokens", "14000",
     "--cpu-cache-tokens-list", "0,4k,1M"],
    ["sweep", *CHAT, "--sequential", "--cache-tokens-list", "20k,40k", "--hints", "session-end:0.5,1",
     "--no-optimum"],
])
def test_sweep_twice_in_one_process_gives_the_same_rows(argv, tmp_path: Path, capsys) -> None:
    before = _state()
    rows = []
    for name in ("a.json", "b.json"):
        assert main([*argv, "--json", str(tmp_path / name)]) == 0
        capsys.readouterr()
        assert _state() == before
        rows.append(_strip_volatile(json.loads((tmp_path / name).read_text())))
    assert rows[0] == rows[1] and rows[0]

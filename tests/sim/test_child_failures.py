"""A helper process that dies is an error, never a silent success (issue #44, point 1).

The offline optimum's forked child and a sweep's worker process are killed with a real
``SIGKILL`` (what the kernel's out-of-memory killer sends) while the real parent waits on them:
the run raises :class:`ChildProcessDied` naming the process and the signal, the command exits
with status 1 after writing what finished (the online run's report, JSON and plot; a sweep's
finished rows). Before: a killed optimum child broke the parent's pipe, the ``BrokenPipeError``
was taken for ``| head`` and the command exited 0 with nothing written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import hybridkv.sim.bounds.optimum_job as optimal
from hybridkv.cli import main
from hybridkv.cli.simulate import optimum_memory_warning
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.sim.executors import execute
from hybridkv.sim.failures import ChildProcessDied, describe_exit
from hybridkv.sim.bounds.optimum_memory import BYTES_PER_BLOCK, estimate, is_large, key_block_size
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.traffic.workitems import WorkItem
from hybridkv.sim.traffic.workloads import ChatWorkload, get_workload, multi_turn_chat
from tests.support.processes import children

REPO = Path(__file__).resolve().parents[2]
SMALL = ["--workload", "chat", "--limit", "30", "--preset", "llama-3.1-8b", "--gpus", "1",
         "--cache-tokens", "100k", "--no-progress"]


@pytest.mark.parametrize("exitcode, text", [
    (-9, "was killed by SIGKILL (likely out of memory)"),
    (-11, "was killed by SIGSEGV"),
    (-15, "was killed by SIGTERM"),
    (-200, "was killed by signal 200"),
    (3, "exited with status 3"),
    (0, "exited with status 0"),
    (None, "did not exit"),
])
def test_describe_exit_names_the_signal(exitcode, text):
    assert describe_exit(exitcode) == text


@pytest.fixture
def killed_optimum(monkeypatch):
    """Every optimum runs in a forked child, which gets SIGKILL just before the parent asks it
    for the bound (the parent's code after that is the real one). Yields the killed pids."""
    monkeypatch.setattr(optimal, "PARALLEL_OPTIMUM_TOKENS", 0)
    monkeypatch.setattr(optimal, "_PARTS", None)      # no bounds kept from an earlier test
    real = optimal.OptimumJob.result
    killed: list[int] = []

    def result(self, online):
        assert self._child is not None, "the optimum did not run in a child"
        os.kill(self._child.pid, signal.SIGKILL)
        self._child.join(10)
        killed.append(self._child.pid)
        return real(self, online)
    monkeypatch.setattr(optimal.OptimumJob, "result", result)
    return killed


def _message(pid: int) -> str:
    return (f"the offline optimum's child process (pid {pid}) was killed by SIGKILL (likely out "
            f"of memory) before it answered")


def test_simulator_raises_with_the_online_result(killed_optimum):
    items = items_from_trace(get_workload("chat", seed=0))[:30]
    cfg = SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=3000)
    with pytest.raises(ChildProcessDied) as info:
        Simulator(cfg).run(items)
    exc = info.value
    assert str(exc) == _message(killed_optimum[0]) and exc.child == "optimum"
    online = Simulator(SimConfig(preset=cfg.preset, gpu=cfg.gpu, num_blocks=3000, optimum=False)).run(items)
    assert exc.partial.requests == 30 and exc.partial.optimal_hit_blocks is None
    assert exc.partial.hit_blocks == online.hit_blocks and exc.partial.hit_tokens == online.hit_tokens


@pytest.mark.parametrize("cluster", [[], ["--instances", "2", "--router", "kv-aware"]])
def test_simulate_exits_1_naming_the_child_and_writes_what_finished(killed_optimum, tmp_path,
                                                                     capsys, cluster):
    js, png = tmp_path / "r.json", tmp_path / "r.png"
    assert main(["simulate", *SMALL, *cluster, "--json", str(js), "--plot", str(png)]) == 1
    out, err = capsys.readouterr()
    message = _message(killed_optimum[0])
    assert err.splitlines()[-1] == (f"hybridkv simulate: error: {message}; rerun with "
                                    "--no-optimum, a larger --block-size or --limit")
    assert "block hit rate" in out and f"wrote {png}" in out and png.stat().st_size > 0
    d = json.loads(js.read_text())
    assert d["error"] == message and d["requests"] == 30 and d["optimal_block_hit_rate"] is None
    assert 0 <= d["hit_rate"] <= 1


def test_serial_sweep_row_names_the_killed_optimum_child(killed_optimum):
    items = items_from_trace(get_workload("chat", seed=0))[:20]
    preset, gpu = get_preset("llama-3.1-8b"), get_gpu("h100")
    configs = [SimConfig(preset=preset, gpu=gpu, num_blocks=3000, optimum=False),
               SimConfig(preset=preset, gpu=gpu, num_blocks=3000)]
    got = {o.index: o for o in execute(configs, items, "serial")}
    assert got[0].error is None and got[0].result.requests == 20
    assert got[1].error == f"ChildProcessDied: {_message(killed_optimum[0])}"
    # the online run finished: it is kept beside the error, without the bound
    assert got[1].result.requests == 20 and got[1].result.optimal_hit_blocks is None
    assert got[1].result.hit_blocks == got[0].result.hit_blocks


def test_serial_sweep_writes_the_online_row_of_a_killed_optimum(killed_optimum, tmp_path, capsys):
    js = tmp_path / "s.json"
    assert main(["sweep", "--workload", "chat", "--limit", "20", "--preset", "llama-3.1-8b",
                 "--gpus", "1", "--cache-tokens-list", "100k", "--no-progress", "--json", str(js)]) == 1
    err = capsys.readouterr().err
    assert f"100000: error: ChildProcessDied: {_message(killed_optimum[0])}" in err
    assert err.splitlines()[-1] == "hybridkv sweep: 1 of 1 configurations failed (see above)"
    (row,) = json.loads(js.read_text())
    assert row["error"] == f"ChildProcessDied: {_message(killed_optimum[0])}"
    assert row["requests"] == 20 and row["optimal_block_hit_rate"] is None and row["value"] == 100_000


def _descendants(pid: int) -> list[int]:
    kids = children()
    out, todo = [], [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _run_and_kill(argv: list[str], wait_for: str, pick, timeout_s: float = 240.0):
    """Run ``hybridkv argv``; once a stdout line contains ``wait_for``, SIGKILL the descendant
    processes ``pick(pid, cmdline)`` chooses (waiting up to 30 s for one). Returns the exit
    status, stdout, stderr and the killed pids."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "hybridkv.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    out: list[str] = []
    seen = threading.Event()

    def read() -> None:
        for line in proc.stdout:
            out.append(line)
            if wait_for in line:
                seen.set()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    killed: list[int] = []
    try:
        assert seen.wait(timeout_s), f"never saw {wait_for!r}: {''.join(out)[-2000:]}"
        deadline = time.monotonic() + 30
        while not killed and time.monotonic() < deadline and proc.poll() is None:
            for pid in _descendants(proc.pid):
                if pick(pid, _cmdline(pid)):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
            time.sleep(0.05)
        assert killed, "no process to kill"
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    reader.join(timeout=5)
    return rc, "".join(out), proc.stderr.read(), killed


def test_the_issue_kill_9_of_the_optimum_child(tmp_path: Path, trace_dir: Path):
    """The issue's reproduction: ``kill -9`` of the optimum's child during ``simulate --limit
    1500 --json`` (21 M prompt tokens: the bound runs in a forked child from the start)."""
    js = tmp_path / "x.json"
    rc, out, err, killed = _run_and_kill(
        ["simulate", "--trace", "mooncake-conversation", "--limit", "1500", "--preset",
         "llama-3.1-8b", "--cache-tokens", "300k", "--gpus", "1", "--no-progress", "--json", str(js)],
        "hybridkv simulate:", lambda pid, cmd: True)
    assert rc == 1, err[-2000:]
    assert len(killed) == 1 and "Traceback" not in err
    assert err.splitlines()[-1] == (f"hybridkv simulate: error: {_message(killed[0])}; rerun with "
                                    "--no-optimum, a larger --block-size or --limit")
    d = json.loads(js.read_text())
    assert d["requests"] == 1500 and d["optimal_block_hit_rate"] is None and d["error"] == _message(killed[0])
    assert "block hit rate" in out


def test_a_killed_sweep_worker_is_named(trace_dir: Path):
    """Library: the job whose worker got SIGKILL says so; the job no worker was left for too."""
    items = items_from_trace(get_workload("chat", seed=3))[:300]
    preset, gpu = get_preset("llama-3.1-8b"), get_gpu("h100")
    configs = [SimConfig(preset=preset, gpu=gpu, num_blocks=n, optimum=False) for n in (3000, 4000)]
    import multiprocessing
    killed: list[int] = []

    def progress(index: int, done: int, total: int) -> None:
        if not killed and done < total:     # job 0 is running: its first progress report
            for child in multiprocessing.active_children():
                os.kill(child.pid, signal.SIGKILL)
                killed.append(child.pid)
    got = {o.index: o for o in execute(configs, items, "processes", workers=1, progress=progress)}
    assert len(killed) == 1 and got[0].result is None and got[1].result is None
    assert got[0].error == (f"ChildProcessDied: the sweep's worker process (pid {killed[0]}) "
                            "running it was killed by SIGKILL (likely out of memory)")
    assert got[1].error == (f"ChildProcessDied: no worker process was left to run it (the sweep's "
                            f"worker process (pid {killed[0]}) was killed by SIGKILL (likely out of "
                            "memory))")


def _ray_task_pids() -> list[int]:
    """Ray workers executing a sweep job (Ray names the process after the task it runs)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit() and _cmdline(int(d)).startswith("ray::_ray_task"):
            out.append(int(d))
    return out


def test_a_killed_ray_task_is_named():
    """The Ray task running job 0 gets SIGKILL: job 0 is a ChildProcessDied error with Ray's
    reason (Ray does not retry it: max_retries=0); job 1 still runs on a new worker. The
    workload is long enough (about 1,200 requests) that the task is still running when the
    driver, however loaded the machine, reads its first progress report and kills it."""
    pytest.importorskip("ray")
    items = items_from_trace(multi_turn_chat(ChatWorkload(num_conversations=200), seed=3))
    preset, gpu = get_preset("llama-3.1-8b"), get_gpu("h100")
    configs = [SimConfig(preset=preset, gpu=gpu, num_blocks=n, optimum=False) for n in (3000, 4000)]
    killed: list[int] = []

    def progress(index: int, done: int, total: int) -> None:
        if not killed and done < total:
            for pid in _ray_task_pids():
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    got = {o.index: o for o in execute(configs, items, "ray", workers=1, progress=progress)}
    assert len(killed) == 1 and got[0].result is None and got[1].result.requests == len(items)
    assert got[0].error.startswith("ChildProcessDied: the Ray task running it died (WorkerCrashedError: ")


def test_sweep_exits_1_naming_the_killed_worker_and_writes_the_finished_rows(tmp_path: Path,
                                                                             trace_dir: Path):
    js = tmp_path / "s.json"
    rc, out, err, killed = _run_and_kill(
        ["sweep", "--trace", "mooncake-conversation", "--limit", "400", "--preset", "llama-3.1-8b",
         "--gpus", "1", "--cache-tokens-list", "200k,210k,220k", "--no-optimum", "--no-progress",
         "--executor", "processes", "--workers", "1", "--json", str(js)],
        "block hit rate", lambda pid, cmd: "spawn_main" in cmd)
    assert rc == 1, err[-2000:]
    assert len(killed) == 1 and "Traceback" not in err
    died = f"the sweep's worker process (pid {killed[0]})"
    # killed while running 210k, or between 200k and 210k (before it said it took the next)
    assert (f"210000: error: ChildProcessDied: {died} running it was killed by SIGKILL (likely out "
            "of memory)" in err or f"210000: error: ChildProcessDied: no worker process was left to "
            f"run it ({died} was killed by SIGKILL (likely out of memory))" in err)
    assert (f"220000: error: ChildProcessDied: no worker process was left to run it ({died} was "
            "killed by SIGKILL (likely out of memory))") in err
    assert err.splitlines()[-1] == "hybridkv sweep: 2 of 3 configurations failed (see above)"
    rows = json.loads(js.read_text())
    assert [r["value"] for r in rows] == [200_000, 210_000, 220_000]
    assert rows[0]["requests"] == 400 and "error" in rows[1] and "error" in rows[2]


# ---- the optimum's memory, estimated before the run -----------------------------------------------

def _items(*prompt_lens: int) -> list[WorkItem]:
    return [WorkItem(f"r{i}", float(i), n, 1, None) for i, n in enumerate(prompt_lens)]


def test_memory_estimate_is_bytes_per_block_times_the_prompt_blocks():
    # ceil(100/16) + ceil(16/16) + ceil(17/16) = 7 + 1 + 2 = 10 blocks
    need = estimate(_items(100, 16, 17), 16)
    assert (need.blocks, need.block_size, need.bytes) == (10, 16, 10 * BYTES_PER_BLOCK) == (10, 16, 2600)
    assert estimate(_items(100, 16, 17), 64).blocks == 2 + 1 + 1
    assert not is_large(need, 5_200) and is_large(need, 5_199) and not is_large(need, None)
    with pytest.raises(ValueError, match="block_size must be an integer >= 1, got 0"):
        estimate(_items(1), 0)


def test_memory_warning_before_the_run():
    cfg = SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=3000)
    assert key_block_size(cfg.preset.kv_config(num_blocks=3000)) == 16
    items = _items(*[16_000] * 1000)         # 1,000 blocks each: 1,000,000 blocks, 260 MB
    assert optimum_memory_warning(cfg, items, 520_000_000) is None
    assert optimum_memory_warning(cfg, items, 500_000_000) == (
        "warning: the offline optimum needs about 0.3 GB (1,000,000 prompt blocks of 16 tokens x "
        "260 B) and 0.5 GB is available: it may be killed for memory; --no-optimum skips it, a "
        "larger --block-size or a smaller --limit shrinks it")
    import dataclasses
    assert optimum_memory_warning(dataclasses.replace(cfg, optimum=False), items, 1) is None


def test_sweep_warns_about_the_optimums_memory_too(monkeypatch, capsys):
    """With 1 byte available every optimum is 'large': simulate and sweep both warn before the
    run; without the optimum neither does."""
    import hybridkv.sim.bounds.optimum_memory as om
    monkeypatch.setattr(om, "available_memory_bytes", lambda: 1)
    argv = ["--workload", "chat", "--limit", "5", "--preset", "llama-3.1-8b", "--gpus", "1",
            "--no-progress"]
    assert main(["sweep", *argv, "--cache-tokens-list", "100k"]) == 0
    err = capsys.readouterr().err
    assert "hybridkv sweep: warning: the offline optimum needs about" in err
    assert err.rstrip().endswith("(per process running a configuration)")
    assert main(["sweep", *argv, "--cache-tokens-list", "100k", "--no-optimum"]) == 0
    assert "offline optimum needs" not in capsys.readouterr().err
    monkeypatch.setattr("hybridkv.cli.simulate.available_memory_bytes", lambda: 1)
    assert main(["simulate", *argv]) == 0
    assert "hybridkv simulate: warning: the offline optimum needs about" in capsys.readouterr().err


def test_a_broken_pipe_that_is_not_stdout_is_a_failure(capsys):
    """The issue's silent exit 0: a helper's pipe broke and run_command took it for `| head`.
    Now only a standard output whose reader is gone exits 0 quietly."""
    import argparse
    from hybridkv.cli.base import run_command

    def broken(args):
        raise BrokenPipeError(32, "Broken pipe")
    args = argparse.Namespace(func=broken, command="simulate", option_names={})
    assert run_command(args) == 1
    assert capsys.readouterr().err == ("hybridkv simulate: error: a pipe to a helper process broke "
                                       "(Broken pipe): it died before it answered\n")


def test_stdout_into_a_reader_that_stopped_early_still_exits_0():
    """`hybridkv presets | head -0`: the reader is gone before the command writes; it exits 0
    with nothing on stderr (its standard output polls as broken)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "hybridkv.cli", "presets"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    proc.stdout.close()                      # the reader stops before the first line
    rc = proc.wait(timeout=60)
    assert (rc, proc.stderr.read().decode()) == (0, "")

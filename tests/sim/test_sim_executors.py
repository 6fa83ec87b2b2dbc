"""Sweep executors: serial, local processes and Ray give the same results; failures stay local."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.sim.executors import Outcome, execute
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim import SimConfig, items_from_trace
from hybridkv.sim.traffic.workloads import get_workload
from hybridkv.sim.simulator import TIMING_KEYS


def _without_wall(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING_KEYS}


@pytest.fixture(scope="module")
def sweep():
    items = items_from_trace(get_workload("system-prompt", seed=3))[:16]
    preset, gpu = get_preset("gemma-3-27b"), get_gpu("h100")
    configs = [SimConfig(preset=preset, gpu=gpu, num_blocks=n, retention_interval=r, seed=5)
               for n, r in [(3000, 0), (40, 0), (800, None), (800, 0)]]   # 40 blocks: too small
    return configs, items


def _collect(outcomes) -> dict[int, Outcome]:
    got: dict[int, Outcome] = {}
    for o in outcomes:
        assert o.index not in got
        got[o.index] = o
    return got


def _check_against_serial(got: dict[int, Outcome], serial: dict[int, Outcome]) -> None:
    assert sorted(got) == sorted(serial) == [0, 1, 2, 3]
    for i, o in serial.items():
        if o.result is None:
            assert got[i].result is None and got[i].error == o.error
        else:
            assert _without_wall(got[i].result.to_json()) == _without_wall(o.result.to_json())
            assert got[i].result.timeline == o.result.timeline


@pytest.fixture(scope="module")
def serial(sweep):
    configs, items = sweep
    got = _collect(execute(configs, items, "serial"))
    assert got[1].result is None and "cannot hold request" in got[1].error
    assert all(got[i].result is not None and got[i].result.requests == 16 for i in (0, 2, 3))
    assert got[0].result.hit_tokens > 0
    return got


def test_processes_match_serial(sweep, serial):
    configs, items = sweep
    _check_against_serial(_collect(execute(configs, items, "processes", workers=2)), serial)


def test_ray_matches_serial_and_reports_progress(sweep, serial):
    pytest.importorskip("ray")
    configs, items = sweep
    seen: dict[int, tuple[int, int]] = {}
    got = _collect(execute(configs, items, "ray", workers=2,
                           progress=lambda i, d, t: seen.__setitem__(i, (d, t))))
    _check_against_serial(got, serial)
    assert all(seen[i] == (len(items), len(items)) for i, o in got.items() if o.result is not None)


@pytest.mark.parametrize("kw, message", [
    (dict(executor="threads"), "unknown executor 'threads'; choose one of serial, processes, ray"),
    (dict(executor="processes", workers=0), "workers must be None or an integer >= 1, got 0"),
    (dict(executor="processes", ray_address="auto"), "needs executor 'ray'"),
    (dict(executor="serial", workers=2), "needs executor 'processes' or 'ray'"),
])
def test_bad_arguments_are_named(sweep, kw, message):
    configs, items = sweep
    with pytest.raises(ValueError, match=message):
        execute(configs, items, **kw)


def test_cli_sweep_processes_streams_and_keeps_failures(tmp_path: Path, trace_dir: Path, capsys):
    argv = ["sweep", "--trace", "mooncake-conversation", "--limit", "30",
            "--cache-tokens-list", "100k,3k,1M", "--no-progress", "--preset", "llama-3.1-8b"]
    js = {e: tmp_path / f"{e}.json" for e in ("serial", "processes")}
    assert main(argv + ["--json", str(js["serial"])]) == 1            # 3k tokens cannot hold one
    err = capsys.readouterr().err
    assert "3000: error: RuntimeError: the KV cache cannot hold request" in err
    assert "1 of 3 configurations failed" in err
    assert main(argv + ["--json", str(js["processes"]), "--executor", "processes", "--workers", "2"]) == 1
    rows = {e: [_without_wall(r) for r in json.loads(p.read_text())] for e, p in js.items()}
    assert rows["serial"] == rows["processes"]
    assert [r["value"] for r in rows["serial"]] == [100_000, 3_000, 1_000_000]
    assert set(rows["serial"][1]) == {"value", "error"} and rows["serial"][0]["requests"] == 30


def test_cli_rejects_bad_executor_options(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--workers", "0"])
    assert "must be an integer >= 1, got '0'" in capsys.readouterr().err
    assert main(["sweep", "--workload", "replay", "--ray-address", "auto", "--no-progress"]) == 2
    assert "--ray-address auto needs --executor ray" in capsys.readouterr().err
    assert main(["sweep", "--workload", "replay", "--workers", "2", "--no-progress"]) == 2
    assert "--workers 2 needs --executor processes or ray" in capsys.readouterr().err


def test_cli_sweep_row_says_n_a_for_what_was_not_measured(capsys):
    assert main(["sweep", "--workload", "replay", "--limit", "5", "--sequential", "--no-optimum",
                 "--cache-tokens-list", "1M", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "optimum n/a" in out and "TTFT p50 n/a" in out and "None" not in out


def test_optimum_keys_are_reused_across_capacities(sweep, monkeypatch):
    import hybridkv.sim.bounds.bound_inputs as sim
    _, items = sweep
    monkeypatch.setattr(sim, "_OPTIMUM_KEYS", None)
    first = [sim.optimal_hit_blocks(items, 16, c) for c in (30, 300, 3000)]
    assert sim._OPTIMUM_KEYS is not None and sim._OPTIMUM_KEYS[0] is items
    fresh = []
    for c in (30, 300, 3000):                  # a new list each time: nothing is reused
        monkeypatch.setattr(sim, "_OPTIMUM_KEYS", None)
        fresh.append(sim.optimal_hit_blocks(list(items), 16, c))
    assert first == fresh and first[0] < first[1] <= first[2]
    assert sim.optimal_hit_blocks(items, 32, 300) <= first[1] * 2   # another block size: recomputed
    assert sim._OPTIMUM_KEYS[1] == 32

"""The cluster simulator and its routers (small workloads; the full traces are in
benchmarks/bench_cluster.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hybridkv.sim.cluster import ClusterSimulator, offered_load
from hybridkv.sim.presets import get_gpu, get_preset
from hybridkv.sim.routing import ROUTERS, InstanceLoad, RouteDecision, Router, RouterSetup, make_router
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.sim.workloads import get_workload


def config(blocks: int, **kw) -> SimConfig:
    return SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=blocks,
                     optimum=False, **kw)


def chat(n: int = 24, turns: int = 4, rate: float = 4.0, seed: int = 0):
    return items_from_trace(get_workload("chat", num_conversations=n, turns=turns,
                                         arrival_rate=rate, seed=seed))


def test_one_instance_cluster_is_the_single_simulator() -> None:
    items = chat()
    single = Simulator(config(3000)).run(items)
    for router in ROUTERS:
        res = ClusterSimulator(config(3000), 1, router).run(items)
        r = res.instances[0]
        assert (r.hit_tokens, r.prompt_tokens, r.steps, r.output_tokens) == \
            (single.hit_tokens, single.prompt_tokens, single.steps, single.output_tokens)
        assert r.ttft_s == pytest.approx(single.ttft_s)
        assert res.routed_requests == [len(items)] and res.load_imbalance == 1.0


def test_kv_aware_index_mirrors_every_instance_and_beats_round_robin() -> None:
    items = chat(n=32, turns=5, rate=30.0, seed=4)   # busy enough that the queue term spreads
    rr = ClusterSimulator(config(1500), 4, "round-robin").run(items)
    sim = ClusterSimulator(config(1500), 4, "kv-aware")
    kv = sim.run(items)
    for inst in sim.instances:                       # in-process events == the pool, per instance
        pool = inst.sim.kv.pool
        want = Counter(pool.block_hash[b] for b in range(1, len(pool.block_hash))
                       if pool.block_hash[b] is not None and pool.block_group[b] == sim.key_group)
        assert sim.index.num_blocks(inst.idx) == len(want)
        for x in want:
            assert inst.idx in sim.index.holders(sim.key_group, x)
    sim.index.check()
    a, b = kv.to_json(), rr.to_json()
    assert a["requests"] == b["requests"] == len(items)
    assert a["hit_rate"] > 1.2 * b["hit_rate"]      # measured 0.727 vs 0.547
    assert kv.predicted_hit_tokens > 0
    assert 1.0 <= kv.load_imbalance < 2.0


def test_approximate_router_keeps_its_history_within_capacity() -> None:
    r = make_router("approximate", RouterSetup(num_instances=2, block_size=16, capacity_blocks=5))
    loads = [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)]
    hs = [bytes([i]) * 4 for i in range(8)]
    d1 = r.route(hs, 8 * 16, loads)
    assert d1.predicted_hit_tokens == 0
    assert r.index.num_blocks(d1.instance) == 5       # only the 5 most recent are predicted
    busy = [InstanceLoad(d1.instance, 10**6, 1), InstanceLoad(1 - d1.instance, 0, 0)]
    d2 = r.route(hs[:3] + [b"x" * 4], 4 * 16, busy)   # its prefix left the LRU: no prediction
    assert d2.predicted_hit_tokens == 0 and d2.instance != d1.instance
    d3 = r.route(hs[3:], 5 * 16, loads)
    assert d3.instance == d1.instance and d3.predicted_hit_tokens == 4 * 16


def test_kv_aware_weighs_prefix_against_load() -> None:
    from hybridkv.events.index import KVEventIndex
    index = KVEventIndex()
    hs = [bytes([i]) * 4 for i in range(10)]
    index.add(1, 0, hs)
    r = make_router("kv-aware", RouterSetup(num_instances=3, block_size=16, capacity_blocks=100,
                                            index=index, overlap_weight=1.0))
    idle = [InstanceLoad(i, 0, 0) for i in range(3)]
    assert r.route(hs, 161, idle).instance == 1                       # the holder, when idle
    busy = [InstanceLoad(0, 0, 0), InstanceLoad(1, 10_000, 5), InstanceLoad(2, 50, 1)]
    assert r.route(hs, 161, busy).instance == 0                       # not at any queue length
    assert r.route(hs, 161, [InstanceLoad(0, 0, 0), InstanceLoad(1, 100, 1)]).instance == 1


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="num_instances must be an integer >= 1, got 0"):
        ClusterSimulator(config(100), 0)
    with pytest.raises(ValueError, match="unknown router 'nope'; valid: round-robin"):
        ClusterSimulator(config(100), 2, "nope")
    with pytest.raises(ValueError, match="overlap_weight"):
        make_router("kv-aware", RouterSetup(num_instances=1, block_size=16, capacity_blocks=1,
                                            overlap_weight=-1))


def test_a_new_router_is_one_class_and_one_registration(monkeypatch, tmp_path, capsys) -> None:
    """A toy router registered on ROUTERS (this test's copy of the table) is known by name to
    the cluster simulator and to ``simulate --router``, and its decisions are the ones used.
    Guards against a router list kept apart from the registry (a name the CLI refuses, or a
    make_router that falls through to another router)."""
    from hybridkv.cli import main
    monkeypatch.setattr(ROUTERS, "_table", dict(ROUTERS._table))

    @ROUTERS.register("last")
    class LastInstance(Router):
        calls = 0

        def route(self, hashes, prompt_len, loads):
            LastInstance.calls += 1
            return RouteDecision(len(loads) - 1, 0)

    items = chat(n=8, turns=2)
    res = ClusterSimulator(config(1500), 3, "last").run(items)
    assert res.routed_requests == [0, 0, len(items)] and LastInstance.calls == len(items)
    assert res.to_json()["router"] == "last"
    out = tmp_path / "c.json"
    assert main(["simulate", "--workload", "chat", "--limit", "10", "--instances", "2", "--router",
                 "last", "--cache-tokens", "100k", "--no-progress", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["router"] == "last" and [p["routed_requests"] for p in d["per_instance"]] == [0, 10]


def test_offered_load_warning_states_rate_and_capacity() -> None:
    items = chat(n=40, turns=3, rate=200.0)
    load = offered_load(config(1000), items, 1)
    assert load.overloaded
    msg = load.warning()
    assert "offered load exceeds capacity" in msg and "req/s" in msg and "tok/s" in msg
    calm = offered_load(config(1000), chat(n=8, turns=2, rate=0.05), 2)
    assert not calm.overloaded and calm.warning() is None


def test_cli_cluster_json_and_errors(tmp_path, capsys) -> None:
    from hybridkv.cli import main
    out = tmp_path / "c.json"
    assert main(["simulate", "--workload", "chat", "--limit", "40", "--instances", "2",
                 "--router", "least-loaded", "--cache-tokens", "100k", "--no-progress",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["router"] == "least-loaded" and d["num_instances"] == 2
    assert sum(p["routed_requests"] for p in d["per_instance"]) == d["requests"] == 40
    for key in ("hit_rate", "ttft_p50_s", "ttft_p99_s", "queue_p50_s", "queue_p99_s", "load_imbalance",
                "optimal_block_hit_rate", "evictions", "throughput_tok_s", "gap"):
        assert key in d
    assert d["kv_events_published"] == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--instances", "0"])
    assert exit_.value.code == 2
    assert "--instances: must be an integer [1, 1024], got '0'" in capsys.readouterr().err
    assert main(["simulate", "--kv-events-endpoint", "tcp://nowhere", "--limit", "2"]) == 2
    assert "malformed KV events endpoint 'tcp://nowhere'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["simulate", "--router", "fastest"])
    assert "invalid choice: 'fastest'" in capsys.readouterr().err


def test_cli_warns_when_one_instance_is_overloaded(tmp_path, capsys) -> None:
    from hybridkv.cli import main
    out = tmp_path / "s.json"
    assert main(["simulate", "--workload", "system-prompt", "--limit", "60", "--no-progress",
                 "--no-optimum", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    err = capsys.readouterr().err
    assert d["offered_load"]["overloaded"] == ("offered load exceeds capacity" in err)
    assert d["kv_events_published"] == 0


def test_cli_publishes_kv_events(tmp_path, capsys) -> None:
    pytest.importorskip("zmq")
    from hybridkv.cli import main
    out = tmp_path / "e.json"
    assert main(["simulate", "--workload", "chat", "--limit", "20", "--no-progress", "--no-optimum",
                 "--kv-events-endpoint", f"ipc://{tmp_path}/ev.sock",
                 "--kv-events-replay-endpoint", f"ipc://{tmp_path}/replay.sock",
                 "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["kv_events_published"] > 0
    assert f"{d['kv_events_published']} batches published" in capsys.readouterr().out
    assert main(["simulate", "--workload", "chat", "--limit", "8", "--no-progress", "--instances", "2",
                 "--router", "kv-aware", "--kv-events-endpoint", f"ipc://{tmp_path}/c.sock",
                 "--json", str(out)]) == 0
    assert json.loads(out.read_text())["kv_events_published"] > 0

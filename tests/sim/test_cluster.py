"""The cluster simulator and its routers (small workloads; the full traces are in
benchmarks/bench_cluster.py)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from hybridkv.sim.cluster.loop import ClusterSimulator, offered_load
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.cluster.routing import ROUTERS, InstanceLoad, RouteDecision, Router, RouterSetup, make_router
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.sim.traffic.workloads import get_workload
from hybridkv.sim.cluster.routing import RouterTuning


def config(blocks: int, **kw) -> SimConfig:
    kw.setdefault("optimum", False)
    return SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=blocks, **kw)


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


def test_one_instance_cluster_keeps_the_single_simulators_clock_between_arrivals() -> None:
    """B arrives while A's 2,000-token prefill step runs and C after both finished: the
    instance starts B when A's step ends (not at B's arrival) and jumps to C's arrival when
    idle, exactly as the single simulator does: same TTFTs, steps and makespan."""
    items = items_from_trace([_req("A", 0.0, range(2000)), _req("B", 0.001, range(5000, 5064), out=3),
                              _req("C", 7.5, range(9000, 9100), out=2)])
    single = Simulator(config(3000)).run(items)
    res = ClusterSimulator(config(3000), 1, "round-robin").run(items)
    r = res.instances[0]
    assert single.ttft_s[1] > 0.001               # B waited for A's step
    assert r.ttft_s == pytest.approx(single.ttft_s, rel=1e-12)
    assert (r.steps, r.output_tokens) == (single.steps, single.output_tokens)
    assert r.makespan_s == pytest.approx(single.makespan_s, rel=1e-12)


def test_one_instance_cluster_optimum_and_gap_are_the_single_simulators() -> None:
    """With the offline bound on, a one-instance cluster reports the single simulator's bound,
    gap report (on a sliding-window model, whose loss is partly ``retained``), what-if answers
    and non-anticipative reference; without it, none of them."""
    cfg = SimConfig(preset=get_preset("gemma-3-27b"), gpu=get_gpu("h100"), num_blocks=800,
                    optimum=True, retention_interval=0)
    items = chat(n=6, turns=3, rate=8.0, seed=1)
    single = Simulator(cfg).run(items)
    o = ClusterSimulator(cfg, 1, "round-robin").run(items).overall
    assert single.gap.retained_blocks > 0 and single.what_if is not None
    assert (o.hit_blocks, o.prompt_blocks, o.optimal_hit_blocks) == \
        (single.hit_blocks, single.prompt_blocks, single.optimal_hit_blocks)
    assert (o.gap, o.what_if, o.hazard) == (single.gap, single.what_if, single.hazard)
    off = ClusterSimulator(config(3000), 2).run(chat(n=4, turns=2)).overall
    assert (off.optimal_hit_blocks, off.gap, off.what_if, off.hazard) == (None, None, None, None)


def test_cluster_optimum_of_no_requests_and_of_one() -> None:
    """The bound's sanity check holds at its edges: no requests (0 of 0 blocks), and one
    request, which no cache can hit (the online run's 0 is the optimum)."""
    empty = ClusterSimulator(config(100, optimum=True), 2).run([])
    assert (empty.overall.requests, empty.overall.prompt_blocks, empty.overall.optimal_hit_blocks) == (0, 0, 0)
    one = ClusterSimulator(config(100, optimum=True), 2).run(items_from_trace([_req("a", 0, range(64))]))
    assert (one.overall.hit_blocks, one.overall.optimal_hit_blocks, one.overall.prompt_blocks) == (0, 0, 4)


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


# ---- the routers, one decision at a time -----------------------------------------------------


def _blocks(tag: int, n: int) -> list[bytes]:
    """``n`` distinct block hashes (a chain tagged ``tag``)."""
    return [bytes([tag, i]) for i in range(n)]


def _kv_router(held: dict[int, int], hs: list[bytes], w: float, *, group: int = 0,
               num_instances: int = 2):
    """A kv-aware router whose index says instance i holds the first ``held[i]`` of ``hs``
    (no load-skew bound: the score alone)."""
    from hybridkv.events.index import KVEventIndex
    index = KVEventIndex()
    for inst, n in held.items():
        index.add(inst, group, hs[:n])
    return make_router("kv-aware", RouterSetup(num_instances=num_instances, block_size=16,
                                               capacity_blocks=100, index=index, group=group,
                                               overlap_weight=w, max_skew=None))


def test_kv_aware_score_at_a_non_default_weight() -> None:
    """The score is ``queued + w * (prompt - hit)``. Instance 1 holds 4 blocks (64 tokens) of a
    160-token prompt and has X tokens queued; instance 0 is idle and holds nothing. At w = 4
    instance 1 costs X + 4 * 96 against 4 * 160: it wins iff X < 256, and at X = 256 the tie
    goes to fewer queued requests. Guards against formulas that agree only at w = 1
    (``w * queued + uncached``, ``queued + w * prompt - hit``, the weight dropped)."""
    hs = _blocks(1, 10)
    r = _kv_router({1: 4}, hs, 4.0)
    for queued, want in ((0, 1), (100, 1), (255, 1), (256, 0), (300, 0)):
        d = r.route(hs, 160, [InstanceLoad(0, 0, 0), InstanceLoad(1, queued, 1)])
        assert d.instance == want, queued
        assert d.predicted_hit_tokens == (64 if want == 1 else 0)
    # at w = 0.5 a hit is worth half its tokens: 64 tokens held beat at most 31 queued
    r = _kv_router({1: 4}, hs, 0.5)
    assert r.route(hs, 160, [InstanceLoad(0, 0, 0), InstanceLoad(1, 31, 1)]).instance == 1
    assert r.route(hs, 160, [InstanceLoad(0, 0, 0), InstanceLoad(1, 33, 1)]).instance == 0


def test_kv_aware_at_weight_zero_routes_by_load_alone() -> None:
    """Weight 0 is allowed (only a negative weight is refused) and ignores the prefix: the
    least queued instance wins, then the fewest requests, then the lowest index."""
    hs = _blocks(2, 6)
    r = _kv_router({0: 6}, hs, 0.0, num_instances=3)
    loads = [InstanceLoad(0, 10, 0), InstanceLoad(1, 5, 3), InstanceLoad(2, 5, 2)]
    assert r.route(hs, 200, loads).instance == 2
    assert r.route(hs, 200, [InstanceLoad(0, 5, 2), InstanceLoad(1, 5, 2), InstanceLoad(2, 9, 0)]
                   ).instance == 0


def test_kv_aware_never_predicts_the_last_token() -> None:
    """The last prompt token is always computed: a prompt of exactly 10 blocks can hit 9 of
    them (144 tokens) even where all 10 are held, and a 1-token prompt hits nothing."""
    hs = _blocks(3, 10)
    r = _kv_router({1: 10}, hs, 1.0)
    idle = [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)]
    d = r.route(hs, 160, idle)
    assert (d.instance, d.predicted_hit_tokens) == (1, 144)
    d = r.route(hs, 161, idle)
    assert (d.instance, d.predicted_hit_tokens) == (1, 160)
    d = r.route(hs[:1], 1, idle)
    assert (d.instance, d.predicted_hit_tokens) == (0, 0)


def test_kv_aware_reads_its_own_group_and_ties_go_to_fewer_requests() -> None:
    """The router scores the hashes of ``setup.group`` only: blocks held in group 0 do not
    count for a router of group 2. Among equal scores the fewest queued requests win, then the
    lowest index."""
    from hybridkv.events.index import KVEventIndex
    hs = _blocks(4, 5)
    index = KVEventIndex()
    index.add(0, 0, hs)       # instance 0 holds them in group 0
    index.add(1, 2, hs[:2])   # instance 1 holds two of them in group 2
    r = make_router("kv-aware", RouterSetup(num_instances=2, block_size=16, capacity_blocks=9,
                                            index=index, group=2, overlap_weight=1.0))
    idle = [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)]
    d = r.route(hs, 81, idle)
    assert (d.instance, d.predicted_hit_tokens) == (1, 32)
    fresh = _blocks(5, 3)
    assert r.route(fresh, 48, [InstanceLoad(0, 0, 2), InstanceLoad(1, 0, 1)]).instance == 1
    assert r.route(fresh, 48, [InstanceLoad(0, 0, 1), InstanceLoad(1, 0, 1)]).instance == 0
    # built without an index, it makes its own (empty) one
    own = make_router("kv-aware", RouterSetup(num_instances=2, block_size=16, capacity_blocks=9))
    assert own.route(hs, 81, idle) == RouteDecision(0, 0)


def test_round_robin_and_least_loaded_decisions() -> None:
    """Round-robin takes instances in turn whatever the load; least-loaded takes the fewest
    outstanding tokens, then the fewest requests, then the lowest index. Neither predicts a
    hit."""
    rr = make_router("round-robin", RouterSetup(num_instances=3, block_size=16, capacity_blocks=1))
    loads = [InstanceLoad(0, 10**6, 9), InstanceLoad(1, 0, 0), InstanceLoad(2, 0, 0)]
    assert [rr.route([], 10, loads) for _ in range(4)] == \
        [RouteDecision(0, 0), RouteDecision(1, 0), RouteDecision(2, 0), RouteDecision(0, 0)]
    ll = make_router("least-loaded", RouterSetup(num_instances=3, block_size=16, capacity_blocks=1))
    assert ll.route([], 10, [InstanceLoad(0, 7, 0), InstanceLoad(1, 3, 5), InstanceLoad(2, 3, 4)]) \
        == RouteDecision(2, 0)
    assert ll.route([], 10, [InstanceLoad(0, 3, 4), InstanceLoad(1, 3, 4), InstanceLoad(2, 9, 0)]) \
        == RouteDecision(0, 0)


def test_approximate_router_predicts_from_an_lru_of_what_it_routed() -> None:
    """With one instance every request goes there; its predicted cache is an LRU of the hashes
    routed to it, ``capacity_blocks`` long, a hash seen again becoming the most recent. After
    [a b c], [a], [d] at capacity 3, b (the least recent) is forgotten: a and c are predicted,
    b is not. The setup's block size and weight reach the router."""
    a, b, c, d = (bytes([9, i]) for i in range(4))
    r = make_router("approximate", RouterSetup(num_instances=1, block_size=8, capacity_blocks=3,
                                               overlap_weight=2.5))
    assert r.overlap_weight == 2.5 and r.block_size == 8
    one = [InstanceLoad(0, 0, 0)]
    for hs in ([a, b, c], [a], [d]):
        r.route(hs, 8 * len(hs), one)
    assert r.index.num_blocks(0) == 3
    assert r.index.prefix_match([a, c, d], 0) == {0: 3}
    assert r.index.prefix_match([b], 0) == {}
    assert r.route([a, c, b], 8 * 3 + 1, one).predicted_hit_tokens == 16     # a, c held; b not
    with pytest.raises(ValueError, match="capacity_blocks must be an integer >= 1, got 0"):
        make_router("approximate", RouterSetup(num_instances=1, block_size=8, capacity_blocks=0))


# ---- routing decisions of a whole cluster, on constructed workloads --------------------------


def _req(rid: str, t: float, tokens, out: int = 1):
    import numpy as np

    from hybridkv.sim.traffic.traces import TraceRequest
    return TraceRequest(rid, t, np.asarray(tokens, dtype=np.int64), out)


def _spy(sim: ClusterSimulator) -> list[tuple[int, int]]:
    """Record the router's (instance, predicted hit tokens) per request."""
    seen: list[tuple[int, int]] = []
    route = sim.router.route

    def recording(hashes, prompt_len, loads):
        d = route(hashes, prompt_len, loads)
        seen.append((d.instance, d.predicted_hit_tokens))
        return d
    sim.router.route = recording  # type: ignore[method-assign]
    return seen


A = list(range(1000, 1128))          # three conversations' token streams (disjoint)
B = list(range(2000, 2128))
C = list(range(3000, 3160))
D = list(range(4000, 4048))
SCENARIO = [_req("A1", 0, A[:64]), _req("B1", 0, B[:64]), _req("A2", 10, A[:96]),
            _req("C1", 20, C), _req("B2", 20, B[:96]), _req("A3", 20, A[:128]), _req("D1", 20, D)]


def test_kv_aware_cluster_routes_each_request_where_the_score_says() -> None:
    """Two llama instances (16-token blocks), kv-aware at weight 2; requests arriving together
    are routed before any step, later ones after everything has finished (1 output token).
    By hand, cost = queued + 2 * (prompt - hit):

    * A1 (64 tokens): both idle, 128 each: instance 0 (the lower index). B1: 64 + 128 against
      128: instance 1.
    * A2 at t=10 (A1 + 32 tokens): instance 0 holds A1's 4 blocks: 2 * 32 = 64 against 192.
    * C1 at t=20 (160 new tokens): 320 on both: instance 0. B2 (B1 + 32): instance 0 has 160
      queued (352), instance 1 holds 4 blocks (64): instance 1, hit 64.
    * A3 (A2 + 32, 128 tokens): instance 0 holds A2's 6 blocks: 160 + 2 * 32 = 224; instance 1
      has B2's predicted 32 uncached tokens queued: 32 + 256 = 288. Instance 0, hit 96 (at
      weight 1 as ``2 * queued + uncached`` it would be instance 1).
    * D1 (48 new tokens): 192 + 96 against 32 + 96: instance 1.

    Guards against any change of routing (a third of the requests sent elsewhere, the load or
    the hit counted differently, events not reaching the index), not only of the aggregates.
    (No load-skew bound: with the default, C1 would go to instance 1, 3 > 2 x 1.)"""
    sim = ClusterSimulator(config(3000), 2, "kv-aware", RouterTuning(overlap_weight=2.0, max_skew=None))
    seen = _spy(sim)
    res = sim.run(items_from_trace(SCENARIO))
    assert seen == [(0, 0), (1, 0), (0, 64), (0, 0), (1, 64), (0, 96), (1, 0)]
    assert res.routed_requests == [4, 3]
    assert res.routed_prompt_tokens == [64 + 96 + 160 + 128, 64 + 96 + 48]
    assert res.predicted_hit_tokens == 64 + 64 + 96
    # the predictions came true: the instances hit exactly those tokens
    assert [r.hit_tokens for r in res.instances] == [64 + 96, 64]
    assert res.load_imbalance == pytest.approx(448 / ((448 + 208) / 2))


def test_least_loaded_cluster_counts_queued_prompts() -> None:
    """Requests arriving together (no step between them) see the instances' queued prompt
    tokens: 100, 50, 30, 40 on two instances go 0 (tie), 1 (100 > 0), 1 (100 > 50), 1
    (100 > 80); a request arriving after all finished finds both idle and goes to 0."""
    reqs = [_req(f"r{i}", 0, range(5000 + 1000 * i, 5000 + 1000 * i + n))
            for i, n in enumerate((100, 50, 30, 40))] + [_req("late", 30, range(9000, 9010))]
    sim = ClusterSimulator(config(3000), 2, "least-loaded")
    seen = _spy(sim)
    res = sim.run(items_from_trace(reqs))
    assert [i for i, _ in seen] == [0, 1, 1, 1, 0]
    assert res.routed_requests == [2, 3] and res.routed_prompt_tokens == [110, 120]


def _spy_loads(sim: ClusterSimulator) -> list[list]:
    """Record the loads the router is shown, per request."""
    seen: list[list] = []
    route = sim.router.route

    def recording(hashes, prompt_len, loads):
        seen.append(list(loads))
        return route(hashes, prompt_len, loads)
    sim.router.route = recording  # type: ignore[method-assign]
    return seen


def test_the_router_sees_queued_tokens_and_queued_requests() -> None:
    """Requests of 50, 100, 50 and 10 tokens arrive together on two least-loaded instances:
    0, 1, 0, then a tie at 100 queued tokens each, broken by the fewer queued requests
    (instance 1 has one, instance 0 two)."""
    reqs = [_req(f"r{i}", 0, range(1000 * (i + 1), 1000 * (i + 1) + n))
            for i, n in enumerate((50, 100, 50, 10))]
    sim = ClusterSimulator(config(3000), 2, "least-loaded")
    loads = _spy_loads(sim)
    res = sim.run(items_from_trace(reqs))
    assert loads[3] == [InstanceLoad(0, 100, 2), InstanceLoad(1, 100, 1)]
    assert res.routed_requests == [2, 2] and res.routed_prompt_tokens == [100, 110]


def test_queued_tokens_are_the_prompt_minus_the_predicted_hit() -> None:
    """In the kv-aware scenario above, A3 sees instance 0 with C1's 160 tokens queued and
    instance 1 with B2's 96 minus its predicted 64. A router that claims a whole prompt is
    cached adds nothing to the queue (never a negative or a token more)."""
    sim = ClusterSimulator(config(3000), 2, "kv-aware", RouterTuning(overlap_weight=2.0, max_skew=None))
    loads = _spy_loads(sim)
    sim.run(items_from_trace(SCENARIO))
    assert loads[5] == [InstanceLoad(0, 160, 1), InstanceLoad(1, 32, 1)]
    assert loads[6] == [InstanceLoad(0, 160 + 32, 2), InstanceLoad(1, 32, 1)]

    sim = ClusterSimulator(config(3000), 1, "round-robin")
    route = sim.router.route
    sim.router.route = lambda h, n, ld: RouteDecision(route(h, n, ld).instance, n)  # type: ignore[method-assign]
    loads = _spy_loads(sim)
    sim.run(items_from_trace([_req("a", 0, range(64)), _req("b", 0, range(100, 164))]))
    assert loads[1] == [InstanceLoad(0, 0, 1)]


def test_the_router_keys_on_the_first_full_attention_group() -> None:
    """With the sliding-window group first, the router's index and its hashes are the full
    group's (group 1): each follow-up's predicted hit is what the instance then hits. A model
    of sliding-window layers only keys on its one group."""
    import dataclasses
    gemma = get_preset("gemma-3-27b")
    swa_first = dataclasses.replace(gemma, groups=(gemma.groups[1], gemma.groups[0]))
    cfg = SimConfig(preset=swa_first, gpu=get_gpu("h100"), num_blocks=3000, optimum=False)
    reqs = [_req("A1", 0, A[:64]), _req("A2", 10, A[:96]), _req("A3", 20, A[:128])]
    sim = ClusterSimulator(cfg, 2, "kv-aware", RouterTuning(max_skew=None))     # the score alone
    assert (sim.key_group, sim.router.group, sim.key_block) == (1, 1, 16)
    res = sim.run(items_from_trace(reqs))
    assert res.predicted_hit_tokens == sum(r.hit_tokens for r in res.instances) == 64 + 96
    only_swa = dataclasses.replace(gemma, groups=(gemma.groups[1],))
    sim = ClusterSimulator(dataclasses.replace(cfg, preset=only_swa), 2, "kv-aware", RouterTuning(
        max_skew=None))
    assert (sim.key_group, sim.router.group) == (0, 0)
    assert sim.run(items_from_trace(reqs)).routed_requests == [3, 0]


def test_the_routers_hashes_prove_the_boundary_token_like_the_instances() -> None:
    """With EAGLE's hash lookahead each block's hash also covers the next token; the router
    hashes the same way, so a follow-up's predicted hit is the hit its instance finds."""
    from hybridkv.core.spec_decode import SpecDecode
    cfg = config(3000, spec=SpecDecode("eagle", 2))
    sim = ClusterSimulator(cfg, 2, "kv-aware")
    assert sim.hasher.lookahead == 1
    res = sim.run(items_from_trace([_req("A1", 0, A[:64], out=3), _req("A2", 10, A[:96])]))
    assert res.predicted_hit_tokens == sum(r.hit_tokens for r in res.instances) == 48


def test_cluster_optimum_charges_blocks_computed_elsewhere_to_routing() -> None:
    """Round-robin sends A1, A2, A3 (each extending the last) to instances 0, 1, 0. Online, A2
    hits nothing (A1 is on the other instance) and A3 hits A1's 4 blocks. An unlimited cache
    would hit 4 (A2) + 6 (A3) blocks, and so does the bound at the instances' summed capacity;
    the 6 missing blocks were all computed on the other instance: ``routed``, none evicted or
    in flight (each request finished before the next arrived)."""
    reqs = [_req("A1", 0, A[:64]), _req("A2", 10, A[:96]), _req("A3", 20, A[:128])]
    res = ClusterSimulator(config(3000, optimum=True), 2, "round-robin").run(items_from_trace(reqs))
    o = res.overall
    assert res.routed_requests == [2, 1]
    assert (o.hit_blocks, o.optimal_hit_blocks, o.prompt_blocks) == (4, 10, 4 + 6 + 8)
    g = o.gap
    assert (g.ceiling_blocks, g.online_blocks, g.routed_blocks, g.routed_requests) == (10, 4, 6, 2)
    assert (g.evicted_blocks, g.in_flight_blocks, g.retained_blocks) == (0, 0, 0)
    assert res.config["optimum_capacity_blocks"] == 2 * 2999
    assert res.to_json()["optimal_block_hit_rate"] == pytest.approx(10 / 18)



# ---- offered load, the combined result, the JSON ---------------------------------------------


def test_offered_load_numbers_by_hand() -> None:
    """1,000 prompt tokens/s against 2 instances of 300 tok/s: 600 tok/s of capacity, so only a
    hit rate above 1 - 600/1000 = 40 % keeps up. At exactly the capacity the load is not
    over it; with no capacity at all no hit rate helps (the sentence about it is left out);
    without prompt tokens nothing is needed."""
    from hybridkv.sim.cluster.loop import OfferedLoad
    load = OfferedLoad(requests=10, duration_s=5.0, arrival_rate_req_s=2.0, prompt_tok_s=1000.0,
                       instances=2, capacity_tok_s=300.0)
    assert load.cluster_capacity_tok_s == 600.0
    assert load.needed_hit_rate == pytest.approx(0.4) and load.overloaded
    tail = ("otherwise queues grow for the whole run and TTFT measures the backlog (add instances "
            "with --instances, or GPUs with --gpus).")
    assert load.warning() == (
        "warning: offered load exceeds capacity: 10 requests over 5 s = 2.00 req/s, 1,000 prompt "
        "tok/s; 2 instance(s) prefill about 600 tok/s (300 each). Only a prefix-hit rate above 40% "
        "keeps up; " + tail)
    assert load.to_json() == {"requests": 10, "duration_s": 5.0, "arrival_rate_req_s": 2.0,
                              "prompt_tok_s": 1000.0, "instances": 2,
                              "capacity_tok_s_per_instance": 300.0, "cluster_capacity_tok_s": 600.0,
                              "needed_hit_rate": pytest.approx(0.4), "overloaded": True,
                              "peak_prompt_tok_s": None, "peak_window_s": 0.0}
    even = OfferedLoad(10, 5.0, 2.0, 600.0, 2, 300.0)
    assert not even.overloaded and even.needed_hit_rate == 0.0 and even.warning() is None
    none = OfferedLoad(10, 5.0, 2.0, 600.0, 2, 0.0)
    assert none.needed_hit_rate == 1.0 and none.warning() == (
        "warning: offered load exceeds capacity: 10 requests over 5 s = 2.00 req/s, 600 prompt "
        "tok/s; 2 instance(s) prefill about 0 tok/s (0 each). " + tail)
    idle = OfferedLoad(0, 0.0, 0.0, 0.0, 1, 0.0)
    assert idle.needed_hit_rate == 0.0 and not idle.overloaded


def test_offered_load_of_a_workload() -> None:
    """Prompts of 100, 200 and 300 tokens arriving over 2 s: 1.5 req/s and 300 prompt tok/s;
    one instance's capacity is a full step of the token budget at the context of half the mean
    prompt (100 tokens), by the instance's cost model. One request has no duration and no rate."""
    import numpy as np

    from hybridkv.cost.profile import cost_model
    cfg = config(1000)
    items = items_from_trace([_req("a", 0, range(100)), _req("b", 1, range(200)),
                              _req("c", 2, range(300))])
    load = offered_load(cfg, items, 3)
    budget = cfg.sched.max_num_batched_tokens
    step = cost_model(cfg.preset, cfg.gpu).step_time_arrays(np.array([float(budget)]),
                                                            np.array([100.0]))
    assert (load.requests, load.duration_s, load.arrival_rate_req_s, load.prompt_tok_s,
            load.instances) == (3, 2.0, 1.5, 300.0, 3)
    assert load.capacity_tok_s == pytest.approx(budget / float(step))
    one = offered_load(cfg, items[:1], 1)
    assert (one.duration_s, one.arrival_rate_req_s, one.prompt_tok_s) == (0.0, 0.0, 0.0)


def test_offered_load_over_the_first_to_last_arrival() -> None:
    """The duration runs from the first arrival to the last (a trace need not start at 0):
    two requests 0.5 s apart are 4 req/s; one request, or none, has no duration and no rate.
    With no requests the capacity is a budget step at context 0."""
    import numpy as np
    cfg = config(1000)
    two = offered_load(cfg, items_from_trace([_req("a", 100.0, range(60)), _req("b", 100.5, range(40))]), 1)
    assert (two.requests, two.duration_s, two.arrival_rate_req_s, two.prompt_tok_s) == (2, 0.5, 4.0, 200.0)
    late = offered_load(cfg, items_from_trace([_req(f"r{i}", 50.0 + i, range(10)) for i in range(3)]), 1)
    assert (late.duration_s, late.arrival_rate_req_s, late.prompt_tok_s) == (2.0, 1.5, 15.0)
    none = offered_load(cfg, [], 2)
    assert (none.requests, none.duration_s, none.arrival_rate_req_s, none.prompt_tok_s) == (0, 0.0, 0.0, 0.0)
    budget = cfg.sched.max_num_batched_tokens
    step = Simulator(cfg).cost.step_time_arrays(np.array([float(budget)]), np.array([0.0]))
    assert float(none.capacity_tok_s) == budget / float(step) and not none.overloaded


def test_offered_load_capacity_is_the_instances_own_cost_model() -> None:
    """The capacity is timed by the cost model an instance of ``cfg`` steps with: the roofline
    when asked, a given profile's constants, the GPUs' count."""
    import dataclasses

    import numpy as np

    from hybridkv.cost.profile import default_profile
    base = config(1000)
    slow = dataclasses.replace(default_profile(), calibration=dataclasses.replace(
        default_profile().calibration, gemm_efficiency=0.2))
    items = items_from_trace([_req("a", 0, range(100)), _req("b", 1, range(300))])
    budget = base.sched.max_num_batched_tokens
    caps = []
    for cfg in (base, dataclasses.replace(base, cost_model="roofline"),
                dataclasses.replace(base, profile=slow), dataclasses.replace(base, num_gpus=2)):
        step = Simulator(cfg).cost.step_time_arrays(np.array([float(budget)]), np.array([100.0]))
        caps.append(float(offered_load(cfg, items, 1).capacity_tok_s))
        assert caps[-1] == budget / float(step)
    assert len(set(caps)) == 4


def test_combine_sums_counts_pools_samples_and_keeps_extremes() -> None:
    """The overall result: counts summed, TTFT and inter-token samples pooled, the longest
    makespan and the highest peak, mean usage averaged over instances, retained blocks summed
    per group, partial if any instance is."""
    from hybridkv.sim.cluster.loop import combine
    from hybridkv.sim.simulator import SimResult
    a = SimResult(requests=3, rejected=1, prompt_tokens=100, hit_tokens=40, prompt_blocks=7,
                  hit_blocks=2, output_tokens=9, steps=5, preemptions=1, evictions=4,
                  ttft_s=[0.1], itl_s=[0.01], makespan_s=2.0, mean_usage=0.2, peak_usage=0.9,
                  retained_blocks={"full": 3, "swa": 1})
    b = SimResult(requests=2, rejected=0, prompt_tokens=50, hit_tokens=10, prompt_blocks=4,
                  hit_blocks=1, output_tokens=6, steps=8, preemptions=2, evictions=0,
                  ttft_s=[0.3, 0.2], itl_s=[], makespan_s=5.0, mean_usage=0.6, peak_usage=0.7,
                  retained_blocks={"full": 5}, partial=True)
    c = combine([a, b])
    assert (c.requests, c.rejected, c.prompt_tokens, c.hit_tokens, c.prompt_blocks, c.hit_blocks,
            c.output_tokens, c.steps, c.preemptions, c.evictions) == (5, 1, 150, 50, 11, 3, 15, 13, 3, 4)
    assert c.ttft_s == [0.1, 0.3, 0.2] and c.itl_s == [0.01]
    assert (c.makespan_s, c.peak_usage, c.mean_usage) == (5.0, 0.9, pytest.approx(0.4))
    assert c.retained_blocks == {"full": 8, "swa": 1} and c.partial
    assert not combine([a]).partial
    assert combine([]).mean_usage == 0.0


def test_cluster_json_per_instance_and_queueing() -> None:
    """The JSON of a cluster result: a single run's keys over the combined result, the
    queueing percentiles over every instance's samples, and per instance its own keys (no
    config, gap, what-if or retained blocks) with what was routed to it. Imbalance is the
    busiest instance's routed prompt tokens over the mean (1.0 when nothing was routed)."""
    from hybridkv.sim.cluster.loop import ClusterResult
    from hybridkv.sim.simulator import SimResult
    r0, r1 = SimResult(requests=2, prompt_tokens=30), SimResult(requests=1, prompt_tokens=90)
    res = ClusterResult(router="x", instances=[r0, r1], queue_s=[[1.0, 3.0], [2.0]],
                        routed_requests=[2, 1], routed_prompt_tokens=[30, 90],
                        predicted_hit_tokens=7, kv_events_published=4, config={"k": 1})
    d = res.to_json()
    # the cluster's own wall time, partial flag and offered load, not the combined result's
    from hybridkv.sim.cluster.loop import OfferedLoad
    load = OfferedLoad(10, 5.0, 2.0, 1000.0, 2, 300.0)
    own = ClusterResult(router="x", instances=[r0, r1], queue_s=[[], []], routed_requests=[2, 1],
                        routed_prompt_tokens=[30, 90], offered=load, wall_s=2.5, partial=True)
    j = own.to_json()
    assert (j["wall_s"], j["partial"], j["offered_load"]) == (2.5, True, load.to_json())
    assert (d["requests"], d["prompt_tokens"], d["router"], d["num_instances"]) == (3, 120, "x", 2)
    assert (d["queue_p50_s"], d["queue_mean_s"]) == (2.0, 2.0)
    assert d["queue_p99_s"] == pytest.approx(2.98)
    assert d["load_imbalance"] == pytest.approx(90 / 60) == res.load_imbalance
    assert (d["predicted_hit_tokens"], d["kv_events_published"], d["config"]) == (7, 4, {"k": 1})
    assert d["offered_load"] is None and d["partial"] is False
    p0, p1 = d["per_instance"]
    assert (p0["instance"], p0["routed_requests"], p0["routed_prompt_tokens"]) == (0, 2, 30)
    assert (p1["instance"], p1["queue_p50_s"], p1["queue_mean_s"], p1["prompt_tokens"]) == (1, 2.0, 2.0, 90)
    assert not {"config", "gap", "what_if", "retained_blocks"} & set(p0)
    empty = ClusterResult("x", [SimResult()], [[]], [0], [0])
    assert empty.load_imbalance == 1.0
    assert empty.to_json()["queue_p50_s"] is None and empty.to_json()["queue_mean_s"] is None


def test_cluster_config_record_is_the_single_simulators() -> None:
    """The result's config record names what each instance ran with, under the single
    simulator's keys (``num_blocks_per_instance`` its ``num_blocks``), plus the cluster's own:
    the instances, the router and the bound's capacity over all instances."""
    from hybridkv.sched import SchedulerConfig
    from hybridkv.sim.simulator import PrefixRetention
    cfg = config(1000, num_gpus=2, retention_interval=None, seed=5, eviction_policy="priority",
                 prefix_retention=PrefixRetention(32, 10, 5.0),
                 sched=SchedulerConfig(max_num_batched_tokens=1024, max_num_seqs=7))
    items = items_from_trace([_req("a", 0, range(64)), _req("b", 1, range(100, 164))])
    one = Simulator(cfg).run(items).config
    shared = ("preset", "weight_dtype", "gpu", "num_gpus", "block_size", "cache_tokens", "key_block_size",
              "retention_interval", "eviction_policy", "prefix_retention",
              "max_num_batched_tokens", "max_num_seqs", "seed", "tiers")
    want = {k: one[k] for k in shared} | {
        "num_blocks_per_instance": one["num_blocks"], "instances": 3, "router": "least-loaded",
        "router_max_skew": None, "spec": one["spec"],
        "deployment": {**one["deployment"], "dp": 3, "gpus": 6, "name": "3 x TP-2"},   # 3 of TP-2
        "optimum_capacity_blocks": 3 * one["optimum_capacity_blocks"]}
    assert want["prefix_retention"] == "32:10:5" and want["num_gpus"] == 2
    res = ClusterSimulator(cfg, 3, "least-loaded").run(items)
    assert res.config == want and res.to_json()["config"] == want and res.overall.config == want
    plain = ClusterSimulator(config(1000), 2).run(items).config
    assert plain["prefix_retention"] is None and plain["eviction_policy"] == "lru"
    assert plain["router_max_skew"] == 2.0            # kv-aware honours the default bound


def test_an_idle_instance_has_no_makespan_and_a_finished_run_is_not_partial() -> None:
    """Round-robin sends the one request (arriving at t=5) to instance 0: its makespan is the
    single simulator's; instance 1 never stepped, so its makespan is 0 (not the arrival its
    clock jumped to). A run that finished is not partial, and its wall times are its own."""
    import time
    items = items_from_trace([_req("a", 5.0, range(64), out=3)])
    single = Simulator(config(1000)).run(items)
    t0 = time.perf_counter()
    res = ClusterSimulator(config(1000), 2, "round-robin").run(items)
    elapsed = time.perf_counter() - t0
    assert [r.steps for r in res.instances] == [single.steps, 0]
    assert [r.makespan_s for r in res.instances] == [single.makespan_s, 0.0]
    assert not res.partial and not res.overall.partial and not any(r.partial for r in res.instances)
    assert res.to_json()["partial"] is False
    assert 0 < res.overall.wall_s <= res.wall_s <= elapsed


def test_queueing_is_first_admission_minus_arrival() -> None:
    """One seat (``max_num_seqs=1``): A and B arrive together at t=1; A is admitted at once
    (0 s queued), B when A's one-token run ends, A's TTFT later. An event sink is handed each
    step's start and end: back to back from the arrival to the makespan."""
    from hybridkv.sched import SchedulerConfig
    steps: list[tuple[float, float]] = []
    cfg = config(1000, sched=SchedulerConfig(max_num_seqs=1))
    sim = ClusterSimulator(cfg, 1, "round-robin", event_sinks=[lambda s, e, evs: steps.append((s, e))])
    res = sim.run(items_from_trace([_req("A", 1.0, range(64)), _req("B", 1.0, range(100, 164))]))
    r = res.instances[0]
    assert res.queue_s == [[0.0, r.ttft_s[0]]] and r.ttft_s[0] > 0
    assert len(steps) == r.steps == 2
    assert steps[0][0] == 1.0 and steps[0][1] == steps[1][0] and steps[1][1] == r.makespan_s


def test_progress_counts_finished_requests() -> None:
    """``progress(done, total)`` after routing request 0, 256, 512, ... and at the end: 300
    one-token requests a second apart (each finished before the next arrives) report 0, 256,
    then 300 of 300."""
    reqs = [_req(f"r{i}", float(i), range(16 * i, 16 * i + 16)) for i in range(300)]
    seen: list[tuple[int, int]] = []
    ClusterSimulator(config(1000), 2, "round-robin",
                     progress=lambda d, t: seen.append((d, t))).run(items_from_trace(reqs))
    assert seen == [(0, 300), (256, 300), (300, 300)]


def test_progress_while_draining_every_2048_steps() -> None:
    """After routing, the instances run to the end with a report every 2048 steps: B (10
    tokens) and A (2048 tokens, its last at step 2048) report 2 done at step 2048, then the end."""
    reqs = [_req("A", 0, range(16), out=2048), _req("B", 0, range(100, 116), out=10)]
    seen: list[tuple[int, int]] = []
    res = ClusterSimulator(config(1000), 1, progress=lambda d, t: seen.append((d, t))).run(items_from_trace(reqs))
    assert res.instances[0].steps == 2048
    assert seen == [(0, 2), (2, 2), (2, 2)]


def test_outstanding_counts_predicted_then_uncomputed_tokens() -> None:
    """White box (``_Instance.outstanding``): a waiting request counts its predicted uncached
    tokens; one partly computed counts its prompt minus what is computed (never below 0); one
    that produced a token or finished is dropped from the pending list."""
    from types import SimpleNamespace

    from hybridkv.sim.cluster.loop import _Instance

    def er(computed: int, prompt: int, outputs: int = 0, finished: bool = False):
        return SimpleNamespace(num_computed_tokens=computed, num_prompt_tokens=prompt,
                               num_output_tokens=outputs, status=SimpleNamespace(finished=finished))
    inst = _Instance(0, None)  # type: ignore[arg-type]
    waiting, partial, over = er(0, 100), er(40, 100), er(120, 100)
    inst.pending = [(waiting, 70), (partial, 100), (er(100, 100, outputs=1), 5),
                    (er(0, 50, finished=True), 50), (over, 9)]
    assert inst.outstanding() == 70 + 60 + 0
    assert inst.pending == [(waiting, 70), (partial, 100), (over, 9)]


# ---- the cluster's plumbing: events, rejections, interruption, jobs --------------------------


def test_only_the_key_groups_events_reach_the_index_and_sinks_get_them_all() -> None:
    """On a hybrid preset (full + sliding window) the router's index holds exactly the key
    group's cached hashes of each instance, never the window group's; an event sink per
    instance sees every step's events (both groups). A router that needs no events leaves the
    index empty while sinks still receive them."""
    cfg = SimConfig(preset=get_preset("gemma-3-27b"), gpu=get_gpu("h100"), num_blocks=1500,
                    optimum=False)
    items = chat(n=6, turns=3, rate=100.0, seed=1)   # busy: both instances get requests
    got: list[list] = [[], []]
    sinks = [lambda s, e, evs, i=i: got[i].extend(evs) for i in range(2)]
    sim = ClusterSimulator(cfg, 2, "kv-aware", event_sinks=sinks)
    assert sim.key_group == 0 and sim.key_block == 16
    res = sim.run(items)
    for inst in sim.instances:
        cached = inst.sim.kv.pool.index       # per group: hash -> block(s)
        assert sim.index.num_blocks(inst.idx) == len(cached[0]) > 0 and len(cached[1]) > 0
        assert all(inst.idx in sim.index.holders(0, h) for h in cached[0])
        assert {getattr(ev, "group_idx", None) for ev in got[inst.idx]} >= {0, 1}
    assert res.index_blocks == sum(sim.index.num_blocks(i) for i in range(2))
    quiet = ClusterSimulator(cfg, 2, "round-robin", event_sinks=[lambda *a: None] * 2)
    assert quiet.run(items).index_blocks == 0 and quiet.instances[0].sim.kv.take_events() == []
    assert ClusterSimulator(cfg, 2, "approximate").router.capacity == (1500 - 1) // 2


def test_no_kv_events_are_recorded_without_a_consumer() -> None:
    """Only a router that reads the index, or an event sink, makes the instances record KV
    events: a round-robin cluster without sinks keeps none (nothing piles up), and the
    kv-aware index takes every event it is given."""
    for router in ("round-robin", "kv-aware"):
        sim = ClusterSimulator(config(1000), 2, router)
        sim.run(chat(n=4, turns=2))
        assert all(inst.sim.kv.take_events() == [] for inst in sim.instances)
        assert all(inst.sim.kv.enable_events == (router == "kv-aware") for inst in sim.instances)


def test_a_prefix_cache_reset_leaves_the_index() -> None:
    """An instance's prefix-cache reset (its ``AllBlocksCleared``, which names no group)
    removes that instance, and only it, from the router's index at its next step."""
    from types import SimpleNamespace
    sim = ClusterSimulator(config(3000), 2, "kv-aware", RouterTuning(overlap_weight=2.0))
    sim.run(items_from_trace(SCENARIO))                # both instances hold blocks
    before = [sim.index.num_blocks(i) for i in range(2)]
    assert min(before) > 0
    inst = sim.instances[0]
    assert inst.sim.kv.reset_prefix_cache()
    for hook in inst.sim.step_hooks:                  # what the instance's next step calls
        hook(inst.clock, inst.clock, SimpleNamespace(admitted=[]))
    assert [sim.index.num_blocks(i) for i in range(2)] == [0, before[1]]


def test_cluster_refuses_a_sequential_config_and_a_wrong_number_of_sinks() -> None:
    with pytest.raises(ValueError, match="^a cluster simulation is timed; --sequential does not apply$"):
        ClusterSimulator(config(100, sequential=True), 2)
    with pytest.raises(ValueError, match=r"need one event sink per instance \(2\), got 1"):
        ClusterSimulator(config(100), 2, event_sinks=[lambda *a: None])


def test_cluster_rejects_over_long_prompts_on_instance_0() -> None:
    """A prompt that reaches max_model_len is rejected (counted on instance 0, never routed);
    the others are served with their allowed output length."""
    from hybridkv.sched import SchedulerConfig
    cfg = config(3000, sched=SchedulerConfig(max_model_len=100), max_model_len=100)
    reqs = [_req("ok", 0, range(50), out=8), _req("long", 0, range(100, 200)),
            _req("ok2", 1, range(300, 390), out=50)]
    res = ClusterSimulator(cfg, 2, "round-robin").run(items_from_trace(reqs))
    assert [r.rejected for r in res.instances] == [1, 0]
    assert res.routed_requests == [1, 1] and [r.requests for r in res.instances] == [2, 1]
    assert res.overall.requests == 3 and res.overall.rejected == 1
    assert res.overall.output_tokens == 8 + 10


def test_ctrl_c_gives_the_partial_cluster_result() -> None:
    """Ctrl-C while routing raises RunInterrupted (never the bare KeyboardInterrupt) carrying
    the result so far, marked partial, timed, with no predicted hits counted."""
    import time

    from hybridkv.sim.interrupt import RunInterrupted

    def stop(done, total):
        raise KeyboardInterrupt
    sim = ClusterSimulator(config(3000), 2, "round-robin", progress=stop)
    t0 = time.perf_counter()
    try:
        sim.run(chat(n=4, turns=2))
    except RunInterrupted as exc:
        part = exc.partial
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C escaped as a bare KeyboardInterrupt, without the partial result")
    else:
        pytest.fail("Ctrl-C did not stop the run")
    elapsed = time.perf_counter() - t0
    assert part.partial and part.overall.partial and all(r.partial for r in part.instances)
    assert part.router == "round-robin" and len(part.instances) == 2
    assert part.predicted_hit_tokens == 0 and part.to_json()["partial"] is True
    assert 0 < part.wall_s <= elapsed and 0 < part.overall.wall_s <= elapsed


def test_a_failing_router_raises_its_own_error() -> None:
    """An error inside the routing loop (here the router's) propagates unchanged: only Ctrl-C
    becomes RunInterrupted."""
    sim = ClusterSimulator(config(3000, optimum=True), 2, "round-robin")

    def broken(hashes, prompt_len, loads):
        raise ValueError("router broke")
    sim.router.route = broken  # type: ignore[method-assign]
    try:
        sim.run(chat(n=2, turns=1))
    except ValueError as exc:
        assert str(exc) == "router broke"
    except KeyboardInterrupt:       # RunInterrupted is one: the error must not become it
        pytest.fail("the router's error became an interruption")
    else:
        pytest.fail("the router's error was swallowed")


def test_a_cluster_job_builds_its_cluster() -> None:
    """ClusterJob (a sweep's picklable job) builds the cluster it names: instances, router and
    weight."""
    from hybridkv.sim.cluster.loop import ClusterJob
    sim = ClusterJob(config(500), 3, "approximate", 1.5).simulator()
    assert len(sim.instances) == 3 and sim.router_name == "approximate"
    assert sim.router.overlap_weight == 1.5 and sim.router.capacity == 499
    assert ClusterJob(config(500), 2).simulator().router.overlap_weight == 4.0
    seen: list[tuple[int, int]] = []
    ClusterJob(config(500), 2).simulator(progress=lambda d, t: seen.append((d, t))).run(chat(n=2, turns=1))
    assert seen and seen[-1] == (2, 2)


def test_the_default_router_is_kv_aware_and_a_tiny_pool_predicts_one_block() -> None:
    """Without a router name the cluster routes kv-aware. The approximate router's LRU is the
    pool's share of one group, at least one block: 2 blocks (one is the null block) give 1,
    also shared by two groups."""
    assert ClusterSimulator(config(500), 2).router_name == "kv-aware"
    assert type(ClusterSimulator(config(500), 2).router).__name__ == "KVAwareRouter"
    assert ClusterSimulator(config(2), 1, "approximate").router.capacity == 1
    gemma = SimConfig(preset=get_preset("gemma-3-27b"), gpu=get_gpu("h100"), num_blocks=2,
                      optimum=False)                 # two groups share one block: still 1
    assert ClusterSimulator(gemma, 1, "approximate").router.capacity == 1


def test_kv_aware_built_directly_scores_group_0() -> None:
    """``KVAwareRouter(index, block_size)`` scores group 0 by default (the group a cluster's
    key group has in a one-group model): blocks held there count, blocks of group 1 do not."""
    from hybridkv.events.index import KVEventIndex
    from hybridkv.sim.cluster.routing.kv_aware import KVAwareRouter
    hs = _blocks(6, 4)
    index = KVEventIndex()
    index.add(1, 0, hs[:3])
    index.add(0, 1, hs)
    d = KVAwareRouter(index, 16).route(hs, 65, [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)])
    assert d == RouteDecision(1, 48)

"""The KV-aware routers' bound on load skew (issue #44, point 4).

Before: with every session sharing a system prompt, prefix affinity sent almost everything to
the instance that held it (17,148 of 17,561 Mooncake requests to instance 0). Now an instance
takes a request only while its routed requests, with it, stay within ``max_skew`` times the
other instances' mean (at least 1); the least-routed may always take it
(:func:`~hybridkv.sim.cluster.routing.base.within_skew`). Counts below are worked out by hand."""

from __future__ import annotations

import json
import math

import pytest

from hybridkv.cli import main
from hybridkv.events.index import KVEventIndex
from hybridkv.sim import SimConfig, items_from_trace
from hybridkv.sim.cluster.loop import ClusterJob, ClusterSimulator
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.sim.cluster.routing import (DEFAULT_MAX_SKEW, InstanceLoad, KVAwareRouter, RouterSetup,
                                  make_router, within_skew)
from hybridkv.sim.traffic.traces import TraceRequest
from hybridkv.sim.cluster.routing import RouterTuning

SYS = list(range(1000, 1256))          # a 256-token system prompt every request starts with


@pytest.mark.parametrize("routed, max_skew, allowed", [
    ([0, 0], 2.0, [0, 1]),
    ([1, 0], 2.0, [0, 1]),          # 2 <= 2 x max(1, 0)
    ([2, 0], 2.0, [1]),             # 3 > 2 x 1
    ([2, 1], 2.0, [1]),             # 3 > 2 x 1
    ([2, 2], 2.0, [0, 1]),
    ([3, 2], 2.0, [0, 1]),          # 4 <= 2 x 2
    ([4, 2], 2.0, [1]),             # 5 > 4
    ([4, 1, 3], 2.0, [1, 2]),       # 0: 5 > 2 x 2; 1: the least routed; 2: 4 <= 2 x 2.5
    ([1, 1], 1.0, [0, 1]),          # over the bound, but both are the least routed
    ([2, 1], 1.0, [1]),
    ([1, 0], 1.5, [1]),             # 2 > 1.5 x 1
    ([5, 0, 0], None, [0, 1, 2]),   # no bound
    ([7], 2.0, [0]),                # one instance
])
def test_within_skew_by_hand(routed, max_skew, allowed):
    assert within_skew(routed, max_skew) == allowed


@pytest.mark.parametrize("bad", [0.5, 0, -1, math.nan, "2", True])
def test_bad_max_skew_is_named(bad):
    with pytest.raises(ValueError) as info:
        KVAwareRouter(KVEventIndex(), 16, max_skew=bad)
    assert str(info.value) == f"max_skew must be None (no bound) or a number >= 1, got {bad!r}"


def _shared_prefix_routes(router, n: int = 12) -> list[int]:
    """Route ``n`` identical requests (the system prompt's 16 blocks + one token) to 2 idle
    instances."""
    hs = [bytes([7, i]) for i in range(16)]
    idle = [InstanceLoad(0, 0, 0), InstanceLoad(1, 0, 0)]
    return [router.route(hs, 16 * 16 + 1, idle).instance for _ in range(n)]


# Instance 0 holds the prefix (or wins the tie by index) and takes every request the bound
# allows; instance 1 only the ones it must: counts (1,0) (2,0) (2,1) (2,2) (3,2) (4,2) (4,3)
# (5,3) (6,3) (6,4) (7,4) (8,4).
BOUNDED_2 = [0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0]
# At 3: (1,0) (2,0) (3,0) (3,1) (3,2) (4,2) (5,2) (6,2) (6,3) (7,3) (8,3) (9,3).
BOUNDED_3 = [0, 0, 0, 1, 1, 0, 0, 0, 1, 0, 0, 0]


@pytest.mark.parametrize("name", ["kv-aware", "approximate"])
@pytest.mark.parametrize("max_skew, routes", [(2.0, BOUNDED_2), (3.0, BOUNDED_3), (None, [0] * 12)])
def test_every_kv_aware_router_honours_the_bound(name, max_skew, routes):
    index = KVEventIndex()
    index.add(0, 0, [bytes([7, i]) for i in range(16)])      # kv-aware: instance 0 holds it all
    router = make_router(name, RouterSetup(num_instances=2, block_size=16, capacity_blocks=100,
                                           index=index, max_skew=max_skew))
    assert router.bounds_skew and router.max_skew == max_skew
    assert _shared_prefix_routes(router) == routes
    assert router.routed == [routes.count(0), routes.count(1)]


def test_the_default_bound_is_2():
    assert DEFAULT_MAX_SKEW == 2.0 == RouterSetup(1, 16, 1).max_skew
    assert ClusterJob(_config(), 2).simulator().router.max_skew == 2.0
    assert ClusterJob(_config(), 2, max_skew=None).simulator().router.max_skew is None
    assert not make_router("round-robin", RouterSetup(2, 16, 1)).bounds_skew


def _config() -> SimConfig:
    return SimConfig(preset=get_preset("llama-3.1-8b"), gpu=get_gpu("h100"), num_blocks=3000,
                     optimum=False)


def _sessions(n: int = 12) -> list[TraceRequest]:
    """``n`` one-turn sessions, every one the system prompt + 40 tokens of its own, 10 s apart
    (each has finished, and its blocks reached the router's index, before the next arrives)."""
    return [TraceRequest(f"s{i}", 10.0 * i, SYS + [5000 + 100 * i + k for k in range(40)], 1,
                         session=f"s{i}") for i in range(n)]


@pytest.mark.parametrize("max_skew, counts", [(2.0, [8, 4]), (3.0, [9, 3]), (None, [12, 0])])
def test_cluster_with_a_shared_system_prompt(max_skew, counts):
    sim = ClusterSimulator(_config(), 2, "kv-aware", RouterTuning(max_skew=max_skew))
    res = sim.run(items_from_trace(_sessions()))
    assert res.routed_requests == counts
    assert res.request_shares == [counts[0] / 12, counts[1] / 12]
    assert res.request_skew == counts[0] / 6
    d = res.to_json()
    assert (d["request_shares"], d["request_skew"], d["router_max_skew"]) == (
        res.request_shares, res.request_skew, max_skew)


def _write_trace(path, reqs: list[TraceRequest]) -> None:
    path.write_text("".join(json.dumps({"prompt_token_ids": r.prompt.tolist(), "output_len": r.output_len,
                                        "arrival_s": r.arrival_s, "session": r.session}) + "\n"
                            for r in reqs))


def test_cli_simulate_kv_aware_bounds_the_skew_and_reports_the_balance(tmp_path, capsys):
    trace, js = tmp_path / "shared.jsonl", tmp_path / "c.json"
    _write_trace(trace, _sessions())
    argv = ["simulate", "--trace", str(trace), "--instances", "2", "--router", "kv-aware",
            "--preset", "llama-3.1-8b", "--gpus", "1", "--cache-tokens", "100k", "--no-progress",
            "--no-optimum"]
    assert main([*argv, "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert ("  balance                   requests max / mean 1.333 (instance 0: 66.7% of them); "
            "bound: each instance within 2x the others' mean") in out.splitlines()
    d = json.loads(js.read_text())
    assert [p["routed_requests"] for p in d["per_instance"]] == [8, 4]
    assert d["request_shares"] == [8 / 12, 4 / 12] and d["router_max_skew"] == 2.0
    assert main([*argv, "--router-max-skew", "none", "--json", str(js)]) == 0
    assert "requests max / mean 2.000 (instance 0: 100.0% of them); no bound" in capsys.readouterr().out
    assert json.loads(js.read_text())["router_max_skew"] is None
    assert main([*argv, "--router-max-skew", "3", "--json", str(js)]) == 0
    assert [p["routed_requests"] for p in json.loads(js.read_text())["per_instance"]] == [9, 3]


def test_cli_max_skew_errors(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--instances", "2", "--router-max-skew", "0.5"])
    assert "--router-max-skew: must be a finite number >= 1 or 'none', got '0.5'" in capsys.readouterr().err
    assert main(["simulate", "--instances", "2", "--router", "round-robin", "--router-max-skew", "2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "hybridkv simulate: error: --router-max-skew 2 is read only by --router kv-aware or "
        "approximate or tier-aware with --instances N; got --router round-robin")
    assert main(["simulate", "--router-max-skew", "none", "--limit", "2"]) == 2
    assert "--router-max-skew none is read only by --router kv-aware or approximate or tier-aware with " \
           "--instances N; got one instance" in capsys.readouterr().err
    assert main(["sweep", "--router-max-skew", "3", "--limit", "2", "--no-progress"]) == 2
    assert "--router-max-skew 3 is read only by --router kv-aware or approximate or tier-aware with " \
           "--instances or --instances-list; got one instance" in capsys.readouterr().err

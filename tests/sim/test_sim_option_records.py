"""The simulator's option records: defaults, a refused value with its message, frozen.

RouterTuning (ClusterSimulator), TierGeometry (TierRuntime), SideTask (OptimumJob),
GoodputSearch (make_plan) and the workload shapes (ChatWorkload, AgentWorkload,
SystemPromptWorkload: the generators' and ``--workload-param``'s keys).
"""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv.sim.bounds.optimum_job import SideTask
from hybridkv.sim.cluster.routing import RouterSetup, RouterTuning, TierAwareRouter
from hybridkv.sim.plan.planning import GoodputSearch
from hybridkv.sim.tiers.runtime import TierGeometry
from hybridkv.sim.traffic.workloads import (AgentWorkload, ChatWorkload, SystemPromptWorkload,
                                            multi_turn_chat, workload_keys)


def test_router_tuning() -> None:
    t = RouterTuning()
    assert (t.overlap_weight, t.max_skew) == (4.0, 2.0)
    assert RouterTuning(0.0, None).max_skew is None
    with pytest.raises(ValueError, match=r"^overlap_weight must be >= 0, got -1$"):
        RouterTuning(overlap_weight=-1)
    with pytest.raises(ValueError, match=r"^max_skew must be None \(no bound\) or a number >= 1, got 0\.5$"):
        RouterTuning(max_skew=0.5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.max_skew = 3.0  # type: ignore[misc]


def test_tier_aware_router_is_built_from_its_setup() -> None:
    holds = lambda i, g, h: False  # noqa: E731
    r = TierAwareRouter(RouterSetup(num_instances=3, block_size=16, capacity_blocks=10, group=1,
                                    overlap_weight=2.5, max_skew=None, tier_holds=holds))
    assert (r.num_instances, r.block_size, r.group, r.overlap_weight, r.max_skew) == (3, 16, 1, 2.5, None)
    assert r.tier_holds is holds


def test_tier_geometry() -> None:
    g = TierGeometry(2, 32, 16, block_bytes=[160, 416])  # type: ignore[arg-type]
    assert (g.bytes_per_token, g.num_layers, g.key_block, g.block_bytes, g.num_gpus) == \
        (2, 32, 16, (160, 416), 1)
    with pytest.raises(ValueError, match=r"^TierGeometry.num_gpus must be an integer >= 1, got 0$"):
        TierGeometry(1, 1, 16, num_gpus=0)
    with pytest.raises(ValueError, match=r"^TierGeometry.block_bytes entry must be an integer >= 1, got 0$"):
        TierGeometry(1, 1, 16, block_bytes=(8, 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.num_gpus = 2  # type: ignore[misc]


def test_side_task() -> None:
    s = SideTask(lambda: 7)
    assert s.key is None and s.run() == 7
    with pytest.raises(TypeError, match=r"^SideTask.run must be callable, got 3$"):
        SideTask(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^SideTask.key must be hashable or None, got \[1\]$"):
        SideTask(lambda: 0, [1])
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.key = 1  # type: ignore[misc]


def test_goodput_search() -> None:
    g = GoodputSearch()
    assert (g.rows, g.precision, g.max_runs) == (4, 1.25, 4)
    with pytest.raises(ValueError, match=r"^goodput precision must be a finite number > 1, got 1$"):
        GoodputSearch(precision=1)
    with pytest.raises(ValueError, match=r"^GoodputSearch.max_runs must be an integer >= 1, got 0$"):
        GoodputSearch(max_runs=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.rows = 1  # type: ignore[misc]


def test_workload_shapes_defaults_and_keys() -> None:
    assert dataclasses.astuple(ChatWorkload()) == (64, 6, 1024, (64, 512), (64, 512), 16, 4.0, 32_000)
    assert dataclasses.astuple(AgentWorkload()) == (16, 20, 4096, (256, 1024), (256, 2048), (16, 128), 8,
                                                    2.0, 32_000)
    assert dataclasses.astuple(SystemPromptWorkload()) == (512, 8, 2048, (32, 512), (32, 256), 0.0, 16.0,
                                                           32_000)
    assert workload_keys("chat") == ["num_conversations", "turns", "system_tokens", "user_tokens",
                                     "answer_tokens", "concurrency", "arrival_rate", "vocab_size"]
    assert workload_keys("replay") == ["a_tokens", "b_tokens", "output_len", "gap_s", "vocab_size"]
    with pytest.raises(ValueError, match="valid workloads: agentic, chat, replay, system-prompt"):
        workload_keys("nope")


@pytest.mark.parametrize("make, message", [
    (lambda: ChatWorkload(num_conversations=0), r"^num_conversations must be an integer >= 1, got 0$"),
    (lambda: ChatWorkload(user_tokens=(5, 2)),
     r"^user_tokens range must satisfy 0 <= lo <= hi, got \(5, 2\)$"),
    (lambda: AgentWorkload(arrival_rate=0.0),
     r"^arrival rate must be a positive finite number or None, got 0\.0$"),
    (lambda: AgentWorkload(tool_tokens=-1),
     r"^tool_tokens must be an integer >= 0 or a \(lo, hi\) range, got -1$"),
    (lambda: SystemPromptWorkload(zipf_s=-0.5), r"^zipf_s must be a finite number >= 0, got -0\.5$"),
    (lambda: SystemPromptWorkload(vocab_size=1), r"^vocab_size must be an integer >= 2, got 1$"),
])
def test_workload_shapes_refuse_bad_values(make, message) -> None:
    with pytest.raises(ValueError, match=message):
        make()


def test_a_workload_shape_is_frozen_and_the_seed_stays_beside_it() -> None:
    shape = ChatWorkload(num_conversations=2, turns=2, system_tokens=4, user_tokens=3, answer_tokens=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        shape.turns = 3  # type: ignore[misc]
    a, b = multi_turn_chat(shape, seed=1), multi_turn_chat(shape, seed=2)
    assert [r.prompt_len for r in a] == [7, 12, 7, 12] and [r.output_len for r in a] == [2] * 4
    assert any((x.prompt != y.prompt).any() for x, y in zip(a, b))

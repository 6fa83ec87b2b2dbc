"""The eviction-policy registry (``hybridkv.core.eviction``): names, the factory, attaching.

* every valid name builds its policy (``lru``: the plain pool; ``recommended``: ``adaptive``);
  an unknown name is refused naming it and every valid one; compat mode refuses non-LRU;
* a new policy is one class and one registration line (a toy MRU policy runs through the
  manager), and carries its registered name;
* a policy attaches to one pool only; bad policy arguments are refused by name.
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request
from hybridkv.core.eviction import (EVICTION_POLICIES, POLICIES, RECOMMENDED, RECOMMENDED_HYBRID, AdaptivePolicy,
                                    ChainARCPolicy, CostAwarePolicy, EVAPolicy, EvictionPolicy,
                                    LFUPolicy, PriorityPolicy, S3FIFOPolicy, TurnAdaptivePolicy,
                                    TurnEVAPolicy, make_policy, policy_names, resolve_policy)
from hybridkv.core.policy_pool import PolicyBlockPool
from hybridkv.core.pool import BlockPool
from tests.support.helpers import content_key
from tests.support.policies import NON_LRU, Cache, policy_config, serve_prompt
from hybridkv.core.cache_options import CacheOptions


#: the built-in policies, in registration order (a policy registered later adds to the list)
BUILT_IN = ("lru", "s3fifo", "lfu", "cost", "eva", "eva-turns", "arc", "adaptive", "adaptive-turns",
            "priority")


def test_the_valid_names_are_the_registry_lru_first_recommended_last():
    """policy_names(): ``lru``, every registered policy in registration order (the built-ins
    first, as listed), the ``recommended`` alias last; POLICIES is the same tuple."""
    names = policy_names()
    assert names[0] == "lru" and names[-1] == "recommended"
    assert names[1:-1] == EVICTION_POLICIES.names()
    assert names[:len(BUILT_IN)] == BUILT_IN and tuple(POLICIES) == names


@pytest.mark.parametrize("bad", ["LRU", "", "no-such-policy", None, 3, "adaptive "])
def test_unknown_policy_name_is_refused_naming_it_and_the_valid_names(bad):
    """resolve_policy / make_policy: the message names the bad value (repr) and every valid name."""
    msg = f"unknown eviction policy {bad!r}; valid: {', '.join(policy_names())}"
    assert msg.startswith(f"unknown eviction policy {bad!r}; valid: lru, s3fifo, lfu, cost, eva, ")
    for call in (resolve_policy, make_policy):
        with pytest.raises(ValueError) as exc:
            call(bad)
        assert str(exc.value) == msg


def test_each_policy_name_builds_its_policy():
    """make_policy maps every valid name to its class (``lru``: None, the pool's own list;
    ``recommended``: ``adaptive``); ``adaptive-turns`` challenges LRU with chain ARC and
    eva-turns, ``adaptive`` with chain ARC alone."""
    want = {"lru": type(None), "s3fifo": S3FIFOPolicy, "lfu": LFUPolicy, "cost": CostAwarePolicy,
            "eva": EVAPolicy, "eva-turns": TurnEVAPolicy, "arc": ChainARCPolicy,
            "adaptive": AdaptivePolicy, "adaptive-turns": TurnAdaptivePolicy, "priority": PriorityPolicy,
            "recommended": AdaptivePolicy}
    assert set(want) <= set(POLICIES) and set(BUILT_IN) <= set(want)
    for name, cls in want.items():
        assert type(make_policy(name)) is cls, name
        assert resolve_policy(name) == ("adaptive" if name == "recommended" else name)
    assert [type(a) for a in make_policy("adaptive").alts] == [ChainARCPolicy]
    assert [type(a) for a in make_policy("adaptive-turns").alts] == [ChainARCPolicy, TurnEVAPolicy]
    assert [type(a) for a in make_policy("recommended").alts] == [ChainARCPolicy]
    # eva-turns keeps its own horizon (64 buckets), eva its (32)
    assert make_policy("eva-turns").ages == 64 and make_policy("eva").ages == 32


def test_priority_policy_from_the_registry_reads_its_clock():
    """make_policy("priority", clock=...) uses the given clock for TTLs; the default clock is
    a working callable (time.monotonic)."""
    from hybridkv.core.retention_config import RetentionMark
    t = [0.0]
    pol = make_policy("priority", clock=lambda: t[0])
    c = Cache(pol, 4)
    a, b, d = c.pool.allocate(3)
    for blk, k in ((a, 1), (b, 2), (d, 3)):
        c.pool.insert(0, content_key(k), blk)
    c.pool.retain([a, b, d], [0], [RetentionMark(1, 90, 5.0)])       # block a: priority 90 for 5 s
    c.pool.free([a, b, d])
    t[0] = 1.0
    assert c.drain() == [2, 3, 1]                 # 1 still pinned at t = 1
    default = make_policy("priority")
    Cache(default, 4).serve([1, 2])
    assert callable(default.clock) and isinstance(default.clock(), float)


def test_a_policy_attaches_to_one_pool_only():
    """attach: a policy already owned by a pool refuses a second pool, naming itself;
    attaching again to its own pool is harmless (the base rule; ``adaptive`` attaches its
    shadows once, so it is called once, as the contract says)."""
    for name in ("s3fifo", "lfu", "arc", "eva", "adaptive", "priority"):
        pol = make_policy(name)
        first = PolicyBlockPool(4, 1, pol)
        assert pol.pool is first
        if name != "adaptive":
            pol.attach(first)
            assert pol.pool is first
        with pytest.raises(ValueError) as exc:
            PolicyBlockPool(4, 1, pol)
        assert str(exc.value) == f"eviction policy {pol.name!r} is already attached to another pool"
        assert pol.pool is first


def test_lru_keeps_the_plain_pool():
    assert type(KVCacheManager(policy_config(8)).pool) is BlockPool
    assert type(KVCacheManager(policy_config(8), CacheOptions(eviction_policy="lru")).pool) is BlockPool
    for p in NON_LRU:
        assert type(KVCacheManager(policy_config(8), CacheOptions(eviction_policy=p)).pool) is PolicyBlockPool


def test_bad_policy_names():
    for bad in ("LRU", "", "no-such-policy", None, 3):
        with pytest.raises(ValueError, match="unknown eviction policy.*valid: lru, s3fifo"):
            KVCacheManager(policy_config(8), CacheOptions(eviction_policy=bad))
    with pytest.raises(ValueError, match="vllm_compat.*must be 'lru'"):
        KVCacheManager(policy_config(8), CacheOptions(eviction_policy="s3fifo", vllm_compat=True))
    assert resolve_policy("recommended") == RECOMMENDED == "adaptive"
    assert resolve_policy("recommended", hybrid=True) == RECOMMENDED_HYBRID == "lfu"
    assert resolve_policy("arc", hybrid=True) == "arc"
    assert make_policy("lru") is None


def test_recommended_on_a_hybrid_config_is_lfu_behind_the_hit_point_layer():
    from hybridkv import FullAttention, KVCacheConfig, KVCacheGroup, SlidingWindow
    from hybridkv.core.eviction import HitPointLayer, LFUPolicy
    fa = FullAttention(block_size=4, num_kv_heads=1, head_dim=8)
    sw = SlidingWindow(block_size=2, window=4, num_kv_heads=1, head_dim=8)
    hybrid = KVCacheConfig((KVCacheGroup("fa", fa, ("l0",)), KVCacheGroup("sw", sw, ("l1",))), num_blocks=16)
    kv = KVCacheManager(hybrid, CacheOptions(eviction_policy="recommended"))
    assert kv.eviction_policy == "lfu"
    assert isinstance(kv.pool.policy, HitPointLayer) and type(kv.pool.policy.inner) is LFUPolicy
    assert KVCacheManager(policy_config(8), CacheOptions(eviction_policy="recommended")).eviction_policy == "adaptive"


class _ToyMRU(EvictionPolicy):
    """A toy policy for the registry test: evict the block freed last first (MRU)."""

    name = "toy-mru"
    __slots__ = ("held", "made_with")

    def __init__(self) -> None:
        super().__init__()
        self.held: dict[int, None] = {}           # in free order
        self.made_with: tuple = ()

    @classmethod
    def create(cls, rules, clock):
        pol = cls()
        pol.made_with = (rules, clock)
        return pol

    def __len__(self) -> int:
        return len(self.held)

    def __contains__(self, b: int) -> bool:
        return b in self.held

    def __iter__(self):
        return iter(self.held)

    def on_free(self, blocks) -> None:
        self.held.update(dict.fromkeys(blocks))

    def on_hit(self, b: int, held: bool) -> None:
        if held:
            del self.held[b]

    def pop(self, n: int) -> list[int]:
        return [self.held.popitem()[0] for _ in range(n)]

    def forget(self, blocks) -> None:
        pass


def test_a_new_policy_is_one_class_and_one_registration_line(monkeypatch):
    """Registering a toy policy makes its name valid everywhere a name is checked (the error
    lists it, compat mode refuses it) and the manager runs it through the one factory
    signature, ``create(rules, clock)``: victims in the toy's order (MRU keeps the request
    served first, LRU the one served last), integrity green. Guards against a name list or an
    if-chain beside the registry that a new policy would also have to be added to."""
    monkeypatch.setattr(EVICTION_POLICIES, "_table", dict(EVICTION_POLICIES._table))
    EVICTION_POLICIES.register("toy-mru")(_ToyMRU)
    assert resolve_policy("toy-mru") == "toy-mru" and "toy-mru" in policy_names()
    with pytest.raises(ValueError, match=r"^unknown eviction policy 'toy'; valid: lru, .*, toy-mru, recommended$"):
        resolve_policy("toy")
    with pytest.raises(ValueError, match="vllm_compat pins vLLM's LRU order; eviction_policy must be 'lru', "
                                         "got 'toy-mru'"):
        KVCacheManager(policy_config(9), CacheOptions(eviction_policy="toy-mru", vllm_compat=True))

    def run(policy: str) -> tuple[int, int]:
        clock = lambda: 0.0                                   # noqa: E731
        kv = KVCacheManager(policy_config(9), CacheOptions(eviction_policy=policy), clock=clock)
        if policy == "toy-mru":
            assert type(kv.pool) is PolicyBlockPool and type(kv.pool.policy) is _ToyMRU
            rules, got_clock = kv.pool.policy.made_with
            assert len(rules) == 1 and rules[0].block_size == 4 and got_clock is clock
        a, b = list(range(9)), list(range(100, 109))          # 2 cached blocks each
        serve_prompt(kv, "a", a)
        serve_prompt(kv, "b", b)
        serve_prompt(kv, "c", list(range(200, 221)))               # 6 blocks: evicts 2 cached ones
        kv.check_integrity()
        return kv.lookup(Request("a2", a)).num_tokens, kv.lookup(Request("b2", b)).num_tokens

    assert run("lru") == (0, 8)
    assert run("toy-mru") == (8, 0)


def test_every_registered_policy_carries_its_registered_name():
    """A policy's ``name`` (in its messages) is the key it is registered under."""
    assert len(EVICTION_POLICIES) == len(POLICIES) - 2
    for key, cls in EVICTION_POLICIES.items():
        assert cls.name == key and type(make_policy(key)) is cls


def test_bad_policy_arguments():
    from hybridkv.core.eviction.adaptive import AdaptivePolicy
    from hybridkv.core.eviction.arc import ChainARCPolicy
    for bad in (0, -1.0, "2"):
        with pytest.raises(ValueError, match="ghost_ratio"):
            ChainARCPolicy(ghost_ratio=bad)
    for bad in (-0.1, 1.0, None):
        with pytest.raises(ValueError, match="margin"):
            AdaptivePolicy(margin=bad)
    with pytest.raises(ValueError, match="challengers"):
        AdaptivePolicy(challengers=())

"""Application hints on the core API: what a :class:`Hint` accepts and refuses, the retention
configs it stands for, and where a manager takes or refuses one.

* bad hints (a negative TTL, a probability outside [0, 1], a pin longer than the prompt or
  larger than the cache) are one-line ``ValueError`` naming the value;
* a hint maps onto retention configs by the same block rule as a ``RetentionConfig``;
* hints are off by default: a manager without ``hints=True`` refuses a hinted request, and
  ``vllm_compat`` refuses ``hints=True``.
"""

from __future__ import annotations

import math

import pytest

from hybridkv import FullAttention, Hint, KVCacheConfig, KVCacheGroup, KVCacheManager, Request
from hybridkv.core.hints import (PIN_PRIORITY, RESUME_FACTOR, RESUME_MARGIN_S, RESUME_PRIORITY,
                                 hint_marks)
from hybridkv.core.pool import BlockPool
from hybridkv.core.retention_config import (MIN_PRIORITY, RetentionConfig, TokenRange,
                                            block_marks)
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def _config(num_blocks: int = 16) -> KVCacheConfig:
    return KVCacheConfig((KVCacheGroup("g", FullAttention(block_size=4, num_kv_heads=1, head_dim=4),
                                       ("l",)),), num_blocks=num_blocks)


@pytest.mark.parametrize("kwargs, names", [
    ({"pin_s": -1.0}, "-1.0"),
    ({"pin_s": 0}, "0"),
    ({"pin_s": math.inf}, "inf"),
    ({"resume_s": -0.5}, "-0.5"),
    ({"continues": 1.5}, "1.5"),
    ({"continues": -0.1}, "-0.1"),
    ({"continues": True}, "True"),
    ({"pin_tokens": 0, "pin_s": 5}, "0"),
    ({"pin_tokens": 4}, "pin_tokens=4"),
    ({"last_turn": 1}, "1"),
    ({"last_turn": True, "resume_s": 3.0}, "3.0"),
    ({"session": ["a"]}, "['a']"),
])
def test_bad_hint_is_one_line_error_naming_the_value(kwargs, names):
    with pytest.raises(ValueError) as exc:
        Hint(**kwargs)
    msg = str(exc.value)
    assert names in msg and "\n" not in msg


def test_hint_kinds_and_ends():
    assert Hint().empty and not Hint().ends
    assert Hint(last_turn=True).ends
    assert Hint(continues=0.2).ends and not Hint(continues=0.5).ends
    assert not Hint(pin_s=3).empty and not Hint(resume_s=0).empty


def test_hint_maps_onto_retention_configs():
    """Each kind is a retention config, and its marks are that config's ``block_marks``."""
    h = Hint(session="s", pin_s=30, pin_tokens=9)
    assert h.configs(20) == (RetentionConfig((TokenRange(0, 9, PIN_PRIORITY, 30.0),)),)
    r = Hint(resume_s=10)
    ttl = RESUME_FACTOR * 10 + RESUME_MARGIN_S
    assert r.configs(20) == (RetentionConfig((TokenRange(0, None, RESUME_PRIORITY, ttl),),
                                             decode_priority=RESUME_PRIORITY, decode_ttl_s=ttl),)
    end = Hint(last_turn=True)
    (cfg,) = end.configs(20)
    assert cfg.ranges[0].priority == MIN_PRIORITY
    for hint in (h, r, end):
        want = []
        for c in hint.configs(20):
            want += block_marks(c, 4, 20, 26)
        assert hint_marks(hint, 4, 20, 26) == tuple(want)


def test_pin_longer_than_prompt_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"pin_tokens=9 lies outside the prompt \(8 tokens\)"):
        Request("r", list(range(8)), RequestCacheParams(hint=Hint(pin_s=5, pin_tokens=9)))


def test_pin_larger_than_cache_is_refused_naming_it():
    kv = KVCacheManager(_config(4), CacheOptions(hints=True))          # 3 usable blocks of 4 tokens
    req = Request("big", list(range(40)), RequestCacheParams(hint=Hint(pin_s=5, pin_tokens=20)))
    with pytest.raises(ValueError, match=r"pin_tokens=20 needs 5 blocks, more than the cache holds \(3\)"):
        kv.allocate(req, 8)
    kv.check_integrity()


def test_hints_off_by_default():
    kv = KVCacheManager(_config())
    assert kv.hint_stats() is None
    assert type(kv.pool) is BlockPool          # lru without hints: the pool's own queue
    req = Request("r", list(range(8)), RequestCacheParams(hint=Hint(last_turn=True)))
    with pytest.raises(ValueError, match="carries a hint, which this manager ignores"):
        kv.allocate(req, 8)


def test_hints_refused_in_compat_mode_and_not_a_bool():
    with pytest.raises(ValueError, match="vllm_compat pins vLLM's LRU order"):
        KVCacheManager(_config(), CacheOptions(hints=True, vllm_compat=True))
    with pytest.raises(ValueError, match="hints must be True, False or 'force', got 1"):
        KVCacheManager(_config(), CacheOptions(hints=1))


def test_request_refuses_a_non_hint():
    with pytest.raises(ValueError, match="hint must be a Hint or None, got 'last'"):
        Request("r", [1, 2, 3], RequestCacheParams(hint="last"))

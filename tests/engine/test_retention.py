"""``LLM.generate(retention=...)`` reaches the manager: a pinned prefix survives a flood of
one-off prompts under ``CacheConfig(eviction_policy="priority")``; ``priority=`` stays the
scheduling priority; bad input is refused before anything is queued."""

from __future__ import annotations

import pytest

from hybridkv import RetentionConfig, TokenRange
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import Built, build_llm, random_tokens

SYSTEM = random_tokens(32, 700)                      # 4 blocks of 8 tokens
PIN = RetentionConfig((TokenRange(0, 32, 100, ttl_s=3600.0),))


def _hit_after_flood(built: Built, policy: str, retention) -> int:
    llm = build_llm(built.path, block_size=8, device="cpu", num_blocks=24, eviction_policy=policy)
    llm.generate([SYSTEM + [1, 2, 3]], max_tokens=2, params=RequestParams(ignore_eos=True, retention=retention))
    for i in range(6):                               # 6 x 5 blocks of one-off prompts > the pool
        llm.generate([random_tokens(36, 800 + i)], max_tokens=2,
                     params=RequestParams(ignore_eos=True, priority=[i]))
    llm.kv.check_integrity()
    (out,) = llm.generate([SYSTEM + [4, 5, 6]], max_tokens=2, params=RequestParams(ignore_eos=True))
    return out.num_cached_tokens


def test_generate_retention_pins_a_system_prompt(built_models: dict[str, Built]) -> None:
    built = built_models["llama"]
    assert _hit_after_flood(built, "lru", None) == 0
    assert _hit_after_flood(built, "priority", None) == 0     # no config: LRU's order
    assert _hit_after_flood(built, "priority", PIN) == 32


def test_generate_retention_bad_input(built_models: dict[str, Built]) -> None:
    built = built_models["llama"]
    lru = build_llm(built.path, block_size=8, device="cpu", num_blocks=24)
    with pytest.raises(ValueError, match="eviction_policy='priority'.*'lru'"):
        lru.generate([SYSTEM], max_tokens=1, params=RequestParams(retention=PIN))
    llm = build_llm(built.path, block_size=8, device="cpu", num_blocks=24, eviction_policy="priority")
    with pytest.raises(ValueError, match=r"lies outside the prompt \[0, 3\)"):
        llm.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(retention=PIN))
    with pytest.raises(ValueError, match="one entry per prompt"):
        llm.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(retention=[None, None]))
    for engine in (lru, llm):
        assert not engine.engine.scheduler.has_unfinished() and engine.kv.stats().requests == 0
    with pytest.raises(ValueError, match="unknown eviction policy 'pin'; valid: .*priority"):
        build_llm(built.path, block_size=8, device="cpu", num_blocks=24, eviction_policy="pin")

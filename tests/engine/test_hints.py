"""``LLM.generate(hint=...)`` reaches the manager's hint layer under ``CacheConfig(hints=True)``;
hints are off by default (a hint is refused), and a hinted engine whose requests carry no hint
generates and caches exactly as the plain one."""

from __future__ import annotations

import pytest

from hybridkv import Hint
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import Built, build_llm, random_tokens

SYSTEM = random_tokens(32, 700)                      # 4 blocks of 8 tokens


def test_generate_hint_reaches_the_layer(built_models: dict[str, Built]) -> None:
    llm = build_llm(built_models["llama"].path, block_size=8, device="cpu", num_blocks=24, hints=True)
    llm.generate([SYSTEM + [1, 2], SYSTEM + [3, 4]], max_tokens=2, params=RequestParams(ignore_eos=True,
                 hint=[Hint(session="a", pin_s=60.0, pin_tokens=32), Hint(session="b", last_turn=True)]))
    llm.kv.check_integrity()
    stats = llm.kv.hint_stats()
    assert stats.releases == 2


def test_hinted_engine_without_hints_is_the_plain_one(built_models: dict[str, Built]) -> None:
    outs = []
    for hints in (False, True):
        llm = build_llm(built_models["llama"].path, block_size=8, device="cpu", num_blocks=24, hints=hints)
        run = []
        for i in range(6):
            run += [(o.token_ids, o.num_cached_tokens) for o in llm.generate(
                [SYSTEM + random_tokens(12, 900 + i)], max_tokens=3, params=RequestParams(ignore_eos=True))]
        outs.append((run, llm.kv.stats().evictions))
    assert outs[0] == outs[1]


def test_generate_hint_bad_input(built_models: dict[str, Built]) -> None:
    path = built_models["llama"].path
    plain = build_llm(path, block_size=8, device="cpu", num_blocks=24)
    with pytest.raises(ValueError, match=r"hint needs CacheConfig\(hints=True\)"):
        plain.generate([SYSTEM], max_tokens=1, params=RequestParams(hint=Hint(last_turn=True)))
    llm = build_llm(path, block_size=8, device="cpu", num_blocks=24, hints=True)
    with pytest.raises(ValueError, match="one entry per prompt"):
        llm.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(hint=[None, None]))
    with pytest.raises(ValueError, match=r"pin_tokens=9 lies outside the prompt \(3 tokens\)"):
        llm.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(hint=Hint(pin_s=5, pin_tokens=9)))
    with pytest.raises(ValueError, match="CacheConfig.hints must be True, False or 'force', got 'yes'"):
        build_llm(path, block_size=8, device="cpu", num_blocks=24, hints="yes")
    for engine in (plain, llm):
        assert not engine.engine.scheduler.has_unfinished() and engine.kv.stats().requests == 0


def test_generate_takes_the_public_cache_fields(built_models: dict[str, Built]) -> None:
    """Anthropic ``cache_control`` (1 h) pins the prompt's 4 full blocks softly; OpenAI's
    ``prompt_cache_key`` names the session; a malformed field is refused naming the prompt."""
    llm = build_llm(built_models["llama"].path, block_size=8, device="cpu", num_blocks=24, hints="force")
    llm.generate([SYSTEM + [1, 2], SYSTEM + [3, 4]], max_tokens=2, params=RequestParams(ignore_eos=True,
                 cache_control=[{"type": "ephemeral", "ttl": "1h"}, None],
                 prompt_cache_key=["user-1", "user-2"]))
    llm.kv.check_integrity()
    stats = llm.kv.hint_stats()
    assert (stats.releases, stats.pinned) == (1, 4)
    with pytest.raises(ValueError, match="prompt 1: prompt_cache_retention must be one of 'in_memory', "
                                         "'24h', got '1h'"):
        llm.generate([[1, 2, 3], [4, 5, 6]], max_tokens=1,
                     params=RequestParams(prompt_cache_retention=[None, "1h"]))
    with pytest.raises(ValueError, match=r"nvext needs one value for every prompt or one per prompt \(1\), got 2"):
        llm.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(nvext=[None, None]))
    plain = build_llm(built_models["llama"].path, block_size=8, device="cpu", num_blocks=24)
    with pytest.raises(ValueError, match=r"hint needs CacheConfig\(hints=True\) \(so do cache_control"):
        plain.generate([[1, 2, 3]], max_tokens=1, params=RequestParams(cache_control={"type": "ephemeral"}))

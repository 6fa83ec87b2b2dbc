"""The scheduler-driven engine (``hybridkv.LLM``) computes transformers' logits exactly.

Every test runs requests through the shared scheduler and the KV-cache manager, records the
logits of every position the engine computed (recomputed ones included) and compares them
with transformers' full forward of the final sequence (fp32, max abs diff <= 1e-4). Each test
also asserts that the situation it names really happened (a hit, a chunk split, a
preemption, a null sliding-window entry...), so a scenario cannot silently degrade into a
cold run.
"""

from __future__ import annotations

import pytest
import torch

from hybridkv.core.rules import make_rule
from hybridkv.engine.llm import LLM
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import ARCHS, TOL, Built, blocks_for, build_llm, oracle_diff, random_tokens

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens

SLIDING = {"qwen2_swa", "qwen3_swa", "mistral", "gemma3", "gpt_oss"}


def make_llm(built: Built, **kw) -> LLM:
    kw.setdefault("num_blocks", 160)
    kw.setdefault("max_num_batched_tokens", 256)
    return build_llm(built.path, block_size=built.arch.block_sizes, device="cpu", record_logits=True, **kw)


def test_cold(built: Built) -> None:
    """Two prompts batched from an empty cache, prefilled and decoded together."""
    llm = make_llm(built)
    outs = llm.generate([random_tokens(29, 1), random_tokens(18, 2)], max_tokens=12, params=NO_EOS)
    assert [o.num_cached_tokens for o in outs] == [0, 0]
    assert [len(o.token_ids) for o in outs] == [12, 12]
    assert oracle_diff(built, outs) <= TOL


def test_prefix_hit_from_earlier_request(built: Built) -> None:
    """B shares A's first 40 tokens and arrives after A finished: it computes only its suffix
    on top of A's cached blocks (sliding groups: only the blocks in its window)."""
    llm = make_llm(built)
    a_prompt = random_tokens(44, 3)
    (a,) = llm.generate([a_prompt], max_tokens=6, params=NO_EOS)
    (b,) = llm.generate([a_prompt[:40] + random_tokens(9, 4)], max_tokens=8, params=NO_EOS)
    align = llm.kv_config.alignment
    assert b.num_cached_tokens >= align and b.num_cached_tokens % align == 0
    assert min(b.logits[0]) == b.num_cached_tokens  # nothing below the hit was recomputed
    assert oracle_diff(built, [a, b]) <= TOL


def test_chunked_prefill(built: Built) -> None:
    """A 7-token budget and a 5-token prefill cap split every prompt into uneven chunks that
    start and end inside blocks; decodes of earlier requests share steps with later chunks."""
    llm = make_llm(built, max_num_batched_tokens=7, long_prefill_token_threshold=5)
    outs = llm.generate([random_tokens(n, 5 + n) for n in (31, 17, 23)], max_tokens=6, params=NO_EOS)
    assert llm.stats.steps >= (31 + 17 + 23) // 7
    assert oracle_diff(built, outs) <= TOL


def test_preemption_and_recompute(built: Built) -> None:
    """A pool too small for the requests it admits: short prefill chunks let five requests in
    at once, their growth exhausts the pool, and the scheduler preempts, frees and later
    recomputes them (from whatever prefix stayed cached); recomputed logits match too."""
    pool = blocks_for(make_llm(built), 48) + 3  # one 48-token request, plus a little
    llm = make_llm(built, num_blocks=pool, max_model_len=48, long_prefill_token_threshold=4)
    outs = llm.generate([random_tokens(20, 30 + i) for i in range(5)], max_tokens=20, params=NO_EOS)
    assert llm.stats.preemptions > 0
    assert any(o.num_preemptions for o in outs)
    assert oracle_diff(built, outs) <= TOL
    llm.kv.check_integrity()


def test_sliding_window_boundary(built_sliding: Built) -> None:
    """Sequences several windows long, chunked across the window edge, then a prefix hit
    longer than two windows (dense retention): sliding tables hold null entries below the window (those
    blocks were freed and may be reused) and the logits stay exact."""
    built = built_sliding
    llm = make_llm(built, max_num_batched_tokens=9, retention_interval=None)
    window = built.model.config.sliding_window
    sliding = [g for g, grp in enumerate(llm.kv_config.groups) if not make_rule(grp.spec).downward_closed]
    assert window is not None and sliding
    prompt = random_tokens(3 * window + 5, 40)
    reqs = llm.submit([prompt], max_tokens=2 * window, params=NO_EOS)
    saw_null = False
    while llm.engine.has_unfinished():
        llm.engine.step()
        for r in llm.scheduler.running:
            tables = llm.kv.block_ids(r.request)
            saw_null |= any(0 in tables[g] for g in sliding)
    (a,) = llm.collect(reqs)
    assert saw_null
    (b,) = llm.generate([prompt[:2 * window + 4] + random_tokens(7, 41)], max_tokens=window, params=NO_EOS)
    assert b.num_cached_tokens > window
    assert oracle_diff(built, [a, b]) <= TOL


def _retention_cases() -> list[tuple[str, object]]:
    cases = []
    for name in ARCHS:
        cases += [(name, None), (name, 0)]
        if name in SLIDING:
            cases.append((name, "N"))
    return cases


@pytest.mark.parametrize("name, retention", _retention_cases())
def test_retention(built_models: dict[str, Built], name: str, retention: object) -> None:
    """Dense (None), replay-boundaries-only (0) and periodic (N = 2 alignment units) retention:
    a resend and the next chat turn hit (dense: the turn hits past the prompt), a request
    sharing part of the prompt hits under dense retention, and everything stays exact."""
    built = built_models[name]
    probe = make_llm(built)
    interval = 2 * probe.kv_config.alignment if retention == "N" else retention
    llm = make_llm(built, retention_interval=interval)
    prompt = random_tokens(50, 50)
    (a,) = llm.generate([prompt], max_tokens=20, params=NO_EOS)
    resend, partial, turn = llm.generate(
        [prompt, prompt[:37] + random_tokens(8, 51), prompt + a.token_ids + random_tokens(6, 52)],
        max_tokens=6, params=NO_EOS)
    assert resend.num_cached_tokens > 0 and turn.num_cached_tokens >= resend.num_cached_tokens
    assert oracle_diff(built, [a, resend, partial, turn]) <= TOL
    # every policy promises the finished request's final length (aligned down): the next
    # turn hits into the previous answer
    align = llm.kv_config.alignment
    assert turn.num_cached_tokens == (len(prompt) + len(a.token_ids) - 1) // align * align
    if interval is None:  # dense retention keeps every aligned end
        assert partial.num_cached_tokens > 0


def test_cache_salt_isolation(built: Built) -> None:
    """Requests share KV only within one salt: the same prompt under another salt (or none)
    misses, under the same salt hits, and every variant is exact."""
    llm = make_llm(built)
    prompt = random_tokens(40, 60)
    (a,) = llm.generate([prompt], max_tokens=5, params=RequestParams(ignore_eos=True, cache_salt="tenant-a"))
    (b,) = llm.generate([prompt], max_tokens=5, params=RequestParams(ignore_eos=True, cache_salt="tenant-b"))
    (c,) = llm.generate([prompt], max_tokens=5, params=NO_EOS)
    (d,) = llm.generate([prompt], max_tokens=5, params=RequestParams(ignore_eos=True, cache_salt="tenant-a"))
    assert (a.num_cached_tokens, b.num_cached_tokens, c.num_cached_tokens) == (0, 0, 0)
    assert d.num_cached_tokens > 0
    assert a.token_ids == b.token_ids == c.token_ids == d.token_ids
    assert oracle_diff(built, [a, b, c, d]) <= TOL


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("name", ["qwen2_swa", "gemma3", "gpt_oss", "deepseek"])
def test_cuda_engine_matches_oracle(built_models: dict[str, Built], drafter_dirs, name: str) -> None:
    """The whole engine on CUDA (model, paged cache, DFlash drafter) with prefix hits and
    chunked prefill matches the CPU transformers oracle and the CPU engine's tokens."""
    built = built_models[name]
    prompts = [random_tokens(37, 170), random_tokens(37, 170)[:33] + random_tokens(6, 171)]
    cpu = make_llm(built).generate(prompts, max_tokens=10, params=NO_EOS)
    llm = build_llm(built.path, block_size=built.arch.block_sizes, device="cuda", record_logits=True,
              num_blocks=160, max_num_batched_tokens=16, spec="dflash:3",
              draft_model=drafter_dirs(name, "dflash"))
    outs = llm.generate(prompts, max_tokens=10, params=NO_EOS) + llm.generate(prompts, max_tokens=10,
                                                                                 params=NO_EOS)
    assert [o.token_ids for o in outs] == [o.token_ids for o in cpu] * 2
    assert outs[-1].num_cached_tokens > 0
    assert oracle_diff(built, outs) <= TOL

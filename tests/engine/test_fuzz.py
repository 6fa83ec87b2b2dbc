"""Fuzz: many requests with shared prefixes, arriving while others run, in a pool so small
that blocks are evicted and requests preempted. Every output must equal the request's
cold-cache output (a fresh engine without prefix caching), and every computed logits row
must equal transformers'.
"""

from __future__ import annotations

import random

import pytest

from hybridkv.core.eviction import HitPointLayer
from hybridkv.engine.llm import LLM
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import TOL, Built, blocks_for, build_llm, oracle_diff, random_tokens

MAX_LEN = 72


def workload(seed: int) -> list[tuple[list[int], int, str | None, int]]:
    """(prompt, max_tokens, cache salt, arrival step) per request: prompts share one of three
    system prefixes (some exactly, some resent, some extending another request's prompt)."""
    rng = random.Random(seed)
    systems = [random_tokens(n, seed * 10 + i) for i, n in enumerate((24, 37, 41))]
    reqs: list[tuple[list[int], int, str | None, int]] = []
    for i in range(22):
        roll = rng.random()
        if reqs and roll < 0.15:
            prompt = list(rng.choice(reqs)[0])  # an exact resend
        elif reqs and roll < 0.3:
            prompt = list(rng.choice(reqs)[0])[:MAX_LEN - 30] + random_tokens(rng.randint(1, 9), 1000 + i)
        else:
            sysp = rng.choice(systems)
            prompt = sysp[:rng.randint(len(sysp) // 2, len(sysp))] + random_tokens(rng.randint(1, 14), 2000 + i)
        prompt = prompt[:MAX_LEN - 16]
        salt = "other" if rng.random() < 0.15 else None
        reqs.append((prompt, rng.randint(1, 14), salt, rng.randint(0, 40)))
    return reqs


def run_interleaved(llm: LLM, reqs: list[tuple[list[int], int, str | None, int]]):
    """Submit each request at its arrival step while the engine keeps stepping."""
    submitted: list = [None] * len(reqs)
    step = 0
    while step <= max(r[3] for r in reqs) or llm.engine.has_unfinished():
        for i, (prompt, max_tokens, salt, arrival) in enumerate(reqs):
            if arrival == step:
                (submitted[i],) = llm.submit([prompt], max_tokens,
                                             params=RequestParams(cache_salt=salt, ignore_eos=True))
        llm.engine.step()
        step += 1
    return llm.collect(submitted)


def cold_outputs(built: Built, reqs, **kw) -> list[list[int]]:
    llm = build_llm(built.path, block_size=built.arch.block_sizes, device="cpu", num_blocks=512,
              enable_prefix_caching=False, **kw)
    outs = llm.generate([r[0] for r in reqs], [r[1] for r in reqs], params=RequestParams(ignore_eos=True))
    return [o.token_ids for o in outs]


def run_tiny_pool_and_check(built: Built, reqs, **kw) -> LLM:
    """``reqs`` through an engine whose pool holds one request and one prefill chunk (``kw``:
    more engine options); every output must equal its cold run and every computed logits row
    transformers'. Returns the engine."""
    probe = build_llm(built.path, block_size=built.arch.block_sizes, device="cpu", num_blocks=512, **kw)
    pool = blocks_for(probe, MAX_LEN) + 3 * len(probe.kv_config.groups)  # room for one prefill chunk
    llm = build_llm(built.path, block_size=built.arch.block_sizes, device="cpu", num_blocks=pool,
                    max_model_len=MAX_LEN, max_num_batched_tokens=24, long_prefill_token_threshold=10,
                    record_logits=True, **kw)
    outs = run_interleaved(llm, reqs)
    cold = cold_outputs(built, reqs)
    for i, (out, want) in enumerate(zip(outs, cold)):
        assert out.token_ids == want, f"request {i} ({out.num_cached_tokens} cached) diverged from its cold run"
    assert oracle_diff(built, outs) <= TOL
    return llm


CASES = [("qwen2_swa", None, 0), ("gemma3", None, 1), ("deepseek", None, 2), ("gpt_oss", None, 3),
         ("qwen2_swa", "ngram", 4), ("qwen2_swa", "dflash", 5), ("gemma3", "draft_model", 6), ("llama", "dflash", 7)]


@pytest.mark.parametrize("name, method, seed", CASES, ids=[f"{n}-{m or 'plain'}" for n, m, _ in CASES])
def test_fuzz_shared_prefixes_tiny_pool(built_models: dict[str, Built], drafter_dirs, name: str,
                                        method: str | None, seed: int) -> None:
    built = built_models[name]
    reqs = workload(seed)
    kw = {}
    if method is not None:
        kind = {"ngram": None, "dflash": "dflash", "draft_model": "copy"}[method]
        kw = dict(spec=f"{method}:3", draft_model=drafter_dirs(name, kind) if kind else None)
    llm = run_tiny_pool_and_check(built, reqs, **kw)
    stats = llm.kv.stats()
    assert stats.hits > 0, "the workload should hit the prefix cache"
    assert stats.evictions > 0, "the pool should be small enough to evict cached blocks"
    assert llm.stats.preemptions > 0, "the pool should be small enough to preempt"
    llm.kv.check_integrity()


POLICY_CASES = [("gemma3", "s3fifo", 8), ("gpt_oss", "eva-turns", 9), ("qwen2_swa", "arc", 10)]


@pytest.mark.parametrize("name, policy, seed", POLICY_CASES, ids=[f"{n}-{p}" for n, p, _ in POLICY_CASES])
def test_fuzz_hit_points_serve_what_transformers_computes(built_models: dict[str, Built], name: str,
                                                          policy: str, seed: int) -> None:
    """The same fuzz on sliding-window models under a policy behind the hit-point layer
    (windows evicted with the full-attention block that ends their hit point): every hit the
    layer keeps is served exactly (cold outputs, transformers' logits)."""
    llm = run_tiny_pool_and_check(built_models[name], workload(seed), eviction_policy=policy)
    assert isinstance(llm.kv.pool.policy, HitPointLayer)
    stats = llm.kv.stats()
    assert stats.hits > 0 and stats.evictions > 0
    assert llm.kv.pool.policy.counts[0] > 0, "some anchor should have taken its windows along"
    llm.kv.check_integrity()

"""Property-based tests: random hybrid configs and random operation sequences.

After every step:
* ``check_integrity()`` (pool, free queue, index, ref counts, cached hashes of held blocks);
* every hit block holds exactly the request's tokens for its position, according to a shadow
  record of what each block was last written with (independent of hashing);
* the hit length equals the independent oracle (``tests/support/oracle.py``): a brute-force search
  over aligned ends, from the attention definitions, over what the manager's KV events say
  is cached. Nothing of the implementation's lookup or rules is reused.
Principle 1: after a request is freed, every block it cached is read by some hit that a
replay of its own tokens gets (the write path keeps only what the read path can use).

Besides tokens and a cache salt, the operation sequences' requests carry, per example
(:class:`~tests.support.random_ops.Extras`): multimodal items (kept from the prompt they extend, swapped for another
image at the same positions, or new, often at a block boundary), a LoRA adapter (the prompt's
own or another one, a re-pointed path included), and the manager gets a ``max_model_len``
with prompts drawn near and over it. The oracle then keys blocks by content
(:class:`~tests.support.oracle.ContentMirror`: salt, LoRA, tokens and images, from the Request's
fields), and the shadow record compares the LoRA and the image patch of every token too.

The strategies and the model that drives the manager: :mod:`tests.support.random_ops`.
Profiles: the default budget keeps the suite fast; ``--hypothesis-profile=deep`` runs 5,000+
examples per test, longer sequences, weighted to hybrids and speculative decoding
(``tests/hypothesis_budget.py``, TESTING.md).
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, Request
from tests.hypothesis_budget import budgeted, examples, note
from tests.support.oracle import CacheMirror, attention_kind, hash_index, oracle_hit, proof_groups
from tests.support.random_ops import (MAX_OPS, MIN_OPS, Model, config_kind, configs, decode_ops,
                                      next_prompt, op_configs)
from hybridkv.core.cache_options import CacheOptions


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(op_configs(), st.binary(min_size=4 * MIN_OPS, max_size=4 * MAX_OPS).map(decode_ops))
@budgeted(0.55)
def test_random_operations_keep_invariants(cfg_args, ops):
    (cfg, retention, spec, compat), extras = cfg_args
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, spec_decode=spec, vllm_compat=compat,
        max_model_len=extras.max_model_len, enable_events=True))
    for kind in config_kind(cfg, spec, compat):
        note(kind)
    for on, kind in zip(extras, ("extras: images", "extras: LoRA", "extras: max_model_len")):
        if on:
            note(kind)
    m = Model(kv, spec, compat, extras)
    for op, x in ops:
        if op == 7:
            # a reset succeeds exactly when no request holds blocks
            if not m.running:
                assert kv.reset_prefix_cache()
                note("prefix-cache resets")
            else:
                assert not kv.reset_prefix_cache()
        elif op <= 1 or not m.running:
            prompt, salt = next_prompt(m, x)
            m.admit(prompt.tokens, salt, 1 + x % 40, prompt.items, prompt.lora)
        elif op <= 4:
            rid = sorted(m.running)[x % len(m.running)]
            m.step(rid, x % 5)
        else:
            m.finish(sorted(m.running)[x % len(m.running)])
        kv.check_integrity()
    note("evictions", kv.stats().evictions)
    for rid in list(m.running):
        m.finish(rid)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1
    note("operations", len(ops))


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs(), st.lists(st.integers(0, 3), min_size=4, max_size=60), st.integers(1, 30))
@budgeted(0.25)
def test_write_path_keeps_only_what_read_path_uses(cfg_args, tokens, chunk):
    """Principle 1: every block a request caches is read by some hit a replay of it gets."""
    cfg, retention, spec, compat = cfg_args
    kv = KVCacheManager(cfg.__class__(cfg.groups, num_blocks=400), CacheOptions(
        retention_interval=retention, spec_decode=spec, vllm_compat=compat, enable_events=True))
    req = Request("r", tokens)
    kv.lookup(req)
    done = 0
    while done < len(tokens):
        n = min(chunk, len(tokens) - done)
        assert kv.allocate(req, n) is not None
        done += n
        req.num_computed_tokens = done
    kv.free(req)
    mirror = CacheMirror()
    mirror.feed(kv.take_events())
    cached = mirror.cached()
    read: set[tuple[int, bytes]] = set()
    a = cfg.alignment
    proofs = proof_groups(cfg, spec)
    for t in range(a, len(tokens) + 1, a):
        # a replay asking for a hit of exactly t tokens that knows the next alignment unit
        # (the lookahead token, the proof block in drop mode): at most t aligned tokens hit
        probe_tokens = tokens[:t + a]
        if len(probe_tokens) <= t:
            probe_tokens = probe_tokens + [99]
        probe = Request(f"p{t}", probe_tokens)
        hit = kv.lookup(probe)
        assert hit.num_tokens == oracle_hit(cfg, spec, compat, probe, mirror)
        for g, ids in enumerate(hit.block_ids):
            read.update((g, probe.block_hashes[hash_index(cfg, g, j)]) for j, b in enumerate(ids) if b)
        if hit.num_tokens:  # drop mode: proof groups also read the block after the hit
            for g in proofs:
                k = hash_index(cfg, g, hit.num_tokens // cfg.groups[g].spec.block_size)
                read.add((g, probe.block_hashes[k]))
    note("write-path replays", len(tokens) // a)
    if compat:
        # vLLM keeps some blocks no aligned hit reads (full groups cache every block, the
        # eagle +1 tail); only require that what is read is cached.
        assert read <= cached
    elif any(attention_kind(g.spec) == "state" for g in cfg.groups):
        # Full-attention blocks past the last checkpoint stay cached on purpose: a later
        # request finds the shared-prefix junction with them and checkpoints it (Marconi).
        # Every other group caches only what some hit reads.
        full = {i for i, g in enumerate(cfg.groups) if attention_kind(g.spec) == "full"}
        assert read <= cached
        assert {key for key in cached - read if key[0] not in full} == set(), \
            f"cached but never read: {len(cached - read)} keys"
    else:
        assert cached == read, f"cached but never read: {len(cached - read)} keys"

"""Speculative decoding on the scheduler-driven engine.

* Every drafter (n-gram, a small draft model, the target itself as draft model, DFlash) with
  prefix caching on gives exactly the plain greedy tokens, and every computed logits row
  (accepted drafts included) equals transformers'.
* The drafters' KV is right: draft-model proposals equal the draft model's own greedy
  continuation (also on a prefix-cache hit, which reads draft KV from cached blocks), and
  DFlash proposals equal a dense (non-paged) evaluation of the same drafter.
* The negative test: with DFlash's lookahead reservation cut from k+1 to k slots, a draft
  write lands in a block that another request owns; that request's cached prefix is
  corrupted and the oracle comparison catches it.
"""

from __future__ import annotations

import pytest
import torch

from hybridkv.engine import build_step_metadata
from hybridkv.engine.drafters import DFlashDrafter, StepRequest
from hybridkv.core.spec_decode import parse_spec
from hybridkv.engine.llm import LLM
from hybridkv.engine.rope import apply_rope_half
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import TOL, Allocator, Built, TableOwner, blocks_for, build_llm, oracle_diff, random_tokens

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens

K = 3


def prompts() -> list[list[int]]:
    base = random_tokens(30, 70)
    loop = [5, 9, 17, 33, 2, 71] * 5  # repetitive: n-gram drafts get accepted
    return [base, base[:20] + random_tokens(13, 71), loop]


def make(built: Built, spec: str | None = None, draft=None, **kw) -> LLM:
    kw.setdefault("num_blocks", 192)
    return build_llm(built.path, block_size=built.arch.block_sizes, device="cpu", spec=spec,
               draft_model=draft, record_logits=True, **kw)


_greedy: dict[str, list[list[int]]] = {}


def plain_greedy(built: Built) -> list[list[int]]:
    if built.arch.name not in _greedy:
        outs = make(built, enable_prefix_caching=False).generate(prompts(), max_tokens=16, params=NO_EOS)
        _greedy[built.arch.name] = [o.token_ids for o in outs]
    return _greedy[built.arch.name]


DRAFTERS = [("ngram", None), ("draft_model", "small"), ("draft_model", "copy"), ("dflash", "dflash")]


@pytest.mark.parametrize("method, kind", DRAFTERS, ids=[f"{m}-{k}" if k else m for m, k in DRAFTERS])
def test_spec_decode_equals_plain_greedy(built: Built, drafter_dirs, method: str, kind: str | None) -> None:
    draft = drafter_dirs(built.arch.name, kind) if kind else None
    llm = make(built, f"{method}:{K}", draft)
    want = plain_greedy(built)
    first = llm.generate(prompts(), max_tokens=16, params=NO_EOS)
    again = llm.generate(prompts(), max_tokens=16, params=NO_EOS)  # prefix-cache hits
    assert [o.token_ids for o in first] == want
    assert [o.token_ids for o in again] == want
    assert all(o.num_cached_tokens > 0 for o in again)
    assert oracle_diff(built, first + again) <= TOL
    stats = llm.stats
    assert stats.draft_tokens > 0
    if kind == "copy":  # the target drafting for itself: every draft is accepted
        assert stats.accepted_tokens == stats.draft_tokens
    if method == "ngram":
        assert stats.accepted_tokens > 0
    llm.kv.check_integrity()


def test_spec_decode_with_chunks_and_preemption(built_models: dict[str, Built], drafter_dirs) -> None:
    """Speculation under a tiny pool and token budget (chunked prefill, preemption, drafts
    truncated by the budget) still gives the plain greedy tokens."""
    built = built_models["qwen2_swa"]
    want = plain_greedy(built)
    for method, kind in (("dflash", "dflash"), ("draft_model", "copy"), ("ngram", None)):
        draft = drafter_dirs("qwen2_swa", kind) if kind else None
        pool = blocks_for(make(built, f"{method}:{K}", draft), 64) + 2
        llm = make(built, f"{method}:{K}", draft, num_blocks=pool, max_model_len=64,
                   max_num_batched_tokens=11, long_prefill_token_threshold=6)
        outs = llm.generate(prompts(), max_tokens=16, params=NO_EOS)
        assert [o.token_ids for o in outs] == want, method
        assert llm.stats.preemptions > 0, method
        assert oracle_diff(built, outs) <= TOL
        llm.kv.check_integrity()


class OracleDFlash(DFlashDrafter):
    """Proposes the true greedy continuation (known from a plain run) in place of the DFlash
    model's argmax, so every draft is accepted and the query block fills all k+1 slots; the
    drafter's KV writes are unchanged."""

    truth: list[list[int]] = []

    def select(self, request: StepRequest, logits: torch.Tensor) -> list[int]:
        for full in self.truth:
            n = len(request.tokens)
            if full[:n] == request.tokens and len(full) >= n + logits.shape[0]:
                return full[n:n + logits.shape[0]]
        return super().select(request, logits)


@pytest.mark.parametrize("name", ["llama", "qwen2_swa", "deepseek"])
def test_dflash_all_accepted_uses_every_lookahead_slot(built_models: dict[str, Built], drafter_dirs,
                                                       name: str) -> None:
    built = built_models[name]
    want = plain_greedy(built)
    llm = make(built, f"dflash:{K}", drafter_dirs(name, "dflash"))
    oracle = OracleDFlash(llm.drafter.model)
    oracle.truth = [p + w for p, w in zip(prompts(), want)]
    oracle.bind(llm.engine)
    llm.engine.drafter = oracle
    outs = llm.generate(prompts(), max_tokens=16, params=NO_EOS)
    assert [o.token_ids for o in outs] == want
    assert llm.stats.accepted_tokens == llm.stats.draft_tokens > 0
    assert oracle_diff(built, outs) <= TOL


def test_draft_model_drafts_are_its_greedy_continuation(built_models: dict[str, Built], drafter_dirs) -> None:
    """After each request's prefill step its k drafts equal the small model's own greedy
    continuation (computed by transformers); the second request hits the first one's cached
    prefix, so its draft KV below the hit comes from cached draft blocks."""
    from tests.engine.helpers import SMALL_DRAFT, build

    built = built_models["qwen2_swa"]
    small_dir = drafter_dirs("qwen2_swa", "small")
    small = build(SMALL_DRAFT, small_dir.parent / "small_oracle", seed=5)
    llm = make(built, f"draft_model:{K}", small_dir)
    base = random_tokens(40, 80)
    for i, prompt in enumerate([base, base[:36] + random_tokens(5, 81)]):
        (req,) = llm.submit([prompt], max_tokens=8, params=NO_EOS)
        llm.engine.step()
        assert req.num_output_tokens == 1
        if i:
            assert req.num_cached_tokens > 0
        seq = list(req.request.token_ids)
        want = []
        for _ in range(K):
            want.append(int(small.oracle(seq + want)[-1].argmax()))
        assert req.spec_token_ids == want
        llm.engine.run()


def dense_dflash(built: Built, drafter, tokens: list[int], k: int) -> list[int]:
    """The drafter evaluated densely: context = all of ``tokens`` but the last (the bonus),
    query block = [bonus, mask x k], bidirectional, no paging."""
    model = built.model
    n_ctx = len(tokens) - 1
    cache_config = built.kv_config(32)
    from hybridkv.engine import PagedKVCache

    cache = PagedKVCache(cache_config)
    owner = TableOwner(Allocator(cache), tokens[:n_ctx])
    meta = build_step_metadata([owner.step(n_ctx)], cache_config)
    _, captured = model.run(meta, cache, capture=drafter.target_layer_ids)
    ctx = drafter.hidden_norm(drafter.fc(torch.cat(captured, dim=-1)))
    pos_ctx = torch.arange(n_ctx)
    pos_blk = torch.arange(n_ctx, n_ctx + k + 1)
    x = model.embed(torch.tensor([tokens[-1]] + [drafter.mask_token_id] * k))
    for layer in drafter.layers:
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        rope_blk = drafter.rotary(pos_blk, h.dtype)
        q = attn.q_norm(attn.q_proj(h).view(k + 1, attn.num_heads, attn.head_dim))
        q = apply_rope_half(q, *rope_blk)
        k_blk, v_blk = attn.key_value(h, rope_blk)
        k_ctx, v_ctx = attn.key_value(ctx, drafter.rotary(pos_ctx, h.dtype))
        keys, vals = torch.cat([k_ctx, k_blk]), torch.cat([v_ctx, v_blk])
        rep = attn.num_heads // attn.num_kv_heads
        keys, vals = keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1)
        probs = torch.softmax(torch.einsum("qhd,khd->hqk", q, keys) * attn.scale, dim=-1)
        out = torch.einsum("hqk,khd->qhd", probs, vals).reshape(k + 1, -1)
        x = x + attn.o_proj(out)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return model.compute_logits(drafter.norm(x)[1:]).argmax(-1).tolist()


@pytest.mark.parametrize("name", ["qwen2_swa", "gemma3", "deepseek"])
def test_dflash_drafts_match_dense_evaluation(built_models: dict[str, Built], drafter_dirs, name: str) -> None:
    """The paged DFlash drafter (context entries written step by step, possibly read from a
    prefix-cache hit, query block in the lookahead slots) proposes what a dense evaluation
    of the same weights proposes, after the prefill step and after later decode steps."""
    built = built_models[name]
    llm = make(built, f"dflash:{K}", drafter_dirs(name, "dflash"), max_num_batched_tokens=9)
    base = random_tokens(33, 90)
    checked = 0
    for prompt in (base, base[:30] + random_tokens(4, 91)):
        (req,) = llm.submit([prompt], max_tokens=10, params=NO_EOS)
        while not req.status.finished:
            llm.engine.step()
            if req.spec_token_ids:
                seq = list(req.request.token_ids)
                assert req.spec_token_ids == dense_dflash(built, llm.drafter.model, seq, len(req.spec_token_ids))
                checked += 1
    assert req.num_cached_tokens > 0 and checked >= 10


# --------------------------------------------------------------------------- negative test
def _lookahead_scenario(built: Built, dflash_dir, cut_to_k: bool, check_draft_slots: bool = False):
    """Shows why DFlash reserves k+1 lookahead slots.

    The engine keeps persistent block-table rows that are never cleared (block_table.py).

    1. W (row 0) and X (row 1) run a prefill + one token and finish. Freeing X puts its last
       draft-group block, a never-cached lookahead block, at the head of the free queue.
    2. B then A arrive together. B takes row 0 and, allocating first, X's old lookahead block
       as its first *target* block: B's layer-0 K/V for position 0 lives there (draft layer 0
       and target layer 0 share one layer slot of the pool).
    3. A takes row 1, X's row, whose stale entry j still names that block. A's prompt length
       is chosen so that A's first query block (bonus + k masks after its prefill) ends at
       position j * block_size: the last of the k+1 slots is the first slot of entry j.
       With k+1 slots reserved, entry j is A's own block. With k, A's table stops before j and
       the write follows the stale entry into B's block, overwriting B's cached position 0.
    4. B keeps decoding over a corrupted prefix; C, resending B's sequence, hits B's cached
       (corrupted) blocks. Both diverge from transformers.

    Returns the outputs of B, A and C and the corrupted block id.
    """
    bs = built.arch.block_sizes["full"]
    llm = build_llm(built.path, block_size=bs, num_blocks=64, device="cpu", spec=f"dflash:{K}",
              draft_model=dflash_dir, record_logits=True, max_num_seqs=4,
              check_draft_slots=check_draft_slots)
    if cut_to_k:
        llm.kv.lookahead_slots = K  # the manager would reserve K + 1 for DFlash
    eng = llm.engine
    draft_group = llm.kv_config.group_index("dflash")
    w, x = llm.submit([random_tokens(6, 100), random_tokens(21, 101)], max_tokens=1, params=NO_EOS)
    eng.run()
    stale_row = eng.rows.tables[draft_group][1].tolist()
    head = next(iter(llm.kv.pool.queue))
    assert head in stale_row, "X's freed lookahead block should head the free queue"
    j = stale_row.index(head)
    p_a, p_b = j * bs - K, 10
    assert p_a > 0 and (p_b + K) % bs  # B's own query block stays inside its last block
    b, a = llm.submit([random_tokens(p_b, 102), random_tokens(p_a, 103)], max_tokens=8, params=NO_EOS)
    eng.step()
    assert (eng.rows.row_of(b.request_id), eng.rows.row_of(a.request_id)) == (0, 1)
    assert llm.kv.block_ids(b.request)[0][0] == head  # B's position 0 lives in that block
    eng.run()
    out_b, out_a = llm.collect([b, a])
    (out_c,) = llm.generate([out_b.prompt_token_ids + out_b.token_ids + random_tokens(5, 104)],
                            max_tokens=4, params=NO_EOS)
    assert out_c.num_cached_tokens > 0  # C reads B's cached prefix
    return out_b, out_a, out_c, head


def test_dflash_needs_k_plus_one_lookahead_slots(built_models: dict[str, Built], drafter_dirs) -> None:
    built = built_models["llama"]
    dflash_dir = drafter_dirs("llama", "dflash")
    assert parse_spec(f"dflash:{K}").lookahead_slots == K + 1
    # k + 1 slots (what the manager reserves): every request is exact.
    b, a, c, _ = _lookahead_scenario(built, dflash_dir, cut_to_k=False)
    assert oracle_diff(built, [b, a, c]) <= TOL
    # k slots: A's last draft write lands in B's block. B (decoding over its corrupted prefix)
    # and C (hitting B's cached prefix) diverge from the oracle; A itself is unharmed.
    b, a, c, _ = _lookahead_scenario(built, dflash_dir, cut_to_k=True)
    assert oracle_diff(built, [a]) <= TOL
    assert oracle_diff(built, [b]) > 1e-2
    assert oracle_diff(built, [c]) > 1e-2


def test_checked_draft_slots_turn_the_overrun_into_an_error(built_models: dict[str, Built], drafter_dirs) -> None:
    with pytest.raises(ValueError, match=r"group 'dflash': block table has \d+ entries but written position"):
        _lookahead_scenario(built_models["llama"], drafter_dirs("llama", "dflash"), cut_to_k=True,
                            check_draft_slots=True)


def test_spec_configuration_errors(built_models: dict[str, Built], drafter_dirs) -> None:
    built = built_models["llama"]
    with pytest.raises(ValueError, match="METHOD:K"):
        parse_spec("dflash")
    with pytest.raises(ValueError, match="unknown speculative method 'medusa'"):
        parse_spec("medusa:2")
    with pytest.raises(ValueError, match="needs draft_model=DIR"):
        make(built, "dflash:3")
    with pytest.raises(ValueError, match="drafts at most 4 tokens"):
        make(built, "dflash:5", drafter_dirs("llama", "dflash"))  # block size 5: k <= 4
    assert parse_spec("draft:2").method == "draft_model" and parse_spec("ngram:4").lookahead_slots == 0


def test_drafter_groups_are_draft_groups(built_models: dict[str, Built], drafter_dirs) -> None:
    """Drafter layers sit in ``is_draft`` groups of the same KV-cache config, so the manager
    accounts for their blocks; the pool is shared."""
    built = built_models["qwen2_swa"]
    for method, kind, prefix in (("dflash", "dflash", "dflash"), ("draft_model", "small", "draft.")):
        llm = make(built, f"{method}:{K}", drafter_dirs("qwen2_swa", kind))
        drafts = [g for g in llm.kv_config.groups if g.is_draft]
        assert drafts and all(g.name.startswith(prefix) for g in drafts)
        assert not any(g.is_draft for g in llm.kv_config.groups if not g.name.startswith(prefix))
        assert llm.kv.lookahead_slots == (K + 1 if method == "dflash" else K)

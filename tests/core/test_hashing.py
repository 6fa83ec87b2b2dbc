"""Hashing formula, extra keys, lookahead hashing, seeds, and validation errors."""

import pytest

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup,
                      KVCacheManager, LoRA, MultiModalItem, Request, SlidingWindow, SpecDecode)
from hybridkv.core import BlockHasher, FreeBlockQueue
from tests.support.helpers import FA, SWA, manager, run_prompt


def test_chained_hash_formula_and_salt():  # vLLM: test_cache_key_salting (own formula)
    h = BlockHasher(16, "sha256")
    tokens = list(range(48))
    req = Request("r", tokens, cache_salt="salt1")
    h.update(req)
    h0 = h.hash_block(None, tokens[:16], extra_keys=(("cache_salt", "salt1"),))
    h1 = h.hash_block(h0, tokens[16:32])
    assert req.block_hashes[:2] == [h0, h1]
    kv = manager(FA(16), num_blocks=20, compat=False)
    run_prompt(kv, "a", tokens + [1], cache_salt="salt1")
    assert kv.lookup(Request("b", tokens + [2], cache_salt="salt1")).num_tokens == 48
    assert kv.lookup(Request("c", tokens + [2], cache_salt="salt2")).num_tokens == 0
    assert kv.lookup(Request("d", tokens + [2])).num_tokens == 0


def test_multimodal_extra_keys():  # vLLM: test_mm_prefix_caching
    tokens = list(range(10)) + [-1] * 10 + list(range(10, 20)) + [-1] * 18 + [-1] * 7 + [100] * 4
    items = [MultiModalItem("aaa", 11, 10), MultiModalItem("bbb", 30, 18), MultiModalItem("ccc", 48, 7)]
    req = Request("r", tokens, mm_items=items)
    assert req.extra_keys(0, 16) == (("mm", "aaa", 11),)
    assert req.extra_keys(16, 32) == (("mm", "aaa", -5), ("mm", "bbb", 14))
    assert req.extra_keys(32, 48) == (("mm", "bbb", -2),)
    assert req.extra_keys(48, 64) == (("mm", "ccc", 0),)
    kv = manager(FA(16), num_blocks=20, compat=False)
    run_prompt(kv, "a", tokens, mm_items=items)
    same = Request("b", tokens[:48] + [7] * 10, mm_items=items)
    assert kv.lookup(same).num_tokens == 48
    other = Request("c", tokens[:48] + [7] * 10, mm_items=[MultiModalItem("zzz", 11, 10)] + items[1:])
    assert kv.lookup(other).num_tokens == 0


def test_lora_path_enters_hash():
    kv = manager(FA(4), num_blocks=20, compat=False)
    run_prompt(kv, "a", list(range(13)), lora=LoRA("ad", "/v1"))
    assert kv.lookup(Request("b", list(range(13)), lora=LoRA("ad", "/v1"))).num_tokens == 12
    assert kv.lookup(Request("c", list(range(13)), lora=LoRA("ad", "/v2"))).num_tokens == 0


def test_seeds():  # vLLM: test_kv_cache_utils.py NONE_HASH seeds
    assert BlockHasher(4, "sha256").none_hash == BlockHasher(4, "sha256").none_hash
    assert BlockHasher(4, "xxh3_128").none_hash != BlockHasher(4, "xxh3_128").none_hash
    assert BlockHasher(4, "xxh3_128", seed="x").none_hash == BlockHasher(4, "xxh3_128", seed="x").none_hash


# vLLM: test_kv_events_reconstruct_lookahead_block_hashes
@pytest.mark.parametrize("la", [1, 2])
def test_lookahead_hashes_and_events_rebuild(la):
    from hybridkv import BlockStored
    h = BlockHasher(2, "sha256", lookahead=la)
    tokens = list(range(4 + la))
    req = Request("r", tokens)
    h.update(req)
    assert len(req.block_hashes) == 2
    h0 = h.hash_block(None, tokens[0:2], tokens[2:2 + la])
    assert req.block_hashes == [h0, h.hash_block(h0, tokens[2:4], tokens[4:4 + la])]
    kv = KVCacheManager(KVCacheConfig((KVCacheGroup("g", FA(2), ("l",)),), num_blocks=10),
                        enable_events=True, hash_algo="sha256",
                        spec_decode=SpecDecode("eagle", 1))
    r = Request("e", list(range(5)))
    kv.allocate(r, 5)
    ev = [e for e in kv.take_events() if isinstance(e, BlockStored)][0]
    assert ev.token_ids == [0, 1, 2, 3] and ev.lookahead_token_ids == [[2], [4]]
    parent = None
    for i, hh in enumerate(ev.block_hashes):
        parent = kv.hasher.hash_block(parent, ev.token_ids[2 * i:2 * i + 2], ev.lookahead_token_ids[i])
        assert parent == hh


def test_prepend_n_order():  # vLLM: test_free_kv_cache_block_queue_prepend_n
    q = FreeBlockQueue(8, [])
    q.append_n([7])
    q.prepend_n([4, 5])
    q.prepend_n([1, 2])
    q.prepend_n([])
    assert list(q) == [1, 2, 4, 5, 7]
    assert q.popleft_n(5) == [1, 2, 4, 5, 7] and len(q) == 0


def test_hash_index_duplicates():  # vLLM: test_maybe_evict_cached_block
    from hybridkv.core import BlockPool
    p = BlockPool(5, 1)
    p.insert(0, b"h0", 1)
    p.insert(0, b"h1", 2)
    p.insert(0, b"h0", 4)
    assert p.index[0][b"h0"] == {1: None, 4: None}
    p.drop_hash(2)
    assert b"h1" not in p.index[0]
    p.drop_hash(1)
    assert p.index[0][b"h0"] == 4 and p.cached_block(0, b"h0") == 4
    p.drop_hash(4)
    assert p.index[0] == {}


# ---- default mode improves on vLLM ------------------------------------------------------------
def test_diverging_inside_last_aligned_block_still_hits():  # vLLM #57610
    prompt = list(range(4100))
    edited = prompt[:4090] + [7] * 30   # same turn, edited near its end
    for compat, expected in [(True, 0), (False, 4064)]:
        kv = manager(FA(32), SWA(16, 1024), num_blocks=2000, compat=compat, retention=0)
        run_prompt(kv, "turn", prompt)
        assert kv.lookup(Request("edit", edited)).num_tokens == expected


def test_next_chat_turn_hits_the_answer():
    prompt = list(range(300))
    kv = manager(FA(16), SWA(16, 64), num_blocks=200, compat=False, retention=0)
    req, _ = run_prompt(kv, "t1", prompt)
    for tok in range(50):                 # decode 50 tokens
        req.append_tokens([1000 + tok])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
    kv.free(req)
    turn2 = list(req.token_ids) + [5] * 40
    assert kv.lookup(Request("t2", turn2)).num_tokens == (len(req.token_ids) - 1) // 16 * 16
    vllm = manager(FA(16), SWA(16, 64), num_blocks=200, compat=True, retention=0)
    req, _ = run_prompt(vllm, "t1", prompt)
    for tok in range(50):
        req.append_tokens([1000 + tok])
        vllm.allocate(req, 1)
        req.num_computed_tokens += 1
    vllm.free(req)
    assert vllm.lookup(Request("t2", turn2)).num_tokens == 288  # only the prompt's boundary


def test_lookahead_hashing_beats_eagle_drop_hybrid():
    tokens = list(range(256))
    drop = manager(FA(16), SWA(16, 64), num_blocks=200, drafts=(1,), compat=True,
                   spec_decode=SpecDecode("eagle", 3, hash_lookahead=False))
    la = manager(FA(16), SWA(16, 64), num_blocks=200, drafts=(1,), compat=False,
                 spec_decode=SpecDecode("eagle", 3))
    q = tokens + [1]          # an identical resend of a 257-token prompt
    for kv in (drop, la):
        run_prompt(kv, "a", q)
    assert drop.lookup(Request("b", q)).num_tokens == 240
    assert la.lookup(Request("b", q)).num_tokens == 256


def test_dflash_reserves_k_plus_one_slots_on_first_prefill():
    kv = manager(FA(4), num_blocks=20, spec_decode=SpecDecode("dflash", 3))
    assert kv.lookahead_slots == 4
    new = kv.allocate(Request("r", list(range(8))), 8)
    assert len(new[0]) == 3          # 8 tokens + 4 slots = 12 -> 3 blocks
    eagle = manager(FA(4), num_blocks=20, spec_decode=SpecDecode("eagle", 3))
    assert len(eagle.allocate(Request("r", list(range(8))), 8)[0]) == 3  # 8 + 3 = 11
    assert len(eagle.allocate(Request("s", list(range(9))), 9)[0]) == 3  # 9 + 3 = 12


def test_stats_count_queries_and_hits():
    kv = manager(FA(4), num_blocks=30, compat=False)
    run_prompt(kv, "a", list(range(20)))
    run_prompt(kv, "b", list(range(20)))
    s = kv.stats()
    assert (s.requests, s.queries, s.hits) == (2, 40, 16)


# ---- validation errors -------------------------------------------------------------------------
@pytest.mark.parametrize("build,match", [
    (lambda: SlidingWindow(block_size=16, window=0), "window must be a positive integer, got 0"),
    (lambda: FullAttention(block_size=-1), "block_size must be a positive integer, got -1"),
    (lambda: FullAttention(block_size=16, dtype="float13"), "unknown dtype 'float13'; valid dtypes"),
    (lambda: ChunkedLocal(block_size=16, chunk_size=24), "chunk_size \\(24\\) must be a multiple of block_size \\(16\\)"),
    (lambda: MLA(block_size=6, compress_ratio=4), "multiple of compress_ratio"),
    (lambda: KVCacheConfig((), num_blocks=10), "groups is empty"),
    (lambda: KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)), KVCacheGroup("a", FA(4), ("m",))), num_blocks=10),
     "duplicate KV-cache group names: \\['a'\\]"),
    (lambda: KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)), KVCacheGroup("b", FA(4), ("l",))), num_blocks=10),
     "layer 'l' is in groups 'a' and 'b'"),
    (lambda: KVCacheGroup("a", FA(4), ()), "has no layers"),
    (lambda: KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)),), num_blocks=1), "at least 2 blocks"),
    (lambda: KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)),)), "exactly one of"),
    (lambda: KVCacheManager(KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)),), num_blocks=10), max_model_len=100),
     "9 usable blocks but one request of max_model_len=100 tokens needs 25"),
    (lambda: SpecDecode("medusa", 2), "unknown speculative method 'medusa'"),
    (lambda: SpecDecode("eagle", 0), "num_speculative_tokens must be an integer >= 1, got 0"),
    (lambda: SpecDecode("dflash", 4, drafter_window=4), "drafter_window 4 is too small for k=4.*>= 5"),
    (lambda: BlockHasher(16, "md5"), "unknown hash algorithm 'md5'"),
    (lambda: Request("r", []), "empty prompt"),
    (lambda: Request("r", [2**70]), "token ids must be integers"),
    (lambda: Request("r", [1, 2], mm_items=[MultiModalItem("x", 1, 5)]), "must have length > 0 and lie inside"),
])
def test_validation_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_bad_calls():
    kv = manager(FA(4), num_blocks=10)
    r = Request("r", list(range(9)))
    with pytest.raises(ValueError, match="num_new_tokens must be a non-negative integer, got -1"):
        kv.allocate(r, -1)
    with pytest.raises(ValueError, match="needs num_new_tokens > 0 or a hit"):
        kv.allocate(r, 0)
    kv.allocate(r, 9)
    hit = kv.lookup(Request("q", list(range(9))))
    assert hit.num_tokens == 8                     # r's two full blocks are cached
    with pytest.raises(ValueError, match="already holds blocks"):
        kv.allocate(r, 1, hit)
    other = manager(FA(4), num_blocks=10)
    with pytest.raises(ValueError, match="another manager's hasher"):
        other.lookup(r)

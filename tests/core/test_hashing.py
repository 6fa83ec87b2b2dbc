"""Block hashes (``hybridkv.core.hashing``): the chained formula, extra keys, lookahead hashing.

* The sha256 chain recomputed from the documented formula (``hybridkv/events/__init__.py``):
  parent + tokens as little-endian int64 [+ lookahead tokens] [+ encoded extra keys]; seeds;
  the extra-key encoding byte for byte; which blocks ``update`` hashes and when.
* What enters a hash: the salt, LoRA (name and path), multimodal items (with EAGLE/MTP
  lookahead hashing, an image starting at the next block too), the lookahead token; KV events
  carry enough to rebuild every hash.
* ``BlockHasher``'s arguments are refused naming the valid values; ``coarse_view``.
The property test of the same contract: ``test_hash_properties.py``.
"""

from __future__ import annotations

import hashlib
import struct

import pytest

from hybridkv import (KVCacheConfig, KVCacheGroup, KVCacheManager, LoRA, MultiModalItem, Request,
                      SpecDecode)
from hybridkv.core import BlockHasher
from hybridkv.core.hashing import coarse_view, encode_extra_keys
from tests.support.helpers import FA, SWA, config, manager, raises, run_prompt, serve
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def test_chained_hash_formula_and_salt():  # vLLM: test_cache_key_salting (own formula)
    h = BlockHasher(16, "sha256")
    tokens = list(range(48))
    req = Request("r", tokens, RequestCacheParams(cache_salt="salt1"))
    h.update(req)
    h0 = h.hash_block(None, tokens[:16], extra_keys=(("cache_salt", "salt1"),))
    h1 = h.hash_block(h0, tokens[16:32])
    assert req.block_hashes[:2] == [h0, h1]
    kv = manager(FA(16), num_blocks=20, compat=False)
    run_prompt(kv, "a", tokens + [1], cache_salt="salt1")
    assert kv.lookup(Request("b", tokens + [2], RequestCacheParams(cache_salt="salt1"))).num_tokens == 48
    assert kv.lookup(Request("c", tokens + [2], RequestCacheParams(cache_salt="salt2"))).num_tokens == 0
    assert kv.lookup(Request("d", tokens + [2])).num_tokens == 0


def test_multimodal_extra_keys():  # vLLM: test_mm_prefix_caching
    tokens = list(range(10)) + [-1] * 10 + list(range(10, 20)) + [-1] * 18 + [-1] * 7 + [100] * 4
    items = [MultiModalItem("aaa", 11, 10), MultiModalItem("bbb", 30, 18), MultiModalItem("ccc", 48, 7)]
    req = Request("r", tokens, RequestCacheParams(mm_items=items))
    assert req.extra_keys(0, 16) == (("mm", "aaa", 11),)
    assert req.extra_keys(16, 32) == (("mm", "aaa", -5), ("mm", "bbb", 14))
    assert req.extra_keys(32, 48) == (("mm", "bbb", -2),)
    assert req.extra_keys(48, 64) == (("mm", "ccc", 0),)
    kv = manager(FA(16), num_blocks=20, compat=False)
    run_prompt(kv, "a", tokens, mm_items=items)
    same = Request("b", tokens[:48] + [7] * 10, RequestCacheParams(mm_items=items))
    assert kv.lookup(same).num_tokens == 48
    other = Request("c", tokens[:48] + [7] * 10, RequestCacheParams(
        mm_items=[MultiModalItem("zzz", 11, 10)] + items[1:]))
    assert kv.lookup(other).num_tokens == 0


def test_lora_path_enters_hash():
    kv = manager(FA(4), num_blocks=20, compat=False)
    run_prompt(kv, "a", list(range(13)), lora=LoRA("ad", "/v1"))
    assert kv.lookup(Request("b", list(range(13)), RequestCacheParams(lora=LoRA("ad", "/v1")))).num_tokens == 12
    assert kv.lookup(Request("c", list(range(13)), RequestCacheParams(lora=LoRA("ad", "/v2")))).num_tokens == 0


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
    kv = KVCacheManager(KVCacheConfig((KVCacheGroup("g", FA(2), ("l",)),), num_blocks=10), CacheOptions(
        enable_events=True, hash_algo="sha256", spec_decode=SpecDecode("eagle", 1)))
    r = Request("e", list(range(5)))
    kv.allocate(r, 5)
    ev = [e for e in kv.take_events() if isinstance(e, BlockStored)][0]
    assert ev.token_ids == [0, 1, 2, 3] and ev.lookahead_token_ids == [[2], [4]]
    parent = None
    for i, hh in enumerate(ev.block_hashes):
        parent = kv.hasher.hash_block(parent, ev.token_ids[2 * i:2 * i + 2], ev.lookahead_token_ids[i])
        assert parent == hh


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


ROOT = hashlib.sha256(b"hybridkv-none-hash").digest()


def _sha(parent: bytes, tokens, extra: bytes = b"") -> bytes:
    """The documented formula (hybridkv/events/__init__.py): sha256(parent + tokens as
    little-endian int64 [+ lookahead as int64] [+ encoded extra keys])."""
    return hashlib.sha256(parent + struct.pack(f"<{len(tokens)}q", *tokens) + extra).digest()


def test_sha256_chain_follows_the_documented_formula() -> None:
    """BlockHasher.__init__ (the fixed sha256 root, a given seed kept), hash_block, update (the
    fast path): every block's hash, recomputed independently.

    sha256 without a seed: root = sha256(b"hybridkv-none-hash"). 10 tokens at B = 4 give two
    hashes (the last 2 tokens do not fill a block); a negative token id is a valid int64."""
    h = BlockHasher(4, "sha256")
    assert (h.block_size, h.algo, h.seed, h.lookahead) == (4, "sha256", "hybridkv-none-hash", 0)
    assert h.none_hash == ROOT
    toks = [5, -1, 7, 2 ** 40, 9, 9, 9, 9, 1, 2]
    req = Request("r", toks)
    h.update(req)
    h0 = _sha(ROOT, toks[:4])
    h1 = _sha(h0, toks[4:8])
    assert req.block_hashes == [h0, h1]
    assert h.hash_block(None, toks[:4]) == h0 and h.hash_block(h0, toks[4:8]) == h1
    seeded = BlockHasher(4, "sha256", seed="abc")
    assert seeded.seed == "abc" and seeded.none_hash == hashlib.sha256(b"abc").digest()
    x = BlockHasher(4, seed="abc")
    assert x.algo == "xxh3_128" and x.seed == "abc" and x.none_hash == BlockHasher(4, seed="abc").none_hash


def test_update_hashes_exactly_the_full_blocks_once_their_lookahead_exists() -> None:
    """BlockHasher.update (which blocks are hashable, where each block's bytes start and end,
    the parent of an incremental update) and hash_block's lookahead.

    B = 4, lookahead L = 2: block i is hashable once (i+1)*4 + 2 tokens exist, and its hash
    covers its 4 tokens and the 2 after them. 5 tokens hash nothing (4 + 2 > 5); 6 hash block
    0; 9 still only block 0 (8 + 2 > 9); 14 hash blocks 1 and 2 (10 and 14 tokens) in one
    update. Without lookahead, exactly 8 tokens hash both blocks."""
    h = BlockHasher(4, "sha256", lookahead=2)
    toks = list(range(100, 114))
    req = Request("r", toks[:5])
    h.update(req)
    assert req.block_hashes == []
    req.append_tokens(toks[5:6])          # 6 tokens: block 0 (ends at 4) + 2 lookahead
    h.update(req)
    h0 = _sha(ROOT, toks[0:4] + toks[4:6])
    assert req.block_hashes == [h0]
    req.append_tokens(toks[6:9])          # 9 tokens: block 1 needs 8 + 2 = 10
    h.update(req)
    assert req.block_hashes == [h0]
    req.append_tokens(toks[9:14])         # 14 tokens: blocks 1 (10) and 2 (14)
    h.update(req)
    h1 = _sha(h0, toks[4:8] + toks[8:10])
    h2 = _sha(h1, toks[8:12] + toks[12:14])
    assert req.block_hashes == [h0, h1, h2]
    assert h.hash_block(h0, toks[4:8], toks[8:10]) == h1
    plain = BlockHasher(4, "sha256")
    req = Request("p", toks[:8])          # exactly two blocks: both hashable (no lookahead)
    plain.update(req)
    assert req.block_hashes == [_sha(ROOT, toks[:4]), _sha(_sha(ROOT, toks[:4]), toks[4:8])]


def _enc(*keys) -> bytes:
    """The extra-key encoding, written out: u32 key count; per key u32 item count; per item
    ``b"s"`` + u32 byte length + UTF-8, or ``b"i"`` + int64 (all little-endian)."""
    out = struct.pack("<I", len(keys))
    for key in keys:
        out += struct.pack("<I", len(key))
        for item in key:
            if isinstance(item, str):
                raw = item.encode()
                out += b"s" + struct.pack("<I", len(raw)) + raw
            else:
                out += b"i" + struct.pack("<q", item)
    return out


def test_extra_key_encoding_is_fixed_and_typed() -> None:
    """encode_extra_keys: the encoding is part of every hash of a block with extra keys (LoRA,
    multimodal items, salt), which crosses processes (sha256 with a shared seed; a consumer that
    knows the tags rehashes with it, hybridkv/events docstring), so its bytes must not change; a
    str and an int of the same text differ, a negative multimodal offset is an int64, and bool /
    float items are refused."""
    keys = (("lora", "ad", "/p"), ("mm", "img", -5), ("cache_salt", "é"))
    assert encode_extra_keys(keys) == _enc(*keys)
    assert encode_extra_keys(()) == b"\x00\x00\x00\x00"
    assert encode_extra_keys((("x", 1),)) != encode_extra_keys((("x", "1"),))
    for bad in (True, 1.5, None):
        with pytest.raises(TypeError, match=r"extra key items must be str or int, got "):
            encode_extra_keys((("x", bad),))


def test_hash_of_a_block_with_extra_keys_appends_their_encoding() -> None:
    """hash_block; update (the extra-keys path: each block's key range, the bytes it hashes, its
    parent): a LoRA request's blocks and an image's blocks.

    An image at tokens [2, 7) with B = 4: block 0 gets ("mm", "img", 2), block 1
    ("mm", "img", -2), block 2 none (a block without keys hashes no key bytes)."""
    h = BlockHasher(4, "sha256")
    toks = list(range(12))
    req = Request("r", toks, RequestCacheParams(mm_items=[MultiModalItem("img", 2, 5)]))
    h.update(req)
    h0 = _sha(ROOT, toks[:4], _enc(("mm", "img", 2)))
    h1 = _sha(h0, toks[4:8], _enc(("mm", "img", -2)))
    h2 = _sha(h1, toks[8:12])
    assert req.block_hashes == [h0, h1, h2]
    assert h.hash_block(None, toks[:4], extra_keys=(("mm", "img", 2),)) == h0
    lora = Request("l", toks[:8], RequestCacheParams(lora=LoRA("ad", "/p")))
    h.update(lora)
    k = _enc(("lora", "ad", "/p"))
    assert lora.block_hashes == [_sha(ROOT, toks[:4], k), _sha(_sha(ROOT, toks[:4], k), toks[4:8], k)]


def test_lookahead_hash_covers_the_extra_keys_of_its_lookahead_tokens() -> None:
    """BlockHasher.update — the extra keys of a block read over the block and its L lookahead
    tokens (a block's hash covers them), not over a range L tokens short.

    B = 4, L = 2, an image at tokens [5, 7): block 0 covers tokens [0, 6), so its keys hold
    ("mm", "img", 5); block 1 covers [4, 10): ("mm", "img", 1)."""
    h = BlockHasher(4, "sha256", lookahead=2)
    toks = list(range(10))
    req = Request("r", toks, RequestCacheParams(mm_items=[MultiModalItem("img", 5, 2)]))
    h.update(req)
    h0 = _sha(ROOT, toks[0:6], _enc(("mm", "img", 5)))
    h1 = _sha(h0, toks[4:10], _enc(("mm", "img", 1)))
    assert req.block_hashes == [h0, h1]


def test_bad_hasher_arguments_are_refused_naming_the_valid_values() -> None:
    """BlockHasher.__init__: each check, its bound (block size 1 and lookahead 0 are valid), the
    default lookahead 0, and the messages."""
    assert BlockHasher(1).block_size == 1 and BlockHasher(1).lookahead == 0
    for bad in (0, True, 2.0):
        with raises(rf"\bhash block_size\b must be a positive integer, got {bad!r}$"):
            BlockHasher(bad)
    with raises(r"unknown hash algorithm 'md5'; valid: xxh3_128, sha256$"):
        BlockHasher(4, "md5")
    for bad in (-1, True, 1.0):
        with raises(rf"\bhash lookahead\b must be a non-negative integer, got {bad!r}$"):
            BlockHasher(4, lookahead=bad)


def test_coarse_view_reads_every_kth_hash() -> None:
    """coarse_view: scale 1 is the list itself; scale k reads hashes k-1, 2k-1, ..."""
    hs = [bytes([i]) for i in range(7)]
    assert coarse_view(hs, 1) == hs
    assert coarse_view(hs, 2) == [hs[1], hs[3], hs[5]]
    assert coarse_view(hs, 3) == [hs[2], hs[5]]


@pytest.mark.parametrize("offset", [4, 8])
def test_lookahead_hash_covers_an_image_starting_at_the_next_block(offset: int) -> None:
    """EAGLE lookahead hashing: block i's hash covers the token after it. When two requests
    have the same placeholder tokens but different images starting exactly at a block
    boundary, the block before the image must not match: the drafter's KV at its last
    position was computed from the image's first embedding (vLLM's request block hasher keeps
    the images overlapping the lookahead tokens in the extra keys)."""
    kv = KVCacheManager(config(FA(4), num_blocks=20), CacheOptions(spec_decode=SpecDecode("eagle", 1)))
    prompt = list(range(1, offset + 1)) + [0] * 4 + [50, 51]
    a = serve(kv, "a", prompt, mm_items=[MultiModalItem("image-a", offset, 4)])
    b = Request("b", prompt, RequestCacheParams(mm_items=[MultiModalItem("image-b", offset, 4)]))
    hit = kv.lookup(b)
    # blocks before the one ending at the image start are shared; that one is not
    assert hit.num_tokens == offset - 4
    assert a.block_hashes[offset // 4 - 1] != b.block_hashes[offset // 4 - 1]
    assert a.block_hashes[: offset // 4 - 1] == b.block_hashes[: offset // 4 - 1]
    # the same image does hit through the block (and one more)
    same = Request("c", prompt, RequestCacheParams(mm_items=[MultiModalItem("image-a", offset, 4)]))
    assert kv.lookup(same).num_tokens == offset + 4


def test_without_lookahead_an_image_at_the_next_block_does_not_enter_the_hash() -> None:
    """Control: with no lookahead (no EAGLE), the image at the next block is outside block
    i's key, so both requests share block i (and only it)."""
    kv = KVCacheManager(config(FA(4), num_blocks=20))
    prompt = [1, 2, 3, 4] + [0] * 4 + [50, 51]
    serve(kv, "a", prompt, mm_items=[MultiModalItem("image-a", 4, 4)])
    b = Request("b", prompt, RequestCacheParams(mm_items=[MultiModalItem("image-b", 4, 4)]))
    assert kv.lookup(b).num_tokens == 4

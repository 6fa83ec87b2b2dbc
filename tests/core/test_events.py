"""KV events (``BlockStored`` / ``BlockRemoved``) and the evicted-block listener.

* ``BlockStored``'s fields for a chunked prefill with an image and a LoRA, and with hash
  lookahead; ``BlockRemoved`` names the GPU medium; vLLM's untagged extra keys;
* ``add_evicted_listener`` and ``holds_cached``: what an offload-on-evict tier is told, and
  when.
The wire format and the publisher: ``tests/events``.
"""

from __future__ import annotations

from hybridkv import (BlockRemoved, BlockStored, KVCacheManager, LoRA, MultiModalItem, Request,
                      SpecDecode)
from hybridkv.core.events import untag_extra_keys
from tests.support.helpers import FA, SWA, config, prompt, serve
from hybridkv.core.cache_options import CacheOptions


def _serve(kv: KVCacheManager, rid: str, tokens: list[int]) -> Request:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, len(tokens) - hit.num_tokens, hit) is not None
    req.num_computed_tokens = len(tokens)
    kv.free(req)
    return req


def test_the_listener_hears_each_cached_hash_that_leaves_the_pool_and_nothing_else() -> None:
    kv = KVCacheManager(config(FA(4), num_blocks=9), CacheOptions(enable_events=True))
    heard: list[tuple[int, bytes]] = []
    kv.add_evicted_listener(lambda g, h: heard.append((g, h)))
    a = _serve(kv, "a", list(range(17)))             # 4 full blocks cached, 1 partial
    cached = [a.block_hashes[j] for j in range(4)]
    assert heard == [] and all(kv.holds_cached(0, h) for h in cached)
    # b takes 5 blocks: a's partial (unhashed), the 3 never used, then the oldest cached one
    _serve(kv, "b", list(range(100, 117)))
    assert len(heard) == 1 and all(g == 0 for g, _ in heard)
    assert {h for _, h in heard} <= set(cached)
    for _, h in heard:
        assert not kv.holds_cached(0, h)
    assert sum(kv.holds_cached(0, h) for h in cached) == 3
    removed = [e for e in kv.take_events() if type(e).__name__ == "BlockRemoved"]
    assert len(removed) == 1                          # the KV events still flow


def test_a_sliding_group_offers_only_blocks_its_write_path_cached() -> None:
    kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=40), CacheOptions(retention_interval=0))
    cached: set[tuple[int, bytes]] = set()
    kv.add_cached_listener(lambda g, hashes, blocks: cached.update((g, h) for h in hashes))
    heard: list[tuple[int, bytes]] = []
    kv.add_evicted_listener(lambda g, h: heard.append((g, h)))
    for i in range(6):
        _serve(kv, f"r{i}", [1000 * i + t for t in range(60)])
    assert any(g == 1 for g, _ in heard)
    assert set(heard) <= cached
    window_cached = sum(1 for g, _ in cached if g == 1)
    assert window_cached < sum(1 for g, _ in cached if g == 0)   # windows, not whole prompts


def test_untag_extra_keys_by_hand() -> None:
    """events: untag_extra_keys — vLLM's event form: ``("mm", id, off)`` -> ``(id, off)``, LoRA
    -> its name, the salt -> itself; no keys -> None."""
    keys = (("lora", "ad", "/p"), ("mm", "img", -3), ("cache_salt", "s"))
    assert untag_extra_keys(keys) == ("ad", ("img", -3), "s")
    assert untag_extra_keys((("mm", "a", 0),)) == (("a", 0),)
    assert untag_extra_keys(()) is None


def _stored(kv: KVCacheManager) -> list[BlockStored]:
    return [ev for ev in kv.take_events() if isinstance(ev, BlockStored)]


def test_stored_events_of_a_chunked_prefill_with_an_image_and_a_lora() -> None:
    """_record_stored / _on_stored — the fields of ``BlockStored`` and the listener's arguments
    for a run that does not start at block 0.

    bs 4, a 16-token prompt computed in two chunks of 8: runs of blocks 0–1 then 2–3. An image
    at tokens [6, 10): block 1 ([4, 8)) sees it at offset 6 - 4 = 2, block 2 ([8, 12)) at
    6 - 8 = -2, blocks 0 and 3 not at all. With LoRA "ad" every block's keys start with "ad".
    The second run's parent is block 1's hash. The plain request has no extra keys and no
    lookahead (both None)."""
    P = prompt(0, 16)
    for lora in (None, LoRA("ad", "/p")):
        kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(enable_events=True))
        seen = []
        kv.add_cached_listener(lambda g, hs, bs: seen.append((g, hs, bs)))
        r = serve(kv, "r", P, chunk=8, free=False, lora=lora,
                  mm_items=[MultiModalItem("img", 6, 4)])
        ids = kv.block_ids(r)[0]
        h = r.block_hashes
        first, second = _stored(kv)
        assert seen == [(0, [h[0], h[1]], ids[0:2]), (0, [h[2], h[3]], ids[2:4])]
        pre = ("ad",) if lora else ()
        assert first == BlockStored(block_hashes=[h[0], h[1]], parent_block_hash=None,
                                    token_ids=P[0:8], block_size=4,
                                    lora_name="ad" if lora else None, medium="GPU", group_idx=0,
                                    extra_keys=[pre or None, pre + (("img", 2),)],
                                    lookahead_token_ids=None)
        assert second == BlockStored(block_hashes=[h[2], h[3]], parent_block_hash=h[1],
                                     token_ids=P[8:16], block_size=4,
                                     lora_name="ad" if lora else None, medium="GPU", group_idx=0,
                                     extra_keys=[pre + (("img", -2),), pre or None],
                                     lookahead_token_ids=None)
    plain = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(enable_events=True))
    serve(plain, "q", P)
    (ev,) = _stored(plain)
    assert ev.extra_keys is None and ev.lookahead_token_ids is None and ev.lora_name is None


def test_stored_events_with_hash_lookahead_cover_the_next_token() -> None:
    """_record_stored — the extra keys' range ends ``la`` tokens early; the lookahead list
    restarts at block 0 for a run that does not start there.

    EAGLE k=1 proves one token past each block (L = 1). bs 4, a 13-token prompt in chunks of
    8 and 5: a block is cached once its tokens are computed and its next token is known (the
    prompt's), so the first run is blocks 0–1 and the second block 2 (block 3 would need token
    16, past the prompt). Block j carries
    token 4(j + 1) as its lookahead; an image at [4, 6) is in block 0's keys at offset 4
    (block 0's range with L is [0, 5)) and in block 1's at offset 0."""
    P = prompt(0, 13)
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(
        enable_events=True, spec_decode=SpecDecode("eagle", 1)))
    r = serve(kv, "r", P, chunk=8, free=False, mm_items=[MultiModalItem("img", 4, 2)])
    evs = _stored(kv)
    firsts = [ev.token_ids[0] // 4 for ev in evs]
    blocks = [f + i for ev, f in zip(evs, firsts) for i in range(len(ev.block_hashes))]
    assert firsts == [0, 2] and blocks == [0, 1, 2]
    look = [x for ev in evs for x in ev.lookahead_token_ids]
    assert look == [[4], [8], [12]]
    keys = [x for ev in evs for x in ev.extra_keys]
    assert keys == [(("img", 4),), (("img", 0),), None]
    assert [x for ev in evs for x in ev.block_hashes] == r.block_hashes[:3]


def test_removed_events_name_the_gpu_medium() -> None:
    """_on_evict — ``BlockRemoved``'s medium changed from "GPU".

    3 usable blocks, bs 4: "a" caches 1 block (5 tokens), "z" (9 tokens) evicts it."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(enable_events=True))
    a = serve(kv, "a", prompt(100, 5))
    serve(kv, "z", prompt(300, 9))
    removed = [ev for ev in kv.take_events() if isinstance(ev, BlockRemoved)]
    assert removed == [BlockRemoved([a.block_hashes[0]], "GPU", 0)]

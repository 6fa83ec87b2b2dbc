"""The wire format: what hybridkv encodes, decoded by an independent decoder (tests/events/
spec_decoder.py, plain msgpack), and hashes recomputed from token_ids with hashlib alone."""

from __future__ import annotations

import hashlib
import struct

import pytest
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

pytest.importorskip("msgspec")
pytest.importorskip("msgpack")
import msgpack  # noqa: E402

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup,  # noqa: E402
                      KVCacheManager, Request, SlidingWindow)
from hybridkv.events import recompute_block_hashes  # noqa: E402
from hybridkv.events.wire import (AllBlocksCleared, BlockRemoved, BlockStored, EventBatch,  # noqa: E402
                                  WireMapper, decode_batch, encode_batch)
from tests.events.spec_decoder import decode_payload  # noqa: E402


def serve(kv: KVCacheManager, rid: str, tokens: list[int], decode: int = 0) -> Request:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is not None
    req.num_computed_tokens = req.num_tokens
    for k in range(decode):
        req.append_tokens([90_000 + k])
        assert kv.allocate(req, 1) is not None
        req.num_computed_tokens += 1
    kv.free(req)
    return req


def hybrid_config(num_blocks: int = 64) -> KVCacheConfig:
    return KVCacheConfig((
        KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),
        KVCacheGroup("swa", SlidingWindow(block_size=32, window=64), ("l1",)),
        KVCacheGroup("chunk", ChunkedLocal(block_size=16, chunk_size=64), ("l2",)),
    ), num_blocks=num_blocks)


def independent_hashes(parent: bytes | None, token_ids: list[int], block_size: int,
                       hash_block: int) -> list[bytes]:
    """sha256(parent + tokens as <int64) chained per hash block, root sha256(seed)."""
    h = parent if parent is not None else hashlib.sha256(b"hybridkv-none-hash").digest()
    out = []
    for j in range(len(token_ids) // block_size):
        block = token_ids[j * block_size:(j + 1) * block_size]
        for k in range(0, block_size, hash_block):
            sub = block[k:k + hash_block]
            h = hashlib.sha256(h + struct.pack(f"<{len(sub)}q", *sub)).digest()
        out.append(h)
    return out


def test_batch_is_an_array_and_events_are_tagged_maps_in_vllm_field_order() -> None:
    cfg = hybrid_config(num_blocks=64)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))
    serve(kv, "a", list(range(200)), decode=3)
    serve(kv, "b", list(range(1000, 1300)))       # evicts some of a's blocks
    assert kv.reset_prefix_cache()
    events = kv.take_events()
    payload = encode_batch(WireMapper(cfg).batch(events, ts=12.5, data_parallel_rank=3))
    raw = msgpack.unpackb(payload, raw=False)
    assert isinstance(raw, list) and raw[0] == 12.5 and raw[2] == 3
    batch = decode_payload(payload)                # raises on any deviation from the contract
    kinds = [e.kind for e in batch.events]
    assert kinds.count("BlockStored") >= 3 and "BlockRemoved" in kinds
    assert kinds[-1] == "AllBlocksCleared" and batch.events[-1].fields == {}
    assert len(batch.events) == len(events)
    for core, ev in zip(events, batch.events):
        if ev.kind == "BlockStored":
            assert ev.get("block_hashes") == list(core.block_hashes)
            assert ev.get("lora_id") is None and "lora_id" in ev.fields   # required, so present
            assert ev.get("medium") == "GPU" and ev.get("group_idx") == core.group_idx
            kind, window = {0: ("full_attention", None), 1: ("sliding_window", 64),
                            2: ("chunked_local_attention", None)}[core.group_idx]
            assert ev.get("kv_cache_spec_kind") == kind
            assert ev.get("kv_cache_spec_sliding_window") == window
            assert ("kv_cache_spec_sliding_window" in ev.fields) == (window is not None)
            assert "extra_keys" not in ev.fields and "session_id" not in ev.fields  # defaults omitted
        elif ev.kind == "BlockRemoved":
            assert ev.get("block_hashes") == list(core.block_hashes)
            assert ev.get("group_idx") == core.group_idx


def test_stored_hashes_are_recomputable_from_token_ids() -> None:
    cfg = hybrid_config()
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))
    serve(kv, "a", list(range(7, 300)), decode=20)
    serve(kv, "b", list(range(7, 200)) + list(range(5000, 5100)))
    events = kv.take_events()
    batch = decode_payload(encode_batch(WireMapper(cfg).batch(events, ts=0.0)))
    stored = [e for e in batch.events if e.kind == "BlockStored"]
    assert {e.get("group_idx") for e in stored} == {0, 1, 2}
    for ev in stored:
        want = independent_hashes(ev.get("parent_block_hash"), ev.get("token_ids"),
                                  ev.get("block_size"), cfg.hash_block_size)
        assert ev.get("block_hashes") == want
    # and the helper agrees on the coarse groups' sub-blocks (no lookahead here)
    for ev in WireMapper(cfg).batch(events, ts=0.0).events:
        if isinstance(ev, BlockStored):
            assert recompute_block_hashes(ev, cfg.hash_block_size) == ev.block_hashes


def test_recompute_helper_with_lookahead_and_coarse_blocks() -> None:
    from hybridkv import SpecDecode
    cfg = hybrid_config()
    kv = KVCacheManager(cfg, CacheOptions(
        spec_decode=SpecDecode("eagle", 2), hash_algo="sha256", enable_events=True))
    serve(kv, "a", list(range(300)), decode=10)
    mapper = WireMapper(cfg)
    n = 0
    for core in kv.take_events():
        ev = mapper.map(core)
        if isinstance(ev, BlockStored):
            assert ev.lookahead_token_ids and len(ev.lookahead_token_ids[0]) == 1
            assert recompute_block_hashes(ev, cfg.hash_block_size) == ev.block_hashes
            n += 1
    assert n >= 2


def test_mla_kinds() -> None:
    cfg = KVCacheConfig((KVCacheGroup("mla", MLA(block_size=64), ("l0",)),), num_blocks=16)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))
    serve(kv, "a", list(range(200)))
    batch = decode_payload(encode_batch(WireMapper(cfg).batch(kv.take_events(), ts=1.0)))
    assert {e.get("kv_cache_spec_kind") for e in batch.events} == {"mla_attention"}


def test_decodes_a_payload_built_by_hand_in_vllm_form() -> None:
    """A payload written with plain msgpack the way vLLM's msgspec encoder lays it out (int
    hashes, optional fields absent) decodes into the typed structs, and re-encodes to it."""
    stored = {"type": "BlockStored", "block_hashes": [11, 12], "parent_block_hash": None,
              "token_ids": list(range(32)), "block_size": 16, "lora_id": None, "medium": "GPU",
              "lora_name": None, "group_idx": 1, "kv_cache_spec_kind": "sliding_window",
              "kv_cache_spec_sliding_window": 4096}
    removed = {"type": "BlockRemoved", "block_hashes": [b"\x01" * 16], "medium": "CPU"}
    payload = msgpack.packb([1.25, [stored, removed, {"type": "AllBlocksCleared"}], 2])
    b = decode_batch(payload)
    assert b.ts == 1.25 and b.data_parallel_rank == 2
    s, r, c = b.events
    assert isinstance(s, BlockStored) and s.block_hashes == [11, 12] and s.group_idx == 1
    assert s.kv_cache_spec_sliding_window == 4096 and s.extra_keys is None
    assert isinstance(r, BlockRemoved) and r.group_idx is None and r.medium == "CPU"
    assert isinstance(c, AllBlocksCleared)
    # and the reverse: our encoding of the same structs is the same msgpack document (keys in the
    # same order; msgspec may pick a wider map header than msgpack does, so bytes can differ)
    ours = msgpack.unpackb(encode_batch(EventBatch(1.25, [s, r, c], 2)), raw=False)
    theirs = msgpack.unpackb(payload, raw=False)
    assert ours == theirs
    assert [list(e) for e in ours[1]] == [list(e) for e in theirs[1]]
    # a two-item batch (no rank) is accepted too
    assert decode_batch(msgpack.packb([0.5, []])).data_parallel_rank is None


def test_malformed_payloads_raise() -> None:
    import msgspec
    with pytest.raises(msgspec.DecodeError):
        decode_batch(b"\x93\x01")
    with pytest.raises(msgspec.ValidationError):
        decode_batch(msgpack.packb([1.0, [{"type": "Nope"}], 0]))


# ---- requests with extra keys: LoRA, multimodal items, cache salt ---------------------------------
def untagged_keys(req: Request, start: int, end: int) -> tuple | None:
    """vLLM's event form of one block's extra keys over ``[start, end)`` (``to_event_extra_keys``
    of ``generate_block_hash_extra_keys`` in vllm/v1/core/kv_cache_utils.py), written from that
    contract: the LoRA name, then ``(identifier, offset - start)`` of every multimodal item that
    overlaps the range, then the cache salt in the first block only; None when there are none."""
    keys: list = [req.lora.name] if req.lora else []
    keys += [[m.identifier, m.offset - start] for m in req.mm_items
             if m.offset < end and m.offset + m.length > start]
    if start == 0 and req.cache_salt:
        keys.append(req.cache_salt)
    return keys or None


def test_lora_multimodal_and_salt_keys_reach_the_wire_per_block() -> None:
    """A LoRA request with an image and a cache salt: every BlockStored names the adapter
    (``lora_name``) and carries one untagged extra-key entry per block, in vLLM's order (LoRA
    name, ``(image, offset in the block)``, salt in block 0 only). Hand-computed for 16-token
    blocks and an image on tokens [10, 30): block 0 holds its first 6 tokens (offset 10), block
    1 the rest (offset 10 - 16 = -6), block 2 only the LoRA name. Guards against the mapper
    dropping ``lora_name`` or ``extra_keys``, or misaligning the entries with the blocks."""
    from hybridkv import LoRA, MultiModalItem
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),), num_blocks=32)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))
    req = Request("a", list(range(50)), RequestCacheParams(
        lora=LoRA("sql", "/adapters/sql"), cache_salt="tenant-7", mm_items=[MultiModalItem("img-0", 10,
        20)]))
    hit = kv.lookup(req)
    assert kv.allocate(req, req.num_tokens, hit) is not None
    payload = encode_batch(WireMapper(cfg).batch(kv.take_events(), ts=2.0))
    (ev,) = decode_payload(payload).events
    assert ev.kind == "BlockStored" and ev.get("lora_name") == "sql"
    assert ev.get("lora_id") is None and "lora_id" in ev.fields
    assert ev.get("token_ids") == list(range(48)) and ev.get("block_size") == 16
    assert ev.get("extra_keys") == [["sql", ["img-0", 10], "tenant-7"], ["sql", ["img-0", -6]],
                                    ["sql"]]
    typed = decode_batch(payload).events[0]            # the typed decoder: tuples per block
    assert typed.extra_keys == [("sql", ["img-0", 10], "tenant-7"), ("sql", ["img-0", -6]),
                                ("sql",)]
    assert typed.lora_name == "sql"


def test_a_salt_alone_keys_only_the_first_block_and_blocks_without_keys_are_nil() -> None:
    """A salted request without LoRA or images: the salt is block 0's only key, and the other
    blocks' entries are nil (one entry per block, as vLLM sends them); no ``lora_name``."""
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=4), ("l0",)),), num_blocks=16)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", enable_events=True))
    req = Request("a", list(range(13)), RequestCacheParams(cache_salt="s"))
    assert kv.allocate(req, 13, kv.lookup(req)) is not None
    (ev,) = decode_payload(encode_batch(WireMapper(cfg).batch(kv.take_events(), ts=0.0))).events
    assert ev.get("extra_keys") == [["s"], None, None]
    assert ev.get("lora_name") is None and "lora_name" in ev.fields


@pytest.mark.parametrize("spec", [None, "eagle"])
def test_extra_keys_of_random_requests_match_vllms_rule(spec) -> None:
    """Many requests sharing prefixes, each with some of LoRA, images and a salt, on a hybrid
    config (blocks of 16 and 32 tokens): every stored block's entry on the wire equals
    :func:`untagged_keys` over the block's hashed range (its tokens plus the lookahead, as the
    block hash covers them), and its group's kind, window and tokens are the request's."""
    import random

    from hybridkv import LoRA, MultiModalItem, SpecDecode
    rng = random.Random(5)
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),
                         KVCacheGroup("mla", MLA(block_size=32), ("l1",))), num_blocks=200)
    kv = KVCacheManager(cfg, CacheOptions(
        hash_algo="sha256", enable_events=True, spec_decode=SpecDecode(spec, 2) if spec else None))
    la = kv.hasher.lookahead
    mapper = WireMapper(cfg)
    seen = 0
    for i in range(30):
        n = rng.randrange(20, 140)
        items, pos = [], rng.randrange(0, 30)
        while pos + 3 < n and rng.random() < 0.7:
            length = rng.randrange(1, 30)
            items.append(MultiModalItem(f"img{rng.randrange(4)}", pos, min(length, n - pos)))
            pos += length + rng.randrange(0, 20)
        req = Request(f"r{i}", [rng.randrange(3) for _ in range(n)], RequestCacheParams(
            lora=LoRA(rng.choice(["a", "b"]), "/p") if rng.random() < 0.5 else None,
            cache_salt=rng.choice([None, "x"]), mm_items=items))
        assert kv.allocate(req, n, kv.lookup(req)) is not None
        events = kv.take_events()
        kv.free(req)
        for ev in decode_payload(encode_batch(mapper.batch(events, ts=0.0))).events:
            if ev.kind != "BlockStored":
                continue
            bs, g = ev.get("block_size"), ev.get("group_idx")
            assert bs == cfg.groups[g].spec.block_size
            assert ev.get("kv_cache_spec_kind") == ("full_attention", "mla_attention")[g]
            assert ev.get("lora_name") == (req.lora.name if req.lora else None)
            hashes, tokens = ev.get("block_hashes"), ev.get("token_ids")
            # the run's first block: the one whose chained hash is the event's first hash
            per = bs // cfg.hash_block_size
            ends = req.block_hashes[per - 1::per]
            pos = ends.index(hashes[0])
            assert hashes == ends[pos:pos + len(hashes)]
            assert tokens == req.token_ids.tolist()[pos * bs:(pos + len(hashes)) * bs]
            keys = ev.get("extra_keys")
            want = [untagged_keys(req, (pos + j) * bs, (pos + j + 1) * bs + la)
                    for j in range(len(hashes))]
            if not req.has_extra_keys:
                assert "extra_keys" not in ev.fields
            else:
                assert keys == want
                seen += 1
    assert seen > 10


#: every field of vLLM 0.33's BlockStored / BlockRemoved set to a value other than its default
EVERY_STORED_FIELD = dict(
    block_hashes=[b"\x01" * 32, b"\x02" * 32], parent_block_hash=b"\x00" * 32,
    token_ids=list(range(8)), block_size=4, lora_id=3, medium="CPU", lora_name="sql",
    extra_keys=[("sql", ["img", 2], "salt"), None], group_idx=2,
    kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=128, locality="LOCAL",
    ownership="tier-1", session_id="sess-9", lookahead_token_ids=[[8], [9]])
EVERY_REMOVED_FIELD = dict(block_hashes=[7, 8], medium="STORAGE", group_idx=1, locality="REMOTE",
                           ownership="tier-2")


def test_every_field_vllms_decoder_reads_round_trips() -> None:
    """Each field of vLLM's BlockStored and BlockRemoved (vllm/distributed/kv_events.py), set to
    a non-default value, is on the wire under its own name, in declaration order, with its
    value (the independent decoder), and decodes back to the same struct; the batch's
    timestamp and rank too. Guards against a renamed, reordered, retyped or dropped field."""
    from tests.events.spec_decoder import REMOVED_ORDER, STORED_ORDER
    stored = BlockStored(**EVERY_STORED_FIELD)
    removed = BlockRemoved(**EVERY_REMOVED_FIELD)
    payload = encode_batch(EventBatch(4.5, [stored, removed, AllBlocksCleared()], 6))
    raw = msgpack.unpackb(payload, raw=False)
    assert [list(e) for e in raw[1]] == [list(STORED_ORDER), list(REMOVED_ORDER), ["type"]]
    batch = decode_payload(payload)
    assert (batch.ts, batch.data_parallel_rank) == (4.5, 6)
    s, r, c = batch.events
    want = dict(EVERY_STORED_FIELD, extra_keys=[["sql", ["img", 2], "salt"], None])
    assert (s.kind, s.fields) == ("BlockStored", want)
    assert (r.kind, r.fields) == ("BlockRemoved", EVERY_REMOVED_FIELD)
    assert (c.kind, c.fields) == ("AllBlocksCleared", {})
    back = decode_batch(payload)
    assert (back.ts, back.data_parallel_rank) == (4.5, 6)
    assert back.events == [stored, removed, AllBlocksCleared()]


@pytest.mark.parametrize("seed", [None, "tenant-seed"])
def test_recompute_without_lookahead_with_a_seed_and_each_blocks_own_size(seed) -> None:
    """No speculative decoding (no lookahead on the wire), the manager's ``hash_seed`` given
    to the helper, and the helper's default hash block (the event's own block size) on a
    single-size model: every stored event recomputes to its hashes; a chain's first event does
    not under another seed."""
    cfg = KVCacheConfig((KVCacheGroup("full", FullAttention(block_size=16), ("l0",)),), num_blocks=32)
    kv = KVCacheManager(cfg, CacheOptions(hash_algo="sha256", hash_seed=seed, enable_events=True))
    serve(kv, "a", list(range(100)))
    serve(kv, "b", list(range(50)) + list(range(900, 950)))
    stored = [WireMapper(cfg).map(e) for e in kv.take_events()]
    stored = [e for e in stored if isinstance(e, BlockStored)]
    assert len(stored) >= 2 and all(e.lookahead_token_ids is None for e in stored)
    assert any(len(e.block_hashes) > 1 for e in stored)
    for ev in stored:
        assert recompute_block_hashes(ev, seed=seed) == ev.block_hashes
        assert recompute_block_hashes(ev, 8, seed=seed) != ev.block_hashes   # other chain
        if ev.parent_block_hash is None:                 # the seed is the chain's root
            assert recompute_block_hashes(ev, seed="other") != ev.block_hashes
    assert any(e.parent_block_hash is None for e in stored)


def test_recompute_refuses_what_it_cannot_rehash() -> None:
    ev = BlockStored([b"\x01" * 32], None, list(range(16)), 16, None, "GPU", None)
    with pytest.raises(ValueError, match=r"^hash_block_size 6 does not divide the event's block_size 16$"):
        recompute_block_hashes(ev, 6)
    keyed = BlockStored([b"\x01" * 32], None, list(range(16)), 16, None, "GPU", None,
                        extra_keys=[("sql",)])
    with pytest.raises(ValueError, match=r"^blocks with extra keys need their tagged keys to be rehashed$"):
        recompute_block_hashes(keyed)
    nil_keys = BlockStored([b"\x01" * 32], None, list(range(16)), 16, None, "GPU", None,
                           extra_keys=[None])
    assert len(recompute_block_hashes(nil_keys)) == 1       # nil entries are no keys


def test_removals_keep_their_medium_and_the_mapper_fills_a_missing_one() -> None:
    """A removal goes out on the medium its core event names (the mapper's own medium is only
    the fallback for an event without one), for stored blocks and removals alike; anything
    that is not a core event is refused by name."""
    from hybridkv.core import events as core
    cfg = hybrid_config()
    cpu = WireMapper(cfg, medium="CPU")
    assert cpu.map(core.BlockRemoved([b"h"], "GPU", 1)) == BlockRemoved([b"h"], "GPU", group_idx=1)
    assert cpu.map(core.BlockRemoved([b"h"], "", 2)) == BlockRemoved([b"h"], "CPU", group_idx=2)
    assert WireMapper(cfg).map(core.BlockRemoved([b"h"], "", 0)).medium == "GPU"
    stored = cpu.map(core.BlockStored([b"h"], None, list(range(16)), 16, None, "", 0))
    assert stored.medium == "CPU"
    with pytest.raises(TypeError, match=r"^not a KV event: 'x'$"):
        cpu.map("x")


def test_an_mla_spec_with_a_window_is_vllms_sliding_mla_kind() -> None:
    """``spec_kind`` names a windowed MLA spec (an extension's subclass) ``sliding_window_mla``
    with its window, as vLLM does; plain MLA has no window."""
    import dataclasses

    from hybridkv.events.wire import spec_kind

    @dataclasses.dataclass(frozen=True, slots=True)
    class WindowedMLA(MLA):
        @property
        def window_tokens(self) -> int:
            return 128

    assert spec_kind(WindowedMLA(block_size=16)) == ("sliding_window_mla", 128)
    assert spec_kind(MLA(block_size=16)) == ("mla_attention", None)


def test_the_package_resolves_its_lazy_names_and_refuses_unknown_ones() -> None:
    """``hybridkv.events.NAME`` loads the wire and ZMQ parts on first use: each lazy name is
    the object of its module; an unknown name is an AttributeError naming it."""
    import importlib

    import hybridkv.events as events
    for name, mod in events._LAZY.items():
        assert getattr(events, name) is getattr(importlib.import_module(f"hybridkv.events.{mod}"), name)
    assert set(events._LAZY) <= set(events.__all__)
    with pytest.raises(AttributeError, match=r"^module 'hybridkv.events' has no attribute 'Nope'$"):
        events.Nope  # noqa: B018

"""KVTransfer through LocalCPUStore (and a broken store): round trips, prefixes, corruption,
foreign layouts, full and failing stores."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch

from hybridkv.connectors.kernel_blocks import KernelBlockMap, plan_kernel_blocks
from hybridkv.connectors.layout import KVLayout
from hybridkv.connectors.stores import LocalCPUStore
from hybridkv.connectors.stores.base import KVStore
from hybridkv.connectors.transfer import TRAILER_BYTES, KVTransfer, TransferOptions

from hybridkv.core.blockref import BlockRef

from .kv_helpers import (alloc, engine, gqa_config, h, mixed_config, raw, refs, same_block, scramble,
                         snapshot)

MODES = [("direct", "python"), ("staged", "python"), ("staged", "torch")]


class CountingStore(LocalCPUStore):
    """LocalCPUStore that counts the calls made to it (not its own internal calls)."""

    def __init__(self, capacity: int) -> None:
        super().__init__(capacity)
        self.calls: dict[str, int] = {}
        self._depth = 0

    def _call(self, name: str, fn, *args):
        if self._depth == 0:
            self.calls[name] = self.calls.get(name, 0) + 1
        self._depth += 1
        try:
            return fn(*args)
        finally:
            self._depth -= 1

    def batch_put(self, keys, payloads):
        return self._call("batch_put", super().batch_put, keys, payloads)

    def batch_get(self, keys, expected_sizes=None):
        return self._call("batch_get", super().batch_get, keys, expected_sizes)

    def batch_put_from(self, keys, buffer, offsets, sizes):
        return self._call("batch_put_from", super().batch_put_from, keys, buffer, offsets, sizes)

    def batch_get_into(self, keys, buffer, offsets, sizes):
        return self._call("batch_get_into", super().batch_get_into, keys, buffer, offsets, sizes)


@pytest.mark.parametrize("mode, copy_mode", MODES)
def test_mixed_mla_eagle_round_trip(mode: str, copy_mode: str) -> None:
    cfg = mixed_config(num_blocks=12)
    kv = engine(cfg, seed=1)
    store = CountingStore(1 << 24)
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(mode=mode, copy_mode=copy_mode))
    assert tr.mode == mode
    ref = snapshot(kv)
    mla_blocks = [(h(i), b) for i, b in enumerate([3, 1, 7])]
    draft_blocks = [(h(i), b) for i, b in enumerate([5, 9])]  # same hashes, other group
    assert tr.save(refs(tr, "mla", mla_blocks)) == [True] * 3
    assert tr.save(refs(tr, "draft", draft_blocks)) == [True] * 2
    put = "batch_put" if mode == "direct" else "batch_put_from"
    assert store.calls == {put: 2}  # one store call per save
    assert len(store) == 5
    scramble(kv, seed=2)
    # load into other block ids than they were saved from
    assert tr.load(refs(tr, "mla", [(h(0), 2), (h(1), 4), (h(2), 6)])) == 3
    assert tr.load(refs(tr, "draft", [(h(0), 8), (h(1), 10)])) == 2
    get = "batch_get" if mode == "direct" else "batch_get_into"
    assert store.calls == {put: 2, get: 2}  # one store call per load
    for src, dst in [(3, 2), (1, 4), (7, 6)]:
        assert same_block(kv, ref, ("m0", "m1", "m2"), dst, src, mla=True)
    for src, dst in [(5, 8), (9, 10)]:
        assert same_block(kv, ref, ("eagle.0",), dst, src)
    st = tr.stats
    mla_bytes = 3 * cfg.groups[0].spec.page_size_bytes
    draft_bytes = cfg.groups[1].spec.page_size_bytes
    assert (st.saved, st.save_dropped, st.loaded, st.load_failed, st.corrupt) == (5, 0, 5, 0, 0)
    assert st.saved_bytes == st.loaded_bytes == 3 * mla_bytes + 2 * draft_bytes
    assert store.used_bytes == 3 * (mla_bytes + TRAILER_BYTES) + 2 * (draft_bytes + TRAILER_BYTES)


@pytest.mark.parametrize("mode, copy_mode", MODES[:2])
def test_one_call_may_mix_groups_one_store_batch_per_run(mode: str, copy_mode: str) -> None:
    cfg = mixed_config(num_blocks=12)
    kv = engine(cfg, seed=1)
    store = CountingStore(1 << 24)
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(mode=mode, copy_mode=copy_mode))
    ref = snapshot(kv)
    assert tr.save(refs(tr, "mla", [(h(0), 3), (h(1), 1)]) + refs(tr, "draft", [(h(0), 5)])) == [True] * 3
    put = "batch_put" if mode == "direct" else "batch_put_from"
    get = "batch_get" if mode == "direct" else "batch_get_into"
    assert store.calls == {put: 2}
    scramble(kv, seed=2)
    loads = refs(tr, "mla", [(h(0), 2), (h(1), 4)]) + refs(tr, "draft", [(h(0), 8)])
    assert tr.load(loads) == 3 and store.calls[get] == 2
    assert same_block(kv, ref, ("m0", "m1", "m2"), 4, 1, mla=True)
    assert same_block(kv, ref, ("eagle.0",), 8, 5)
    # a miss in the first run: the draft run is not even read, and counts as failed
    store.remove([tr.key("mla", h(1))])
    assert tr.load(loads) == 1 and store.calls[get] == 3
    st = tr.stats
    assert (st.loaded, st.load_failed, st.load_misses) == (4, 2, 1)


@pytest.mark.parametrize("mode, copy_mode", MODES)
def test_load_returns_leading_prefix_and_writes_nothing_after_a_miss(mode, copy_mode) -> None:
    cfg = gqa_config(num_blocks=10)
    kv = alloc(cfg, "hnd", seed=3)
    store = LocalCPUStore(1 << 24)
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(mode=mode, copy_mode=copy_mode))
    ref = snapshot(kv)
    assert all(tr.save(refs(tr, "full", [(h(i), i + 1) for i in range(4)])))
    store.remove([tr.key("full", h(2))])
    assert tr.lookup("full", [h(0), h(1), h(2), h(3)]) == 2
    scramble(kv, seed=4)
    after = snapshot(kv)
    assert tr.load(refs(tr, "full", [(h(i), i + 5) for i in range(4)])) == 2
    layers = ("f0", "f1")
    assert same_block(kv, ref, layers, 5, 1, "hnd") and same_block(kv, ref, layers, 6, 2, "hnd")
    # blocks 7 (missing) and 8 (present, but after the miss) are untouched
    assert same_block(kv, after, layers, 7, 7, "hnd") and same_block(kv, after, layers, 8, 8, "hnd")
    st = tr.stats
    assert (st.loaded, st.load_failed, st.load_misses, st.corrupt) == (2, 2, 1, 0)
    assert tr.load(refs(tr, "full", [(h(99), 1)])) == 0


def _store_payload(store: KVStore, key: bytes) -> bytes:
    (payload,) = store.batch_get([key])
    assert payload is not None
    return payload


@pytest.mark.parametrize("mode, copy_mode", MODES)
@pytest.mark.parametrize("damage", ["flip data", "flip trailer", "truncate", "extend",
                                    "other block's payload"])
def test_corrupt_payload_rejected_and_counted(mode, copy_mode, damage) -> None:
    cfg = mixed_config()
    kv = engine(cfg, seed=5)
    store = LocalCPUStore(1 << 24)
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(mode=mode, copy_mode=copy_mode))
    assert all(tr.save(refs(tr, "mla", [(h(1), 1), (h(2), 2), (h(3), 3)])))
    key = tr.key("mla", h(2))
    good = bytearray(_store_payload(store, key))
    if damage == "flip data":
        good[100] ^= 0x01
    elif damage == "flip trailer":
        good[-1] ^= 0x80
    elif damage == "truncate":
        good = good[:-1]
    elif damage == "extend":
        good += b"\0"
    else:
        good = bytearray(_store_payload(store, tr.key("mla", h(3))))
    store.remove([key])
    assert store.batch_put([key], [bytes(good)]) == [True]
    before = snapshot(kv)
    assert tr.load(refs(tr, "mla", [(h(1), 4), (h(2), 5), (h(3), 6)])) == 1
    assert same_block(kv, before, ("m0", "m1", "m2"), 5, 5, mla=True)  # not written
    st = tr.stats
    assert (st.loaded, st.load_failed, st.corrupt, st.load_misses) == (1, 2, 1, 0)


def test_foreign_namespace_rank_and_layout_never_read() -> None:
    cfg = gqa_config()
    kv = alloc(cfg, "kv_first", seed=6)
    store = LocalCPUStore(1 << 24)
    layout = KVLayout.register(kv, cfg)
    tr = KVTransfer(layout, store, TransferOptions(namespace="llama-3-8b@abc"))
    assert all(tr.save(refs(tr, "full", [(h(1), 1), (h(2), 2)])))
    same = KVTransfer(layout, store, TransferOptions(namespace="llama-3-8b@abc"))
    assert same.key("full", h(1)) == tr.key("full", h(1))
    others = [
        KVTransfer(layout, store, TransferOptions(namespace="llama-3-8b@def")),
        KVTransfer(layout, store, TransferOptions(namespace="llama-3-8b@abc", rank=1)),
        KVTransfer(KVLayout.register(alloc(cfg, "hnd"), cfg), store, TransferOptions(
            namespace="llama-3-8b@abc")),
    ]
    for other in others:
        assert other.key("full", h(1)) != tr.key("full", h(1))
        assert other.lookup("full", [h(1)]) == 0
        assert other.load(refs(other, "full", [(h(1), 3), (h(2), 4)])) == 0
        assert other.stats.load_misses == 2 and other.stats.corrupt == 0
    assert same.load(refs(same, "full", [(h(1), 3), (h(2), 4)])) == 2
    # same key text but another layout behind it (a misconfigured peer): the trailer says so
    forged = KVTransfer(KVLayout.register(alloc(cfg, "hnd"), cfg), store, TransferOptions(namespace="x"))
    forged._fingerprints["full"] = same._fingerprints["full"] ^ 1
    assert forged.load(refs(forged, "full", [(h(1), 3)])) == 0


def test_key_format() -> None:
    cfg = gqa_config()
    tr = KVTransfer(KVLayout.register(alloc(cfg), cfg), LocalCPUStore(1 << 20))
    key = tr.key("swa", bytes(range(16)))
    assert key == f"{bytes(range(16)).hex()}/swa/{tr.fingerprint('swa'):016x}".encode()
    assert tr.fingerprint("swa") != tr.fingerprint("full")
    assert tr.payload_bytes("swa") == cfg.groups[1].spec.page_size_bytes + TRAILER_BYTES


def test_full_store_drops_are_counted_not_raised() -> None:
    cfg = mixed_config()
    kv = engine(cfg, seed=7)
    layout = KVLayout.register(kv, cfg)
    payload = layout["mla"].block_bytes + TRAILER_BYTES
    tiny = KVTransfer(layout, LocalCPUStore(payload - 1))  # no block fits at all
    assert tiny.save(refs(tiny, "mla", [(h(1), 1), (h(2), 2)])) == [False, False]
    assert (tiny.stats.saved, tiny.stats.save_dropped, tiny.stats.saved_bytes) == (0, 2, 0)
    assert tiny.load(refs(tiny, "mla", [(h(1), 1)])) == 0
    # room for two blocks: an LRU store evicts the oldest; loads then miss them
    small = KVTransfer(layout, LocalCPUStore(2 * payload), TransferOptions(mode="staged"))
    assert small.save(refs(small, "mla", [(h(i), i) for i in range(1, 5)])) == [True] * 4
    assert small.load(refs(small, "mla", [(h(1), 5), (h(2), 6)])) == 0
    assert small.load(refs(small, "mla", [(h(3), 5), (h(4), 6)])) == 2


def test_calls_larger_than_staging_are_split() -> None:
    cfg = mixed_config(num_blocks=12)
    kv = engine(cfg, seed=8)
    layout = KVLayout.register(kv, cfg)
    store = CountingStore(1 << 24)
    slot = -(-(layout["mla"].block_bytes + TRAILER_BYTES) // 64) * 64
    tr = KVTransfer(layout, store, TransferOptions(staging_bytes=3 * slot, mode="staged"))
    ref = snapshot(kv)
    assert tr.save(refs(tr, "mla", [(h(i), i) for i in range(1, 8)])) == [True] * 7
    assert store.calls["batch_put_from"] == 3  # 3 + 3 + 1
    scramble(kv, seed=9)
    assert tr.load(refs(tr, "mla", [(h(i), 12 - i) for i in range(1, 8)])) == 7
    assert store.calls["batch_get_into"] == 3
    assert all(same_block(kv, ref, ("m0", "m1", "m2"), 12 - i, i, mla=True) for i in range(1, 8))
    # a miss in the first chunk stops before the next chunks are fetched
    store.remove([tr.key("mla", h(2))])
    assert tr.load(refs(tr, "mla", [(h(i), 12 - i) for i in range(1, 8)])) == 1
    assert store.calls["batch_get_into"] == 4


class BrokenStore(KVStore):
    """Every store call raises, as a buggy or crashed backend might."""

    zero_copy = True

    def batch_exists(self, keys: Sequence[bytes]) -> list[bool]:
        raise RuntimeError("boom")

    def batch_put(self, keys, payloads):
        raise RuntimeError("boom")

    def batch_get(self, keys, expected_sizes=None):
        raise RuntimeError("boom")

    def batch_put_from(self, keys, buffer, offsets, sizes):
        raise RuntimeError("boom")

    def batch_get_into(self, keys, buffer, offsets, sizes):
        raise ConnectionError("boom")

    def remove(self, keys):
        return 0

    def register_buffer(self, buffer):
        self.registrations = getattr(self, "registrations", 0) + 1
        if self.registrations == 1:
            raise RuntimeError("register_buffer returned -1")
        return super().register_buffer(buffer)


@pytest.mark.parametrize("mode", ["direct", "staged"])
def test_failing_store_never_raises(mode: str) -> None:
    cfg = gqa_config()
    kv = alloc(cfg, seed=10)
    store = BrokenStore()
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(mode=mode))
    before = snapshot(kv)
    assert tr.save(refs(tr, "full", [(h(1), 1), (h(2), 2)])) == [False, False]
    assert tr.load(refs(tr, "full", [(h(1), 3)])) == 0
    assert tr.lookup("full", [h(1)]) == 0
    assert all(torch.equal(before[n].view(torch.int16), kv[n].view(torch.int16)) for n in kv)
    st = tr.stats
    assert (st.save_dropped, st.load_failed, st.store_errors) == (2, 1, 3)
    # staged: the save failed registering the staging buffer; the load registered it again
    assert getattr(store, "registrations", 0) == (0 if mode == "direct" else 2)


def test_caller_errors_raise() -> None:
    cfg = gqa_config()
    tr = KVTransfer(KVLayout.register(alloc(cfg), cfg), LocalCPUStore(1 << 20))
    with pytest.raises(ValueError, match="null block"):
        tr.save(refs(tr, "full", [(h(1), 0)]))
    with pytest.raises(ValueError, match="out of range"):
        tr.load(refs(tr, "full", [(h(1), 8)]))
    with pytest.raises(ValueError, match=r"group must be an index into the config's 2 groups \['full', 'swa'\]"):
        tr.save([BlockRef(2, 1, h(1))])
    with pytest.raises(ValueError, match="non-empty bytes"):
        tr.save(refs(tr, "full", [("abc", 1)]))  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"BlockRef\(group, block_id, block_hash\)"):
        tr.load([(h(1), 1)])  # type: ignore[list-item]
    # one bad block in a call stores nothing
    with pytest.raises(ValueError, match="null block"):
        tr.save(refs(tr, "full", [(h(1), 1), (h(2), 0)]))
    assert tr.stats.saved == 0
    with pytest.raises(ValueError, match="mode"):
        KVTransfer(tr.layout, LocalCPUStore(1 << 20), TransferOptions(mode="fast"))  # type: ignore[arg-type]
    assert tr.save([]) == [] and tr.load([]) == 0
    assert tr.stats.as_dict() == {k: 0 for k in tr.stats.as_dict()}


@pytest.mark.parametrize("mode, copy_mode", MODES)
def test_kernel_paged_cache_round_trip(mode: str, copy_mode: str) -> None:
    """Logical 32-token draft blocks on 8-token kernel pages, 32-token MLA blocks on 16."""
    cfg = mixed_config(num_blocks=6, draft_block=32)
    plan = plan_kernel_blocks(cfg, {"target": [16, 64], "draft": [8, 16]},
                              group_backends={"draft": ["draft"]})
    assert plan["mla"].kernel_block_size == 16 and plan["draft"].kernel_block_size == 16
    plan["draft"] = KernelBlockMap(32, 8)  # a backend that wants smaller pages for the drafter
    kv = alloc(cfg, "kv_first", kernel={"mla": 16, "draft": 8}, seed=20)
    store = LocalCPUStore(1 << 22)
    tr = KVTransfer(KVLayout.register(kv, cfg, kernel_blocks=plan), store, TransferOptions(
        mode=mode, copy_mode=copy_mode))
    ref = snapshot(kv)
    assert all(tr.save(refs(tr, "draft", [(h(1), 1), (h(2), 4)])))
    assert all(tr.save(refs(tr, "mla", [(h(1), 2)])))
    scramble(kv, seed=21)
    assert tr.load(refs(tr, "draft", [(h(1), 5), (h(2), 3)])) == 2
    assert tr.load(refs(tr, "mla", [(h(1), 1)])) == 1
    # kernel pages 4b..4b+3 of the draft layer, 2b..2b+1 of each MLA layer
    for src, dst in [(1, 5), (4, 3)]:
        got, want = kv["eagle.0"][:, 4 * dst:4 * dst + 4], ref["eagle.0"][:, 4 * src:4 * src + 4]
        assert raw(got) == raw(want)
    assert all(raw(kv[n][2:4]) == raw(ref[n][4:6]) for n in ("m0", "m1", "m2"))
    # the same blocks paged at the logical size are another layout: they do not read these
    logical = KVTransfer(KVLayout.register(alloc(cfg, "kv_first", seed=22), cfg), store)
    assert logical.load(refs(logical, "draft", [(h(1), 1)])) == 0


def test_verify_false_keeps_size_and_trailer_checks_only() -> None:
    cfg = mixed_config()
    kv = engine(cfg, seed=23)
    store = LocalCPUStore(1 << 24)
    tr = KVTransfer(KVLayout.register(kv, cfg), store, TransferOptions(verify=False))
    assert all(tr.save(refs(tr, "mla", [(h(1), 1), (h(2), 2)])))
    good = _store_payload(store, tr.key("mla", h(1)))
    flipped = bytearray(good)
    flipped[5] ^= 1
    store.batch_put([tr.key("mla", h(7)), tr.key("mla", h(8))], [bytes(flipped), good[:-1]])
    assert tr.load(refs(tr, "mla", [(h(7), 3)])) == 1  # a flipped data bit is not seen without the checksum
    assert tr.load(refs(tr, "mla", [(h(8), 3)])) == 0  # a truncated payload still is
    assert tr.stats.corrupt == 1


def test_transfer_options_are_checked_when_built_and_kept_whole() -> None:
    """TransferOptions refuses a bad mode, staging size or rank by name when it is built; a
    transfer keeps the record it was given and takes no other kind of options; 'direct' on a
    cache off the CPU is the one check that needs the layout."""
    import dataclasses
    with pytest.raises(ValueError, match=r"^mode must be 'auto', 'direct' or 'staged', got 'fast'$"):
        TransferOptions(mode="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"staging_bytes"):
        TransferOptions(staging_bytes=0)
    with pytest.raises(ValueError, match=r"\brank\b"):
        TransferOptions(rank=-1)
    opts = TransferOptions(namespace="m@1", rank=2, verify=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.rank = 3  # type: ignore[misc]
    cfg = gqa_config()
    tr = KVTransfer(KVLayout.register(alloc(cfg), cfg), LocalCPUStore(1 << 20), opts)
    assert tr.options is opts and (tr.namespace, tr.rank, tr.verify, tr.mode) == ("m@1", 2, False, "direct")
    with pytest.raises(ValueError, match=r"^options must be a TransferOptions or None, got dict$"):
        KVTransfer(KVLayout.register(alloc(cfg), cfg), LocalCPUStore(1 << 20), {"rank": 1})  # type: ignore[arg-type]

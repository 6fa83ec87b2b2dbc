"""Layout registration by bytes: GQA, MLA, mixed MLA + EAGLE draft, kernel blocks, rejections."""

from __future__ import annotations

import pytest
import torch

from hybridkv.connectors.kernel_blocks import KernelBlockMap
from hybridkv.connectors.layout import KVLayout
from hybridkv.core.specs import KVCacheConfig, KVCacheGroup

from .kv_helpers import (
    alloc,
    block_bytes,
    engine_cache,
    gqa_config,
    gqa_spec,
    mixed_config,
    mla_config,
    mla_spec,
    raw,
    snapshot,
)


def seg_bytes(segs) -> list[bytes]:
    return [raw(s.view()) for s in segs]


# ----------------------------------------------------------------------------- registration
def test_gqa_engine_cache_two_segments_per_layer_adjacent_in_the_page() -> None:
    cfg = gqa_config()
    _, kv = engine_cache(cfg)
    layout = KVLayout.register(kv, cfg)
    full = layout["full"]
    page = cfg.groups[0].spec.page_size_bytes
    assert full.block_bytes == 2 * page
    segs = full.block_segments(5)
    assert [s.layer for s in segs] == ["f0", "f0", "f1", "f1"]
    assert [s.nbytes for s in segs] == [page // 2] * 4
    # K then V of each layer, read back through ordinary indexing
    assert seg_bytes(segs) == [raw(kv[n][p, 5]) for n in ("f0", "f1") for p in (0, 1)]
    # the engine keeps K and V of a block in one page: block stride = max page size
    assert segs[1].offset - segs[0].offset == page // 2
    assert full.block_segments(6)[0].offset - segs[0].offset == cfg.max_page_bytes
    assert full.num_runs == 2  # K+V of each layer merged (f0 and f1 are different slots)


def test_gqa_kv_first_tensor_segments_are_far_apart() -> None:
    cfg = gqa_config()
    kv = alloc(cfg, "kv_first")
    layout = KVLayout.register(kv, cfg)
    seg = cfg.groups[0].spec.page_size_bytes // 2
    segs = layout["full"].block_segments(3)
    assert [s.offset for s in segs[:2]] == [3 * seg, (cfg.num_blocks + 3) * seg]
    assert seg_bytes(segs) == [raw(kv[n][p, 3]) for n in ("f0", "f1") for p in (0, 1)]
    assert layout["full"].num_runs == 4


@pytest.mark.parametrize("kind", ["kv_first", "block_first", "hnd"])
def test_gqa_layouts_gather_logical_contents(kind: str) -> None:
    cfg = gqa_config()
    kv = alloc(cfg, kind)
    layout = KVLayout.register(kv, cfg)
    rows = layout["full"].gather([4, 1, 7])
    for i, b in enumerate([4, 1, 7]):
        expect = b"".join(block_bytes(kv[n], b, kind) for n in ("f0", "f1"))
        assert rows[i].numpy().tobytes() == expect


def test_layouts_give_different_fingerprints() -> None:
    cfg = gqa_config()
    fps = {kind: KVLayout.register(alloc(cfg, kind), cfg)["full"].fingerprint
           for kind in ("kv_first", "block_first", "hnd")}
    fps["engine"] = KVLayout.register(engine_cache(cfg)[1], cfg)["full"].fingerprint
    fps["engine, 20 blocks"] = KVLayout.register(
        engine_cache(gqa_config(num_blocks=20))[1], gqa_config(num_blocks=20))["full"].fingerprint
    # the payload is K then V, tokens x heads x dim, whatever the distance between K and V and
    # the pool size: one fingerprint; heads x tokens x dim (HND) means other bytes
    hnd = fps.pop("hnd")
    assert len(set(fps.values())) == 1 and hnd not in fps.values()
    f16 = KVCacheConfig(KVCacheGroup("full", gqa_spec(dtype="float16"), ("f0", "f1")), num_blocks=8)
    kv16 = {n: torch.zeros(2, 8, 16, 2, 8, dtype=torch.float16) for n in ("f0", "f1")}
    assert KVLayout.register(kv16, f16)["full"].fingerprint not in fps.values()


def test_mla_one_segment_per_layer() -> None:
    cfg = mla_config()
    kv = alloc(cfg)
    layout = KVLayout.register(kv, cfg)
    mla = layout["mla"]
    page = cfg.groups[0].spec.page_size_bytes
    segs = mla.block_segments(2)
    assert [(s.layer, s.nbytes) for s in segs] == [("m0", page), ("m1", page)]
    assert seg_bytes(segs) == [raw(kv["m0"][2]), raw(kv["m1"][2])]
    assert mla.block_bytes == 2 * page


def test_mixed_mla_and_eagle_draft_on_the_engine_cache() -> None:
    cfg = mixed_config()
    _, kv = engine_cache(cfg)
    layout = KVLayout.register(kv, cfg)
    mla, draft = layout["mla"], layout["draft"]
    assert draft.group.is_draft and not mla.group.is_draft
    assert mla.block_bytes == 3 * cfg.groups[0].spec.page_size_bytes
    assert draft.block_bytes == cfg.groups[1].spec.page_size_bytes
    assert [s.layer for s in draft.block_segments(4)] == ["eagle.0", "eagle.0"]
    assert seg_bytes(draft.block_segments(4)) == [raw(kv["eagle.0"][p, 4]) for p in (0, 1)]
    assert seg_bytes(mla.block_segments(3)) == [raw(kv[n][3]) for n in ("m0", "m1", "m2")]
    # the draft layer shares layer slot 0 with m0: its blocks are at the same byte offsets
    assert draft.block_segments(4)[0].offset == mla.block_segments(4)[0].offset
    assert mla.fingerprint != draft.fingerprint


@pytest.mark.parametrize("mode", ["python", "torch"])
def test_gather_scatter_round_trip_moves_only_those_blocks(mode: str) -> None:
    cfg = mixed_config()
    _, kv = engine_cache(cfg, seed=3)
    layout = KVLayout.register(kv, cfg)
    before = snapshot(kv)
    mla = layout["mla"]
    out = torch.full((3, mla.block_bytes + 100), 7, dtype=torch.uint8)  # rows with padding
    mla.gather([2, 5, 8], out, mode=mode)
    assert (out[:, mla.block_bytes:] == 7).all()
    for i, b in enumerate([2, 5, 8]):
        assert out[i, : mla.block_bytes].numpy().tobytes() == b"".join(
            raw(kv[n][b]) for n in ("m0", "m1", "m2"))
    # scatter blocks 2, 5, 8 into 9, 1, 3 (reversed rows)
    mla.scatter([3, 1, 9], out.flip(0).contiguous(), mode=mode)
    for src, dst in [(8, 3), (5, 1), (2, 9)]:
        for n in ("m0", "m1", "m2"):
            assert raw(kv[n][dst]) == raw(before[n][src])
    for b in (0, 2, 4, 5, 6, 7, 8):  # untouched
        assert all(raw(kv[n][b]) == raw(before[n][b]) for n in ("m0", "m1", "m2"))


def test_python_and_torch_copies_agree() -> None:
    cfg = gqa_config()
    kv = alloc(cfg, "hnd", seed=5)
    g = KVLayout.register(kv, cfg)["full"]
    ids = [7, 3, 3, 1]
    assert torch.equal(g.gather(ids, mode="python"), g.gather(ids, mode="torch"))


def test_kernel_blocks_map_logical_blocks_to_kernel_pages() -> None:
    cfg = mixed_config(num_blocks=6, draft_block=32)
    kv = alloc(cfg, "kv_first", kernel={"mla": 16, "draft": 8})
    assert kv["m0"].shape[0] == 12 and kv["eagle.0"].shape[1] == 24
    layout = KVLayout.register(kv, cfg, kernel_blocks={"mla": 16, "draft": KernelBlockMap(32, 8)})
    draft, mla = layout["draft"], layout["mla"]
    assert draft.kernel.ratio == 4 and mla.kernel.ratio == 2
    # logical block 2 of the draft group = kernel pages 8..11, K runs then V runs
    segs = draft.block_segments(2)
    assert len(segs) == 8
    assert seg_bytes(segs) == [raw(kv["eagle.0"][p, k]) for p in (0, 1) for k in range(8, 12)]
    assert draft.num_runs == 2  # the four K pages are adjacent, so are the V pages
    rows = mla.gather([1, 5])
    assert rows[1].numpy().tobytes() == b"".join(raw(kv[n][10:12]) for n in ("m0", "m1", "m2"))
    # registered without the kernel map, the same tensors do not fit the logical layout
    with pytest.raises(ValueError, match="kernel_blocks"):
        KVLayout.register(kv, cfg)


# ------------------------------------------------------------------------------ rejections
def _one_layer(spec, shape, dtype=torch.bfloat16, num_blocks=8):
    cfg = KVCacheConfig(KVCacheGroup("g", spec, ("attn.7",)), num_blocks=num_blocks)
    return cfg, {"attn.7": torch.zeros(shape, dtype=dtype)}


@pytest.mark.parametrize("what, spec, shape, dtype, expected, actual", [
    ("dtype float32", gqa_spec(), (2, 8, 16, 2, 8), torch.float32, 8192, 16384),
    ("block size 32", gqa_spec(), (2, 8, 32, 2, 8), torch.bfloat16, 8192, 16384),
    ("7 blocks", gqa_spec(), (2, 7, 16, 2, 8), torch.bfloat16, 8192, 7168),
    ("head dim 16", gqa_spec(), (2, 8, 16, 2, 16), torch.bfloat16, 8192, 16384),
    ("3 kv heads", gqa_spec(), (2, 8, 16, 3, 8), torch.bfloat16, 8192, 12288),
    ("mla latent 16", mla_spec(), (8, 32, 16), torch.bfloat16, 12288, 8192),
    ("mla float32", mla_spec(), (8, 32, 24), torch.float32, 12288, 24576),
])
def test_wrong_size_rejected_naming_layer_and_bytes(what, spec, shape, dtype, expected,
                                                    actual) -> None:
    cfg, kv = _one_layer(spec, shape, dtype)
    with pytest.raises(ValueError) as err:
        KVLayout.register(kv, cfg)
    msg = str(err.value)
    assert "'attn.7'" in msg, what
    assert f"expected {expected} bytes" in msg and f"got {actual} bytes" in msg, msg


def test_same_size_wrong_dtype_rejected() -> None:
    cfg, kv = _one_layer(gqa_spec(), (2, 8, 16, 2, 8), torch.float16)
    with pytest.raises(ValueError,
                       match=r"'attn.7'.*expected dtype torch.bfloat16.*got torch.float16"):
        KVLayout.register(kv, cfg)


def test_same_bytes_wrong_layout_rejected() -> None:
    # 16 tokens x 2 heads split as 32 tokens x 1 head per page: same bytes, but one block of the
    # spec is not a run of this tensor (blocks of 32 tokens, 4 of them)
    cfg, kv = _one_layer(gqa_spec(), (2, 4, 32, 2, 8))
    with pytest.raises(ValueError, match=r"'attn.7'.*no such layout"):
        KVLayout.register(kv, cfg)
    # K/V interleaved per token: a block is still one contiguous page -> accepted
    cfg, kv = _one_layer(gqa_spec(), (8, 16, 2, 2, 8))
    assert KVLayout.register(kv, cfg)["g"].num_runs == 1


def test_ambiguous_two_block_cache_and_overlap_rejected() -> None:
    cfg, kv = _one_layer(gqa_spec(), (2, 2, 16, 2, 8), num_blocks=2)
    with pytest.raises(ValueError, match="cannot be told apart"):
        KVLayout.register(kv, cfg)
    cfg, _ = _one_layer(mla_spec(), (8, 32, 24))
    over = torch.zeros(1, 32, 24, dtype=torch.bfloat16).expand(8, 32, 24)
    with pytest.raises(ValueError, match="overlaps"):
        KVLayout.register({"attn.7": over}, cfg)


def test_missing_unknown_layers_and_bad_maps_rejected() -> None:
    cfg = gqa_config()
    kv = alloc(cfg)
    with pytest.raises(ValueError, match=r"missing \['s0'\]"):
        KVLayout.register({n: t for n, t in kv.items() if n != "s0"}, cfg)
    with pytest.raises(ValueError, match=r"not in any group \['extra'\]"):
        KVLayout.register({**kv, "extra": kv["s0"]}, cfg)
    with pytest.raises(ValueError, match="unknown groups"):
        KVLayout.register(kv, cfg, kernel_blocks={"nope": 8})
    with pytest.raises(ValueError, match="logical block size 32"):
        KVLayout.register(kv, cfg, kernel_blocks={"full": KernelBlockMap(32, 8)})


def test_block_ids_checked() -> None:
    cfg = mla_config()
    g = KVLayout.register(alloc(cfg), cfg)["mla"]
    with pytest.raises(ValueError, match=r"block id 8 out of range.*0 <= id < 8"):
        g.block_segments(8)
    with pytest.raises(ValueError, match="out of range"):
        g.gather([1, -1])
    with pytest.raises(ValueError, match="rows must be"):
        g.gather([1], out=torch.zeros((1, 10), dtype=torch.uint8))

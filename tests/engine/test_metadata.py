"""Step metadata: slot mapping, window reads, and loud failures on bad block tables."""

from __future__ import annotations

import pytest

from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup, SlidingWindow
from hybridkv.engine import SequenceInput, build_step_metadata

FULL = FullAttention(block_size=4, num_kv_heads=1, head_dim=8, dtype="float32")
SWA = SlidingWindow(block_size=2, num_kv_heads=1, head_dim=8, dtype="float32", window=3)
CONFIG = KVCacheConfig((KVCacheGroup("full", FULL, ("a",)), KVCacheGroup("swa", SWA, ("b",))), num_blocks=20)


def test_slot_mapping_and_reads() -> None:
    # 3 cached tokens + 3 new at positions 3, 4, 5.
    seq = SequenceInput([1, 2, 3], start=3, block_tables={"full": [5, 9], "swa": [6, 7, 8]})
    meta = build_step_metadata([seq], CONFIG)
    full, swa = meta.groups
    assert meta.positions.tolist() == [3, 4, 5]
    assert full.slot_mapping.tolist() == [5 * 4 + 3, 9 * 4 + 0, 9 * 4 + 1]
    assert swa.slot_mapping.tolist() == [7 * 2 + 1, 8 * 2 + 0, 8 * 2 + 1]
    # full reads positions 0..5; sliding (W = 3) reads from 3 - 3 + 1 = 1.
    assert full.sequences[0].key_blocks.tolist() == [5, 5, 5, 5, 9, 9]
    assert swa.sequences[0].key_blocks.tolist() == [6, 7, 7, 8, 8]
    assert swa.sequences[0].key_offsets.tolist() == [1, 0, 1, 0, 1]


def test_sliding_read_of_null_block_fails() -> None:
    seq = SequenceInput([1, 2, 3], start=3, block_tables={"full": [5, 9], "swa": [0, 7, 8]})
    with pytest.raises(ValueError, match=r"group 'swa': read position 1 maps to block 0"):
        build_step_metadata([seq], CONFIG)


def test_sliding_window_reads_and_mask() -> None:
    seq = SequenceInput([1, 2], start=4, block_tables={"full": [5, 9], "swa": [0, 7, 8]})
    swa = build_step_metadata([seq], CONFIG).groups[1]
    s = swa.sequences[0]
    # query 4 reads [2, 4], query 5 reads [3, 5]; keys gathered are positions 2..5.
    assert s.key_blocks.tolist() == [7, 7, 8, 8] and s.key_offsets.tolist() == [0, 1, 0, 1]
    assert s.mask.tolist() == [[True, True, True, False], [False, True, True, True]]


def test_never_writes_null_block() -> None:
    seq = SequenceInput([1], start=0, block_tables=[[0], [3]])
    with pytest.raises(ValueError, match=r"group 'full': written position 0 maps to block 0"):
        build_step_metadata([seq], CONFIG)


def test_short_table_and_out_of_range_block() -> None:
    with pytest.raises(ValueError, match="needs entry 1"):
        build_step_metadata([SequenceInput([1] * 5, 0, [[3], [4, 5, 6]])], CONFIG)
    with pytest.raises(ValueError, match=r"block 20 .* \[1, 20\)"):
        build_step_metadata([SequenceInput([1], 0, [[20], [4]])], CONFIG)


def test_two_sequences_writing_one_slot_fail() -> None:
    seqs = [SequenceInput([1], 0, [[3], [4]]), SequenceInput([2], 0, [[3], [5]])]
    with pytest.raises(ValueError, match="same slot"):
        build_step_metadata(seqs, CONFIG)


def test_table_count_must_match_groups() -> None:
    with pytest.raises(ValueError, match="1 block tables for 2"):
        build_step_metadata([SequenceInput([1], 0, [[3]])], CONFIG)
    with pytest.raises(ValueError, match="no block table for group 'swa'"):
        build_step_metadata([SequenceInput([1], 0, {"full": [3]})], CONFIG)


def test_chunked_local_reads_and_mask_come_from_its_rule() -> None:
    """Chunked-local attention (chunk 4): a query reads only its own chunk, so the first new
    query at 6 reads from 4, and query 8 starts a new chunk."""
    from hybridkv.core.specs import ChunkedLocal
    chunked = ChunkedLocal(block_size=2, num_kv_heads=1, head_dim=8, dtype="float32", chunk_size=4)
    cfg = KVCacheConfig((KVCacheGroup("c", chunked, ("a",)),), num_blocks=20)
    meta = build_step_metadata([SequenceInput([1, 2, 3], start=6, block_tables=[[0, 0, 7, 8, 9]])], cfg)
    g = meta.groups[0]
    assert g.chunk == 4 and g.window is None
    s = g.sequences[0]
    assert s.key_blocks.tolist() == [7, 7, 8, 8, 9]        # positions 4..8; blocks 0-1 never read
    assert s.mask.tolist() == [[True, True, True, False, False],
                               [True, True, True, True, False],
                               [False, False, False, False, True]]

"""Specs, groups and the config (``hybridkv.core.specs``), and the shared validators.

Bad input is behaviour: every constructor must refuse a bad value with a ``ValueError`` that
names the field, the bad value and what would be valid, and must accept the values at the edge
of the valid range. The regexes match those key parts (field names as whole, case-sensitive
words; values; the valid range), not the rest of the wording. Expected numbers are derived by
hand in the docstrings from the classes' docstrings: page and dtype sizes, the hash block size
and alignment a config derives, ``StateSpec`` bytes (Qwen3-Next's and Nemotron-H's recurrent
layers by hand), state extents in whole pages and the pool a state group needs.
"""

from __future__ import annotations

import pytest

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager,
                      MultiModalItem, Request, SlidingWindow, SpecDecode, StateSpec)
from hybridkv.core import BlockHasher
from hybridkv.core.specs import DTYPE_BYTES, STATE_DTYPES, dtype_bytes
from hybridkv.core.validation import check_int
from tests.support.helpers import FA, NEMOTRON_H, QWEN3_NEXT, raises, state_hybrid
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def group(name: str, spec, layers=None) -> KVCacheGroup:
    return KVCacheGroup(name, spec, layers if layers is not None else (f"{name}.l0",))


def fa(bs: int = 4) -> FullAttention:
    return FullAttention(block_size=bs, num_kv_heads=1, head_dim=8)


BAD_SPECS = [  # (build, key parts of the message)
    (lambda: FullAttention(block_size=0), r"\bFullAttention\.block_size\b.*positive integer.*got 0$"),
    (lambda: FullAttention(block_size=True), r"\bFullAttention\.block_size\b.*got True$"),
    (lambda: FullAttention(block_size=2.5), r"\bFullAttention\.block_size\b.*got 2\.5$"),
    (lambda: SlidingWindow(block_size=4, num_kv_heads=0),
     r"\bSlidingWindow\.num_kv_heads\b.*positive integer.*got 0$"),
    (lambda: MLA(block_size=4, head_dim=-3), r"\bMLA\.head_dim\b.*positive integer.*got -3$"),
    (lambda: FullAttention(block_size=4, dtype="fp16"),
     r"unknown dtype 'fp16'; valid dtypes: bfloat16, float16, float32, float8_e4m3fn, "
     r"float8_e5m2, fp4, fp8, int8, uint8$"),
    (lambda: SlidingWindow(block_size=4, window=0), r"\bSlidingWindow\.window\b.*positive integer.*got 0$"),
    (lambda: ChunkedLocal(block_size=4, chunk_size=0),
     r"\bChunkedLocal\.chunk_size\b.*positive integer.*got 0$"),
    (lambda: ChunkedLocal(block_size=16, chunk_size=24),
     r"\bChunkedLocal\.chunk_size\b \(24\) must be a multiple of \bblock_size\b \(16\)"),
    (lambda: MLA(block_size=4, kv_lora_rank=0), r"\bMLA\.kv_lora_rank\b.*positive integer.*got 0$"),
    (lambda: MLA(block_size=4, qk_rope_head_dim=-1),
     r"\bMLA\.qk_rope_head_dim\b must be a non-negative integer, got -1$"),
    (lambda: MLA(block_size=4, qk_rope_head_dim=True), r"\bMLA\.qk_rope_head_dim\b.*got True$"),
    (lambda: MLA(block_size=4, compress_ratio=0), r"\bMLA\.compress_ratio\b.*positive integer.*got 0$"),
    (lambda: MLA(block_size=6, compress_ratio=4),
     r"\bMLA\.block_size\b \(6\) must be a multiple of \bcompress_ratio\b \(4\)"),
    (lambda: StateSpec(block_size=4, conv_shape=(3, 0)),
     r"\bStateSpec\.conv_shape\b must be a non-empty tuple of positive integers, got \(3, 0\)$"),
    (lambda: StateSpec(block_size=4, conv_shape=()), r"\bStateSpec\.conv_shape\b.*got \(\)$"),
    (lambda: StateSpec(block_size=4, conv_shape=(True, 4)), r"\bStateSpec\.conv_shape\b.*got \(True, 4\)$"),
    (lambda: StateSpec(block_size=4, conv_shape=True), r"\bStateSpec\.conv_shape\b.*got True$"),
    (lambda: StateSpec(block_size=4, state_shape=(4, -8)),
     r"\bStateSpec\.state_shape\b must be a non-empty tuple of positive integers, got \(4, -8\)$"),
    (lambda: StateSpec(block_size=4, conv_dtype="fp8"),
     r"\bStateSpec\.conv_dtype\b 'fp8' is not supported.*valid dtypes: bfloat16, float16, float32$"),
    (lambda: StateSpec(block_size=4, state_dtype="int8"),
     r"\bStateSpec\.state_dtype\b 'int8' is not supported.*valid dtypes: bfloat16, float16, float32$"),
]


@pytest.mark.parametrize("build,match", BAD_SPECS)
def test_bad_spec_is_refused_naming_the_field_and_the_value(build, match) -> None:
    """_check_positive_int; dtype_bytes; AttentionSpec/SlidingWindow/ ChunkedLocal/MLA/StateSpec
    ``__post_init__``: the owner and field in the message (class name read from the wrong
    object, field name lost or changed), each bound (0 and True accepted, ``<`` for ``<=``),
    ``and``/``or`` swaps that let a bad value through; _check_shape's checks."""
    with raises(match):
        build()


def test_specs_at_the_edge_of_the_valid_range_are_accepted() -> None:
    """_check_positive_int (every int refused; 1 refused); AttentionSpec (a field read as None);
    ChunkedLocal / MLA (``/`` for ``%``: every valid multiple refused); MLA (qk_rope_head_dim 0
    refused); _check_shape (an int shape not wrapped, a valid shape refused, a dimension of 1
    refused); StateSpec's normalised shapes and dtype checks (each ``object.__setattr__`` /
    ``getattr`` of them).

    A value of exactly 1 is a positive integer; qk_rope_head_dim may be 0; a shape may be a
    bare int or a list (stored as a tuple)."""
    s = FullAttention(block_size=1, num_kv_heads=1, head_dim=1)
    assert (s.block_size, s.num_kv_heads, s.head_dim) == (1, 1, 1)
    assert SlidingWindow(block_size=1, window=1).window_tokens == 1
    assert ChunkedLocal(block_size=4, chunk_size=8).chunk_size == 8
    m = MLA(block_size=4, kv_lora_rank=1, qk_rope_head_dim=0, compress_ratio=2)
    assert m.latent_dim == 1 and m.compress_ratio == 2
    st = StateSpec(block_size=4, conv_shape=5, state_shape=[1, 2], conv_dtype="float16",
                   state_dtype="bfloat16")
    assert st.conv_shape == (5,) and st.state_shape == (1, 2)
    assert type(st.conv_shape) is tuple and type(st.state_shape) is tuple
    assert st.conv_bytes == 5 * 2 and st.state_bytes == 2 * 2
    for dt in STATE_DTYPES:
        assert StateSpec(block_size=4, conv_dtype=dt, state_dtype=dt).conv_dtype == dt


def test_dtype_bytes_of_every_dtype() -> None:
    """dtype_bytes: each documented dtype's element size (fp4 is half a byte)."""
    expected = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
                "fp8": 1, "int8": 1, "uint8": 1, "fp4": 0.5}
    assert set(DTYPE_BYTES) == set(expected)
    for dt, b in expected.items():
        assert dtype_bytes(dt) == b
        assert FullAttention(block_size=1, num_kv_heads=1, head_dim=2, dtype=dt).bytes_per_token \
            == int(2 * 2 * b)


BAD_GROUPS = [
    (lambda: KVCacheGroup("", fa(), ("l",)), r"\bKVCacheGroup\.name\b must be a non-empty string, got ''$"),
    (lambda: KVCacheGroup(5, fa(), ("l",)), r"\bKVCacheGroup\.name\b.*got 5$"),
    (lambda: KVCacheGroup("g", "full", ("l",)),
     r"KVCacheGroup 'g': spec must be an AttentionSpec \(FullAttention, SlidingWindow, "
     r"ChunkedLocal, MLA, SparseMLA, CompressorState or StateSpec\), got str$"),
    (lambda: KVCacheGroup("g", fa(), []), r"KVCacheGroup 'g' has no layers"),
    (lambda: KVCacheGroup("g", fa(), ("a", "b", "a", "c")),
     r"KVCacheGroup 'g' lists layers more than once: \['a'\]$"),
]


@pytest.mark.parametrize("build,match", BAD_GROUPS)
def test_bad_group_is_refused_naming_it(build, match) -> None:
    """KVCacheGroup.__post_init__: a bad name or spec let through or not named; the duplicated
    layers listed wrongly (every layer, none, or a TypeError)."""
    with raises(match):
        build()


def test_group_layer_names_become_a_tuple() -> None:
    """KVCacheGroup.__post_init__: a valid group refused; a single layer name (a str) not
    wrapped, or a list not turned into a tuple."""
    assert KVCacheGroup("g", fa(), "attn").layer_names == ("attn",)
    g = KVCacheGroup("g", fa(), ["a", "b"])
    assert g.layer_names == ("a", "b") and type(g.layer_names) is tuple
    assert g.is_draft is False


BAD_CONFIGS = [
    (lambda: KVCacheConfig((), num_blocks=4),
     r"^\bKVCacheConfig\.groups\b is empty; give at least one \bKVCacheGroup\b$"),
    (lambda: KVCacheConfig((group("a", fa()), "b"), num_blocks=4),
     r"\bKVCacheConfig\.groups\b must hold \bKVCacheGroup\b, got str$"),
    (lambda: KVCacheConfig((group("a", fa()), group("b", fa()), group("a", fa(), ("x",))), num_blocks=4),
     r"duplicate KV-cache group names: \['a'\]$"),
    (lambda: KVCacheConfig((group("a", fa(), ("l",)), group("b", fa(), ("m", "l"))), num_blocks=4),
     r"layer 'l' is in groups 'a' and 'b'; \beach layer belongs to exactly one group\b"),
    (lambda: KVCacheConfig((group("a", fa()),)),
     r"\bgive exactly one of \bKVCacheConfig\.num_blocks\b or \bmemory_bytes\b, "
     r"got num_blocks=None, memory_bytes=None$"),
    (lambda: KVCacheConfig((group("a", fa()),), num_blocks=4, memory_bytes=4096),
     r"\bKVCacheConfig\.num_blocks\b or \bmemory_bytes\b, got num_blocks=4, memory_bytes=4096$"),
    (lambda: KVCacheConfig((group("a", fa()),), memory_bytes=0),
     r"\bKVCacheConfig\.memory_bytes\b must be a positive integer, got 0$"),
    (lambda: KVCacheConfig((group("a", fa()),), num_blocks=1),
     r"\bKVCacheConfig\b needs at least 2 blocks \(block 0 is the null block\), got num_blocks=1$"),
    (lambda: KVCacheConfig((group("a", fa()),), num_blocks=2.5), r"at least 2 blocks.*got num_blocks=2\.5$"),
    (lambda: KVCacheConfig((group("a", fa()),), num_blocks=True), r"at least 2 blocks.*got num_blocks=True$"),
    # fa(): 4 tokens * 2 (K, V) * 1 head * 8 dims * 2 bytes = 128 bytes per block
    (lambda: KVCacheConfig((group("a", fa()),), memory_bytes=255),
     r"at least 2 blocks.*got num_blocks=1 from memory_bytes=255 at 128 bytes per block$"),
]


@pytest.mark.parametrize("build,match", BAD_CONFIGS)
def test_bad_config_is_refused_naming_the_problem(build, match) -> None:
    """KVCacheConfig.__post_init__: each check (empty, not a group, duplicate names, a layer in
    two groups, both or neither size, a non-positive memory budget, fewer than 2 blocks or not
    an int) and what its message names (the duplicates, both groups of the layer, the sizes
    given, the budget the block count came from — only when it came from one)."""
    with raises(match):
        build()


def test_config_normalises_its_groups_and_derives_its_sizes() -> None:
    """KVCacheConfig.__post_init__: a single group or a list of groups stored as a tuple; hash
    block size = GCD and alignment = LCM of the block sizes (ints, over three groups so a broken
    reduce shows); a budget divided into whole blocks; num_blocks 2 accepted.

    Block sizes 4, 6, 16: GCD 2, LCM 48. memory_bytes = 5 * 128 + 127 with 128-byte blocks
    gives 5 blocks."""
    g = group("a", fa())
    one = KVCacheConfig(g, num_blocks=2)
    assert one.groups == (g,) and one.num_blocks == 2
    specs = [fa(4), FullAttention(block_size=6, num_kv_heads=1, head_dim=8), fa(16)]
    cfg = KVCacheConfig([group(f"g{i}", s) for i, s in enumerate(specs)], num_blocks=8)
    assert type(cfg.groups) is tuple and [x.name for x in cfg.groups] == ["g0", "g1", "g2"]
    assert cfg.hash_block_size == 2 and type(cfg.hash_block_size) is int
    assert cfg.alignment == 48 and type(cfg.alignment) is int
    assert cfg.group_index("g1") == 1 and cfg.group_index("g2") == 2
    by_budget = KVCacheConfig((g,), memory_bytes=5 * 128 + 127)
    assert by_budget.num_blocks == 5 and type(by_budget.num_blocks) is int
    assert by_budget.memory_bytes == 5 * 128 + 127


def test_unknown_group_name_lists_the_groups() -> None:
    """KVCacheConfig.group_index — the KeyError's message."""
    cfg = KVCacheConfig((group("g0", fa()), group("g1", fa())), num_blocks=4)
    with pytest.raises(KeyError, match=r"no KV-cache group named 'x'; groups: \['g0', 'g1'\]"):
        cfg.group_index("x")


def _state_config(num_blocks: int, second_state: bool = False) -> KVCacheConfig:
    """fa(): 128-byte pages. State "s": conv (2, 8) bf16 = 32 B + state (4, 8) fp32 = 128 B =
    160 B per layer, so an extent of ceil(160 / 128) = 2 blocks. Optional state "t" after it:
    (1, 8) bf16 + (1, 8) fp32 = 48 B, one block."""
    groups = [group("a", fa()),
              group("s", StateSpec(block_size=4, conv_shape=(2, 8), state_shape=(4, 8)))]
    if second_state:
        groups.append(group("t", StateSpec(block_size=4, conv_shape=(1, 8), state_shape=(1, 8))))
    return KVCacheConfig(tuple(groups), num_blocks=num_blocks)


def test_state_extents_round_up_to_whole_pages() -> None:
    """KVCacheConfig.extent_blocks: 160 B over 128-byte pages is 2 blocks; an attention group's
    extent is 1 block."""
    cfg = _state_config(8, second_state=True)
    assert [cfg.extent_blocks(i) for i in range(3)] == [1, 2, 1]
    assert all(type(cfg.extent_blocks(i)) is int for i in range(3))


def test_state_fit_needs_a_live_state_and_a_checkpoint_per_state_group() -> None:
    """KVCacheConfig.check_state_fits: one request needs 1 block of the attention group plus 2
    extents (live + checkpoint) of each state group: 1 + 2 * 2 = 5 blocks, so 6 blocks (with the
    null block) fit and 5 do not; the message names the group with the largest extent, its
    sizes, the need, the usable blocks and the smallest valid num_blocks and memory_bytes (6 *
    128 = 768). With the second state group: 1 + 4 + 2 = 7 blocks."""
    _state_config(6).check_state_fits()
    with raises(r"state group 's' stores 160 B of state per layer, 2 blocks of 128 B page each; "
                r"one request needs 5 blocks but the pool has 4 usable blocks; give "
                r"num_blocks >= 6 \(memory_bytes >= 768\)$"):
        _state_config(5).check_state_fits()
    _state_config(8, second_state=True).check_state_fits()
    with raises(r"state group 's' .* needs 7 blocks but the pool has 6 usable blocks; give "
                r"num_blocks >= 8 \(memory_bytes >= 1024\)$"):
        _state_config(7, second_state=True).check_state_fits()
    KVCacheConfig((group("a", fa()),), num_blocks=2).check_state_fits()


def test_check_int_by_hand() -> None:
    """validation: check_int — ``optional`` defaulting to True, ``or`` / ``and`` slips (a
    negative int or a float accepted), and the message with and without "None or "."""
    check_int("n", 0, 0)
    check_int("n", None, 0, optional=True)
    check_int("n", 5, 1, optional=True)
    with pytest.raises(ValueError, match=r"^n must be an integer >= 0, got None$"):
        check_int("n", None, 0)                       # not optional by default
    for value, low, optional, message in [
        (None, 0, False, "n must be an integer >= 0, got None"),
        (-1, 0, False, "n must be an integer >= 0, got -1"),
        (5.0, 0, False, "n must be an integer >= 0, got 5.0"),
        (True, 0, False, "n must be an integer >= 0, got True"),
        (-1, 0, True, "n must be None or an integer >= 0, got -1"),
    ]:
        with pytest.raises(ValueError) as exc:
            check_int("n", value, low, optional=optional)
        assert str(exc.value) == message


def test_state_bytes_match_the_hand_computed_sizes() -> None:
    # conv 3 x 8192 bf16 = 49,152 B + state 32 x 128 x 128 fp32 = 2,097,152 B
    assert QWEN3_NEXT.page_size_bytes == 2_146_304
    # conv 3 x 10240 bf16 = 61,440 B + state 128 x 64 x 128 fp32 = 4,194,304 B
    assert NEMOTRON_H.page_size_bytes == 4_255_744
    assert QWEN3_NEXT.bytes_per_token == 0
    cfg = state_hybrid(QWEN3_NEXT)
    # attention page: 16 tokens x 2 heads x 256 x 2 (K, V) x 2 B = 32,768 B -> 66 pages
    assert cfg.max_page_bytes == 32_768
    assert cfg.extent_blocks(1) == 66 and cfg.extent_blocks(0) == 1
    # vLLM-compat-like layout: a 1056-token attention page holds one state (k = 1)
    assert state_hybrid(StateSpec(1056, conv_shape=QWEN3_NEXT.conv_shape, state_shape=QWEN3_NEXT.state_shape),
                  attn_bs=1056).extent_blocks(1) == 1


@pytest.mark.parametrize("field", ["state_dtype", "conv_dtype"])
@pytest.mark.parametrize("dtype", ["fp8", "float8_e4m3fn", "int8", "fp4", "nonsense"])
def test_unsupported_state_dtype_is_a_clear_error(field, dtype) -> None:
    with pytest.raises(ValueError, match=rf"StateSpec.{field} '{dtype}' is not supported for a "
                                         r"recurrent state; valid dtypes: bfloat16, float16, float32"):
        StateSpec(16, **{field: dtype})


@pytest.mark.parametrize("shape", [(), (0, 3), (2, -1), "ab", None])
def test_bad_state_shape_is_a_clear_error(shape) -> None:
    with pytest.raises(ValueError, match="state_shape must be a non-empty tuple of positive integers"):
        StateSpec(16, state_shape=shape)


def test_state_larger_than_the_pool_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"state group 'gdn' stores 2146304 B of state per layer, "
                                         r"66 blocks of 32768 B page each; one request needs 133 "
                                         r"blocks but the pool has 99 usable blocks; give "
                                         r"num_blocks >= 134"):
        KVCacheManager(state_hybrid(QWEN3_NEXT, num_blocks=100))
    KVCacheManager(state_hybrid(QWEN3_NEXT, num_blocks=134))       # the minimum it names works


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
    (lambda: KVCacheManager(KVCacheConfig((KVCacheGroup("a", FA(4), ("l",)),), num_blocks=10), CacheOptions(
        max_model_len=100)),
     "9 usable blocks but one request of max_model_len=100 tokens needs 25"),
    (lambda: SpecDecode("medusa", 2), "unknown speculative method 'medusa'"),
    (lambda: SpecDecode("eagle", 0), "num_speculative_tokens must be an integer >= 1, got 0"),
    (lambda: SpecDecode("dflash", 4, drafter_window=4), "drafter_window 4 is too small for k=4.*>= 5"),
    (lambda: BlockHasher(16, "md5"), "unknown hash algorithm 'md5'"),
    (lambda: Request("r", []), "empty prompt"),
    (lambda: Request("r", [2**70]), "token ids must be integers"),
    (lambda: Request("r", [1, 2], RequestCacheParams(mm_items=[MultiModalItem("x", 1, 5)])), "must have length > 0 and lie inside"),
])
def test_validation_errors(build, match):
    with pytest.raises(ValueError, match=match):
        build()


def test_deepseek_v4_cache_kinds_store_their_bytes_and_inherit_their_rules() -> None:
    """SparseMLA, CompressorState — bytes by hand, rules inherited (docs/extending.md: a spec
    that only stores differently needs no rule).

    SparseMLA(256, latent 448 + 64 at fp8, ratio 4, indexer 128 fp8): 512 + 128 = 640 B per
    compressed position, 160 B per token, 64 positions x 640 = 40,960 B per page.
    CompressorState(4, window 8, 2 x 512 fp32): 4,096 B per token, 16,384 B per page."""
    from hybridkv.core.rules import MLARule, SlidingRule, rule_class
    from hybridkv.core.specs import CompressorState, SparseMLA
    csa = SparseMLA(256, kv_lora_rank=448, qk_rope_head_dim=64, compress_ratio=4, dtype="fp8")
    assert (csa.index_bytes, csa.bytes_per_token, csa.page_size_bytes) == (128, 160, 40960)
    assert rule_class(csa) is MLARule and csa.kv_parts == 1 and csa.storage == "latent"
    st = CompressorState(4, num_kv_heads=2, head_dim=512, dtype="float32", window=8)
    assert (st.bytes_per_token, st.page_size_bytes, st.window_tokens) == (4096, 16384, 8)
    assert rule_class(st) is SlidingRule
    with pytest.raises(ValueError, match=r"SparseMLA\.index_head_dim must be a positive integer, got 0"):
        SparseMLA(256, compress_ratio=4, index_head_dim=0)
    with pytest.raises(ValueError, match=r"CompressorState\.window \(4\) must hold at least one group "
                                         r"of compress_ratio \(8\) tokens"):
        CompressorState(4, window=4, compress_ratio=8)

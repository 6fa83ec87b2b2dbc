"""Logical vs kernel block sizes: choice, id mapping, start-up validation."""

from __future__ import annotations

import itertools
import random

import pytest

from hybridkv.connectors.kernel_blocks import (
    KernelBlockMap,
    choose_kernel_block_size,
    plan_kernel_blocks,
)
from hybridkv.core.specs import KVCacheConfig, KVCacheGroup

from .kv_helpers import gqa_spec, mla_spec

BACKENDS = {"target": [16, 32, 64], "draft": [16, 32]}


@pytest.mark.parametrize("logical, kernel", [(64, 32), (32, 32), (48, 16), (16, 16), (256, 32),
                                             (96, 32)])
def test_largest_common_size_that_divides(logical: int, kernel: int) -> None:
    assert choose_kernel_block_size(logical, BACKENDS) == kernel


def test_single_backend_takes_its_largest_divisor() -> None:
    assert choose_kernel_block_size(128, {"flash": [16, 32, 64, 128]}) == 128
    assert choose_kernel_block_size(192, {"flash": [16, 32, 64, 128]}) == 64


def test_no_common_size_raises_naming_every_size() -> None:
    with pytest.raises(ValueError) as err:
        choose_kernel_block_size(24, BACKENDS, group="swa")
    msg = str(err.value)
    assert "24" in msg and "'swa'" in msg
    assert "target supports [16, 32, 64]" in msg and "draft supports [16, 32]" in msg
    # backends with no size in common at all
    with pytest.raises(ValueError, match="common sizes: none"):
        choose_kernel_block_size(64, {"a": [16], "b": [32]})


@pytest.mark.parametrize("sizes", [{}, {"a": []}, {"a": [0]}, {"a": [-16]}, {"a": [16.0]},
                                   {"a": [True]}])
def test_invalid_backend_sizes_raise(sizes: dict) -> None:
    with pytest.raises(ValueError):
        choose_kernel_block_size(64, sizes)


@pytest.mark.parametrize("logical", [0, -32, 1.5, True])
def test_invalid_logical_size_raises(logical: object) -> None:
    with pytest.raises(ValueError, match="logical block size must be an integer >= 1"):
        choose_kernel_block_size(logical, BACKENDS)  # type: ignore[arg-type]


def test_choice_matches_brute_force() -> None:
    rng = random.Random(7)
    pool = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 128]
    for _ in range(300):
        backends = {f"b{i}": rng.sample(pool, rng.randint(1, 5)) for i in range(rng.randint(1, 3))}
        logical = rng.choice([8, 16, 24, 32, 48, 64, 96, 128, 160, 256])
        ok = [k for k in range(1, logical + 1)
              if logical % k == 0 and all(k in s for s in backends.values())]
        if ok:
            assert choose_kernel_block_size(logical, backends) == max(ok)
        else:
            with pytest.raises(ValueError):
                choose_kernel_block_size(logical, backends)


def test_logical_to_kernel_ids() -> None:
    m = KernelBlockMap(64, 16)
    assert m.ratio == 4
    assert list(m.kernel_range(3)) == [12, 13, 14, 15]
    assert m.kernel_ids([0, 3, 1]) == [0, 1, 2, 3, 12, 13, 14, 15, 4, 5, 6, 7]
    assert [m.logical_id(k) for k in (0, 3, 4, 15, 16)] == [0, 0, 1, 3, 4]
    assert m.num_kernel_blocks(10) == 40
    assert m.kernel_block_table([[5, 2], [1]]) == [[20, 21, 22, 23, 8, 9, 10, 11], [4, 5, 6, 7]]
    ident = KernelBlockMap.identity(32)
    assert ident.ratio == 1 and ident.kernel_ids([4, 2]) == [4, 2]


def test_kernel_ids_are_a_bijection() -> None:
    for logical, kernel in itertools.product([16, 32, 64], [1, 4, 8, 16]):
        m = KernelBlockMap(logical, kernel)
        ids = m.kernel_ids(range(5))
        assert ids == list(range(5 * m.ratio))
        assert all(m.logical_id(k) == b for b in range(5) for k in m.kernel_range(b))


def test_kernel_size_must_divide_logical() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        KernelBlockMap(48, 32)
    with pytest.raises(ValueError, match="KernelBlockMap.logical_block_size must be an integer >= 1, got 0"):
        KernelBlockMap(0, 16)


def _config() -> KVCacheConfig:
    return KVCacheConfig((
        KVCacheGroup("mla", mla_spec(block_size=64), ("m0",)),
        KVCacheGroup("draft", gqa_spec(block_size=32), ("d0",), is_draft=True),
    ), num_blocks=4)


def test_plan_every_backend_constrains_every_group_by_default() -> None:
    plan = plan_kernel_blocks(_config(), BACKENDS)
    assert plan["mla"] == KernelBlockMap(64, 32)
    assert plan["draft"] == KernelBlockMap(32, 32)


def test_plan_with_backends_per_group() -> None:
    plan = plan_kernel_blocks(_config(), BACKENDS, group_backends={"mla": ["target"]})
    assert plan["mla"].kernel_block_size == 64
    assert plan["draft"].kernel_block_size == 32  # not listed: every backend
    with pytest.raises(ValueError, match="unknown group 'nope'"):
        plan_kernel_blocks(_config(), BACKENDS, group_backends={"nope": ["target"]})
    with pytest.raises(ValueError, match="known backends"):
        plan_kernel_blocks(_config(), BACKENDS, group_backends={"mla": ["cutlass"]})


def test_plan_fails_at_startup_naming_the_group() -> None:
    cfg = KVCacheConfig(KVCacheGroup("odd", gqa_spec(block_size=24), ("l",)), num_blocks=4)
    with pytest.raises(ValueError, match=r"logical block size 24 of group 'odd'"):
        plan_kernel_blocks(cfg, BACKENDS)

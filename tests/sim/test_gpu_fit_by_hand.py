"""GPU fit, by hand: vLLM's rule (``hybridkv.cost.hardware``), ``0.9 x G x memory - weights -
G x 6 GiB``, on each GPU preset and on models that need one, several and the largest count of
GPUs; the boundary at MAX_GPUS = 1024; a fraction that is not the default."""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv.cost.hardware import MAX_GPUS, fewest_gpus, kv_budget
from hybridkv.cost.presets import get_gpu, get_preset

GIB = 2 ** 30
H100_BYTES = int(79.18 * GIB)          # what CUDA reports (the preset says so)


def budget_by_hand(mem: int, weights: float, gpus: int, fraction: float = 0.9) -> int:
    return int(fraction * gpus * mem - weights - gpus * 6 * GIB)


@pytest.mark.parametrize("name, gpu, gpus, weights", [
    ("llama-3.1-8b", "h100", 1, 8.03e9 * 2),             # 50.3 GiB (vLLM logged 51.38)
    ("llama-3.1-8b", "h200", 1, 8.03e9 * 2),
    ("deepseek-v4-style", "h100", 16, 671e9 * 1),
    ("deepseek-v4-style", "b200", 8, 671e9 * 1),
    ("gpt-oss-120b", "h100", 1, 116.8e9 * 0.55),
    ("llama-4-scout", "h100", 4, 109e9 * 2),
])
def test_kv_budget_is_the_rule_by_hand(name, gpu, gpus, weights) -> None:
    mem = {"h100": H100_BYTES, "h200": 141 * 10**9, "b200": 192 * 10**9}[gpu]
    b = kv_budget(get_preset(name), get_gpu(gpu), gpus)
    assert b.kv_bytes == budget_by_hand(mem, weights, gpus)
    assert b.tokens() == max(0, b.kv_bytes) // get_preset(name).kv_bytes_per_token()["total"]
    assert b.fits == (b.kv_bytes > 0)


def test_llama_on_one_h100_holds_50_3_gib_and_412_098_tokens() -> None:
    b = kv_budget(get_preset("llama-3.1-8b"), get_gpu("h100"), 1)
    assert b.kv_bytes / GIB == pytest.approx(50.305, abs=5e-4)
    assert b.tokens() == b.kv_bytes // 131072 == 412_098


@pytest.mark.parametrize("name, gpu, expected", [
    ("llama-3.1-8b", "h100", 1),
    ("gpt-oss-120b", "h100", 1),                 # 64.2 GB of weights < 70.07 GB a GPU leaves
    ("llama-4-scout", "h100", 4),                # 218 GB: 3 would do, a power of two: 4
    ("deepseek-v4-style", "h100", 16),           # 671 GB: 9.58 GPUs' worth -> 16
    ("deepseek-v4-style", "h200", 8),            # 0.9 x 141 GB - 6 GiB = 120.5 GB a GPU: 5.6 -> 8
    ("deepseek-v4-style", "b200", 8),            # 166.36 GB a GPU: 4 leave 665.4 GB < 671 -> 8
])
def test_the_fewest_gpus_are_the_smallest_power_of_two_that_leaves_kv_room(name, gpu, expected) -> None:
    preset, g = get_preset(name), get_gpu(gpu)
    n = 1
    while budget_by_hand(g.memory_bytes, preset.weight_bytes, n) <= 0:
        n *= 2
    assert n == expected and fewest_gpus(preset, g) == expected
    assert kv_budget(preset, g, expected).fits
    if expected > 1:
        assert not kv_budget(preset, g, expected // 2).fits


def test_the_largest_count_is_reached_and_not_passed() -> None:
    """A model that needs exactly 1024 x h100 (weights of 1000 GPUs' share) gets 1024; one that
    needs more gets None; a KV request that only 1024 hold gets 1024."""
    h100 = get_gpu("h100")
    per_gpu = 0.9 * h100.memory_bytes - 6 * GIB                   # 70.07 GB
    base = get_preset("llama-3.1-8b")
    big = dataclasses.replace(base, num_params=int(1000 * per_gpu / 2), active_params=int(1000 * per_gpu / 2))
    assert fewest_gpus(big, h100) == MAX_GPUS == 1024
    huge = dataclasses.replace(base, num_params=int(1025 * per_gpu / 2), active_params=int(1025 * per_gpu / 2))
    assert fewest_gpus(huge, h100) is None
    need = int(1000 * per_gpu)                                    # KV bytes only 1024 GPUs leave
    assert fewest_gpus(base, h100, kv_bytes=need) == 1024
    assert fewest_gpus(base, h100, kv_bytes=int(1030 * per_gpu)) is None


def test_a_memory_fraction_moves_the_fit() -> None:
    """gpt-oss-120b (64.24 GB) on one h100 at fraction 0.85: 0.85 x 85.02 GB - 6 GiB = 65.83 GB
    fits by 1.6 GB; at 0.8 (61.57 GB) it needs 2."""
    preset, h100 = get_preset("gpt-oss-120b"), get_gpu("h100")
    assert kv_budget(preset, h100, 1, 0.85).kv_bytes == budget_by_hand(H100_BYTES, 116.8e9 * 0.55, 1, 0.85)
    assert fewest_gpus(preset, h100, 0.85) == 1 and fewest_gpus(preset, h100, 0.8) == 2
    with pytest.raises(ValueError, match="gpu memory fraction must be in"):
        kv_budget(preset, h100, 1, 0.0)

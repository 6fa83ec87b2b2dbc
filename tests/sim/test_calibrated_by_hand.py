"""The calibrated step-time model term by term, against a scalar re-derivation of the formula
in ``hybridkv.cost.calibrated``'s docstring, written without the module (and without the core's
hit rules: each attention kind's (query, key) pairs and KV span are counted here by hand).

For every preset kind (dense llama-3.1-8b; MoE gpt-oss-120b and llama-4-scout, with sliding and
chunked-local layers; MLA deepseek-v4-style; sliding gemma-3-27b; state qwen3-next-80b-a3b and
nemotron-h-8b), on 1, 2 and 8 GPUs, with the shipped calibration and with calibrations that
move every constant (split-KV off, a kind scale, no overhead), the model's three paths
(``step``, ``step_time_arrays``, the decode fast path) equal the re-derivation at ``rel=1e-9``
(sums of the same float terms in another order). A few points are also written out as plain
arithmetic, so the re-derivation itself is checked against numbers.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hybridkv.cost.calibrated import CalibratedCostModel, Calibration
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import cost_model, default_calibration
from hybridkv.core.specs import MLA, ChunkedLocal, SlidingWindow, StateSpec

H100 = get_gpu("h100")
REL = 1e-9


# ---- the formula, by hand --------------------------------------------------------------------
def pairs(spec, n: int, c: int) -> int:
    """(query, key) pairs of the queries at positions c .. c+n-1 (one layer)."""
    if isinstance(spec, StateSpec):
        raise AssertionError
    total = 0
    if isinstance(spec, SlidingWindow):
        for q in range(c, c + n):
            total += min(q + 1, spec.window)
    elif isinstance(spec, ChunkedLocal):
        for q in range(c, c + n):
            total += q - (q // spec.chunk_size) * spec.chunk_size + 1
    else:                              # full attention and MLA: every earlier key
        x = c + n
        total = x * (x + 1) // 2 - c * (c + 1) // 2
    return total


def span(spec, n: int, c: int) -> int:
    """Distinct KV positions those queries read."""
    if isinstance(spec, SlidingWindow):
        first = c - spec.window + 1
    elif isinstance(spec, ChunkedLocal):
        first = (c // spec.chunk_size) * spec.chunk_size
    else:
        first = 0
    return c + n - max(first, 0)


def ref_time(preset, gpu, cal: Calibration, G: int, work) -> float:
    return ref_parts(preset, gpu, cal, G, work)["time"]


def ref_parts(preset, gpu, cal: Calibration, G: int, work) -> dict:
    """The step's time and its terms: ``a`` and ``b`` (GEMM compute and weight reads before
    the blend), ``gemm``, ``attn``, ``gpu`` and ``time``."""
    work = [(n, c) for n, c in work if n > 0]
    if not work:
        return dict(time=0.0)
    F, B = gpu.flops, gpu.mem_bw
    s = preset.shapes
    head, untied = s.head_params, s.untied_embedding_params
    T, R = sum(n for n, _ in work), len(work)
    tile = lambda x: math.ceil(x / 64) * 64                               # noqa: E731
    a = (2 * (preset.active_params - head - untied) * tile(T) + 2 * head * tile(R)) / (G * F * cal.gemm_efficiency)
    W = (preset.num_params - untied) * preset.weight_bytes_per_param
    frac = (preset.active_params - untied) / (preset.num_params - untied)
    b = W * (1 - (1 - frac) ** T) / (G * B * cal.weight_bw_efficiency)
    p = cal.gemm_blend
    gemm = (a ** p + b ** p) ** (1 / p)
    e_c, e_x = cal.attn_causal_efficiency, cal.attn_context_efficiency
    kinds = {"full": 0, "sliding": 1, "chunked": 2, "mla": 3, "state": 4}
    attn = 0.0
    prefill = [(n, c) for n, c in work if n > 16]
    decode = [(n, c) for n, c in work if n <= 16]
    for g in preset.groups:
        spec = g.spec
        L = len(g.layer_names)
        if isinstance(spec, StateSpec):
            kind = "state"
        elif isinstance(spec, MLA):
            kind = "mla"
        elif isinstance(spec, SlidingWindow):
            kind = "sliding"
        elif isinstance(spec, ChunkedLocal):
            kind = "chunked"
        else:
            kind = "full"
        scale = L * cal.kind_scale[kinds[kind]]
        state = kind == "state"
        if state:
            q_heads = kv_heads = spec.state_shape[0]
            group_rows = 1
            pair_flops = 4 * math.prod(spec.state_shape)                  # per token
            state_bytes = 2 * spec.page_size_bytes                        # read + written
        else:
            q_heads = s.num_heads
            kv_heads = 1 if kind == "mla" else spec.num_kv_heads
            group_rows = q_heads / kv_heads
            pair_flops = 4 * preset.attn_width / spec.compress_ratio
        for n, c in prefill:                                    # one call per chunk
            eff = e_c if c == 0 else min(e_x, e_c)
            if state:
                flops, nbytes, splits = n * pair_flops, state_bytes, 1
                units = q_heads                                  # one per head, chunk to chunk
            else:
                keys = span(spec, n, c) + n                      # read, and the new ones written
                flops, nbytes = pairs(spec, n, c) * pair_flops, spec.bytes_per_token * keys
                splits = min(128, max(1, keys / 128)) if cal.split_kv else 1
                units = q_heads * max(1, n / 64)
            work_s = max(flops / (G * F * eff), nbytes / (G * B * cal.attn_bw_efficiency))
            occ = min(1, units * splits / (G * cal.attn_saturation_blocks))
            blocks = q_heads * math.ceil(n / 64)
            attn += scale * (work_s / occ + blocks / G * cal.attn_block_s)
        if decode:                                              # one batched call
            u = [kv_heads * math.ceil(group_rows / 64) if n == 1 else q_heads * math.ceil(n / 64)
                 for n, _ in decode]
            if state:
                flops = sum(n for n, _ in decode) * pair_flops
                per = [state_bytes] * len(decode)
                splits = 1
            else:
                flops = sum(pairs(spec, n, c) for n, c in decode) * pair_flops
                keys = [span(spec, n, c) + n for n, c in decode]
                per = [spec.bytes_per_token * k for k in keys]
                splits = min(128, max(1, max(keys) / 128)) if cal.split_kv else 1
            units = sum(per) / max(x / y for x, y in zip(per, u))            # busiest unit bounds
            work_s = max(flops / (G * F * e_x), sum(per) / (G * B * cal.attn_bw_efficiency))
            occ = min(1, units * splits / (G * cal.attn_saturation_blocks))
            attn += scale * (work_s / occ + sum(u) / G * cal.attn_block_s)
    gpu_s = gemm + attn + cal.graph_overhead_s
    out = dict(a=a, b=b, gemm=gemm, attn=attn, gpu=gpu_s, time=gpu_s, eager=bool(prefill))
    if prefill:                                               # eager: joined with the host's time
        q, h = cal.host_overlap, cal.eager_host_s
        out["time"] = (gpu_s ** q + h ** q) ** (1 / q)
    return out                                                # else a CUDA graph: no host term


# ---- the model equals it ---------------------------------------------------------------------
PRESETS = ["llama-3.1-8b", "gpt-oss-120b", "llama-4-scout", "deepseek-v4-style", "gemma-3-27b",
           "qwen3-next-80b-a3b", "nemotron-h-8b"]
WORK = [
    [(1, 1023)],                                   # one decode
    [(1, 100), (1, 5000), (1, 20000)],             # a decode batch of unequal contexts
    [(4, 300), (4, 300)],                          # speculative verification, equal
    [(1, 70_000), (3, 9000)],                      # unequal units: the busiest bounds the call
    [(2048, 0)],                                   # a fresh causal chunk
    [(544, 8192)],                                 # a chunk after a context (tiles: 576 rows)
    [(17, 130)],                                   # the smallest prefill chunk
    [(512, 9000), (1, 4096), (1, 4096), (300, 0)],  # mixed: one GEMM pass, eager
    [(8192, 8000)],                                # across a chunked-local boundary
]
VARIANTS = {
    "shipped": lambda c: c,
    "no-split-kv": lambda c: dataclasses.replace(c, split_kv=False),
    "scaled-kinds": lambda c: dataclasses.replace(c, kind_scale=(1.0, 1.7, 0.6, 2.5, 3.0),
                                                  attn_context_efficiency=0.2, attn_block_s=4e-6),
    "no-overheads": lambda c: dataclasses.replace(c, graph_overhead_s=0.0, eager_host_s=0.0,
                                                  gemm_blend=1.0, host_overlap=1.0),
}


def compressed_mla():
    """deepseek-v4-style with its MLA layers compressed 4:1 (one latent per 4 tokens) and a
    head count its MLA spec must ignore: no shipped preset has either."""
    from hybridkv.core.specs import KVCacheGroup
    p = get_preset("deepseek-v4-style")
    groups = tuple(KVCacheGroup(g.name, dataclasses.replace(g.spec, compress_ratio=4, num_kv_heads=8),
                                g.layer_names) if isinstance(g.spec, MLA) else g for g in p.groups)
    return dataclasses.replace(p, name="deepseek-v4-compressed", groups=groups)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("gpus", [1, 2, 8])
@pytest.mark.parametrize("name", [*PRESETS, "deepseek-v4-compressed"])
def test_every_preset_kind_equals_the_formula_by_hand(name: str, gpus: int, variant: str) -> None:
    preset = compressed_mla() if name == "deepseek-v4-compressed" else get_preset(name)
    cal = VARIANTS[variant](default_calibration(H100)[0])
    model = CalibratedCostModel(preset, H100, cal, gpus)
    for work in WORK:
        want = ref_time(preset, H100, cal, gpus, work)
        new = [n for n, _ in work]
        ctx = [c for _, c in work]
        assert model.step_time(work) == pytest.approx(want, rel=REL), work
        assert model.step_time_arrays(np.array(new, dtype=np.float64), np.array(ctx, dtype=np.float64)) \
            == pytest.approx(want, rel=REL), work
        assert model.step_time_arrays(list(new), list(ctx)) == pytest.approx(want, rel=REL), work


def test_the_simulators_default_model_is_the_shipped_h100_calibration_on_each_gpu() -> None:
    """No profile: the shipped constants on the GPU's own peaks (H200: H100's compute, faster
    memory), on any preset: the same formula with the other peaks."""
    cal = default_calibration(H100)[0]
    for gpu_name in ("h100", "h200"):
        gpu = get_gpu(gpu_name)
        for name in ("llama-3.1-8b", "deepseek-v4-style", "qwen3-next-80b-a3b"):
            model = cost_model(get_preset(name), gpu, 4)
            assert model.calibration == cal
            for work in WORK[:5]:
                assert model.step_time(work) == pytest.approx(
                    ref_time(get_preset(name), gpu, cal, 4, work), rel=REL)


# ---- a few points as plain arithmetic --------------------------------------------------------
ROUND = Calibration(gemm_efficiency=0.5, weight_bw_efficiency=0.5, gemm_blend=1.0,
                    attn_causal_efficiency=0.5, attn_context_efficiency=0.25, attn_bw_efficiency=0.5,
                    attn_saturation_blocks=100.0, attn_block_s=1e-7, graph_overhead_s=1e-3,
                    eager_host_s=2e-3, host_overlap=1.0)


def test_llama_one_decode_over_1023_tokens_by_arithmetic() -> None:
    """llama-3.1-8b (8.03e9 parameters, 525,336,576 of them the LM head and as many the untied
    embedding; 32 layers of 8 KV heads x 128, 32 query heads) on one H100 (989 TFLOP/s,
    3.35 TB/s), one decode after 1023 tokens, under round constants (blend 1: the terms add)."""
    P_tok = 8_030_000_000 - 2 * 525_336_576                      # 6,979,326,848
    a = (2 * P_tok * 64 + 2 * 525_336_576 * 64) / (989e12 * 0.5)  # one token, one row: 64-row tiles
    b = (8_030_000_000 - 525_336_576) * 2 / (3.35e12 * 0.5)       # dense: every weight read once
    pairs_ = 1024                                                # the query at 1023 reads 1024 keys
    flops = pairs_ * 4 * 4096
    kv = 2 * 8 * 128 * 2 * (1024 + 1)                            # K and V, bf16: reads 1024, writes 1
    work_s = max(flops / (989e12 * 0.25), kv / (3.35e12 * 0.5))
    units = 8 * math.ceil(4 / 64)                                # 4 query rows per KV head: 8 blocks
    splits = 1025 / 128                                          # split-KV: 8.0078 units per request
    attn = 32 * (work_s / (units * splits / 100) + 8 * 1e-7)
    want = a + b + attn + 1e-3
    model = CalibratedCostModel(get_preset("llama-3.1-8b"), H100, ROUND)
    assert model.step_time([(1, 1023)]) == pytest.approx(want, rel=REL)
    assert ref_time(get_preset("llama-3.1-8b"), H100, ROUND, 1, [(1, 1023)]) == pytest.approx(want, rel=REL)
    # the weight reads: 15.009e9 B at 1.675 TB/s; the compute of one 64-row tile of 8.03e9
    # parameters at 494.5 TFLOP/s
    assert b == pytest.approx(8.9608e-3, rel=1e-4) and a == pytest.approx(1.94256e-3, rel=1e-5)


def test_gemma_sliding_chunk_after_a_long_context_by_arithmetic() -> None:
    """gemma-3-27b: 10 full layers and 52 sliding ones (window 1024), 16 KV heads x 128, 32
    query heads, 27.016e9 weights (tied embedding: the LM head's 1,409,630,208 are read, none
    untied). A 128-token chunk after 4096 cached tokens, on 2 GPUs: the sliding layers read
    1024 + 127 keys, not 4224; eager, so host 2 ms is added (overlap 1)."""
    G, n, c = 2, 128, 4096
    P, head = 27_016_000_000, 1_409_630_208
    a = (2 * (P - head) * 128 + 2 * head * 64) / (G * 989e12 * 0.5)
    b = P * 2 / (G * 3.35e12 * 0.5)
    kv_tok = 2 * 16 * 128 * 2
    full_pairs = (c + n) * (c + n + 1) // 2 - c * (c + 1) // 2    # 532,544
    swa_pairs = n * 1024                                          # every query past the window
    eff = min(0.25, 0.5)                                          # after a context: min(context, causal)
    units = 32 * max(1, n / 64)                                   # 64 query blocks
    full = 10 * (max(full_pairs * 4 * 4096 / (G * 989e12 * eff), kv_tok * (c + 2 * n) / (G * 3.35e12 * 0.5))
                 / min(1, units * min(128, (c + 2 * n) / 128) / (G * 100)) + 32 * 2 / G * 1e-7)
    swa_keys = (c + n - (c - 1023)) + n                           # 1151 read, 128 written
    swa = 52 * (max(swa_pairs * 4 * 4096 / (G * 989e12 * eff), kv_tok * swa_keys / (G * 3.35e12 * 0.5))
                / min(1, units * swa_keys / 128 / (G * 100)) + 32 * 2 / G * 1e-7)
    want = a + b + full + swa + 1e-3 + 2e-3
    assert full_pairs == 532_544 and swa_keys == 1279
    model = CalibratedCostModel(get_preset("gemma-3-27b"), H100, ROUND, G)
    assert model.step_time([(n, c)]) == pytest.approx(want, rel=REL)


def test_nemotron_state_layers_by_arithmetic() -> None:
    """nemotron-h-8b: 4 attention layers and 24 Mamba layers (state 128 x 64 x 128 float32, conv
    3 x 10240 bf16), a 256-token fresh chunk: each Mamba layer does 4 x 1,048,576 FLOPs a token,
    reads and writes its 4,255,744 B of state once, one unit per head (128 of them, above the
    100 that saturate)."""
    state = 128 * 64 * 128
    page = state * 4 + 3 * 10240 * 2                               # 4,255,744 B per layer
    n = 256
    a = (2 * (8_000_000_000 - 2 * 536_870_912) * 256 + 2 * 536_870_912 * 64) / (989e12 * 0.5)
    b = (8_000_000_000 - 536_870_912) * 2 / (3.35e12 * 0.5)
    mamba = 24 * (max(n * 4 * state / (989e12 * 0.5), 2 * page / (3.35e12 * 0.5)) / 1
                  + 128 * 4 * 1e-7)
    full_pairs = n * (n + 1) // 2
    kv = 2 * 8 * 128 * 2 * (2 * n)
    full = 4 * (max(full_pairs * 4 * 4096 / (989e12 * 0.5), kv / (3.35e12 * 0.5))
                / min(1, 32 * 4 * 4 / 100) + 32 * 4 * 1e-7)
    want = a + b + mamba + full + 1e-3 + 2e-3
    model = CalibratedCostModel(get_preset("nemotron-h-8b"), H100, ROUND)
    assert page == get_preset("nemotron-h-8b").groups[1].spec.page_size_bytes
    assert model.step_time([(n, 0)]) == pytest.approx(want, rel=REL)


# ---- `hybridkv cost` in-process on models that need many GPUs --------------------------------
def roofline_by_hand(preset, gpu, G: int, work) -> tuple[float, float, float]:
    """The roofline's docstring: (time, FLOPs, bytes) with mfu 0.5, mbu 0.8, 2 ms a step."""
    T = sum(n for n, _ in work)
    A, P = preset.active_params, preset.num_params
    flops = 2 * A * T
    nbytes = preset.weight_bytes_per_param * P * (1 - (1 - A / P) ** T)
    for n, c in work:
        for g in preset.groups:
            L = len(g.layer_names)
            flops += 4 * preset.attn_width * L * pairs(g.spec, n, c) / g.spec.compress_ratio
            nbytes += g.spec.bytes_per_token * L * (span(g.spec, n, c) + n)
    t = max(flops / (G * gpu.flops * 0.5), nbytes / (G * gpu.mem_bw * 0.8)) + 0.002
    return t, flops, nbytes


def fewest_by_hand(preset, gpu) -> int:
    """vLLM's rule: 0.9 of each GPU, less the weights and 6 GiB a GPU, must leave KV room;
    the fewest power of two."""
    n = 1
    weights = preset.num_params * preset.weight_bytes_per_param
    while 0.9 * n * gpu.memory_bytes - weights - n * 6 * 2**30 <= 0:
        n *= 2
    return n


def run_cost(argv, capsys) -> dict | str:
    import json
    from hybridkv.cli import main
    assert main(["cost", *argv]) == 0
    out = capsys.readouterr().out
    return json.loads(out) if "--json" in argv else out


@pytest.mark.parametrize("name, gpus, expected_gpus", [
    # 671 GB of 1-byte weights: 0.9 x 85.02 GB - 6 GiB = 70.07 GB a GPU; 8 hold 560.6 GB,
    # 16 hold 1,121 GB: 16
    ("deepseek-v4-style", 16, 16),               # one TP-16 engine (by default: DP attention)
    ("deepseek-v4-style", 8, 8),                 # given: costed on 8 even if it cannot load
    ("llama-4-scout", None, 4),                  # 218 GB of bf16 weights: 4 x 70.07 GB
    ("gpt-oss-120b", 16, 16),
    ("llama-3.1-8b", 1024, 1024),                # the largest count
])
def test_cost_in_process_prints_the_formulas_values(name, gpus, expected_gpus, capsys) -> None:
    preset = get_preset(name)
    steps = [[(1, 4096)] * 64, [(2048, 0)], [(512, 30000), (1, 1000), (1, 9000)]]
    argv = ["--preset", name, "--step", "1@4096x64", "--step", "2048@0", "--step", "512@30000,1@1000,1@9000"]
    if gpus is not None:
        argv += ["--gpus", str(gpus)]
    if gpus is None or (name, gpus) == ("deepseek-v4-style", 16):
        assert fewest_by_hand(preset, H100) == expected_gpus
    d = run_cost([*argv, "--json"], capsys)
    cal = default_calibration(H100)[0]
    assert d["num_gpus"] == expected_gpus and d["cost_model"] == "calibrated"
    total = 0.0
    for s, work in zip(d["steps"], steps):
        r = ref_parts(preset, H100, cal, expected_gpus, work)
        total += r["time"] + s["comm_s"]
        # the compute formula's time; the tensor-parallel communication on top is
        # tests/sim/test_deployment.py's (by hand there)
        assert s["time_s"] - s["comm_s"] == pytest.approx(r["time"], rel=REL)
        assert (s["comm_s"] > 0) == (expected_gpus > 1)
        assert s["attention_s"] == pytest.approx(r["attn"], rel=REL)
        # the blended GEMM time split in proportion to a**p and b**p
        p = cal.gemm_blend
        share = r["a"] ** p / (r["a"] ** p + r["b"] ** p)
        assert s["compute_s"] == pytest.approx(r["gemm"] * share, rel=REL)
        assert s["memory_s"] == pytest.approx(r["gemm"] * (1 - share), rel=REL)
        overhead = r["time"] - r["gemm"] - r["attn"] if r["eager"] else cal.graph_overhead_s
        assert s["overhead_s"] == pytest.approx(overhead, rel=1e-6, abs=1e-12)
        rt, rf, rb = roofline_by_hand(preset, H100, expected_gpus, work)
        assert s["roofline"]["time_s"] - s["roofline"]["comm_s"] == pytest.approx(rt, rel=REL)
        assert s["roofline"]["comm_s"] == pytest.approx(s["comm_s"])
        assert s["roofline"]["flops"] == pytest.approx(rf, rel=REL)
        assert s["roofline"]["bytes"] == pytest.approx(rb, rel=REL)
        assert s["new_tokens"] == sum(n for n, _ in work) and s["requests"] == len(work)
    assert d["time_s"] == pytest.approx(total, rel=REL)
    text = run_cost(argv, capsys)
    assert text.splitlines()[0].startswith(f"{name} on TP-{expected_gpus}, {expected_gpus} x h100; calibrated:")
    assert f"step 1@4096x64 (64 requests, 64 new tokens): {d['steps'][0]['time_s'] * 1e3:.2f} ms" in text
    assert f"total: {total * 1e3:.2f} ms" in text


def test_cost_with_the_roofline_model_on_many_gpus(capsys) -> None:
    d = run_cost(["--preset", "deepseek-v4-style", "--gpus", "32", "--cost-model", "roofline",
                  "--step", "4096@8192", "--json"], capsys)
    t, f, b = roofline_by_hand(get_preset("deepseek-v4-style"), H100, 32, [(4096, 8192)])
    assert d["num_gpus"] == 32 and d["steps"][0]["roofline"] is None
    assert d["steps"][0]["time_s"] - d["steps"][0]["comm_s"] == pytest.approx(t, rel=REL)
    assert d["steps"][0]["comm_s"] > 0                    # TP-32: over the inter-node link
    assert d["steps"][0]["flops"] == pytest.approx(f, rel=REL)
    assert d["steps"][0]["bytes"] == pytest.approx(b, rel=REL)


def test_fp8_weights_halve_the_weight_reads_and_run_the_gemms_at_the_fp8_peak() -> None:
    """``with_weight_dtype("fp8")``: 1 byte per weight and GEMMs at the H100's dense FP8 peak
    (1,979 TFLOP/s, datasheet) instead of BF16's 989; attention unchanged. The one-decode step of
    the test above: its GEMM compute term ``a`` scales by 989 / 1979, its weight reads ``b``
    halve, the rest is the same."""
    P_tok = 8_030_000_000 - 2 * 525_336_576
    a = (2 * P_tok * 64 + 2 * 525_336_576 * 64) / (989e12 * 0.5)
    b = (8_030_000_000 - 525_336_576) * 2 / (3.35e12 * 0.5)
    bf16 = CalibratedCostModel(get_preset("llama-3.1-8b"), H100, ROUND)
    fp8_preset = get_preset("llama-3.1-8b").with_weight_dtype("fp8")
    fp8 = CalibratedCostModel(fp8_preset, H100, ROUND)
    assert (fp8_preset.weight_bytes_per_param, fp8_preset.gemm_dtype) == (1.0, "fp8")
    assert fp8.step_time([(1, 1023)]) - bf16.step_time([(1, 1023)]) \
        == pytest.approx(a * (989 / 1979 - 1) - b / 2, rel=1e-9)
    for work in WORK:                        # the three paths agree on the FP8 model too
        new, ctx = [n for n, _ in work], [c for _, c in work]
        assert fp8.step_time_arrays(list(new), list(ctx)) == pytest.approx(fp8.step_time(work), rel=REL)
        assert fp8.step(work).time_s == pytest.approx(fp8.step_time(work), rel=REL)
    assert get_preset("llama-3.1-8b").with_weight_dtype(None) == get_preset("llama-3.1-8b")
    with pytest.raises(ValueError, match="unknown weight dtype 'int4'; valid: bf16, fp8"):
        get_preset("llama-3.1-8b").with_weight_dtype("int4")


def test_fp8_roofline_counts_the_gemm_flops_at_the_fp8_peak() -> None:
    """Roofline, a 4096-token fresh prefill of llama-3.1-8b (compute-bound): compute =
    (2 x 8.03e9 x 4096 x 989/1979 + attention FLOPs) / (989 TFLOP/s x mfu 0.5); attention:
    32 layers x 4 x 4096 x the causal pairs 4096 x 4097 / 2."""
    from hybridkv.cost.costmodel import CostModel
    attn = 32 * 4 * 4096 * (4096 * 4097 // 2)
    for dtype, scale in (("bf16", 1.0), ("fp8", 989 / 1979)):
        m = CostModel(get_preset("llama-3.1-8b").with_weight_dtype(dtype), H100)
        c = m.step([(4096, 0)])
        want = (2 * 8_030_000_000 * 4096 * scale + attn) / (989e12 * 0.5)
        assert c.compute_s == pytest.approx(want, rel=1e-12) and c.bound == "compute"
        assert c.flops == pytest.approx(2 * 8_030_000_000 * 4096 + attn, rel=1e-12)   # real FLOPs
        assert m.step_time_arrays([4096], [0]) == pytest.approx(c.time_s, rel=1e-12)

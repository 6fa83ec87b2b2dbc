"""``hybridkv profile`` on a CPU: the timed layers compute what they claim (against plain
attention and recurrences written out here), and grid -> fit -> file -> ``simulate --profile``
runs end to end."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from hybridkv.cli import main  # noqa: E402
from hybridkv.core.specs import ChunkedLocal, FullAttention, KVCacheGroup, SlidingWindow  # noqa: E402
from hybridkv.profiling.layers import Plan, StepModel  # noqa: E402
from hybridkv.cost.presets import get_preset  # noqa: E402
from hybridkv.cost.profile import load_profile  # noqa: E402
from hybridkv.cost.shapes import Trim, trimmed_preset  # noqa: E402
from tests.support.fits import assert_same_fit  # noqa: E402

TINY = Trim(layers_per_group=1, width_divisor=16, vocab_size=64)


def _model(preset: str, spec=None) -> StepModel:
    p = trimmed_preset(get_preset(preset), TINY)
    if spec is not None:
        p = dataclasses.replace(p, groups=(KVCacheGroup("g", spec, ("layers.0",)),))
    return StepModel(p, "cpu", torch.float32, seed=3)


def _reference(q, k, v, visible) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the (query, key) pairs ``visible(qpos, kpos)``, GQA by
    repeating KV heads; q (B, Hq, n, D) at positions S - n .. S - 1, k/v (B, Hkv, S, D)."""
    n, S = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    mask = torch.tensor([[visible(S - n + i, j) for j in range(S)] for i in range(n)])
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), -1) @ v


@pytest.mark.parametrize("spec, visible", [
    (FullAttention(16, num_kv_heads=2, head_dim=16), lambda p, j: j <= p),
    (ChunkedLocal(4, num_kv_heads=2, head_dim=16, chunk_size=8), lambda p, j: p - p % 8 <= j <= p),
])
def test_attention_layer_is_attention_over_the_cache(spec, visible) -> None:
    m = _model("llama-3.1-8b", spec)
    layer = m.layers[0]
    plan = Plan(new=5, context=11, batch=2)
    layer.allocate(plan)
    h = torch.randn(plan.tokens, m.hidden)
    q, k, v = layer.project(h)
    out = layer.core((q, k, v), plan)
    qb = q.view(2, 5, layer.heads, layer.d).transpose(1, 2)
    ref = _reference(qb, layer.cache["kp"], layer.cache["vp"], visible)
    assert torch.allclose(out, ref.transpose(1, 2).reshape(10, -1), atol=1e-5)
    # the new keys were written in place after the context
    assert torch.equal(layer.cache["kp"][:, :, 11:16], k.view(2, 5, layer.kv_heads, layer.d).transpose(1, 2))


def test_sliding_window_decode_reads_exactly_the_window() -> None:
    spec = SlidingWindow(16, num_kv_heads=1, head_dim=16, window=6)
    m = _model("llama-3.1-8b", spec)
    layer = m.layers[0]
    plan = Plan(decode_batch=3, decode_context=20)
    layer.allocate(plan)
    q, k, v = layer.project(torch.randn(3, m.hidden))
    out = layer.core((q, k, v), plan)
    ref = _reference(q.view(3, 1, layer.heads, layer.d).transpose(1, 2), layer.cache["kd"],
                     layer.cache["vd"], lambda p, j: p - 6 < j <= p)
    assert torch.allclose(out, ref.transpose(1, 2).reshape(3, -1), atol=1e-5)


def test_mla_absorbed_decode_equals_unabsorbed_attention() -> None:
    m = _model("deepseek-v3")
    layer = m.layers[0]
    pre, dec = Plan(new=1, context=9, batch=2), Plan(decode_batch=2, decode_context=9)
    h = torch.randn(2, m.hidden)
    proj = layer.project(h)
    layer.allocate(pre)
    cache = layer.cache["p"].clone()
    unabsorbed = layer.core(proj, pre)
    layer.allocate(dec)
    layer.cache["d"].copy_(cache)
    absorbed = layer.core(proj, dec)
    assert torch.allclose(unabsorbed, absorbed, atol=1e-4)


def test_state_stand_in_prefill_equals_token_by_token_recurrence() -> None:
    m = _model("qwen3-next-80b-a3b")
    layer = next(lay for lay in m.layers if type(lay).__name__ == "_State")
    n = 70                                                   # two chunks, the second padded
    h = torch.randn(n, m.hidden)
    proj = layer.project(h)
    layer.allocate(Plan(new=n, batch=1))
    s0 = layer.cache["p"].clone()
    chunked = layer.core(proj, Plan(new=n, batch=1))
    final = layer.cache["p"].clone()
    layer.allocate(Plan(decode_batch=1))
    layer.cache["d"].copy_(s0)
    steps = [layer.core(tuple(t[i:i + 1] for t in proj), Plan(decode_batch=1)) for i in range(n)]
    assert torch.allclose(chunked, torch.cat(steps), rtol=1e-4, atol=1e-3)
    assert torch.allclose(final, layer.cache["d"], rtol=1e-4, atol=1e-3)


def test_step_model_counts_what_it_built() -> None:
    m = _model("llama-3.1-8b")
    s = m.preset.shapes
    per_layer = 2 * s.hidden_size * s.num_heads * s.head_dim + 2 * s.hidden_size * 1 * s.head_dim \
        + 3 * s.hidden_size * s.intermediate_size
    assert m.num_params == per_layer + 2 * s.vocab_size * s.hidden_size
    plan = Plan(new=7, context=3, batch=2, decode_batch=3, decode_context=5)
    m.allocate(plan)
    ids, rows = m.inputs(plan)
    assert rows.tolist() == [6, 13, 14, 15, 16]             # last prefill positions, every decode
    assert m.forward(ids, rows, plan).shape == (5, s.vocab_size)


def test_profile_cli_grid_fit_file_and_simulate(tmp_path: Path, capsys) -> None:
    out = tmp_path / "cpu.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert main(["profile", "--preset", "gemma-3-27b", "--device", "cpu", "--out", str(out),
                     "--no-progress", "--point", "96@32,1@64x3"]) == 0
        assert torch.get_num_threads() == 2          # the CPU profile's one thread is not left behind
    finally:
        torch.set_num_threads(threads)
    text = capsys.readouterr().out
    assert "gemma-3-27b on cpu: 18 steps, 6 kernel points" in text and f"wrote {out}" in text
    prof = load_profile(out)
    assert len(prof.points) == 18 and all(p.median_s > 0 for p in prof.points)
    assert {p.kind for p in prof.points} == {"prefill", "decode", "mixed"}
    assert {k.attention for k in prof.kernels} == {"full", "sliding"}
    assert prof.device["kind"] == "cpu" and prof.software["torch"] == torch.__version__
    assert prof.model["trim"] == {"layers_per_group": 2, "width_divisor": 16, "vocab_size": 512}
    assert prof.fit["points"] == 18 and prof.calibration is not None
    # the file carries the grid: a refit without any device gives the same constants
    again = tmp_path / "again.json"
    assert main(["profile", "--refit", str(out), "--out", str(again)]) == 0
    assert_same_fit(load_profile(again).calibration, prof.calibration)
    # the profile times a simulation
    assert main(["simulate", "--preset", "gemma-3-27b", "--workload", "chat", "--limit", "20",
                 "--profile", str(out), "--no-progress", "--no-optimum", "--cache-tokens", "60k"]) == 0
    assert "step times: calibrated: profile of gemma-3-27b on cpu" in capsys.readouterr().out
    json.loads(out.read_text())                              # plain JSON


def test_profile_refuses_bad_requests(tmp_path: Path, capsys) -> None:
    assert main(["profile", "--preset", "llama-3.1-8b", "--device", "cpu", "--out", str(tmp_path / "x.json"),
                 "--grid", "none"]) == 2
    assert "--grid none needs at least one --point" in capsys.readouterr().err
    assert main(["profile", "--preset", "llama-3.1-8b", "--out", str(tmp_path / "x.json"),
                 "--point", "512@0,256@3"]) == 2
    assert "mixes 2 prefill" in capsys.readouterr().err


# ---- the harness: same computation, fewer host ops; timing that measures the GPU ----------------


def test_mixed_step_attends_each_part_over_its_own_cache() -> None:
    m = _model("llama-3.1-8b", FullAttention(16, num_kv_heads=2, head_dim=16))
    layer = m.layers[0]
    plan = Plan(new=4, context=6, batch=2, decode_batch=3, decode_context=9)
    layer.allocate(plan)
    q, k, v = layer.project(torch.randn(plan.tokens, m.hidden))
    out = layer.core((q, k, v), plan)
    causal = lambda p, j: j <= p   # noqa: E731
    pre = _reference(q[:8].view(2, 4, layer.heads, layer.d).transpose(1, 2), layer.cache["kp"],
                     layer.cache["vp"], causal).transpose(1, 2).reshape(8, -1)
    dec = _reference(q[8:].view(3, 1, layer.heads, layer.d).transpose(1, 2), layer.cache["kd"],
                     layer.cache["vd"], causal).transpose(1, 2).reshape(3, -1)
    assert torch.allclose(out, torch.cat([pre, dec]), atol=1e-5)
    assert torch.equal(layer.cache["kd"][:, :, 9:10], k[8:].view(3, 1, layer.kv_heads, layer.d).transpose(1, 2))


@pytest.mark.parametrize("n, s", [(7, 7), (1, 12), (5, 12), (1, 1)])
def test_sdpa_is_lower_right_causal_on_every_path(n, s) -> None:
    from hybridkv.profiling.layers import sdpa
    g = torch.Generator().manual_seed(n * 100 + s)
    q = torch.randn(2, 4, n, 8, generator=g)
    k, v = torch.randn(2, 2, s, 8, generator=g), torch.randn(2, 2, s, 8, generator=g)
    assert torch.allclose(sdpa(q, k, v), _reference(q, k, v, lambda p, j: j <= p), atol=1e-5)


def test_rms_norm_is_the_float32_formula_in_one_op() -> None:
    from torch.profiler import profile

    from hybridkv.profiling.layers import rms_norm
    x = torch.randn(5, 64, dtype=torch.bfloat16)
    w = torch.rand(64, dtype=torch.bfloat16) + 0.5
    xf = x.float()
    want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)
    assert torch.allclose(rms_norm(x, w).float(), want.float(), rtol=1e-2, atol=1e-2)
    with profile() as prof:
        rms_norm(x, w)
    top = [e.name for e in prof.events() if e.cpu_parent is None]
    assert top == ["aten::rms_norm"]


def test_a_layer_issues_few_host_ops() -> None:
    """Each op Python issues costs host time; an eager step issues every one of them. A
    prefill or decode layer of full attention issues 25 (a mixed one 42)."""
    from torch.profiler import profile
    m = _model("llama-3.1-8b", FullAttention(16, num_kv_heads=2, head_dim=16))
    layer = m.layers[0]
    for plan, most in ((Plan(new=16, batch=1), 25), (Plan(decode_batch=4, decode_context=32), 25),
                       (Plan(new=16, context=32, batch=1, decode_batch=4, decode_context=32), 42)):
        layer.allocate(plan)
        x = torch.randn(plan.tokens, m.hidden)
        with torch.inference_mode():
            layer.forward(x, plan)
            with profile() as prof:
                layer.forward(x, plan)
        top = [e.name for e in prof.events() if e.cpu_parent is None]
        # on a CPU a prefill after a context materialises its mask (2 ops; CUDA runs the
        # lower-right flash kernel directly)
        assert len([t for t in top if t not in ("aten::ones", "aten::tril", "aten::empty")]) <= most, top


class _FakeGpu:
    """A GPU that runs queued work in order while the host issues more: ``fn`` issues
    ``kernels`` kernels, spending ``host_s / kernels`` host seconds on each, and each runs
    ``gpu_s / kernels`` seconds on the GPU once the GPU reaches it."""

    def __init__(self, host_s: float, gpu_s: float, kernels: int = 20) -> None:
        import time as _time
        self.now = _time.perf_counter
        self.free_at = 0.0
        self.host_s, self.gpu_s, self.kernels = host_s, gpu_s, kernels

    def enqueue(self, seconds: float) -> float:
        self.free_at = max(self.free_at, self.now()) + seconds
        return self.free_at

    def fn(self) -> None:
        import time as _time
        for _ in range(self.kernels):
            end = self.now() + self.host_s / self.kernels
            while self.now() < end:
                pass
            self.enqueue(self.gpu_s / self.kernels)

    def install(self, monkeypatch) -> None:
        import time as _time
        gpu = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.at = None

            def record(self) -> None:
                self.at = gpu.enqueue(0.0)

            def query(self) -> bool:
                return gpu.now() >= self.at

            def synchronize(self) -> None:
                while gpu.now() < self.at:
                    _time.sleep(0.0002)

            def elapsed_time(self, end) -> float:
                return (end.at - self.at) * 1e3

        monkeypatch.setattr(torch.cuda, "Event", Event)
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: gpu.enqueue(cycles / 1e9))
        def synchronize(device=None) -> None:
            e = Event()
            e.record()
            e.synchronize()

        monkeypatch.setattr(torch.cuda, "synchronize", synchronize)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)


def test_queue_ahead_times_the_gpu_not_the_host(monkeypatch) -> None:
    from hybridkv.profiling import timing
    gpu = _FakeGpu(host_s=0.03, gpu_s=0.01)          # a host-bound eager step
    gpu.install(monkeypatch)
    monkeypatch.setattr(timing, "_CYCLES_PER_S", {})
    cuda = torch.device("cuda", 0)
    opts = timing.TimingOptions(warmup=1, min_repeats=3, max_repeats=3, target_s=0.0)
    plain = timing.time_call(gpu.fn, cuda, dataclasses.replace(opts, queue_ahead=False))
    ahead = timing.time_call(gpu.fn, cuda, opts)
    # Timed from the host's first issue, the step takes the host's time (30 ms of issuing,
    # more when this machine is loaded); queued ahead, it takes the GPU's 10 ms.
    assert plain.median_s == pytest.approx(plain.host_s + 0.0005, rel=0.1) and plain.host_s >= 0.03
    assert ahead.median_s == pytest.approx(0.01, rel=0.1)
    assert ahead.host_s >= 0.03 and ahead.unqueued == 0
    assert timing._CYCLES_PER_S[0] == pytest.approx(1e9, rel=0.1)

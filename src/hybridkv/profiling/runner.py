"""``hybridkv profile``: time a grid of steps of a preset's shapes, fit, write a profile file.

:func:`run_profile` builds the preset's layers with random weights on the device
(:class:`~hybridkv.profiling.layers.StepModel`), measures reference rates (a large GEMM, a
device-to-device copy), times every grid point (prefill and mixed steps eagerly, decode-only
steps as a replayed CUDA graph on CUDA), times the attention kernels of the preset's other
attention kinds next to a full-attention reference, measures host <-> device copies (CUDA),
and fits the calibrated model (:meth:`hybridkv.cost.profile.Profile.refit`). The file is
rewritten after every point, so an interrupted run keeps what it measured; a point that does
not fit in memory or fails is recorded under ``method.skipped`` with its reason, and points
left when ``time_budget_s`` runs out are skipped the same way.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hybridkv.core.specs import FullAttention, KVCacheGroup
from hybridkv.profiling.layers import Plan, StepModel, _Attention
from hybridkv.profiling.timing import TimingOptions, attention_kernel_names, time_call
from hybridkv.cost.calibrated import CalibratedCostModel, Calibration, attention_kind
from hybridkv.cost.calibration_fit import KernelPoint
from hybridkv.cost.grid import GridPoint, format_step
from hybridkv.cost.presets import GPU_PRESETS, ModelPreset, get_preset
from hybridkv.cost.profile import Profile, software_versions
from hybridkv.cost.shapes import Trim, trimmed_preset
from hybridkv.cost.transfer import DEFAULT_TRANSFER, CopyPoint, fit_transfer

__all__ = ["CPU_TRIM", "ProfileRequest", "default_grid", "run_profile"]

CPU_TRIM = Trim(layers_per_group=2, width_divisor=16, vocab_size=512)
"""The tiny shapes a CPU profile uses by default."""

_CPU_GRID = ("16@0", "32@0", "64@0", "128@0", "256@0", "32@64", "64@128", "128@256", "64@512",
             "1@32", "1@128x2", "1@256x4", "1@64x8", "1@512x8", "1@128x16",
             "64@64,1@128x4", "128@0,1@64x8")

# Points measured in the published H100 data (repeated: they show how a new run compares),
# then points it does not have: longer contexts, other token counts, larger decode batches
# and mixed chunked-prefill steps. Ordered so a time budget drops the least useful last.
_CUDA_GRID = (
    "2048@0", "8192@2048", "2048@30720", "1@1024", "1@1024x32", "1@8192",
    "2048@4096,1@1024x64", "512@0,1@1024x32", "256@8192,1@2048x16", "1024@2048,1@4096x32",
    "4096@0,1@512x128", "128@16384,1@1024x8", "2048@16384,1@2048x64", "512@4096,1@8192x16",
    "8192@0,1@1024x16",
    "512@24576", "8192@24576", "4096@28672", "1024@16384", "4096@16384", "256@30720",
    "1024@0", "4096@0", "256@1024", "1024@4096", "4096@4096", "12288@0",
    "1@4096", "1@16384", "1@32768", "1@4096x4", "1@1024x16", "1@8192x8", "1@16384x8",
    "1@4096x64", "1@2048x128", "1@1024x256", "1@512x384", "1@256x512",
    "1024@8192,1@4096x32", "256@0,1@2048x128", "2048@0,1@8192x8", "4096@8192,1@1024x32",
    "128@0,1@512x256", "64@4096,1@4096x64",
    "128@8192", "2048@24576", "6144@12288", "768@2048", "3072@0",
    "1@2048x32", "1@12288x16", "1@30720x4", "1@768x192", "1@6144x48", "1@24576x2",
    "16384@8192",
)

_CPU_KERNELS = ("64@0", "64@192", "1@256x4")
_CUDA_KERNELS = ("2048@0", "2048@8192", "512@16384", "1@4096x16", "1@2048x64")


def default_grid(device_type: str) -> tuple[GridPoint, ...]:
    """The default grid of a ``"cpu"`` (tiny shapes) or ``"cuda"`` profile."""
    steps = _CPU_GRID if device_type == "cpu" else _CUDA_GRID
    return tuple(GridPoint.from_step(s) for s in steps)


@dataclass(frozen=True)
class ProfileRequest:
    """What to profile.

    Attributes:
        preset: model preset name.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        gpu: GPU preset whose datasheet peaks the efficiencies refer to (None: the measured
            reference GEMM and copy rates).
        trim: shrink the preset (default on a CPU: :data:`CPU_TRIM`).
        points: the grid (empty: :func:`default_grid`).
        kernels: also time the attention kernels of the preset's non-full attention kinds.
        timing: repetitions per point.
        decode_graph: time decode-only steps as CUDA graphs (CUDA only).
        transfer: measure host <-> device copies (CUDA only).
        time_budget_s: stop starting points after this many seconds (None: no limit).
        dtype: ``"bfloat16"`` or ``"float32"`` (None: bfloat16 on CUDA, float32 on a CPU,
            where bfloat16 matmuls are slow on most processors).
        threads: CPU threads torch may use (None: 1 on a CPU device, where a thread pool
            competing with other processes stalls; torch's default on CUDA).
        seed: seeds the weights and caches.
        loo: also compute leave-one-out errors of the fit.
    """

    preset: str
    device: str = "cpu"
    gpu: str | None = None
    trim: Trim | None = None
    points: tuple[GridPoint, ...] = ()
    kernels: bool = True
    timing: TimingOptions | None = None
    decode_graph: bool = True
    transfer: bool = True
    time_budget_s: float | None = None
    dtype: str | None = None
    threads: int | None = None
    seed: int = 0
    loo: bool = False
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.gpu is not None and self.gpu not in GPU_PRESETS:
            raise ValueError(f"unknown GPU preset {self.gpu!r}; valid GPUs: {', '.join(GPU_PRESETS)}")
        if self.dtype not in (None, "bfloat16", "float32"):
            raise ValueError(f"dtype must be bfloat16 or float32, got {self.dtype!r}")
        get_preset(self.preset)
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ValueError(f"time budget must be > 0 seconds, got {self.time_budget_s!r}")


class _Progress:
    """A tqdm bar when tqdm is installed and enabled, else nothing."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.bar = None
        if enabled:
            try:
                from tqdm import tqdm
                self.bar = tqdm(total=total, desc="profile", unit="pt", file=sys.stderr)
            except ImportError:
                pass

    def step(self, label: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(label, refresh=False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _plan(p: GridPoint) -> Plan:
    return Plan(p.new_tokens, p.context, p.batch if p.new_tokens else 0, p.decode_batch, p.decode_context)


def _need_bytes(model: ModelPreset, p: GridPoint) -> int:
    """Rough device memory a grid point needs beyond the weights (caches and activations)."""
    kv = model.kv_bytes_per_token()["total"]
    tokens = p.batch * (p.context + p.new_tokens) if p.new_tokens else 0
    tokens += p.decode_batch * (p.decode_context + 1)
    s = model.shapes
    t = p.batch * p.new_tokens + p.decode_batch
    act = t * (8 * s.hidden_size + 6 * s.mlp_width) * 4 + (p.batch + p.decode_batch) * s.vocab_size * 4
    return kv * tokens + act + (1 << 30)


def _reference(device: torch.device, dtype: torch.dtype) -> dict:
    """Rates of a large GEMM and a device copy (read + write bytes per second)."""
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    opts = TimingOptions(warmup=2, min_repeats=5, max_repeats=10, target_s=0.3)
    gemm = time_call(lambda: a @ b, device, opts).median_s
    size = (1 << 30) if device.type == "cuda" else (64 << 20)
    src = torch.empty(size, device=device, dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy = time_call(lambda: dst.copy_(src), device, opts).median_s
    return {"gemm_flops_s": 2 * n ** 3 / gemm, "gemm_n": n, "copy_bytes_s": 2 * size / copy,
            "copy_bytes": size}


def _transfer(device: torch.device) -> list[CopyPoint]:
    """Host <-> device copies: pinned single copies, one pageable copy, batched block copies."""
    out: list[CopyPoint] = []
    big = 256 << 20
    host = torch.empty(big, dtype=torch.uint8).pin_memory()
    dev = torch.empty(big, dtype=torch.uint8, device=device)

    def mean_time(fn: Callable[[], object], reps: int = 10) -> float:
        fn()
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / reps

    for size in (64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20, big):
        out.append(CopyPoint("h2d", size, mean_time(lambda: dev[:size].copy_(host[:size], non_blocking=True))))
        out.append(CopyPoint("d2h", size, mean_time(lambda: host[:size].copy_(dev[:size], non_blocking=True))))
    pageable = torch.empty(big, dtype=torch.uint8)
    out.append(CopyPoint("h2d", big, mean_time(lambda: dev.copy_(pageable), reps=3), pinned=False))
    gen = torch.Generator().manual_seed(0)
    for block, count in ((64 << 10, 1024), (256 << 10, 512), (2 << 20, 64)):
        starts = (torch.randint(0, big // block, (count,), generator=gen) * block).tolist()

        def scattered() -> None:
            for i, s in enumerate(starts):
                dev[i * block % big:i * block % big + block].copy_(host[s:s + block], non_blocking=True)

        out.append(CopyPoint("h2d", block, mean_time(scattered, reps=3), copies=count))
    return out


def _kernel_layers(model: ModelPreset, built: StepModel, trimmed: bool) -> list[tuple[str, object, object]]:
    """(kind, group, layer): the first layer of each attention kind of the target model, and a
    full-attention reference layer (group None) when the model has no full-attention group."""
    order = sorted(((int(n.rpartition(".")[2]), g) for g in model.groups if not g.is_draft
                    for n in g.layer_names), key=lambda t: t[0])
    out: list[tuple[str, object, object]] = []
    seen: set[str] = set()
    for i, (_, g) in enumerate(order):           # built.layers is in the same model order
        kind = attention_kind(g.spec)
        if kind not in seen:
            seen.add(kind)
            out.append((kind, g, built.layers[i]))
    if "full" not in seen:
        spec = FullAttention(16, num_kv_heads=max(1, model.shapes.num_heads // 4),
                             head_dim=64 if trimmed else 128)
        out.insert(0, ("full", None, _Attention(built, spec)))
    return out


def run_profile(req: ProfileRequest, out: str | Path | None = None, progress: bool = True,
                log: Callable[[str], None] | None = None) -> Profile:
    """Measure, fit and (``out``) write a profile (what it does: module docstring). torch's
    thread count (one thread on a CPU unless ``req.threads`` says otherwise) is restored after."""
    threads = torch.get_num_threads()
    try:
        return _run_profile(req, out, progress, log)
    finally:
        torch.set_num_threads(threads)


def _run_profile(req: ProfileRequest, out: str | Path | None, progress: bool,
                 log: Callable[[str], None] | None) -> Profile:
    say = log or (lambda msg: print(msg, file=sys.stderr))
    t_start = time.perf_counter()
    device = torch.device(req.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {req.device!r} asked for, but torch sees no CUDA device")
    cuda = device.type == "cuda"
    dtype_name = req.dtype or ("bfloat16" if cuda else "float32")
    dtype = getattr(torch, dtype_name)
    threads = req.threads or (None if cuda else 1)
    if threads:
        torch.set_num_threads(threads)
    trim = req.trim if req.trim is not None else (Trim() if cuda else CPU_TRIM)
    base = get_preset(req.preset)
    if base.shapes is None:
        raise ValueError(f"preset {req.preset!r} has no layer shapes to profile")
    model = trimmed_preset(base, trim)
    timing = req.timing or (TimingOptions() if cuda else TimingOptions(1, 3, 10, 0.05))
    points = list(req.points or default_grid(device.type))
    torch.manual_seed(req.seed)
    say(f"profile: building {model.name} ({dtype_name}) on {device} ...")
    with torch.inference_mode():
        built = StepModel(model, device, dtype, seed=req.seed)
        model = dataclasses.replace(model, num_params=built.num_params, active_params=built.num_params)
        ref = _reference(device, dtype)
    gpu = GPU_PRESETS.get(req.gpu) if req.gpu else None
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    device_info = {
        "name": name, "kind": device.type, "gpu": req.gpu,
        "memory_bytes": (torch.cuda.get_device_properties(device).total_memory if cuda else 0),
        "peak_flops": gpu.flops if gpu else ref["gemm_flops_s"],
        "peak_bw": gpu.mem_bw if gpu else ref["copy_bytes_s"],
        "peak_source": gpu.source if gpu else "measured reference GEMM and copy of this profile",
        "reference": ref}
    if cuda:
        props = torch.cuda.get_device_properties(device)
        device_info.update(multiprocessors=props.multi_processor_count,
                           capability=f"{props.major}.{props.minor}")
    software = software_versions()
    software.update(torch=torch.__version__, cuda=torch.version.cuda,
                    cudnn=(torch.backends.cudnn.version() if cuda else None),
                    sdpa={"flash": torch.backends.cuda.flash_sdp_enabled(),
                          "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
                          "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                          "math": torch.backends.cuda.math_sdp_enabled()})
    method = {"dtype": dtype_name, "threads": torch.get_num_threads(), "weights": "random", "timer": "cuda-events" if cuda else "perf_counter",
              "prefill": "eager", "decode": "cuda-graph" if cuda and req.decode_graph else "eager",
              "mixed": "eager", "statistic": "median and minimum of the timed repetitions",
              "timing": timing.to_json(), "layers": "see hybridkv.profiling.layers", "skipped": [],
              **req.extra}
    model_info = {"preset": req.preset, "trim": trim.to_json(), "num_params": built.num_params,
                  "active_params": built.num_params}
    measured: list[GridPoint] = []
    kernels: list[KernelPoint] = []

    def snapshot(tm=DEFAULT_TRANSFER) -> Profile:
        return Profile(device=device_info, model=model_info, points=tuple(measured),
                       kernels=tuple(kernels), transfer=tm, software=software, method=method)

    kernel_layers = _kernel_layers(model, built, not trim.is_identity) if req.kernels else []
    kinds = {k for k, _, _ in kernel_layers}
    kernel_steps = (_CUDA_KERNELS if cuda else _CPU_KERNELS) if kinds - {"full"} else ()
    total = len(points) + len(kernel_steps) * len(kernel_layers) + (1 if cuda and req.transfer else 0)
    bar = _Progress(total, progress)
    free = (lambda: torch.cuda.mem_get_info(device)[0]) if cuda else (lambda: 1 << 62)
    cudnn_sdp = torch.backends.cuda.cudnn_sdp_enabled()
    if cuda:
        # The FlashAttention backend, as the method describes (cuDNN's attention, which SDPA
        # would otherwise prefer for some shapes, is off while the profile runs).
        torch.backends.cuda.enable_cudnn_sdp(False)
        software["sdpa"]["cudnn"] = False
    try:
        with torch.inference_mode():
            for p in points:
                label = p.step
                if req.time_budget_s is not None and time.perf_counter() - t_start > req.time_budget_s:
                    method["skipped"].append({"step": label, "reason": "time budget"})
                    bar.step(label)
                    continue
                if _need_bytes(model, p) > free():
                    method["skipped"].append({"step": label, "reason": "does not fit in device memory"})
                    bar.step(label)
                    continue
                plan = _plan(p)
                try:
                    built.allocate(plan)
                    ids, rows = built.inputs(plan)
                    graph = cuda and req.decode_graph and p.kind == "decode"
                    step = lambda: built.forward(ids, rows, plan)   # noqa: E731
                    try:
                        t = time_call(step, device, timing, graph=graph)
                    except RuntimeError as exc:
                        if not graph:
                            raise
                        # A step that cannot be captured is timed eagerly (and said so).
                        method.setdefault("graph_fallbacks", []).append(
                            {"step": label, "reason": f"{type(exc).__name__}: {str(exc)[:160]}"})
                        torch.cuda.synchronize(device)
                        t = time_call(step, device, timing)
                    measured.append(dataclasses.replace(p, median_s=t.median_s, min_s=t.min_s,
                                                        repeats=len(t.seconds), host_s=t.host_s))
                    if t.unqueued:
                        method.setdefault("unqueued", []).append({"step": label, "repetitions": t.unqueued})
                except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
                    method["skipped"].append({"step": label, "reason": f"{type(exc).__name__}: {str(exc)[:160]}"})
                finally:
                    built.free()
                    if cuda:
                        torch.cuda.empty_cache()
                bar.step(label)
                if out is not None:
                    snapshot().save(out)
            if cuda:
                method["attention_kernels"] = _which_kernels(built, device)
            for step in kernel_steps:
                gp = GridPoint.from_step(step)
                plan = _plan(gp)
                for kind, group, layer in kernel_layers:
                    label = f"{kind} {step}"
                    try:
                        layer.allocate(plan)
                        h = torch.randn(plan.tokens, built.hidden, device=device, dtype=dtype)
                        proj = layer.project(h)
                        t = time_call(lambda: layer.core(proj, plan), device, timing)
                        kernels.append(_kernel_point(model, group, layer, kind, gp, t))
                    except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
                        method["skipped"].append({"step": label, "reason": f"{type(exc).__name__}: {str(exc)[:160]}"})
                    finally:
                        layer.cache = {}
                        if cuda:
                            torch.cuda.empty_cache()
                    bar.step(label)
            tm = DEFAULT_TRANSFER
            if cuda and req.transfer:
                tm = fit_transfer(_transfer(device), f"measured by hybridkv profile on {name}")
                bar.step("transfer")
            else:
                method["transfer"] = (f"not measured ({'--no-transfer' if cuda else 'CPU device'}): the "
                                      "default copy times")
    finally:
        bar.close()
        torch.backends.cuda.enable_cudnn_sdp(cudnn_sdp)
    if not measured:
        raise ValueError("no grid point could be measured; see the reasons above")
    method["wall_s"] = time.perf_counter() - t_start
    prof = snapshot(tm).refit(loo=req.loo)
    if out is not None:
        prof.save(out)
    return prof


def _which_kernels(built: StepModel, device: torch.device) -> dict:
    """The attention kernels a fresh prefill, a prefill after a context and a decode batch run
    (evidence of which SDPA backend the device's PyTorch dispatched to)."""
    out = {}
    for step in ("512@0", "512@2048", "1@2048x8"):
        plan = _plan(GridPoint.from_step(step))
        try:
            built.allocate(plan)
            ids, rows = built.inputs(plan)
            out[step] = attention_kernel_names(lambda: built.forward(ids, rows, plan), device)
        except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:
            out[step] = [f"{type(exc).__name__}: {str(exc)[:120]}"]
        finally:
            built.free()
            torch.cuda.empty_cache()
    return out


_KERNEL_NOTES = {"full": "SDPA, lower-right causal mask", "sliding": "SDPA over window blocks (stand-in)",
                 "chunked": "SDPA split at chunk boundaries",
                 "mla": "unabsorbed SDPA prefill, absorbed matmul decode (stand-in)",
                 "state": "chunked linear attention (stand-in)"}


def _kernel_point(model: ModelPreset, group, layer, kind: str, gp: GridPoint, t) -> KernelPoint:
    """The kernel point of one timed attention core, with the work the model counts for it
    (one layer of ``group``; ``group`` None: the full-attention reference layer)."""
    if group is None:
        spec = FullAttention(16, num_kv_heads=layer.kv_heads, head_dim=layer.d)
        one = dataclasses.replace(model, groups=(KVCacheGroup("ref", spec, ("layers.0",)),),
                                  attn_width=layer.heads * layer.d)
    else:
        one = dataclasses.replace(model, groups=(dataclasses.replace(group, layer_names=("layers.0",)),))
    f = CalibratedCostModel(one, GPU_PRESETS["h100"], Calibration()).features(gp.work())
    return KernelPoint(kind, format_step(gp.work()), float(f.call_flops.sum()), float(f.call_bytes.sum()),
                       float(f.call_units.sum()), bool(f.call_causal.all()), t.median_s, t.min_s,
                       _KERNEL_NOTES[kind])

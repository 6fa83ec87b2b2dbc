r"""A deployment: how a model's engines are laid out over GPUs, and what it holds per instance.

A :class:`Deployment` of ``gpus = tp * dp`` GPUs runs ``dp`` *instances* (replicas behind a
router, each its own scheduler and KV cache; the simulator's cluster). An instance's ``tp`` GPUs
split every layer (tensor parallelism). ``ep`` shards the routed experts of a MoE preset:

* ``ep = tp`` (``dp_attention`` off): inside one instance the experts are sharded instead of
  split (vLLM's ``--enable-expert-parallel`` with tensor-parallel attention);
* ``ep = tp * dp`` with ``dp_attention``: *data-parallel attention*, as SGLang
  (``--enable-dp-attention --moe-a2a-backend deepep``, docs "DeepSeek usage" and the LMSYS
  blog "Deploying DeepSeek with PD Disaggregation and Large-scale Expert Parallelism on 96 H100
  GPUs", 2025-05-05) and vLLM (``--data-parallel-size N --enable-expert-parallel``, docs
  "Data Parallel Deployment" / "Expert Parallel Deployment") run DeepSeek-class models: every
  rank is an instance with its own requests and cache, its attention and dense weights whole,
  and ``1 / ep`` of the experts; the ranks step together through every MoE layer, exchanging
  tokens all-to-all.

The default deployment (:func:`default_deployment`) is what those engines' recipes do: a
DeepSeek-class preset (MLA + MoE) runs DP attention + EP over all its GPUs; any other preset the
smallest power-of-two ``tp`` inside one node whose GPUs hold the weights with room for
:data:`USEFUL_CACHE_TOKENS` tokens of cache, the rest as replicas.

The communication one step costs is :mod:`hybridkv.cost.comm`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hybridkv.core.validation import check_int
from hybridkv.cost.hardware import DEFAULT_GPU_MEMORY_FRACTION, KVBudget, kv_budget
from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["DEFAULT_GPUS_PER_NODE", "USEFUL_CACHE_TOKENS", "Deployment", "default_deployment",
           "expert_params", "instance_budget", "is_deepseek_class"]

DEFAULT_GPUS_PER_NODE = 8
"""GPUs one node joins with NVLink (an HGX/DGX H100, H200 or B200 board)."""

USEFUL_CACHE_TOKENS = 262_144
"""A cache the default deployment asks each instance to hold at least: the default batch
(``--max-num-seqs`` 256) at 1,024 tokens each."""


@dataclass(frozen=True, slots=True)
class Deployment:
    """``dp`` instances of ``tp`` GPUs each; ``ep``: the expert-parallel group (module docstring).

    Attributes:
        tp: GPUs one instance splits its layers over (tensor parallelism).
        dp: instances (replicas or data-parallel attention ranks).
        ep: GPUs the routed experts are sharded over (1: none).
        gpus_per_node: GPUs per node: a group wider than this communicates over the
            inter-node link.
        dp_attention: the ``dp`` instances are ranks of one expert-parallel engine (``ep = tp * dp``).
        reason: why this deployment runs (shown in the report).
    """

    tp: int = 1
    dp: int = 1
    ep: int = 1
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE
    dp_attention: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        for name in ("tp", "dp", "ep", "gpus_per_node"):
            check_int(f"Deployment.{name}", getattr(self, name), 1)
        if self.dp_attention and self.ep != self.tp * self.dp:
            raise ValueError(f"data-parallel attention shards the experts over all tp x dp = "
                             f"{self.tp * self.dp} GPUs; got --ep {self.ep}")
        if not self.dp_attention and self.ep not in (1, self.tp):
            raise ValueError(f"--ep {self.ep}: expert parallelism shards the experts over one "
                             f"instance's --tp {self.tp} GPUs (--ep {self.tp}) or, with "
                             f"data-parallel attention, over all {self.tp * self.dp} GPUs")

    @property
    def gpus(self) -> int:
        """All GPUs of the deployment."""
        return self.tp * self.dp

    @property
    def group(self) -> int:
        """GPUs that step together: one instance's, or all ranks' with DP attention."""
        return self.ep if self.dp_attention else self.tp

    @property
    def name(self) -> str:
        """``TP-8``, ``8 x TP-1``, ``DP-16 attention + EP-16``."""
        if self.dp_attention:
            attn = "" if self.tp == 1 else f" x TP-{self.tp}"
            return f"DP-{self.dp}{attn} attention + EP-{self.ep}"
        one = f"TP-{self.tp}" + (f" + EP-{self.ep}" if self.ep > 1 else "")
        return one if self.dp == 1 else f"{self.dp} x {one}"

    def describe(self) -> str:
        """The name, the GPU count and why."""
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.name} on {self.gpus} GPU{'s' if self.gpus != 1 else ''}{why}"

    def to_json(self) -> dict[str, Any]:
        return {"tp": self.tp, "dp": self.dp, "ep": self.ep, "gpus": self.gpus,
                "gpus_per_node": self.gpus_per_node, "dp_attention": self.dp_attention,
                "name": self.name, "reason": self.reason}


def is_deepseek_class(preset: ModelPreset) -> bool:
    """MLA attention and routed experts: the models SGLang and vLLM serve with DP attention + EP."""
    s = preset.shapes
    return s is not None and s.mla is not None and s.moe is not None


def expert_params(preset: ModelPreset) -> int:
    """Routed-expert parameters of ``preset`` (0 for a dense one): 3 matrices (gate, up, down)
    of ``hidden x expert_intermediate`` per expert, over the MoE layers (the layers after
    ``dense_layers``)."""
    s = preset.shapes
    if s is None or s.moe is None:
        return 0
    m = s.moe
    layers = preset.num_layers - m.dense_layers
    return min(preset.num_params, 3 * s.hidden_size * m.expert_intermediate * m.num_experts * layers)


def instance_budget(preset: ModelPreset, gpu: GpuPreset, dep: Deployment,
                    fraction: float = DEFAULT_GPU_MEMORY_FRACTION) -> KVBudget:
    """The KV memory one instance's ``tp`` GPUs leave: all weights split over them, or with DP
    attention the dense weights whole plus ``tp / ep`` of the experts."""
    if not dep.dp_attention:
        return kv_budget(preset, gpu, dep.tp, fraction)
    experts = expert_params(preset) * preset.weight_bytes_per_param
    dense = preset.weight_bytes - experts
    return kv_budget(preset, gpu, dep.tp, fraction, weights=dense * dep.tp + experts * dep.tp / dep.ep)


def _useful(budget: KVBudget) -> bool:
    return budget.tokens() >= USEFUL_CACHE_TOKENS


def default_deployment(preset: ModelPreset, gpu: GpuPreset, gpus: int,
                       fraction: float = DEFAULT_GPU_MEMORY_FRACTION,
                       gpus_per_node: int = DEFAULT_GPUS_PER_NODE) -> Deployment:
    """The deployment serving engines would run ``preset`` with on ``gpus`` x ``gpu``
    (module docstring), with its reason.

    Raises:
        ValueError: when no deployment of ``gpus`` holds the weights, naming what would.
    """
    check_int("gpus", gpus, 1)
    if is_deepseek_class(preset) and gpus > 1:
        dep = Deployment(1, gpus, gpus, gpus_per_node, True,
                         "DeepSeek-class MLA + MoE: data-parallel attention + expert parallelism, "
                         "as SGLang's and vLLM's large-scale recipes run it")
        budget = instance_budget(preset, gpu, dep, fraction)
        if budget.fits:
            return dep
        raise ValueError(f"{preset.name} with DP attention + EP-{gpus} does not fit {gpus} x {gpu.name}: "
                         f"each rank: {budget.describe()}; use more --gpus or a larger --gpu")
    fallback = None
    tp = 1
    while tp <= min(gpus, gpus_per_node):
        if gpus % tp == 0:
            dep = Deployment(tp, gpus // tp, 1, gpus_per_node)
            budget = instance_budget(preset, gpu, dep, fraction)
            if budget.fits and _useful(budget):
                why = (f"the smallest power-of-two TP in a node that holds the weights and "
                       f"{USEFUL_CACHE_TOKENS:,}+ cache tokens"
                       + (f"; {dep.dp} replicas behind the router" if dep.dp > 1 else ""))
                return Deployment(tp, gpus // tp, 1, gpus_per_node, reason=why)
            if budget.fits and fallback is None:
                fallback = tp
        tp *= 2
    if fallback is not None:
        dp = gpus // fallback
        return Deployment(fallback, dp, 1, gpus_per_node, reason=(
            f"the smallest power-of-two TP in a node that holds the weights (no TP in a node "
            f"leaves {USEFUL_CACHE_TOKENS:,} cache tokens)" + (f"; {dp} replicas" if dp > 1 else "")))
    if gpus > gpus_per_node and kv_budget(preset, gpu, gpus, fraction).fits:
        return Deployment(gpus, 1, 1, gpus_per_node, reason=(
            f"the weights fit no TP group inside one node of {gpus_per_node}: TP-{gpus} across "
            "nodes, its all-reduces over the inter-node link"))
    raise ValueError(f"{preset.name} does not fit {gpus} x {gpu.name} in any deployment "
                     f"({kv_budget(preset, gpu, gpus, fraction).describe()}); use more --gpus or a larger --gpu")

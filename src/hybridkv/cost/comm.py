r"""The communication of one engine step under a :class:`~hybridkv.cost.deployment.Deployment`,
and a cost model that adds it to the compute time.

The collectives are counted from the model's shapes as vLLM and SGLang issue them, for a step
of ``T`` new tokens and ``R`` requests (``h`` the hidden size, activations in BF16, 2 bytes)::

    tensor parallel (tp > 1), over tp GPUs:
        all-reduce of T*h*2 bytes: 1 after the vocabulary-parallel embedding, and per layer 1
            after attention's output projection and 1 after the MLP (a MoE layer with
            ep = tp exchanges its tokens all-to-all instead)
        all-gather of R*vocab*2 bytes: the vocabulary-parallel LM head's logits
    expert parallel (ep > 1), over the ep GPUs, per MoE layer:
        dispatch T*k*h*1 bytes (FP8) and combine T*k*h*2 bytes (BF16): DeepEP's formats;
        k = the experts each token uses, T = this instance's (rank's) tokens

Each is timed by :mod:`hybridkv.cost.collectives` on the link the group spans: the GPU's NVLink
inside a node of ``gpus_per_node``, the inter-node link (``ib-ndr``) for a wider group. Nothing
overlaps (both engines issue these on the compute stream; SGLang's two-batch overlap is opt-in).

:class:`DeployedCostModel` wraps a compute model (calibrated or roofline) built for the
instance's GPUs. With data-parallel attention the ranks step together, so a rank's step is
modelled as the whole group's work over the ``ep`` GPUs, each rank carrying the same work: the
inner model is built for ``ep`` GPUs and given the rank's work ``dp`` times; every rank also
reads its whole dense (non-expert) weights, which that inner model spread over the group, so
the rest of them is added at the weight-read rate.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from hybridkv.cost.calibrated import CalibratedCostModel
from hybridkv.cost.collectives import NVLINK_OF_GPU, Link, all_gather_s, all_reduce_s, all_to_all_s, get_link
from hybridkv.cost.costmodel import CostModel, StepCost
from hybridkv.cost.deployment import Deployment, expert_params
from hybridkv.cost.presets import GpuPreset, ModelPreset

__all__ = ["ACT_BYTES", "INTER_NODE_LINK", "CommCounts", "DeployedCostModel", "comm_counts", "link_for",
           "step_comm_s"]

ACT_BYTES = 2
"""Bytes of one activation value (BF16)."""
DISPATCH_BYTES = 1
"""Bytes per value of an expert-parallel dispatch (FP8, as DeepEP sends it)."""
INTER_NODE_LINK = "ib-ndr"
COMM_MEMO = 1 << 16
"""Step shapes whose communication a :class:`DeployedCostModel` remembers (then it starts over)."""


def link_for(gpu: GpuPreset, n: int, gpus_per_node: int) -> Link:
    """The link a group of ``n`` GPUs communicates over: the GPU's NVLink inside a node, the
    inter-node link for a wider group."""
    if n > gpus_per_node:
        return get_link(INTER_NODE_LINK)
    return get_link(NVLINK_OF_GPU.get(gpu.name, "nvlink-h100"))


@dataclass(frozen=True, slots=True)
class CommCounts:
    """The collectives of one step, per token or per request (module docstring).

    Attributes:
        all_reduces: all-reduces per step over the tp group.
        ar_bytes_per_token: bytes each of them carries per new token.
        gather_bytes_per_request: all-gathered logits bytes per request.
        a2a_layers: MoE layers exchanging tokens all-to-all over the ep group.
        dispatch_bytes_per_token / combine_bytes_per_token: bytes one token sends in each.
    """

    all_reduces: int
    ar_bytes_per_token: int
    gather_bytes_per_request: int
    a2a_layers: int
    dispatch_bytes_per_token: int
    combine_bytes_per_token: int


def comm_counts(preset: ModelPreset, dep: Deployment) -> CommCounts:
    """The collectives ``preset`` issues per step under ``dep``."""
    h = preset.hidden_size
    s = preset.shapes
    moe = s.moe if s is not None and expert_params(preset) > 0 else None
    moe_layers = preset.num_layers - moe.dense_layers if moe is not None else 0
    a2a = moe_layers if dep.ep > 1 and moe is not None else 0
    ar = 0
    if dep.tp > 1:
        ar = 1 + 2 * preset.num_layers - a2a        # a MoE layer's tokens go all-to-all instead
    vocab = s.vocab_size if s is not None else 0
    k = moe.top_k if moe is not None else 0
    return CommCounts(ar, h * ACT_BYTES, vocab * ACT_BYTES if dep.tp > 1 else 0, a2a,
                      k * h * DISPATCH_BYTES, k * h * ACT_BYTES)


def step_comm_s(counts: CommCounts, dep: Deployment, gpu: GpuPreset, tokens: float, requests: float) -> float:
    """Seconds of communication of a step of ``tokens`` new tokens and ``requests`` requests
    (one instance's, or one rank's with DP attention)."""
    if tokens <= 0:
        return 0.0
    t = 0.0
    if counts.all_reduces:
        link = link_for(gpu, dep.tp, dep.gpus_per_node)
        t += counts.all_reduces * all_reduce_s(link, tokens * counts.ar_bytes_per_token, dep.tp)
        t += all_gather_s(link, requests * counts.gather_bytes_per_request, dep.tp)
    if counts.a2a_layers:
        link = link_for(gpu, dep.ep, dep.gpus_per_node)
        t += counts.a2a_layers * all_to_all_s(link, tokens * counts.dispatch_bytes_per_token,
                                              tokens * counts.combine_bytes_per_token, dep.ep)
    return t


class DeployedCostModel:
    """A compute cost model plus the communication of ``deployment`` (module docstring).

    Args:
        inner: the compute model, built for the instance's ``tp`` GPUs (DP attention: for
            the ``ep`` GPUs of the group).
        deployment: the deployment.
    """

    def __init__(self, inner: CostModel | CalibratedCostModel, deployment: Deployment) -> None:
        self.inner = inner
        self.deployment = deployment
        self.model = inner.model
        self.gpu = inner.gpu
        self.kind = inner.kind
        self.num_gpus = deployment.tp
        self.counts = comm_counts(inner.model, deployment)
        dep = deployment
        self._copies = dep.dp if dep.dp_attention else 1
        extra = 0.0
        if dep.dp_attention and dep.ep > 1:
            p = inner.model
            dense = p.weight_bytes - expert_params(p) * p.weight_bytes_per_param
            eff = (inner.calibration.weight_bw_efficiency if isinstance(inner, CalibratedCostModel)
                   else inner.mbu)
            extra = dense * (1.0 - dep.tp / dep.ep) / dep.tp / (inner.gpu.mem_bw * eff)
        self._dense_extra_s = extra
        self._comm: dict[tuple[float, float], float] = {}     # (tokens, requests) -> seconds
        self.source = f"{inner.source}; {dep.name}, communication from published collectives"

    def comm_s(self, tokens: float, requests: float) -> float:
        """Communication seconds of a step of ``tokens`` new tokens over ``requests`` requests
        (remembered: a run's steps repeat a few thousand shapes; at most ``COMM_MEMO``)."""
        memo = self._comm
        t = memo.get((tokens, requests))
        if t is None:
            if len(memo) >= COMM_MEMO:
                memo.clear()
            t = memo[tokens, requests] = step_comm_s(self.counts, self.deployment, self.gpu, tokens, requests)
        return t

    def _tile(self, work: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return work * self._copies

    def step(self, work: Iterable[tuple[int, int]]) -> StepCost:
        """The inner model's :class:`StepCost` with ``comm_s`` (and the replicated dense weight
        reads of DP attention) added to ``time_s``."""
        work = [(n, c) for n, c in work if n]
        c = self.inner.step(self._tile(work))
        if not work:
            return c
        comm = self.comm_s(sum(n for n, _ in work), len(work))
        return replace(c, time_s=c.time_s + comm + self._dense_extra_s, comm_s=comm,
                       memory_s=c.memory_s + self._dense_extra_s)

    def step_time(self, work: Iterable[tuple[int, int]]) -> float:
        return self.step(work).time_s

    def step_time_arrays(self, new: NDArray[Any] | list[int], ctx: NDArray[Any] | list[int]) -> float:
        """:meth:`step_time` for ``work = zip(new, ctx)`` (the simulator's hot path)."""
        k = self._copies
        tokens: float                           # an int for a list, a float for arrays
        if new.__class__ is list:
            tokens, rows = sum(new), len(new) - new.count(0)
            t = self.inner.step_time_arrays(new * k, ctx * k) if k > 1 else self.inner.step_time_arrays(new, ctx)
        else:
            new = np.asarray(new)
            tokens, rows = float(new.sum()), int(np.count_nonzero(new))
            t = (self.inner.step_time_arrays(np.tile(new, k), np.tile(np.asarray(ctx), k)) if k > 1
                 else self.inner.step_time_arrays(new, ctx))
        if tokens <= 0:
            return t
        c = self._comm.get((tokens, rows))             # comm_s(), its memo read inline
        if c is None:
            c = self.comm_s(tokens, rows)
        return t + c + self._dense_extra_s

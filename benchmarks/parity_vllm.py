"""The vLLM 0.33 side of the parity harness (needs the optional venv; see bench_vs_vllm.py).

vLLM's ``KVCacheManager`` is built the way its scheduler builds it (scheduler block size =
LCM, hash block size = GCD, ``max_in_flight_tokens`` = the step budget, ``use_eagle`` for
EAGLE drop mode, ``is_eagle_group`` on the draft groups) and driven through
:func:`parity_harness.run_case` exactly as vLLM's ``Scheduler.schedule`` calls it:
``new_step_starts`` each step, ``allocate_slots(req, n, num_lookahead_tokens=k)`` for running
requests, ``get_computed_blocks`` + ``allocate_slots(..., full_sequence_must_fit=True)`` on
admission, ``free`` on preemption and finish. Hashing (the request's block hasher, sha256 over
pickled tuples: vLLM's default) is timed apart from manager calls.
"""

from __future__ import annotations

import logging
import time

from parity_harness import Case, Geometry, ReqState


class VllmModules:
    """vLLM's classes, imported once (about 10 s)."""

    def __init__(self) -> None:
        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.utils import hashing
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig,
                                                KVCacheGroupSpec, SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus
        self.version = getattr(vllm, "__version__", "?")
        self.torch = torch
        self.SamplingParams = SamplingParams
        self.KVCacheManager = KVCacheManager
        self.get_request_block_hasher = get_request_block_hasher
        self.FullAttentionSpec = FullAttentionSpec
        self.SlidingWindowSpec = SlidingWindowSpec
        self.KVCacheConfig = KVCacheConfig
        self.KVCacheGroupSpec = KVCacheGroupSpec
        self.Request = Request
        self.RequestStatus = RequestStatus
        self.hash_fn = hashing.sha256
        quiet = logging.getLogger("vllm.v1.core.kv_cache_utils")
        level = quiet.level
        quiet.setLevel(logging.ERROR)
        try:
            init_none_hash(self.hash_fn)
        finally:
            quiet.setLevel(level)


class VllmSide:
    """vLLM's KVCacheManager through the parity loop."""

    def __init__(self, V: VllmModules, case: Case, geo: Geometry, count_evictions: bool = True) -> None:
        self.V = V
        kw = dict(num_kv_heads=8, head_size=128, dtype=V.torch.bfloat16)
        groups = []
        for g, (kind, bs, w) in enumerate(case.groups):
            spec = (V.FullAttentionSpec(block_size=bs, **kw) if kind == "full"
                    else V.SlidingWindowSpec(block_size=bs, sliding_window=w, **kw))
            eagle_group = case.eagle is not None and case.eagle != "all" and case.eagle == kind
            groups.append(V.KVCacheGroupSpec([f"l{g}"], spec, is_eagle_group=eagle_group))
        cfg = V.KVCacheConfig(num_blocks=geo.num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=groups,
                              prefix_cache_retention_interval=case.retention)
        self.kv = V.KVCacheManager(cfg, max_model_len=geo.max_model_len,
                                   scheduler_block_size=geo.alignment,
                                   hash_block_size=geo.hash_block_size,
                                   max_in_flight_tokens=case.budget, enable_caching=True,
                                   use_eagle=case.eagle is not None, log_stats=True)
        self.hasher = V.get_request_block_hasher(geo.hash_block_size, V.hash_fn)
        self.lookahead = case.lookahead
        self.mgr_s = 0.0
        self.hash_s = 0.0
        self.computed: dict[str, object] = {}
        self.n_evicted = 0
        if count_evictions:
            pool = self.kv.block_pool
            inner = pool._maybe_evict_cached_block

            def counting(block, _inner=inner):
                evicted = _inner(block)
                if evicted:
                    self.n_evicted += 1
                return evicted
            pool._maybe_evict_cached_block = counting

    def new_step(self) -> None:
        t0 = time.perf_counter()
        self.kv.new_step_starts()
        self.mgr_s += time.perf_counter() - t0

    def make(self, st: ReqState) -> None:
        if st.handle is not None:
            return
        V = self.V
        req = V.Request(st.item.rid, list(st.item.prompt),
                        V.SamplingParams(max_tokens=max(1, len(st.item.answer))), None,
                        block_hasher=None)
        t0 = time.perf_counter()
        req._block_hasher = self.hasher
        req.update_block_hashes()
        self.hash_s += time.perf_counter() - t0
        st.handle = req

    def append(self, st: ReqState, tokens: list[int]) -> None:
        t0 = time.perf_counter()
        st.handle.append_output_token_ids(tokens)
        self.hash_s += time.perf_counter() - t0

    def lookup(self, st: ReqState) -> int:
        req = st.handle
        t0 = time.perf_counter()
        blocks, hit, boundary = self.kv.get_computed_blocks(req)
        req.shared_prefix_boundary = boundary
        self.mgr_s += time.perf_counter() - t0
        self.computed[st.item.rid] = (blocks, hit)
        return hit

    def admit(self, st: ReqState, num_new: int) -> bool:
        blocks, hit = self.computed.pop(st.item.rid)
        req = st.handle
        t0 = time.perf_counter()
        new = self.kv.allocate_slots(req, num_new, hit, blocks,
                                     num_lookahead_tokens=self.lookahead,
                                     full_sequence_must_fit=True)
        self.mgr_s += time.perf_counter() - t0
        if new is None:
            return False
        req.status = self.V.RequestStatus.RUNNING
        return True

    def allocate(self, st: ReqState, num_new: int) -> bool:
        t0 = time.perf_counter()
        new = self.kv.allocate_slots(st.handle, num_new, num_lookahead_tokens=self.lookahead)
        self.mgr_s += time.perf_counter() - t0
        return new is not None

    def set_computed(self, st: ReqState) -> None:
        st.handle.num_computed_tokens = st.computed

    def preempt(self, st: ReqState) -> None:
        req = st.handle
        t0 = time.perf_counter()
        self.kv.free(req)
        self.mgr_s += time.perf_counter() - t0
        req.status = self.V.RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1

    def finish(self, st: ReqState) -> None:
        t0 = time.perf_counter()
        self.kv.free(st.handle)
        self.mgr_s += time.perf_counter() - t0
        st.handle.status = self.V.RequestStatus.FINISHED_LENGTH_CAPPED

    def evictions(self) -> int:
        return self.n_evicted


"""What one request needs of the pool, checked before the manager is built: blocks at most
across the groups (:func:`blocks_for_request`), that a request of ``max_model_len`` fits
(:func:`check_fits`), and that the lookahead slots of speculative decoding fit
(:func:`check_lookahead`). Each error names the bad value and what would fit."""

from __future__ import annotations

from hybridkv.core.rules import make_rule
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.core.specs import KVCacheConfig

__all__ = ["blocks_for_request", "check_fits", "check_lookahead"]


def blocks_for_request(config: KVCacheConfig, length: int, *, retention_interval: int | None = 0,
                       vllm_compat: bool = False, hold: int | None = None) -> int:
    """Blocks one request of ``length`` tokens needs at most, across the groups.

    Full groups hold the whole sequence; local groups their window (or chunk), plus the
    tokens they hold past it (``hold``; default: the alignment unit kept for the final-end
    promise in default mode with sparse retention; a manager in EAGLE drop mode holds its
    proof block too, ``coordinator.hold``), plus two blocks (one prefill chunk; chunked
    prefill bounds the chunk).
    """
    if hold is None:
        hold = 0 if vllm_compat or retention_interval is None else config.alignment
    return sum(make_rule(g.spec).max_blocks(length, hold) * config.extent_blocks(i)
               for i, g in enumerate(config.groups))


def check_lookahead(config: KVCacheConfig, spec: SpecDecode, max_model_len: int | None) -> None:
    """Reject lookahead slots no request could ever hold: a first step of one token plus
    the slots must fit the pool (every group allocates them) and stay below max_model_len."""
    def first_step(la: int) -> int:
        return sum(-(-(1 + la) // g.spec.block_size) for g in config.groups)

    usable = config.num_blocks - 1
    la = spec.lookahead_slots
    limit = 0                                 # the largest lookahead that fits the pool
    hi = usable * max(g.spec.block_size for g in config.groups)
    while limit < hi:                         # first_step is non-decreasing in la
        mid = (limit + hi + 1) // 2
        if first_step(mid) <= usable:
            limit = mid
        else:
            hi = mid - 1
    why = f"the pool's {usable} usable blocks"
    if max_model_len is not None and max_model_len - 1 < limit:
        limit, why = max_model_len - 1, f"max_model_len={max_model_len}"
    if la > limit:
        extra = la - spec.num_speculative_tokens   # DFlash: one slot more than k
        raise ValueError(
            f"SpecDecode({spec.method!r}, {spec.num_speculative_tokens}) needs {la} lookahead "
            f"slots per request, more than {why} allow ({limit}); valid "
            f"num_speculative_tokens: 1..{limit - extra}"
            if limit - extra >= 1 else
            f"SpecDecode({spec.method!r}, {spec.num_speculative_tokens}) needs {la} lookahead "
            f"slots per request and {why} allow {limit}: no speculative decoding fits; give "
            "more blocks or a larger max_model_len")


def check_fits(config: KVCacheConfig, max_len: int, *, retention_interval: int | None,
               vllm_compat: bool, hold: int | None = None) -> None:
    """Reject a ``max_model_len`` one request of which cannot fit the pool (``hold``: as
    :func:`blocks_for_request`)."""
    need = blocks_for_request(config, max_len, retention_interval=retention_interval,
                              vllm_compat=vllm_compat, hold=hold)
    if need > config.num_blocks - 1:
        raise ValueError(
            f"the pool has {config.num_blocks - 1} usable blocks but one request of "
            f"max_model_len={max_len} tokens needs {need} across the groups; give more blocks "
            "or a smaller max_model_len"
        )

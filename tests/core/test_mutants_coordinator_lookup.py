"""Tests that kill the mutants mutmut found surviving in the lookup and caching side of
``src/hybridkv/core/coordinator.py`` (TESTING.md, "Mutation testing: core/coordinator.py,
lookup and caching side"): ``find_longest_hit`` and its fixed point, ``find_external_hit``,
the write path (``cache``, ``_cache_prefix``, ``_cache_ends``, ``_insert_span``), vLLM's
write mask in compat mode (``_write_mask``, ``_mask_ends``, ``_compat_limits``) and the
promised boundaries (``_boundaries``).

Public API only (``KVCacheManager``, ``Request``, the specs, ``lookup`` / ``allocate`` /
``free`` / ``block_ids`` / ``take_events`` / ``lookup_external`` / ``check_integrity``; the
cached positions are read with ``tests.core.helpers.cached_positions``, which compares a
table's blocks with the request's hashes). Expectations are derived by hand from the
documented contract (docstrings, ARCHITECTURE.md, /work/shared/reference/vllm-kv-core.md) in
each docstring. All deterministic and fast: mutmut runs them for every mutant.
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, SpecDecode
from tests.core.helpers import FA, SWA, cached_positions, config, manager, run_prompt

EAGLE_DROP = SpecDecode("eagle", 1, hash_lookahead=False)


def prompt(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


# ---- compat mode, retention 0: vLLM's write mask ----------------------------------------------

def _vllm_mask(p: int, a: int, bs: int, window: int, proof: int, drop: bool,
               junction: int = 0) -> set[int]:
    """vLLM 0.33's SWA write mask for retention 0 (reference §1.13, SlidingWindowManager
    .reachable_block_mask), written from the reference, not from hybridkv: the reachable
    boundaries are the replay boundaries (``P - 1``; EAGLE drop mode: ``max((P-1)//A*A - A, 0)``
    and ``max(P//A*A - A, 0)``), the junction and (EAGLE groups) ``junction - block_size``; each
    aligned down to A keeps the ``need = cdiv(W - 1, bs)`` blocks before it, plus the block
    after it in an EAGLE group (the proof block), never below block 0."""
    need = -(-(window - 1) // bs)
    ends = [max((p - 1) // a * a - a, 0), max(p // a * a - a, 0)] if drop else [p - 1]
    if junction:
        ends.append(junction)
        if proof:
            ends.append(junction - bs)
    out: set[int] = set()
    for b in ends:
        if b < 0:
            continue
        e = b // a * a // bs
        out |= set(range(max(e - need, 0), e + proof))
    return out


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [5, 8, 9, 12, 13, 16, 17, 20, 23, 24, 25])
def test_compat_mask_of_one_sliding_group_keeps_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _write_mask — vLLM's replay boundaries (``p - 1``; EAGLE
    drop mode's ``{resend - A, extension - A}`` pair, 0 kept) moved by one token or one
    unit, ``max(.., 0)`` → ``max(.., 1)``, end 0 dropped: other blocks cached.

    Compat mode, retention 0, one SWA group (bs 4, W 8: need 2; A 4), drop mode with the
    group as the drafter (proof block). A one-shot prefill of p tokens: the unitary coordinator
    caches up to p // 4 blocks (all hashed), exactly the masked ones (:func:`_vllm_mask`)."""
    spec = EAGLE_DROP if drop else None
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=spec,
                 drafts=(0,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    want = {j for j in _vllm_mask(p, 4, 4, 8, int(drop), drop) if j < p // 4}
    assert cached_positions(kv, r, 0) == want
    kv.check_integrity()


@pytest.mark.parametrize("drop", [False, True])
@pytest.mark.parametrize("p", [9, 16, 17, 20, 24, 25, 31, 32, 33, 40])
def test_compat_mask_of_a_hybrid_aligns_the_replay_windows(drop, p) -> None:
    """coordinator: _mask_ends / _compat_limits — the boundaries aligned down to A = 8 in the
    group's 4-token blocks; the hybrid coordinator's cacheable prefix (``align(n)``; an EAGLE
    group ``min(n, align(n) + bs)``).

    Compat mode, retention 0, full (bs 8) + SWA (bs 4, W 8: need 2); drop mode with the SWA
    group as the only drafter. After a one-shot prefill of p tokens the SWA group has cached
    the masked blocks below its cacheable prefix: ``align8(p) // 4`` blocks, or with the proof
    block ``min(p, align8(p) + 4) // 4``."""
    spec = EAGLE_DROP if drop else None
    kv = manager(FA(8), SWA(4, 8), num_blocks=60, retention=0, spec_decode=spec,
                 drafts=(1,) if drop else ())
    r, _ = run_prompt(kv, "r", prompt(100, p))
    aligned = p // 8 * 8
    limit = min(p, aligned + 4) // 4 if drop and aligned else aligned // 4
    want = {j for j in _vllm_mask(p, 8, 4, 8, int(drop), drop) if j < limit}
    assert cached_positions(kv, r, 1) == want
    assert cached_positions(kv, r, 0) == set(range(aligned // 8))   # full: every block
    kv.check_integrity()


def test_compat_mask_without_a_hit_pins_no_junction() -> None:
    """coordinator: _mask_ends — a new request allocated with ``hit=None`` given junction 1
    instead of 0 (its end 0 then masks block 0 of an EAGLE group).

    Compat mode, retention 0, drop mode, SWA (bs 4, W 8) drafter; 40 tokens allocated without
    a lookup: the replay ends are 32 and 36 (blocks 8 and 9), masked [6, 9) ∪ [7, 10) = 6..9;
    block 0 is not among them."""
    kv = manager(SWA(4, 8), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r = Request("r", prompt(100, 40))
    assert kv.allocate(r, 40, None) is not None
    r.num_computed_tokens = 40
    assert cached_positions(kv, r, 0) == {6, 7, 8, 9}


def test_compat_mask_of_a_one_token_prompt_in_drop_mode() -> None:
    """coordinator: _mask_ends — ``max(.., 0)`` → ``max(.., 1)`` for either end of the EAGLE
    pair (visible only with alignment 1).

    Compat mode, retention 0, drop mode, SWA (bs 1, W 9: need 8) drafter, A = 1. A one-token
    prompt's pair is ``{max(0 - 1, 0), max(1 - 1, 0)} = {0}``: only span(0) = [0, 1) is
    masked. Three decode steps later (4 tokens computed and hashed, nothing out of the window
    yet) block 0 is still the only cached block; an end 1 would have masked block 1 too."""
    kv = manager(SWA(1, 9), num_blocks=40, retention=0, spec_decode=EAGLE_DROP, drafts=(0,))
    r, _ = run_prompt(kv, "r", [7])
    for tok in (8, 9, 10):
        r.append_tokens([tok])
        assert kv.allocate(r, 1) is not None
        r.num_computed_tokens += 1
    assert 0 not in kv.block_ids(r)[0]
    assert cached_positions(kv, r, 0) == {0}

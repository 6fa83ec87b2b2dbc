"""Tests that kill the mutants mutmut found surviving in ``src/hybridkv/core/coordinator.py``
(TESTING.md, "Mutation testing"; the pool's are in ``test_mutants.py``).

Each test names the mutant(s) it guards (``function — the change``). They use only the public
API (``KVCacheManager``, ``Request``, the specs/config, ``lookup`` / ``allocate`` / ``free`` /
``block_ids`` / ``state_blocks`` / ``export_positions`` / ``take_events`` / ``stats`` /
``check_integrity``, ``lookup_external`` / ``commit_external``); expectations are derived by
hand in the docstrings. All are deterministic and fast (mutmut runs them for every mutant).
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, StateSpec
from tests.core.helpers import FA, config

STATE4 = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")


def prompt(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


# ---- export_positions -----------------------------------------------------------------------

def _state_manager_with_a_served() -> tuple[KVCacheManager, list[int]]:
    """Full (bs 4) + state (bs 4), retention N = 8: "a" (22 tokens, chunks 5, 5, 5, 7)
    leaves checkpoints at 8 and 16 (multiples of N) and 20 (its replay boundary (22-1)//4*4)."""
    kv = KVCacheManager(config(FA(4), STATE4, num_blocks=200), retention_interval=8)
    A = prompt(100, 22)
    a = Request("a", A)
    hit = kv.lookup(a)
    want = [[], [8], [], [16, 20]]
    for n, w in zip((5, 5, 5, 7), want):
        first = hit if a.num_computed_tokens == 0 else None
        assert kv.export_positions(a, n, first) == w
        assert kv.allocate(a, n, first) is not None
        assert [e.position for e in kv.state_blocks(a)[0].exports] == w
        a.num_computed_tokens += n
    kv.free(a)
    return kv, A


@pytest.mark.parametrize("chunks, want", [((5, 8, 8), ([12], [16, 20], [24])),
                                          ((3, 5, 8), ([], [12, 16], [20, 24]))])
def test_export_positions_predict_every_allocation_after_a_junction_hit(chunks, want) -> None:
    """coordinator: export_positions — the hit's tokens not added to (or subtracted from) the
    computed count, the hit not passed on, or a running request's state ignored (its
    promised junction forgotten): the prediction must equal the exports the allocation asks.

    "b" shares a's first 14 tokens (24 tokens): the full group serves 12, the state group
    only 8 (its checkpoints are 8, 16, 20), so the hit is 8 with junction 12. b's promised
    ends: multiples of 8, the junction 12 (and 12 - 4 = 8), its replay boundary 20 (and 16).
    Chunks 5, 8, 8 from 8: (8, 13] → 12, (13, 21] → 16, 20, (21, 29] ∩ ≤ 24 → 24. Chunks 3, 5,
    8: (8, 11] → none, (11, 16] → 12, 16 (the junction in a running request's step), then 20, 24."""
    kv, A = _state_manager_with_a_served()
    b = Request("b", A[:14] + prompt(500, 10))
    hit = kv.lookup(b)
    assert (hit.num_tokens, hit.shared_prefix_boundary) == (8, 12)
    b.num_computed_tokens = 0
    for i, (n, w) in enumerate(zip(chunks, want)):
        first = hit if i == 0 else None
        assert kv.export_positions(b, n, first) == w
        assert kv.allocate(b, n, first) is not None
        assert [e.position for e in kv.state_blocks(b)[0].exports] == w
        b.num_computed_tokens = (hit.num_tokens if i == 0 else b.num_computed_tokens) + n
        kv.check_integrity()

"""Tests that kill the allocation-side mutants of ``src/hybridkv/core/coordinator.py`` that
mutmut's third coordinator run left surviving (TESTING.md, "Mutation testing: core/coordinator.py,
allocation side (stop 21)"): ``plan``, ``commit``, ``allocate``, ``free`` and their helpers.

Public API only (``KVCacheManager``, ``Request``, the specs/config, ``lookup`` / ``allocate`` /
``free`` / ``block_ids`` / ``state_blocks`` / ``take_events`` / ``check_integrity``);
expectations are derived by hand in the docstrings. Deterministic and fast.
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request, StateSpec
from tests.core.helpers import FA, SWA, config

STATE1 = StateSpec(block_size=1, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")
STATE4 = StateSpec(block_size=4, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")


def prompt(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


# ---- free: the final length of a state request ---------------------------------------------

@pytest.mark.parametrize("computed, hit_after", [(1, 1), (2, 2), (3, 3)])
def test_a_state_request_freed_after_its_first_tokens_serves_them(computed, hit_after) -> None:
    """coordinator: _free_states — at free the live state is re-tagged as the checkpoint at
    the final aligned length whenever that length is > 0 (``computed > 0``) and the length is
    then promised to the other groups (``servable = end > 0``); with ``> 1`` a request freed
    after exactly one token would drop its state and serve nothing.

    Full (bs 1) + state (bs 1): alignment 1. Retention N = 8 and a 20-token prompt (replay
    boundaries 19, 18): no promised end below 8, so no checkpoint is exported during the
    first ``computed`` tokens. Freed then, the final length ``computed`` is promised: the
    full group caches its blocks, the state group keeps its live state there, so a new
    request with the same first tokens hits ``computed``."""
    kv = KVCacheManager(config(FA(1), STATE1, num_blocks=100), retention_interval=8)
    P = prompt(100, 20)
    r = Request("r", P)
    assert kv.allocate(r, computed, kv.lookup(r)) is not None
    assert kv.state_blocks(r)[0].exports == ()
    r.num_computed_tokens = computed
    kv.free(r)
    kv.check_integrity()
    q = Request("q", P[:computed] + prompt(500, 5))
    assert kv.lookup(q).num_tokens == hit_after

"""Soft retention against hard pins, block by block (``hybridkv.core.eviction.hint_layer``,
"Hard and soft pins"): a soft pin is refreshed by every release of its blocks, hinted or not,
comes back after it decayed when the blocks are used again, and is broken before any other
pin. Same set-up as ``test_hint_layer_blocks.py`` (forced hints, 4-token blocks, names
``"<request><index>"``, chains freed tail first)."""

from __future__ import annotations

from hybridkv import Hint
from tests.core.eviction.test_hint_layer_blocks import T0, Pool, chain


def _reread_then_fill(soft: bool) -> tuple[list[str], object]:
    """p pinned 10 s at T0; at T0 + 8 an unhinted p2 re-reads it (20 tokens: hit 16, new block
    p20), then n; at T0 + 15 a request needs all 12 blocks."""
    pool = Pool(12)
    pool.serve("p", 100, Hint(session="P", pin_s=10.0, soft=soft))
    pool.clock.now = T0 + 8.0
    assert pool.serve("p2", 100, tokens=20) == 16
    pool.serve("n", 500)
    pool.clock.now = T0 + 15.0
    pool.fill("x", 12)
    return pool.evicted, pool.kv.hint_stats()


def test_a_hit_refreshes_a_soft_pin_and_not_a_hard_one() -> None:
    """Hard: the pin ends at T0 + 10 (the unhinted re-read does not extend it): at T0 + 15 p's
    blocks have lapsed and go first (demoted), then LRU: p20, n. Soft: the re-read at T0 + 8
    extends it to T0 + 18: p20 and n go first, p's 4 pins are broken last."""
    hard, st = _reread_then_fill(False)
    assert hard == [*chain("p"), "p20", *chain("n")]
    assert (st.pins_lapsed, st.pins_broken, st.soft_refreshes) == (4, 0, 0)
    soft, st = _reread_then_fill(True)
    assert soft == ["p20", *chain("n"), *chain("p")]
    assert (st.pins_lapsed, st.pins_broken, st.soft_refreshes) == (0, 4, 4)


def test_a_decayed_soft_pin_comes_back_when_the_blocks_are_used_again() -> None:
    """p pinned 10 s at T0; unused until T0 + 20 (decayed), then an unhinted p2 re-reads it and
    n follows; at T0 + 25 a request needs all 12 blocks. Soft: the re-read retains p's blocks
    another 10 s (SGLang's rule: the priority holds while the idle time is under the
    retention), so p20 and n go first; hard: the pin is spent, LRU order (p2's release before
    n's)."""
    for soft, expected in ((True, ["p20", *chain("n"), *chain("p")]),
                           (False, ["p20", *chain("p"), *chain("n")])):
        pool = Pool(12)
        pool.serve("p", 100, Hint(session="P", pin_s=10.0, soft=soft))
        pool.clock.now = T0 + 20.0
        assert pool.serve("p2", 100, tokens=20) == 16
        pool.serve("n", 500)
        pool.clock.now = T0 + 25.0
        pool.fill("x", 12)
        assert pool.evicted == expected, soft


def test_soft_pins_are_broken_before_predicted_and_hard_ones() -> None:
    """Freed at T0: h (hard, 100 s), r (resumes in 20 s: 31 s), s (soft, 200 s), then n. A
    request needs all 16 blocks at T0 + 1: n (the policy's), then the soft pin although it
    lasts longest, then the predicted return, then the hard pin."""
    pool = Pool(16)
    pool.serve("h", 100, Hint(session="H", pin_s=100.0))
    pool.serve("r", 200, Hint(session="R", resume_s=20.0))
    pool.serve("s", 300, Hint(session="S", pin_s=200.0, soft=True))
    pool.serve("n", 500)
    pool.clock.now = T0 + 1.0
    pool.fill("x", 16)
    assert pool.evicted == [*chain("n"), *chain("s"), *chain("r"), *chain("h")]
    assert pool.kv.hint_stats().pins_broken == 12

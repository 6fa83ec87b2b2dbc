"""``s3fifo`` (``eviction/s3fifo.py``): a small FIFO for new content, a main queue with second
chances (hit counts capped at 3), and a ghost of recently evicted hashes that readmits
recomputed content to main.
"""

from __future__ import annotations

import pytest

from hybridkv.core.eviction import S3FIFOPolicy
from tests.support.helpers import content_key
from tests.support.policies import Cache


@pytest.mark.parametrize("ratio", [0, 0.0, 1, 1.0, -0.5, 1.5])
def test_s3fifo_small_ratio_must_be_a_fraction(ratio):
    with pytest.raises(ValueError) as exc:
        S3FIFOPolicy(small_ratio=ratio)
    assert str(exc.value) == f"small_ratio must be in (0, 1), got {ratio!r}"


def test_s3fifo_small_queue_goes_first_only_while_over_its_share():
    """Victims come from ``small`` while it holds more than 10 % of the held blocks (or ``main``
    is empty), else from ``main``, where a hit block gets a second chance (count - 1, back to
    the end). 11 blocks: contents 1..10 hit once (main, tail first: 10, 9, .., 1), 100 never
    hit (small). Draining: small 1 of 11 (not > 1.1) -> main: every block spends its hit going
    round once, then 10 leaves; small 1 of 10 (not > 1.0) -> 9 leaves; small 1 of 9 (> 0.9)
    -> 100 leaves; then main in order."""
    c = Cache(S3FIFOPolicy(), 12)
    chain = list(range(1, 11))
    c.serve(chain)
    assert c.serve(chain) == 10
    c.serve([100])
    assert c.drain() == [10, 9, 100, 8, 7, 6, 5, 4, 3, 2, 1]


def test_s3fifo_small_exactly_at_its_share_is_not_over_it():
    """small_ratio 0.5, 2 blocks in small and 2 in main: 2 is not more than half of 4, so the
    victim comes from main (its hit spent first: both main blocks go round, then 2 leaves);
    then small 2 of 3 is over half: 11 leaves; small 1 of 2 is not: 1 (main); then 12."""
    c = Cache(S3FIFOPolicy(small_ratio=0.5), 5)
    c.serve([1, 2])
    c.serve([1, 2])                                 # main: 2, 1 (freed tail first), one hit each
    c.serve([11])
    c.serve([12])                                   # small: 11, 12
    assert c.drain() == [2, 11, 1, 12]


def test_s3fifo_hit_counts_cap_at_three():
    """A block's hit count is capped at 3 and starts at 0: content 1 hit 5 times and content 2
    hit 3 times have the same count, so in main (1 ahead of 2) they spend their three chances
    in turn and 1 leaves first (uncapped, 2 would run out first). Hit 3 times against twice,
    the block behind leaves first."""
    c = Cache(S3FIFOPolicy(), 3)
    for _ in range(6):
        c.serve([1])
    for _ in range(4):
        c.serve([2])
    assert c.drain() == [1, 2]
    # content 1 hit 3 times, content 2 twice: 2 runs out first although it is behind 1
    c = Cache(S3FIFOPolicy(), 3)
    for _ in range(4):
        c.serve([1])
    for _ in range(3):
        c.serve([2])
    assert c.drain() == [2, 1]


def test_s3fifo_counts_a_hit_on_a_block_in_use():
    """A hit on a block another request holds counts too (on_hit with held False): content 1,
    read twice by two overlapping requests, has 2 hits; content 2 has 1 (3 > 2 would not
    pass with a lost hit). main: 2 then 1 (1 freed last). Drain: 2 (1 -> 0, round), 1 (2 ->
    1, round), 2 leaves, 1 (1 -> 0, round), 1 leaves."""
    c = Cache(S3FIFOPolicy(), 4)
    c.serve([1])
    c.serve([2])
    c.serve([2])                                    # 2: one hit, main
    b = c.block(1)
    c.pool.touch([b])                               # request x hits 1 (leaves small)
    c.pool.touch([b])                               # request y hits 1 while x holds it
    c.pool.free([b])
    c.pool.free([b])                                # now free: 2 hits -> main
    c.pool.check()
    assert c.drain() == [2, 1]
    # the same with a single reader: 1 hit each, 2 ahead of 1, so the order is the same; but
    # a third content hit once and freed between shows the count: 1 (count 2) outlives it
    c = Cache(S3FIFOPolicy(), 5)
    for t in (1, 2, 3):
        c.serve([t])
    c.serve([2])
    b = c.block(1)
    c.pool.touch([b])
    c.pool.touch([b])
    c.pool.free([b, b])
    c.serve([3])                                    # main: 2, 1, 3 (one, two, one hits)
    assert c.drain() == [2, 3, 1]


def test_s3fifo_ghost_readmits_recomputed_content_to_main():
    """Content evicted from ``small`` is remembered (ghost, up to num_blocks - 1 = 3 hashes);
    computed again while remembered it enters ``main``, so the one-off blocks after it leave
    first. 4 blocks (3 usable):

    serve 1, 2, 3 (small 1 2 3); 4 evicts 1 (ghost 1); 5 evicts 2 (ghost 1 2); computing 1
    again evicts 3 (ghost 1 2 3, at capacity) and 1 is readmitted to main. small 4 5, main 1:
    6 evicts 4, 7 evicts 5, 8 evicts 6 (small 6 7 is over 10 %); the drain: 7, 8, then 1."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 5, 1, 6, 7, 8):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 3, 4, 5, 6]
    assert c.drain() == [7, 8, 1]


def test_s3fifo_ghost_forgets_beyond_num_blocks_minus_one():
    """The ghost keeps num_blocks - 1 = 3 hashes: after 1, 2, 3, 4 were evicted from small,
    1 is forgotten (computing it again files it in small), 2 is remembered (main).

    serve 1, 2, 3; 4, 5, 6 evict 1, 2, 3 (ghost 1 2 3); computing 1 evicts 4 (ghost 2 3 4):
    1 goes to small (5 6 1). 7 evicts 5, 8 evicts 6, 9 evicts 1 (small FIFO)."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 5, 6, 1, 7, 8, 9):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 3, 4, 5, 6, 1]


def test_s3fifo_forgets_a_reallocated_blocks_hits():
    """A block's hit count lasts until its id is reallocated (forget): block b holds content 1,
    is hit (count 1), loses its hash while held (drop_hash) and returns as scratch; reused for
    content 2, it is a block never hit, so it is filed in small (not main): the drain takes
    small in FIFO order 2, 3, 4 (with the stale count, 2 would sit in main and leave last)."""
    c = Cache(S3FIFOPolicy(), 4)
    pool = c.pool
    b, = pool.allocate(1)
    pool.insert(0, content_key(1), b)
    pool.free([b])
    pool.touch([b])
    pool.drop_hash(b)
    pool.free([b])
    assert pool.allocate(1) == [b]                   # scratch is reused first
    pool.insert(0, content_key(2), b)
    pool.free([b])
    c.serve([3])
    c.serve([4])
    assert c.drain() == [2, 3, 4]


def test_s3fifo_second_chances_carry_over_between_evictions():
    """The hit count a main block keeps after one eviction is what it spends at the next, and
    a ghost-readmitted block (no hits) leaves main at its turn without a chance. 3 usable
    blocks: 1, 2, 3 (small); 4 evicts 1 (ghost); 1 again evicts 2 and is readmitted (main);
    4 and 3 are hit (main: 1, 4, 3, one hit each for 4 and 3); 5 evicts 1 (main's head, no
    hit); 2 again evicts 5 (small) and is readmitted to main behind 4 and 3, which still hold
    their hit: the drain spends 4's and 3's chances, so 2 leaves first, then 4, then 3."""
    c = Cache(S3FIFOPolicy(), 4)
    for t in (1, 2, 3, 4, 1):
        assert c.serve([t]) == 0
    assert c.serve([4]) == 1
    assert c.serve([3]) == 1
    for t in (5, 2):
        assert c.serve([t]) == 0
    assert c.evicted == [1, 2, 1, 5]
    assert c.drain() == [2, 4, 3]


def test_s3fifo_check_rejects_a_corrupted_state():
    """check(): a block in both queues (the first five ids named) and a ghost over
    num_blocks - 1 hashes are reported."""
    c = Cache(S3FIFOPolicy(), 8)
    c.serve([1, 2, 3, 4, 5, 6, 7])
    pol = c.policy
    for b in list(pol.small):
        pol.main[b] = None
    with pytest.raises(AssertionError) as exc:
        pol.check()
    assert str(exc.value) == "s3fifo: blocks [1, 2, 3, 4, 5] are in both queues"
    for n in (2, 8):
        c = Cache(S3FIFOPolicy(), n)
        c.serve([1])
        for k in range(n - 1):
            c.policy.ghost[content_key(100 + k)] = None
        c.policy.check()                                 # n - 1: at capacity
        c.policy.ghost[content_key(99)] = None
        with pytest.raises(AssertionError) as exc:
            c.policy.check()
        assert str(exc.value) == "s3fifo: ghost queue over its capacity"

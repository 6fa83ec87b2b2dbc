"""``KVCacheManager.check_integrity``'s verdicts (white box).

The check is public API and must reject a corrupted manager. The public API cannot corrupt
one, so these tests break one thing at a time by hand (a table entry, a ref count's reference)
in a manager that passed the check just before, and assert the check raises
``AssertionError`` naming what broke. The pool's own check: ``test_pool.py``.
"""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request
from tests.support.helpers import FA, manager, prompt, run_prompt


def _held_prompt() -> tuple[KVCacheManager, Request]:
    """Two full-attention groups (bs 4), vLLM-compat caching (every full block is cached):
    request "a" holds 12 computed tokens, three cached blocks per group, and has three block
    hashes; request "b" ran a different prompt and was freed, so its blocks are cached and
    free. The manager passes the check."""
    kv = manager(FA(4), FA(4), num_blocks=32)
    b, _ = run_prompt(kv, "b", prompt(1000, 12))
    kv.free(b)
    a, _ = run_prompt(kv, "a", prompt(0, 12))
    assert len(a.block_hashes) == 3
    assert [len(t) for t in kv.block_ids(a)] == [3, 3]
    kv.check_integrity()
    return kv, a


def _tables(kv: KVCacheManager, req: Request) -> list[list[int]]:
    """The request's live block tables (white box: the corruption tests edit them)."""
    return kv.coordinator.reqs[req.request_id].tables


def test_integrity_rejects_a_block_at_another_requests_position() -> None:
    """check_integrity — the hash-position check skipped (the request or the block's hash read
    as None, ``or`` → ``and``) or its message lost.

    Swapping group 0's first two entries keeps every ref count and the pool intact, but the
    block at position 0 is cached under the request's hash for position 1: the check must name
    position 0 and that block."""
    kv, a = _held_prompt()
    t = _tables(kv, a)[0]
    first = t[0]
    t[0], t[1] = t[1], t[0]
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 position 0: block {t[0]} is "
                       r"cached under a hash that is not the request's hash for that position$"):
        kv.check_integrity()
    assert first == t[1]


def test_integrity_rejects_a_cached_block_past_the_requests_hashes() -> None:
    """check_integrity — ``k > len(hashes)`` for ``>=``: a cached block at the position just
    past the request's last hash read the hash list out of range (an IndexError, not the
    checker's verdict).

    Appending a cached free block (request "b"'s first) at position 3 of "a"'s 3-hash table."""
    kv, a = _held_prompt()
    pool = kv.pool
    other = next(x for x in range(1, len(pool.ref_cnt)) if pool.block_hash[x] is not None
                 and pool.ref_cnt[x] == 0 and pool.block_group[x] == 0)
    _tables(kv, a)[0].append(other)
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 position 3: block {other} is "
                       r"cached under a hash that is not the request's hash for that position$"):
        kv.check_integrity()


def test_integrity_rejects_a_block_cached_for_another_group() -> None:
    """check_integrity — the group check's message lost.

    Swapping the first entries of groups 0 and 1: each table now holds a block cached for the
    other group; the check names group 0's entry first."""
    kv, a = _held_prompt()
    t0, t1 = _tables(kv, a)
    b0, b1 = t0[0], t1[0]
    t0[0], t1[0] = b1, b0
    with pytest.raises(AssertionError, match=rf"^request 'a' group 0 holds block {b1} cached for "
                       r"group 1$"):
        kv.check_integrity()


def test_integrity_rejects_a_block_id_the_pool_never_handed_out() -> None:
    """check_integrity — ``b <= len(refs)`` (the first id past the pool's ids then indexes the
    ref list out of range: an IndexError, not the verdict); the message lost.

    The first id past the pool's per-block lists is put into "a"'s group 1 table."""
    kv, a = _held_prompt()
    bad = len(kv.pool.ref_cnt)
    _tables(kv, a)[1][2] = bad
    with pytest.raises(AssertionError, match=rf"^request 'a' group 1 holds block {bad}, which the "
                       r"pool never handed out$"):
        kv.check_integrity()


def test_integrity_rejects_a_ref_count_without_its_table_reference() -> None:
    """check_integrity — the ref-count comparison skipped, started at block 2, or its message
    lost.

    A fresh pool hands out block 1 first, so request "a" holds it (ref_cnt 1). Replacing that
    table entry with the null block leaves ref_cnt 1 with 0 table references: the check must
    name block 1 and both counts."""
    kv = manager(FA(4), FA(4), num_blocks=32)
    a, _ = run_prompt(kv, "a", prompt(0, 12))
    kv.check_integrity()
    tables = _tables(kv, a)
    (g, j), = [(g, j) for g, t in enumerate(tables) for j, b in enumerate(t) if b == 1]
    assert kv.pool.ref_cnt[1] == 1
    tables[g][j] = 0
    with pytest.raises(AssertionError, match=r"^block 1: ref_cnt 1 but 0 table references$"):
        kv.check_integrity()

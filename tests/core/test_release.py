"""Release (``core/coordinator/release.py``): blocks leaving a window, and ``free``.

* the blocks that leave a window (several in one step, in several groups) are released before
  the step and available to it; only default-mode windows keep a hold;
* a released or freed block gets the request's retention marks first;
* ``free`` caches the final length in default mode only (as vLLM, compat mode only releases),
  is a no-op for an unknown id, and lets the Request go.
"""

from __future__ import annotations

import gc
import weakref

import pytest

from hybridkv import BlockStored, KVCacheManager, Request, SpecDecode
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from tests.support.helpers import FA, SWA, admit, config, prompt, serve
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams


def test_the_blocks_two_windows_release_in_one_step_are_all_available() -> None:
    """coordinator: plan — ``freed_total += freed`` summed over the groups (``=`` keeps only
    the last group's): the blocks every window releases before the step's new blocks are
    popped count as available.

    Two sliding groups (bs 4, W 5), dense retention (no hold), 4 usable blocks. r (20 tokens)
    takes 2 blocks per group for its first 8 tokens: the pool is empty. At 8 computed each
    window skips 8 - 5 + 1 = 4 tokens, so each group releases block 0 (last reference) and
    needs 1 new block for tokens 8..11: 2 needed, 0 free + 2 released available → it fits."""
    kv = KVCacheManager(config(SWA(4, 5), SWA(4, 5), num_blocks=5), CacheOptions(retention_interval=None))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8)
    assert kv.num_free_blocks == 0
    got = kv.allocate(r, 4)
    assert got is not None and [len(g) for g in got] == [1, 1]
    assert [t[0] for t in kv.block_ids(r)] == [0, 0]
    kv.check_integrity()


@pytest.mark.parametrize("priority, hits", [(100, (4, 0)), (0, (0, 4))])
def test_a_block_leaving_the_window_keeps_its_retention_marks(priority, hits) -> None:
    """coordinator: _release — a block that leaves the window of a request carrying a
    retention config gets the request's marks before it is freed (the ``priority`` policy
    then evicts by them); without them it would go in LRU order.

    One sliding group (bs 4, W 5), dense retention (no hold), ``priority`` eviction, 4
    usable blocks. r (16 tokens) marks tokens 0..3 with ``priority``; at 8 computed its
    step to 12 releases block 0 (cached). y (4 tokens) is then served and freed (a cached
    block, default priority, freed later). z needs one block with none fresh left: it
    evicts y's block if r's block is pinned (100), else r's older, lower-priority one. A
    lookup of r's first 4 tokens (+1) then hits 4 or 0, one of y's the other way round."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=5), CacheOptions(
        eviction_policy="priority", retention_interval=None))
    r = Request("r", prompt(100, 16), RequestCacheParams(
        retention=RetentionConfig((TokenRange(0, 4, priority),))))
    admit(kv, r, 8)
    assert kv.allocate(r, 4) is not None
    r.num_computed_tokens = 12
    assert kv.block_ids(r)[0][0] == 0
    y = Request("y", prompt(700, 4))
    admit(kv, y, 4)
    kv.free(y)
    z = Request("z", prompt(900, 3))
    assert kv.allocate(z, 3, kv.lookup(z)) is not None
    assert (kv.lookup(Request("q", prompt(100, 5))).num_tokens,
            kv.lookup(Request("q2", prompt(700, 5))).num_tokens) == hits
    kv.check_integrity()


@pytest.mark.parametrize("compat, retention, kept_at_12, kept_at_16",
                         [(True, 0, False, False), (False, 0, True, True),
                          (False, None, True, False)])
def test_only_default_mode_windows_keep_a_hold(compat, retention, kept_at_12, kept_at_16) -> None:
    """coordinator: __init__ — the hold (tokens a window keeps past its edge) is 0 in compat
    mode, as in vLLM, even for a drafter's proof block; in default mode it is the proof
    block (drop mode), plus one alignment unit with sparse retention (the final end sits up
    to a proof block and an alignment unit below the computed tokens).

    One sliding group (bs 4, W 5), EAGLE without hash lookahead (drop mode: the group
    carries the proof; alignment 4). r (20 tokens) steps 8, 4, 4, 4. At 8 computed vLLM skips
    8 - 5 + 1 = 4 tokens (block 0 leaves at the step from 8); with a hold of 4 (dense) the
    skip reaches 4 tokens at 12 computed (block 0 leaves at the step from 12); with a hold
    of 4 + 4 (sparse) at 16 (block 0 leaves at the step from 16)."""
    kv = KVCacheManager(config(SWA(4, 5), num_blocks=30), CacheOptions(
        vllm_compat=compat, retention_interval=retention, spec_decode=SpecDecode("eagle", 1,
        hash_lookahead=False)))
    r = Request("r", prompt(100, 20))
    admit(kv, r, 8, num_lookahead_tokens=0)
    assert kv.allocate(r, 4, num_lookahead_tokens=0) is not None
    r.num_computed_tokens = 12
    assert (kv.block_ids(r)[0][0] != 0) == kept_at_12
    assert kv.allocate(r, 4, num_lookahead_tokens=0) is not None
    r.num_computed_tokens = 16
    assert (kv.block_ids(r)[0][0] != 0) == kept_at_16
    assert kv.allocate(r, 4, num_lookahead_tokens=0) is not None
    r.num_computed_tokens = 20
    assert kv.block_ids(r)[0][0] == 0
    kv.check_integrity()


@pytest.mark.parametrize("priority, hits", [(100, (4, 0)), (0, (0, 4))])
def test_a_freed_request_gives_its_blocks_its_retention_marks(priority, hits) -> None:
    """coordinator: free — every table of a request carrying a retention config gives its
    blocks the request's marks when it is freed (the ``priority`` policy then evicts by
    them).

    Full (bs 4), ``priority`` eviction, 3 usable blocks. r (5 tokens) marks tokens 0..3
    with ``priority`` and is freed (block 0 cached). y (4 tokens) is then served and freed
    (default priority, freed later); r's scratch block went back too. z (8 tokens) needs 2
    blocks: the scratch one and one cached block, y's if r's is pinned (100), else r's
    older, lower-priority one. Lookups of r's and y's prompts (+1) then hit 4 or 0."""
    kv = KVCacheManager(config(FA(4), num_blocks=4), CacheOptions(eviction_policy="priority"))
    r = Request("r", prompt(100, 5), RequestCacheParams(
        retention=RetentionConfig((TokenRange(0, 4, priority),))))
    admit(kv, r, 5)
    kv.free(r)
    y = Request("y", prompt(700, 4))
    admit(kv, y, 4)
    kv.free(y)
    z = Request("z", prompt(900, 8))
    assert kv.allocate(z, 8, kv.lookup(z)) is not None
    assert (kv.lookup(Request("q", prompt(100, 5))).num_tokens,
            kv.lookup(Request("q2", prompt(700, 5))).num_tokens) == hits
    kv.check_integrity()


def test_compat_free_caches_nothing() -> None:
    """coordinator: free — only default mode caches at free (the final-length promise); in
    compat mode, as vLLM's ``free``, freeing only releases blocks (``caching and not
    compat``).

    Compat, full (bs 4), EAGLE with hash lookahead (a block's hash needs the token after
    it). r (8-token prompt) computes 8 tokens: block 0 is stored, block 1 cannot be hashed
    yet. Its next token is appended (block 1 now hashable) and r is freed: nothing is
    stored at free."""
    kv = KVCacheManager(config(FA(4), num_blocks=30), CacheOptions(
        vllm_compat=True, enable_events=True, spec_decode=SpecDecode("eagle", 1)))
    r = Request("r", prompt(100, 8))
    admit(kv, r, 8)
    assert [list(e.token_ids) for e in kv.take_events() if isinstance(e, BlockStored)] == \
        [prompt(100, 4)]
    r.append_tokens([500])
    kv.free(r)
    assert [e for e in kv.take_events() if isinstance(e, BlockStored)] == []
    kv.check_integrity()


def test_a_window_releases_several_blocks_in_one_step() -> None:
    """coordinator: _released — ``j -= 1`` → ``j = 1``: releasing more than one block in one
    step (a long prefill chunk) walks the table back to front; the broken step loops for ever.

    Compat mode (no held unit), sliding W=4, bs 4, 19 usable blocks. Chunks of 4 and 16
    tokens hold blocks 0..4; at 20 computed tokens, tokens below 17 left the window: the next
    step releases blocks 0..3 at once (4 freed, 1 new: 14 + 4 - 1 = 17 free)."""
    kv = KVCacheManager(config(SWA(4, 4), num_blocks=20), CacheOptions(
        vllm_compat=True, retention_interval=None))
    r = Request("r", prompt(0, 24))
    for n in (4, 16, 4):
        assert kv.allocate(r, n) is not None
        r.num_computed_tokens += n
    table = kv.block_ids(r)[0]
    assert table[:4] == [0, 0, 0, 0] and 0 not in table[4:] and len(table) == 6
    assert kv.num_free_blocks == 17
    kv.check_integrity()


def test_free_of_an_unknown_request_is_refused_by_name_and_free_lets_the_request_go() -> None:
    """free — an unknown id passed silently (issue #44) or raised a bare KeyError, or the
    manager kept every freed Request alive (memory grew with every request served)."""
    kv = KVCacheManager(config(FA(4), num_blocks=16))
    with pytest.raises(ValueError, match=r"^free\('never'\): the request holds no blocks"):
        kv.free(Request("never", prompt(0, 3)))
    r = serve(kv, "a", prompt(0, 9))            # served and freed
    with pytest.raises(ValueError, match=r"^free\('a'\): the request holds no blocks"):
        kv.free(r)                                # twice
    ref = weakref.ref(r)
    del r
    gc.collect()
    assert ref() is None
    kv.check_integrity()


def test_the_max_model_len_check_counts_a_drop_modes_proof_hold() -> None:
    """KVCacheManager._check_fits; blocks_for_request(hold=) — full attention (bs 4) beside a
    window (bs 4, W 8), max_model_len 40: 10 full blocks + the window's 2 + 1 held alignment
    unit + 2 for a prefill chunk = 15; in EAGLE drop mode the window also holds the proof
    block (hold 4 + 4 = 8 tokens): 16. A 16-block pool (15 usable) fits the first only."""
    cfg = config(FA(4), SWA(4, 8), num_blocks=16)
    assert (KVCacheManager.blocks_for_request(cfg, 40), KVCacheManager.blocks_for_request(cfg, 40, hold=8)) == (15, 16)
    KVCacheManager(cfg, CacheOptions(max_model_len=40))
    with pytest.raises(ValueError, match=r"the pool has 15 usable blocks but one request of "
                                         r"max_model_len=40 tokens needs 16 across the groups"):
        KVCacheManager(cfg, CacheOptions(
            max_model_len=40, spec_decode=SpecDecode("eagle", 1, hash_lookahead=False)))

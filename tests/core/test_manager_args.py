"""Building a manager (``KVCacheManager.__init__``): arguments, and what must fit the pool.

* each argument check refuses a bad value naming it (bool is not an int) and accepts the
  smallest valid one; the defaults (no events, the given ``spec_decode`` kept);
* ``max_model_len`` must fit the pool, with the advice of how many blocks would;
* the lookahead limit: the largest ``num_speculative_tokens`` whose first step fits the pool
  and ``max_model_len`` (DFlash's extra slot counted), with its messages at the edges;
* ``blocks_for_request`` adds the alignment unit only in default mode.
"""

from __future__ import annotations

import pytest

from hybridkv import BlockRemoved, KVCacheManager, Request, SpecDecode
from tests.support.helpers import FA, SWA, config, prompt, serve
from hybridkv.core.cache_options import CacheOptions


BAD_MANAGERS = [  # (keyword arguments, key parts of the message)
    (dict(max_in_flight_tokens=0), r"\bmax_in_flight_tokens\b must be None or a positive integer, got 0$"),
    (dict(max_in_flight_tokens=True), r"\bmax_in_flight_tokens\b.*got True$"),
    (dict(max_in_flight_tokens=2.0), r"\bmax_in_flight_tokens\b.*got 2\.0$"),
    (dict(max_model_len=0), r"\bmax_model_len\b must be None or a positive integer, got 0$"),
    (dict(max_model_len=True), r"\bmax_model_len\b must be None or a positive integer, got True$"),
    (dict(max_model_len=8.0), r"\bmax_model_len\b must be None or a positive integer, got 8\.0$"),
    (dict(spec_decode="eagle"), r"\bspec_decode\b must be a SpecDecode or None, got 'eagle'$"),
    (dict(vllm_compat=True, eviction_policy="lfu"),
     r"\bvllm_compat\b pins vLLM's LRU order; \beviction_policy\b must be 'lru', got 'lfu'$"),
    (dict(eviction_policy="priority", clock=5),
     r"\bclock\b must be None or a callable returning seconds, got 5$"),
]


@pytest.mark.parametrize("kw,match", BAD_MANAGERS)
def test_bad_manager_arguments_are_refused_naming_the_value(kw, match) -> None:
    """__init__: each argument check (a bad value let through by an ``and``/``or`` swap, bool
    accepted) and its message (the argument, the bad value, what is valid)."""
    with pytest.raises(ValueError, match=match):
        KVCacheManager(config(FA(4), num_blocks=16),
                       CacheOptions(**{k: v for k, v in kw.items() if k != "clock"}), clock=kw.get("clock"))


def test_manager_needs_a_config() -> None:
    """__init__ — the config type check and its message (the type given)."""
    with pytest.raises(ValueError, match=r"^config must be a KVCacheConfig, got dict$"):
        KVCacheManager({"num_blocks": 4})


def test_smallest_valid_manager_arguments_are_accepted() -> None:
    """__init__ — max_in_flight_tokens 1 and max_model_len 1 are positive integers (1 was
    refused, 0 accepted), and a manager with them serves a one-token request."""
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(max_in_flight_tokens=1, max_model_len=1))
    assert kv.max_model_len == 1
    r = Request("r", [7])
    assert kv.allocate(r, 1) is not None
    kv.check_integrity()


def test_default_manager_records_no_events_and_keeps_its_spec_decode() -> None:
    """__init__ — events on by default, the eviction callback installed without events, or
    ``spec_decode`` not kept (the scheduler and the engine read it).

    A 3-block pool (2 usable, bs 4) serves two different 8-token prompts: the second evicts
    the first's cached blocks. take_events stays empty without ``enable_events``; with it, the
    evictions are reported."""
    for events in (False, True):
        kv = KVCacheManager(config(FA(4), num_blocks=3),
                            CacheOptions(vllm_compat=True, enable_events=events))
        serve(kv, "a", prompt(0, 8))
        serve(kv, "b", prompt(100, 8))
        got = kv.take_events()
        assert kv.stats().evictions == 2
        assert (sum(isinstance(e, BlockRemoved) for e in got) == 2) if events else got == []
    sd = SpecDecode("eagle", 2)
    assert KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(spec_decode=sd)).spec_decode is sd


def test_blocks_for_request_adds_the_alignment_unit_only_in_default_mode() -> None:
    """blocks_for_request — the hold (one alignment unit for local groups in default mode with
    retention on) dropped, forced, or the condition changed; ``/`` for ``*``.

    Full (bs 4) + sliding (bs 4, W 8), alignment 4, length 40. Full: ceil(40/4) = 10.
    Sliding: min(10, ceil((8 + hold)/4) + 2): hold 4 → 5, hold 0 → 4. So default mode
    (retention 0) needs 15, compat or retention None 14; the result is an int."""
    cfg = config(FA(4), SWA(4, 8), num_blocks=64)
    n = KVCacheManager.blocks_for_request(cfg, 40)
    assert n == 15 and type(n) is int
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=0) == 15
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=4) == 15
    assert KVCacheManager.blocks_for_request(cfg, 40, vllm_compat=True) == 14
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=None) == 14
    assert KVCacheManager.blocks_for_request(cfg, 40, retention_interval=0, vllm_compat=True) == 14


def test_max_model_len_must_fit_the_pool_exactly() -> None:
    """_check_fits — the manager's retention / compat not passed on, the ``need > usable``
    boundary moved, the advice changed.

    Same groups, max_model_len 40: default mode needs 15 blocks (16 with the null block),
    compat or retention None need 14 (15 with the null block)."""
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=16), CacheOptions(max_model_len=40))
    with pytest.raises(ValueError, match=r"the pool has 14 usable blocks but one request of "
                       r"max_model_len=40 tokens needs 15 across the groups; give more blocks "
                       r"or a smaller max_model_len$"):
        KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), CacheOptions(max_model_len=40))
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), CacheOptions(max_model_len=40, vllm_compat=True))
    KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=15), CacheOptions(
        max_model_len=40, retention_interval=None))
    with pytest.raises(ValueError, match="needs 14 across"):
        KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=14), CacheOptions(
            max_model_len=40, vllm_compat=True))


def test_lookahead_limit_rounds_each_groups_blocks_up() -> None:
    """_check_lookahead — ``/`` for ``//`` in a group's first-step blocks (no rounding up).

    Two full groups (bs 4), 3 usable blocks: a first step of 1 + la tokens takes
    2 * ceil((1 + la)/4) blocks <= 3, so la <= 3. k = 3 fits; k = 4 is refused (without the
    rounding 2 * 5/4 = 2.5 <= 3 would pass), naming 1..3."""
    KVCacheManager(config(FA(4), FA(4), num_blocks=4), CacheOptions(spec_decode=SpecDecode("eagle", 3)))
    with pytest.raises(ValueError, match=r"needs 4 lookahead slots per request, more than the "
                       r"pool's 3 usable blocks allow \(3\); valid num_speculative_tokens: 1\.\.3"):
        KVCacheManager(config(FA(4), FA(4), num_blocks=4), CacheOptions(spec_decode=SpecDecode("eagle", 4)))


def test_no_lookahead_fits_a_pool_of_one_token_steps() -> None:
    """_check_lookahead — the search starts at limit 1 instead of 0.

    Two full groups of bs 1, 3 usable blocks: a first step takes 2 * (1 + la) <= 3 blocks,
    so la = 0 is the limit and even k = 1 must be refused."""
    with pytest.raises(ValueError, match="allow 0: no speculative decoding fits"):
        KVCacheManager(config(FA(1), FA(1), num_blocks=4), CacheOptions(spec_decode=SpecDecode("eagle", 1)))


def test_lookahead_limit_of_a_two_block_pool() -> None:
    """_check_lookahead — the fit test made strict; the search's upper end lowered by two after
    a miss (skipping the answer).

    One full group (bs 4), 2 usable blocks: ceil((1 + la)/4) <= 2 gives la <= 7, so k = 7
    fits (a strict test would stop at 3). Two full groups (bs 4), 2 usable blocks:
    2 * ceil((1 + la)/4) <= 2 gives la <= 3, so k = 3 fits (the search misses at 6, then must
    still try 3)."""
    KVCacheManager(config(FA(4), num_blocks=3), CacheOptions(spec_decode=SpecDecode("eagle", 7)))
    KVCacheManager(config(FA(4), FA(4), num_blocks=3), CacheOptions(spec_decode=SpecDecode("eagle", 3)))


def test_lookahead_limit_below_max_model_len() -> None:
    """_check_lookahead — the ``max_model_len - 1`` cap: its condition moved by one either way,
    its value changed or removed; the reason named in the message.

    One full group (bs 4), 2 usable blocks: the pool allows la <= 7. max_model_len 7 caps it
    at 6 (k = 6 fits, k = 7 is refused naming max_model_len=7); max_model_len 8 does not cap
    it (7 = 7: k = 7 fits, k = 8 is refused naming the pool)."""
    cfg = config(FA(4), num_blocks=3)
    KVCacheManager(cfg, CacheOptions(max_model_len=7, spec_decode=SpecDecode("eagle", 6)))
    with pytest.raises(ValueError, match=r"needs 7 lookahead slots per request, more than "
                       r"max_model_len=7 allow \(6\); valid num_speculative_tokens: 1\.\.6$"):
        KVCacheManager(cfg, CacheOptions(max_model_len=7, spec_decode=SpecDecode("eagle", 7)))
    KVCacheManager(cfg, CacheOptions(max_model_len=8, spec_decode=SpecDecode("eagle", 7)))
    with pytest.raises(ValueError, match=r"more than the pool's 2 usable blocks allow \(7\); "
                       r"valid num_speculative_tokens: 1\.\.7$"):
        KVCacheManager(cfg, CacheOptions(max_model_len=8, spec_decode=SpecDecode("eagle", 8)))


def test_lookahead_messages_at_the_edge() -> None:
    """_check_lookahead — the "valid 1..limit" message kept down to limit 1; the advice of the
    "nothing fits" message.

    max_model_len 2 caps the lookahead at 1: k = 2 is refused with "valid 1..1";
    max_model_len 1 caps it at 0: nothing fits."""
    cfg = config(FA(4), num_blocks=8)
    with pytest.raises(ValueError, match=r"allow \(1\); valid num_speculative_tokens: 1\.\.1$"):
        KVCacheManager(cfg, CacheOptions(max_model_len=2, spec_decode=SpecDecode("eagle", 2)))
    with pytest.raises(ValueError, match=r"max_model_len=1 allow 0: no speculative decoding fits; "
                       r"give more blocks or a larger max_model_len$"):
        KVCacheManager(cfg, CacheOptions(max_model_len=1, spec_decode=SpecDecode("eagle", 1)))


def test_dflash_lookahead_message_counts_its_extra_slot() -> None:
    """_check_lookahead — DFlash's extra slot added instead of subtracted in the valid range, or
    in the test that picks the message.

    DFlash takes k + 1 slots. max_model_len 3 caps the lookahead at 2: k = 2 (3 slots) is
    refused with "valid 1..1" (2 - 1); max_model_len 2 caps it at 1: 1 - 1 = 0, nothing fits."""
    cfg = config(FA(4), num_blocks=8)
    with pytest.raises(ValueError, match=r"needs 3 lookahead slots .*allow \(2\); valid "
                       r"num_speculative_tokens: 1\.\.1$"):
        KVCacheManager(cfg, CacheOptions(
            max_model_len=3, spec_decode=SpecDecode("dflash", 2, drafter_window=8)))
    with pytest.raises(ValueError, match=r"allow 1: no speculative decoding fits"):
        KVCacheManager(cfg, CacheOptions(
            max_model_len=2, spec_decode=SpecDecode("dflash", 1, drafter_window=8)))


def test_impossible_lookahead_is_rejected_at_construction() -> None:
    cfg = config(FA(4), SWA(4, 8), num_blocks=21)       # 20 usable; 1 + la slots in both groups
    with pytest.raises(ValueError, match=r"SpecDecode\('eagle', 1000000\) needs 1000000 lookahead "
                                         r"slots per request, more than the pool's 20 usable blocks "
                                         r"allow \(39\); valid num_speculative_tokens: 1\.\.39"):
        KVCacheManager(cfg, CacheOptions(spec_decode=SpecDecode("eagle", 10**6)))
    KVCacheManager(cfg, CacheOptions(spec_decode=SpecDecode("eagle", 39)))          # the largest that fits
    with pytest.raises(ValueError, match=r"valid num_speculative_tokens: 1\.\.38"):
        KVCacheManager(cfg, CacheOptions(spec_decode=SpecDecode("dflash", 39)))     # k + 1 slots
    with pytest.raises(ValueError, match=r"more than max_model_len=16 allow \(15\); valid "
                                         r"num_speculative_tokens: 1\.\.15"):
        KVCacheManager(config(FA(4), num_blocks=100), CacheOptions(
            spec_decode=SpecDecode("mtp", 16), max_model_len=16))
    KVCacheManager(config(FA(4), num_blocks=100), CacheOptions(
        spec_decode=SpecDecode("mtp", 15), max_model_len=16))
    with pytest.raises(ValueError, match="no speculative decoding fits"):
        KVCacheManager(config(FA(4), num_blocks=100), CacheOptions(
            spec_decode=SpecDecode("dflash", 1), max_model_len=2))
    KVCacheManager(cfg, CacheOptions(spec_decode=SpecDecode("ngram", 10**6)))       # n-gram reserves no slots


def test_the_options_are_one_frozen_record_checked_when_built() -> None:
    """CacheOptions: the defaults are the manager's; a bad value is refused when the record is
    built, before any manager; the record cannot change after; the manager keeps the record
    it was given and takes no other kind of options."""
    import dataclasses
    opts = CacheOptions()
    assert (opts.retention_interval, opts.enable_caching, opts.hash_algo, opts.eviction_policy,
            opts.hints, opts.vllm_compat, opts.spec_decode) == (0, True, "xxh3_128", "lru", False,
                                                                False, None)
    with pytest.raises(ValueError, match=r"^hints must be True, False or 'force', got 'yes'$"):
        CacheOptions(hints="yes")
    with pytest.raises(ValueError, match=r"^vllm_compat pins vLLM's LRU order; hints=True needs "
                                         r"vllm_compat=False$"):
        CacheOptions(hints=True, vllm_compat=True)
    with pytest.raises(ValueError, match=r"^unknown eviction policy 'no-such'; valid: lru, "):
        CacheOptions(eviction_policy="no-such")
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.hints = True  # type: ignore[misc]
    kv = KVCacheManager(config(FA(4), num_blocks=16), CacheOptions(eviction_policy="recommended"))
    assert kv.options.eviction_policy == "recommended" and kv.eviction_policy == "adaptive"
    assert KVCacheManager(config(FA(4), num_blocks=16)).options == CacheOptions()
    with pytest.raises(ValueError, match=r"^options must be a CacheOptions or None, got dict$"):
        KVCacheManager(config(FA(4), num_blocks=16), {"hints": True})  # type: ignore[arg-type]

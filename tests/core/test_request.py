"""Tests that kill the mutants mutmut found surviving in the small modules of
``src/hybridkv/core`` (``retention.py``, ``hashing.py``, ``spec_decode.py``, ``request.py``,
``specs.py``, ``blockref.py``, ``validation.py``, ``retention_config.py``, ``events.py``;
TESTING.md, "Mutation testing").

mutmut runs only ``tests/core``, so a contract that the suite checks elsewhere (the CLI, the
simulator) is pinned here again, through the public API, with expectations derived by hand.
"""

from __future__ import annotations

import math

import pytest

from hybridkv import KVCacheManager, LoRA, MultiModalItem, Request
from hybridkv.core.blockref import BlockRef, TableRef
from hybridkv.core.events import untag_extra_keys
from hybridkv.core.spec_decode import SpecDecode, parse_spec
from hybridkv.core.validation import check_int
from hybridkv.core.retention import Retention, replay_boundaries
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from tests.support.helpers import FA, SWA, config


# ---- core/retention.py ----------------------------------------------------------------------

@pytest.mark.parametrize("interval, specs, message", [
    ("8", (SWA(4, 8),), "retention_interval must be None or an integer, got '8'"),
    (True, (SWA(4, 8),), "retention_interval must be None or an integer, got True"),
    (-4, (SWA(4, 8),), "retention_interval must be non-negative and a multiple of the scheduler "
                       "block size (4), got -4"),
    (8, (FA(4),), "retention_interval=8 needs a sliding-window or chunked-local KV-cache group, "
                  "and this config has none; set it to 0 or None"),
    (1, (FA(1),), "retention_interval=1 needs a sliding-window or chunked-local KV-cache group, "
                  "and this config has none; set it to 0 or None"),
    (6, (FA(4), SWA(4, 8)), "retention_interval must be non-negative and a multiple of the "
                            "scheduler block size (4, the LCM of the group block sizes), got 6"),
])
def test_bad_retention_interval_is_refused_with_its_reason(interval, specs, message) -> None:
    """retention: validate_retention_interval — each check and its message (the suite checked
    them only outside tests/core)."""
    with pytest.raises(ValueError) as exc:
        KVCacheManager(config(*specs, num_blocks=16), retention_interval=interval)
    assert str(exc.value) == message


@pytest.mark.parametrize("interval, specs", [(None, (FA(4),)), (0, (FA(4),)), (0, (SWA(4, 8),)),
                                             (8, (FA(4), SWA(4, 8))), (4, (SWA(4, 8),))])
def test_valid_retention_intervals_are_accepted(interval, specs) -> None:
    """retention: validate_retention_interval — a valid interval is not refused (0 without a
    local group; N a multiple of the alignment with one)."""
    kv = KVCacheManager(config(*specs, num_blocks=16), retention_interval=interval)
    assert kv.retention_interval == interval


def test_replay_boundaries_by_hand() -> None:
    """retention: replay_boundaries — the resend ``(P - 1) // A * A``; drop mode's pair
    ``{resend - A, extension - A}`` (extension = ``P // A * A``); one unit below each; 0
    dropped. A = 4."""
    assert replay_boundaries(9, 4, False, False) == (8,)
    assert replay_boundaries(9, 4, False, True) == (4, 8)
    assert replay_boundaries(4, 4, False, True) == ()            # resend 0: nothing
    assert replay_boundaries(5, 4, False, True) == (4,)          # 4 - 4 = 0 is dropped
    assert replay_boundaries(13, 4, True, False) == (8,)         # resend 12, extension 12
    assert replay_boundaries(12, 4, True, False) == (4, 8)       # resend 8, extension 12
    assert replay_boundaries(13, 4, True, True) == (4, 8)
    assert replay_boundaries(12, 4, True, True) == (4, 8)        # 0 dropped
    assert replay_boundaries(4, 4, True, False) == ()            # resend 0, extension 4: both 0
    assert replay_boundaries(17, 8, False, True) == (8, 16)


def test_promised_ends_by_hand() -> None:
    """retention: Retention.ends_between / next_end — dense (every multiple of A), 0 (only the
    request's own boundaries) and N (every multiple of N plus them); ``after < t <= upto``."""
    dense, sparse, every8 = Retention(None, 4), Retention(0, 4), Retention(8, 4)
    assert dense.dense and not sparse.dense and not every8.dense
    assert dense.ends_between(0, 20, (6,)) == [4, 6, 8, 12, 16, 20]
    assert dense.ends_between(4, 12, (4, 13)) == [8, 12]
    assert sparse.ends_between(0, 20, (6, 21, 0)) == [6]
    assert sparse.ends_between(6, 20, (6, 20)) == [20]
    assert every8.ends_between(0, 24, (12, 24)) == [8, 12, 16, 24]
    assert every8.ends_between(8, 15, ()) == []
    assert dense.next_end(5, ()) == 8 and dense.next_end(8, ()) == 12
    assert dense.next_end(5, (6,)) == 6
    assert sparse.next_end(5, ()) == math.inf
    assert sparse.next_end(5, (7, 3, 9)) == 7
    assert sparse.next_end(7, (7, 9)) == 9          # an end at `after` is not after it
    assert every8.next_end(8, (20,)) == 16 and every8.next_end(16, (20,)) == 20


def masked_blocks(rule, interval: int | None, ends: tuple[int, ...], limit: int) -> set[int]:
    """vLLM's write mask from its definition: the union of ``span(e)`` over every multiple
    of the interval (in the rule's blocks, k >= 1) and every boundary end."""
    out: set[int] = set()
    all_ends = set(ends)
    if interval:
        per = interval // rule.block_size
        all_ends |= set(range(per, limit + 1, per))
    for e in all_ends:
        lo, hi = rule.span(e)
        out |= set(range(lo, hi))
    return out


@pytest.mark.parametrize("interval", [0, 8, 16])
@pytest.mark.parametrize("proof", [False, True])
def test_masked_runs_cover_the_write_mask(interval, proof) -> None:
    """retention: Retention.next_masked_run / next_masked_block — the interval's first end
    (``k`` off by two, ``k / per``), the start clamp ``max(lo, j)`` dropped, a span ending at
    ``j`` taken as covering it, the stop of an empty answer (0) and which ``stop`` wins for
    equal starts. Brute force over j: the first masked block >= j, and ``[i, stop)`` all
    masked (W = 9, bs 4: a hit at e needs blocks ``[e - 2, e + proof)``)."""
    from hybridkv.core.rules import make_rule

    rule = make_rule(SWA(4, 9), proof=proof)
    ret = Retention(interval, 4)
    for ends in [(), (5,), (3, 7), (7, 3), (5, 4), (2, 6, 9)]:
        mask = masked_blocks(rule, interval, ends, 40)
        for j in range(0, 20):
            i, stop = ret.next_masked_run(rule, j, ends)
            want = min((b for b in mask if b >= j), default=math.inf)
            assert i == want and ret.next_masked_block(rule, j, ends) == want
            if i == math.inf:
                assert stop == 0
            else:
                assert stop > i and all(b in mask for b in range(i, stop))


def test_masked_run_stop_is_the_longest_span_from_its_start() -> None:
    """retention: next_masked_run — ``i <= best`` let a later end with the same start and a
    shorter span replace the stop. Sparse (interval 0), W = 9, bs 4: from j = 3 the ends 5
    (span [3, 5)) and 4 (span [2, 4), clamped to [3, 4)) both start at 3; stop is 5."""
    from hybridkv.core.rules import make_rule

    rule = make_rule(SWA(4, 9))
    assert Retention(0, 4).next_masked_run(rule, 3, (5, 4)) == (3, 5)
    assert Retention(0, 4).next_masked_run(rule, 3, (4, 5)) == (3, 5)
    assert Retention(0, 4).next_masked_run(rule, 5, (5,)) == (math.inf, 0)   # [3, 5) ends at j


# ---- core/spec_decode.py --------------------------------------------------------------------

@pytest.mark.parametrize("make, message", [
    (lambda: SpecDecode("medusa", 2),
     "unknown speculative method 'medusa'; valid: eagle, eagle3, mtp, dflash, draft_model, ngram"),
    (lambda: SpecDecode("eagle", 2.0), "num_speculative_tokens must be an integer >= 1, got 2.0"),
    (lambda: SpecDecode("ngram", 2, hash_lookahead=True),
     "hash_lookahead applies to eagle, eagle3 and mtp only, not 'ngram'"),
    (lambda: SpecDecode("eagle", 2, drafter_window=8), "drafter_window applies to dflash only, not 'eagle'"),
    (lambda: SpecDecode("dflash", 2, drafter_window=2),
     "dflash drafter_window 2 is too small for k=2: one step queries k draft positions plus the "
     "bonus token, so the window must be >= 3"),
    (lambda: SpecDecode("dflash", 2, drafter_window=4.0),
     "dflash drafter_window 4.0 is too small for k=2: one step queries k draft positions plus the "
     "bonus token, so the window must be >= 3"),
    (lambda: parse_spec("eagle:3:4"), "speculative decoding 'eagle:3:4': K must be an integer >= 1, got '3:4'"),
])
def test_bad_spec_decode_is_refused_with_its_reason(make, message) -> None:
    """spec_decode: SpecDecode.__post_init__ / check_drafter_window / parse_spec — each check
    (a float k or window accepted; the window bound ``<`` became ``<=`` or inverted) and its
    exact message; METHOD:K splits at the first colon."""
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == message


def test_dflash_window_of_exactly_k_plus_one_is_accepted() -> None:
    """spec_decode: check_drafter_window — ``window <= need`` / ``isinstance`` inverted: the
    smallest valid window (k + 1) and a larger one are accepted."""
    assert SpecDecode("dflash", 2, drafter_window=3).drafter_window == 3
    assert SpecDecode("dflash", 2, drafter_window=64).drafter_window == 64


# ---- core/blockref.py, core/validation.py, core/events.py ------------------------------------

def test_table_ref_resolves_to_the_block_at_its_position() -> None:
    """blockref: TableRef.resolve — each field of the BlockRef (no test in tests/core resolved
    one)."""
    ref = TableRef(1, 2, b"h").resolve([[0, 0, 0], [5, 6, 7]])
    assert ref == BlockRef(1, 7, b"h") and (ref.group, ref.block_id, ref.block_hash) == (1, 7, b"h")


def test_check_int_by_hand() -> None:
    """validation: check_int — ``optional`` defaulting to True, ``or`` / ``and`` slips (a
    negative int or a float accepted), and the message with and without "None or "."""
    check_int("n", 0, 0)
    check_int("n", None, 0, optional=True)
    check_int("n", 5, 1, optional=True)
    with pytest.raises(ValueError, match=r"^n must be an integer >= 0, got None$"):
        check_int("n", None, 0)                       # not optional by default
    for value, low, optional, message in [
        (None, 0, False, "n must be an integer >= 0, got None"),
        (-1, 0, False, "n must be an integer >= 0, got -1"),
        (5.0, 0, False, "n must be an integer >= 0, got 5.0"),
        (True, 0, False, "n must be an integer >= 0, got True"),
        (-1, 0, True, "n must be None or an integer >= 0, got -1"),
    ]:
        with pytest.raises(ValueError) as exc:
            check_int("n", value, low, optional=optional)
        assert str(exc.value) == message


def test_untag_extra_keys_by_hand() -> None:
    """events: untag_extra_keys — vLLM's event form: ``("mm", id, off)`` -> ``(id, off)``, LoRA
    -> its name, the salt -> itself; no keys -> None."""
    keys = (("lora", "ad", "/p"), ("mm", "img", -3), ("cache_salt", "s"))
    assert untag_extra_keys(keys) == ("ad", ("img", -3), "s")
    assert untag_extra_keys((("mm", "a", 0),)) == (("a", 0),)
    assert untag_extra_keys(()) is None


# ---- core/request.py ------------------------------------------------------------------------

def test_numpy_prompt_of_floats_is_refused_naming_its_dtype() -> None:
    """request: _as_token_array — the numpy branch skipped (``hasattr`` on None or a misspelt
    attribute): a float array must be refused by its dtype, and an int array read as is."""
    import numpy as np

    with pytest.raises(ValueError, match=r"^request 'r': token ids must be integers, got dtype float64$"):
        Request("r", np.array([1.5, 2.0]))
    assert list(Request("r", np.array([3, 4], dtype=np.int32)).token_ids) == [3, 4]
    assert list(Request("r", np.array([-1, 2**40], dtype=np.int64)).token_ids) == [-1, 2**40]  # signed int64


def test_append_tokens_takes_any_iterable_of_ints() -> None:
    """request: Request.append_tokens — the general path (not a list or tuple) read None."""
    import numpy as np

    req = Request("r", [1, 2])
    req.append_tokens(np.array([3, 4]))
    req.append_tokens(range(5, 7))
    req.append_tokens((7,))
    req.append_tokens([8])
    assert list(req.token_ids) == [1, 2, 3, 4, 5, 6, 7, 8] and req.num_tokens == 8


def test_extra_keys_tag_lora_mm_and_salt() -> None:
    """request: Request.extra_keys — the ``"lora"`` tag (it enters every block hash; the
    hashing module's documented form is ``("lora", name, path)``)."""
    req = Request("r", list(range(8)), lora=LoRA("ad", "/p"), cache_salt="s",
                  mm_items=[MultiModalItem("img", 2, 3)])
    assert req.extra_keys(0, 4) == (("lora", "ad", "/p"), ("mm", "img", 2), ("cache_salt", "s"))
    assert req.extra_keys(4, 8) == (("lora", "ad", "/p"), ("mm", "img", -2))


@pytest.mark.parametrize("make, message", [
    (lambda: Request("r", []), "request 'r' has an empty prompt; give at least one token"),
    (lambda: Request("r", [1], cache_salt=5), "request 'r': cache_salt must be a str or None, got 5"),
    (lambda: Request("r", [1], lora="x"), "request 'r': lora must be a LoRA(name, path), got 'x'"),
    (lambda: Request("r", [1], mm_items=["x"]), "request 'r': mm_items must hold MultiModalItem, got 'x'"),
    (lambda: Request("r", list(range(8)), mm_items=[MultiModalItem("img", 6, 4)]),
     "request 'r': multimodal item 'img' at [6, 10) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), mm_items=[MultiModalItem("img", 2, 0)]),
     "request 'r': multimodal item 'img' at [2, 2) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), mm_items=[MultiModalItem("img", -1, 2)]),
     "request 'r': multimodal item 'img' at [-1, 1) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), mm_items=[MultiModalItem("a", 0, 4), MultiModalItem("b", 2, 2)]),
     "request 'r': multimodal items must be sorted by offset and not overlap; 'b' starts at 2 < 4"),
    (lambda: Request("r", [1], retention="x"), "request 'r': retention must be a RetentionConfig or None, got 'x'"),
    (lambda: Request("r", list(range(8)), retention=RetentionConfig((TokenRange(4, 10, 90),))),
     "request 'r': retention range [4, 10) lies outside the prompt [0, 8); valid ranges: 0 <= start < end <= 8"),
])
def test_bad_request_is_refused_with_its_reason(make, message) -> None:
    """request: Request.__init__ — each check and its exact message (the suite matched few of
    them)."""
    with pytest.raises(ValueError) as exc:
        make()
    assert str(exc.value) == message


def test_non_integer_token_is_refused_naming_the_request() -> None:
    """request: _as_token_array / Request.__init__ — the message names the request and the
    valid range."""
    with pytest.raises(ValueError, match=r"^request 'r': token ids must be integers in "
                                         r"\[-9223372036854775808, 9223372036854775807\] \("):
        Request("r", [1, "a"])
    req = Request("r", [1])
    with pytest.raises(ValueError, match=r"^request 'r': token ids must be integers in \["):
        req.append_tokens(iter([2**63]))
    assert list(req.token_ids) == [1]


def test_a_fresh_request_with_a_one_token_image() -> None:
    """request: Request.__init__ — ``length <= 1`` refused a one-token item; ``num_preemptions``
    starts at 0 (the scheduler counts up from it); adjacent items do not overlap."""
    req = Request("r", list(range(8)), mm_items=[MultiModalItem("a", 0, 1), MultiModalItem("b", 1, 7)])
    assert req.num_preemptions == 0 and req.num_computed_tokens == 0 and req.num_prompt_tokens == 8
    assert req.extra_keys(0, 4) == (("mm", "a", 0), ("mm", "b", 1))

"""Speculative decoding's record (``hybridkv.core.spec_decode``): ``SpecDecode``'s checks and the
one grammar, ``parse_spec``, shared by the simulator's and the engine's command lines and by
``LLM(spec=...)``.
"""

from __future__ import annotations

import pytest

from hybridkv.core.spec_decode import SPEC_METHODS, SpecDecode, parse_spec


@pytest.mark.parametrize("text, method, k", [
    ("eagle:3", "eagle", 3), ("EAGLE3:2", "eagle3", 2), (" mtp : 1 ", "mtp", 1),
    ("dflash:7", "dflash", 7), ("draft:2", "draft_model", 2), ("draft-model:4", "draft_model", 4),
    ("draft_model:1", "draft_model", 1), ("ngram:4", "ngram", 4),
])
def test_method_colon_k(text: str, method: str, k: int) -> None:
    assert parse_spec(text) == SpecDecode(method, k)


def test_none_turns_it_off() -> None:
    assert parse_spec("none") is None and parse_spec(" None ") is None


@pytest.mark.parametrize("text, message", [
    ("dflash", r"METHOD:K \(methods: " + ", ".join(SPEC_METHODS) + r"; K >= 1 .*got 'dflash'"),
    ("medusa:2", "unknown speculative method 'medusa'; valid: eagle"),
    ("eagle:x", "K must be an integer >= 1, got 'x'"),
    ("eagle:", "K must be an integer >= 1, got ''"),
    ("eagle:0", "num_speculative_tokens must be an integer >= 1, got 0"),
    ("", "METHOD:K"),
])
def test_bad_text_names_the_value_and_the_valid_range(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_spec(text)
    with pytest.raises(ValueError, match="a string METHOD:K or 'none', got 3"):
        parse_spec(3)  # type: ignore[arg-type]


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

"""The one grammar of speculative decoding (``parse_spec``), shared by the simulator's and the
engine's command lines and by ``LLM(spec=...)``."""

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

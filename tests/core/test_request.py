"""``Request`` (``hybridkv.core.request``): its checks (each with its reason and the request's
name), token arrays from lists, iterables and numpy, ``append_tokens`` (a bad item changes
nothing), multimodal items and the extra keys (LoRA, images, salt) that enter its hashes.
"""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv import LoRA, MultiModalItem, Request
from hybridkv.core.retention_config import RetentionConfig, TokenRange
from hybridkv.core.request import RequestCacheParams


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
    req = Request("r", list(range(8)), RequestCacheParams(
        lora=LoRA("ad", "/p"), cache_salt="s", mm_items=[MultiModalItem("img", 2, 3)]))
    assert req.extra_keys(0, 4) == (("lora", "ad", "/p"), ("mm", "img", 2), ("cache_salt", "s"))
    assert req.extra_keys(4, 8) == (("lora", "ad", "/p"), ("mm", "img", -2))


@pytest.mark.parametrize("make, message", [
    (lambda: Request("r", []), "request 'r' has an empty prompt; give at least one token"),
    (lambda: Request("r", [1], RequestCacheParams(cache_salt=5)), "request 'r': cache_salt must be a str or None, got 5"),
    (lambda: Request("r", [1], RequestCacheParams(lora="x")), "request 'r': lora must be a LoRA(name, path), got 'x'"),
    (lambda: Request("r", [1], RequestCacheParams(mm_items=["x"])), "request 'r': mm_items must hold MultiModalItem, got 'x'"),
    (lambda: Request("r", list(range(8)), RequestCacheParams(mm_items=[MultiModalItem("img", 6, 4)])),
     "request 'r': multimodal item 'img' at [6, 10) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), RequestCacheParams(mm_items=[MultiModalItem("img", 2, 0)])),
     "request 'r': multimodal item 'img' at [2, 2) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), RequestCacheParams(mm_items=[MultiModalItem("img", -1, 2)])),
     "request 'r': multimodal item 'img' at [-1, 1) must have length > 0 and lie inside the prompt [0, 8)"),
    (lambda: Request("r", list(range(8)), RequestCacheParams(
        mm_items=[MultiModalItem("a", 0, 4), MultiModalItem("b", 2, 2)])),
     "request 'r': multimodal items must be sorted by offset and not overlap; 'b' starts at 2 < 4"),
    (lambda: Request("r", [1], RequestCacheParams(retention="x")), "request 'r': retention must be a RetentionConfig or None, got 'x'"),
    (lambda: Request("r", list(range(8)), RequestCacheParams(
        retention=RetentionConfig((TokenRange(4, 10, 90),)))),
     "request 'r': retention range [4, 10) lies outside the prompt [0, 8); valid ranges: 0 <= start < end <= 8"),
])
def test_bad_request_is_refused_with_its_reason(make, message) -> None:
    """request: Request.__init__ — each check and its exact message."""
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
    req = Request("r", list(range(8)), RequestCacheParams(
        mm_items=[MultiModalItem("a", 0, 1), MultiModalItem("b", 1, 7)]))
    assert req.num_preemptions == 0 and req.num_computed_tokens == 0 and req.num_prompt_tokens == 8
    assert req.extra_keys(0, 4) == (("mm", "a", 0), ("mm", "b", 1))


def test_append_tokens_with_a_bad_item_changes_nothing() -> None:
    """A list or tuple with a bad token (one token too: a decode step's append takes its own
    path) raises ValueError naming the request and leaves the tokens as they were."""
    r = Request("r", [1, 2, 3])
    for bad in ([4, "x"], [5, 2**70], [6, 1.5], ["x"], [2**70], (1.5,), [None]):
        with pytest.raises(ValueError, match="request 'r'"):
            r.append_tokens(bad)
        assert list(r.token_ids) == [1, 2, 3]
    r.append_tokens([4, 5])
    r.append_tokens((6,))
    r.append_tokens([7])
    assert list(r.token_ids) == [1, 2, 3, 4, 5, 6, 7]


def test_request_cache_params_record():
    """The record's defaults, its refusal of a non-bool skip flag, frozen; Request reads it whole."""
    p = RequestCacheParams()
    assert (p.cache_salt, p.lora, p.mm_items, p.skip_prefix_cache, p.retention, p.hint,
            p.checkpoints) == (None, None, (), False, None, None, ())
    with pytest.raises(ValueError) as exc:
        RequestCacheParams(skip_prefix_cache="yes")
    assert str(exc.value) == "RequestCacheParams: skip_prefix_cache must be True or False, got 'yes'"
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.cache_salt = "s"  # type: ignore[misc]
    r = Request("r", [1, 2, 3], RequestCacheParams(cache_salt="s", skip_prefix_cache=True,
                                                    checkpoints=(3, 1)))
    assert (r.cache_salt, r.skip_prefix_cache, r.checkpoints) == ("s", True, (1, 3))
    with pytest.raises(ValueError) as exc:
        Request("r", [1], {"cache_salt": "s"})  # type: ignore[arg-type]
    assert str(exc.value) == ("request 'r': params must be a RequestCacheParams or None, "
                              "got {'cache_salt': 's'}")

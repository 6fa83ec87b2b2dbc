"""Checkpoints where the application says (``Request(checkpoints=...)``; vLLM RFC #55697) and
at the shared-prefix junction (vLLM #53945), on a recurrent-state hybrid and a window group."""

from __future__ import annotations

import pytest

from hybridkv import KVCacheManager, Request
from tests.support.helpers import FA, QWEN3_NEXT, SWA, config, prompt, run_prompt, state_hybrid
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

SYSTEM = prompt(1000, 200)          # a 200-token system prompt every request starts with


def _serve(kv: KVCacheManager, rid: str, user_base: int, marks=()) -> int:
    """A request: the system prompt, 37 tokens of its own; computed, freed. Returns its hit."""
    r, hit = run_prompt(kv, rid, SYSTEM + prompt(user_base, 37), checkpoints=marks)
    kv.free(r)
    kv.check_integrity()
    return hit.num_tokens


@pytest.mark.parametrize("marks, hits", [
    # no mark: a checkpoint only where requests ended (237 -> 224): the second request finds
    # the 192 attention tokens but no state there (0); its junction (192) is promised, so the
    # third hits 192
    ((), [0, 0, 192, 192]),
    # the end of the system prompt marked (200 -> 192): the first request writes a checkpoint
    # there, so the second request already hits 192
    ((200,), [0, 192, 192, 192]),
])
def test_a_marked_position_is_a_checkpoint_from_the_first_request(marks, hits) -> None:
    """_boundaries; exports — Qwen3-Next's gated-delta-net state beside full attention (block
    16); requests share the 200-token system prompt and differ after it."""
    kv = KVCacheManager(state_hybrid(QWEN3_NEXT, num_blocks=4000))
    assert [_serve(kv, f"r{i}", 5000 + 100 * i, marks) for i in range(4)] == hits


def test_marks_are_promised_ends_of_window_groups_too_and_ignored_in_compat_mode() -> None:
    """_boundaries — a window group (bs 4, W 8) beside full attention keeps the window before a
    marked position (100 -> 100) and nothing else under retention 0, so a request sharing the
    first 100 tokens hits 100; without the mark, or in compat mode (vLLM 0.33 has no marks),
    it hits 0 on its first try."""
    def second_hit(compat: bool, marks) -> int:
        kv = KVCacheManager(config(FA(4), SWA(4, 8), num_blocks=400), CacheOptions(
            vllm_compat=compat, retention_interval=0))
        r, _ = run_prompt(kv, "a", prompt(0, 100) + prompt(500, 60), checkpoints=marks)
        kv.free(r)
        return kv.lookup(Request("b", prompt(0, 100) + prompt(900, 30))).num_tokens
    assert (second_hit(False, (100,)), second_hit(False, ()), second_hit(True, (100,))) == (100, 0, 0)


@pytest.mark.parametrize("bad", [0, 161, -3, 2.5, True])
def test_a_mark_outside_the_prompt_is_refused(bad) -> None:
    """Request — a mark must be an integer in [1, prompt length]."""
    with pytest.raises(ValueError, match=r"request 'x': checkpoint positions must be integers in "
                                         r"\[1, 160\] \(the prompt\), got "):
        Request("x", prompt(0, 160), RequestCacheParams(checkpoints=(bad,)))
    assert Request("y", prompt(0, 160), RequestCacheParams(checkpoints=(96, 32, 96))).checkpoints == (32, 96)


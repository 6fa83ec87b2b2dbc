"""The public APIs' cache fields mapped onto hints (``hybridkv.core.public_hints``): each shape's
exact hint, from the APIs' published values (Anthropic ``cache_control.ttl`` "5m" / "1h";
OpenAI ``prompt_cache_retention`` "in_memory" (5-10 min of inactivity: 600 s) / "24h"; Dynamo
``nvext.cache_control`` TTL strings), and an error naming the bad field and value for each
malformed one."""

from __future__ import annotations

import pytest

from hybridkv.core.hints import PIN_PRIORITY, SOFT_PIN_PRIORITY, Hint
from hybridkv.core.public_hints import dynamo_ttl_seconds, public_hint


@pytest.mark.parametrize("body, pin_s", [
    ({"cache_control": {"type": "ephemeral"}}, 300.0),
    ({"cache_control": {"type": "ephemeral", "ttl": "5m"}}, 300.0),
    ({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, 3600.0),
    ({"prompt_cache_retention": "in_memory"}, 600.0),
    ({"prompt_cache_retention": "24h"}, 86400.0),
    ({"nvext": {"cache_control": {"type": "ephemeral"}}}, 300.0),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "30m"}}}, 1800.0),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "90s"}}}, 90.0),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "2h"}}}, 7200.0),
])
def test_each_ttl_shape_is_a_soft_pin_of_the_whole_prompt(body, pin_s) -> None:
    h = public_hint(body, "s1")
    assert h == Hint(session="s1", pin_s=pin_s, soft=True)
    marks = h.configs(40)[0].ranges[0]
    assert (marks.start, marks.end, marks.priority, marks.ttl_s) == (0, 40, SOFT_PIN_PRIORITY, pin_s)


def test_a_hard_pin_keeps_the_top_priority() -> None:
    r = Hint(pin_s=5.0).configs(8)[0].ranges[0]
    assert (r.priority, r.ttl_s) == (PIN_PRIORITY, 5.0)


def test_session_keys_name_the_session_only_when_the_request_has_none() -> None:
    assert public_hint({"prompt_cache_key": "user-7"}) == Hint(session="user-7")
    assert public_hint({"nvext": {"agent_hints": {"prefix_id": "p"}}}) == Hint(session="p")
    assert public_hint({"prompt_cache_key": "user-7"}, "conv-1") == Hint(session="conv-1")
    both = {"prompt_cache_key": "k", "nvext": {"agent_hints": {"prefix_id": "k"}}}
    assert public_hint(both) == Hint(session="k")


def test_agent_hints_speculative_prefill_says_the_session_continues_the_rest_is_scheduling() -> None:
    body = {"nvext": {"agent_hints": {"priority": 5, "strict_priority": 1, "osl": 1024,
                                      "speculative_prefill": True, "total_requests": 3}}}
    assert public_hint(body, "s") == Hint(session="s", continues=1.0)
    assert public_hint({"nvext": {"agent_hints": {"osl": 10}}}, "s") == Hint(session="s")


def test_no_public_field_returns_the_base_and_fields_merge_into_it() -> None:
    base = Hint(session="s", last_turn=True)
    assert public_hint({"prompt_token_ids": [1]}, "s", base) is base
    assert public_hint({}, None, None) is None
    got = public_hint({"cache_control": {"type": "ephemeral", "ttl": "1h"}}, "s", base)
    assert got == Hint(session="s", last_turn=True, pin_s=3600.0, soft=True)


@pytest.mark.parametrize("body, names", [
    ({"cache_control": {"type": "persistent"}}, "'persistent'"),
    ({"cache_control": {"type": "ephemeral", "ttl": "2h"}}, "'2h'"),
    ({"cache_control": {"type": "ephemeral", "ttl": 300}}, "300"),
    ({"cache_control": {"type": "ephemeral", "tll": "5m"}}, "'tll'"),
    ({"cache_control": "ephemeral"}, "'ephemeral'"),
    ({"prompt_cache_retention": "1h"}, "'1h'"),
    ({"prompt_cache_key": ""}, "prompt_cache_key"),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "5 min"}}}, "'5 min'"),
    ({"nvext": {"cache_control": {"type": "ephemeral", "ttl": "0s"}}}, "'0s'"),
    ({"nvext": {"agent_hint": {}}}, "'agent_hint'"),
    ({"nvext": {"agent_hints": {"osl": -1}}}, "-1"),
    ({"nvext": {"agent_hints": {"speculative_prefill": "yes"}}}, "'yes'"),
    ({"cache_control": {"type": "ephemeral"}, "prompt_cache_retention": "24h"}, "give one"),
    ({"prompt_cache_key": "a", "nvext": {"agent_hints": {"prefix_id": "b"}}}, "different sessions"),
])
def test_a_malformed_field_is_an_error_naming_it(body, names) -> None:
    with pytest.raises(ValueError) as exc:
        public_hint(body, "s")
    assert names in str(exc.value)


def test_a_ttl_shape_beside_a_hybridkv_pin_is_refused() -> None:
    with pytest.raises(ValueError, match="hint.pin_s and cache_control"):
        public_hint({"cache_control": {"type": "ephemeral"}}, "s", Hint(session="s", pin_s=10.0))


def test_dynamo_ttl_strings() -> None:
    assert [dynamo_ttl_seconds(t) for t in ("5m", "30m", "1h", "45s", "1.5h")] == [300, 1800, 3600, 45, 5400]


def test_soft_needs_a_pin() -> None:
    with pytest.raises(ValueError, match="soft=True .* needs pin_s"):
        Hint(soft=True)
    with pytest.raises(ValueError, match="soft must be True or False, got 1"):
        Hint(pin_s=1.0, soft=1)

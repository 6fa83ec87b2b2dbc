"""Workload loaders and generators: formats, validation errors, determinism, prefix structure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.sim.traffic.traces import (TraceRequest, expand_block_ids, iter_mooncake_records,
                                 load_mooncake_trace, load_token_trace)
from hybridkv.sim.traffic.workloads import (WORKLOADS, AgentWorkload, ChatWorkload, SystemPromptWorkload,
                                            agentic_loop, get_workload, multi_turn_chat,
                                            replay_microbenchmark, shared_system_prompt)


def _write_jsonl(path: Path, lines: list[object]) -> Path:
    path.write_text("".join((ln if isinstance(ln, str) else json.dumps(ln)) + "\n" for ln in lines))
    return path


# --------------------------------------------------------------------------------------------
# TraceRequest
# --------------------------------------------------------------------------------------------


def test_trace_request_is_frozen_and_read_only() -> None:
    r = TraceRequest("r", 0, [1, 2, 3], 4)
    assert r.prompt.dtype == np.int64 and r.prompt_len == 3 and r.arrival_s == 0.0
    with pytest.raises(ValueError):
        r.prompt[0] = 7  # read-only array
    with pytest.raises(AttributeError):
        r.output_len = 5  # type: ignore[misc]
    assert r == TraceRequest("r", 0.0, np.array([1, 2, 3]), 4)
    assert r != TraceRequest("r", 0.0, np.array([1, 2, 4]), 4)


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(prompt=[], output_len=1, arrival_s=0.0),
        dict(prompt=[1.5], output_len=1, arrival_s=0.0),
        dict(prompt=[1], output_len=-1, arrival_s=0.0),
        dict(prompt=[1], output_len=1, arrival_s=-2.0),
        dict(prompt=[1], output_len=1, arrival_s=float("nan")),
    ],
)
def test_trace_request_rejects_bad_values(kwargs) -> None:
    with pytest.raises(ValueError, match="TraceRequest 'x'"):
        TraceRequest(request_id="x", **kwargs)


# --------------------------------------------------------------------------------------------
# Mooncake
# --------------------------------------------------------------------------------------------


def _splitmix64_oracle(x: int) -> int:
    """splitmix64's finalizer on one Python int, mod 2**64 (the published constants)."""
    m = (1 << 64) - 1
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & m
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def test_expand_block_ids_is_splitmix_of_id_and_position() -> None:
    """Token j of block id h is splitmix64((h << 9 | j) + golden ratio) >> 33 (512-token ids),
    checked against Python integers; the caller's ids are not changed."""
    ids = [0, 1, 7, 2**40 + 3, 123456789]
    tokens = expand_block_ids(ids, 4 * 512 + 100)
    want = [_splitmix64_oracle(((h << 9 | j) + 0x9E3779B97F4A7C15) & ((1 << 64) - 1)) >> 33
            for h in ids for j in range(512)][:4 * 512 + 100]
    assert tokens.dtype == np.int64 and tokens.tolist() == want
    assert tokens[:3].tolist() == want[:3] and want[0] != want[1]
    x = np.array([5, 2**63 + 11], dtype=np.uint64)
    from hybridkv.sim.traffic.token_ids import splitmix64
    assert splitmix64(x).tolist() == [_splitmix64_oracle(5), _splitmix64_oracle(2**63 + 11)]
    assert x.tolist() == [5, 2**63 + 11]                  # the input is not changed


def test_expand_block_ids_prefix_structure() -> None:
    a = expand_block_ids([5, 6, 7], 1500)
    b = expand_block_ids([5, 6, 8], 1536)
    assert a.dtype == np.int64 and a.shape == (1500,)
    assert np.array_equal(a[:1024], b[:1024])  # shared ids -> identical token prefixes
    assert np.mean(a[1024:1500] != b[1024:1500]) > 0.99  # different ids -> different tokens
    assert np.array_equal(a, expand_block_ids([5, 6, 7], 1500))  # deterministic
    both = np.concatenate([expand_block_ids(list(range(200)), 200 * 512), b])
    assert both.min() >= 0 and both.max() < 2**31
    # Tokens inside one block and across ids look random (no short-period structure).
    assert len(np.unique(expand_block_ids(list(range(200)), 200 * 512))) > 0.99 * 200 * 512
    with pytest.raises(ValueError):
        expand_block_ids([1], 513)


def test_load_mooncake_trace(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "mc.jsonl", [
        {"timestamp": 0, "input_length": 700, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 1500, "input_length": 1024, "output_length": 0, "hash_ids": [0, 2]},
        "",
        {"timestamp": 2000, "input_length": 1, "output_length": 3, "hash_ids": [9]},
    ])
    reqs = load_mooncake_trace(path)
    assert [r.prompt_len for r in reqs] == [700, 1024, 1]
    assert [r.arrival_s for r in reqs] == [0.0, 1.5, 2.0]
    assert [r.output_len for r in reqs] == [5, 0, 3]
    assert [r.block_ids for r in reqs] == [(0, 1), (0, 2), (9,)]
    assert [r.request_id for r in reqs] == ["mc-0", "mc-1", "mc-2"]
    assert np.array_equal(reqs[0].prompt[:512], reqs[1].prompt[:512])
    assert not np.array_equal(reqs[0].prompt[512:700], reqs[1].prompt[512:700])
    assert len(load_mooncake_trace(path, limit=2)) == 2
    # A different block size changes how many ids a prompt needs.
    assert load_mooncake_trace(
        _write_jsonl(tmp_path / "b16.jsonl", [{"timestamp": 0, "input_length": 20,
                                               "output_length": 1, "hash_ids": [3, 4]}]),
        block_tokens=16,
    )[0].prompt_len == 20


def test_real_mooncake_head_loads(trace_dir: Path) -> None:
    path = trace_dir / "mooncake_conversation.jsonl.xz"
    reqs = load_mooncake_trace(path, limit=50)
    recs = list(iter_mooncake_records(path, limit=50))
    assert len(reqs) == 50
    assert [r.prompt_len for r in reqs] == [rec.input_length for rec in recs]
    # Requests 0 and 1 share hash id 0: their first 512 tokens agree.
    assert reqs[0].block_ids[0] == reqs[1].block_ids[0]
    assert np.array_equal(reqs[0].prompt[:512], reqs[1].prompt[:512])


GOOD = {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}


@pytest.mark.parametrize(
    "bad,message",
    [
        ("{not json", "bad JSON"),
        ("[1, 2]", "expected a JSON object"),
        ({k: v for k, v in GOOD.items() if k != "hash_ids"}, "missing field 'hash_ids'"),
        ({k: v for k, v in GOOD.items() if k != "timestamp"}, "missing field 'timestamp'"),
        ({**GOOD, "output_length": -1}, "'output_length' must be an integer >= 0, got -1"),
        ({**GOOD, "input_length": -5}, "'input_length' must be an integer >= 0, got -5"),
        ({**GOOD, "input_length": 0}, "'input_length' must be >= 1"),
        ({**GOOD, "input_length": 1.5}, "'input_length' must be an integer"),
        ({**GOOD, "timestamp": -1}, "'timestamp'"),
        ({**GOOD, "hash_ids": [1]}, "too short for input_length 600"),
        ({**GOOD, "hash_ids": [1, 2, 3]}, "too long"),
        ({**GOOD, "hash_ids": [1, "x"]}, "list of integers"),
    ],
)
def test_mooncake_errors_name_file_and_line(tmp_path: Path, bad, message: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD, bad])
    with pytest.raises(ValueError, match=message) as info:
        load_mooncake_trace(path)
    assert f"{path}:2:" in str(info.value)


# --------------------------------------------------------------------------------------------
# Token traces
# --------------------------------------------------------------------------------------------


def test_load_token_trace(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "tok.jsonl", [
        {"prompt_token_ids": [1, 2, 3], "output_len": 4},
        {"prompt_token_ids": [1, 2], "output_len": 0, "arrival_s": 0.5, "session": "s",
         "request_id": "custom"},
    ])
    a, b = load_token_trace(path)
    assert a == TraceRequest("tok-0", 0.0, np.array([1, 2, 3]), 4)
    assert b == TraceRequest("custom", 0.5, np.array([1, 2]), 0, "s")
    assert a.block_ids == ()


def test_token_ids_follow_the_rule_of_request(tmp_path: Path) -> None:
    """One rule for token ids: any int64 (negative ones too) in Request and in the loader."""
    from hybridkv import Request
    ids = [-1, -(2**63), 2**63 - 1, 0]
    path = _write_jsonl(tmp_path / "tok.jsonl", [{"prompt_token_ids": ids, "output_len": 1}])
    (req,) = load_token_trace(path)
    assert req.prompt.tolist() == ids == list(Request("r", ids).token_ids)
    for bad in ([2**63], [-(2**63) - 1]):
        with pytest.raises(ValueError):
            Request("r", bad)
        with pytest.raises(ValueError, match="int64|integers"):
            load_token_trace(_write_jsonl(tmp_path / "bad.jsonl", [{"prompt_token_ids": bad, "output_len": 1}]))


@pytest.mark.parametrize(
    "bad,message",
    [
        ("", None),  # blank lines are skipped, not errors
        ("nope", "bad JSON"),
        ({"output_len": 1}, "missing field 'prompt_token_ids'"),
        ({"prompt_token_ids": [1]}, "missing field 'output_len'"),
        ({"prompt_token_ids": [], "output_len": 1}, "non-empty list"),
        ({"prompt_token_ids": [1, 2.5], "output_len": 1}, "flat list of integers"),
        ({"prompt_token_ids": [1, [2]], "output_len": 1}, "flat list of integers"),
        ({"prompt_token_ids": [2**63], "output_len": 1}, "int64"),
        ({"prompt_token_ids": [1], "output_len": -3}, "'output_len' must be an integer >= 0, got -3"),
        ({"prompt_token_ids": [1], "output_len": 1, "arrival_s": -1}, "'arrival_s'"),
        ({"prompt_token_ids": [1], "output_len": 1, "session": 3}, "'session'"),
        ({"prompt_token_ids": [1], "output_len": 1, "request_id": "tok-0"}, "duplicate request_id"),
    ],
)
def test_token_trace_errors_name_file_and_line(tmp_path: Path, bad, message: str | None) -> None:
    path = _write_jsonl(tmp_path / "tok.jsonl", [{"prompt_token_ids": [7], "output_len": 1}, bad])
    if message is None:
        assert len(load_token_trace(path)) == 1
        return
    with pytest.raises(ValueError, match=message) as info:
        load_token_trace(path)
    assert f"{path}:2:" in str(info.value)


# --------------------------------------------------------------------------------------------
# Generators
# --------------------------------------------------------------------------------------------


def _same(a: list[TraceRequest], b: list[TraceRequest]) -> bool:
    return len(a) == len(b) and all(x == y for x, y in zip(a, b))


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_workloads_are_deterministic_and_ordered(name: str) -> None:
    small = {
        "chat": dict(num_conversations=4, turns=3),
        "system-prompt": dict(num_requests=20),
        "agentic": dict(num_agents=3, steps=4),
        "replay": dict(a_tokens=64, b_tokens=32),
    }[name]
    a = get_workload(name, seed=1, **small)
    assert _same(a, get_workload(name, seed=1, **small))
    if name != "replay":
        assert not _same(a, get_workload(name, seed=2, **small))
    arrivals = [r.arrival_s for r in a]
    assert arrivals == sorted(arrivals)
    assert len({r.request_id for r in a}) == len(a)
    assert all(r.prompt.min() >= 0 for r in a)


def test_unknown_workload_lists_valid_names() -> None:
    with pytest.raises(ValueError, match="agentic, chat, replay, system-prompt"):
        get_workload("nope")


def _check_growing_sessions(reqs: list[TraceRequest], steps: int) -> None:
    by_session: dict[str, list[TraceRequest]] = {}
    for r in reqs:
        by_session.setdefault(r.session, []).append(r)  # type: ignore[arg-type]
    for turns in by_session.values():
        assert len(turns) == steps
        for prev, cur in zip(turns, turns[1:]):
            # The next prompt is the previous prompt + the previous answer + new text.
            assert cur.prompt_len > prev.prompt_len + prev.output_len
            assert np.array_equal(cur.prompt[: prev.prompt_len], prev.prompt)


def test_multi_turn_chat_history_contains_answers() -> None:
    reqs = multi_turn_chat(ChatWorkload(
        num_conversations=5, turns=4, system_tokens=100, user_tokens=20, answer_tokens=(5, 30),
        concurrency=2), seed=3)
    assert len(reqs) == 20
    _check_growing_sessions(reqs, 4)
    # The answer tokens are fixed per turn: regenerating gives the same history.
    again = multi_turn_chat(ChatWorkload(
        num_conversations=5, turns=4, system_tokens=100, user_tokens=20, answer_tokens=(5, 30),
        concurrency=2), seed=3)
    assert _same(reqs, again)
    # Every conversation starts with the shared system prompt.
    firsts = [r for r in reqs if r.request_id.endswith("-t0")]
    assert all(np.array_equal(f.prompt[:100], firsts[0].prompt[:100]) for f in firsts)
    assert not np.array_equal(firsts[0].prompt[100:120], firsts[1].prompt[100:120])


def test_concurrency_one_runs_conversations_back_to_back() -> None:
    reqs = multi_turn_chat(ChatWorkload(
        num_conversations=3, turns=2, concurrency=1, arrival_rate=None), seed=0)
    assert [r.request_id for r in reqs] == [f"chat-s{s}-t{t}" for s in range(3) for t in range(2)]
    assert all(r.arrival_s == 0.0 for r in reqs)


def test_concurrency_interleaves() -> None:
    reqs = multi_turn_chat(ChatWorkload(num_conversations=8, turns=5, concurrency=8), seed=0)
    sessions = [r.session for r in reqs]
    switches = sum(a != b for a, b in zip(sessions, sessions[1:]))
    assert switches > 20


def test_agentic_loop_grows_long_context_with_short_outputs() -> None:
    reqs = agentic_loop(AgentWorkload(
        num_agents=3, steps=5, system_tokens=1000, task_tokens=100, tool_tokens=(200, 400),
        action_tokens=(10, 20)), seed=0)
    _check_growing_sessions(reqs, 5)
    assert all(10 <= r.output_len <= 20 for r in reqs)
    assert max(r.prompt_len for r in reqs) > 1000 + 100 + 4 * 200


def test_shared_system_prompt_uses_few_prefixes() -> None:
    reqs = shared_system_prompt(SystemPromptWorkload(
        num_requests=60, num_prompts=3, system_tokens=50, user_tokens=10, zipf_s=1.0), seed=0)
    prefixes = {tuple(r.prompt[:50]) for r in reqs}
    assert 1 < len(prefixes) <= 3
    assert len({tuple(r.prompt[50:]) for r in reqs}) == 60  # user text is unique
    assert all(r.session is None for r in reqs)


def test_replay_microbenchmark_is_a_b_a() -> None:
    a, b, a2 = replay_microbenchmark(a_tokens=100, b_tokens=50, gap_s=2.0)
    assert np.array_equal(a.prompt, a2.prompt) and a.prompt_len == 100 and b.prompt_len == 50
    assert np.mean(a.prompt[:50] != b.prompt) > 0.9
    assert (a.arrival_s, b.arrival_s, a2.arrival_s) == (0.0, 2.0, 4.0)


@pytest.mark.parametrize(
    "call",
    [
        lambda: multi_turn_chat(ChatWorkload(num_conversations=0)),
        lambda: multi_turn_chat(ChatWorkload(user_tokens=(5, 2))),
        lambda: multi_turn_chat(ChatWorkload(arrival_rate=0.0)),
        lambda: shared_system_prompt(SystemPromptWorkload(num_prompts=0)),
        lambda: replay_microbenchmark(a_tokens=0),
    ],
)
def test_generators_reject_bad_arguments(call) -> None:
    with pytest.raises(ValueError):
        call()


# --------------------------------------------------------------------------------------------
# Every documented field and error of the two formats
# --------------------------------------------------------------------------------------------


def test_trace_request_fields_by_hand() -> None:
    """The record keeps an int64 copy of the prompt (the caller's array is not frozen), a
    float arrival, an int output length, the block ids as ints, and output ids of exactly
    output_len tokens. Equality compares id, arrival, output length, session, block ids and
    prompt; a non-record compares unequal; records are unhashable; repr names the sizes."""
    src = np.array([5, 6, 7], dtype=np.int32)
    r = TraceRequest("r", 2, src, np.int64(2), "s", block_ids=[np.int64(9), 8], output_ids=[1, 2])
    assert r.prompt.dtype == np.int64 and src.flags.writeable and not r.prompt.flags.writeable
    assert isinstance(r.arrival_s, float) and type(r.output_len) is int
    assert r.block_ids == (9, 8) and all(type(b) is int for b in r.block_ids)
    assert r.output_ids.tolist() == [1, 2] and r.output_ids.dtype == np.int64
    same = TraceRequest("r", 2.0, [5, 6, 7], 2, "s", block_ids=(9, 8))
    assert r == same
    for other in (TraceRequest("q", 2.0, [5, 6, 7], 2, "s", (9, 8)),
                  TraceRequest("r", 3.0, [5, 6, 7], 2, "s", (9, 8)),
                  TraceRequest("r", 2.0, [5, 6, 7], 3, "s", (9, 8)),
                  TraceRequest("r", 2.0, [5, 6, 7], 2, "t", (9, 8)),
                  TraceRequest("r", 2.0, [5, 6, 7], 2, "s", (9,))):
        assert r != other
    assert r != "r" and r.__eq__("r") is NotImplemented
    with pytest.raises(TypeError):
        hash(r)
    assert repr(r) == ("TraceRequest(request_id='r', arrival_s=2.0, prompt_len=3, output_len=2, "
                       "session='s', blocks=2)")
    frozen = np.array([1, 2], dtype=np.int64)
    frozen.flags.writeable = False
    assert TraceRequest("f", 0, frozen, 0).prompt is frozen          # kept as is, no copy


@pytest.mark.parametrize("kwargs,message", [
    (dict(prompt=[[1, 2]]), "prompt must be a non-empty 1-D array of integer token ids, got shape \\(1, 2\\)"),
    (dict(prompt=["a"]), "prompt must be a non-empty 1-D array"),
    (dict(arrival_s=True), "arrival_s must be finite and >= 0, got True"),
    (dict(arrival_s="1"), "arrival_s must be finite and >= 0, got '1'"),
    (dict(arrival_s=float("inf")), "arrival_s must be finite and >= 0, got inf"),
    (dict(output_len=True), "output_len must be an integer >= 0, got True"),
    (dict(output_len=1.0), "output_len must be an integer >= 0, got 1.0"),
    (dict(output_len=2, output_ids=[1]), "output_ids must hold output_len=2 tokens, got shape \\(1,\\)"),
])
def test_trace_request_errors_name_the_value(kwargs, message) -> None:
    args = dict(prompt=[1], output_len=1, arrival_s=0.0) | kwargs
    with pytest.raises(ValueError, match=f"TraceRequest 'x': {message}"):
        TraceRequest(request_id="x", **args)
    assert TraceRequest("x", 0, [1], 0).output_len == 0                   # zero is allowed


def test_mooncake_fields_by_hand(tmp_path: Path) -> None:
    """A float timestamp in ms becomes seconds; ids need ceil(input_length / block_tokens)
    entries (an exact multiple needs no partial one); a hash id may be 0; the record keeps the
    line number (blank lines count); ``limit`` stops early (0: nothing)."""
    path = _write_jsonl(tmp_path / "m.jsonl", [
        "",
        {"timestamp": 1234.5, "input_length": 1024, "output_length": 0, "hash_ids": [0, 7]},
        {"timestamp": 0, "input_length": 1025, "output_length": 2, "hash_ids": [0, 7, 8]},
    ])
    recs = list(iter_mooncake_records(path))
    assert [(r.lineno, r.timestamp_ms, r.input_length, r.output_length, r.hash_ids) for r in recs] == \
        [(2, 1234.5, 1024, 0, (0, 7)), (3, 0.0, 1025, 2, (0, 7, 8))]
    assert isinstance(recs[1].timestamp_ms, float)
    assert load_mooncake_trace(path)[0].arrival_s == 1.2345
    assert list(iter_mooncake_records(path, limit=0)) == []
    assert [r.lineno for r in iter_mooncake_records(path, limit=1)] == [2]
    with pytest.raises(ValueError, match="limit must be None or an integer >= 0, got -1"):
        list(iter_mooncake_records(path, limit=-1))
    with pytest.raises(ValueError, match="block_tokens must be an integer >= 1, got 0"):
        list(iter_mooncake_records(path, block_tokens=0))
    # a smaller block: the prompt is each id's tokens at that block size, cut to input_length
    small = _write_jsonl(tmp_path / "s.jsonl", [
        {"timestamp": 0, "input_length": 7, "output_length": 1, "hash_ids": [3, 9]}])
    (req,) = load_mooncake_trace(small, block_tokens=4)
    assert req.prompt.tolist() == expand_block_ids((3, 9), 7, 4).tolist()
    assert req.prompt[4:].tolist() == expand_block_ids((9,), 3, 4).tolist()


@pytest.mark.parametrize("bad,message", [
    ({**GOOD, "timestamp": "5"}, "'timestamp' must be a finite number >= 0, got '5'"),
    ({**GOOD, "timestamp": True}, "'timestamp' must be a finite number >= 0, got True"),
    ('{"timestamp": NaN, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
     "'timestamp' must be a finite number >= 0, got nan"),
    ('{"timestamp": Infinity, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]}',
     "'timestamp' must be a finite number >= 0, got inf"),
    ({k: v for k, v in GOOD.items() if k != "input_length"}, "missing field 'input_length' \\(fields present: "
     "\\['hash_ids', 'output_length', 'timestamp'\\]\\)"),
    ({k: v for k, v in GOOD.items() if k != "output_length"}, "missing field 'output_length'"),
    ({**GOOD, "output_length": 2.0}, "'output_length' must be an integer >= 0, got 2.0"),
    ({**GOOD, "hash_ids": [1, -2]}, "'hash_ids' must be a list of integers >= 0"),
    ({**GOOD, "hash_ids": [1, True]}, "'hash_ids' must be a list of integers >= 0"),
    ({**GOOD, "hash_ids": "12"}, "'hash_ids' must be a list of integers >= 0"),
    ({**GOOD, "hash_ids": [1]}, "'hash_ids' too short for input_length 600: 1 ids cover 512 tokens, need 2"),
    ({**GOOD, "hash_ids": [1, 2, 3]}, "'hash_ids' too long for input_length 600: 3 ids, expected 2 of 512 tokens"),
    ("[1, 2]", "expected a JSON object, got list"),
    ('{"timestamp": 0, "input_length": 6', "bad JSON \\(Expecting ',' delimiter at column 35\\)"),
])
def test_mooncake_value_errors(tmp_path: Path, bad, message: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD, bad])
    with pytest.raises(ValueError, match=f"^{path}:2: {message}"):
        list(iter_mooncake_records(path))


def test_a_mooncake_line_past_the_limit_is_not_read(tmp_path: Path) -> None:
    """``limit`` stops before the next line is parsed: a bad line after it is never reached."""
    path = _write_jsonl(tmp_path / "m.jsonl", [GOOD, "{broken"])
    assert len(list(iter_mooncake_records(path, limit=1))) == 1


@pytest.mark.parametrize("bad,message", [
    ({"prompt_token_ids": "123", "output_len": 1}, "'prompt_token_ids' must be a non-empty list of integers"),
    ({"prompt_token_ids": [[1], [2]], "output_len": 1}, "'prompt_token_ids' must be a flat list of integers"),
    ({"prompt_token_ids": [1, "2"], "output_len": 1}, "'prompt_token_ids' must be a flat list of integers"),
    ({"prompt_token_ids": [2**64 - 1, 2**63], "output_len": 1},    # numpy reads them as uint64
     "token ids must be int64 values \\(the rule of Request\\), got range "
     "\\[9223372036854775808, 18446744073709551615\\]"),
    ({"prompt_token_ids": [1], "output_len": 1.5}, "'output_len' must be an integer >= 0, got 1.5"),
    ({"prompt_token_ids": [1], "output_len": 1, "arrival_s": True}, "'arrival_s' must be a finite number >= 0, got True"),
    ({"prompt_token_ids": [1], "output_len": 1, "arrival_s": "0"}, "'arrival_s' must be a finite number >= 0, got '0'"),
    ('{"prompt_token_ids": [1], "output_len": 1, "arrival_s": Infinity}', "'arrival_s' must be a finite number >= 0, got inf"),
    ({"prompt_token_ids": [1], "output_len": 1, "session": 3}, "'session' must be a string, got 3"),
    ({"prompt_token_ids": [1], "output_len": 1, "request_id": ""}, "'request_id' must be a non-empty string, got ''"),
    ({"prompt_token_ids": [1], "output_len": 1, "request_id": 7}, "'request_id' must be a non-empty string, got 7"),
    ({"prompt_token_ids": [1], "output_len": 1, "request_id": "tok-0"}, "duplicate request_id 'tok-0'"),
    ({"output_len": 1}, "missing field 'prompt_token_ids' \\(fields present: \\['output_len'\\]\\)"),
])
def test_token_trace_value_errors(tmp_path: Path, bad, message: str) -> None:
    path = _write_jsonl(tmp_path / "tok.jsonl", [{"prompt_token_ids": [7], "output_len": 1}, bad])
    with pytest.raises(ValueError, match=f"^{path}:2: {message}"):
        load_token_trace(path)


def test_token_trace_defaults_by_hand(tmp_path: Path) -> None:
    """Missing arrival_s is 0.0 and an integer one becomes a float; missing request_id is
    ``<stem>-<index among the loaded requests>`` (blank lines do not count); a given session
    and id are kept; the prompt is int64."""
    path = _write_jsonl(tmp_path / "x.jsonl.gz.jsonl", [
        {"prompt_token_ids": [1, 2], "output_len": 0, "arrival_s": 3},
        "",
        {"prompt_token_ids": [3], "output_len": 5, "session": "s", "request_id": "mine"},
        {"prompt_token_ids": [4], "output_len": 1},
    ])
    a, b, c = load_token_trace(path)
    assert (a.request_id, a.arrival_s, a.session, a.output_len) == ("x.jsonl.gz-0", 3.0, None, 0)
    assert isinstance(a.arrival_s, float) and a.prompt.dtype == np.int64
    assert (b.request_id, b.arrival_s, b.session, b.output_len) == ("mine", 0.0, "s", 5)
    assert c.request_id == "x.jsonl.gz-2"


def test_resolve_trace_by_path_or_bundled_name(tmp_path: Path, monkeypatch) -> None:
    """An existing file wins over a bundled name; a bundled name is its packaged file; a folder
    and a missing path are refused by name, the latter listing the bundled traces; a bundled
    trace whose file is gone asks for a reinstall."""
    from hybridkv.sim.traffic import traces
    own = _write_jsonl(tmp_path / "mooncake-synthetic", [GOOD])
    monkeypatch.chdir(tmp_path)
    assert traces.resolve_trace("mooncake-synthetic") == Path("mooncake-synthetic")
    assert traces.resolve_trace(own) == own
    bundled = traces.BUNDLED_TRACES["mooncake-conversation"]
    assert traces.resolve_trace("mooncake-conversation") == bundled.path
    assert bundled.path.name == "mooncake_conversation.jsonl.xz"
    with pytest.raises(ValueError, match=f"^trace {str(tmp_path)!r} is not a file$"):
        traces.resolve_trace(tmp_path)
    with pytest.raises(ValueError, match=r"^trace file 'nope.jsonl' does not exist \(bundled traces: "
                                         r"mooncake-conversation, mooncake-synthetic; see `hybridkv "
                                         r"traces`\)$"):
        traces.resolve_trace("nope.jsonl")
    gone = bundled._replace(name="gone", file="gone.jsonl.xz")
    monkeypatch.setitem(traces.BUNDLED_TRACES, "gone", gone)
    with pytest.raises(ValueError, match=r"^bundled trace 'gone' is missing from the installed "
                                         r"package \(.*gone.jsonl.xz\); reinstall hybridkv$"):
        traces.resolve_trace("gone")


def test_trace_format_reads_the_first_non_blank_line(tmp_path: Path) -> None:
    from hybridkv.sim.traffic.traces import trace_format
    assert trace_format(_write_jsonl(tmp_path / "m.jsonl", ["", GOOD])) == "mooncake"
    tokens = tmp_path / "t.jsonl"
    tokens.write_text('\n  \n{"prompt_token_ids": [1], "output_len": 1}\n{"hash_ids": []}\n')
    assert trace_format(tokens) == "tokens"
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n \n")
    with pytest.raises(ValueError, match=f"^{empty}: the trace is empty$"):
        trace_format(empty)
    bad = tmp_path / "b.jsonl.xz"
    bad.write_bytes(b"not xz at all")
    with pytest.raises(ValueError, match=f"^{bad}: cannot read the trace \\("):
        trace_format(bad)


def _splitmix64_reference(x: int) -> int:
    """Vigna's splitmix64 finalizer on Python ints (mod 2**64), as published."""
    m = (1 << 64) - 1
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


@pytest.mark.parametrize("block_tokens", [1, 2, 3, 512, 513])
def test_expanded_tokens_are_the_splitmix_of_id_and_position(block_tokens: int) -> None:
    """Token j of id h is ``splitmix64(((h << s) | j) + golden) >> 33`` with s the bits a
    position needs (at least 1): the values every Mooncake result depends on. The largest id
    that fits beside s position bits is accepted; one more is refused, as are too few ids."""
    from hybridkv.sim.traffic.traces import expand_block_ids
    s = max(1, (block_tokens - 1).bit_length())
    top = (1 << (64 - s)) - 1
    ids = [0, 7, 123456789, top]
    got = expand_block_ids(ids, len(ids) * block_tokens - 1, block_tokens)
    golden = 0x9E3779B97F4A7C15
    want = [_splitmix64_reference((((h << s) | j) + golden) & ((1 << 64) - 1)) >> 33
            for h in ids for j in range(block_tokens)][:len(ids) * block_tokens - 1]
    assert got.tolist() == want and got.dtype == np.int64
    with pytest.raises(ValueError, match=f"^block id {top + 1} too large for {block_tokens}-token blocks$"):
        expand_block_ids([top + 1], 1, block_tokens)
    with pytest.raises(ValueError, match=f"^2 block ids of {block_tokens} tokens cannot give "
                                         f"{2 * block_tokens + 1} tokens$"):
        expand_block_ids([1, 2], 2 * block_tokens + 1, block_tokens)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from([1, 2, 3, 16, 511, 512, 513]), st.data())
def test_the_compiled_expansion_is_numpys(block_tokens: int, data: st.DataObject) -> None:
    """The build's expansion (one C loop when compiled) gives numpy's tokens (the reference,
    :func:`expand_numpy`) for ids from 0 to the largest that fits, any cut of the last block,
    zero tokens and no ids included: the same values, dtype int64, a writable array."""
    from tests.core.test_compiled import _require_compiled
    _require_compiled()                      # (the source's expansion is numpy's itself)
    from hybridkv.sim.traffic.token_ids import expand_block_ids, expand_numpy
    s = max(1, (block_tokens - 1).bit_length())
    ids = data.draw(st.lists(st.one_of(st.integers(0, (1 << (64 - s)) - 1), st.integers(0, 999),
                                       st.just((1 << (64 - s)) - 1)), max_size=6))
    n = data.draw(st.integers(0, len(ids) * block_tokens))
    got, want = expand_block_ids(ids, n, block_tokens), expand_numpy(ids, n, block_tokens)
    assert got.dtype == want.dtype == np.int64 and got.tolist() == want.tolist()
    assert len(got) == n and got.flags.writeable


@pytest.mark.parametrize("name, stem", [("a.jsonl.xz", "a"), ("a.json.gz", "a"), ("dir/b.json", "b"),
                                        ("c.jsonl", "c"), (".xz", ".xz"), (".jsonl.xz", ".jsonl"),
                                        ("d.XZ", "d.XZ"), ("e.txt", "e.txt")])
def test_trace_stem_drops_json_and_compression_suffixes(name: str, stem: str) -> None:
    from hybridkv.sim.traffic.traces import trace_stem
    assert trace_stem(name) == stem


def test_gzip_traces_read_like_plain_ones(tmp_path: Path) -> None:
    """A ``.gz`` trace (UTF-8 text) reads to the same requests as its plain file; its format is
    detected through the compression; a bad gzip stream is named."""
    import gzip

    from hybridkv.sim.traffic.traces import load_mooncake_trace, open_trace_text, trace_format
    plain = _write_jsonl(tmp_path / "m.jsonl", [GOOD, dict(GOOD, timestamp=5)])
    gz = tmp_path / "m.jsonl.gz"
    gz.write_bytes(gzip.compress(plain.read_bytes()))
    with open_trace_text(gz) as fh:
        assert fh.read() == plain.read_text(encoding="utf-8")
    assert trace_format(gz) == "mooncake"
    a, b = load_mooncake_trace(plain), load_mooncake_trace(gz)
    assert [(r.arrival_s, r.prompt.tolist()) for r in a] == [(r.arrival_s, r.prompt.tolist()) for r in b]
    assert len(a) == 2
    bad = tmp_path / "x.jsonl.gz"
    bad.write_bytes(b"not gzip")
    with pytest.raises(ValueError, match=f"^{bad}: cannot read the trace \\("):
        trace_format(bad)


def test_a_trace_request_owns_a_read_only_copy_of_its_prompt() -> None:
    """A writeable int64 prompt is copied: the caller's array stays writeable and its later
    changes do not reach the request."""
    arr = np.arange(5, dtype=np.int64)
    req = TraceRequest("r", 0.0, arr, 1)
    assert arr.flags.writeable and not req.prompt.flags.writeable
    arr[0] = 99
    assert req.prompt.tolist() == [0, 1, 2, 3, 4]


def test_unreadable_and_cut_lines_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "b.jsonl.xz"
    bad.write_bytes(b"not xz at all")
    with pytest.raises(ValueError, match=f"^{bad}: cannot read the trace \\("):
        list(iter_mooncake_records(bad))
    cut = _write_jsonl(tmp_path / "c.jsonl", [GOOD, '{"timestamp": "x'])
    with pytest.raises(ValueError, match=f"^{cut}:2: bad JSON \\(Unterminated string starting at "
                                         f"column 15\\)$"):
        list(iter_mooncake_records(cut))


def test_a_cut_line_reports_its_own_end_column_and_trailing_text_is_refused(tmp_path: Path) -> None:
    """Only the line break is stripped before parsing: a cut line that ends in blanks reports
    the column after them, and text after a complete object is bad JSON, not ignored."""
    cut = tmp_path / "cut.jsonl"
    cut.write_text('{"prompt_token_ids": [1, 2],   \n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{cut}:1: bad JSON \\(Expecting property name "
                                         f"enclosed in double quotes at column 32\\)$"):
        load_token_trace(cut)
    extra = tmp_path / "extra.jsonl"
    extra.write_text('{"prompt_token_ids": [1, 2], "output_len": 1}X\n', encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{extra}:1: bad JSON \\(Extra data at column 46\\)$"):
        load_token_trace(extra)


def test_traces_are_read_as_utf8_whatever_the_locale(tmp_path: Path) -> None:
    """A trace is UTF-8 text on every machine: under an ASCII locale (UTF-8 mode and locale
    coercion off) a token trace with non-ASCII request ids and sessions loads as under UTF-8,
    plain, gzip and xz alike."""
    import gzip
    import lzma
    import os
    import subprocess
    import sys

    import hybridkv
    text = "".join(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 1, "request_id": rid,
                               "session": "sé"}, ensure_ascii=False) + "\n"
                   for rid in ("café-1", "東京-2"))
    paths = [tmp_path / "t.jsonl", tmp_path / "t.jsonl.gz", tmp_path / "t.jsonl.xz"]
    paths[0].write_text(text, encoding="utf-8")
    paths[1].write_bytes(gzip.compress(text.encode("utf-8")))
    paths[2].write_bytes(lzma.compress(text.encode("utf-8")))
    here = [[(r.request_id, r.session) for r in load_token_trace(p)] for p in paths]
    assert here == [[("café-1", "sé"), ("東京-2", "sé")]] * 3
    script = ("import json, sys, locale; from hybridkv.sim.traffic.traces import load_token_trace; "
              "print(json.dumps([locale.getpreferredencoding(False)] + [[(r.request_id, r.session) "
              "for r in load_token_trace(p)] for p in sys.argv[1:]]))")
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0",
               PYTHONIOENCODING="ascii", PYTHONPATH=str(Path(hybridkv.__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", script, *map(str, paths)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    encoding, *there = json.loads(out.stdout)
    assert encoding.lower() not in ("utf-8", "utf8")      # the locale really is not UTF-8
    assert [[tuple(x) for x in t] for t in there] == here


# ---- the Mooncake ids' granularity (issue #44, point 2) ------------------------------------------

def test_mooncake_block_warning_names_the_id_size_and_the_effect():
    from hybridkv.sim.traffic.traces import mooncake_block_warning
    assert mooncake_block_warning(16) == (
        "Mooncake hash ids cover 512 tokens and block_size=16 cuts them: a turn continuing an "
        "earlier request diverges at the last 512-token boundary before that request's end, not "
        "at its end, so up to 511 cached tokens per turn are never hit again and sliding-window "
        "or recurrent groups keep no window or checkpoint there (missed as 'windows' / "
        "'checkpoints'); block_size=512 matches the ids")
    assert mooncake_block_warning(512) is None and mooncake_block_warning(1024) is None
    assert mooncake_block_warning(256).startswith("Mooncake hash ids cover 512 tokens and block_size=256")
    assert "block_size=64 matches" in mooncake_block_warning(16, block_tokens=64)


def test_the_bundled_conversation_turns_diverge_at_the_earlier_turns_last_id(trace_dir):
    """The effect the warning names, on the trace itself: of the first 3,000 requests, every
    one that continues an earlier request (all of its ids but the last, at least 2) has a new
    id where the earlier one's last id was."""
    recs = [r.hash_ids for r in iter_mooncake_records(trace_dir / "mooncake_conversation.jsonl.xz", 3000)]
    same = differ = 0
    for i, ids in enumerate(recs):
        for a in recs[max(0, i - 200):i]:
            if len(a) > 2 and len(ids) > len(a) and ids[:len(a) - 1] == a[:-1]:
                same += ids[len(a) - 1] == a[-1]
                differ += ids[len(a) - 1] != a[-1]
                break
    assert (same, differ) == (0, 137)


@pytest.mark.parametrize("extra, warned", [(["--block-size", "16"], True), ([], True),
                                            (["--block-size", "512"], False)])
def test_cli_warns_about_a_block_size_that_cuts_mooncake_ids_by_default(trace_dir, capsys, extra, warned):
    from hybridkv.cli import main
    assert main(["simulate", "--trace", "mooncake-conversation", "--limit", "5", "--preset",
                 "llama-3.1-8b", "--gpus", "1", "--no-progress", "--no-optimum", *extra]) == 0
    err = capsys.readouterr().err
    size = extra[1] if extra else "16"            # llama-3.1-8b's own block size
    line = (f"hybridkv simulate: warning: Mooncake hash ids cover 512 tokens and --block-size {size} "
            "cuts them: a turn continuing")
    assert (line in err) == warned and ("Mooncake hash ids" in err) == warned

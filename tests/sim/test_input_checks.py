"""Inputs that used to be accepted silently (issue #44, point 5), each now a one-line error or,
where legal but suspicious, a warning: a prompt beyond the model's context, an unknown trace
field, a session that goes on after ``last_turn``, a session hint without a session. (The
manager's ``free()`` of an unknown request or twice: tests/core/test_manager_api.py and
tests/core/test_release.py.)"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.cost.presets import MODEL_PRESETS, get_preset
from hybridkv.sim.traffic.traces import (MOONCAKE_FIELDS, TOKEN_FIELDS, TraceWarning, iter_mooncake_records,
                                 load_token_trace)
from hybridkv.sim.traffic.workitems import WorkItem
from hybridkv.sim.traffic.workload_fit import context_warning


def _write(path: Path, *lines: dict) -> Path:
    path.write_text("".join(json.dumps(d) + "\n" for d in lines))
    return path


def _tok(n: int = 4, **kw) -> dict:
    return {"prompt_token_ids": list(range(1, n + 1)), "output_len": 1, **kw}


def _moon(**kw) -> dict:
    return {"timestamp": 0, "input_length": 20, "output_length": 1, "hash_ids": [7], **kw}


# ---- unknown fields ---------------------------------------------------------------------------

def test_a_misspelt_token_trace_field_is_named_with_the_known_ones(tmp_path):
    p = _write(tmp_path / "t.jsonl", _tok(session="a"), _tok(sesion="a"))
    with pytest.raises(ValueError) as info:
        load_token_trace(p)
    assert str(info.value) == (f"{p}:2: unknown field 'sesion' (did you mean 'session'?); known: "
                               "prompt_token_ids, output_len, arrival_s, session, request_id, hint, "
                               "cache_control, prompt_cache_key, prompt_cache_retention, nvext, "
                               "checkpoints")


def test_an_unknown_mooncake_field_is_named_with_the_known_ones(tmp_path):
    p = _write(tmp_path / "m.jsonl", _moon(), _moon(priority=3))
    with pytest.raises(ValueError) as info:
        list(iter_mooncake_records(p))
    assert str(info.value) == (f"{p}:2: unknown field 'priority'; known: timestamp, input_length, "
                               "output_length, hash_ids, session, hint, cache_control, "
                               "prompt_cache_key, prompt_cache_retention, nvext")
    public = ("cache_control", "prompt_cache_key", "prompt_cache_retention", "nvext")
    assert MOONCAKE_FIELDS[-6:] == ("session", "hint", *public)
    assert TOKEN_FIELDS[-8:] == ("session", "request_id", "hint", *public, "checkpoints")


def test_cli_names_the_unknown_field(tmp_path, capsys):
    p = _write(tmp_path / "t.jsonl", _tok(sesion="a"))
    assert main(["simulate", "--trace", str(p), "--preset", "llama-3.1-8b", "--gpus", "1",
                 "--no-progress"]) == 2
    assert capsys.readouterr().err == (f"hybridkv simulate: error: {p}:1: unknown field 'sesion' (did "
                                       "you mean 'session'?); known: prompt_token_ids, output_len, "
                                       "arrival_s, session, request_id, hint, cache_control, "
                                       "prompt_cache_key, prompt_cache_retention, nvext, "
                                       "checkpoints\n")


# ---- hints --------------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("last_turn", True), ("continues", 0.5), ("resume_s", 3)])
def test_a_session_hint_without_a_session_is_refused(tmp_path, field, value):
    p = _write(tmp_path / "t.jsonl", _tok(hint={field: value}))
    with pytest.raises(ValueError) as info:
        load_token_trace(p)
    assert str(info.value) == (f"{p}:1: 'hint' field {field!r} is about the request's session, but "
                               "the line has no 'session'")
    m = _write(tmp_path / "m.jsonl", _moon(hint={field: value}))
    with pytest.raises(ValueError, match=rf"^{m}:1: 'hint' field '{field}' is about the request's session"):
        list(iter_mooncake_records(m))


def test_a_pin_without_a_session_is_still_a_hint(tmp_path):
    (r,) = load_token_trace(_write(tmp_path / "t.jsonl", _tok(hint={"pin_s": 5})))
    assert r.hint.pin_s == 5 and r.session is None


def test_turns_after_last_turn_are_warned_about_once(tmp_path):
    p = _write(tmp_path / "t.jsonl",
               _tok(session="a", hint={"last_turn": True}), _tok(session="b", hint={"last_turn": True}),
               _tok(session="a"), _tok(session="c"), _tok(session="b"), _tok(session="a"))
    with pytest.warns(TraceWarning) as got:
        reqs = load_token_trace(p)
    assert len(reqs) == 6 and len(got) == 1
    assert str(got[0].message) == (
        f"{p}: 2 sessions send more requests after a hint with last_turn true (first: session "
        "'a', last_turn at line 1, next request at line 3); the hint is wrong there, or a session "
        "id is reused")
    m = _write(tmp_path / "m.jsonl", _moon(session="s", hint={"last_turn": True}), _moon(session="s"))
    with pytest.warns(TraceWarning, match=rf"^{m}: 1 session sends more requests after a hint with "
                                          r"last_turn true \(first: session 's', last_turn at line 1, "
                                          r"next request at line 2\)"):
        assert len(list(iter_mooncake_records(m))) == 2


def test_a_session_that_really_ends_is_not_warned_about(tmp_path):
    p = _write(tmp_path / "t.jsonl", _tok(session="a"), _tok(session="a", hint={"last_turn": True}),
               _tok(session="b"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", TraceWarning)
        assert len(load_token_trace(p)) == 3


def test_cli_prints_the_trace_warning_as_one_line(tmp_path, capsys):
    p = _write(tmp_path / "t.jsonl", _tok(session="a", hint={"last_turn": True}),
               _tok(8, session="a", arrival_s=1.0))
    assert main(["simulate", "--trace", str(p), "--preset", "llama-3.1-8b", "--gpus", "1",
                 "--no-progress", "--no-optimum"]) == 0
    err = capsys.readouterr().err
    assert (f"hybridkv simulate: warning: {p}: 1 session sends more requests after a hint with "
            "last_turn true (first: session 'a', last_turn at line 1, next request at line 2); the "
            "hint is wrong there, or a session id is reused\n") in err


# ---- the model's context ---------------------------------------------------------------------

def test_presets_know_their_context():
    assert {n: get_preset(n).context_len for n in MODEL_PRESETS} == {
        "llama-3.1-8b": 131_072, "gemma-3-27b": 131_072, "gpt-oss-120b": 131_072,
        "llama-4-scout": 10_485_760, "deepseek-v3": 163_840, "deepseek-v4-style": None,
        "deepseek-v4-flash": 1_048_576,
        "qwen3-next-80b-a3b": 262_144, "nemotron-h-8b": None}


def _items(*lens: int) -> list[WorkItem]:
    return [WorkItem(f"r{i}", float(i), n, 1, None) for i, n in enumerate(lens)]


def test_context_warning_by_hand():
    llama = get_preset("llama-3.1-8b")
    assert context_warning(llama, _items(131_071, 5), None) is None
    assert context_warning(llama, _items(131_072, 10_000_000, 5), None) == (
        "2 of 3 requests have prompts of at least llama-3.1-8b's context of 131,072 tokens (the "
        "longest: 10,000,000); the real model cannot run them, the simulation does: "
        "max_model_len=131072 rejects them")
    assert context_warning(llama, _items(10_000_000), 131_072) is None     # rejected anyway
    assert context_warning(llama, _items(5), 200_000) == (
        "max_model_len=200000 is beyond llama-3.1-8b's context of 131,072 tokens: the real model "
        "cannot run requests that long")
    assert context_warning(get_preset("deepseek-v4-style"), _items(10_000_000), None) is None


def test_cli_warns_about_a_prompt_beyond_the_context(tmp_path, capsys):
    p = _write(tmp_path / "t.jsonl", _tok(140_000), _tok(10))
    argv = ["simulate", "--trace", str(p), "--preset", "llama-3.1-8b", "--gpus", "1", "--no-progress",
            "--no-optimum"]
    assert main(argv) == 0
    assert ("hybridkv simulate: warning: 1 of 2 requests have prompts of at least llama-3.1-8b's "
            "context of 131,072 tokens (the longest: 140,000); the real model cannot run them, the "
            "simulation does: --max-model-len 131072 rejects them\n") in capsys.readouterr().err
    assert main([*argv, "--max-model-len", "131072"]) == 0
    err = capsys.readouterr().err
    assert "context" not in err
    assert main(["sweep", "--trace", str(p), "--preset", "llama-3.1-8b", "--gpus", "1",
                 "--no-progress", "--no-optimum", "--cache-tokens-list", "300k"]) == 0
    assert ("hybridkv sweep: warning: 1 of 2 requests have prompts of at least llama-3.1-8b's "
            "context") in capsys.readouterr().err


# ---- checkpoint marks ---------------------------------------------------------------------------

def test_token_trace_checkpoints_are_read_and_checked(tmp_path):
    """load_token_trace — a line's "checkpoints" become TraceRequest.checkpoints (sorted, without
    repeats); a position outside [1, prompt length] or not an integer is named with its line."""
    p = _write(tmp_path / "t.jsonl", _tok(6, checkpoints=[4, 2, 4]), _tok(6))
    assert [r.checkpoints for r in load_token_trace(p)] == [(2, 4), ()]
    for bad in ([7], [0], [1.5], 3):
        q = _write(tmp_path / "b.jsonl", _tok(6, checkpoints=bad))
        with pytest.raises(ValueError) as info:
            load_token_trace(q)
        assert str(info.value) == (f"{q}:1: 'checkpoints' must be a list of prompt positions in "
                                   f"[1, 6], got {bad!r}")

"""Request traces for the simulator: the request record, trace-file loaders and the bundled
traces (the seeded synthetic generators are :mod:`hybridkv.sim.traffic.workloads`).

A workload is a ``list[TraceRequest]`` in arrival order. Every request carries its prompt as
token ids, so a token-level manager can hash it; Mooncake traces also keep their raw block ids
(``block_ids``) so block-level simulations (:mod:`hybridkv.sim.bounds.optimal`) can run without tokens.

Loaders (every malformed line raises ``ValueError("<file>:<line>: <what is wrong>")``):

* :func:`load_mooncake_trace` — the Mooncake FAST'25 JSONL format
  ``{"timestamp": ms, "input_length": n, "output_length": m, "hash_ids": [...], "session"?: str,
  "hint"?: {...}}``.
* :func:`load_token_trace` — ``{"prompt_token_ids": [...], "output_len": m, "arrival_s"?: s,
  "session"?: str, "request_id"?: str, "hint"?: {...}, "checkpoints"?: [positions]}``
  (positions the application marks for a checkpoint: :attr:`TraceRequest.checkpoints`).

Both formats take an optional ``"hint"`` object (:func:`parse_hint`): what the application told
the cache about the request's session, ``{"last_turn"?: bool, "continues"?: p, "pin_s"?: s,
"pin_tokens"?: n, "resume_s"?: s}`` (:class:`hybridkv.core.hints.Hint`; its session is the
line's ``"session"``: the session fields ``last_turn``, ``continues`` and ``resume_s`` need one).
Both also take the public APIs' cache fields (:data:`~hybridkv.core.public_hints.PUBLIC_HINT_FIELDS`:
Anthropic ``"cache_control"``, OpenAI ``"prompt_cache_key"`` / ``"prompt_cache_retention"``,
Dynamo ``"nvext"``), mapped onto the same hint by :func:`~hybridkv.core.public_hints.public_hint`
(a malformed one names the file and line).

A field neither format knows is an error naming it (a typo such as ``"sesion"`` would otherwise
vanish). What is legal but suspicious is a :class:`TraceWarning` (``warnings.warn``): a session
that sends more requests after a hint said ``last_turn``.

Trace files may be plain, gzip (``.gz``) or xz (``.xz``) compressed. Public traces ship inside
the package (:data:`BUNDLED_TRACES`, e.g. ``"mooncake-conversation"``); :func:`resolve_trace`
turns a bundled name or a path into a file and :func:`trace_format` tells the two formats apart.
"""

from __future__ import annotations

import difflib
import gzip
import json
import lzma
import math
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from hybridkv.core.hints import Hint
from hybridkv.core.public_hints import PUBLIC_HINT_FIELDS
from hybridkv.core.request import INT64_MAX, INT64_MIN
from hybridkv.core.validation import check_int
from hybridkv.sim.traffic.bundled import BUNDLED_TRACES, BundledTrace, resolve_trace
from hybridkv.sim.traffic.token_ids import MOONCAKE_BLOCK_TOKENS, expand_block_ids
from hybridkv.sim.traffic.trace_hints import line_hint, parse_hint

__all__ = [
    "BUNDLED_TRACES",
    "MOONCAKE_BLOCK_TOKENS",
    "BundledTrace",
    "MOONCAKE_FIELDS",
    "MooncakeRecord",
    "TOKEN_FIELDS",
    "TraceRequest",
    "TraceWarning",
    "expand_block_ids",
    "iter_mooncake_records",
    "load_mooncake_trace",
    "load_token_trace",
    "mooncake_block_warning",
    "open_trace_text",
    "parse_hint",
    "resolve_trace",
    "trace_format",
    "trace_stem",
]


MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids", "session", "hint",
                   *PUBLIC_HINT_FIELDS)
"""The fields of a Mooncake trace line."""

TOKEN_FIELDS = ("prompt_token_ids", "output_len", "arrival_s", "session", "request_id", "hint",
                *PUBLIC_HINT_FIELDS, "checkpoints")
"""The fields of a token trace line."""


class TraceWarning(UserWarning):
    """A trace that loads but is probably not what its author meant (the message says why)."""


def mooncake_block_warning(block_size: int, block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> str | None:
    """Why a Mooncake trace at ``block_size`` tokens per block is distorted, or None when the
    block size is a multiple of the ids' ``block_tokens`` (512).

    A Mooncake trace has no tokens, only one hash id per ``block_tokens`` prompt tokens (the
    last id covering the partial tail); the loader expands each id into pseudo tokens. A
    request that continues an earlier one (the next turn of a conversation) shares the earlier
    prompt's ids up to its last whole id and gets a new id where the earlier one's partial tail
    was, so it diverges at the last ``block_tokens`` boundary before the earlier request's end,
    not at its end. At a block size that cuts the ids, the up to ``block_tokens - 1`` tokens
    after that boundary were cached and are never hit again, and a sliding-window or recurrent
    group keeps its window or checkpoint at the earlier request's end, where the next turn
    never comes back: the full-attention blocks hit but the next turn falls back (counted as
    *windows* or *checkpoints* in the gap report). A token-level trace has neither effect.
    """
    if block_size % block_tokens == 0:
        return None
    return (f"Mooncake hash ids cover {block_tokens} tokens and block_size={block_size} cuts them: a "
            f"turn continuing an earlier request diverges at the last {block_tokens}-token boundary "
            f"before that request's end, not at its end, so up to {block_tokens - 1} cached tokens "
            f"per turn are never hit again and sliding-window or recurrent groups keep no window or "
            f"checkpoint there (missed as 'windows' / 'checkpoints'); block_size={block_tokens} "
            f"matches the ids")

TOKEN_ID_LIMIT = 2**31
"""Pseudo-token ids from :func:`expand_block_ids` lie in ``[0, TOKEN_ID_LIMIT)``."""



# --------------------------------------------------------------------------------------------
# The request record
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class TraceRequest:
    """One request of a workload.

    Attributes:
        request_id: unique within the workload.
        arrival_s: arrival time in seconds from the start of the workload (finite, >= 0).
        prompt: the prompt's token ids, a read-only 1-D ``int64`` array (at least one token).
        output_len: tokens the request generates (>= 0).
        session: conversation / agent the request belongs to (None for independent requests).
        block_ids: the trace's raw block ids (Mooncake ``hash_ids``), empty when the workload
            has no block-level ids.
        output_ids: the output tokens, when the workload knows them (generators whose next
            turn repeats this answer); a simulator then emits exactly these.
        hint: what the application tells the cache about the request's session (None: nothing).
        checkpoints: prompt positions the application marks as worth a checkpoint (the end of
            its system prompt; :attr:`hybridkv.core.request.Request.checkpoints`), each in
            ``[1, prompt_len]``; a simulator serves them only when asked
            (``SimConfig.checkpoint_marks``).

    Equality compares every field (the prompt by value); instances are not hashable.
    """

    request_id: str
    arrival_s: float
    prompt: np.ndarray
    output_len: int
    session: str | None = None
    block_ids: tuple[int, ...] = field(default=())
    output_ids: np.ndarray | None = None
    hint: Hint | None = None
    checkpoints: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        prompt = np.asarray(self.prompt)
        if prompt.ndim != 1 or prompt.size == 0 or prompt.dtype.kind not in "iu":
            raise ValueError(
                f"TraceRequest {self.request_id!r}: prompt must be a non-empty 1-D array of integer "
                f"token ids, got shape {prompt.shape} dtype {prompt.dtype}"
            )
        if prompt.dtype != np.int64 or prompt.flags.writeable:
            prompt = prompt.astype(np.int64, copy=True)  # own a private, read-only copy
        prompt.flags.writeable = False
        object.__setattr__(self, "prompt", prompt)
        if isinstance(self.arrival_s, bool) or not isinstance(self.arrival_s, (int, float)) \
                or not math.isfinite(self.arrival_s) or self.arrival_s < 0:
            raise ValueError(
                f"TraceRequest {self.request_id!r}: arrival_s must be finite and >= 0, "
                f"got {self.arrival_s!r}"
            )
        object.__setattr__(self, "arrival_s", float(self.arrival_s))
        if isinstance(self.output_len, bool) or not isinstance(self.output_len, (int, np.integer)) \
                or self.output_len < 0:
            raise ValueError(
                f"TraceRequest {self.request_id!r}: output_len must be an integer >= 0, "
                f"got {self.output_len!r}"
            )
        object.__setattr__(self, "output_len", int(self.output_len))
        if self.output_ids is not None:
            out = np.asarray(self.output_ids, dtype=np.int64)
            if out.shape != (self.output_len,):
                raise ValueError(
                    f"TraceRequest {self.request_id!r}: output_ids must hold output_len="
                    f"{self.output_len} tokens, got shape {out.shape}")
            object.__setattr__(self, "output_ids", out)
        object.__setattr__(self, "block_ids", tuple(int(b) for b in self.block_ids))
        if self.hint is not None:
            if not isinstance(self.hint, Hint):
                raise ValueError(f"TraceRequest {self.request_id!r}: hint must be a Hint or None, "
                                 f"got {self.hint!r}")
            self.hint.check_prompt(prompt.size, f"TraceRequest {self.request_id!r}")
        marks = tuple(self.checkpoints)
        if not all(is_int(m) and 0 < m <= prompt.size for m in marks):
            raise ValueError(f"TraceRequest {self.request_id!r}: checkpoints must be integers in "
                             f"[1, {prompt.size}] (the prompt), got {list(marks)!r}")
        object.__setattr__(self, "checkpoints", tuple(sorted({int(m) for m in marks})))

    @property
    def prompt_len(self) -> int:
        """Number of prompt tokens."""
        return int(self.prompt.size)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TraceRequest):
            return NotImplemented
        return (
            self.request_id == other.request_id
            and self.arrival_s == other.arrival_s
            and self.output_len == other.output_len
            and self.session == other.session
            and self.block_ids == other.block_ids
            and self.hint == other.hint
            and self.checkpoints == other.checkpoints
            and np.array_equal(self.prompt, other.prompt)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"TraceRequest(request_id={self.request_id!r}, arrival_s={self.arrival_s!r}, "
            f"prompt_len={self.prompt_len}, output_len={self.output_len}, "
            f"session={self.session!r}, blocks={len(self.block_ids)})"
        )


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def open_trace_text(path: str | Path) -> IO[str]:
    """Open a trace for reading text, decompressing ``.xz`` and ``.gz`` files transparently."""
    path = Path(path)
    if path.suffix == ".xz":
        return lzma.open(path, "rt", encoding="utf-8")
    if path.suffix == ".gz":
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open("r", encoding="utf-8")


def trace_stem(path: str | Path) -> str:
    """The file name without ``.jsonl`` and compression suffixes (request ids are built on it)."""
    name = Path(path).name
    for suffix in (".xz", ".gz", ".jsonl", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return name


def _iter_json_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (1-based line number, object) for each non-blank line; bad JSON raises ValueError."""
    with open_trace_text(path) as fh:
        lines = enumerate(fh, start=1)
        while True:
            try:
                lineno, line = next(lines)
            except StopIteration:
                return
            except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as exc:
                raise ValueError(f"{path}: cannot read the trace ({exc})") from None
            if not line.strip():
                continue
            try:
                obj = json.loads(line.rstrip("\r\n"))   # a cut line reports its own end column
            except json.JSONDecodeError as exc:
                what = exc.msg.removesuffix(" at")           # "Unterminated string starting at"
                raise ValueError(f"{path}:{lineno}: bad JSON ({what} at column {exc.colno})") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
            yield lineno, obj


def _field(path: Path, lineno: int, obj: dict[str, Any], name: str) -> Any:
    try:
        return obj[name]
    except KeyError:
        raise ValueError(
            f"{path}:{lineno}: missing field {name!r} (fields present: {sorted(obj)})"
        ) from None


def _check_fields(path: Path, lineno: int, obj: dict[str, Any], known: tuple[str, ...]) -> None:
    """ValueError naming the first field of ``obj`` not in ``known`` (and the closest known one)."""
    unknown = sorted(set(obj) - set(known))
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1, cutoff=0.75)
        near = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"{path}:{lineno}: unknown field {unknown[0]!r}{near}; known: "
                         f"{', '.join(known)}")


class _SessionEnds:
    """Sessions that send another request after a ``last_turn`` hint (one warning at the end)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.ended: dict[str, int] = {}          # session -> line of its last_turn hint
        self.continued: set[str] = set()
        self.first: tuple[str, int, int] | None = None

    def see(self, lineno: int, session: str | None, hint: Hint | None) -> None:
        if session is not None and session in self.ended:
            self.continued.add(session)
            if self.first is None:
                self.first = (session, self.ended[session], lineno)
            del self.ended[session]
        if session is not None and hint is not None and hint.last_turn:
            self.ended[session] = lineno

    def warn(self) -> None:
        if self.first is not None:
            session, end, again = self.first
            n = len(self.continued)
            warnings.warn(TraceWarning(
                f"{self.path}: {n} session{'' if n == 1 else 's'} send{'s' if n == 1 else ''} more "
                f"requests after a hint with last_turn true (first: session {session!r}, last_turn "
                f"at line {end}, next request at line {again}); the hint is wrong there, or a "
                "session id is reused"), stacklevel=3)


def _line_session(path: Path, lineno: int, obj: dict[str, Any]) -> str | None:
    session = obj.get("session")
    if session is not None and not isinstance(session, str):
        raise ValueError(f"{path}:{lineno}: 'session' must be a string, got {session!r}")
    return session


def _nonneg_int(path: Path, lineno: int, obj: dict[str, Any], name: str) -> int:
    value = _field(path, lineno, obj, name)
    check_int(f"{path}:{lineno}: {name!r}", value, 0)
    return value


@dataclass(frozen=True, slots=True)
class MooncakeRecord:
    """One validated line of a Mooncake trace (no tokens).

    Attributes:
        lineno: 1-based line number in the file.
        timestamp_ms: arrival time in milliseconds.
        input_length: prompt tokens (>= 1).
        output_length: generated tokens (>= 0).
        hash_ids: one id per ``block_tokens`` prompt tokens, the last covering the partial tail.
        session: the line's optional ``"session"``.
        hint: the line's optional ``"hint"`` (:func:`parse_hint`).
    """

    lineno: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    session: str | None = None
    hint: Hint | None = None


def iter_mooncake_records(
    path: str | Path, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> Iterator[MooncakeRecord]:
    """Validate and yield the records of a Mooncake JSONL trace without expanding tokens.

    Raises:
        ValueError: naming the file and the 1-based line of the first bad line: bad JSON,
            a missing or unknown field (:data:`MOONCAKE_FIELDS`), a negative or non-integer
            length, a negative timestamp, ``hash_ids`` whose length is not
            ``ceil(input_length / block_tokens)``, or a bad hint (:func:`parse_hint`).

    Warns:
        TraceWarning: a session sends more requests after a ``last_turn`` hint.
    """
    path = Path(path)
    check_int("limit", limit, 0, optional=True)
    check_int("block_tokens", block_tokens, 1)
    if limit == 0:
        return
    count = 0
    ends = _SessionEnds(path)
    for lineno, obj in _iter_json_lines(path):
        _check_fields(path, lineno, obj, MOONCAKE_FIELDS)
        ts = _field(path, lineno, obj, "timestamp")
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts) or ts < 0:
            raise ValueError(f"{path}:{lineno}: 'timestamp' must be a finite number >= 0, got {ts!r}")
        input_length = _nonneg_int(path, lineno, obj, "input_length")
        if input_length == 0:
            raise ValueError(f"{path}:{lineno}: 'input_length' must be >= 1, got 0")
        output_length = _nonneg_int(path, lineno, obj, "output_length")
        hash_ids = _field(path, lineno, obj, "hash_ids")
        if not isinstance(hash_ids, list) or not all(is_int(h) and h >= 0 for h in hash_ids):
            raise ValueError(f"{path}:{lineno}: 'hash_ids' must be a list of integers >= 0")
        need = -(-input_length // block_tokens)
        if len(hash_ids) < need:
            raise ValueError(
                f"{path}:{lineno}: 'hash_ids' too short for input_length {input_length}: "
                f"{len(hash_ids)} ids cover {len(hash_ids) * block_tokens} tokens, need {need}"
            )
        if len(hash_ids) > need:
            raise ValueError(
                f"{path}:{lineno}: 'hash_ids' too long for input_length {input_length}: "
                f"{len(hash_ids)} ids, expected {need} of {block_tokens} tokens"
            )
        session = _line_session(path, lineno, obj)
        hint = line_hint(path, lineno, obj, session, input_length)
        count += 1
        ends.see(lineno, session, hint)
        yield MooncakeRecord(lineno, float(ts), input_length, output_length, tuple(hash_ids),
                             session, hint)
        if limit is not None and count >= limit:
            ends.warn()
            return                                   # the next line is never read
    ends.warn()


def load_mooncake_trace(
    path: str | Path, limit: int | None = None, block_tokens: int = MOONCAKE_BLOCK_TOKENS
) -> list[TraceRequest]:
    """Load a Mooncake FAST'25 JSONL trace as token-level requests.

    Each ``hash_ids`` entry becomes ``block_tokens`` pseudo tokens (:func:`expand_block_ids`);
    the prompt is cut to ``input_length``. ``arrival_s = timestamp / 1000``; request ids are
    ``"<file stem>-<index>"``; ``block_ids`` keeps the raw ids. Memory is 8 bytes per prompt
    token (the whole conversation trace is ~1.2 GB: pass ``limit``, or use
    :func:`iter_mooncake_records` when only block ids are needed).

    Args:
        path: the JSONL file.
        limit: load at most this many requests (None: all).
        block_tokens: tokens per hash id (512 in the Mooncake release).

    Raises:
        ValueError: for the first bad line, naming the file and line (see
            :func:`iter_mooncake_records`).
    """
    path = Path(path)
    out: list[TraceRequest] = []
    for i, rec in enumerate(iter_mooncake_records(path, limit, block_tokens)):
        prompt = expand_block_ids(rec.hash_ids, rec.input_length, block_tokens)
        prompt.flags.writeable = False  # TraceRequest keeps a read-only int64 array as is
        out.append(
            TraceRequest(
                request_id=f"{trace_stem(path)}-{i}",
                arrival_s=rec.timestamp_ms / 1000.0,
                prompt=prompt,
                output_len=rec.output_length,
                session=rec.session,
                block_ids=rec.hash_ids,
                hint=rec.hint,
            )
        )
    return out


def load_token_trace(path: str | Path) -> list[TraceRequest]:
    """Load a token-level JSONL trace.

    Line format: ``{"prompt_token_ids": [int, ...], "output_len": int, "arrival_s"?: float,
    "session"?: str, "request_id"?: str, "hint"?: {...}, "checkpoints"?: [int, ...]}``
    (:func:`parse_hint`; checkpoint positions in ``[1, prompt length]``). Missing ``arrival_s`` means 0.0 (an offline batch);
    missing ``request_id`` means ``"<file stem>-<index>"``. File order is kept.

    Raises:
        ValueError: naming the file and 1-based line of the first bad line: bad JSON, a missing
            field, an empty prompt or token ids that are not int64 integers (the rule of
            :class:`~hybridkv.core.request.Request`: any int64 value, negative ones included,
            is an opaque token the cache hashes; the engine checks the vocabulary), a negative or
            non-integer output_len, a negative or non-finite arrival_s, a non-string session or
            request_id, a duplicate request_id, an unknown field (:data:`TOKEN_FIELDS`), or a
            malformed hint (:func:`parse_hint`).

    Warns:
        TraceWarning: a session sends more requests after a ``last_turn`` hint.
    """
    path = Path(path)
    out: list[TraceRequest] = []
    seen_ids: set[str] = set()
    ends = _SessionEnds(path)
    for lineno, obj in _iter_json_lines(path):
        _check_fields(path, lineno, obj, TOKEN_FIELDS)
        raw = _field(path, lineno, obj, "prompt_token_ids")
        if not isinstance(raw, list) or not raw:
            raise ValueError(f"{path}:{lineno}: 'prompt_token_ids' must be a non-empty list of integers")
        try:
            prompt = np.asarray(raw)
        except (ValueError, TypeError):
            prompt = np.asarray([], dtype=object)
        if prompt.ndim != 1 or prompt.dtype.kind not in "iu":
            raise ValueError(f"{path}:{lineno}: 'prompt_token_ids' must be a flat list of integers")
        if int(prompt.min()) < INT64_MIN or int(prompt.max()) > INT64_MAX:
            raise ValueError(
                f"{path}:{lineno}: token ids must be int64 values (the rule of Request), got "
                f"range [{prompt.min()}, {prompt.max()}]"
            )
        output_len = _nonneg_int(path, lineno, obj, "output_len")
        arrival = obj.get("arrival_s", 0.0)
        if isinstance(arrival, bool) or not isinstance(arrival, (int, float)) \
                or not math.isfinite(arrival) or arrival < 0:
            raise ValueError(f"{path}:{lineno}: 'arrival_s' must be a finite number >= 0, got {arrival!r}")
        session = _line_session(path, lineno, obj)
        hint = line_hint(path, lineno, obj, session, int(prompt.size))
        request_id = obj.get("request_id", f"{trace_stem(path)}-{len(out)}")
        if not isinstance(request_id, str) or not request_id:
            raise ValueError(f"{path}:{lineno}: 'request_id' must be a non-empty string, got {request_id!r}")
        if request_id in seen_ids:
            raise ValueError(f"{path}:{lineno}: duplicate request_id {request_id!r}")
        seen_ids.add(request_id)
        marks = obj.get("checkpoints", [])
        if not isinstance(marks, list) or not all(is_int(m) and 0 < m <= prompt.size for m in marks):
            raise ValueError(f"{path}:{lineno}: 'checkpoints' must be a list of prompt positions in "
                             f"[1, {prompt.size}], got {marks!r}")
        ends.see(lineno, session, hint)
        out.append(
            TraceRequest(request_id, float(arrival), prompt.astype(np.int64), output_len, session,
                         hint=hint, checkpoints=tuple(marks))
        )
    ends.warn()
    return out


def trace_format(path: str | Path) -> str:
    """``"mooncake"`` when the first non-blank line has ``hash_ids``, else ``"tokens"`` (whose
    loader then names whatever is wrong with the line).

    Raises:
        ValueError: an empty or unreadable file (the path is named).
    """
    with open_trace_text(path) as fh:
        try:
            first = next((line for line in fh if line.strip()), "")
        except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as exc:
            raise ValueError(f"{path}: cannot read the trace ({exc})") from None
    if not first:
        raise ValueError(f"{path}: the trace is empty")
    return "mooncake" if '"hash_ids"' in first else "tokens"

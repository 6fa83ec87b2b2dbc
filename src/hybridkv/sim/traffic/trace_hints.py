"""The hints a trace line carries: its ``"hint"`` object (:func:`parse_hint`) and the public
cache-control fields (:mod:`hybridkv.core.public_hints`), merged by :func:`line_hint`; every
error names the line (``file:line``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hybridkv.core.hints import Hint
from hybridkv.core.public_hints import public_hint

__all__ = ["HINT_FIELDS", "SESSION_HINT_FIELDS", "line_hint", "parse_hint"]

#: The fields of a trace line's ``"hint"`` object (:func:`parse_hint`).
HINT_FIELDS = ("last_turn", "continues", "pin_s", "pin_tokens", "resume_s")
#: The hint fields about the request's session (a line without ``"session"`` cannot give them).
SESSION_HINT_FIELDS = ("last_turn", "continues", "resume_s")


def parse_hint(value: object, session: object, where: str, prompt_len: int) -> Hint:
    """The :class:`~hybridkv.core.hints.Hint` of a trace line's ``"hint"`` object (fields
    :data:`HINT_FIELDS`, all optional; ``session`` is the line's). ``where`` names the line
    (``file:line``) in every error: not an object, an unknown field, a bad value (a negative
    time, a probability outside [0, 1], ...), a pin longer than the prompt, or a session field
    (:data:`SESSION_HINT_FIELDS`) on a line without a session."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: 'hint' must be an object with fields among {', '.join(HINT_FIELDS)}, "
                         f"got {value!r}")
    unknown = sorted(set(value) - set(HINT_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown 'hint' field {unknown[0]!r}; valid: {', '.join(HINT_FIELDS)}")
    try:
        hint = Hint(session=session, **value)
        hint.check_prompt(prompt_len, "prompt")
    except ValueError as exc:
        raise ValueError(f"{where}: bad 'hint': {exc}") from None
    about_session = [f for f in SESSION_HINT_FIELDS if f in value]
    if session is None and about_session:
        raise ValueError(f"{where}: 'hint' field {about_session[0]!r} is about the request's "
                         "session, but the line has no 'session'")
    return hint


def line_hint(path: Path, lineno: int, obj: dict[str, Any], session: str | None,
              prompt_len: int) -> Hint | None:
    """The hint of a trace line: its ``"hint"`` object (:func:`parse_hint`) merged with its
    public cache fields (:func:`~hybridkv.core.public_hints.public_hint`); errors name
    ``file:line``."""
    where = f"{path}:{lineno}"
    hint = obj.get("hint")
    if hint is not None:
        hint = parse_hint(hint, session, where, prompt_len)
    try:
        return public_hint(obj, session, hint)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None

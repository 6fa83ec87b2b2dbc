"""The transformers versions the engine is proven equal to, and the warning outside them.

The engine loads checkpoints itself, so transformers matters in two places: the version that
wrote a checkpoint's ``config.json`` (its ``transformers_version`` field) fixes which field
names and defaults the file uses, and the installed transformers is the oracle the engine's
tests compare with (and the tokenizer of a checkpoint without ``tokenizer.json``). CI runs the
engine's equivalence tests against both ends of :data:`TESTED_TRANSFORMERS`; outside them the
engine still runs, and says once per version, in one line, that it is untested there.

Where versions disagree on a model, the engine follows the model's reference implementation:
gpt-oss's ``swiglu_limit`` comes from ``config.json`` (transformers reads it from 5.19 on; older
releases clamp at a fixed 7.0, which equals the published checkpoints' value).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

#: Oldest and newest transformers release the engine equivalence suite passes on. Supported:
#: ``TESTED_TRANSFORMERS[0] <= version < next minor after TESTED_TRANSFORMERS[1]`` (patch
#: releases of the newest tested minor are in range); pyproject.toml declares the same range.
TESTED_TRANSFORMERS = ("4.57.6", "5.24.0")

_warned: set[tuple[str, str]] = set()


class UntestedTransformersWarning(UserWarning):
    """A checkpoint or the installed transformers is outside :data:`TESTED_TRANSFORMERS`."""


def parse_version(text: str) -> tuple[int, int, int] | None:
    """``"4.55.0.dev0"`` -> ``(4, 55, 0)``; None when ``text`` does not start ``MAJOR.MINOR``."""
    m = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(text))
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)


def range_text() -> str:
    """The tested range as a requirement string, e.g. ``>=4.57.6,<5.25``."""
    major, minor, _ = parse_version(TESTED_TRANSFORMERS[1])  # type: ignore[misc]
    return f">={TESTED_TRANSFORMERS[0]},<{major}.{minor + 1}"


def in_tested_range(version: str) -> bool:
    """True when ``version`` lies in the tested range (a dev / rc build counts as its release)."""
    v = parse_version(version)
    low = parse_version(TESTED_TRANSFORMERS[0])
    high = parse_version(TESTED_TRANSFORMERS[1])
    assert low is not None and high is not None
    return v is not None and low <= v and v[:2] <= high[:2]


def _warn(subject: str, version: str) -> None:
    if (subject, version) in _warned:
        return
    _warned.add((subject, version))
    warnings.warn(f"{subject} {version}, outside the range the engine is tested against "
                  f"(transformers{range_text()}): equality with transformers is unproven there",
                  UntestedTransformersWarning, stacklevel=3)


def check_checkpoint_version(raw: dict[str, Any], model_dir: str | Path) -> None:
    """Warn once per version when ``config.json``'s ``transformers_version`` is outside the range
    (a config without the field, such as the engine's own random checkpoints, is not checked)."""
    version = raw.get("transformers_version")
    if version is not None and not in_tested_range(str(version)):
        _warn(f"checkpoint {Path(model_dir).name!r} was written by transformers", str(version))


def check_installed_transformers(version: str) -> None:
    """Warn once when the installed transformers (the tokenizer here) is outside the range."""
    if not in_tested_range(version):
        _warn("the tokenizer runs on the installed transformers", version)

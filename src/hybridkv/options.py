"""Command-line value types shared by the subcommands (``sim`` and ``engine`` both parse them).

Each is an ``argparse`` type: it returns the parsed value or raises
``argparse.ArgumentTypeError`` with the bad text and the valid range, which argparse prefixes
with the option the user typed (``argument --block-size: must be ...``) and turns into a
one-line usage error (exit status 2). This module imports nothing of hybridkv, so every layer
may use it.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable, Mapping


def int_in(lo: int, hi: int | None = None) -> Callable[[str], int]:
    """An integer in ``[lo, hi]`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"must be an integer {rng}, got {text!r}")
        return value
    parse.__name__ = "integer"
    return parse


def non_negative_number(text: str) -> float:
    """A finite number >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


def parse_retention(text: str) -> int | None:
    """A sliding-window retention interval: ``none`` (or ``dense``) -> None, else an integer
    >= 0 (0: replay boundaries only; N: every N tokens too)."""
    if text.strip().lower() in ("none", "dense"):
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(
            f"retention interval must be 'none' or an integer >= 0, got {text!r}")
    return value


def name_options(message: str, options: Mapping[str, str]) -> str:
    """A library error with the config field names it mentions replaced by the command-line
    options that set them (``max_model_len=3`` -> ``--max-model-len 3``; a field may be
    prefixed by its config class, ``CacheConfig.num_blocks``). ``options`` maps field names to
    the option text of one command: the library names its fields, each command its options."""
    if not options:
        return message
    pattern = re.compile(r"\b(?:[A-Z][A-Za-z]*Config\.)?(" + "|".join(map(re.escape, options))
                         + r")\b(=)?")
    return pattern.sub(lambda m: options[m[1]] + (" " if m[2] else ""), message)

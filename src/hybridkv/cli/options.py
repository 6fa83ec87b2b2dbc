"""Every command-line value type of the ``hybridkv`` commands.

Each is an ``argparse`` type: it returns the parsed value or raises
``argparse.ArgumentTypeError`` with the bad text and the valid range, which argparse prefixes
with the option the user typed (``argument --block-size: must be ...``) and turns into a
one-line usage error (exit status 2). Rules that belong to the library (an eviction policy's
name, a speculative-decoding spec, a prefix retention) are asked of the library, so a flag, a
config field and a Python caller get the same message from the one place that knows the rule.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Callable, Mapping

from hybridkv.core.spec_decode import SPEC_OFF, SpecDecode, parse_spec
from hybridkv.cost.gpus import GPU_PRESETS, GpuPreset, get_gpu

MAX_SPEC_TOKENS = 64
"""Largest ``--spec METHOD:K`` (EAGLE uses 1-5, DFlash 7-15; each token is a lookahead slot
that every running request holds in every group)."""
MAX_BLOCK_SIZE = 4096
DEFAULT_GPU = "h100"
_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def _type_error(exc: ValueError) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(str(exc))


# ---- presets -----------------------------------------------------------------------------------


def gpu_preset(text: str) -> GpuPreset:
    """``--gpu NAME``: the GPU preset object, resolved once while the options are parsed."""
    try:
        return get_gpu(text.strip())
    except ValueError as exc:
        raise _type_error(exc) from None


def add_gpu_option(p: argparse._ActionsContainer, default: str | None = DEFAULT_GPU,
                   what: str = "GPU preset", default_text: str | None = None) -> None:
    """The one declaration of ``--gpu``: ``args.gpu`` is a :class:`GpuPreset` (argparse resolves
    a string default too), or None when ``default`` is None and the option is not given.
    ``what``/``default_text``: the command's words for the option and for its default."""
    p.add_argument("--gpu", type=gpu_preset, default=default, metavar="GPU",
                   help=f"{what}: {', '.join(GPU_PRESETS)} (default {default_text or default})")


# ---- numbers -----------------------------------------------------------------------------------


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


def positive_number(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def parse_max_skew(text: str) -> float:
    """``--router-max-skew``: a finite number >= 1, or ``none`` (no bound: returned as inf)."""
    if text.strip().lower() == "none":
        return math.inf
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number or 'none': {text!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 1 or 'none', got {text!r}")
    return value


def fraction(lo_open: bool) -> Callable[[str], float]:
    """An argparse type: a float in ``(0, 1]`` (``lo_open``) or ``[0, 1]``."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        ok = (0 < value <= 1) if lo_open else (0 <= value <= 1)
        if not ok:  # NaN fails both comparisons
            raise argparse.ArgumentTypeError(f"must be in {'(0, 1]' if lo_open else '[0, 1]'}, got {text!r}")
        return value
    parse.__name__ = "fraction"
    return parse


def parse_count(text: str) -> int:
    """``"3M"`` -> 3000000, ``"500k"`` -> 500000, ``"1.5G"``, ``"1e9"``; plain integers too.

    Refuses non-numbers, NaN, infinities, negative and fractional counts (0 is allowed here;
    :func:`positive_count` refuses it).
    """
    t = text.strip().lower().replace("_", "")
    mult = 1
    if t and t[-1] in _SUFFIX:
        mult = _SUFFIX[t[-1]]
        t = t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (examples: 4096, 500k, 3M, 1e9)") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite count: {text!r}")
    if value < 0 or value != int(value):
        raise argparse.ArgumentTypeError(f"not a non-negative whole count: {text!r}")
    return int(value)


def positive_count(text: str) -> int:
    """:func:`parse_count` that also refuses 0 (a size the user gives is never replaced)."""
    value = parse_count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return value


def parse_count_list(text: str) -> list[int]:
    """``"1M,3M,10M"`` -> sizes (each >= 1); an empty item is named."""
    out = []
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: 1M,3M,10M)")
        try:
            out.append(positive_count(item))
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"item {i} of {text!r}: {exc}") from None
    return out


def parse_int_list(lo: int, hi: int) -> Callable[[str], list[int]]:
    """``"1,2,4"`` -> distinct integers in ``[lo, hi]``, in the given order; an item is named."""
    one = int_in(lo, hi)

    def parse(text: str) -> list[int]:
        out: list[int] = []
        for i, item in enumerate(text.split(","), 1):
            if not item.strip():
                raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: 1,2,4)")
            try:
                value = one(item)
            except argparse.ArgumentTypeError as exc:
                raise argparse.ArgumentTypeError(f"item {i} of {text!r}: {exc}") from None
            if value not in out:
                out.append(value)
        return out
    parse.__name__ = "list"
    return parse


def parse_block_size(text: str) -> int:
    """A power of two in ``[1, MAX_BLOCK_SIZE]``."""
    value = int_in(1, MAX_BLOCK_SIZE)(text)
    if value & (value - 1):
        raise argparse.ArgumentTypeError(
            f"must be a power of two in [1, {MAX_BLOCK_SIZE}] (e.g. 16, 64, 256), got {text!r}")
    return value


# ---- retention ---------------------------------------------------------------------------------


def parse_retention(text: str) -> int | None:
    """A retention interval: ``none`` (or ``dense``) -> None, else an integer >= 0 (0: replay
    boundaries only; N: every N tokens too). For a state group the promised hit ends are where
    checkpoints are written, so it is the checkpoint interval too."""
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


def parse_retention_list(text: str) -> list[int | None]:
    """``"none,0,1024"`` -> retention intervals; an empty item is named."""
    out = []
    for i, item in enumerate(text.split(","), 1):
        if not item.strip():
            raise argparse.ArgumentTypeError(f"item {i} of {text!r} is empty (example: none,0,1024)")
        out.append(parse_retention(item))
    return out


def parse_prefix_retention(text: str):
    """``TOKENS:PRIORITY[:TTL_S]`` -> :class:`~hybridkv.sim.simulator.PrefixRetention`."""
    from hybridkv.sim.simulator import PrefixRetention
    try:
        return PrefixRetention.parse(text)
    except ValueError as exc:
        raise _type_error(exc) from None


# ---- eviction policies (the names and the rules are the core's) -------------------------------


def parse_policy(text: str) -> str:
    """One eviction policy name (``recommended`` kept as given; the manager resolves it)."""
    from hybridkv.core.eviction import resolve_policy
    try:
        resolve_policy(text)
    except ValueError as exc:
        raise _type_error(exc) from None
    return text


def sweepable_policies() -> tuple[str, ...]:
    """``--eviction-policies all``: the policies that order on their own (``priority`` without
    retention configs is LRU; it is swept with ``--prefix-retention``)."""
    from hybridkv.core.eviction import POLICIES, resolve_policy
    out: list[str] = []
    for name in POLICIES:
        concrete = resolve_policy(name)
        if concrete != "priority" and concrete not in out:
            out.append(concrete)
    return tuple(out)


class AllPolicies(list):
    """``--eviction-policies all``: the sweepable policies, remembered as "all" (a preset may
    run only some of them)."""


def parse_policy_list(text: str) -> list[str]:
    """``a,b,c`` or ``all`` -> distinct resolved names, in the given order."""
    from hybridkv.core.eviction import resolve_policy
    if text.strip() == "all":
        return AllPolicies(sweepable_policies())
    out: list[str] = []
    for part in text.split(","):
        name = resolve_policy(parse_policy(part.strip()))
        if name not in out:
            out.append(name)
    return out


# ---- speculative decoding ----------------------------------------------------------------------


def spec_argument(text: str) -> SpecDecode | str:
    """``--spec`` of ``simulate`` / ``sweep``: :func:`hybridkv.core.spec_decode.parse_spec`'s
    grammar; ``none`` stays :data:`SPEC_OFF` here (it turns a preset's method off; no option
    means the preset's)."""
    try:
        spec = parse_spec(text)
    except ValueError as exc:
        raise _type_error(exc) from None
    if spec is not None and not 1 <= spec.num_speculative_tokens <= MAX_SPEC_TOKENS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: K (speculative tokens per step) must be in [1, {MAX_SPEC_TOKENS}]")
    return SPEC_OFF if spec is None else spec


def engine_spec_argument(text: str) -> str:
    """``--spec`` of ``generate``: ``METHOD:K`` with a method the reference engine drafts
    with, or ``none`` (imports the engine, so only when ``generate`` parses it)."""
    from hybridkv.engine.llm_options import ENGINE_SPEC_METHODS
    usage = f"METHOD:K with METHOD in {', '.join(ENGINE_SPEC_METHODS)} and K an integer >= 1, or none"
    try:
        spec = parse_spec(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{usage}, got {text!r}") from None
    if spec is not None and spec.method not in ENGINE_SPEC_METHODS:
        raise argparse.ArgumentTypeError(f"{usage}, got {text!r} (the reference engine does not "
                                         f"implement {spec.method!r})")
    return text


# ---- generate ----------------------------------------------------------------------------------


def prompt_ids(text: str) -> list[int]:
    """``1,2,3`` -> token ids (at least one)."""
    try:
        ids = [int(t) for t in text.split(",") if t.strip()]  # "1 2" is refused, not read as 12
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids needs at least one token id")
    bad = next((t for t in ids if t < 0), None)
    if bad is not None:
        raise argparse.ArgumentTypeError(f"token ids are >= 0 (below the model's vocabulary "
                                         f"size), got {bad} in {text!r}")
    return ids


BLOCK_SIZE_KINDS = ("full", "sliding", "mla")


def engine_block_size(text: str) -> int | dict[str, int]:
    """``16`` or ``full=16,sliding=8``: every size an integer >= 1, kinds from
    :data:`BLOCK_SIZE_KINDS`."""
    usage = f"N or KIND=N,... with KIND in {', '.join(BLOCK_SIZE_KINDS)} and N an integer >= 1"
    if "=" not in text:
        try:
            return int_in(1)(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} ({usage})") from None
    sizes: dict[str, int] = {}
    for part in text.split(","):
        kind, _, value = (t.strip() for t in part.partition("="))
        if kind not in BLOCK_SIZE_KINDS or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"{usage}, got {text!r}")
        sizes[kind] = int(value)
    return sizes


# ---- library errors in the words of the command line -------------------------------------------


# ---- cost model ---------------------------------------------------------------------------------


def step_argument(text: str) -> list[tuple[int, int]]:
    """A step ``N@C[xB],...`` (:func:`hybridkv.cost.grid.parse_step`) as its work list."""
    from hybridkv.cost.grid import parse_step
    try:
        return parse_step(text)
    except ValueError as exc:
        raise _type_error(exc) from None


def profile_argument(text: str):
    """A profile file (:func:`hybridkv.cost.profile.load_profile`), read and fitted."""
    from hybridkv.cost.profile import load_profile
    try:
        return load_profile(text)
    except ValueError as exc:
        raise _type_error(exc) from None


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

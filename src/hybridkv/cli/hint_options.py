"""The hint options of ``simulate`` and ``sweep``: "what if my application told the cache ...?".

``--hints KIND[=SECONDS][:ACCURACY]`` synthesises hints from the workload's own future
(:mod:`hybridkv.sim.traffic.hint_synthesis`): ``session-end`` (the last turn of a session says so),
``ttl[=SECONDS]`` (a continuing session's request pins its prompt, default 300 s), ``resume``
(a continuing session's request says when it comes back), each right with probability
ACCURACY (default 1; 0.5: random); a last ``:force`` makes the pool follow every hint untested
instead of testing them first. ``simulate`` runs the workload with and without them and
prints both; ``sweep --hints KIND:A,B,...`` runs every accuracy (and no hints) at every cache
size and prints and draws hit rate (and, timed, TTFT) against accuracy. A trace whose lines
carry ``"hint"`` objects (or the public APIs' cache fields: :mod:`hybridkv.core.public_hints`)
is served with its own hints unless ``--hints`` replaces them. ``--pins hard|soft`` makes every
pin of the hints served that kind (:attr:`hybridkv.core.hints.Hint.soft`); ``sweep --pins
hard,soft`` puts both in one table, on the same hints.

The value is checked where it is parsed (a known kind, an accuracy in [0, 1], a TTL > 0); the
rules that involve other options in :func:`check_hint_options`, before the trace is read.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Sequence

from hybridkv.sim.traffic.hint_synthesis import HINT_KINDS, HintSpec
from hybridkv.core.hints import RETENTION_KINDS

__all__ = ["HintSweep", "add_hint_options", "apply_hints", "check_hint_options", "parse_hint_spec",
           "parse_hint_sweep", "parse_pins"]


def parse_pins(text: str) -> tuple[str, ...]:
    """``hard``, ``soft`` or a comma list of them (argparse type of ``sweep --pins``)."""
    kinds = tuple(k.strip() for k in str(text).split(","))
    bad = [k for k in kinds if k not in RETENTION_KINDS]
    if bad or len(set(kinds)) != len(kinds):
        what = f"unknown pin kind {bad[0]!r}" if bad else f"a pin kind repeated in {text!r}"
        raise argparse.ArgumentTypeError(f"{what}; valid: {', '.join(RETENTION_KINDS)} "
                                         "(a comma list in sweep, e.g. hard,soft)")
    return kinds


def parse_hint_spec(text: str) -> HintSpec:
    """``KIND[=SECONDS][:ACCURACY][:force]`` (argparse type)."""
    try:
        return HintSpec.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclasses.dataclass(frozen=True, slots=True)
class HintSweep:
    """``sweep --hints``: one kind at several accuracies."""

    specs: tuple[HintSpec, ...]

    def __str__(self) -> str:
        first = str(dataclasses.replace(self.specs[0], force=False)).rsplit(":", 1)[0]
        return (f"{first}:{','.join(f'{s.accuracy:g}' for s in self.specs)}"
                + (":force" if self.specs[0].force else ""))


def parse_hint_sweep(text: str) -> HintSweep:
    """``KIND[=SECONDS][:A,B,...][:force]`` (argparse type): the accuracies of one kind (a
    last ``:force`` applies to each)."""
    text = str(text).strip()
    force = text.endswith(":force")
    if force:
        text = text[:-len(":force")]
    head, sep, accs = text.partition(":")
    items = accs.split(",") if sep else [""]
    specs = []
    for i, acc in enumerate(items, 1):
        if sep and not acc.strip():
            raise argparse.ArgumentTypeError(f"accuracy {i} of {text!r} is empty (example: "
                                             "session-end:0.5,0.8,1)")
        spec = parse_hint_spec(f"{head}:{acc}" if acc.strip() else head)
        specs.append(dataclasses.replace(spec, force=True) if force else spec)
    return HintSweep(tuple(specs))


def add_hint_options(p: argparse.ArgumentParser, sweep: bool = False) -> None:
    """``--hints`` (``sweep``: a list of accuracies)."""
    kinds = ", ".join(HINT_KINDS)
    if sweep:
        p.add_argument("--hints", type=parse_hint_sweep, metavar="KIND[=SECONDS]:A,B,...[:force]",
                       help=f"hints synthesised from the trace's future ({kinds}) at each accuracy "
                            "in [0, 1] (and without hints), at every cache size: hit rate (and TTFT) "
                            "against accuracy, e.g. session-end:0.5,0.8,1 (:force: followed untested)")
        p.add_argument("--pins", type=parse_pins, metavar="hard,soft",
                       help="run the hints (--hints, or the trace's own) with every pin made each "
                            "kind: hard (lasts its TTL from the release that set it) or soft "
                            "(refreshed by every hit, broken first); one table, e.g. "
                            "--hints ttl=300:1 --pins hard,soft")
    else:
        p.add_argument("--hints", type=parse_hint_spec, metavar="KIND[=SECONDS][:ACCURACY][:force]",
                       help=f"hints synthesised from the trace's future ({kinds}; ttl=SECONDS pins "
                            "for that long, default 300), right with probability ACCURACY in [0, 1] "
                            "(default 1; 0.5 is random); the run without hints is printed beside it "
                            "(--no-baseline skips it), e.g. session-end:0.8; :force follows every hint "
                            "untested instead of testing them first, e.g. session-end:1:force")
        p.add_argument("--pins", choices=RETENTION_KINDS,
                       help="make every pin of the hints served this kind: hard (lasts its TTL from "
                            "the release that set it) or soft (refreshed by every hit, broken "
                            "first); default: as the hints say (the public TTL fields are soft)")


def check_hint_options(args: argparse.Namespace) -> None:
    """What ``--hints`` cannot be combined with (before the trace is read)."""
    if getattr(args, "pins", None) is not None and (getattr(args, "instances", None) not in (None, 1)
                                                     or getattr(args, "router", None)):
        raise ValueError("--pins applies to hints, which simulate one instance; drop --instances / --router")
    if getattr(args, "hints", None) is None:
        return
    if args.vllm_compat:
        raise ValueError("--hints needs the hint layer in front of the eviction policy; "
                         "--vllm-compat pins vLLM's LRU order: drop one")
    if getattr(args, "instances", None) not in (None, 1) or getattr(args, "router", None):
        raise ValueError("--hints simulates one instance; drop --instances / --router")
    if getattr(args, "prefix_retention", None) is not None:
        raise ValueError("--hints and --prefix-retention both set how long blocks stay; give one")


def apply_hints(cfg, args: argparse.Namespace, items: Sequence, spec: HintSpec | None = None):
    """``cfg`` with the hints of the options: ``spec`` (default: ``--hints``) synthesised, or,
    without one, the trace's own hints when its requests carry any."""
    spec = spec if spec is not None else getattr(args, "hints", None)
    if isinstance(spec, HintSweep):
        spec = None
    carried = any(it.hint is not None for it in items)
    if spec is not None:
        return dataclasses.replace(cfg, hints=spec, trace_hints=False)
    if cfg.retention is not None and not carried:
        raise ValueError(f"--pins {cfg.retention} sets the kind of the hints' pins, but the workload "
                         "carries no hints; add --hints (e.g. --hints ttl=300)")
    return dataclasses.replace(cfg, trace_hints=carried) if carried else cfg

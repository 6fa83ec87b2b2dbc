"""The ``hybridkv`` command line: one module per command over the library.

==============  =============================================================================
module          what it holds
==============  =============================================================================
base.py         the :class:`Command` record, the :data:`COMMANDS` registry, and how errors
                become one line on stderr and an exit status (:func:`run_command`)
options.py      every argparse value type (each names the bad value and the valid range)
output.py       output-path checks, results that are never lost, JSON, progress bars
sim_options.py  the options ``simulate`` and ``sweep`` share -> a workload and a ``SimConfig``
simulate.py     ``simulate``; cluster.py: its ``--instances``/``--router``/``--kv-events-*``
sweep.py        ``sweep`` (sizes, retention intervals, eviction policies, state presets)
plan.py         ``plan``: the cheapest deployment meeting an SLO (:mod:`hybridkv.sim.plan`)
cost.py         ``cost``: one step's time and its split under the cost model
profile.py      ``profile``: measure a preset's steps on this machine, fit, write a profile
catalog.py      ``presets`` and ``traces``
generate.py     ``generate`` on the reference engine (torch is imported only when it runs)
demo.py         ``demo``
==============  =============================================================================

Adding a command is one module here whose last lines register it::

    def add_arguments(p: argparse.ArgumentParser) -> None: ...   # its options
    def run(args: argparse.Namespace) -> int: ...                 # the exit status

    COMMANDS.register("name", Command(help="one line", add_arguments=add_arguments, run=run))

plus its module name in the registration import below. ``run`` raises ``ValueError`` for bad
input (one line, exit status 2); the work itself is a library call (``hybridkv.sim``,
``hybridkv.engine``): a command parses, checks, calls and prints.
"""

from __future__ import annotations

import sys

from hybridkv.cli.base import COMMANDS, Command, build_parser, run_command, unknown_options
# Registration lines, in the order `hybridkv --help` lists the commands:
from hybridkv.cli import simulate, sweep, plan, cost, profile, catalog, generate, demo  # noqa: E402,F401  # isort: skip

DESCRIPTION = """\
The ``hybridkv`` command.

Subcommands:
    simulate  trace-driven simulation of a model's prefix cache and latency (the main job)
    sweep     hit rate against cache size, retention interval or instance count, with the
              offline optimum
    plan      the cheapest deployment that meets a latency SLO: $/M tokens, goodput, and what
              a CPU tier, hints and KV-aware routing save
    cost      what one engine step costs: time, compute / memory / attention split
    profile   measure a preset's step times on this machine's GPU (or CPU) and fit the cost model
    presets   model and GPU presets with their KV bytes per token
    traces    the request traces bundled with the package (Mooncake, Apache-2.0)
    generate  greedy generation with the reference engine (paged attention over the manager)
    demo      a short printed walk-through of prefix caching on a hybrid full + sliding-window
              model (retention, the scratch-first free queue, speculative decoding).

Errors are one line on stderr: exit status 2 for bad input (options, files, sizes), 1 for a
failure while running (out of memory, an unwritable file, an internal error; set
HYBRIDKV_DEBUG=1 to see the traceback of an internal error), 130 when interrupted.
"""


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` (default: the process's arguments), run the command, return its exit
    status (a usage error exits with status 2 from the parser)."""
    parser = build_parser(DESCRIPTION)
    args, extra = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
    if extra and not getattr(args, "accepts_any_arguments", False):
        unknown_options(parser, args.command, extra)
    args.extra_arguments = extra          # a command that accepts them reads them here
    return run_command(args, own_process=argv is None)


__all__ = ["COMMANDS", "Command", "main", "run_command"]

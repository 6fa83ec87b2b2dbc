"""The command contract: :class:`Command`, the :data:`COMMANDS` registry, and how a command's
errors become one line on stderr and an exit status (:func:`run_command`)."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable, Mapping

from hybridkv.cli.options import name_options
from hybridkv.core.registry import Registry
from hybridkv.sim.failures import ChildProcessDied


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand of ``hybridkv``.

    Attributes:
        help: the one-line summary ``hybridkv --help`` lists.
        add_arguments: adds the command's options to its parser; it may also override the
            parser's defaults (``func``: what runs, ``accepts_any_arguments``: no usage error
            for unknown options).
        run: runs the parsed options; returns the exit status. Errors it raises become one
            line (see :func:`run_command`).
        description: the text of ``hybridkv NAME --help`` (None: ``help``).
        option_names: config field names -> the options that set them, so a library error
            speaks in this command's options (:func:`~hybridkv.cli.options.name_options`).
    """

    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
    option_names: Mapping[str, str] = field(default_factory=dict)


#: Every command, in the order ``hybridkv --help`` lists them. A command module registers its
#: :class:`Command` with one line, ``COMMANDS.register("name", Command(...))``.
COMMANDS: Registry[Command] = Registry("command")


class OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (the subcommands' parsers inherit it)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def plain(text: str | None) -> str | None:
    """A docstring as ``--help`` shows it: reST roles and literals become plain text
    (``:class:`~a.B``` -> ``B``, double backquotes dropped)."""
    if text is None:
        return None
    text = re.sub(r":\w+:`~([\w.]+)`", lambda m: m[1].rsplit(".", 1)[-1], text)
    text = re.sub(r":\w+:`([^`]+)`", r"\1", text)
    return text.replace("``", "")


def build_parser(description: str) -> argparse.ArgumentParser:
    """The ``hybridkv`` parser with one subparser per registered command (descriptions in
    plain text: :func:`plain`)."""
    parser = OneLineParser(prog="hybridkv", description=plain(description),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    parser.commands = {}                      # name -> its parser (unknown_options' errors)
    for name, cmd in COMMANDS.items():
        p = sub.add_parser(name, help=cmd.help, description=plain(cmd.description or cmd.help),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=cmd.run, option_names=cmd.option_names)
        cmd.add_arguments(p)
        parser.commands[name] = p
    return parser


def unknown_options(parser: argparse.ArgumentParser, command: str, extra: list[str]) -> None:
    """The usage error for options ``command`` does not know, from that command's parser (so
    it points at ``hybridkv COMMAND --help``), with the closest known option when one is near."""
    sub = getattr(parser, "commands", {}).get(command, parser)
    known = [o for a in sub._actions for o in a.option_strings]
    hints = []
    for word in extra:
        if word.startswith("-"):
            close = difflib.get_close_matches(word.split("=", 1)[0], known, n=1, cutoff=0.8)
            if close:
                hints.append(f"{word}: did you mean {close[0]}?")
    more = f" ({'; '.join(hints)})" if hints else ""
    sub.error(f"unrecognized arguments: {' '.join(extra)}{more}")


def _stdout_broken() -> bool:
    """Whether standard output is a pipe whose reader has gone (``| head`` stopped reading):
    the write end then polls as an error. Not a real file descriptor (a test's capture):
    False; no ``poll`` on this platform: True (as before)."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    try:
        import select
        poller = select.poll()
    except (ImportError, AttributeError):
        return True
    poller.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poller.poll(0))


def _stop_on_first_interrupt(signum, frame) -> None:
    """SIGINT handler of a command: the first Ctrl-C stops the run; later ones are ignored
    while it stops its helpers and writes what finished (which takes seconds at most)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def run_command(args: argparse.Namespace, own_process: bool = False) -> int:
    """Run a parsed command; every error becomes one line on stderr and an exit status:
    2 for bad input (``ValueError``, ``RuntimeError``: a workload that cannot run as
    configured), 1 for a failure while running (out of memory, a helper process that died:
    :class:`~hybridkv.sim.failures.ChildProcessDied`, an unwritable file, an internal error;
    ``HYBRIDKV_DEBUG=1`` re-raises it), 130 when interrupted (Ctrl-C).

    During the command only the first Ctrl-C counts (:func:`_stop_on_first_interrupt`); the
    previous handler comes back afterwards, except after an interrupt in ``own_process`` (the
    process is about to exit: a second Ctrl-C must not cut that short)."""
    def fail(status: int, message: str) -> int:
        message = name_options(message, getattr(args, "option_names", None) or {})
        print(f"hybridkv {args.command}: error: {message}", file=sys.stderr)
        return status
    try:
        previous = signal.signal(signal.SIGINT, _stop_on_first_interrupt)
    except ValueError:                        # not the main thread: no signals here
        previous = None
    interrupted = False
    try:
        return args.func(args)
    except BrokenPipeError as exc:
        if not _stdout_broken():      # another pipe: a helper process died, never a success
            return fail(1, f"a pipe to a helper process broke ({exc.strerror or exc}): it died "
                           "before it answered")
        # piped into a reader that stopped early (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ValueError as exc:                 # bad input: a usage error
        return fail(2, str(exc))
    except MemoryError:
        return fail(1, "out of memory; use a smaller --cache-tokens / --num-blocks, --limit or "
                       "a shorter trace")
    except OSError as exc:
        where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
        return fail(1, f"{exc.strerror or exc}{where}")
    except ChildProcessDied as exc:           # a helper process died: a failure while running
        advice = ("; rerun with --no-optimum, a larger --block-size or --limit"
                  if exc.child == "optimum" else "")
        return fail(1, f"{exc}{advice}")
    except KeyboardInterrupt:
        interrupted = True
        signal.signal(signal.SIGINT, signal.SIG_IGN) if previous is not None else None
        print(file=sys.stderr)
        return fail(130, "interrupted")
    except RuntimeError as exc:               # e.g. a workload that cannot run as configured
        return fail(2, str(exc))
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback for users
        if os.environ.get("HYBRIDKV_DEBUG"):
            raise
        return fail(1, f"internal error {type(exc).__name__}: {exc} (please report it; "
                       "HYBRIDKV_DEBUG=1 shows the traceback)")
    finally:
        if previous is not None and not (interrupted and own_process):
            signal.signal(signal.SIGINT, previous)

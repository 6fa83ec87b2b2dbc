"""What the commands write: output-path checks, results that are never lost, JSON, progress."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, Iterator


STDOUT = "-"
"""``--json -``: the JSON goes to standard output (and the report to standard error)."""


def check_output_path(path: str | None, option: str, allow_stdout: bool = False) -> None:
    """Refuse, before a run, an output path that cannot be written: a missing folder, a
    folder, a file that does not open for writing (``/proc/version``); ``-`` is standard
    output where ``allow_stdout``. Nothing is created or changed."""
    if path is None:
        return
    if path == STDOUT:
        if allow_stdout:
            return
        raise ValueError(f"{option} '-': this output is a file, not standard output; give a file name")
    if not path.strip():
        raise ValueError(f"{option} {path!r}: give a file name")
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{option} {path!r} is a folder; give a file name")
    if not parent.is_dir():
        raise ValueError(f"{option} {path!r}: folder {str(parent)!r} does not exist")
    if p.exists():
        if not p.is_file():
            raise ValueError(f"{option} {path!r} is not a regular file; give a file name")
        try:
            with open(p, "ab"):          # opening to append changes nothing
                pass
        except OSError as exc:
            raise ValueError(f"{option} {path!r} is not writable ({exc.strerror or exc})") from None
        return
    try:
        with tempfile.NamedTemporaryFile(dir=parent, prefix=".hybridkv-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"{option} {path!r}: cannot create a file in {str(parent)!r} "
                         f"({exc.strerror or exc})") from None


def check_plot_path(path: str | None, others: dict[str, str | None]) -> None:
    """Refuse, before a run, a ``--plot`` matplotlib cannot write (its suffix) or a path another
    output option names too (``others``: option -> path)."""
    if path is None:
        return
    check_output_path(path, "--plot")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ValueError('--plot needs matplotlib: pip install "hybridkv[sim]"') from None
    suffix = Path(path).suffix.lower().lstrip(".")
    kinds = Figure().canvas.get_supported_filetypes()
    if suffix and suffix not in kinds:
        raise ValueError(f"--plot {path!r}: matplotlib cannot write '.{suffix}' files; use one of "
                         f"{', '.join('.' + k for k in sorted(kinds))} (e.g. .png)")
    for option, other in others.items():
        if other is not None and other != STDOUT and _same_file(path, other):
            raise ValueError(f"--plot {path!r} is also the {option} path; give them different files")


def _same_file(a: str, b: str) -> bool:
    try:
        if Path(a).exists() and Path(b).exists():
            return Path(a).samefile(b)
    except OSError:
        pass
    return os.path.realpath(a) == os.path.realpath(b)


def write_output(path: str, write: Callable[[str], None], what: str) -> str:
    """Write a finished result with ``write(path)``; if that fails, write it to a temporary file
    instead and say where (a finished run is never lost). Returns the path written. When the
    second write fails too, the temporary file is removed and that error raised."""
    try:
        write(path)
        return path
    except OSError as exc:
        fd, fallback = tempfile.mkstemp(prefix="hybridkv-", suffix=Path(path).suffix or ".out")
        os.close(fd)
        try:
            write(fallback)
        except BaseException:
            os.unlink(fallback)
            raise
        print(f"hybridkv: could not write {what} to {path!r} ({exc.strerror or exc}); "
              f"saved it to {fallback}", file=sys.stderr)
        return fallback


def write_json(path: str, data: object, what: str = "the JSON result") -> None:
    """Write ``data`` as indented JSON through :func:`write_output` and say where (``-``:
    standard output, see :func:`json_to_stdout`)."""
    text = json.dumps(data, indent=2) + "\n"
    if path == STDOUT:
        out = _JSON_STREAM or sys.stdout
        out.write(text)
        out.flush()
        return
    print(f"wrote {write_output(path, lambda p: Path(p).write_text(text), what)}")


_JSON_STREAM = None   # standard output while json_to_stdout sends the report to stderr


@contextlib.contextmanager
def json_to_stdout(json_path: str | None) -> Iterator[None]:
    """With ``--json -`` the JSON alone goes to standard output: inside this block everything
    else printed goes to standard error. Any other path: nothing changes."""
    global _JSON_STREAM
    if json_path != STDOUT:
        yield
        return
    _JSON_STREAM = sys.stdout
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _JSON_STREAM = None


def print_json(data: object) -> None:
    """``data`` as indented JSON on stdout (``--json`` of the listing commands)."""
    json.dump(data, sys.stdout, indent=2)
    print()


def progress_bar(enabled: bool, label: str, tty: bool | None = None
                 ) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """``(update(done, total), close)`` of a progress bar on stderr (tqdm when installed, a
    counter otherwise); ``(None, no-op)`` when disabled or when stderr is not a terminal
    (``tty``, default ``sys.stderr.isatty()``): redirected, the bar's carriage returns would
    overwrite the report's first line in the file. A ``done`` that falls back (a new run
    reported on the same bar) starts the bar over, with its own rate and ETA."""
    if tty is None:
        tty = sys.stderr.isatty()
    if not (enabled and tty):
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        def report(done: int, total: int) -> None:
            print(f"\r{label}: {done}/{total} requests", end="", file=sys.stderr, flush=True)
        return report, lambda: print(file=sys.stderr)
    bar = tqdm(desc=label, unit="req", file=sys.stderr, leave=False, delay=0.5)  # after the header

    def update(done: int, total: int) -> None:
        if done < bar.n or total != bar.total:   # the next run of a sweep: its own rate and ETA
            bar.reset(total=total)
        bar.n = done
        bar.refresh()
    return update, bar.close

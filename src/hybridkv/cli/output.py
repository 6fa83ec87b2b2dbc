"""What the commands write: output-path checks, results that are never lost, JSON, progress."""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable


def check_output_path(path: str | None, option: str) -> None:
    """Refuse, before a run, an output path that cannot be written (missing folder, a folder)."""
    if path is None:
        return
    p = Path(path)
    parent = p.parent if str(p.parent) else Path(".")
    if p.is_dir():
        raise ValueError(f"{option} {path!r} is a folder; give a file name")
    if not parent.is_dir():
        raise ValueError(f"{option} {path!r}: folder {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise ValueError(f"{option} {path!r} is not writable")


def write_output(path: str, write: Callable[[str], None], what: str) -> str:
    """Write a finished result with ``write(path)``; if that fails, write it to a temporary file
    instead and say where (a finished run is never lost). Returns the path written."""
    try:
        write(path)
        return path
    except OSError as exc:
        fd, fallback = tempfile.mkstemp(prefix="hybridkv-", suffix=Path(path).suffix or ".out")
        os.close(fd)
        write(fallback)
        print(f"hybridkv: could not write {what} to {path!r} ({exc.strerror or exc}); "
              f"saved it to {fallback}", file=sys.stderr)
        return fallback


def write_json(path: str, data: object, what: str = "the JSON result") -> None:
    """Write ``data`` as indented JSON through :func:`write_output` and say where."""
    text = json.dumps(data, indent=2) + "\n"
    print(f"wrote {write_output(path, lambda p: Path(p).write_text(text), what)}")


def print_json(data: object) -> None:
    """``data`` as indented JSON on stdout (``--json`` of the listing commands)."""
    json.dump(data, sys.stdout, indent=2)
    print()


def progress_bar(enabled: bool, label: str) -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    """``(update(done, total), close)`` of a progress bar on stderr (tqdm when installed, a
    counter otherwise); ``(None, no-op)`` when disabled. A ``done`` that falls back (the next
    run of a sweep) starts the bar over, with its own rate and ETA."""
    if not enabled:
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

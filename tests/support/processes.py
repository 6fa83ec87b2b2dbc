"""This machine's process tree, read from ``/proc`` (tests that kill or wait for children)."""

from __future__ import annotations

import os
from pathlib import Path


def children() -> dict[int, list[int]]:
    """Parent pid -> its children's pids, for every process now running."""
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids

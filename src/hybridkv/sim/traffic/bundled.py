"""The public request traces shipped inside the package, addressed by name
(:data:`BUNDLED_TRACES`), and :func:`resolve_trace`: a name or a path to the file to read."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

__all__ = ["BUNDLED_TRACES", "BundledTrace", "resolve_trace"]


class BundledTrace(NamedTuple):
    """A public trace shipped inside the package (``hybridkv/sim/traffic/data``)."""

    name: str          # what ``--trace`` accepts
    file: str          # file name under ``hybridkv/sim/traffic/data``
    requests: int      # lines (checked by the tests)
    description: str
    source: str
    licence: str

    @property
    def path(self) -> Path:
        """The compressed JSONL file of this trace (inside the installed package)."""
        return _DATA_DIR / self.file


_DATA_DIR = Path(__file__).resolve().parent / "data"
_MOONCAKE_SOURCE = "Mooncake FAST'25 release (github.com/kvcache-ai/Mooncake, FAST25-release/traces)"

BUNDLED_TRACES: dict[str, BundledTrace] = {t.name: t for t in (
    BundledTrace("mooncake-conversation", "mooncake_conversation.jsonl.xz", 12_031,
                 "one hour of online chat traffic (Kimi), timestamps in ms",
                 _MOONCAKE_SOURCE + " conversation_trace.jsonl", "Apache-2.0"),
    BundledTrace("mooncake-synthetic", "mooncake_synthetic.jsonl.xz", 3_993,
                 "Poisson arrivals built from public datasets, multi-turn order kept",
                 _MOONCAKE_SOURCE + " synthetic_trace.jsonl", "Apache-2.0"),
)}
"""Traces shipped with the package, by name (Mooncake JSONL format, xz-compressed)."""


def resolve_trace(trace: str | Path) -> Path:
    """The file of ``trace``: a bundled trace's name (:data:`BUNDLED_TRACES`) or a path.

    An existing file wins over a bundled name of the same spelling.

    Raises:
        ValueError: neither an existing file nor a bundled name (the names are listed).
    """
    path = Path(trace)
    if path.is_file():
        return path
    bundled = BUNDLED_TRACES.get(str(trace))
    if bundled is not None:
        if not bundled.path.is_file():
            raise ValueError(f"bundled trace {bundled.name!r} is missing from the installed package "
                             f"({bundled.path}); reinstall hybridkv")
        return bundled.path
    if path.exists():
        raise ValueError(f"trace {str(trace)!r} is not a file")
    raise ValueError(f"trace file {str(trace)!r} does not exist (bundled traces: "
                     f"{', '.join(BUNDLED_TRACES)}; see `hybridkv traces`)")

"""The one integer-argument check of the package.

``check_int(name, value, low)`` accepts an ``int`` (never a ``bool``) that is ``>= low``, or
``None`` when ``optional``; anything else raises ``ValueError`` naming the argument, the valid
range and the bad value: ``"NAME must be [None or ]an integer >= LOW, got VALUE"``.
"""

from __future__ import annotations


def check_int(name: str, value: object, low: int, *, optional: bool = False) -> None:
    """Raise ``ValueError`` unless ``value`` is an integer >= ``low`` (or None if ``optional``)."""
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        none = "None or " if optional else ""
        raise ValueError(f"{name} must be {none}an integer >= {low}, got {value!r}")

"""Comparing fitted constants: a refit reproduces a fit only to the solver's tolerance.

A least-squares fit's last digits depend on the BLAS build, its thread count and the CPU (the
shipped H100 profile refitted on another x86-64 machine differs in the 9th digit), so a refit is
compared field by field within :data:`FIT_REL`; a value read back from a file is compared with
``==``.
"""

from __future__ import annotations

import dataclasses

import pytest

#: relative tolerance of a refitted constant against the same fit made elsewhere
FIT_REL = 1e-6


def assert_same_fit(got, want, rel: float = FIT_REL) -> None:
    """``got`` and ``want`` (two :class:`~hybridkv.cost.calibrated.Calibration`) hold the same
    fit: every float field within ``rel`` (tuples element by element), every other field equal."""
    assert type(got) is type(want)
    for f in dataclasses.fields(want):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if isinstance(b, float):
            assert a == pytest.approx(b, rel=rel), f.name
        elif isinstance(b, tuple) and all(isinstance(x, float) for x in b):
            assert a == pytest.approx(b, rel=rel), f.name
        else:
            assert a == b, f.name

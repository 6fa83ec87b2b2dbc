"""The untested-transformers warning, exactly: once per (what, version) in one process, each
version on its own, both ends of the range and their neighbours, dev and rc builds as their
release, and nothing left behind in the warning filters."""

from __future__ import annotations

import warnings

import pytest

from hybridkv.engine import versions
from hybridkv.engine.versions import UntestedTransformersWarning


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(versions, "_warned", set())


def _caught(fn) -> list[str]:
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in record if issubclass(w.category, UntestedTransformersWarning)]


@pytest.mark.parametrize("version, warns", [
    ("4.57.6", False), ("4.57.5", True), ("4.57.6.dev0", False), ("4.57.5.post1", True),
    ("5.24.0", False), ("5.24.17", False), ("5.24.0rc1", False), ("5.25.0", True),
    ("5.25.0.dev0", True), ("4.58", False), ("3.99.99", True), ("6.0.0", True), ("nightly", True),
])
def test_the_range_ends_and_their_neighbours(version: str, warns: bool) -> None:
    got = _caught(lambda: versions.check_checkpoint_version({"transformers_version": version}, "/m/ck"))
    assert got == ([f"checkpoint 'ck' was written by transformers {version}, outside the range the "
                    "engine is tested against (transformers>=4.57.6,<5.25): equality with "
                    "transformers is unproven there"] if warns else [])


def test_once_per_version_and_subject_across_calls_in_one_process() -> None:
    def calls():
        for v in ("4.40.0", "4.41.0", "4.40.0", "4.41.0"):
            versions.check_checkpoint_version({"transformers_version": v}, f"/m/ck-{v}")
        versions.check_installed_transformers("4.40.0")
        versions.check_installed_transformers("4.40.0")
    got = _caught(calls)
    assert [m.split(",")[0] for m in got] == [
        "checkpoint 'ck-4.40.0' was written by transformers 4.40.0",
        "checkpoint 'ck-4.41.0' was written by transformers 4.41.0",
        "the tokenizer runs on the installed transformers 4.40.0"]
    assert _caught(calls) == []                      # the same process: said already


def test_a_config_without_the_field_is_not_checked_and_filters_are_left_alone() -> None:
    before = list(warnings.filters)
    assert _caught(lambda: versions.check_checkpoint_version({}, "/m/ck")) == []
    assert list(warnings.filters) == before

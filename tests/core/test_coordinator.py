"""``KVCacheCoordinator`` (``hybridkv.core.coordinator``): one flat class joined from its seams.
"""

from __future__ import annotations

import dataclasses

import pytest

from hybridkv.core.coordinator import CoordinatorModes


def test_the_coordinator_is_its_seams_joined_flat():
    """KVCacheCoordinator holds every method of its seams in one class namespace (no seam
    overrides another, the hot path searches one class), and joining two seams that define the
    same name is refused rather than resolved silently by an MRO. Its one base holds the
    fields a step reads (an extension type when compiled)."""
    import hybridkv.core.coordinator as co
    from hybridkv.core.coordinator.allocate import Allocation
    from hybridkv.core.coordinator.base import CoordinatorBase, _Fields
    from hybridkv.core.coordinator.lookup import Lookup
    from hybridkv.core.coordinator.release import Release
    from hybridkv.core.coordinator.states import StateGroups
    from hybridkv.core.coordinator.write import WritePath

    cls = co.KVCacheCoordinator
    # one base: the hot fields' holder (an extension type when compiled), no seam in the MRO
    assert cls.__mro__ == (cls, _Fields, object) and cls.__module__ == "hybridkv.core.coordinator"
    seams = (CoordinatorBase, Lookup, Allocation, WritePath, Release, StateGroups)
    for seam in seams:
        for name, value in vars(seam).items():
            if not name.startswith("__") or name == "__init__":
                assert vars(cls)[name] is value, (seam.__name__, name)
    with pytest.raises(TypeError, match="Release and another seam both define 'cache'"):
        co._join("Twice", "", WritePath, type("Release", (), {"cache": lambda self: None}))


def test_join_builds_one_named_class_from_the_seams():
    """``_join`` returns a plain class (bases: object only) named and documented as asked,
    whose namespace holds each seam's own methods and ``__init__`` but not the seams' class
    bookkeeping (their ``__dict__``, ``__weakref__``, ``__module__``, ``__doc__``).

    Guards against a join that builds the class wrongly (no name, the namespace passed as the
    bases, a seam's ``__dict__`` descriptor copied in). The coordinator's own join runs once,
    when the package is imported, so this calls ``_join`` again at test time: a defect there
    would otherwise show only as a failed import of ``hybridkv.core``."""
    import hybridkv.core.coordinator as co

    class First:
        """first seam"""

        def __init__(self, x):
            self.x = x

        def double(self):
            return 2 * self.x

    class Second:
        def triple(self):
            return 3 * self.x

    cls = co._join("Joined", "joined doc", First, Second)
    assert isinstance(cls, type) and cls.__mro__ == (cls, object)
    assert (cls.__name__, cls.__qualname__) == ("Joined", "Joined")
    assert (cls.__module__, cls.__doc__) == ("hybridkv.core.coordinator", "joined doc")
    assert vars(cls)["__init__"] is vars(First)["__init__"]
    assert vars(cls)["double"] is vars(First)["double"]
    assert vars(cls)["triple"] is vars(Second)["triple"]
    assert vars(cls)["__dict__"] is not vars(First)["__dict__"]     # the new class's own
    obj = cls(7)
    assert (obj.double(), obj.triple()) == (14, 21)


def test_coordinator_modes_record() -> None:
    """The coordinator's modes: defaults, refused values with their ranges, frozen."""
    m = CoordinatorModes()
    assert (m.drop_mode, m.vllm_compat, m.caching, m.max_model_len, m.max_in_flight_tokens) == (
        False, False, True, None, None)
    for kw, msg in (({"caching": 1}, "CoordinatorModes: caching must be True or False, got 1"),
                    ({"max_model_len": 0},
                     "CoordinatorModes: max_model_len must be None or a positive integer, got 0")):
        with pytest.raises(ValueError) as exc:
            CoordinatorModes(**kw)
        assert str(exc.value) == msg
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.caching = False  # type: ignore[misc]

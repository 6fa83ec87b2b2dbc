"""``KVCacheCoordinator`` (``hybridkv.core.coordinator``): one flat class joined from its seams.
"""

from __future__ import annotations

import pytest


def test_the_coordinator_is_its_seams_joined_flat():
    """KVCacheCoordinator holds every method of its seams in one class namespace (no seam
    overrides another, the hot path searches one class), and joining two seams that define the
    same name is refused rather than resolved silently by an MRO."""
    import hybridkv.core.coordinator as co
    from hybridkv.core.coordinator.allocate import Allocation
    from hybridkv.core.coordinator.base import CoordinatorBase
    from hybridkv.core.coordinator.lookup import Lookup
    from hybridkv.core.coordinator.release import Release
    from hybridkv.core.coordinator.states import StateGroups
    from hybridkv.core.coordinator.write import WritePath

    cls = co.KVCacheCoordinator
    assert cls.__mro__ == (cls, object) and cls.__module__ == "hybridkv.core.coordinator"
    seams = (CoordinatorBase, Lookup, Allocation, WritePath, Release, StateGroups)
    for seam in seams:
        for name, value in vars(seam).items():
            if not name.startswith("__") or name == "__init__":
                assert vars(cls)[name] is value, (seam.__name__, name)
    with pytest.raises(TypeError, match="Release and another seam both define 'cache'"):
        co._join("Twice", "", WritePath, type("Release", (), {"cache": lambda self: None}))

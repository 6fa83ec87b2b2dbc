"""Fixtures for the store tests.

Mooncake tests run a real master and storage node. Mooncake's transfer ports listen on all
interfaces, so the whole package of tests that use :func:`loopback` moves the pytest main thread
(and hence every Mooncake process and thread started from it) into a private network namespace
whose only interface is ``lo``. That needs root (CI runs as root). When that is impossible, or
the ``mooncake`` package is missing, the tests *fail* with the reason; set
``HYBRIDKV_SKIP_MOONCAKE=1`` to skip them explicitly instead.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from hybridkv.testing.netns import (
    NetnsUnavailable,
    loopback_netns,
    non_loopback_interfaces,
)

if TYPE_CHECKING:
    from hybridkv.connectors.stores.mooncake import MooncakeStore
    from hybridkv.testing.mooncake_cluster import MooncakeCluster


def _mooncake_or_fail() -> None:
    if os.environ.get("HYBRIDKV_SKIP_MOONCAKE") == "1":
        pytest.skip("HYBRIDKV_SKIP_MOONCAKE=1")
    try:
        import mooncake.store  # noqa: F401
    except ImportError as exc:
        pytest.fail(f"mooncake is not installed ({exc}); run .ci/install_mooncake.sh")


@pytest.fixture(scope="package")
def loopback() -> Iterator[None]:
    """The pytest main thread inside a loopback-only network namespace for the package's tests."""
    _mooncake_or_fail()
    try:
        with loopback_netns():
            assert non_loopback_interfaces() == []
            yield
    except NetnsUnavailable as exc:
        pytest.fail(f"cannot isolate Mooncake in a network namespace: {exc} (run as root)")


@pytest.fixture(scope="package")
def cluster(loopback: None) -> Iterator[MooncakeCluster]:
    """A shared master + one 128 MiB storage node for tests that do not break it."""
    from hybridkv.testing.mooncake_cluster import MooncakeCluster

    with MooncakeCluster([128 << 20]) as c:
        yield c


@pytest.fixture
def store(cluster: MooncakeCluster) -> Iterator[MooncakeStore]:
    """A client of the shared cluster with a key namespace of its own."""
    from hybridkv.connectors.stores.mooncake import MooncakeStore
    from hybridkv.connectors.stores.mooncake_config import MooncakeStoreConfig

    s = MooncakeStore(MooncakeStoreConfig(
        master_address=cluster.master_address, key_prefix=f"t{uuid.uuid4().hex[:8]}/"))
    assert s.healthy
    yield s
    s.close()

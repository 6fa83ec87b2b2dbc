"""Test infrastructure, shipped so that tests, examples and benchmarks can import it.

Nothing in a production package (``core``, ``sched``, ``sim``, ``engine``, ``connectors``)
imports from here; this package imports production modules, never the other way round.

* :mod:`.mooncake_cluster` - :class:`MooncakeCluster` starts a Mooncake master and storage nodes
  as local subprocesses (the production client is :class:`hybridkv.connectors.stores.MooncakeStore`);
  :func:`free_port`, :func:`find_mooncake_binary`.
* :mod:`.netns` - :func:`loopback_netns` runs the calling thread in a private network namespace
  that has only loopback (Mooncake's transfer ports listen on every interface).
* :mod:`.store_bench` - :func:`bench_zero_copy`, the raw zero-copy throughput of any store
  (``python -m hybridkv.testing.store_bench`` runs it on a fresh local Mooncake cluster).

Each module imports ``mooncake`` lazily, so this package imports without it.
"""

from .mooncake_cluster import MasterOptions, MooncakeCluster, find_mooncake_binary, free_port
from .netns import NetnsUnavailable, loopback_netns, netns_supported, non_loopback_interfaces


def __getattr__(name: str):
    # store_bench is also run as ``python -m``: import it on first use, not with the package
    if name == "bench_zero_copy":
        from .store_bench import bench_zero_copy
        return bench_zero_copy
    raise AttributeError(f"module 'hybridkv.testing' has no attribute {name!r}")


__all__ = ["MasterOptions", "MooncakeCluster", "NetnsUnavailable", "bench_zero_copy", "find_mooncake_binary",
           "free_port", "loopback_netns", "netns_supported", "non_loopback_interfaces"]

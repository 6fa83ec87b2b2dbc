"""How long the Mooncake store takes to answer when its master fails (the timings the tests no
longer assert; the tests check the behaviour through the store's counters).

Inside a loopback-only network namespace (needs root), with a local master + 16 MiB node:

* down at start: ``MooncakeStore(...)`` against a closed port (TCP probe, no client set up);
* killed master: the call that finds the failure, then three calls answered while unhealthy;
* hung master (``rpc_timeout_ms``): the call that waits one RPC timeout, then two calls.

    python benchmarks/bench_store_failures.py [--rpc-timeout-ms 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import time
from hybridkv.testing.mooncake_cluster import MasterOptions


def _ms(t0: float) -> float:
    return round((time.monotonic() - t0) * 1000, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rpc-timeout-ms", type=int, default=1000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig
    from hybridkv.testing import MooncakeCluster, free_port, loopback_netns

    keys = [i.to_bytes(16, "little") + b"\0" for i in range(8)]
    out: dict[str, float] = {}
    with loopback_netns():
        t0 = time.monotonic()
        store = MooncakeStore(MooncakeStoreConfig(master_address=f"127.0.0.1:{free_port()}"))
        out["down at start: construct (ms)"] = _ms(t0)
        assert not store.healthy
        store.close()

        with MooncakeCluster([16 << 20], MasterOptions(client_ttl_s=2)) as cluster:
            store = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address,
                                                      rpc_timeout_ms=args.rpc_timeout_ms))
            assert store.batch_put(keys, [b"x" * 1000] * len(keys)) == [True] * len(keys)
            cluster.pause_master()
            try:
                t0 = time.monotonic()
                store.batch_exists(keys[:1])
                out["hung master: first call (ms)"] = _ms(t0)
                t0 = time.monotonic()
                store.batch_get(keys[:1], [1000])
                store.batch_put(keys[1:2], [b"y"])
                out["hung master: next 2 calls (ms)"] = _ms(t0)
            finally:
                cluster.resume_master()
            store.close()

        with MooncakeCluster([16 << 20], MasterOptions(client_ttl_s=2)) as cluster:
            store = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address))
            assert store.batch_put(keys, [b"x" * 1000] * len(keys)) == [True] * len(keys)
            cluster.kill_master()
            t0 = time.monotonic()
            store.batch_exists(keys)
            out["killed master: first call (ms)"] = _ms(t0)
            t0 = time.monotonic()
            store.batch_get(keys)
            store.batch_put(keys, [b"y"] * len(keys))
            store.remove(keys)
            out["killed master: next 3 calls (ms)"] = _ms(t0)
            store.close()

    if args.json:
        print(json.dumps(out, indent=1))
    else:
        for k, v in out.items():
            print(f"{k:<40} {v:>10.1f}")


if __name__ == "__main__":
    main()

"""Time to first token when a long prefix comes from a KV store instead of being recomputed.

Reference engine on CPU, one torch thread, the small models of ``bench_engine.py`` (Llama-style
full attention, and the same size with sliding-window layers). A writer engine computes a
``--prefix``-token prompt once and saves its KV to the store; then, alternating within each
repeat, fresh engines serve ``prefix + --own`` new tokens:

* recompute: an engine without a store computes the whole prompt;
* store hit: an engine on the store loads the prefix's blocks and computes the rest (it also
  saves its new blocks, as a serving engine does);
* store miss: an engine on the store gets a prompt whose prefix is not there (lookup misses, the
  whole prompt is computed and saved): the store's cost when it does not help.

TTFT = from submit to the first generated token (one prefill step; the cache fits the whole
prompt in one step). Best of ``--repeats`` for each; ratios compare numbers of the same run.
Stores: ``LocalCPUStore`` (in process) and Mooncake Store (a local master + storage node in a
loopback-only network namespace, as the tests run it; needs root and the mooncake package).

    python benchmarks/bench_connector_ttft.py [--prefix 2048] [--own 32] [--repeats 5]
        [--models small,hybrid] [--no-mooncake] [--no-local] [--threads 1] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import HYBRID, SMALL, tokens  # noqa: E402

from hybridkv.connectors.stores import LocalCPUStore  # noqa: E402
from hybridkv.connectors.stores.base import KVStore  # noqa: E402
from hybridkv.engine.checkpoints import random_model  # noqa: E402
from hybridkv.engine.llm import LLM  # noqa: E402
from hybridkv.engine.llm_options import (ENGINE_SCHEDULER, CacheConfig, RequestParams, RuntimeConfig,  # noqa: E402
                                         StoreConfig)

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens

MODELS = {"small": ("llama (full)", SMALL), "hybrid": ("qwen2 (full + sliding)", HYBRID)}


def make(path: Path, store: KVStore | None = None) -> LLM:
    return LLM(path, store=StoreConfig(store), cache=CacheConfig(block_size=16, num_blocks=1024),
               scheduler=replace(ENGINE_SCHEDULER, max_num_batched_tokens=4096),
               runtime=RuntimeConfig(device="cpu"))


def first_token(llm: LLM, prompt: list[int]) -> dict[str, Any]:
    """TTFT of one request on ``llm`` (plus load time and tokens from the store)."""
    load_s = [0.0]
    if llm.connector is not None:
        real = llm.connector.run_loads

        def timed(loads):
            t0 = time.perf_counter()
            try:
                return real(loads)
            finally:
                load_s[0] += time.perf_counter() - t0

        llm.connector.run_loads = timed
    (req,) = llm.submit([prompt], max_tokens=1, params=NO_EOS)
    t0 = time.perf_counter()
    while req.num_output_tokens == 0:
        llm.engine.step()
    ttft = time.perf_counter() - t0
    llm.engine.run()  # finish; saves what was cached at free (not part of the TTFT)
    out = llm.collect([req])[0]
    loaded_bytes = llm.connector.transfer.stats.loaded_bytes if llm.connector else 0
    return {"ttft_s": ttft, "load_s": load_s[0], "external_tokens": out.num_external_tokens,
            "loaded_bytes": loaded_bytes, "token": out.token_ids[0]}


def bench_store(path: Path, store: KVStore, prefix_len: int, own: int, repeats: int
                ) -> dict[str, Any]:
    prefix = tokens(prefix_len, 7)
    writer = make(path, store)
    writer.generate([prefix], max_tokens=1, params=NO_EOS)  # computes and saves the prefix
    saved = writer.connector.transfer.stats.saved
    runs: dict[str, list[dict[str, Any]]] = {"recompute": [], "hit": [], "miss": []}
    for r in range(repeats):
        suffix = tokens(own, 1000 + r)
        order = ["recompute", "hit", "miss"] if r % 2 == 0 else ["miss", "hit", "recompute"]
        for kind in order:
            if kind == "recompute":
                runs[kind].append(first_token(make(path), prefix + suffix))
            elif kind == "hit":
                runs[kind].append(first_token(make(path, store), prefix + suffix))
            else:
                other = tokens(prefix_len, 5000 + r)  # a prefix the store does not hold
                runs[kind].append(first_token(make(path, store), other + suffix))
        rec, hit = runs["recompute"][-1], runs["hit"][-1]
        if hit["token"] != rec["token"]:
            raise AssertionError(f"repeat {r}: the store-hit engine's first token {hit['token']} "
                                 f"differs from the recomputing engine's {rec['token']}")
        if hit["external_tokens"] == 0 or runs["miss"][-1]["external_tokens"] != 0:
            raise AssertionError(f"repeat {r}: expected a store hit and a store miss, got "
                                 f"{hit['external_tokens']} / "
                                 f"{runs['miss'][-1]['external_tokens']} external tokens")
    best = {k: min(v, key=lambda x: x["ttft_s"]) for k, v in runs.items()}
    hit = best["hit"]
    return {
        "saved_blocks": saved,
        "hit_tokens": hit["external_tokens"],
        "ttft_recompute_ms": best["recompute"]["ttft_s"] * 1e3,
        "ttft_hit_ms": hit["ttft_s"] * 1e3,
        "ttft_miss_ms": best["miss"]["ttft_s"] * 1e3,
        "speedup": best["recompute"]["ttft_s"] / hit["ttft_s"],
        "miss_over_recompute": best["miss"]["ttft_s"] / best["recompute"]["ttft_s"],
        "load_ms": hit["load_s"] * 1e3,
        "load_share": hit["load_s"] / hit["ttft_s"],
        "loaded_mib": hit["loaded_bytes"] / (1 << 20),
        "load_gib_s": hit["loaded_bytes"] / (1 << 30) / hit["load_s"] if hit["load_s"] else 0.0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=2048, help="prefix tokens that the store holds")
    ap.add_argument("--own", type=int, default=32, help="new tokens after the prefix")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--models", default="small,hybrid", help="comma-separated: small, hybrid")
    ap.add_argument("--no-local", action="store_true")
    ap.add_argument("--no-mooncake", action="store_true")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1; 0: torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stores: list[tuple[str, KVStore]] = []
        if not args.no_local:
            stores.append(("local", LocalCPUStore(2 << 30)))
        if not args.no_mooncake:
            from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig
            from hybridkv.testing import MooncakeCluster, loopback_netns

            stack.enter_context(loopback_netns())
            cluster = stack.enter_context(MooncakeCluster([1 << 30]))
            mc = MooncakeStore(MooncakeStoreConfig(master_address=cluster.master_address))
            stack.callback(mc.close)
            if not mc.healthy:
                raise SystemExit("Mooncake store not reachable")
            stores.append(("mooncake", mc))
        for key in args.models.split(","):
            name, cfg = MODELS[key]
            path = random_model(Path(tmp) / key, cfg, seed=0)
            make(path).generate([tokens(300, 0)], max_tokens=4, params=NO_EOS)  # warm-up
            for store_name, store in stores:
                r = bench_store(path, store, args.prefix, args.own, args.repeats)
                rows.append({"model": name, "store": store_name, **r})
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "prefix": args.prefix,
                          "own": args.own, "rows": rows}, indent=2))
        return
    print(f"torch threads: {torch.get_num_threads()}; CPU; fp32; block size 16; prompt = "
          f"{args.prefix} prefix + {args.own} new tokens; best of {args.repeats}")
    print(f"{'model':<24}{'store':<10}{'hit':>6}{'recompute':>11}{'store hit':>11}{'speedup':>9}"
          f"{'load':>9}{'load MiB':>10}{'GiB/s':>7}{'store miss':>12}{'miss/rec':>9}")
    for r in rows:
        print(f"{r['model']:<24}{r['store']:<10}{r['hit_tokens']:>6}"
              f"{r['ttft_recompute_ms']:>8.1f} ms"
              f"{r['ttft_hit_ms']:>8.1f} ms{r['speedup']:>8.2f}x{r['load_ms']:>6.1f} ms"
              f"{r['loaded_mib']:>10.2f}{r['load_gib_s']:>7.2f}{r['ttft_miss_ms']:>9.1f} ms"
              f"{r['miss_over_recompute']:>8.2f}x")


if __name__ == "__main__":
    main()

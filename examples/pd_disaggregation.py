"""Prefill/decode disaggregation through Mooncake Store, checked against a single engine.

    python examples/pd_disaggregation.py [--model DIR] [--prompt-len 512] [--max-tokens 16]

::

    this process                     prefill process                 decode process
    ────────────                     ───────────────                 ──────────────
    mooncake_master + storage node
    tiny random model (or --model)
    run prefill ───────────────────► LLM(store=StoreConfig(Mooncake))
                                     generate(prompt, max_tokens=1)
                                     saves the prompt's KV blocks ──► storage node
    run decode  ──────────────────────────────────────────────────► LLM(store=StoreConfig(Mooncake))
                                                                     finds the prompt's blocks,
                                                                     loads them (no recompute),
                                                                     generates N tokens
    single engine, no store: the same prompt, N tokens
    compare: identical tokens? anything loaded?   exit 0 only if both

Each engine runs in its own process (the Mooncake client of the prefill process is gone
before the decode process starts: the KV lives on the storage node). Engines that share a store
agree on the block hashes (a fixed hash seed) and on a namespace derived from the model files,
so the decode engine finds exactly the blocks the prefill engine computed. The decode engine
still computes the prompt's last partial block itself (it needs the last token's logits).

Needs Mooncake (``pip install 'hybridkv[mooncake]'``); as root it isolates Mooncake in a
loopback-only network namespace (``--no-netns`` to skip).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from _common import (engine_kwargs, local_mooncake, open_mooncake, random_prompt, read_job,
                     run_child, serve, tiny_model, vocab_size, write_result)


def child(role: str, job: dict) -> None:
    """The prefill or the decode engine, in its own process."""
    import torch

    from hybridkv.engine.llm import LLM
    from hybridkv.engine.llm_options import StoreConfig

    torch.set_num_threads(job["threads"])
    store = open_mooncake(job["master"])
    t0 = time.perf_counter()
    llm = LLM(job["model"], store=StoreConfig(store), **engine_kwargs(job))
    load_s = time.perf_counter() - t0
    max_tokens = 1 if role == "prefill" else job["max_tokens"]
    out, ttft, total = serve(llm, job["prompt"], max_tokens)
    transfer = llm.connector.transfer.stats
    write_result(job, {
        "token_ids": out.token_ids, "external_tokens": out.num_external_tokens,
        "ttft_s": ttft, "total_s": total, "engine_load_s": load_s,
        "saved_blocks": transfer.saved, "saved_bytes": transfer.saved_bytes,
        "loaded_blocks": transfer.loaded, "loaded_bytes": transfer.loaded_bytes,
        "store_drops": store.stats.drops, "corrupt": transfer.corrupt,
    })
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="HF-format model directory (default: a tiny random "
                    "hybrid qwen2 model written to a temporary directory)")
    ap.add_argument("--prompt-len", type=int, default=512, help="prompt tokens (random ids)")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens the decode engine generates")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-cache-mib", type=int, default=64, help="KV pool of each engine")
    ap.add_argument("--seed", type=int, default=0, help="model weights and prompt")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    ap.add_argument("--no-netns", action="store_true",
                    help="do not isolate Mooncake in a loopback-only network namespace")
    ap.add_argument("--role", choices=("prefill", "decode"), help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        child(args.role, read_job(args.job))
        return 0

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hybridkv-pd-") as tmp:
        if args.model is None:
            t0 = time.perf_counter()
            model = tiny_model(Path(tmp) / "tiny-hybrid", seed=args.seed)
            print(f"model   : tiny random hybrid qwen2 (full + sliding layers) written in "
                  f"{time.perf_counter() - t0:.2f} s")
        else:
            model = args.model.resolve()
            print(f"model   : {model}")
        prompt = random_prompt(args.prompt_len, vocab_size(model), seed=args.seed + 1)
        job = dict(model=str(model), prompt=prompt, max_tokens=args.max_tokens,
                   block_size=args.block_size, kv_cache_mib=args.kv_cache_mib,
                   threads=args.threads)

        with local_mooncake(isolate=not args.no_netns) as cluster:
            job["master"] = cluster.master_address
            pre, pre_wall = run_child(__file__, "prefill", job)
            print(f"prefill : {len(prompt)} prompt tokens computed in {pre['total_s']:.3f} s, "
                  f"{pre['saved_blocks']} blocks ({pre['saved_bytes'] >> 10} KiB) saved to "
                  f"Mooncake; first token {pre['token_ids'][0]}; process {pre_wall:.2f} s")
            dec, dec_wall = run_child(__file__, "decode", job)
            print(f"decode  : {dec['external_tokens']} prompt tokens loaded from Mooncake "
                  f"({dec['loaded_blocks']} blocks, {dec['loaded_bytes'] >> 10} KiB), "
                  f"{len(dec['token_ids'])} tokens generated; TTFT {dec['ttft_s']:.3f} s, "
                  f"total {dec['total_s']:.3f} s; process {dec_wall:.2f} s")

        # the reference: one engine, no store, same prompt
        import torch

        from hybridkv.engine.llm import LLM

        torch.set_num_threads(args.threads)
        single = LLM(model, **engine_kwargs(job))
        ref, ttft, total = serve(single, prompt, args.max_tokens)
        print(f"single  : no store; TTFT {ttft:.3f} s, total {total:.3f} s")

    print(f"time    : {time.perf_counter() - t_start:.2f} s in all")
    ok = True
    if dec["external_tokens"] <= 0:
        print("RESULT: FAILED - the decode engine loaded nothing from the store")
        ok = False
    if dec["token_ids"] != ref.token_ids:
        print(f"RESULT: MISMATCH - decode output differs from the single-engine run\n"
              f"  decode: {dec['token_ids']}\n  single: {ref.token_ids}")
        ok = False
    if pre["token_ids"][:1] != ref.token_ids[:1]:
        print(f"RESULT: MISMATCH - the prefill engine's first token {pre['token_ids'][:1]} "
              f"differs from the single engine's {ref.token_ids[:1]}")
        ok = False
    if ok:
        print(f"RESULT: identical - the decode engine's {len(ref.token_ids)} tokens equal the "
              f"single-engine run, with {dec['external_tokens']} of {len(prompt)} prompt tokens "
              f"loaded instead of computed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

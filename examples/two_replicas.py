"""Two engine replicas share KV through Mooncake Store: a conversation moves between them.

    python examples/two_replicas.py [--model DIR] [--prompt-len 384] [--max-tokens 16]

::

    replica A (own process)                      replica B (own process, same store)
    ─────────────────────                        ───────────────────────────────────
    turn 1: system + question -> answer          turn 2: turn 1 + answer + follow-up
    caches and saves the whole conversation      finds turn 1's blocks in the store,
      (its final length is a replay boundary)      loads them, computes only the new part

    then, in this process: both turns on a fresh engine without any store (cold runs);
    exit 0 only if B loaded something and both replicas' outputs equal the cold runs.

Replica B never saw turn 1, so without the shared store it would recompute all of it. For the
sliding-window layers only the blocks of the last window are needed at the hit point, and
replica A keeps exactly those for its final length: the store holds what B's lookup needs.

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


def replica(job: dict) -> None:
    """One replica serving one request, in its own process."""
    import torch

    from hybridkv.engine.llm import LLM
    from hybridkv.engine.llm_options import StoreConfig

    torch.set_num_threads(job["threads"])
    store = open_mooncake(job["master"])
    llm = LLM(job["model"], store=StoreConfig(store), **engine_kwargs(job))
    out, ttft, total = serve(llm, job["prompt"], job["max_tokens"])
    transfer = llm.connector.transfer.stats
    write_result(job, {
        "token_ids": out.token_ids, "external_tokens": out.num_external_tokens,
        "cached_tokens": out.num_cached_tokens, "ttft_s": ttft, "total_s": total,
        "saved_blocks": transfer.saved, "loaded_blocks": transfer.loaded,
        "loaded_bytes": transfer.loaded_bytes,
    })
    store.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="HF-format model directory (default: a tiny random "
                    "hybrid qwen2 model written to a temporary directory)")
    ap.add_argument("--prompt-len", type=int, default=384, help="turn 1 prompt tokens")
    ap.add_argument("--follow-up-len", type=int, default=24, help="new tokens of turn 2")
    ap.add_argument("--max-tokens", type=int, default=16, help="tokens generated per turn")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-cache-mib", type=int, default=64, help="KV pool of each engine")
    ap.add_argument("--seed", type=int, default=0, help="model weights and prompts")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per engine")
    ap.add_argument("--no-netns", action="store_true",
                    help="do not isolate Mooncake in a loopback-only network namespace")
    ap.add_argument("--role", choices=("replica",), help=argparse.SUPPRESS)
    ap.add_argument("--job", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role:
        replica(read_job(args.job))
        return 0

    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="hybridkv-replicas-") as tmp:
        model = tiny_model(Path(tmp) / "tiny-hybrid", args.seed) if args.model is None \
            else args.model.resolve()
        print(f"model   : {model if args.model else 'tiny random hybrid qwen2 (full + sliding)'}")
        vocab = vocab_size(model)
        turn1 = random_prompt(args.prompt_len, vocab, seed=args.seed + 1)
        base = dict(model=str(model), max_tokens=args.max_tokens, block_size=args.block_size,
                    kv_cache_mib=args.kv_cache_mib, threads=args.threads)

        with local_mooncake(isolate=not args.no_netns) as cluster:
            base["master"] = cluster.master_address
            a, a_wall = run_child(__file__, "replica", dict(base, prompt=turn1))
            print(f"replica A: turn 1 ({len(turn1)} tokens) answered in {a['total_s']:.3f} s, "
                  f"{a['saved_blocks']} blocks saved; process {a_wall:.2f} s")
            turn2 = turn1 + a["token_ids"] + random_prompt(args.follow_up_len, vocab,
                                                           seed=args.seed + 2)
            b, b_wall = run_child(__file__, "replica", dict(base, prompt=turn2))
            print(f"replica B: turn 2 ({len(turn2)} tokens): {b['external_tokens']} loaded from "
                  f"Mooncake ({b['loaded_blocks']} blocks, {b['loaded_bytes'] >> 10} KiB), "
                  f"TTFT {b['ttft_s']:.3f} s, total {b['total_s']:.3f} s; process {b_wall:.2f} s")

        import torch

        from hybridkv.engine.llm import LLM

        torch.set_num_threads(args.threads)
        cold = []
        for prompt in (turn1, turn2):  # a fresh engine per turn: nothing cached, no store
            out, ttft, _ = serve(LLM(model, **engine_kwargs(base)), prompt, args.max_tokens)
            cold.append(out.token_ids)
        print(f"cold     : turn 2 without any store: TTFT {ttft:.3f} s")

    print(f"time     : {time.perf_counter() - t_start:.2f} s in all")
    ok = True
    if b["external_tokens"] <= 0:
        print("RESULT: FAILED - replica B loaded nothing from the store")
        ok = False
    for name, got, want in (("A (turn 1)", a["token_ids"], cold[0]),
                            ("B (turn 2)", b["token_ids"], cold[1])):
        if got != want:
            print(f"RESULT: MISMATCH - replica {name} differs from the cold run\n"
                  f"  replica: {got}\n  cold:    {want}")
            ok = False
    if ok:
        print(f"RESULT: identical - both replicas equal cold runs; replica B loaded "
              f"{b['external_tokens']} of its {len(turn2)} prompt tokens that replica A computed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

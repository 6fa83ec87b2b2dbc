"""``hybridkv generate``: greedy generation on the reference engine from the command line.

    hybridkv generate --model DIR --prompt "Hello" --max-tokens 32
    hybridkv generate --model DIR --prompt-ids 1,2,3 --prompt-ids 1,2,4 --max-tokens 8 --json
    hybridkv generate --model DIR --prompt-ids 1,2,3 --spec dflash:7 --draft-model DRAFT_DIR

Several prompts run as one batch (continuous batching), so a later prompt can hit the prefix
cache of an earlier one; ``--json`` prints every request's generated token ids and its
prefix-cache hit tokens (plus engine counters).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids needs at least one token id")
    return ids


def _parse_retention(text: str) -> int | None:
    """``none`` (dense retention), ``0`` or an interval N >= 1."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"--retention is none or an integer >= 0, got {text!r}")
    return value


def _parse_block_size(text: str) -> int | dict[str, int]:
    """``16`` or ``full=16,sliding=8``."""
    if text.isdigit():
        return int(text)
    sizes: dict[str, int] = {}
    for part in text.split(","):
        kind, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise argparse.ArgumentTypeError(f"--block-size is N or KIND=N,... (full, sliding, mla), got {text!r}")
        sizes[kind.strip()] = int(value)
    return sizes


def add_generate_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register the ``generate`` subcommand on an ``argparse`` subparsers object."""
    p = subparsers.add_parser(
        "generate", help="greedy generation on the reference engine (paged KV, prefix cache, spec decoding)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="HF-format model directory (config.json + safetensors)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text (needs a tokenizer in --model); repeatable")
    src.add_argument("--prompt-ids", action="append", type=_parse_ids, metavar="1,2,3",
                     help="prompt token ids, comma-separated; repeatable")
    p.add_argument("--max-tokens", type=int, default=16, help="output tokens per prompt (default 16)")
    p.add_argument("--spec", default=None, metavar="METHOD:K",
                   help="speculative decoding: ngram:K, draft_model:K or dflash:K")
    p.add_argument("--draft-model", default=None, metavar="DIR",
                   help="drafter directory for draft_model / dflash")
    p.add_argument("--block-size", type=_parse_block_size, default=16,
                   help="tokens per KV block: N, or per layer kind, e.g. full=16,sliding=8")
    p.add_argument("--num-blocks", type=int, default=None, help="KV pool size in blocks (default from 128 MiB)")
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    p.add_argument("--retention", type=_parse_retention, default=0, metavar="none|0|N",
                   help="sliding-window retention interval (default 0)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--state-dtype", default="float32",
                   help="recurrent-state dtype of state models (qwen3_next, nemotron_h): float32 "
                        "(default), bfloat16 or float16")
    p.add_argument("--cache-salt", default=None)
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the model's EOS token")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--dtype", default=None, choices=("float32", "float16", "bfloat16"))
    p.add_argument("--json", action="store_true", help="print token ids and prefix-cache hits as JSON")
    p.set_defaults(func=run_generate)
    return p


def run_generate(args: argparse.Namespace) -> int:
    """Run the ``generate`` subcommand; returns the exit status."""
    import torch

    from hybridkv.sched import SchedulerConfig

    from .llm import LLM
    from .llm_config import ENGINE_SCHEDULER, CacheConfig, RuntimeConfig

    if args.max_tokens < 1:
        print(f"hybridkv generate: error: --max-tokens must be an integer >= 1, got {args.max_tokens}",
              file=sys.stderr)
        return 2
    retention = args.retention
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        llm = LLM(args.model, spec=args.spec, draft_model=args.draft_model,
                  cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                                    retention_interval=retention,
                                    enable_prefix_caching=not args.no_prefix_caching,
                                    state_dtype=args.state_dtype),
                  scheduler=SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                            max_num_seqs=ENGINE_SCHEDULER.max_num_seqs,
                                            max_model_len=args.max_model_len),
                  runtime=RuntimeConfig(device=args.device, dtype=dtype))
        prompts = args.prompt if args.prompt is not None else args.prompt_ids
        t0 = time.perf_counter()
        outs = llm.generate(prompts, args.max_tokens, cache_salt=args.cache_salt, ignore_eos=args.ignore_eos)
        elapsed = time.perf_counter() - t0
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"hybridkv generate: error: {exc}", file=sys.stderr)
        return 2
    stats = llm.stats
    if args.json:
        result = {
            "model": str(args.model),
            "spec": args.spec,
            "outputs": [o.to_dict() for o in outs],
            "stats": {"steps": stats.steps, "draft_tokens": stats.draft_tokens,
                      "accepted_tokens": stats.accepted_tokens, "preemptions": stats.preemptions,
                      "seconds": round(elapsed, 4), **llm.prefix_cache_stats()},
        }
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    for i, o in enumerate(outs):
        shown = o.text if o.text is not None else " ".join(map(str, o.token_ids))
        print(f"[{i}] {shown}")
        print(f"    {len(o.token_ids)} tokens ({o.finish_reason}), prefix-cache hit "
              f"{o.num_cached_tokens}/{len(o.prompt_token_ids)} prompt tokens")
    line = f"{stats.steps} steps in {elapsed:.2f}s"
    if stats.draft_tokens:
        line += f"; drafts accepted {stats.accepted_tokens}/{stats.draft_tokens}"
    print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point (``python -m hybridkv.engine.generate_cli``)."""
    parser = argparse.ArgumentParser(prog="hybridkv")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate_parser(sub)
    return run_generate(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())

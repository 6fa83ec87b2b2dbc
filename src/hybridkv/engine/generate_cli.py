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

from hybridkv.core.spec_decode import parse_spec
from hybridkv.options import int_in, name_options, parse_retention


def _parse_ids(text: str) -> list[int]:
    try:
        ids = [int(t) for t in text.replace(" ", "").split(",") if t != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--prompt-ids takes comma-separated integers, got {text!r}") from None
    if not ids:
        raise argparse.ArgumentTypeError("--prompt-ids needs at least one token id")
    return ids


BLOCK_SIZE_KINDS = ("full", "sliding", "mla")


def _parse_block_size(text: str) -> int | dict[str, int]:
    """``16`` or ``full=16,sliding=8``: every size an integer >= 1, kinds from
    :data:`BLOCK_SIZE_KINDS`."""
    usage = f"N or KIND=N,... with KIND in {', '.join(BLOCK_SIZE_KINDS)} and N an integer >= 1"
    if "=" not in text:
        try:
            return int_in(1)(text)
        except argparse.ArgumentTypeError as exc:
            raise argparse.ArgumentTypeError(f"{exc} ({usage})") from None
    sizes: dict[str, int] = {}
    for part in text.split(","):
        kind, _, value = (t.strip() for t in part.partition("="))
        if kind not in BLOCK_SIZE_KINDS or not value.isdigit() or int(value) < 1:
            raise argparse.ArgumentTypeError(f"{usage}, got {text!r}")
        sizes[kind] = int(value)
    return sizes


def _parse_spec(text: str) -> str:
    """``METHOD:K`` with a method the reference engine drafts with, or ``none``."""
    from .llm import ENGINE_SPEC_METHODS
    usage = f"METHOD:K with METHOD in {', '.join(ENGINE_SPEC_METHODS)} and K an integer >= 1, or none"
    try:
        spec = parse_spec(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{usage}, got {text!r}") from None
    if spec is not None and spec.method not in ENGINE_SPEC_METHODS:
        raise argparse.ArgumentTypeError(f"{usage}, got {text!r} (the reference engine does not "
                                         f"implement {spec.method!r})")
    return text


#: The engine's names for what ``generate`` options set, as its errors spell them.
OPTION_NAMES = {"block_size": "--block-size", "num_blocks": "--num-blocks",
                "max_model_len": "--max-model-len", "max_num_batched_tokens": "--max-num-batched-tokens",
                "retention_interval": "--retention", "draft_model": "--draft-model"}


def _device(torch, name: str | None):
    """``--device`` as a ``torch.device`` (None: the engine's default); ``ValueError`` naming
    the option for a name torch does not know or a device this machine lacks."""
    if name is None:
        return None
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"--device {name!r} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {name}: this PyTorch sees no CUDA device; use --device cpu")
    return device


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
    p.add_argument("--max-tokens", type=int_in(1), default=16, help="output tokens per prompt (default 16)")
    p.add_argument("--spec", type=_parse_spec, default=None, metavar="METHOD:K",
                   help="speculative decoding: ngram:K, draft_model:K or dflash:K")
    p.add_argument("--draft-model", default=None, metavar="DIR",
                   help="drafter directory for draft_model / dflash")
    p.add_argument("--block-size", type=_parse_block_size, default=16,
                   help="tokens per KV block, an integer >= 1: N, or per layer kind (full, "
                        "sliding, mla), e.g. full=16,sliding=8 (default 16)")
    p.add_argument("--num-blocks", type=int_in(2), default=None,
                   help="KV pool size in blocks, >= 2 with the null block (default from 128 MiB)")
    p.add_argument("--max-model-len", type=int_in(2), default=None,
                   help="tokens per request, >= 2 (default: the model's, capped at 4096)")
    p.add_argument("--max-num-batched-tokens", type=int_in(1), default=2048,
                   help="token budget per engine step (default 2048)")
    p.add_argument("--retention", type=parse_retention, default=0, metavar="none|0|N",
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

    retention = args.retention
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        device = _device(torch, args.device)
        llm = LLM(args.model, spec=args.spec, draft_model=args.draft_model,
                  cache=CacheConfig(block_size=args.block_size, num_blocks=args.num_blocks,
                                    retention_interval=retention,
                                    enable_prefix_caching=not args.no_prefix_caching,
                                    state_dtype=args.state_dtype),
                  scheduler=SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                            max_num_seqs=ENGINE_SCHEDULER.max_num_seqs,
                                            max_model_len=args.max_model_len),
                  runtime=RuntimeConfig(device=device, dtype=dtype))
        prompts = args.prompt if args.prompt is not None else args.prompt_ids
        t0 = time.perf_counter()
        outs = llm.generate(prompts, args.max_tokens, cache_salt=args.cache_salt, ignore_eos=args.ignore_eos)
        elapsed = time.perf_counter() - t0
    except (ValueError, FileNotFoundError, RuntimeError) as exc:
        print(f"hybridkv generate: error: {name_options(str(exc), OPTION_NAMES)}", file=sys.stderr)
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

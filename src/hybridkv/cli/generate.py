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
import importlib.util
import json
import sys
import time

from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.options import (engine_block_size, engine_spec_argument, int_in, name_options,
                                  parse_retention, prompt_ids)

#: What ``generate`` needs installed (``pip install "hybridkv[engine]"``).
ENGINE_MODULES = ("torch", "safetensors")


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


def missing_engine_module() -> str | None:
    """The first module of :data:`ENGINE_MODULES` that is not installed (nothing is imported)."""
    for name in ENGINE_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ValueError:           # a module set to None in sys.modules: not importable
            return name
    return None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``generate``; without the engine extras, a ``generate`` that says what
    to install (whatever its options)."""
    missing = missing_engine_module()
    if missing is not None:
        message = (f"hybridkv generate needs the engine extras (missing: {missing}): "
                   'pip install "hybridkv[engine]"')
        p.description = message

        def unavailable(args: argparse.Namespace) -> int:
            print(f"hybridkv generate: error: {message}", file=sys.stderr)
            return 2
        p.set_defaults(func=unavailable, accepts_any_arguments=True)
        return
    p.add_argument("--model", required=True, help="HF-format model directory (config.json + safetensors)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", action="append", help="prompt text (needs a tokenizer in --model); repeatable")
    src.add_argument("--prompt-ids", action="append", type=prompt_ids, metavar="1,2,3",
                     help="prompt token ids, comma-separated; repeatable")
    p.add_argument("--max-tokens", type=int_in(1), default=16, help="output tokens per prompt (default 16)")
    p.add_argument("--spec", type=engine_spec_argument, default=None, metavar="METHOD:K",
                   help="speculative decoding: ngram:K, draft_model:K or dflash:K")
    p.add_argument("--draft-model", default=None, metavar="DIR",
                   help="drafter directory for draft_model / dflash")
    p.add_argument("--block-size", type=engine_block_size, default=16,
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


def run(args: argparse.Namespace) -> int:
    """Run the ``generate`` subcommand; returns the exit status."""
    import torch

    from hybridkv.sched import SchedulerConfig

    from hybridkv.engine.llm import LLM
    from hybridkv.engine.llm_options import (ENGINE_SCHEDULER, CacheConfig, RequestParams, RuntimeConfig,
                                             SpeculativeConfig)

    if args.draft_model is not None and args.spec in (None, "none"):  # told before name_options rewrites it
        print("hybridkv generate: error: --draft-model needs --spec draft_model:K or dflash:K", file=sys.stderr)
        return 2
    retention = args.retention
    dtype = getattr(torch, args.dtype) if args.dtype else None
    try:
        device = _device(torch, args.device)
        spec = args.spec
        if args.draft_model is not None:
            spec = SpeculativeConfig(spec, draft_model=args.draft_model)
        llm = LLM(args.model, spec=spec,
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
        outs = llm.generate(prompts, args.max_tokens, params=RequestParams(
            cache_salt=args.cache_salt, ignore_eos=args.ignore_eos))
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


COMMANDS.register("generate", Command(
    help="greedy generation on the reference engine (paged KV, prefix cache, spec decoding)",
    add_arguments=add_arguments, run=run, description=__doc__, option_names=OPTION_NAMES))

__all__ = ["OPTION_NAMES", "add_arguments", "missing_engine_module", "run"]

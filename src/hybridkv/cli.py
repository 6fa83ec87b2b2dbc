"""The ``hybridkv`` command.

Subcommands:
    simulate  trace-driven simulation of a model's prefix cache and latency (the main job)
    sweep     hit rate against cache size or retention interval, with the offline optimum
    presets   model and GPU presets with their KV bytes per token
    traces    the request traces bundled with the package (Mooncake, Apache-2.0)
    generate  greedy generation with the reference engine (paged attention over the manager)
    demo      a short printed walk-through of prefix caching on a hybrid full + sliding-window
              model (retention, the scratch-first free queue, speculative decoding).

Errors are one line on stderr: exit status 2 for bad input (options, files, sizes), 1 for a
failure while running (out of memory, an unwritable file, an internal error; set
HYBRIDKV_DEBUG=1 to see the traceback of an internal error), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow, SpecDecode)
from hybridkv.options import name_options


def _serve(kv: KVCacheManager, rid: str, tokens: list[int], decode: int = 0) -> tuple[Request, int]:
    req = Request(rid, tokens)
    hit = kv.lookup(req)
    if kv.allocate(req, req.num_tokens - hit.num_tokens, hit) is None:
        raise RuntimeError(f"request {rid} does not fit in the pool")
    req.num_computed_tokens = req.num_tokens
    for k in range(decode):
        req.append_tokens([50_000 + k])
        kv.allocate(req, 1)
        req.num_computed_tokens += 1
    return req, hit.num_tokens


def demo(as_json: bool = False) -> dict:
    """Run the walk-through; returns the numbers it printed."""
    out: dict = {}
    say = (lambda *a: None) if as_json else print
    groups = (
        KVCacheGroup("full", FullAttention(block_size=16, num_kv_heads=8, head_dim=128),
                     tuple(f"layers.{i}" for i in range(0, 48, 6))),
        KVCacheGroup("sliding", SlidingWindow(block_size=16, num_kv_heads=8, head_dim=128, window=256),
                     tuple(f"layers.{i}" for i in range(48) if i % 6)),
    )
    config = KVCacheConfig(groups, num_blocks=600)
    say("hybridkv demo: a Gemma-style model, 1 full-attention layer per 5 sliding-window layers")
    say(f"  groups: full (block 16) + sliding (block 16, window 256); pool of {config.num_blocks} "
        f"blocks of {config.block_bytes // 1024} KiB; hit alignment {config.alignment} tokens\n")
    system = list(range(1000, 1000 + 1200))
    for interval in (None, 0):
        kv = KVCacheManager(config, retention_interval=interval)
        name = "dense (None)" if interval is None else "replay boundaries only (0)"
        say(f"retention {name}:")
        a, hit_a = _serve(kv, "A", system + list(range(1, 300)), decode=40)
        kv.free(a)
        cached = sum(1 for h in kv.pool.block_hash if h is not None)
        say(f"  A: 1499-token prompt, 40 decoded tokens -> hit {hit_a}, {cached} blocks stay cached")
        b, hit_b = _serve(kv, "B", list(a.token_ids) + list(range(7000, 7100)))
        say(f"  B (next chat turn: A + A's answer + 100 new tokens) -> hit {hit_b} of {b.num_tokens}")
        kv.free(b)
        c, hit_c = _serve(kv, "C", system + list(range(9000, 9300)))
        say(f"  C (same system prompt, new question) -> hit {hit_c}; it finds the shared "
            f"prefix and promises a junction there")
        kv.free(c)
        d, hit_d = _serve(kv, "D", system + list(range(9500, 9800)))
        say(f"  D (same system prompt again) -> hit {hit_d}")
        kv.free(d)
        s = kv.stats()
        say(f"  prefix cache: {s.hits} hit tokens of {s.queries} queried ({s.hit_rate:.1%}); "
            f"{sum(1 for h in kv.pool.block_hash if h is not None)} cached blocks\n")
        out[f"retention_{interval}"] = {"A": hit_a, "B": hit_b, "C": hit_c, "D": hit_d,
                                        "hit_rate": s.hit_rate}
    say("speculative decoding (EAGLE, k=3) on an identical resend of a 1025-token prompt:")
    for label, spec in (("lookahead hashing (default)", SpecDecode("eagle", 3)),
                        ("vLLM drop mode", SpecDecode("eagle", 3, hash_lookahead=False))):
        kv = KVCacheManager(config, spec_decode=spec, retention_interval=0)
        prompt = list(range(1025))
        a, _ = _serve(kv, "A", prompt)
        kv.free(a)
        _, hit = _serve(kv, "B", prompt)
        say(f"  {label:<28} hit {hit} (lookahead slots {kv.lookahead_slots})")
        out[f"eagle_{'lookahead' if spec.hash_lookahead else 'drop'}"] = hit
    return out


class _OneLineParser(argparse.ArgumentParser):
    """argparse with a one-line usage error (the subcommands' parsers inherit it)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


_NO_ENGINE_COMMANDS = ("simulate", "sweep", "presets", "traces", "demo")


def main(argv: list[str] | None = None) -> int:
    parser = _OneLineParser(prog="hybridkv", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    from hybridkv.sim.commands import add_parsers
    add_parsers(sub)
    given = sys.argv[1:] if argv is None else argv
    try:  # torch loads in ~1.5 s: only for commands that may need the engine
        if given and given[0] in _NO_ENGINE_COMMANDS:
            raise ImportError("not needed")
        from hybridkv.engine.generate_cli import add_generate_parser
    except ImportError as exc:  # torch / safetensors not installed: say how to get them
        _add_generate_stub(sub, exc)
    else:
        add_generate_parser(sub)
    p = sub.add_parser("demo", help="walk through prefix caching on a hybrid model")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.set_defaults(func=_cmd_demo)
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "accepts_any_arguments", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return run_command(args)


def run_command(args: argparse.Namespace) -> int:
    """Run a parsed command; every error becomes one line on stderr and an exit status."""
    def fail(status: int, message: str) -> int:
        message = name_options(message, getattr(args, "option_names", None) or {})
        print(f"hybridkv {args.command}: error: {message}", file=sys.stderr)
        return status
    try:
        return args.func(args)
    except BrokenPipeError:  # piped into a reader that stopped early (e.g. `| head`)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ValueError as exc:                 # bad input: a usage error
        return fail(2, str(exc))
    except MemoryError:
        return fail(1, "out of memory; use a smaller --cache-tokens / --num-blocks, --limit or "
                       "a shorter trace")
    except OSError as exc:
        where = f" {exc.filename!r}" if getattr(exc, "filename", None) else ""
        return fail(1, f"{exc.strerror or exc}{where}")
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return fail(130, "interrupted")
    except RuntimeError as exc:               # e.g. a workload that cannot run as configured
        return fail(2, str(exc))
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback for users
        if os.environ.get("HYBRIDKV_DEBUG"):
            raise
        return fail(1, f"internal error {type(exc).__name__}: {exc} (please report it; "
                       "HYBRIDKV_DEBUG=1 shows the traceback)")


def _add_generate_stub(sub: argparse._SubParsersAction, exc: ImportError) -> None:
    """``generate`` without the engine extras: the subcommand stays and says what to install."""
    missing = getattr(exc, "name", None) or str(exc)
    message = (f"hybridkv generate needs the engine extras (missing: {missing}): "
               'pip install "hybridkv[engine]"')
    p = sub.add_parser("generate", help="greedy generation with the reference engine "
                                        '(needs pip install "hybridkv[engine]")',
                       description=message)

    def unavailable(args: argparse.Namespace) -> int:
        print(f"hybridkv generate: error: {message}", file=sys.stderr)
        return 2
    p.set_defaults(func=unavailable, accepts_any_arguments=True)


def _cmd_demo(args: argparse.Namespace) -> int:
    result = demo(as_json=args.json)
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

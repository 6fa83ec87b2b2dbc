"""``hybridkv demo``: a short printed walk-through of prefix caching on a hybrid full +
sliding-window model (retention, the scratch-first free queue, speculative decoding)."""

from __future__ import annotations

import argparse

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow, SpecDecode)
from hybridkv.cli.base import COMMANDS, Command
from hybridkv.cli.output import print_json
from hybridkv.core.cache_options import CacheOptions


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
        kv = KVCacheManager(config, CacheOptions(retention_interval=interval))
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
        kv = KVCacheManager(config, CacheOptions(spec_decode=spec, retention_interval=0))
        prompt = list(range(1025))
        a, _ = _serve(kv, "A", prompt)
        kv.free(a)
        _, hit = _serve(kv, "B", prompt)
        say(f"  {label:<28} hit {hit} (lookahead slots {kv.lookahead_slots})")
        out[f"eagle_{'lookahead' if spec.hash_lookahead else 'drop'}"] = hit
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")


def run(args: argparse.Namespace) -> int:
    result = demo(as_json=args.json)
    if args.json:
        print_json(result)
    return 0


COMMANDS.register("demo", Command(
    help="walk through prefix caching on a hybrid model", add_arguments=add_arguments, run=run))

__all__ = ["demo", "run"]

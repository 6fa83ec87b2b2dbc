"""Speculative decoding × hybrid layouts of three to five groups: a correct proof costs exactly
its lookahead block, never more (issue 42; vLLM #51771: EAGLE/MTP drop with >= 3 groups).

Every speculative method (EAGLE, EAGLE-3 and MTP in drop mode and with lookahead hashing,
DFlash) runs the same seeded multi-turn workload (a shared system prompt, chat sessions,
resends) on every layout, beside a reference manager of the same layout without speculative
decoding. The oracle is computed from the tokens alone, never from ``core/rules``: with ``S``
the longest prefix a request shares with an earlier request's tokens (all computed), ``h``
the reference hit and ``A`` the alignment,

* DFlash (no boundary proof): the hit is ``h``;
* lookahead hashing: a block's hash covers the token after it, so the hit is ``h - A`` when
  that token is not shared (``S <= h``), else ``h``;
* drop mode: a hit at ``h`` needs the proof groups' block after it cached, so the hit is
  ``h - A`` when that block is not shared (``min(S, P) < h + b``, ``b`` the proof groups'
  block size, ``P`` the prompt), else ``h``; with a recurrent-state group also ``h - A``
  where no earlier request holding the hit's prefix had the proof block inside its own
  prompt (``h > (P' - b)`` rounded down to ``A``): a checkpoint is written while the prompt
  is computed, where the prompt promises one, and cannot be taken later from the decode.

Never more than one alignment unit, on any layout.

Per group, :attr:`~hybridkv.core.events.PrefixCacheStats.block_hit_rate_by_group` tells a
correct drop (every group one alignment unit short on a resend: 31/32 blocks) from a broken
write mask (one group at 0 while the others hit).
"""

from __future__ import annotations

import random

import pytest

from hybridkv import (MLA, FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow, SpecDecode)
from hybridkv.core.specs import StateSpec
from hybridkv.core.cache_options import CacheOptions


def _swa(bs: int, w: int) -> SlidingWindow:
    return SlidingWindow(bs, num_kv_heads=1, head_dim=8, window=w)


def _full(bs: int) -> FullAttention:
    return FullAttention(bs, num_kv_heads=1, head_dim=8)


_STATE = StateSpec(block_size=16, conv_shape=(1, 4), conv_dtype="float32", state_shape=(2, 2),
                   state_dtype="float32")

#: target groups of each layout (the drafter's group is added per method)
LAYOUTS = {
    # full attention beside two windows of different block sizes
    "full+2swa": (("full", _full(16)), ("swa16", _swa(16, 32)), ("swa4", _swa(4, 8))),
    # DeepSeek-V4-Flash's five groups at a quarter of its block sizes {256, 64, 64, 4, 8}
    "v4flash/4": (("mla", MLA(64)), ("swa_a", _swa(16, 32)), ("swa_b", _swa(16, 32)),
                  ("c4", _swa(1, 2)), ("c128", _swa(2, 32))),
    # MLA, a window and a recurrent state
    "mla+swa+state": (("mla", MLA(32)), ("swa", _swa(8, 64)), ("state", _STATE)),
    # full attention and three windows, block sizes 8, 4, 2
    "full+3swa": (("full", _full(8)), ("w16", _swa(8, 16)), ("w24", _swa(4, 24)),
                  ("w4", _swa(2, 4))),
}

#: method -> (SpecDecode, the drafter group's spec kind): EAGLE drafters are one full-attention
#: layer, MTP one MLA layer (DeepSeek's), DFlash one full-attention layer
METHODS = {
    "eagle-drop": (SpecDecode("eagle", 2, hash_lookahead=False), "full"),
    "eagle3-drop": (SpecDecode("eagle3", 3, hash_lookahead=False), "full"),
    "mtp-drop": (SpecDecode("mtp", 1, hash_lookahead=False), "mla"),
    "eagle-lookahead": (SpecDecode("eagle", 2), "full"),
    "mtp-lookahead": (SpecDecode("mtp", 1), "mla"),
    "dflash": (SpecDecode("dflash", 3), "full"),
}


def _config(layout: str, drafter: str) -> KVCacheConfig:
    groups = [KVCacheGroup(name, spec, (f"layers.{i}",)) for i, (name, spec) in enumerate(LAYOUTS[layout])]
    bs = groups[0].spec.block_size
    spec = _full(bs) if drafter == "full" else MLA(bs)
    groups.append(KVCacheGroup("drafter", spec, ("draft.0",), is_draft=True))
    return KVCacheConfig(tuple(groups), num_blocks=20_000)


def _workload(seed: int, a: int) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) pairs: a system prompt of 3-4 alignment units, four sessions whose turns
    extend the previous turn's prompt and output, and resends of earlier prompts."""
    rng = random.Random(seed)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(1, 1 << 30) for _ in range(n)]

    system = fresh(3 * a + rng.randrange(a))
    last: dict[int, list[int]] = {}
    out: list[tuple[list[int], list[int]]] = []
    for i in range(24):
        s = rng.randrange(4)
        if s in last and rng.random() < 0.5:
            p = last[s] + fresh(rng.randrange(1, 2 * a))
        elif out and rng.random() < 0.2:
            p = list(rng.choice(out)[0])
        else:
            p = system + fresh(rng.randrange(1, 2 * a))
        answer = fresh(rng.randrange(1, a))
        last[s] = p + answer
        out.append((p, answer))
    return out


def _serve(kv: KVCacheManager, workload) -> list:
    """One request at a time: prefill, decode the output token by token, free. Returns each
    request's CacheHit."""
    hits = []
    for i, (p, answer) in enumerate(workload):
        r = Request(i, p)
        hit = kv.lookup(r)
        assert kv.allocate(r, len(p) - hit.num_tokens, hit) is not None
        r.num_computed_tokens = len(p)
        for t in answer:
            r.append_tokens([t])
            assert kv.allocate(r, 1) is not None
            r.num_computed_tokens += 1
        kv.free(r)
        kv.check_integrity()
        hits.append(hit)
    return hits


def _lcp(x: list[int], y: list[int]) -> int:
    k = 0
    for u, v in zip(x, y):
        if u != v:
            break
        k += 1
    return k


def _shared(workload) -> list[tuple[int, list[tuple[int, int]]]]:
    """Per request, the longest prefix its prompt shares with an earlier request's tokens, and
    per earlier request (its prompt length, the prefix shared with its tokens)."""
    out = []
    for i, (p, _) in enumerate(workload):
        earlier = [(len(q), _lcp(p, q + answer)) for q, answer in workload[:i]]
        out.append((max((k for _, k in earlier), default=0), earlier))
    return out


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_proof_costs_exactly_its_lookahead_block(layout: str, method: str) -> None:
    """lookup, write path, free — on every layout and method, each request's hit equals the
    token oracle above (the reference hit, less one alignment unit exactly where the proof
    is not shared), over 2 seeds x 24 requests; the pool stays consistent after each."""
    spec, drafter = METHODS[method]
    config = _config(layout, drafter)
    a = config.alignment
    # the proof groups: the drafter and every group with its spec (looked up together)
    proof_bs = config.groups[-1].spec.block_size
    has_state = config.has_state
    for seed in range(2):
        work = _workload(seed, a)
        ref = _serve(KVCacheManager(config), work)
        got = _serve(KVCacheManager(config, CacheOptions(spec_decode=spec)), work)
        for i, ((p, _), (s, earlier), r, g) in enumerate(zip(work, _shared(work), ref, got)):
            h = r.num_tokens
            if spec.hash_lookahead:
                lost = h > 0 and s <= h
            elif spec.drops_last_block:
                lost = h > 0 and min(s, len(p)) < h + proof_bs
                if has_state and h > 0:
                    # a checkpoint is taken only where a prompt promises one: at most where
                    # the prompt itself holds the proof block, (P - b) rounded down to A,
                    # in an earlier request holding the hit's prefix
                    lost = lost or h > max((pl - proof_bs) // a * a for pl, k in earlier if k >= h)
            else:
                lost = False
            assert g.num_tokens == h - a * lost, (seed, i, h, s, g.num_tokens)

"""Minimal reproductions of the parity matrix's divergences (docs/parity.md).

Each repro is a tiny hand-written trace (sequential requests, ``after`` chains) with a case
config and a pool size, run through the same loop as the matrix. ``VLLM`` holds vLLM 0.33's
results for them (per request: hit tokens at each admission), measured with
``.venv-vllm/bin/python benchmarks/parity_repros.py``; the replay test checks hybridkv
against them without vLLM.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import parity_harness as P  # noqa: E402


def _toks(base: int, n: int) -> list[int]:
    return [base + i for i in range(n)]


@dataclass(frozen=True)
class Repro:
    name: str
    diagnosis: str
    case: P.Case
    num_blocks: int
    items: tuple[P.Item, ...]
    max_model_len: int = 256

    def run(self, side_factory) -> P.RunResult:
        trace = list(self.items)
        geo = P.geometry(self.case, trace)
        geo = P.Geometry(geo.block_sizes, geo.hash_block_size, geo.alignment,
                         self.max_model_len, self.num_blocks)
        return P.run_case(self.case, trace, side_factory(self.case, geo))


def _seq(*specs: tuple[str, list[int], int]) -> tuple[P.Item, ...]:
    """Sequential requests: (id, prompt, answer length), each after the previous one."""
    out, prev = [], None
    for i, (rid, prompt, n_ans) in enumerate(specs):
        out.append(P.Item(rid, prompt, _toks(90_000 + 1000 * i, n_ans), prev, 0, (1,) * n_ans))
        prev = rid
    return tuple(out)


def _case(name, groups, retention, eagle, lookahead) -> P.Case:
    return P.Case(name, groups, retention, eagle, lookahead, "repro", "repro", 0,
                  max_num_seqs=1)


F16 = ("full", 16, 0)

# D1: periodic retention N (window 64 / block 16 -> need 4 blocks; N = 128 -> 8-block
# segments). A: prompt 100 (replay end 96 -> tail blocks 2..5) and 14 answer tokens, so 113
# tokens are computed (7 full blocks; segment 0 unfinished). B extends A's whole sequence.
_A = _toks(1, 100)
D1 = Repro(
    "D1 periodic N, unfinished segment", "D1",
    _case("D1", (F16, ("swa", 16, 64)), 128, None, 0), 400,
    _seq(("A", _A, 14), ("B", _A + _toks(90_000, 13) + _toks(5000, 60), 1)),
)

# D3: drop mode, one full group: a request that recomputes the proof block right after its
# hit (R2: hit 32 = 2 blocks, then computes blocks 2..3, block 2 full) caches that new copy
# of block 2 in vLLM, not in hybridkv (compat). The free queue then differs: R1's copy of
# block 2 is older than X's blocks; F evicts it (and, in hybridkv, R2's unhashed copy, which
# sits at the queue's head), so R3 finds block 2 only in vLLM (as R2's copy).
_R = _toks(1, 51)
D3 = Repro(
    "D3 EAGLE proof block recomputed after a hit", "D3",
    _case("D3", (F16,), 0, "all", 0), 10,
    _seq(("R1", _R, 1), ("X", _toks(6000, 40), 1), ("R2", _R + _toks(3000, 5), 1),
         ("F", _toks(7000, 65), 1), ("R3", _R + _toks(3000, 5) + _toks(4000, 20), 1)),
    max_model_len=128,
)

# D4: hybrid EAGLE (all groups), full block 16 + window block 32 (alignment 32). A computes
# 100 tokens: vLLM caches full-group blocks 0..5 (up to align(100) + 16 = 112, capped at 100
# -> 6 full blocks), hybridkv 0..4 (aligned ends only: 64, whose run with its proof block is
# [0, 5)). F then takes every free block: vLLM evicts one cached block more.
D4 = Repro(
    "D4 EAGLE full group cached past the aligned end", "D4",
    _case("D4", (F16, ("swa", 32, 64)), 0, "all", 0), 24,
    _seq(("A", _toks(1, 100), 1), ("F", _toks(7000, 150), 1)), max_model_len=160,
)

# D5: EAGLE on the full group only, window 64. A caches its whole prompt in the full group
# and the replay tails in the window group. B shares A's first 150 tokens: the full group hits
# 144 but the window group nothing, so B's hit is 0 and its junction 144; hybridkv promises
# the junction and 144 - 16 = 128 to the window group, vLLM adds ``boundary - block_size``
# only in EAGLE managers (here the full group, which caches every block anyway). C shares
# A's first 130 tokens and hits 112 only in hybridkv (its window run lies in the extra tail).
_A5 = _toks(1, 200)
D5 = Repro(
    "D5 junction - block promised to a non-EAGLE window group", "D5",
    _case("D5", (F16, ("swa", 16, 64)), 0, "full", 0), 200,
    _seq(("A", _A5, 1), ("B", _A5[:150] + _toks(5000, 60), 1),
         ("C", _A5[:130] + _toks(6000, 60), 1)),
)

REPROS = [D1, D3, D4, D5]


def main() -> int:
    import parity_vllm as PV
    V = PV.VllmModules()
    for r in REPROS:
        v = r.run(lambda c, g: PV.VllmSide(V, c, g))
        h = r.run(lambda c, g: P.HybridkvSide(c, g))
        d = P.compare(h, v.hits, v.summary())
        print(f"{r.name}: {'exact' if d.exact else 'DIFF'}")
        print(f"    vLLM     hits {v.hits} {v.summary()}")
        print(f"    hybridkv hits {h.hits} {h.summary()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

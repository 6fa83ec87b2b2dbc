"""The hit-point layer against a brute-force model, over random request streams.

Requests walk a random prefix tree of key blocks (a shared root, branches, conversations that
come back and extend their chain), hit what is cached, compute the rest, store a window block
at one or two hit points of their chain (the end, sometimes a point before it), then free
everything tail first; other requests' allocations evict. After every request:

* the blocks the layer counts as needed are exactly the key blocks on the chain of a live hit
  point (every block of the chain still holding the content it had when the point was born),
  as long as no needed block had to go;
* no block is in two regions, ``check()`` holds (it recomputes every count from the links);
* no victim was needed while a dead block was free, and a needed block goes only when nothing
  else is (the dead, idle and ranked regions are empty after such an eviction).
"""

from __future__ import annotations

import hashlib
import random

import pytest

from hybridkv.core.eviction import HitPointLayer, LRUPolicy
from hybridkv.core.policy_pool import PolicyBlockPool


def _key(*parts: object) -> bytes:
    return hashlib.blake2b(repr(parts).encode(), digest_size=16).digest()


class _World:
    """A pool behind the layer, and what the brute force knows: block -> content, per live
    hit point (its anchor) the chain contents it was born with."""

    def __init__(self, seed: int, num_blocks: int) -> None:
        self.rng = random.Random(seed)
        self.pool = PolicyBlockPool(num_blocks, 2, HitPointLayer(LRUPolicy(), 0))
        self.layer = self.pool.policy
        self.content: dict[int, tuple[object, ...]] = {}   # block -> (group, path) it holds
        self.index: dict[tuple[object, ...], int] = {}     # (group, path) -> block
        self.chains: dict[int, list[tuple[int, tuple[int, ...]]]] = {}  # anchor -> (block, path)
        self.paths: list[tuple[int, ...]] = [(0,)]
        self.next_id = 1

    def _evicted(self, blocks: list[int]) -> None:
        for b in blocks:
            c = self.content.pop(b, None)
            if c is not None and self.index.get(c) == b:
                del self.index[c]

    def _alloc(self, n: int) -> list[int]:
        layer = self.layer
        before_dead = set(layer.dead)
        needed = {b for b in layer.need} | set(layer.held)
        forced = layer.counts[2]
        blocks = self.pool.allocate(n)
        victims = [b for b in blocks if b in self.content]
        if before_dead and victims:
            # dead blocks go before anything the layer still counts as needed
            first_needed = next((i for i, b in enumerate(victims) if b in needed), None)
            if first_needed is not None:
                assert all(b in set(victims[:first_needed]) for b in before_dead), victims
        if layer.counts[2] > forced:
            assert not layer.dead and not layer.idle and not len(layer.inner)
        self._evicted(victims)
        return blocks

    def request(self) -> None:
        rng = self.rng
        base = rng.choice(self.paths)
        path = list(base[:8])               # (a request holds at most 14 blocks: the pool has 24+)
        for _ in range(rng.randint(1, 4)):
            self.next_id += 1
            path.append(self.next_id)
        keys = [tuple(path[:i + 1]) for i in range(len(path))]
        table: list[int] = []
        hit = 0
        for p in keys:                      # the cached prefix (a hit needs a hit point, but
            b = self.index.get((0, p))      # the pool's touch of it is what matters here)
            if b is None:
                break
            hit += 1
            table.append(b)
        if table:
            self.pool.touch(table)
        fresh = self._alloc(len(keys) - hit)
        for b, p in zip(fresh, keys[hit:]):
            self.pool.insert(0, _key(p), b)
            self.content[b] = (0, p)
            self.index[(0, p)] = b
        table += fresh
        ends = [len(keys) - 1]
        if len(keys) > 2 and rng.random() < 0.5:
            ends.append(rng.randrange(len(keys) - 1))
        wins = self._alloc(len(ends))
        for w, k in zip(wins, ends):
            c = (1, keys[k], w)
            self.pool.insert(1, _key("window", w, keys[k]), w)
            self.content[w] = c
            a = table[k]
            born = a not in self.layer.live
            self.pool.anchor([w], [k], table, classes=[rng.randrange(4)])
            if born:
                self.chains[a] = [(table[j], keys[j]) for j in range(k + 1)]
        self.pool.free(list(reversed(table)))
        self.pool.free(wins)
        self.paths.append(tuple(path))
        if rng.random() < 0.3:
            self.paths.append(tuple(path[:rng.randint(1, len(path))]))

    def pressure(self) -> None:
        n = self.rng.randint(1, max(1, self.pool.num_free // 3))
        blocks = self._alloc(min(n, self.pool.num_free))
        self.pool.free(blocks)              # hash-less scratch: back to the queue

    def oracle_need(self) -> set[int]:
        out: set[int] = set()
        for a in list(self.chains):
            if a not in self.layer.live:
                del self.chains[a]
                continue
            chain = self.chains[a]
            if all(self.content.get(b) == (0, p) for b, p in chain):
                out.update(b for b, _ in chain)
        return out


@pytest.mark.parametrize("seed", range(12))
def test_the_needed_blocks_are_the_chains_of_live_hit_points(seed: int):
    world = _World(seed, num_blocks=24 + 8 * (seed % 4))
    for step in range(150):
        if world.rng.random() < 0.8:
            world.request()
        else:
            world.pressure()
        world.pool.check()
        if world.layer.counts[2] == 0:
            assert set(world.layer.need) == world.oracle_need(), (seed, step)

"""The pool's hash index (``hash -> block id``): candidate implementations on the pool's access
pattern, each driven by the same compiled (Cython) loop, so only the table differs.

    python benchmarks/bench_hash_index.py [--live 190000] [--steps 1000000] [--repeats 3]

The pattern (the Mooncake main job's, scaled): ``--live`` cached blocks; per step a lookup
that misses (a new prompt block), its insert, a lookup that hits (a recent block; an equal
digest made by another request, so the table must compare digests) and the eviction of the
oldest cached hash (LRU reuse). Keys are 16-byte xxh3-128 digests.

Then the pool's batches: runs of ``--batch`` inserts (a request's new blocks, ``insert_run``)
and as many evictions (an allocation's batch, ``_forget``), each candidate driven the way the
compiled pool drives it: ``dict``, and the compiled build's native
``hybridkv.core.hash_index_native.HashIndex`` (the pool's index) without and with its
``prefetch`` of the batch's keys before the batch (skipped without a compiled build).

Candidates:

* ``dict``: a Python dict ``bytes -> int`` (the pool's index).
* ``open``: open addressing over two C arrays (the digest's low 64 bits, the block id),
  linear probing, backward-shift deletion, load <= 1/2; a hit compares the full digest
  (``block_hash[b] == h``), so a 64-bit collision never returns a wrong block.
* ``open-pyhash``: the same, keyed by Python's ``hash(h)`` (cached in the bytes object)
  instead of the digest's low 64 bits, so any hashable key works.
* ``preshed``: ``preshed.maps`` (pip ``preshed``; a Cython map over pre-hashed 64-bit keys,
  tombstone deletion), keyed by the low 64 bits, the full digest compared on a hit as above.

The extension is built in a temporary directory with Cython (``preshed`` is skipped when it
is not installed). Prints ns per operation (4 operations per step), best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import subprocess
import sys
import tempfile
import textwrap

PYX = textwrap.dedent('''
    # cython: language_level=3, boundscheck=False, wraparound=False
    from libc.stdint cimport uint64_t, int64_t
    from libc.stdlib cimport malloc, calloc, free
    from libc.string cimport memcmp
    from cpython.bytes cimport PyBytes_AS_STRING
    from time import perf_counter

    cdef inline uint64_t key64(bytes h):
        return (<uint64_t*>PyBytes_AS_STRING(h))[0]

    def run_dict(list keys, list probes, Py_ssize_t live, Py_ssize_t steps):
        cdef dict idx = {}
        cdef Py_ssize_t t, found = 0
        cdef object h
        t0 = perf_counter()
        for t in range(steps):
            h = keys[t]
            if h in idx:
                found += 1
            idx.setdefault(h, t)
            if t >= 1000:
                v = idx.get(probes[t - 1000])
                if v is not None:
                    found += 1
            if t >= live:
                idx.pop(keys[t - live])
        return perf_counter() - t0, found

    cdef class OpenTable:
        cdef uint64_t* keys
        cdef int64_t* vals       # block id, -1 empty
        cdef Py_ssize_t mask, size
        cdef list block_hash
        cdef bint pyhash

        def __cinit__(self, Py_ssize_t cap, list block_hash, bint pyhash):
            self.pyhash = pyhash
            cdef Py_ssize_t n = 1, i
            while n < 2 * cap:
                n <<= 1
            self.keys = <uint64_t*>malloc(n * sizeof(uint64_t))
            self.vals = <int64_t*>malloc(n * sizeof(int64_t))
            for i in range(n):
                self.vals[i] = -1
            self.mask = n - 1
            self.size = 0
            self.block_hash = block_hash

        def __dealloc__(self):
            free(self.keys)
            free(self.vals)

        cdef inline uint64_t key(self, bytes h):
            return <uint64_t>hash(h) if self.pyhash else key64(h)

        cdef inline Py_ssize_t find(self, bytes h):
            cdef uint64_t k = self.key(h)
            cdef Py_ssize_t i = <Py_ssize_t>((k * 0x9E3779B97F4A7C15ULL) >> 20) & self.mask
            cdef int64_t b
            while True:
                b = self.vals[i]
                if b < 0:
                    return -1
                if self.keys[i] == k and memcmp(PyBytes_AS_STRING(<bytes>self.block_hash[b]),
                                                PyBytes_AS_STRING(h), 16) == 0:
                    return i
                i = (i + 1) & self.mask

        cdef inline void put(self, bytes h, int64_t b):
            cdef uint64_t k = self.key(h)
            cdef Py_ssize_t i = <Py_ssize_t>((k * 0x9E3779B97F4A7C15ULL) >> 20) & self.mask
            while self.vals[i] >= 0:
                i = (i + 1) & self.mask
            self.keys[i] = k
            self.vals[i] = b
            self.size += 1

        cdef inline void remove_at(self, Py_ssize_t i):
            # backward-shift deletion: no tombstones
            cdef Py_ssize_t j = i, home
            while True:
                j = (j + 1) & self.mask
                if self.vals[j] < 0:
                    break
                home = <Py_ssize_t>((self.keys[j] * 0x9E3779B97F4A7C15ULL) >> 20) & self.mask
                if ((j - home) & self.mask) >= ((j - i) & self.mask):
                    self.keys[i] = self.keys[j]
                    self.vals[i] = self.vals[j]
                    i = j
            self.vals[i] = -1
            self.size -= 1

    def run_open(list keys, list probes, Py_ssize_t live, Py_ssize_t steps, bint pyhash=False):
        cdef list block_hash = keys          # block t holds keys[t]
        cdef OpenTable tab = OpenTable(live + 1, block_hash, pyhash)
        cdef Py_ssize_t t, i, found = 0
        cdef bytes h
        t0 = perf_counter()
        for t in range(steps):
            h = keys[t]
            if tab.find(h) >= 0:
                found += 1
            tab.put(h, t)
            if t >= 1000:
                if tab.find(probes[t - 1000]) >= 0:
                    found += 1
            if t >= live:
                i = tab.find(keys[t - live])
                tab.remove_at(i)
        return perf_counter() - t0, found

''')

NATIVE_PYX = textwrap.dedent('''
    from hybridkv.core.hash_index_native cimport HashIndex

    def run_batches_dict(list keys, Py_ssize_t live, Py_ssize_t steps, Py_ssize_t batch):
        cdef dict idx = {}
        cdef Py_ssize_t t, j
        cdef list run
        t0 = perf_counter()
        for t in range(0, steps, batch):
            run = keys[t:t + batch]
            for j in range(len(run)):
                idx.setdefault(run[j], t + j)
            if t >= live:
                run = keys[t - live:t - live + batch]
                for j in range(len(run)):
                    idx.pop(run[j])
        return perf_counter() - t0, len(idx)

    def run_batches_native(list keys, Py_ssize_t live, Py_ssize_t steps, Py_ssize_t batch,
                           bint prefetch):
        cdef HashIndex idx = HashIndex()
        cdef Py_ssize_t t, j
        cdef list run
        t0 = perf_counter()
        for t in range(0, steps, batch):
            run = keys[t:t + batch]
            if prefetch:
                idx.prefetch(run)
            for j in range(len(run)):
                idx.setdefault(run[j], t + j)
            if t >= live:
                run = keys[t - live:t - live + batch]
                if prefetch:
                    idx.prefetch(run)
                for j in range(len(run)):
                    idx.pop(run[j])
        return perf_counter() - t0, len(idx)
''')

PRESHED_PYX = textwrap.dedent('''
    from preshed.maps cimport PreshMap, map_get, map_set, map_clear

    def run_preshed(list keys, list probes, Py_ssize_t live, Py_ssize_t steps):
        cdef list block_hash = keys
        cdef PreshMap m = PreshMap(2 * live)
        cdef Py_ssize_t t, found = 0
        cdef uint64_t k
        cdef void* v
        cdef bytes h
        t0 = perf_counter()
        for t in range(steps):
            h = keys[t]
            k = key64(h) | 2                 # keys 0 and 1 are preshed's empty/deleted
            v = map_get(m.c_map, k)
            if v != NULL and block_hash[<Py_ssize_t>v - 1] == h:
                found += 1
            map_set(m.mem, m.c_map, k, <void*>(t + 1))
            if t >= 1000:
                h = probes[t - 1000]
                v = map_get(m.c_map, key64(h) | 2)
                if v != NULL and memcmp(PyBytes_AS_STRING(<bytes>block_hash[<Py_ssize_t>v - 1]),
                                        PyBytes_AS_STRING(h), 16) == 0:
                    found += 1
            if t >= live:
                map_clear(m.c_map, key64(keys[t - live]) | 2)
        return perf_counter() - t0, found
''')


def build(have_preshed: bool, native: str | None):
    """The candidates' module; ``native``: the directory holding ``hybridkv`` with the compiled
    index's ``.pxd`` (None: no compiled build, no native candidate)."""
    tmp = tempfile.mkdtemp(prefix="hkv_index_")
    with open(os.path.join(tmp, "hkv_index.pyx"), "w") as fh:
        fh.write(PYX + (PRESHED_PYX if have_preshed else "") + (NATIVE_PYX if native else ""))
    with open(os.path.join(tmp, "setup.py"), "w") as fh:
        fh.write("from setuptools import setup\nfrom Cython.Build import cythonize\n"
                 "setup(ext_modules=cythonize('hkv_index.pyx', quiet=True, "
                 f"include_path=[{native!r}] if {native!r} else [], "
                 "compiler_directives={'legacy_implicit_noexcept': True}))\n")
    out = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tmp,
                         capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"building the candidates failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    sys.path.insert(0, tmp)
    import hkv_index  # noqa: E402
    return hkv_index


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--live", type=int, default=190_000)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch", type=int, nargs="+", default=[16, 256],
                    help="batch sizes of the pool's pattern (default 16 256)")
    a = ap.parse_args()
    import xxhash
    have_preshed = importlib.util.find_spec("preshed") is not None
    native = None
    spec = importlib.util.find_spec("hybridkv.core.hash_index_native")
    if spec is not None and spec.origin and not spec.origin.endswith((".pyx", ".py")):
        native = os.path.dirname(os.path.dirname(os.path.dirname(spec.origin)))
    mod = build(have_preshed, native)
    # made in a random order, so that neighbours in the stream are not neighbours in memory
    # (as in the pool, where a block's hash was made by whichever request computed it)
    order = list(range(a.steps))
    random.Random(1).shuffle(order)
    keys: list = [None] * a.steps
    for i in order:
        keys[i] = xxhash.xxh3_128_digest(i.to_bytes(8, "little"))
    probes = [bytes(bytearray(k)) for k in keys]    # a hit's hash: equal, another object
    runs = {"dict": mod.run_dict, "open": mod.run_open,
            "open-pyhash": lambda *args: mod.run_open(*args, pyhash=True)}
    if have_preshed:
        runs["preshed"] = mod.run_preshed
    expect = None
    best = {name: float("inf") for name in runs}
    for _ in range(a.repeats):
        for name, fn in runs.items():
            s, found = fn(keys, probes, a.live, a.steps)
            if expect is None:
                expect = found
            assert found == expect, (name, found, expect)
            best[name] = min(best[name], s)
    ops = 4 * a.steps
    print(f"live {a.live}, steps {a.steps}, hits {expect}; ns per operation, best of {a.repeats}:")
    for name, s in best.items():
        print(f"  {name:12s} {1e9 * s / ops:7.1f}   ({best['dict'] / s:.2f}x dict)")
    if native is None:
        print("no compiled build of hybridkv (pip install -e .): the pool's batches are not measured")
        return
    for batch in a.batch:
        batched = {"dict": lambda: mod.run_batches_dict(keys, a.live, a.steps, batch),
                   "native": lambda: mod.run_batches_native(keys, a.live, a.steps, batch, False),
                   "native+prefetch": lambda: mod.run_batches_native(keys, a.live, a.steps, batch, True)}
        best = {name: float("inf") for name in batched}
        sizes = set()
        for _ in range(a.repeats):
            for name, fn in batched.items():
                s, size = fn()
                sizes.add(size)
                best[name] = min(best[name], s)
        assert len(sizes) == 1, sizes
        ops = 2 * (a.steps - a.live) + a.live
        print(f"the pool's batches of {batch} (inserts, then as many evictions); ns per operation:")
        for name, s in best.items():
            print(f"  {name:16s} {1e9 * s / ops:7.1f}   ({best['dict'] / s:.2f}x dict)")


if __name__ == "__main__":
    main()

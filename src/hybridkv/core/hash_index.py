"""One group's cache index, ``hash -> block id``: a dict in the pure-Python core, an
open-addressing table over a typed array in the compiled one (:func:`new_index`).

:class:`HashIndex` is a mapping with exactly the dict operations the pool and its readers use
(``get``, ``in``, ``[]``, ``[]=``, ``setdefault``, ``pop``, ``len``, iteration, ``keys``,
``items``, ``values``, ``clear``, ``==``) and a dict's results. A value is a block id (an int
>= 0) or, for content computed twice, a dict of block ids (:mod:`hybridkv.core.pool`); such
dicts are rare and live in a side dict, the same object a dict index would hold (the pool
mutates it). Only the iteration order differs from a dict's; nothing depends on it, and
iterating returns equal hashes, not the same objects.

Layout: the table holds 16-byte hashes (the default xxh3-128 digest): per slot three 64-bit
words, the digest's two halves and the value (:data:`EMPTY`, :data:`DUP` or the block id), so
a probe reads one slot and compares the whole digest without touching the bytes object it
came from (a dict reads its entry, then the key object). Linear probing from a Fibonacci hash
of the first half; the load stays at or below 1/2 (the table doubles); deletion shifts later
slots back (no tombstones, so a probe ends at the first empty slot). Any other key (a sha256
digest, a test's short key) lives in a plain dict beside it.
``benchmarks/bench_hash_index.py`` measures it against the dict and ``preshed``
(ARCHITECTURE.md, "The hash index").

The pure-Python core keeps the dict (simple, and faster than this table run as Python);
``tests/core/test_hash_index.py`` checks the table against a dict in both builds and
``tests/core/test_compiled.py`` the compiled core against the pure one.
"""

from __future__ import annotations

from array import array
from typing import Any, Iterator

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

# C constants when compiled (not module attributes there)
#: A free slot's value.
EMPTY = cython.declare(cython.ulonglong, 0xFFFFFFFFFFFFFFFF)
#: A slot whose hash names several blocks: its value is in ``HashIndex.dups``.
DUP = cython.declare(cython.ulonglong, 0xFFFFFFFFFFFFFFFE)
_GOLDEN = cython.declare(cython.ulonglong, 0x9E3779B97F4A7C15)   # 2^64 / golden ratio
_M64 = cython.declare(cython.ulonglong, 0xFFFFFFFFFFFFFFFF)
_MIN_BITS = cython.declare(cython.int, 3)                          # 8 slots
_MISSING = object()                       # pop's "no default"


def new_index() -> Any:
    """An empty index for one group: a :class:`HashIndex` in the compiled core, a dict in the
    pure-Python one."""
    return HashIndex() if cython.compiled else {}


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
@cython.returns(cython.bint)
def _is_digest(h: object) -> bool:
    """Whether ``h`` goes into the table (a 16-byte bytes object)."""
    return type(h) is bytes and len(h) == 16        # type: ignore[arg-type]


@cython.cfunc
@cython.inline
@cython.exceptval(check=False)
@cython.returns(cython.ulonglong)
@cython.locals(h=bytes, j=cython.Py_ssize_t)
def _word(h: bytes, j: int) -> int:
    """Word ``j`` (0 or 1) of the 16-byte digest ``h``, little-endian."""
    if cython.compiled:
        return cython.cast(cython.p_ulonglong, cython.cast(cython.p_char, h))[j]
    return int.from_bytes(h[8 * j:8 * j + 8], "little")


def insert_new(idx: Any, hashes: list, blocks: list) -> int:
    """Insert ``hashes[k] -> blocks[k]`` for k = 0, 1, ... while ``hashes[k]`` is new to
    ``idx`` (a dict or a :class:`HashIndex`; ``len(hashes) == len(blocks)``, each block an
    int); returns how many were inserted (the first hash ``idx`` already holds stops it)."""
    if type(idx) is HashIndex:
        return idx.insert_new(hashes, blocks)
    k = 0
    for h, b in zip(hashes, blocks):
        if idx.setdefault(h, b) is not b:
            break
        k += 1
    return k


def prefetch(idx: Any, hashes: list) -> None:
    """Warn ``idx`` that ``hashes`` are probed next (a :class:`HashIndex` loads their slots
    into the cache together; a dict ignores it)."""
    if type(idx) is HashIndex:
        idx.prefetch(hashes)


def _digest(lo: int, hi: int) -> bytes:
    """The digest whose words are ``lo`` and ``hi`` (:func:`_word`'s inverse)."""
    return int(lo).to_bytes(8, "little") + int(hi).to_bytes(8, "little")


@cython.cclass
class HashIndex:
    """An open-addressing ``hash -> block id`` map with a dict's semantics (module docstring)."""

    slots = cython.declare(cython.ulonglong[:])   # per slot: digest word 0, word 1, value
    other = cython.declare(dict)                  # every key that is not a 16-byte digest
    dups = cython.declare(dict)                   # digest -> its dict of block ids (DUP slots)
    used = cython.declare(cython.Py_ssize_t)
    shift = cython.declare(cython.int)
    mask = cython.declare(cython.Py_ssize_t)

    def __init__(self) -> None:
        self.other = {}
        self.dups = {}
        self._alloc(_MIN_BITS)

    @cython.cfunc
    @cython.locals(n=cython.Py_ssize_t, bits=cython.int)
    def _alloc(self, bits: int) -> None:
        n = 1 << bits
        self.slots = array("Q", [0, 0, EMPTY]) * n
        self.used = 0
        self.shift = 64 - bits
        self.mask = n - 1

    @cython.cfunc
    @cython.inline
    @cython.exceptval(check=False)
    @cython.returns(cython.Py_ssize_t)
    @cython.locals(k=cython.ulonglong)
    def _home(self, k: int) -> int:
        return ((k * _GOLDEN) & _M64) >> self.shift

    @cython.cfunc
    @cython.returns(cython.Py_ssize_t)
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(h=bytes, k0=cython.ulonglong, k1=cython.ulonglong, i=cython.Py_ssize_t,
                   s=cython.ulonglong[:])
    def _find(self, h: bytes) -> int:
        """The slot holding digest ``h``, or -1."""
        s = self.slots
        k0 = _word(h, 0)
        k1 = _word(h, 1)
        i = self._home(k0)
        while s[3 * i + 2] != EMPTY:
            if s[3 * i] == k0 and s[3 * i + 1] == k1:
                return i
            i = (i + 1) & self.mask
        return -1

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(i=cython.Py_ssize_t, v=cython.ulonglong)
    def _value(self, i: int, h: object) -> object:
        v = self.slots[3 * i + 2]
        return self.dups[h] if v == DUP else v

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(k0=cython.ulonglong, k1=cython.ulonglong, v=cython.ulonglong,
                   i=cython.Py_ssize_t, s=cython.ulonglong[:])
    def _put(self, k0: int, k1: int, v: int) -> None:
        """Add the digest with words ``k0``, ``k1`` (absent) with slot value ``v``."""
        if 2 * (self.used + 1) > self.mask + 1:
            self._grow()
        s = self.slots
        i = self._home(k0)
        while s[3 * i + 2] != EMPTY:
            i = (i + 1) & self.mask
        s[3 * i] = k0
        s[3 * i + 1] = k1
        s[3 * i + 2] = v
        self.used += 1

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(old=cython.ulonglong[:], j=cython.Py_ssize_t, n=cython.Py_ssize_t)
    def _grow(self) -> None:
        old = self.slots
        n = self.mask + 1
        self._alloc(64 - self.shift + 1)
        for j in range(n):
            if old[3 * j + 2] != EMPTY:
                self._put(old[3 * j], old[3 * j + 1], old[3 * j + 2])

    @cython.cfunc
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(i=cython.Py_ssize_t, j=cython.Py_ssize_t, home=cython.Py_ssize_t,
                   mask=cython.Py_ssize_t, s=cython.ulonglong[:])
    def _remove_at(self, i: int) -> None:
        """Empty slot ``i``, moving later slots of its cluster back (no tombstones)."""
        s = self.slots
        mask = self.mask
        j = i
        while True:
            j = (j + 1) & mask
            if s[3 * j + 2] == EMPTY:
                break
            home = self._home(s[3 * j])
            if ((j - home) & mask) >= ((j - i) & mask):     # j may move to i
                s[3 * i] = s[3 * j]
                s[3 * i + 1] = s[3 * j + 1]
                s[3 * i + 2] = s[3 * j + 2]
                i = j
        s[3 * i + 2] = EMPTY
        self.used -= 1

    # ---- batches (one call per run of hashes) ------------------------------------------------
    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(hashes=list, s=cython.ulonglong[:], acc=cython.ulonglong, j=cython.Py_ssize_t)
    def prefetch(self, hashes: list) -> int:
        """Read the home slot of each digest of ``hashes`` (independent loads, so the cache
        misses of a run overlap instead of queueing one probe after the other); returns a
        checksum of what it read (so the reads are not optimised away)."""
        s = self.slots
        acc = 0
        for j in range(len(hashes)):
            h = hashes[j]
            if _is_digest(h):
                acc += s[3 * self._home(_word(h, 0)) + 2]    # type: ignore[arg-type]
        return acc & _M64

    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(hashes=list, blocks=list, n=cython.Py_ssize_t, k=cython.Py_ssize_t,
                   i=cython.Py_ssize_t)
    def insert_new(self, hashes: list, blocks: list) -> int:
        """:func:`insert_new` for this index."""
        n = len(hashes)
        self.prefetch(hashes)
        k = 0
        while k < n:
            h = hashes[k]
            b = blocks[k]
            if not _is_digest(h):
                if self.other.setdefault(h, b) is not b:
                    break
            elif self._find(h) >= 0:     # type: ignore[arg-type]
                break
            else:
                self[h] = b
            k += 1
        return k

    # ---- the mapping ------------------------------------------------------------------------
    @cython.locals(i=cython.Py_ssize_t)
    def get(self, h: object, default: object = None) -> object:
        if not _is_digest(h):
            return self.other.get(h, default)
        i = self._find(h)      # type: ignore[arg-type]
        return default if i < 0 else self._value(i, h)

    def __contains__(self, h: object) -> bool:
        if not _is_digest(h):
            return h in self.other
        return self._find(h) >= 0      # type: ignore[arg-type]

    @cython.locals(i=cython.Py_ssize_t)
    def __getitem__(self, h: object) -> object:
        if not _is_digest(h):
            return self.other[h]
        i = self._find(h)      # type: ignore[arg-type]
        if i < 0:
            raise KeyError(h)
        return self._value(i, h)

    @cython.boundscheck(False)
    @cython.wraparound(False)
    @cython.locals(i=cython.Py_ssize_t, v=cython.ulonglong)
    def __setitem__(self, h: object, value: object) -> None:
        if type(value) is dict:
            v = DUP
        elif type(value) is int and 0 <= value < DUP:     # type: ignore[operator]
            v = value                                      # type: ignore[assignment]
        else:
            raise TypeError(f"an index value is a block id (an int >= 0) or a dict of them, "
                            f"got {value!r}")
        if not _is_digest(h):
            self.other[h] = value
            return
        i = self._find(h)      # type: ignore[arg-type]
        if v == DUP:
            self.dups[h] = value
        elif i >= 0 and self.slots[3 * i + 2] == DUP:
            del self.dups[h]
        if i < 0:
            self._put(_word(h, 0), _word(h, 1), v)      # type: ignore[arg-type]
        else:
            self.slots[3 * i + 2] = v

    def __delitem__(self, h: object) -> None:
        self.pop(h)

    @cython.locals(i=cython.Py_ssize_t)
    def setdefault(self, h: object, value: object) -> object:
        if not _is_digest(h):
            return self.other.setdefault(h, value)
        i = self._find(h)      # type: ignore[arg-type]
        if i >= 0:
            return self._value(i, h)
        self[h] = value
        return value

    @cython.locals(i=cython.Py_ssize_t, v=cython.ulonglong)
    def pop(self, h: object, default: object = _MISSING) -> object:
        if not _is_digest(h):
            return self.other.pop(h) if default is _MISSING else self.other.pop(h, default)
        i = self._find(h)      # type: ignore[arg-type]
        if i < 0:
            if default is _MISSING:
                raise KeyError(h)
            return default
        v = self.slots[3 * i + 2]
        self._remove_at(i)
        return self.dups.pop(h) if v == DUP else v

    def __len__(self) -> int:
        return self.used + len(self.other)

    @cython.locals(i=cython.Py_ssize_t)
    def items(self) -> list[tuple[object, object]]:
        """The (hash, value) pairs: the table's in slot order, then the other keys'."""
        out = []
        for i in range(self.mask + 1):
            if self.slots[3 * i + 2] != EMPTY:
                h = _digest(self.slots[3 * i], self.slots[3 * i + 1])
                out.append((h, self._value(i, h)))
        out.extend(self.other.items())
        return out

    def keys(self) -> list[object]:
        """The hashes, in :meth:`items`' order (``dict(index)`` reads them)."""
        return [h for h, _ in self.items()]

    def __iter__(self) -> Iterator[object]:
        return iter(self.keys())

    def values(self) -> list[object]:
        return [v for _, v in self.items()]

    def clear(self) -> None:
        self.other = {}
        self.dups = {}
        self._alloc(_MIN_BITS)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashIndex):
            other = dict(other.items())
        return isinstance(other, dict) and dict(self.items()) == other

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def __repr__(self) -> str:
        return f"HashIndex({dict(self.items())!r})"

    def num_slots(self) -> int:
        """The table's size (a power of two, at least twice the number of digests in it)."""
        return self.mask + 1

    def nbytes(self) -> int:
        """The table's memory in bytes: 24 per slot (the other keys' dict not counted)."""
        return 24 * (self.mask + 1)

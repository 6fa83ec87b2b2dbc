"""Chained block hashes over raw token bytes.

The hash of block ``i`` (tokens ``[i*B, (i+1)*B)`` at the hash block size ``B``) is::

    h[i] = H( h[i-1] | tokens[i*B:(i+1)*B] as int64 | lookahead tokens | encoded extra keys )
    h[-1] = H(seed)                                            (the "none hash")

so one hash identifies the whole prefix up to its block's end. Every field but the extra keys
has a fixed width, which makes the concatenation unambiguous.

* ``H`` is xxh3-128 (default, fastest) or sha256 (for cross-process or multi-tenant use).
* *Lookahead hashing* (``lookahead`` = L > 0): block ``i`` also covers the L tokens after it,
  so a hit proves the token an EAGLE/MTP drafter read at the block's last position. A block's
  hash exists only once L more tokens exist.
* *Extra keys*: LoRA ``("lora", name, path)`` on every block; multimodal items
  ``("mm", identifier, offset - block_start)`` for each item overlapping the block (the offset
  may be negative); ``("cache_salt", salt)`` on block 0 only (chaining salts the rest).
* Groups with a coarser block size ``k*B`` read every k-th hash (:func:`coarse_view`): the last
  fine hash inside a coarse block fingerprints the whole coarse prefix.

Hashes are appended incrementally (:meth:`BlockHasher.update`) as a request's tokens grow.
"""

from __future__ import annotations

import hashlib
import os
import struct
from typing import Callable, Sequence

import xxhash

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.request import Request

HASH_ALGOS = ("xxh3_128", "sha256")
DEFAULT_SEED = "hybridkv-none-hash"
TOKEN_BYTES = 8  # tokens are hashed as little-endian int64

ExtraKey = tuple[object, ...]  # ("lora", name, path) | ("mm", identifier, offset) | ("cache_salt", salt)


def _sha256(data: bytes | bytearray) -> bytes:
    return hashlib.sha256(data).digest()


_DIGESTS: dict[str, Callable[[bytes | bytearray], bytes]] = {"xxh3_128": xxhash.xxh3_128_digest,
                                                              "sha256": _sha256}


def encode_extra_keys(keys: Sequence[ExtraKey]) -> bytes:
    """Canonical, unambiguous byte encoding of a sequence of extra-key tuples."""
    out = [struct.pack("<I", len(keys))]
    for key in keys:
        out.append(struct.pack("<I", len(key)))
        for item in key:
            if isinstance(item, str):
                raw = item.encode()
                out.append(b"s" + struct.pack("<I", len(raw)) + raw)
            elif isinstance(item, bool) or not isinstance(item, int):
                raise TypeError(f"extra key items must be str or int, got {item!r}")
            else:
                out.append(b"i" + struct.pack("<q", item))
    return b"".join(out)


class BlockHasher:
    """Computes a request's chained block hashes, incrementally.

    Args:
        block_size: the hash block size B (tokens per hash).
        algo: "xxh3_128" (default) or "sha256".
        seed: the string whose hash is the chain's root. None means ``DEFAULT_SEED`` for
            sha256 (stable across processes) and a random per-hasher seed for xxh3_128 (so
            collisions cannot be precomputed offline); give a string to share hashes across
            processes or engines.
        lookahead: L, the number of following tokens each block's hash also covers.

    Invariant: ``request.block_hashes[i]`` is the hash of the prefix ``[0, (i+1)*B)`` and
    exists iff ``(i+1)*B + L <= request.num_tokens``.
    """

    __slots__ = ("block_size", "algo", "seed", "lookahead", "none_hash", "_digest")

    def __init__(self, block_size: int, algo: str = "xxh3_128", seed: str | None = None,
                 lookahead: int = 0) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"hash block_size must be a positive integer, got {block_size!r}")
        if algo not in _DIGESTS:
            raise ValueError(f"unknown hash algorithm {algo!r}; valid: {', '.join(HASH_ALGOS)}")
        if isinstance(lookahead, bool) or not isinstance(lookahead, int) or lookahead < 0:
            raise ValueError(f"hash lookahead must be a non-negative integer, got {lookahead!r}")
        if seed is None:
            seed = DEFAULT_SEED if algo == "sha256" else os.urandom(16).hex()
        self.block_size = block_size
        self.algo = algo
        self.seed = seed
        self.lookahead = lookahead
        self._digest = _DIGESTS[algo]
        self.none_hash: bytes = self._digest(seed.encode())

    def hash_block(self, parent: bytes | None, token_ids: Sequence[int],
                   lookahead_ids: Sequence[int] = (), extra_keys: Sequence[ExtraKey] = ()) -> bytes:
        """The hash of one block; the reference formula (used by tests and event consumers)."""
        data = (parent or self.none_hash) + struct.pack(f"<{len(token_ids)}q", *token_ids)
        data += struct.pack(f"<{len(lookahead_ids)}q", *lookahead_ids)
        if extra_keys:
            data += encode_extra_keys(extra_keys)
        return self._digest(data)

    @cython.locals(hashes=list, buf=bytes, parent=bytes, bs=cython.Py_ssize_t,
                   la=cython.Py_ssize_t, start=cython.Py_ssize_t, limit=cython.Py_ssize_t,
                   nblocks=cython.Py_ssize_t, end=cython.Py_ssize_t, step=cython.Py_ssize_t,
                   width=cython.Py_ssize_t, off=cython.Py_ssize_t, k=cython.Py_ssize_t,
                   block_start=cython.Py_ssize_t, raw=cython.p_char, req=Request,
                   work=bytearray, wp=cython.p_char, pp=cython.p_char, plen=cython.Py_ssize_t,
                   i=cython.Py_ssize_t)
    def update(self, request: Request) -> None:
        """Append the hashes of every block of ``request`` that became hashable."""
        if not isinstance(request, Request):
            raise ValueError(f"BlockHasher.update needs a Request, got {type(request).__name__}")
        req = request
        hashes = req.block_hashes
        bs = self.block_size
        la = self.lookahead
        start = len(hashes) * bs
        limit = len(req.token_ids) - la  # a block ending at e is hashable iff e <= limit
        if start + bs > limit:             # most calls (a decode step inside a block)
            return
        nblocks = (limit - start) // bs
        end = start + nblocks * bs
        tokens = req.token_ids
        # the bytes of the new blocks (and their lookahead); a few blocks (a decode step's):
        # the array's own slice costs less than a memoryview's, a long run: one copy less
        span = tokens[start:end + la] if nblocks <= 8 else memoryview(tokens)[start:end + la]
        buf = span.tobytes()
        # compiled, a char pointer into buf: its slices are made by one C call, with no slice
        # object (the source slices the bytes themselves, the same bytes)
        raw = buf
        step = bs * TOKEN_BYTES
        width = step + la * TOKEN_BYTES
        digest = self._digest
        parent = hashes[-1] if hashes else self.none_hash
        if not req.has_extra_keys:
            # each block's input (parent | tokens) is written into one reused buffer: no
            # object per block but its digest
            plen = len(parent)
            work = bytearray(plen + width)
            wp = work
            for k in range(nblocks):                 # (a C loop when compiled)
                off = k * step
                if len(parent) != plen:              # a parent of another length (given)
                    plen = len(parent)
                    work = bytearray(plen + width)
                    wp = work
                if cython.compiled:                  # byte loops: the C compiler's memcpy
                    pp = parent
                    for i in range(plen):
                        wp[i] = pp[i]
                    for i in range(width):
                        wp[plen + i] = raw[off + i]
                else:
                    work[:plen] = parent
                    work[plen:] = raw[off:off + width]
                parent = digest(work)
                hashes.append(parent)
            return
        for k in range(nblocks):
            off = k * step
            block_start = start + k * bs
            keys = req.extra_keys(block_start, block_start + bs + la)
            extra = encode_extra_keys(keys) if keys else b""
            parent = digest(parent + raw[off:off + width] + extra)
            hashes.append(parent)


def coarse_view(hashes: Sequence[bytes], scale: int) -> Sequence[bytes]:
    """Hashes at ``scale`` times the hash block size: element i is ``hashes[(i+1)*scale-1]``."""
    return hashes if scale == 1 else hashes[scale - 1::scale]

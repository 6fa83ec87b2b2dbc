"""Pseudo-token ids for traces that name blocks, not tokens (Mooncake's ``hash_ids``).

Token ``j`` of block id ``h`` is ``splitmix64(((h << s) | j) + golden) >> 33``, with ``s`` the
bits a position needs (at least 1): equal id prefixes give equal token prefixes, different ids
different tokens with overwhelming probability, every value below ``2**31``. Every Mooncake
result depends on these values, so both builds compute the same ones: the source with numpy
(:func:`expand_numpy`, the reference), the compiled build (setup.py compiles this module) with
one C loop over the tokens, which spares a simulated request numpy's fixed cost per call.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

__all__ = ["MOONCAKE_BLOCK_TOKENS", "expand_block_ids", "expand_numpy", "splitmix64"]

MOONCAKE_BLOCK_TOKENS = 512
"""Tokens covered by one Mooncake ``hash_ids`` entry."""

#: The most tokens the C loop writes (8 bytes each must count in a C size; numpy refuses more).
_C_TOKENS = sys.maxsize // 8

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (a bijection on uint64), vectorized; wraps modulo 2**64. Returns
    a new array (``x`` is not changed), computed in place in it and one scratch array."""
    x = x ^ (x >> np.uint64(30))
    x *= _MIX1
    t = x >> np.uint64(27)
    x ^= t
    x *= _MIX2
    np.right_shift(x, np.uint64(31), out=t)
    x ^= t
    return x


def _checked_ids(block_ids: Sequence[int], num_tokens: int, block_tokens: int) -> tuple[np.ndarray, int]:
    """The ids as uint64 and the position bits ``s``; ValueError for too few or too large ids."""
    if num_tokens > len(block_ids) * block_tokens:
        raise ValueError(
            f"{len(block_ids)} block ids of {block_tokens} tokens cannot give {num_tokens} tokens"
        )
    ids = np.asarray(block_ids, dtype=np.uint64)
    shift = max(1, (block_tokens - 1).bit_length())
    if ids.size and int(ids.max()) >> (64 - shift):
        raise ValueError(f"block id {int(ids.max())} too large for {block_tokens}-token blocks")
    return ids, shift


def expand_numpy(block_ids: Sequence[int], num_tokens: int, block_tokens: int) -> np.ndarray:
    """:func:`expand_block_ids` in numpy: the reference (the pure-Python build's path)."""
    ids, shift = _checked_ids(block_ids, num_tokens, block_tokens)
    pos = np.arange(block_tokens, dtype=np.uint64)
    x = (ids[:, None] << np.uint64(shift)) | pos[None, :]    # one full-size array, then in place
    x += _GOLDEN
    mixed = splitmix64(x.reshape(-1)[:num_tokens])
    mixed >>= np.uint64(33)                       # below 2**31: the same values as int64
    return mixed.view(np.int64)


if cython.compiled:     # the source runs expand_numpy (the C pointer types exist only here)
    @cython.locals(out=bytearray, cp=cython.p_char, wp=cython.p_ulonglong, n=cython.Py_ssize_t,
                   bt=cython.Py_ssize_t, k=cython.Py_ssize_t, j=cython.Py_ssize_t,
                   end=cython.Py_ssize_t, i=cython.Py_ssize_t, s=cython.Py_ssize_t,
                   h=cython.ulonglong, x=cython.ulonglong, golden=cython.ulonglong,
                   mix1=cython.ulonglong, mix2=cython.ulonglong)
    def _expand_c(ids: list[int], n: int, bt: int, s: int) -> bytearray:
        """The first ``n`` tokens of ``ids`` (``bt`` per id, ``s`` position bits) as int64s
        in the machine's byte order; C arithmetic modulo 2**64, one store per token."""
        out = bytearray(8 * n)
        cp = out
        wp = cython.cast(cython.p_ulonglong, cp)
        golden, mix1, mix2 = int(_GOLDEN), int(_MIX1), int(_MIX2)
        i = 0
        for k in range(len(ids)):
            if i >= n:
                break
            h = ids[k]
            end = min(bt, n - i)
            for j in range(end):
                x = ((h << s) | j) + golden
                x = (x ^ (x >> 30)) * mix1
                x = (x ^ (x >> 27)) * mix2
                wp[i + j] = (x ^ (x >> 31)) >> 33
            i += end
        return out


def expand_block_ids(block_ids: Sequence[int], num_tokens: int,
                     block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> np.ndarray:
    """Expand block ids into ``num_tokens`` deterministic pseudo-token ids (int64, in
    ``[0, 2**31)``; the module docstring has the formula). The last block is cut so the result
    has exactly ``num_tokens`` tokens.

    Args:
        block_ids: non-negative ids below ``2**64 / 2**ceil(log2(block_tokens))``.
        num_tokens: tokens wanted, at most ``len(block_ids) * block_tokens``.
        block_tokens: tokens per id.

    Raises:
        ValueError: too few ids for ``num_tokens``, or an id too large.
    """
    if not cython.compiled or num_tokens < 0 or block_tokens < 1 or num_tokens > _C_TOKENS:
        return expand_numpy(block_ids, num_tokens, block_tokens)
    ids, shift = _checked_ids(block_ids, num_tokens, block_tokens)
    return np.frombuffer(_expand_c(ids.tolist(), num_tokens, block_tokens, shift), dtype=np.int64)

"""A seeded model of how many draft tokens the target accepts per speculative step.

Two ways to state the distribution of the accepted count ``a`` in ``0..k``:

* ``rate`` alpha: each draft is accepted with probability alpha, independently, and verification
  stops at the first rejection, so ``P(a = i) = alpha**i * (1 - alpha)`` for ``i < k`` and
  ``P(a = k) = alpha**k`` (the usual i.i.d. model; mean accepted = ``sum alpha**i, i=1..k``);
* ``probs``: ``P(a = i)`` for ``i = 0..k`` given explicitly (e.g. measured on real traffic).

Draws come from one ``numpy`` generator seeded at construction: the same seed and the same
sequence of calls give the same counts.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hybridkv.core.validation import check_int


class AcceptanceModel:
    """Accepted draft tokens per step, drawn from a fixed distribution.

    Args:
        num_speculative_tokens: k >= 1.
        rate: per-token acceptance probability in [0, 1] (exclusive with ``probs``).
        probs: k + 1 probabilities of accepting 0..k drafts (they must sum to 1).
        seed: the generator seed.
    """

    _BATCH = 4096

    def __init__(self, num_speculative_tokens: int, *, rate: float | None = None,
                 probs: Sequence[float] | None = None, seed: int = 0) -> None:
        k = num_speculative_tokens
        check_int("num_speculative_tokens", k, 1)
        if (rate is None) == (probs is None):
            raise ValueError("give exactly one of rate (per-token acceptance) or probs (P(a=0..k))")
        if rate is not None:
            if not 0.0 <= float(rate) <= 1.0:
                raise ValueError(f"acceptance rate must be in [0, 1], got {rate!r}")
            p = [float(rate) ** i * (1.0 - float(rate)) for i in range(k)] + [float(rate) ** k]
        else:
            p = [float(x) for x in probs]  # type: ignore[union-attr]  # rate is None: probs given
            if len(p) != k + 1:
                raise ValueError(f"probs must have k + 1 = {k + 1} entries (P(a=0..k)), got {len(p)}")
            if any(x < 0 for x in p) or abs(sum(p) - 1.0) > 1e-6:
                raise ValueError(f"probs must be non-negative and sum to 1, got {p} (sum {sum(p):.6f})")
        self.k = k
        self.probs = np.asarray(p, dtype=np.float64)
        self.probs /= self.probs.sum()
        self._rng = np.random.default_rng(seed)
        self._buf: list[int] = []

    @property
    def mean_accepted(self) -> float:
        """Expected accepted drafts per step."""
        return float(np.dot(np.arange(self.k + 1), self.probs))

    def draw(self) -> int:
        """The accepted count of one step, in ``0..k``."""
        if not self._buf:
            self._buf = self._rng.choice(self.k + 1, size=self._BATCH, p=self.probs).tolist()
            self._buf.reverse()
        return self._buf.pop()

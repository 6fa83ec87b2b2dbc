"""Full attention (and MLA, compressed or not): a hit at e needs every block ``[0, e)``."""

from __future__ import annotations

from typing import Any, Callable, ClassVar

try:
    import cython
except ImportError:                       # no Cython: the C types below are no-ops
    from hybridkv import _cython_shim as cython  # type: ignore[no-redef]  # typed by typings/cython.pyi

from hybridkv.core.rules.base import RULES, HitRule, probe_flags
from hybridkv.core.specs import MLA, FullAttention


@RULES.register(FullAttention)
class FullRule(HitRule):
    """Every earlier token is read: runs are nested, so the lookup scans left to right once."""

    kind: ClassVar[str] = "full"
    cost_kind: ClassVar[str] = "full"
    wire_kind: ClassVar[str] = "full_attention"
    downward_closed: ClassVar[bool] = True
    __slots__ = ()

    def lo(self, e: int) -> int:
        return 0

    def key_pairs(self, x: Any) -> Any:
        return x * (x + 1) // 2

    # The base class's formulas with first_key = 0 and key_pairs above inlined (the cost
    # models call them once per request per step): the same arithmetic, the same results.
    def attention_keys(self, new: Any, context: Any) -> Any:
        x = context + new
        return x * (x + 1) // 2 - context * (context + 1) // 2

    def kv_span(self, new: Any, context: Any) -> Any:
        return context + new

    # The batch sums in one C loop when compiled (a request's counts and keys stay far
    # below 2**31, so their products fit 64 bits): the same integers as the base class's.
    @cython.locals(i=cython.Py_ssize_t, n=cython.Py_ssize_t, c=cython.Py_ssize_t,
                   x=cython.Py_ssize_t, total=cython.Py_ssize_t)
    def attention_keys_sum(self, new: list[int], context: list[int]) -> int:
        total = 0
        for i in range(len(new)):
            n = new[i]
            c = context[i]
            x = c + n
            total += x * (x + 1) // 2 - c * (c + 1) // 2
        return total

    @cython.locals(i=cython.Py_ssize_t, total=cython.Py_ssize_t)
    def kv_span_sum(self, new: list[int], context: list[int]) -> int:
        total = 0
        for i in range(len(new)):
            total += new[i] + context[i]
        return total

    @cython.locals(i=cython.Py_ssize_t, total=cython.Py_ssize_t, top=cython.Py_ssize_t,
                   x=cython.Py_ssize_t)
    def span_sum_max(self, new: list[int], context: list[int]) -> tuple[int, int]:
        total = 0
        top = 0
        for i in range(len(new)):
            x = context[i] + 2 * new[i]             # kv_span (context + new) + new
            total += x
            if i == 0 or x > top:
                top = x
        return total, top

    def longest_hit(self, probe: Callable[[int], object], e_max: int, step: int) -> int:
        # [0, e + proof) cached: scan left to right to the first miss.
        proof = self.proof
        e = e_max // step * step
        if e <= 0:
            return 0
        limit = e + proof
        flags = probe_flags(probe)
        if flags is not None and len(flags) >= limit:
            run = flags[:limit]
            j = run.index(False) if not all(run) else limit     # the first miss, in C
        else:
            j = 0
            while j < limit and probe(j):
                j += 1
        e = (j - proof) // step * step
        return e if e > 0 else 0


@RULES.register(MLA)
class MLARule(FullRule):
    """MLA (compressed or not) reads every earlier position too: full attention's rule, with
    its own name, cost kind and wire kind."""

    kind: ClassVar[str] = "mla"
    cost_kind: ClassVar[str] = "mla"
    wire_kind: ClassVar[str] = "mla_attention"
    windowed_wire_kind: ClassVar[str] = "sliding_window_mla"
    __slots__ = ()

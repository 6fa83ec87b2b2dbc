"""The suite's checks of what every registered attention type must state.

:func:`attention_type_problems` is what ``tests/core/test_attention_types.py`` asserts empty;
``tests/test_extending.py`` runs that file (and the other registry tests) again with a
throwaway policy, router and attention type registered (:mod:`tests.support.throwaways`).
"""

from __future__ import annotations

from hybridkv.core.rules import attention_types
from hybridkv.core.specs import STORAGE_KINDS
from hybridkv.cost.calibration import ATTENTION_KINDS

#: vLLM 0.33's ``KVCacheSpecKind`` values (vllm/v1/kv_cache_interface.py), the kinds a KV event
#: may name
VLLM_SPEC_KINDS = frozenset({
    "full_attention", "mla_attention", "sliding_window", "sliding_window_mla", "mamba",
    "chunked_local_attention", "sink_full_attention", "encoder_only_attention", "cross_attention",
    "unknown"})


def attention_type_problems() -> list[str]:
    """One line per missing or invalid fact of a registered attention type (empty: all good)."""
    problems = []
    kinds: dict[str, str] = {}
    for spec_cls, rule_cls in attention_types().items():
        name = f"{spec_cls.__name__} ({rule_cls.__name__})"
        if not isinstance(rule_cls.kind, str) or not rule_cls.kind:
            problems.append(f"{name}: no kind")
        elif kinds.setdefault(rule_cls.kind, rule_cls.__name__) != rule_cls.__name__:
            problems.append(f"{name}: kind {rule_cls.kind!r} is also {kinds[rule_cls.kind]}'s")
        if rule_cls.cost_kind not in ATTENTION_KINDS:
            problems.append(f"{name}: cost_kind {rule_cls.cost_kind!r} not in {ATTENTION_KINDS}")
        if rule_cls.wire_kind not in VLLM_SPEC_KINDS:
            problems.append(f"{name}: wire_kind {rule_cls.wire_kind!r} is not a vLLM spec kind")
        if rule_cls.windowed_wire_kind and rule_cls.windowed_wire_kind not in VLLM_SPEC_KINDS:
            problems.append(f"{name}: windowed_wire_kind {rule_cls.windowed_wire_kind!r} is not a "
                            "vLLM spec kind")
        if getattr(spec_cls, "storage", None) not in STORAGE_KINDS:
            problems.append(f"{name}: storage {getattr(spec_cls, 'storage', None)!r} not in "
                            f"{STORAGE_KINDS}")
    return problems

"""The KV connector of one engine: the scheduler side and the worker side around a store.

::

    Scheduler.schedule()                                   engine step (worker side)
    ────────────────────                                   ─────────────────────────
    lookup (local hit L) ─► match(): which blocks past L   run_saves(out.saves_before)
       does the tier hold?  one batch_exists per group;    loaded = run_loads(out.loads)
       KVCacheManager.lookup_external runs the core's      forward(out.scheduled)
       fixed point over local ∪ tier -> T                  run_saves(out.saves_after)
    allocate(req, 0, hit, external) ─► out.loads           Scheduler.update(out, sampled, loaded)
    manager caches blocks ─► take_saves() ─► out.saves_*      ─► commit_external: computed = T,
                                                                 or recompute from L on failure
                                                           idle: flush() (blocks cached at free)

The tier's keys are the core's chained block hashes (plus group and layout fingerprint, see
:mod:`hybridkv.connectors.transfer`), so any engine with the same model, layout and hash seed
finds the blocks another engine saved. What is saved is exactly what the manager caches (its
write mask, reported by :meth:`KVCacheManager.add_cached_listener`).

Failure contract: the store can lose blocks between ``match`` and the load, refuse saves when
full, go down, or return corrupted bytes. None of it raises: a load that does not verify every
block reports failure and the request recomputes from its local hit; saves are dropped and
counted (:class:`ConnectorStats` of the transfer, plus the counters here).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Sequence

from hybridkv.core.blockref import BlockRef
from hybridkv.core.coordinator import CacheHit, ExternalHit
from hybridkv.core.manager import KVCacheManager
from hybridkv.core.request import Request
from hybridkv.sched.scheduler import KVLoad
from hybridkv.tiers.admission import FrequencyAdmission

from .transfer import KVTransfer

log = logging.getLogger(__name__)


@dataclass
class ExternalStats:
    """Scheduler-side counters: lookups, tokens the tier offered, loads that committed."""

    lookups: int = 0
    matched_tokens: int = 0
    loads_ok: int = 0
    loads_failed: int = 0
    loaded_tokens: int = 0
    exists_errors: int = 0


class KVConnector:
    """Connect one engine's manager and paged cache to an external tier.

    Args:
        kv: the engine's manager (needs a fixed ``hash_seed`` to share hashes across engines).
        transfer: the worker-side mover over the registered cache and the tier.
        load: look up and load from the tier.
        save: save what the manager caches.
        admit_after: save a block only when the manager caches it for the N-th time (the
            frequency admission filter the simulator's tiers use,
            :class:`~hybridkv.tiers.admission.FrequencyAdmission`; 1: every block).
    """

    def __init__(self, kv: KVCacheManager, transfer: KVTransfer, *, load: bool = True,
                 save: bool = True, admit_after: int = 1) -> None:
        names = [g.name for g in kv.config.groups]
        missing = [n for n in names if n not in transfer.layout.groups]
        if missing:
            raise ValueError(f"the transfer's layout has no group(s) {missing}; "
                             f"registered: {sorted(transfer.layout.groups)}")
        self.kv = kv
        self.transfer = transfer
        self.group_names = names
        self.load_enabled = load
        self.save_enabled = save
        self.stats = ExternalStats()
        self._pending: list[BlockRef] = []
        self.admission = FrequencyAdmission(admit_after)
        if save:
            kv.add_cached_listener(self._on_cached)

    # ---- scheduler side -----------------------------------------------------------------------
    def _on_cached(self, group: int, hashes: list[bytes], blocks: list[int]) -> None:
        see = self.admission.see
        self._pending.extend(BlockRef(group, b, h) for h, b in zip(hashes, blocks) if see((group, h)))

    def take_saves(self) -> list[BlockRef]:
        """Drain the blocks cached since the last call."""
        out, self._pending = self._pending, []
        return out

    def match(self, request: Request, hit: CacheHit) -> ExternalHit | None:
        """How far the tier extends the local ``hit`` (the core's rules, via the manager)."""
        if not self.load_enabled or request.skip_prefix_cache:
            return None
        self.stats.lookups += 1
        kv = self.kv
        kv.hasher.update(request)
        hashes = request.block_hashes
        hbs = kv.config.hash_block_size
        present: set[tuple[int, bytes]] = set()
        store = self.transfer.store
        for g, group in enumerate(kv.config.groups):
            scale = group.spec.block_size // hbs
            first = hit.num_tokens // group.spec.block_size
            cand = hashes[(first + 1) * scale - 1::scale]
            if not cand:
                continue
            keys = [self.transfer.key(group.name, h) for h in cand]
            try:
                found = store.batch_exists(keys)
            except Exception:  # noqa: BLE001 - a store failure is a miss, never an error
                log.warning("batch_exists failed; treating the tier as empty", exc_info=True)
                self.stats.exists_errors += 1
                return None
            present.update((g, h) for h, ok in zip(cand, found) if ok)
        if not present:
            return None
        ext = kv.lookup_external(request, hit, lambda g, h: (g, h) in present)
        if ext is not None:
            self.stats.matched_tokens += ext.num_tokens - ext.local_tokens
        return ext

    # ---- worker side --------------------------------------------------------------------------
    def run_loads(self, loads: Sequence[KVLoad]) -> dict[object, bool]:
        """Load each request's blocks; request id -> True iff every block verified."""
        result: dict[object, bool] = {}
        for load in loads:
            ok = self.transfer.load(load.blocks) == len(load.blocks)
            rid = load.req.request_id
            result[rid] = ok
            ext = load.external
            if ok:
                self.stats.loads_ok += 1
                self.stats.loaded_tokens += ext.num_tokens - ext.local_tokens
            else:
                self.stats.loads_failed += 1
        return result

    def flush(self) -> int:
        """Save what was cached since the last step (call when the engine goes idle: blocks
        cached when the last requests finished are otherwise saved only by the next step)."""
        return self.run_saves(self.take_saves())

    def run_saves(self, saves: Sequence[BlockRef]) -> int:
        """Save blocks (one batch per group); returns how many were stored."""
        if not saves or not self.save_enabled:
            return 0
        return sum(self.transfer.save(sorted(saves, key=lambda ref: ref.group)))

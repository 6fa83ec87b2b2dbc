"""A consumer-side index of which instance holds which block, fed by KV events.

The shape Dynamo's KV router and llm-d's ``kvblock.Index`` build from vLLM's events: per KV
cache group, ``block hash -> set of instances``, plus each instance's own set so that an
``AllBlocksCleared`` drops exactly that instance's entries. A router asks
:meth:`KVEventIndex.prefix_match` how many leading blocks of a request each instance holds.

An instance may store the same content twice (two requests computed it at once: two blocks,
two ``BlockStored``, later two ``BlockRemoved``), so each instance counts its copies and stops
being a holder when the count reaches zero; a set would drop the block at the first removal.

Invariants (checked by :meth:`check`): an instance is listed under ``(group, hash)`` iff it
holds at least one copy; no empty holder sets are kept.

Events are applied by duck typing on the class name and the fields ``block_hashes`` and
``group_idx`` (``None`` is its own group), so wire structs decoded by
:func:`hybridkv.events.wire.decode_batch`, vLLM's own ``KVEventBatch`` structs and the core's
in-process events (:mod:`hybridkv.core.events`) all feed it.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

Instance = Hashable
Key = tuple[int | None, object]  # (group_idx, block hash)


class KVEventIndex:
    """``(group, hash) -> instances``, with per-instance sets; see the module docstring."""

    __slots__ = ("_where", "_held", "kinds", "last_seq", "gaps")

    def __init__(self) -> None:
        self._where: dict[Key, set[Instance]] = {}
        self._held: dict[Instance, dict[Key, int]] = {}
        self.kinds: dict[int | None, tuple[str | None, int | None]] = {}
        self.last_seq: dict[Instance, int] = {}
        self.gaps = 0

    # ---- feeding ----------------------------------------------------------------------------
    def add(self, instance: Instance, group: int | None, hashes: Iterable[object]) -> None:
        held = self._held.setdefault(instance, {})
        where = self._where
        for h in hashes:
            key = (group, h)
            n = held.get(key, 0)
            held[key] = n + 1
            if not n:
                s = where.get(key)
                if s is None:
                    where[key] = {instance}
                else:
                    s.add(instance)

    def remove(self, instance: Instance, group: int | None, hashes: Iterable[object]) -> None:
        held = self._held.get(instance)
        if not held:
            return
        where = self._where
        for h in hashes:
            key = (group, h)
            n = held.get(key, 0)
            if n > 1:
                held[key] = n - 1
            elif n == 1:
                del held[key]
                s = where[key]
                s.discard(instance)
                if not s:
                    del where[key]

    def clear(self, instance: Instance) -> None:
        """Forget everything ``instance`` holds (its ``AllBlocksCleared``, or it went away)."""
        held = self._held.pop(instance, {})
        where = self._where
        for key in held:
            s = where[key]
            s.discard(instance)
            if not s:
                del where[key]

    def apply(self, instance: Instance, event: object) -> None:
        """Apply one BlockStored / BlockRemoved / AllBlocksCleared event of ``instance``."""
        name = type(event).__name__
        if name == "BlockStored":
            group = getattr(event, "group_idx", None)
            self.add(instance, group, event.block_hashes)  # type: ignore[attr-defined]
            kind = getattr(event, "kv_cache_spec_kind", None)
            if kind is not None:
                self.kinds[group] = (kind, getattr(event, "kv_cache_spec_sliding_window", None))
        elif name == "BlockRemoved":
            self.remove(instance, getattr(event, "group_idx", None), event.block_hashes)  # type: ignore[attr-defined]
        elif name == "AllBlocksCleared":
            self.clear(instance)
        else:
            raise TypeError(f"not a KV event: {event!r}")

    def apply_batch(self, instance: Instance, batch: object, seq: int | None = None) -> bool:
        """Apply a decoded batch; with ``seq``, returns False (and counts a gap) when batches
        of this instance were missed, so the caller can ask the replay socket for them."""
        ok = True
        if seq is not None:
            last = self.last_seq.get(instance)
            if last is not None and seq != last + 1:
                self.gaps += 1
                ok = False
            self.last_seq[instance] = seq
        for ev in batch.events:  # type: ignore[attr-defined]
            self.apply(instance, ev)
        return ok

    # ---- reading ----------------------------------------------------------------------------
    def holders(self, group: int | None, block_hash: object) -> frozenset[Instance]:
        return frozenset(self._where.get((group, block_hash), ()))

    def num_blocks(self, instance: Instance) -> int:
        return len(self._held.get(instance, ()))

    def prefix_match(self, hashes: Sequence[object], group: int | None = 0) -> dict[Instance, int]:
        """For each instance holding block 0: how many leading blocks of ``hashes`` it holds
        consecutively (llm-d's longest-consecutive-prefix score). Instances with 0 are absent."""
        where = self._where
        alive: set[Instance] | None = None
        out: dict[Instance, int] = {}
        i = 0
        for i, h in enumerate(hashes):
            s = where.get((group, h))
            if not s:
                break
            if alive is None:
                alive = set(s)
            elif not alive <= s:
                for inst in alive - s:
                    out[inst] = i
                alive &= s
                if not alive:
                    break
        else:
            i = len(hashes)
        for inst in alive or ():
            out[inst] = i
        return out

    def check(self) -> None:
        """Raise AssertionError if the two maps disagree."""
        n = 0
        for inst, held in self._held.items():
            for key, copies in held.items():
                assert copies > 0, f"{inst!r} keeps a zero count for {key!r}"
                assert inst in self._where.get(key, ()), f"{inst!r} holds {key!r} unindexed"
            n += len(held)
        assert n == sum(len(s) for s in self._where.values()), "index has extra entries"
        assert all(self._where.values()), "empty holder set kept"

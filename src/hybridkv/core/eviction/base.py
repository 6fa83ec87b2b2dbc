"""The eviction-policy seam: an object that orders the pool's *cached free* blocks.

The pool (:class:`hybridkv.core.pool.BlockPool`) keeps three regions of free blocks and hands
them out in this order:

1. uncached scratch blocks (no hash): reused first, newest first (the head of the free queue);
2. never-used ids (the lazy pool's gap), in id order;
3. cached free blocks (a hash, ref 0), **in the policy's order**.

LRU, the default, is the pool's own intrusive list (zero overhead, vLLM 0.33's exact order).
Any other policy owns region 3 only: the pool hands it every block that reaches ref 0 with a hash
and asks it for victims when regions 1 and 2 are used up. A policy never sees scratch or fresh
blocks, so "scratch first, fresh next" holds by construction whatever it does.

Contract (every call is O(1) or O(log n) amortized, n = blocks held):

* ``on_free(blocks)``: these blocks (explicit ids with a hash, not held) reached ref 0, in the
  order the pool frees them. Callers free a request's blocks tail first, so a policy that keeps
  that order among equals evicts a chain's tail before its prefix.
* ``on_hit(b, held)``: a reference was taken on block ``b`` (a cache hit, or a touch of a block in
  use). If ``held`` the block was free and leaves the policy now.
* ``pop(n)``: remove and return ``n <= len(self)`` victims, first victim first. The pool drops
  their hashes after the call (``pool.block_hash[b]`` is still readable inside it).
* ``forget(blocks)``: these ids were just allocated (new content); per-id history must go.
* ``__len__``, ``__contains__``, ``__iter__`` (the held ids, any order) and ``check()``.
* ``retain(blocks, positions, marks)`` (only policies with ``uses_retention``, called through
  :meth:`PolicyBlockPool.retain`): a request with a retention config is about to release these
  held, cached blocks (table ``positions`` of one group); see
  :mod:`hybridkv.core.retention_config`. The manager refuses retention configs under a policy
  without ``uses_retention``.

A policy may read ``pool.block_hash`` / ``pool.block_group`` of the pool it is attached to
(:meth:`attach`) but never writes pool state (:class:`PolicyPool`: what it may read). Only
online information is used: nothing here knows the future of the request stream.

Registration: a policy is a subclass of :class:`EvictionPolicy` in its own module, decorated
with ``@EVICTION_POLICIES.register("its-name")`` (the same string as its ``name``), and one
import line in ``eviction/__init__.py``. Every policy is built through the one factory
signature :meth:`EvictionPolicy.create` ``(rules, clock)``; a policy that needs neither keeps
the default, ``cls()``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar, Iterator, Mapping, Protocol, Sequence

from hybridkv.core.registry import Registry

if TYPE_CHECKING:
    from hybridkv.core.retention_config import RetentionMark
    from hybridkv.core.rules import HitRule


class PolicyPool(Protocol):
    """What a policy reads of the pool it is attached to, read-only
    (:class:`~hybridkv.core.pool.BlockPool` is one; so is a shadow's stand-in)."""

    @property
    def num_blocks(self) -> int:
        """Block ids are ``< num_blocks``."""

    @property
    def block_hash(self) -> Sequence[bytes | None]:
        """Per block id: its hash, None if it holds none."""

    @property
    def block_group(self) -> Sequence[int]:
        """Per block id: the group whose hash it holds."""

    @property
    def index(self) -> Sequence[Mapping[bytes, object]]:
        """Per group: the hashes it holds (a policy reads only how many groups there are)."""


class EvictionPolicy:
    """Base class of non-LRU policies (see the module docstring for the contract)."""

    name: ClassVar[str] = ""
    #: whether :meth:`retain` is implemented (requests' retention configs order eviction)
    uses_retention: ClassVar[bool] = False
    __slots__ = ("pool",)

    def __init__(self) -> None:
        # None until attach(), which the pool calls before any other method
        self.pool: PolicyPool = None  # type: ignore[assignment]

    @classmethod
    def create(cls, rules: Sequence[HitRule], clock: Callable[[], float]) -> EvictionPolicy:
        """The policy for a manager whose KV-cache groups have these hit ``rules`` (in group
        order) and whose retention TTLs run on ``clock`` (seconds): the one factory signature
        every registered policy is built through. The default ignores both."""
        return cls()

    def attach(self, pool: PolicyPool) -> None:
        """Called once by the pool that owns this policy."""
        if self.pool is not None and self.pool is not pool:
            raise ValueError(f"eviction policy {self.name!r} is already attached to another pool")
        self.pool = pool

    def __len__(self) -> int:
        raise NotImplementedError

    def __contains__(self, b: int) -> bool:
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        raise NotImplementedError

    def on_free(self, blocks: Sequence[int]) -> None:
        raise NotImplementedError

    def on_hit(self, b: int, held: bool) -> None:
        raise NotImplementedError

    def pop(self, n: int) -> list[int]:
        raise NotImplementedError

    def forget(self, blocks: Sequence[int]) -> None:
        raise NotImplementedError

    def retain(self, blocks: Sequence[int], positions: Sequence[int],
               marks: Sequence[RetentionMark]) -> None:
        raise NotImplementedError

    def check(self) -> None:
        """Raise AssertionError if the policy's own bookkeeping is inconsistent."""


#: Every eviction policy but ``lru`` (the pool's own free queue), by name, in the order errors
#: list them. ``lru`` and the alias ``recommended`` are resolved in one place,
#: :func:`hybridkv.core.eviction.resolve_policy`.
EVICTION_POLICIES: Registry[type[EvictionPolicy]] = Registry("eviction policy",
                                                             value_base=EvictionPolicy)

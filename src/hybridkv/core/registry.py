"""One way to register a thing: a named table from a key to an implementation.

Every pluggable kind of hybridkv — hit rules (keyed by attention-spec type), eviction policies,
routers, engine model families, command-line commands — is a :class:`Registry`. A new one is
one module plus one registration line, the decorator on its class::

    POLICIES = Registry("eviction policy")

    @POLICIES.register("s3fifo")
    class S3FIFOPolicy(EvictionPolicy): ...

and the package that holds the registry imports that module once. Lookups of an unknown key
raise ``ValueError`` naming the bad key and every valid one, so a command-line flag, a config
field and a Python caller all get the same message from the one place that knows the names.

A registry keyed by types (``by_type=True``) resolves a subclass to the nearest registered
base class in its method resolution order, so a subclass of a registered spec inherits its
parent's entry unless it registers its own.
"""

from __future__ import annotations

from typing import Callable, Generic, Hashable, Iterator, TypeVar, overload

__all__ = ["Registry"]

V = TypeVar("V")


class Registry(Generic[V]):
    """A table ``key -> value`` of one kind of pluggable implementation.

    Args:
        kind: what the values are, for messages ("eviction policy", "router", ...).
        by_type: keys are classes, and :meth:`get` of a class walks its MRO to the nearest
            registered base.
        key_base / value_base: (by_type) keys must subclass ``key_base``; values that are
            classes must subclass ``value_base``; checked at registration.

    Contract: registration order is kept (:meth:`names` lists keys in that order); a key is
    registered once (a second registration of the same key raises, so two modules cannot
    silently shadow each other); lookups never change the table.
    """

    __slots__ = ("kind", "by_type", "key_base", "value_base", "_table")

    def __init__(self, kind: str, by_type: bool = False, key_base: type | None = None,
                 value_base: type | None = None) -> None:
        self.kind = kind
        self.by_type = by_type
        self.key_base = key_base
        self.value_base = value_base
        self._table: dict[Hashable, V] = {}

    @overload
    def register(self, key: Hashable) -> Callable[[V], V]: ...
    @overload
    def register(self, key: Hashable, value: V) -> V: ...

    def register(self, key: Hashable, value: V | None = None) -> Callable[[V], V] | V:
        """Register ``value`` under ``key``; without ``value``, a decorator that does.

        Raises:
            ValueError: ``key`` is already registered, or (``by_type``) is not a class.
        """
        if self.by_type and not (isinstance(key, type)
                                 and issubclass(key, self.key_base or object)):
            base = self.key_base.__name__ if self.key_base else "class"
            raise ValueError(f"a {self.kind} is registered for a {base} subclass, got {key!r}")
        if not self.by_type and not (isinstance(key, str) and key):
            raise ValueError(f"a {self.kind} name must be a non-empty string, got {key!r}")

        def add(item: V) -> V:
            if self.value_base is not None and not (isinstance(item, type)
                                                    and issubclass(item, self.value_base)):
                raise ValueError(f"a {self.kind} must be a {self.value_base.__name__} subclass, "
                                 f"got {item!r}")
            if key in self._table:
                raise ValueError(f"{self.kind} {self._label(key)} is already registered "
                                 f"(as {self._table[key]!r})")
            self._table[key] = item
            return item

        return add if value is None else add(value)

    def get(self, key: object) -> V:
        """The value registered for ``key`` (by type: for its nearest registered base).

        Raises:
            ValueError: nothing is registered for ``key``; the message names ``key`` and every
                registered key.
        """
        if self.by_type:
            for cls in getattr(key, "__mro__", ()):
                if cls in self._table:
                    return self._table[cls]
            raise ValueError(f"no {self.kind} is registered for {self._label(key, quote=False)}; "
                             f"registered: {', '.join(self.names())}")
        if isinstance(key, str) and key in self._table:
            return self._table[key]
        raise ValueError(f"unknown {self.kind} {self._label(key)}; valid: {', '.join(self.names())}")

    def names(self) -> tuple[str, ...]:
        """Every registered key as a name (class names for a type registry), in order."""
        return tuple(self._label(k, quote=False) for k in self._table)

    def keys(self) -> tuple[Hashable, ...]:
        """Every registered key, in registration order."""
        return tuple(self._table)

    def items(self) -> tuple[tuple[Hashable, V], ...]:
        """``(key, value)`` pairs in registration order."""
        return tuple(self._table.items())

    def __contains__(self, key: object) -> bool:
        try:
            self.get(key)
        except ValueError:
            return False
        return True

    def __iter__(self) -> Iterator[Hashable]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self.names())})"

    @staticmethod
    def _label(key: object, quote: bool = True) -> str:
        name = key.__name__ if isinstance(key, type) else key
        return repr(name) if quote else str(name)

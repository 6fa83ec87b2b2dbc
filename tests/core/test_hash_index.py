"""The pool's hash index: the compiled build's native table against the dict it replaces.

``hybridkv.core.hash_index_native.HashIndex`` (open addressing, backward-shift deletion,
``prefetch``) must be the same mapping as the pure build's ``hybridkv.core.hash_index.HashIndex``
(a dict): after every operation of a random sequence (inserts, ``setdefault``, ``pop`` with
and without a default, ``get``, deletes, overwrites, ``clear``, ``prefetch``) both hold the
same items, answer the same and raise the same errors. Keys are drawn from few hash classes
(colliding keys that differ, equal keys that are distinct objects) so probe runs, wrap-around
and backward shifts are exercised. Needs the compiled build (as tests/core/test_compiled.py).
"""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.core.hash_index import HashIndex as Reference
from hybridkv.core.pool import BlockPool
from tests.core.test_compiled import _require_compiled


def _native():
    _require_compiled()
    from hybridkv.core.hash_index_native import HashIndex
    return HashIndex


class Key:
    """A key whose hash is chosen (so keys collide at will) and equal by ``name``."""

    def __init__(self, name: int, h: int) -> None:
        self.name, self.h = name, h

    def __hash__(self) -> int:
        return self.h

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Key) and other.name == self.name

    def __repr__(self) -> str:
        return f"Key({self.name}, {self.h})"


# names 0..29 in 5 hash classes: homes 0 and 7 of the first table (8 slots: runs wrap around),
# the last slots of the larger ones (15, 31) and 8 (home 0 until the table has 16 slots)
HASHES = (0, 7, 15, 31, 8)
KEYS = st.integers(0, 29).map(lambda n: Key(n, HASHES[n % 5]))
VALUES = st.one_of(st.integers(0, 1000), st.dictionaries(st.integers(0, 50), st.none(), max_size=3))
OPS = st.lists(st.one_of(
    st.tuples(st.just("set"), KEYS, VALUES),
    st.tuples(st.just("setdefault"), KEYS, VALUES),
    st.tuples(st.just("setdefault"), KEYS, VALUES),
    st.tuples(st.just("pop"), KEYS),
    st.tuples(st.just("pop_default"), KEYS),
    st.tuples(st.just("del"), KEYS),
    st.tuples(st.just("get"), KEYS),
    st.tuples(st.just("getitem"), KEYS),
    st.tuples(st.just("contains"), KEYS),
    st.tuples(st.just("prefetch"), st.lists(KEYS, max_size=5)),
    st.tuples(st.just("clear"),),
), min_size=10, max_size=200)


def _apply(m, op):
    kind = op[0]
    try:
        if kind == "set":
            m[op[1]] = op[2]
            return None
        if kind == "setdefault":
            return m.setdefault(op[1], op[2])
        if kind == "pop":
            return m.pop(op[1])
        if kind == "pop_default":
            return m.pop(op[1], "none")
        if kind == "del":
            del m[op[1]]
            return None
        if kind == "get":
            return m.get(op[1])
        if kind == "getitem":
            return m[op[1]]
        if kind == "contains":
            return op[1] in m
        if kind == "prefetch":
            return m.prefetch(op[1])
        m.clear()
        return None
    except KeyError as exc:
        return ("KeyError", exc.args)


@settings(max_examples=150, deadline=None)
@given(OPS)
def test_the_native_index_is_the_dict_after_every_operation(ops) -> None:
    native, ref = _native()(), Reference()
    for i, op in enumerate(ops):
        got, want = _apply(native, op), _apply(ref, op)
        assert got == want, f"operation {i} {op}: {got!r} != {want!r}"
        assert len(native) == len(ref)
        assert native == ref and ref == native and not (native != ref)
        assert dict(native.items()) == dict(ref.items())
        assert sorted(k.name for k in native) == sorted(k.name for k in ref)
        assert all(native[k] == v for k, v in ref.items())


def test_many_keys_grow_and_shrink_the_table_back_to_empty() -> None:
    """Bytes keys as the pool uses them, through several doublings and every key popped again
    (half of them by an equal key that is another object), then reused."""
    native = _native()()
    keys = [i.to_bytes(16, "little") for i in range(5000)]
    for i, k in enumerate(keys):
        assert native.setdefault(k, i) == i
    native.prefetch(keys)
    assert len(native) == 5000 and native.setdefault(keys[7], -1) == 7
    for i, k in enumerate(keys):
        same = k if i % 2 else bytes(bytearray(k))               # equal, not identical
        assert native.pop(same) == i
        assert k not in native
    assert len(native) == 0 and native == {} and list(native) == []
    native[keys[3]] = {1: None}
    assert native == {keys[3]: {1: None}} and native.get(keys[4], "x") == "x"


def test_errors_views_copies_and_pickles_like_a_dict() -> None:
    HashIndex = _native()
    m = HashIndex({b"a": 1, b"b": {2: None}})
    with pytest.raises(KeyError) as exc:
        m[b"z"]
    assert exc.value.args == (b"z",)
    with pytest.raises(KeyError):
        del m[b"z"]
    with pytest.raises(KeyError):
        m.pop(b"z")
    with pytest.raises(TypeError):
        m[[1]] = 2                                   # unhashable, as for a dict
    with pytest.raises(TypeError):
        hash(m)
    assert set(m.keys()) == {b"a", b"b"} and b"a" in m.keys()
    assert sorted(map(repr, m.values())) == ["1", "{2: None}"]
    assert sorted(m.items(), key=repr) == [(b"a", 1), (b"b", {2: None})]
    c = m.copy()
    c[b"a"] = 5
    assert m[b"a"] == 1 and c[b"a"] == 5 and type(c) is HashIndex
    assert pickle.loads(pickle.dumps(m)) == m
    assert m != {b"a": 1} and m != {b"a": 1, b"b": {3: None}} and (m == [1]) is False
    assert repr(HashIndex({b"a": 1})) == "HashIndex({b'a': 1})"
    assert HashIndex([(b"x", 1)], y=2) == {b"x": 1, "y": 2}


def test_the_compiled_pool_uses_the_native_index() -> None:
    HashIndex = _native()
    pool = BlockPool(8, 2)
    assert [type(i) for i in pool.index] == [HashIndex, HashIndex]
    blocks = pool.allocate(3)
    pool.insert_run(1, [b"h0", b"h1", b"h0"], blocks)              # a duplicate inside the run
    assert pool.index[1] == {b"h0": {blocks[0]: None, blocks[2]: None}, b"h1": blocks[1]}
    pool.check()


def test_a_comparison_that_changes_the_index_is_survived() -> None:
    """Defect guarded: a key comparison that grows or clears the table under a probe (a key's
    ``__eq__`` may run any code) must restart the probe, not read or write slots of the old
    table. The index then holds exactly what the operations left, as a dict would."""
    HashIndex = _native()
    m = HashIndex()

    class Meddler(Key):
        """Equal by name; comparing it with another key first runs ``action`` (once)."""

        def __init__(self, name: int, h: int, action) -> None:
            super().__init__(name, h)
            self.action = action

        def __eq__(self, other: object) -> bool:
            if self.action is not None and isinstance(other, Key) and other.name != self.name:
                action, self.action = self.action, None
                action()
            return super().__eq__(other)

        __hash__ = Key.__hash__

    def grow() -> None:                       # 20 keys: the 8-slot table doubles twice
        for j in range(100, 120):
            m[Key(j, 1000 + j)] = j

    m[Meddler(1, 5, grow)] = "m"
    m[Key(2, 5)] = "k"                       # probes past the meddler: the table grows meanwhile
    assert len(m) == 22 and m[Key(2, 5)] == "k" and m[Key(1, 5)] == "m"
    assert sorted(k.name for k in m) == [1, 2, *range(100, 120)]
    assert all(m[Key(j, 1000 + j)] == j for j in range(100, 120))
    m.clear()
    m[Meddler(1, 5, m.clear)] = "m"
    assert m.setdefault(Key(3, 5), "s") == "s"   # the comparison cleared the table first
    assert dict(m.items()) == {Key(3, 5): "s"} and len(m) == 1

"""SizedLRU against a brute-force model: a list of (key, size), oldest first."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridkv.tiers import SizedLRU
from tests.hypothesis_budget import examples


class ListLRU:
    """The rules of hybridkv.tiers.lru written the slow, obvious way."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.items: list[tuple[int, int]] = []

    def used(self) -> int:
        return sum(s for _, s in self.items)

    def put(self, key: int, size: int) -> tuple[bool, list[int]]:
        if size > self.capacity:
            return False, []
        self.items = [(k, s) for k, s in self.items if k != key]
        evicted = []
        while self.used() + size > self.capacity:
            evicted.append(self.items.pop(0)[0])
        self.items.append((key, size))
        return True, evicted

    def get(self, key: int) -> bool:
        for i, (k, s) in enumerate(self.items):
            if k == key:
                self.items.append(self.items.pop(i))
                return True
        return False

    def pop(self, key: int) -> bool:
        n = len(self.items)
        self.items = [(k, s) for k, s in self.items if k != key]
        return len(self.items) != n


ops = st.lists(st.tuples(st.sampled_from(["put", "get", "peek", "pop", "in"]),
                         st.integers(0, 7), st.integers(1, 40)), max_size=60)


@settings(max_examples=examples(300), deadline=None)
@given(capacity=st.integers(0, 100), ops=ops)
def test_sized_lru_matches_the_list_model(capacity: int, ops) -> None:
    lru: SizedLRU[int, str] = SizedLRU(capacity)
    model = ListLRU(capacity)
    for op, key, size in ops:
        if op == "put":
            held, evicted = lru.put(key, f"v{key}", size)
            assert (held, [k for k, _, _ in evicted]) == model.put(key, size)
            assert all(v == f"v{k}" for k, v, _ in evicted)
        elif op == "get":
            assert (lru.get(key) is not None) == model.get(key)
        elif op == "peek":
            assert (lru.peek(key) is not None) == any(k == key for k, _ in model.items)
        elif op == "pop":
            assert (lru.pop(key) is not None) == model.pop(key)
        else:
            assert (key in lru) == any(k == key for k, _ in model.items)
        assert list(lru.keys()) == [k for k, _ in model.items]
        assert lru.used == model.used() <= capacity
        assert len(lru) == len(model.items)


def test_an_entry_larger_than_the_budget_is_refused_and_evicts_nothing() -> None:
    lru: SizedLRU[str, None] = SizedLRU(10)
    lru.put("a", None, 6)
    assert lru.put("b", None, 11) == (False, [])
    assert list(lru.keys()) == ["a"] and lru.used == 6


def test_re_putting_a_key_is_never_its_own_victim() -> None:
    lru: SizedLRU[str, int] = SizedLRU(10)
    lru.put("a", 1, 6)
    lru.put("b", 2, 4)
    held, evicted = lru.put("a", 3, 7)       # a's old 6 B are given back first; b must go
    assert held and [k for k, _, _ in evicted] == ["b"]
    assert lru.peek("a") == (3, 7) and lru.used == 7


@pytest.mark.parametrize("bad", [-1, 1.5, True, None])
def test_a_bad_capacity_is_refused_naming_it(bad) -> None:
    with pytest.raises(ValueError, match="capacity must be an integer >= 0"):
        SizedLRU(bad)


def test_a_non_positive_entry_size_is_refused() -> None:
    with pytest.raises(ValueError, match="size must be > 0"):
        SizedLRU(10).put("a", None, 0)

"""The compiled pool's hash index (:class:`~hybridkv.core.hash_index.HashIndex`) against a
dict, the pure core's index, over random operation sequences: every answer and every final
state equal. Runs as Python in the pure build and compiled in the compiled one."""

from __future__ import annotations

import random

import pytest
import xxhash

import hybridkv.core
from hybridkv.core.hash_index import HashIndex, insert_new, new_index, prefetch


def _digest(i: int) -> bytes:
    return xxhash.xxh3_128_digest(i.to_bytes(8, "little"))


def _collide(i: int) -> bytes:
    """16-byte hashes whose first 8 bytes (where a probe starts) all agree: every probe
    meets the others and must compare the whole digest."""
    return b"\x07" * 8 + i.to_bytes(8, "little")


KEYSETS = {
    "digests": [_digest(i) for i in range(60)],
    "colliding keys": [_collide(i) for i in range(12)],
    "short and non-bytes": [b"h", b"h1", b"", "s", 3, (1, 2)] + [_digest(i) for i in range(6)],
}


def _check_same(t: HashIndex, d: dict) -> None:
    assert len(t) == len(d)
    assert dict(t.items()) == d
    assert sorted(map(repr, t)) == sorted(map(repr, d))
    assert t == d and not (t != d)
    digests = sum(1 for h in d if type(h) is bytes and len(h) == 16)
    assert 2 * digests <= t.num_slots()          # load <= 1/2


@pytest.mark.parametrize("keys", KEYSETS.values(), ids=KEYSETS.keys())
@pytest.mark.parametrize("seed", range(4))
def test_random_operations_answer_as_a_dict(keys: list, seed: int) -> None:
    rng = random.Random(seed)
    t, d = HashIndex(), {}
    for step in range(700):
        h = rng.choice(keys)
        op = rng.randrange(7)
        if op == 0:
            assert t.get(h) == d.get(h) and (h in t) == (h in d)
        elif op == 1:
            b = rng.randrange(50)
            assert t.setdefault(h, b) == d.setdefault(h, b)
        elif op == 2:
            assert t.pop(h, "none") == d.pop(h, "none")
        elif op == 3:                              # duplicated content: a dict of ids
            v = {rng.randrange(50): None for _ in range(rng.randrange(1, 4))}
            t[h] = v
            d[h] = v
            assert t[h] is v
        elif op == 4:
            b = rng.randrange(50)
            t[h] = b
            d[h] = b
        elif op == 5 and h in d:
            assert t[h] == d[h]
            del t[h]
            del d[h]
        elif op == 6 and rng.random() < 0.02:
            t.clear()
            d.clear()
        if step % 50 == 0:
            _check_same(t, d)
    _check_same(t, d)


@pytest.mark.parametrize("h", [_digest(1), b"h"], ids=["digest", "other key"])
def test_a_dict_value_is_the_object_stored(h: bytes) -> None:
    """The pool mutates a duplicate set in place; the index hands back that very dict."""
    t = HashIndex()
    v = {3: None, 5: None}
    t[h] = v
    t.get(h)[7] = None
    assert t[h] == {3: None, 5: None, 7: None}
    assert t.pop(h) is v and h not in t and len(t) == 0
    t[h] = {}                                     # an empty set stays (check() names it)
    assert t[h] == {} and t.values() == [{}] and t.keys() == [h]
    t[h] = 4                                      # back to one block
    assert t.items() == [(h, 4)] and t.setdefault(h, 9) == 4


def test_missing_and_bad_values() -> None:
    t = HashIndex()
    with pytest.raises(KeyError):
        t[b"x"]
    with pytest.raises(KeyError):
        t.pop(b"x")
    for bad in (-1, 1.5, "3", None, True):
        with pytest.raises(TypeError, match="block id"):
            t[b"x"] = bad
    assert len(t) == 0


def test_grows_and_shrinks_on_clear() -> None:
    t = HashIndex()
    for i in range(1000):
        t[_digest(i)] = i
    assert len(t) == 1000 and t.num_slots() == 2048 and t.nbytes() == 24 * 2048
    assert [t[_digest(i)] for i in range(1000)] == list(range(1000))
    for i in range(0, 1000, 2):
        assert t.pop(_digest(i)) == i
    assert [t.get(_digest(i)) for i in range(6)] == [None, 1, None, 3, None, 5]
    t.clear()
    assert len(t) == 0 and t.num_slots() == 8


def test_new_index_by_build() -> None:
    """The compiled core indexes with the table, the pure one with a dict."""
    idx = new_index()
    assert type(idx) is (HashIndex if hybridkv.core.COMPILED else dict)


@pytest.mark.parametrize("keys", KEYSETS.values(), ids=KEYSETS.keys())
def test_insert_new_stops_at_the_first_known_hash(keys: list) -> None:
    """insert_new on a HashIndex and on a dict: the same count, the same entries after."""
    rng = random.Random(5)
    for _ in range(30):
        known = rng.sample(keys, rng.randrange(len(keys) // 2))
        run = rng.sample(keys, rng.randrange(1, len(keys) // 2))
        blocks = [100 + j for j in range(len(run))]
        t, d = HashIndex(), {}
        for j, h in enumerate(known):
            t[h] = d[h] = j
        prefetch(t, run)
        prefetch(d, run)
        k = insert_new(t, run, blocks)
        assert k == insert_new(d, run, blocks)
        want = next((j for j, h in enumerate(run) if h in known or h in run[:j]), len(run))
        assert k == want
        _check_same(t, d)

"""Property test of what a block hash must distinguish: tokens, lookahead tokens, images.

Two requests share a cached prefix of t tokens only if everything the KV of those t tokens (and,
with EAGLE/MTP lookahead hashing, the drafter's KV at position t - 1, which read token t) was
computed from is the same: the tokens ``[0, t + L)`` and the multimodal items overlapping
``[0, t + L)``, at the same offsets (vLLM's extra keys: ``("mm", identifier, offset)``). The
expected hit below is a brute force over that definition; nothing of the implementation's
hasher is reused.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, MultiModalItem, Request, SpecDecode
from tests.support.helpers import FA, config
from tests.hypothesis_budget import budgeted, examples, note
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

BS = 4
IMAGES = {"cat": 3, "dog": 5, "owl": 4}          # identifier -> placeholder length


@st.composite
def prompts(draw):
    n = draw(st.integers(2, 28))
    tokens = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    items, pos = [], 0
    while True:
        pos = draw(st.integers(pos, pos + 8))
        name = draw(st.sampled_from(sorted(IMAGES)))
        if pos + IMAGES[name] > n or draw(st.integers(0, 3)) == 0:
            break
        items.append(MultiModalItem(name, pos, IMAGES[name]))
        for i in range(pos, pos + IMAGES[name]):
            tokens[i] = -1                        # one placeholder id for every image
        pos += IMAGES[name]
    return tokens, items


def mutate(draw, tokens, items):
    """A second prompt: a prefix of the first, maybe with an image swapped or moved, plus new text."""
    keep = draw(st.integers(0, len(tokens)))
    tokens = tokens[:keep] + draw(st.lists(st.integers(0, 2), max_size=6))
    kept = [it for it in items if it.offset + it.length <= keep]
    if kept and draw(st.booleans()):
        k = draw(st.integers(0, len(kept) - 1))
        other = draw(st.sampled_from([i for i in sorted(IMAGES) if IMAGES[i] == kept[k].length] or
                                     [kept[k].identifier]))
        kept[k] = MultiModalItem(other + ("" if other != kept[k].identifier else "-v2"),
                                 kept[k].offset, kept[k].length)
    if not tokens:
        tokens = [0]
    return tokens, kept


def overlapping(items, end: int) -> set[tuple[str, int]]:
    return {(it.identifier, it.offset) for it in items if it.offset < end}


def expected_hit(a, b, lookahead: int) -> int:
    (ta, ia), (tb, ib) = a, b
    best = 0
    for t in range(BS, len(tb), BS):              # t <= len(b) - 1
        end = t + lookahead
        if end > len(ta) or end > len(tb):
            break
        if ta[:end] != tb[:end] or overlapping(ia, end) != overlapping(ib, end):
            break
        best = t
    return best


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(prompts(), st.data(), st.sampled_from([None, SpecDecode("eagle", 1), SpecDecode("mtp", 2)]))
@budgeted(0.05)
def test_hits_respect_tokens_lookahead_and_images(a, data, spec):
    b = mutate(data.draw, *a)
    lookahead = 1 if spec is not None else 0
    kv = KVCacheManager(config(FA(BS), num_blocks=40), CacheOptions(
        spec_decode=spec, retention_interval=None))
    ra = Request("a", a[0], RequestCacheParams(mm_items=a[1]))
    assert kv.allocate(ra, len(a[0]), kv.lookup(ra)) is not None
    ra.num_computed_tokens = len(a[0])
    kv.free(ra)
    hit = kv.lookup(Request("b", b[0], RequestCacheParams(mm_items=b[1]))).num_tokens
    assert hit == expected_hit(a, b, lookahead)
    note("multimodal lookups")
    if hit:
        note("multimodal lookups with a non-zero hit")

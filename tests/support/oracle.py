"""An independent model of prefix-cache hits, for tests.

Nothing here calls into the implementation's lookup, rules or coordinator: the model is written
from the attention definitions and vLLM 0.33's lookup (``find_longest_cache_hit`` of
``FullAttentionManager``, ``SlidingWindowManager`` and ``ChunkedLocalAttentionManager`` in
``vllm/v1/core/single_type_kv_cache_manager.py``; the fixed point and EAGLE margin of
``HybridKVCacheCoordinator.find_longest_cache_hit`` in ``kv_cache_coordinator.py``), and it
learns what is cached only from the manager's public KV events.

* :class:`CacheMirror` rebuilds the set of cached ``(group, hash)`` keys from ``BlockStored``,
  ``BlockRemoved`` and ``AllBlocksCleared`` events, as an external indexer would.
* :func:`needed_blocks` states, per attention type, which blocks of a group a hit ending at
  token ``t`` reads:

  ===============  ===========================================================
  full / MLA       tokens ``[0, t)``
  sliding (W)      tokens ``[max(0, t - W + 1), t)`` (the query at t reads W tokens)
  chunked (C)      tokens ``[floor(t / C) * C, t)`` (only the query's own chunk)
  state (a)        the checkpoint at exactly t: the group's block ``t / a - 1`` (a recurrent
                   state after t tokens depends on all of them and cannot be assembled
                   from other positions; never a proof block: no drafter has such layers)
  proof (drop)     plus the block that starts at t (EAGLE legacy drop mode, draft groups)
  ===============  ===========================================================

* :class:`ContentMirror` keys cached blocks by *content* instead of hash: salt, LoRA (name and
  path), the tokens ``[0, e + L)`` and the multimodal items overlapping them, computed from the
  Request's public fields (never with the implementation's hasher or extra-key helpers); it
  learns which hash names which content from the BlockStored events of the request being
  allocated, and fails when one hash names two contents.
* :func:`oracle_hit` is a brute-force search: the largest multiple of the alignment (LCM of the
  block sizes), at most ``num_tokens - 1``, whose needed blocks are all hashed and cached in
  every group. Identical sibling groups need no special case: each one must hold its own
  blocks, which is what probing them together means.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import reduce
from typing import Iterable

from hybridkv import (AllBlocksCleared, BlockRemoved, BlockStored, KVCacheConfig, Request,
                      SpecDecode)

PROOF_METHODS = ("eagle", "eagle3", "mtp")


class _KeyMultiset:
    """Cached ``(group, key)`` pairs, counted: a key can be held by several blocks at once (two
    requests computed the same content), so a ``BlockRemoved`` for one leaves the others."""

    def __init__(self) -> None:
        self.keys: Counter[tuple] = Counter()

    def _store(self, key: tuple) -> None:
        self.keys[key] += 1

    def _remove(self, key: tuple) -> None:
        assert self.keys[key] > 0, f"BlockRemoved for a key never stored: group {key[0]}"
        self.keys[key] -= 1
        if not self.keys[key]:
            del self.keys[key]

    def __contains__(self, key: tuple) -> bool:
        return self.keys.get(key, 0) > 0

    def cached(self) -> set[tuple]:
        return set(self.keys)


class CacheMirror(_KeyMultiset):
    """The multiset of cached ``(group, hash)`` keys, rebuilt from KV events only."""

    def feed(self, events: Iterable[object]) -> None:
        for ev in events:
            if isinstance(ev, BlockStored):
                for h in ev.block_hashes:
                    self._store((ev.group_idx, h))
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    self._remove((ev.group_idx, h))
            elif isinstance(ev, AllBlocksCleared):
                self.keys.clear()
            else:
                raise AssertionError(f"unknown event {ev!r}")


def alignment(cfg: KVCacheConfig) -> int:
    return reduce(lambda a, b: a * b // math.gcd(a, b), (g.spec.block_size for g in cfg.groups))


def hash_block_size(cfg: KVCacheConfig) -> int:
    return reduce(math.gcd, (g.spec.block_size for g in cfg.groups))


def drop_mode(spec: SpecDecode | None) -> bool:
    """vLLM's legacy EAGLE semantics: a proof method with lookahead hashing turned off."""
    return spec is not None and spec.method in PROOF_METHODS and spec.hash_lookahead is False


def proof_groups(cfg: KVCacheConfig, spec: SpecDecode | None) -> set[int]:
    """Groups that need the block after a hit (vLLM's ``is_eagle_group`` / ``use_eagle``, #44082).

    Draft groups in drop mode; every group when none is marked draft (vLLM's fallback); and
    every group with the same spec as a draft group (identical siblings share one mask).
    """
    if not drop_mode(spec):
        return set()
    drafts = {i for i, g in enumerate(cfg.groups) if g.is_draft}
    states = {i for i, g in enumerate(cfg.groups) if attention_kind(g.spec) == "state"}
    if not drafts:
        return set(range(len(cfg.groups))) - states
    draft_specs = {cfg.groups[i].spec for i in drafts}
    return {i for i, g in enumerate(cfg.groups) if g.spec in draft_specs} - states


def attention_kind(spec) -> str:
    """``full``, ``sliding``, ``chunked`` or ``state``: which attention definition a spec
    follows, read from the spec's own class (independently of :mod:`hybridkv.core.rules`)."""
    from hybridkv.core.specs import MLA, ChunkedLocal, FullAttention, SlidingWindow, StateSpec
    if isinstance(spec, StateSpec):
        return "state"
    if isinstance(spec, (FullAttention, MLA)):
        return "full"
    if isinstance(spec, SlidingWindow):
        return "sliding"
    if isinstance(spec, ChunkedLocal):
        return "chunked"
    raise AssertionError(f"the oracle does not know spec type {type(spec).__name__}")


def needed_blocks(cfg: KVCacheConfig, group: int, t: int, proof: bool) -> range:
    """Block indices of ``group`` a hit ending at token ``t`` reads (see the module table)."""
    spec = cfg.groups[group].spec
    bs = spec.block_size
    rule = attention_kind(spec)
    if rule == "full":
        first_token = 0
    elif rule == "sliding":
        first_token = max(0, t - spec.window + 1)
    elif rule == "chunked":
        first_token = t // spec.chunk_size * spec.chunk_size
    elif rule == "state":
        return range(t // bs - 1, t // bs) if t > 0 else range(0)
    else:
        raise AssertionError(f"the oracle does not know rule {rule!r}")
    return range(first_token // bs, t // bs + (1 if proof else 0))


def hash_index(cfg: KVCacheConfig, group: int, j: int) -> int:
    """Index in ``request.block_hashes`` of the hash that keys block j of ``group``: the last
    fine hash inside the block (vLLM's ``BlockHashListWithBlockSize``: hashes are chained, so the
    last fine hash inside a coarse block is that block's hash)."""
    return (j + 1) * (cfg.groups[group].spec.block_size // hash_block_size(cfg)) - 1


def key_of(cfg: KVCacheConfig, req: Request, group: int, j: int) -> tuple[int, bytes] | None:
    k = hash_index(cfg, group, j)
    return (group, req.block_hashes[k]) if k < len(req.block_hashes) else None


def serves(cfg: KVCacheConfig, spec: SpecDecode | None, compat: bool, req: Request,
           cached: CacheMirror | ContentMirror | set, t: int, cap: int) -> bool:
    """Whether every group holds the blocks a hit ending at ``t`` reads (keyed by content
    with a :class:`ContentMirror`, by the request's hashes otherwise)."""
    proofs = proof_groups(cfg, spec)
    single = len(cfg.groups) == 1
    for g in range(len(cfg.groups)):
        bs = cfg.groups[g].spec.block_size
        for j in needed_blocks(cfg, g, t, g in proofs):
            if compat and single and (j + 1) * bs > cap:
                # vLLM's single-group coordinator looks up at most `cap` tokens and gives the
                # drop no margin (``UnitaryKVCacheCoordinator``): the proof block must
                # lie inside the capped range too.
                return False
            key = cached.key_of(req, g, j) if isinstance(cached, ContentMirror) else \
                key_of(cfg, req, g, j)
            if key is None or key not in cached:
                return False
    return True


def oracle_hit(cfg: KVCacheConfig, spec: SpecDecode | None, compat: bool, req: Request,
               cached: CacheMirror | ContentMirror | set, max_model_len: int | None = None) -> int:
    """The longest servable hit of ``req`` (tokens) given the cached ``(group, hash)`` keys (or
    a :class:`ContentMirror`'s content keys)."""
    if req.skip_prefix_cache:
        return 0
    cap = req.num_tokens - 1
    if max_model_len is not None:
        cap = min(cap, max_model_len - 1)
    a = alignment(cfg)
    for t in range(cap // a * a, 0, -a):
        if serves(cfg, spec, compat, req, cached, t, cap):
            return t
    return 0


# ---- content keys: what a cached block was computed from ------------------------------------
# The mirror above trusts the request's hashes as the identity of a prefix. The content mirror
# below does not: it keys a block by an exact, collision-free identity of everything its KV
# depends on (vLLM's hash inputs: parent, tokens, LoRA, images, salt), computed from the Request's
# public fields, and learns which hash names which content only from the BlockStored events of
# the request being allocated. Two different contents under one hash is then a failure of its
# own (the hash misses an input), and a hash that differs for equal contents shows up as a hit
# the oracle finds and the manager does not.
#
# The KV of group g's block j (tokens [s, e), e = (j + 1) * bs) in a request depends on:
#   * the cache salt and the LoRA adapter (name and path) of the request;
#   * the tokens [0, e + L), L = 1 with EAGLE/EAGLE3/MTP lookahead hashing (the drafter's KV at
#     e - 1 read token e), else 0;
#   * every multimodal item overlapping [0, e + L), by identifier and position: an item
#     overlaps [0, x) iff its offset is below x.


def lookahead_tokens(spec: SpecDecode | None) -> int:
    """L: 1 for a proof method that hashes the boundary token (its default), else 0."""
    return 1 if spec is not None and spec.method in PROOF_METHODS and spec.hash_lookahead else 0


class ContentMirror(_KeyMultiset):
    """The multiset of cached ``(group, content id)`` keys, rebuilt from KV events.

    Content ids are small ints handed out by an interner: equal ids iff equal (salt, LoRA,
    tokens [0, e + L), items overlapping them). ``feed(events, writer)`` must be called right
    after each ``allocate`` / ``free`` of ``writer`` (the request whose blocks those events
    store); ``BlockRemoved`` and ``AllBlocksCleared`` need no writer.
    """

    def __init__(self, cfg: KVCacheConfig, spec: SpecDecode | None) -> None:
        super().__init__()
        self.cfg = cfg
        self.hbs = hash_block_size(cfg)
        self.la = lookahead_tokens(spec)
        self.content_of: dict[tuple[int, bytes], int] = {}   # (group, hash) -> content id
        self._ids: dict[tuple, int] = {}
        self._chains: dict[int, tuple[Request, list[int]]] = {}

    # -- content ids ------------------------------------------------------------------------
    def _intern(self, key: tuple) -> int:
        return self._ids.setdefault(key, len(self._ids))

    def chain(self, req: Request) -> list[int]:
        """Content ids of ``req``'s fine blocks: element i covers tokens ``[0, (i+1)*hbs + L)``;
        one per fine block whose lookahead tokens exist. Grows as the request's tokens do."""
        memo = self._chains.get(id(req))
        if memo is None or memo[0] is not req:
            lora = (req.lora.name, req.lora.path) if req.lora is not None else None
            memo = (req, [self._intern(("root", req.cache_salt, lora))])
            self._chains[id(req)] = memo
        ids = memo[1]                      # ids[0] is the root; ids[i + 1] is fine block i
        toks = req.token_ids
        while (len(ids)) * self.hbs + self.la <= len(toks):
            i = len(ids) - 1
            lo = i * self.hbs + self.la if i else 0
            hi = (i + 1) * self.hbs + self.la
            items = tuple((it.identifier, it.offset) for it in req.mm_items if lo <= it.offset < hi)
            ids.append(self._intern((ids[-1], tuple(toks[lo:hi]), items)))
        return ids[1:]

    def key_of(self, req: Request, group: int, j: int) -> tuple[int, int] | None:
        """The content key of block j of ``group`` in ``req``; None while its hash cannot exist
        (the L tokens after the block are not there yet)."""
        k = hash_index(self.cfg, group, j)
        if (k + 1) * self.hbs + self.la > req.num_tokens:
            return None
        return (group, self.chain(req)[k])

    # -- events -----------------------------------------------------------------------------
    def feed(self, events: Iterable[object], writer: Request | None = None) -> None:
        pos = None
        for ev in events:
            if isinstance(ev, BlockStored):
                if pos is None:
                    assert writer is not None, "BlockStored outside an allocate/free of a known request"
                    pos = {h: k for k, h in enumerate(writer.block_hashes)}
                chain = self.chain(writer)
                for h in ev.block_hashes:
                    assert h in pos, f"group {ev.group_idx}: a stored hash is none of {writer!r}'s"
                    content = chain[pos[h]]
                    seen = self.content_of.setdefault((ev.group_idx, h), content)
                    assert seen == content, (
                        f"group {ev.group_idx}: one hash names two different contents (salt, "
                        f"LoRA, tokens or multimodal items differ), the second from {writer!r}")
                    self._store((ev.group_idx, content))
            elif isinstance(ev, BlockRemoved):
                for h in ev.block_hashes:
                    assert (ev.group_idx, h) in self.content_of, \
                        f"BlockRemoved for a hash never stored: group {ev.group_idx}"
                    self._remove((ev.group_idx, self.content_of[(ev.group_idx, h)]))
            elif isinstance(ev, AllBlocksCleared):
                self.keys.clear()
            else:
                raise AssertionError(f"unknown event {ev!r}")

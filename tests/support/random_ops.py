"""The random-operation model the property tests share: strategies and :class:`Model`.

* :func:`configs` draws a hybrid config (full, MLA, sliding, chunked and state groups, identical
  siblings, a draft group) with its retention interval, speculative decoding and mode;
  :func:`op_configs` adds the per-example :class:`Extras` (images, LoRA, ``max_model_len``).
* :data:`ATTENTION_SPECS` draws one full or sliding spec (the rules' and masks' comparisons).
* :func:`decode_ops` turns one byte string into an operation sequence (4 bytes per operation).
* :class:`Model` drives a :class:`~hybridkv.KVCacheManager` through admissions, steps,
  preemptions and finishes, keeps a shadow record of what every block was last written with,
  and checks every hit against it and against the independent oracle
  (:mod:`tests.support.oracle`) over the manager's KV events; :func:`next_prompt` draws each
  request's prompt from the ones before it.

Budgets and the ``deep`` profile: ``tests/hypothesis_budget.py``, TESTING.md.
"""

from __future__ import annotations

from typing import NamedTuple

import pytest
from hypothesis import strategies as st

from hybridkv import (MLA, ChunkedLocal, FullAttention, KVCacheConfig, KVCacheGroup,
                      KVCacheManager, LoRA, MultiModalItem, Request, SlidingWindow, SpecDecode)
from hybridkv.core.specs import StateSpec
from tests.hypothesis_budget import is_deep, note
from tests.support.helpers import FA, SWA
from tests.support.oracle import (ContentMirror, attention_kind, drop_mode, hash_block_size,
                                  oracle_hit)
from hybridkv.core.cache_options import CacheOptions
from hybridkv.core.request import RequestCacheParams

DEEP = is_deep()
MIN_OPS, MAX_OPS = (30, 150) if DEEP else (8, 40)

SPECS_PLAIN = [None, SpecDecode("eagle", 2), SpecDecode("eagle", 1, hash_lookahead=False),
               SpecDecode("dflash", 2), SpecDecode("ngram", 3)]
# deep: weighted to speculative decoding (EAGLE lookahead and drop, MTP, DFlash)
SPECS_DEEP = [None, SpecDecode("eagle", 2), SpecDecode("eagle", 1, hash_lookahead=False),
              SpecDecode("eagle3", 3, hash_lookahead=False), SpecDecode("mtp", 1),
              SpecDecode("mtp", 2, hash_lookahead=False), SpecDecode("dflash", 2),
              SpecDecode("dflash", 4), SpecDecode("draft_model", 2), SpecDecode("ngram", 3)]


ATTENTION_SPECS = st.sampled_from([FA(4), FA(16), SWA(4, 8), SWA(4, 13), SWA(16, 64), SWA(8, 200)])

# Strategies are built once (building one inside a draw costs more than the draw).
_KIND = st.sampled_from(["full", "mla", "swa", "swa", "swa", "chunked", "state"] if DEEP else
                        ["full", "swa", "swa", "chunked", "state"])
_KIND_NO_STATE = _KIND.filter(lambda k: k != "state")
# a recurrent state of 32 to 272 bytes: 1 to 9 block ids per checkpoint next to 16-byte pages
_STATE_SHAPE = st.sampled_from([(2, 2), (2, 4), (4, 4), (4, 8), (8, 8)])
_HEAD_KIND = st.sampled_from(["full", "mla"])
_N_GROUPS = st.sampled_from([1, 2, 2, 2, 3, 3, 3, 4]) if DEEP else st.integers(1, 3)
_BLOCK = st.sampled_from([2, 4, 8])
_WINDOW = st.integers(1, 24)
_CHUNK_BLOCKS = st.integers(1, 4)
_POOL = st.integers(12, 60)
_SPEC = st.sampled_from(SPECS_DEEP if DEEP else SPECS_PLAIN)
_GROUP = st.integers(0, 3)
# per example: images, LoRA, max_model_len (each in 1 of 3 examples; half under deep)
_EXTRA = st.sampled_from([False, True] if DEEP else [False, False, True])
_MAX_LEN = st.integers(4, 64)
# examples with images: mostly EAGLE/MTP lookahead hashing (an image starting at a block's end
# enters that block's hash), else the drop mode or no drafter
_SPEC_IMAGES = st.sampled_from([SpecDecode("eagle", 1), SpecDecode("mtp", 2), SpecDecode("eagle", 2),
                                SpecDecode("eagle", 1, hash_lookahead=False), None])

PLACEHOLDER = -1                                 # one token id for every image patch
IMAGES = {"cat": 3, "cow": 3, "dog": 5, "elk": 5, "owl": 2, "emu": 2}   # id -> patches
TWIN = {"cat": "cow", "cow": "cat", "dog": "elk", "elk": "dog", "owl": "emu", "emu": "owl"}
IMAGE_NAMES = sorted(IMAGES)
LORAS = [None, LoRA("a"), LoRA("b"), LoRA("a", "a-v2")]   # the last: "a" re-pointed


def _spec(draw, kind: str, bs: int):
    if kind == "full":
        return FullAttention(block_size=bs, num_kv_heads=1, head_dim=4)
    if kind == "mla":
        return MLA(block_size=bs)
    if kind == "swa":
        return SlidingWindow(block_size=bs, num_kv_heads=1, head_dim=4, window=draw(_WINDOW))
    if kind == "state":
        return StateSpec(block_size=bs, conv_shape=(1, 4), conv_dtype="float32",
                         state_shape=draw(_STATE_SHAPE), state_dtype="float32")
    return ChunkedLocal(block_size=bs, num_kv_heads=1, head_dim=4, chunk_size=bs * draw(_CHUNK_BLOCKS))


@st.composite
def configs(draw, states: bool = True, spec_choices=_SPEC):
    """A random config; ``states=False`` leaves state groups out (non-LRU eviction policies
    do not support them yet); ``spec_choices`` draws the speculative decoding."""
    n = draw(_N_GROUPS)
    kinds = [draw(_KIND if states else _KIND_NO_STATE) for _ in range(n)]
    if DEEP and n > 1 and draw(_GROUP):
        # mostly multi-group hybrids: a full (or MLA) group plus local groups
        kinds[0] = draw(_HEAD_KIND)
    specs = [_spec(draw, k, draw(_BLOCK)) for k in kinds]
    if DEEP and n > 1 and attention_kind(specs[-1]) != "full" and draw(st.booleans()):
        specs[-2] = specs[-1]                       # identical siblings: one lookup unit
    draft = draw(_GROUP)
    groups = tuple(KVCacheGroup(f"g{i}", s, (f"l{i}",),
                                is_draft=i == draft and attention_kind(s) != "state")
                   for i, s in enumerate(specs))
    pool = draw(_POOL)
    while True:                  # a pool too small for one state is refused: grow it
        try:
            cfg = KVCacheConfig(groups, num_blocks=pool)
            cfg.check_state_fits()
            break
        except ValueError as exc:
            if "state group" not in str(exc):
                raise
            pool *= 2
    has_local = any(attention_kind(s) != "full" for s in specs)
    retention = draw(st.sampled_from([None, 0] + ([cfg.alignment, 2 * cfg.alignment] if has_local else [])))
    spec = draw(spec_choices)
    compat = draw(st.booleans())
    # A pool too small for one request's lookahead slots is refused at construction (its own
    # test: tests/core/test_manager_api.py); grow such a pool until the manager accepts it.
    while True:
        try:
            KVCacheManager(cfg, CacheOptions(
                retention_interval=retention, spec_decode=spec, vllm_compat=compat))
            break
        except ValueError as exc:
            if "lookahead" not in str(exc) or cfg.num_blocks > 10_000:
                raise
            cfg = KVCacheConfig(groups, num_blocks=2 * cfg.num_blocks)
    return cfg, retention, spec, compat


class Extras(NamedTuple):
    """What an example's requests carry beyond tokens and a salt (drawn once per example)."""

    images: bool                 # multimodal items
    lora: bool                   # a LoRA adapter per request
    max_model_len: int | None    # the manager's limit; prompts drawn near and over it


NO_EXTRAS = Extras(False, False, None)


@st.composite
def op_configs(draw):
    """A config (:func:`configs`) and its :class:`Extras`. A drawn max_model_len the manager
    refuses (a pool too small for one request of that length, or lookahead slots past it) is
    moved until it is accepted: smaller for the pool, larger for the slots."""
    images = draw(_EXTRA)
    cfg_args = draw(configs(spec_choices=_SPEC_IMAGES if images else _SPEC))
    cfg, retention, spec, compat = cfg_args
    max_len = draw(_MAX_LEN) if draw(_EXTRA) else None
    for _ in range(12 if max_len else 0):
        try:
            KVCacheManager(cfg, CacheOptions(
                retention_interval=retention, spec_decode=spec, vllm_compat=compat, max_model_len=max_len))
            break
        except ValueError as exc:
            if "lookahead" in str(exc):
                max_len += 4
            elif "max_model_len" in str(exc) and max_len > 1:
                max_len = max(1, max_len * 2 // 3)
            else:
                raise
    else:
        max_len = None
    return cfg_args, Extras(images, draw(_EXTRA), max_len)


def config_kind(cfg: KVCacheConfig, spec: SpecDecode | None, compat: bool) -> list[str]:
    rules = sorted({attention_kind(g.spec) for g in cfg.groups})
    kinds = [f"config: {len(cfg.groups)} group(s), {'+'.join(rules)}"]
    if len({g.spec for g in cfg.groups}) < len(cfg.groups):
        kinds.append("config: identical siblings")
    if spec is None:
        kinds.append("spec: none")
    else:
        mode = "drop" if spec.hash_lookahead is False and spec.needs_boundary_proof else "lookahead" \
            if spec.needs_boundary_proof else "slots"
        kinds.append(f"spec: {spec.method} ({mode})")
    kinds.append("mode: vllm_compat" if compat else "mode: default")
    return kinds


def decode_ops(raw: bytes) -> list[tuple[int, int]]:
    """Operations from bytes, 4 per op: (kind 0..7, argument < 2**24). One byte string is
    one Hypothesis draw (cheap to generate for long sequences) and shrinks well. Kinds:
    0-1 admit a request, 2-4 step a running one, 5-6 finish one, 7 reset the prefix cache
    (admit instead of step/finish when nothing runs)."""
    return [(raw[i] % 8, int.from_bytes(raw[i + 1:i + 4], "little")) for i in range(0, len(raw) - 3, 4)]


class Prompt(NamedTuple):
    """An admitted prompt, for later requests to extend."""

    tokens: tuple[int, ...]
    items: tuple[MultiModalItem, ...]
    lora: LoRA | None


def _mix(x: int) -> int:
    """24 more bits from an operation's argument (for the choices the extras make)."""
    return ((x * 0x9E3779B1) & 0xFFFFFFFF) >> 8


def next_prompt(m: "Model", x: int) -> tuple[Prompt, str | None]:
    """The next request's prompt and salt from an operation's argument: a prefix of an earlier
    prompt (its images that fit kept, the last one sometimes swapped for its twin at the same
    positions; or cut right before one of its images, followed by the same image or its twin;
    its LoRA mostly kept) plus new tokens, maybe with a new image (often starting at a
    hash-block or alignment boundary, the EAGLE lookahead case), maybe cut or padded to
    within 3 tokens of max_model_len (one over it included)."""
    base = m.history[x % len(m.history)] if m.history and x % 3 else Prompt((), (), None)
    keep = (x // 7) % (len(base.tokens) + 1)
    tail = [(x >> k) % 5 for k in range(1 + x % 13)]
    salt = "s" if x % 11 == 0 else None
    ex = m.extras
    if not (ex.images or ex.lora or ex.max_model_len):
        return Prompt(base.tokens[:keep] + tuple(tail), (), None), salt
    y = _mix(x)
    items = []
    if ex.images:
        new = None                                 # (identifier, position in the new tokens)
        if base.items and (y >> 22) % 2:
            # cut right before one of the prompt's images (and the placeholder-valued text
            # tokens before it): the same image or its twin follows, maybe moved
            k = (y >> 5) % len(base.items)
            it = base.items[k]
            keep = it.offset
            start = base.items[k - 1].offset + base.items[k - 1].length if k else 0
            while keep > start and base.tokens[keep - 1] == PLACEHOLDER:
                keep -= 1
            new = (it.identifier if (y >> 2) % 2 else TWIN[it.identifier], 0)
            note("requests with the same or another image where their prompt's was")
        items = [it for it in base.items if it.offset + it.length <= keep]
        if items and y % 3 == 0:                   # another image at the same positions
            it = items[-1]
            items[-1] = MultiModalItem(TWIN[it.identifier], it.offset, it.length)
            note("requests with an image swapped at the same positions")
        if new is None and (y >> 2) % 3:           # a new image in the new tokens
            p = (y >> 7) % (len(tail) + 1)
            unit = (hash_block_size(m.cfg), m.cfg.alignment, m.cfg.alignment, 0)[(y >> 12) % 4]
            if unit:
                p += -(keep + p) % unit
                tail += [(x >> k) % 5 for k in range(p - len(tail))]
                note("requests with an image starting at a block boundary")
            new = (IMAGE_NAMES[(y >> 4) % len(IMAGE_NAMES)], p)
        if new is not None:
            # 0-2 text tokens equal to the placeholder first: the same tokens can then hold
            # the same image at another position
            name, p = new
            pad = (y >> 9) % 5 // 2
            tail[p:p] = [PLACEHOLDER] * (pad + IMAGES[name])
            items.append(MultiModalItem(name, keep + p + pad, IMAGES[name]))
    lora = None
    if ex.lora:
        lora = base.lora if base.tokens and (y >> 14) % 3 else LORAS[(y >> 16) % len(LORAS)]
    tokens = base.tokens[:keep] + tuple(tail)
    if ex.max_model_len and (y >> 18) % 3 == 0:    # near the limit: max_model_len - 3 .. + 1
        target = max(1, ex.max_model_len - 3 + (y >> 20) % 5)
        tokens = (tokens + tuple((x >> k) % 5 for k in range(target)))[:target]
        items = [it for it in items if it.offset + it.length <= target]
        note("requests within 3 tokens of max_model_len")
    return Prompt(tokens, tuple(items), lora), salt


def block_content(req: Request, lo: int, hi: int) -> tuple:
    """What the KV of tokens ``[lo, hi)`` was computed from, for the shadow record: the salt,
    the LoRA (name and path), the tokens, and for each token the image and patch it is
    (``()`` when no token is an image patch)."""
    patches = ()
    if req.mm_items:
        patches = tuple(next(((it.identifier, p - it.offset) for it in req.mm_items
                              if it.offset <= p < it.offset + it.length), None) for p in range(lo, hi))
        if not any(patches):
            patches = ()
    lora = (req.lora.name, req.lora.path) if req.lora is not None else None
    return (req.cache_salt, lora, tuple(req.token_ids[lo:hi]), patches)


class Model:
    """Drives a manager and keeps the shadow record of block contents and the event mirror."""

    def __init__(self, kv: KVCacheManager, spec: SpecDecode | None, compat: bool,
                 extras: Extras = NO_EXTRAS):
        self.kv = kv
        self.cfg = kv.config
        self.spec = spec
        self.compat = compat
        self.extras = extras
        self.mirror = ContentMirror(kv.config, spec)
        self.running: dict[str, Request] = {}
        self.written: dict[tuple[int, int], tuple] = {}   # (group, block) -> block_content
        self.prompts: list[list[int]] = []                 # admitted prompts' tokens
        self.history: list[Prompt] = []                    # ... with their images and LoRA
        self.events: list = []                             # every KV event, in order
        self.counter = 0

    def sync(self, writer: Request | None = None) -> None:
        """Feed the events to the mirror (and the log ``events``); right after each allocate
        or free of ``writer``, the request whose blocks they store."""
        events = self.kv.take_events()
        self.events += events
        self.mirror.feed(events, writer)

    def check_fresh(self, req: Request, upto: int) -> None:
        """Write-path freshness (vLLM caches at every ``allocate_slots``): an allocation that brings ``req`` to ``upto``
        computed tokens caches, in full-attention-only configs without the EAGLE drop, every
        block of the aligned prefix it completed (both modes; compat caches per group up to
        its own hashes, default mode promises a common end, so check the common part)."""
        cfg = self.cfg
        if drop_mode(self.spec) or any(attention_kind(g.spec) != "full" for g in cfg.groups):
            return
        upto = min(upto, req.num_tokens)
        hbs = hash_block_size(cfg)
        # a block's hash exists once the L tokens after it exist (L = 1: lookahead hashing)
        la = 1 if self.spec is not None and self.spec.hash_lookahead else 0
        self.kv.lookup(req)                      # side-effect free; brings the hashes up to date
        assert len(req.block_hashes) == max(0, req.num_tokens - la) // hbs
        limit = min(min(upto, len(req.block_hashes) // (g.spec.block_size // hbs) * g.spec.block_size)
                    for g in cfg.groups)
        limit = limit // cfg.alignment * cfg.alignment
        self.sync()
        for g, group in enumerate(cfg.groups):
            for j in range(limit // group.spec.block_size):
                assert self.mirror.key_of(req, g, j) in self.mirror, \
                    f"group {g} block {j} of {req.request_id} not cached after computing {upto}"
        note("write-path freshness checks")

    def record_written(self, req: Request) -> None:
        cfg = self.cfg
        tables = self.kv.block_ids(req)
        for g, table in enumerate(tables):
            bs = cfg.groups[g].spec.block_size
            for j, b in enumerate(table):
                if b and (j + 1) * bs <= req.num_computed_tokens:
                    self.written[(g, b)] = block_content(req, j * bs, (j + 1) * bs)
        # state groups: the live state (after num_computed tokens) becomes the final-length
        # checkpoint at free when it sits on a block boundary; record what it holds
        c = req.num_computed_tokens
        for sb in self.kv.state_blocks(req):
            bs = cfg.groups[sb.group].spec.block_size
            head = sb.live[0]
            if c and c % bs == 0:
                self.written[(sb.group, head)] = block_content(req, c - bs, c)
            else:
                self.written.pop((sb.group, head), None)

    def forget(self, new_blocks) -> None:
        for g, ids in enumerate(new_blocks):
            for b in ids:
                for gg in range(len(self.cfg.groups)):
                    self.written.pop((gg, b), None)

    def check_hit(self, req: Request, hit) -> None:
        cfg = self.cfg
        assert hit.num_tokens % cfg.alignment == 0 and hit.num_tokens <= req.num_tokens - 1
        for g, ids in enumerate(hit.block_ids):
            bs = cfg.groups[g].spec.block_size
            assert len(ids) * bs == hit.num_tokens
            for j, b in enumerate(ids):
                if b:
                    want = block_content(req, j * bs, (j + 1) * bs)
                    assert self.written.get((g, b)) == want, \
                        f"hit block {b} holds other tokens (or images, LoRA, salt)"
        self.sync()
        assert hit.num_tokens == oracle_hit(cfg, self.spec, self.compat, req, self.mirror,
                                            self.kv.max_model_len)
        note("lookups")
        if hit.num_tokens:
            note("lookups with a non-zero hit")
            note("hit tokens", hit.num_tokens)
            if any(it.offset < hit.num_tokens for it in req.mm_items):
                note("hits over image patches")
            if req.lora is not None:
                note("hits of LoRA requests")
        if hit.shared_prefix_boundary:
            note("lookups reporting a shared-prefix junction")

    def make_request(self, rid: str, tokens, salt, **options) -> Request:
        """The Request ``admit`` submits (subclasses add per-request options; ``options``:
        ``mm_items`` and ``lora``, given only when set)."""
        return Request(rid, tokens, RequestCacheParams(cache_salt=salt, **options))

    def admit(self, tokens, salt, chunk, items=(), lora=None) -> None:
        rid = f"r{self.counter}"
        self.counter += 1
        options = {k: v for k, v in (("mm_items", tuple(items)), ("lora", lora)) if v}
        req = self.make_request(rid, tokens, salt, **options)
        if req.mm_items:
            note("requests with images")
        if req.lora is not None:
            note(f"requests with LoRA {req.lora.name}:{req.lora.path or '-'}")
        free = self.kv.num_free_blocks
        hit = self.kv.lookup(req)
        self.check_hit(req, hit)
        limit = self.kv.max_model_len
        if limit is not None and req.num_tokens > limit:
            # Over max_model_len: its lookup is capped at max_model_len - 1 (checked above
            # against the oracle) and takes no block; allocating the whole prompt is a
            # ValueError naming the limit that changes nothing (the next operations check
            # that nothing of it stayed).
            assert self.kv.num_free_blocks == free
            with pytest.raises(ValueError, match=rf"past max_model_len={limit}$"):
                self.kv.allocate(req, req.num_tokens - hit.num_tokens, hit)
            assert self.kv.num_free_blocks == free
            note("requests over max_model_len (lookup capped, allocate refused)")
            return
        n = min(chunk, req.num_tokens - hit.num_tokens)
        new = self.kv.allocate(req, n, hit)
        self.sync(req)
        if new is None:
            note("admissions refused (pool full)")
            return
        self.forget(new)
        self.check_fresh(req, hit.num_tokens + n)
        req.num_computed_tokens = hit.num_tokens + n
        self.record_written(req)
        self.running[rid] = req
        self.prompts.append(list(tokens))
        self.history.append(Prompt(tuple(tokens), tuple(items), lora))

    def step(self, rid: str, token: int) -> None:
        req = self.running[rid]
        if req.num_computed_tokens < req.num_tokens:      # continue the prefill
            n = min(7, req.num_tokens - req.num_computed_tokens)
            note("prefill chunks")
        elif self.kv.max_model_len is not None and req.num_tokens >= self.kv.max_model_len:
            # a step past the limit is refused (the decode fast path included), changing
            # nothing; a scheduler finishes the request here
            free = self.kv.num_free_blocks
            with pytest.raises(ValueError, match=rf"past max_model_len={self.kv.max_model_len}$"):
                self.kv.allocate(req, 1)
            assert self.kv.num_free_blocks == free
            note("requests stopped at max_model_len (a step past it refused)")
            self.finish(rid)
            return
        else:                                            # decode: the new token is computed next
            req.append_tokens([token])
            n = 1
            note("decode steps")
        new = self.kv.allocate(req, n)
        self.sync(req)
        if new is None:
            note("preemptions")
            self.preempt(rid)
            return
        self.forget(new)
        self.check_fresh(req, req.num_computed_tokens + n)
        req.num_computed_tokens += n
        self.record_written(req)

    def preempt(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.kv.free(req)
        self.sync(req)

    def finish(self, rid: str) -> None:
        req = self.running.pop(rid)
        self.kv.free(req)
        self.sync(req)
        note("requests finished")

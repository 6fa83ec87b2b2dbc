"""KV events on the wire (vLLM 0.33's ZMQ/msgpack format) and a consumer-side index.

Above the core (imports only :mod:`hybridkv.core`)::

    KVCacheManager(cfg, CacheOptions(enable_events=True)) --take_events--> KVEventStream --EventBatch--> ZmqEventPublisher
         (core events)                                  (WireMapper: spec kind)       (XPUB + ROUTER replay)
                                                                                          |  ZMQ
    router <-- prefix_match -- KVEventIndex <-- apply_batch <-- decode_batch <------------+

Stream invariants (tests/events/test_stream.py checks them on the decoded ZMQ stream of real
scheduler runs): sequence numbers are contiguous from 0; in a full-attention group every
``BlockStored``'s parent was stored before and is still held; every ``BlockRemoved`` names a
block stored and not yet removed; replaying the events gives exactly the pool's cached blocks
(as a multiset: two requests may cache the same content in two blocks). Window and chunked
groups keep only the blocks some promised hit reads, so their parents may never be cached.

Recomputing a block hash from an event (what a consumer needs to match its own prompts)
---------------------------------------------------------------------------------------
Hashes on the wire are the manager's raw digests (``bytes``). Run the manager with
``hash_algo="sha256"`` for anything that crosses a process: with no ``hash_seed`` the chain's
root is then the fixed ``sha256(b"hybridkv-none-hash")`` (xxh3 mode seeds each process at
random unless ``hash_seed`` is given). With ``B`` the hash block size (the GCD of the groups'
block sizes; equal to ``block_size`` for a single-size model) and ``L`` the lookahead::

    h(parent, tokens)  = sha256(parent + tokens as little-endian int64 + lookahead as int64)
    root               = sha256(seed.encode())                   seed "hybridkv-none-hash"

A ``BlockStored`` of a group with ``block_size = k*B`` covers ``len(block_hashes)`` blocks;
block j's hash is the chain, starting at the previous block's hash (``parent_block_hash`` for
j = 0, ``root`` when it is None), over its k sub-blocks of B tokens from ``token_ids``; each
sub-block's lookahead is the L tokens after it (inside the block, or
``lookahead_token_ids[j]`` for the last). :func:`recompute_block_hashes` does exactly this.
Blocks with extra keys (LoRA, multimodal items, cache salt) also hash their tagged keys
(:func:`hybridkv.core.hashing.encode_extra_keys`); the event carries them in vLLM's untagged
form, so those blocks are recomputed only by a consumer that knows the tags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridkv.core.hashing import BlockHasher
from hybridkv.events.index import KVEventIndex

if TYPE_CHECKING:
    from hybridkv.events.wire import BlockStored

# The wire and ZMQ parts need the ``events`` extra (msgspec, pyzmq): imported on first use, so
# the index (used by the simulator's routers) works without them.
_LAZY = {
    "DEFAULT_ENDPOINT": "publisher", "END_SEQ": "publisher", "KVEventsConfig": "publisher",
    "ZmqEventPublisher": "publisher", "check_endpoint": "publisher",
    "is_bind_endpoint": "publisher", "offset_endpoint": "publisher",
    "KVEventStream": "stream", "attach_kv_events": "stream",
    "AllBlocksCleared": "wire", "BlockRemoved": "wire", "BlockStored": "wire",
    "EventBatch": "wire", "KVEventBatch": "wire", "WireMapper": "wire", "decode_batch": "wire",
    "encode_batch": "wire", "spec_kind": "wire",
}


def __getattr__(name: str):
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module 'hybridkv.events' has no attribute {name!r}")
    import importlib
    return getattr(importlib.import_module(f"hybridkv.events.{mod}"), name)


def recompute_block_hashes(event: BlockStored, hash_block_size: int | None = None,
                           algo: str = "sha256", seed: str | None = None) -> list[bytes]:
    """The hashes of a ``BlockStored`` recomputed from its tokens (see the module docstring).

    Raises ValueError for blocks with extra keys (their tagged form is not on the wire).
    """
    bs = event.block_size
    hbs = hash_block_size or bs
    if bs % hbs:
        raise ValueError(f"hash_block_size {hbs} does not divide the event's block_size {bs}")
    if event.extra_keys and any(k for k in event.extra_keys):
        raise ValueError("blocks with extra keys need their tagged keys to be rehashed")
    lookahead = event.lookahead_token_ids
    la = len(lookahead[0]) if lookahead else 0
    hasher = BlockHasher(hbs, algo, seed, lookahead=la)
    toks = list(event.token_ids)
    parent = event.parent_block_hash
    out = []
    for j in range(len(event.block_hashes)):
        block = toks[j * bs:(j + 1) * bs]
        ahead = block + (list(lookahead[j]) if lookahead else [])
        for k in range(bs // hbs):
            parent = hasher.hash_block(parent, block[k * hbs:(k + 1) * hbs],
                                       ahead[(k + 1) * hbs:(k + 1) * hbs + la])
        out.append(parent)
    return out


__all__ = [
    "attach_kv_events", "AllBlocksCleared", "BlockRemoved", "BlockStored", "DEFAULT_ENDPOINT", "END_SEQ", "EventBatch",
    "KVEventBatch", "KVEventIndex", "KVEventStream", "KVEventsConfig", "WireMapper",
    "ZmqEventPublisher", "check_endpoint", "decode_batch", "encode_batch", "is_bind_endpoint",
    "offset_endpoint", "recompute_block_hashes", "spec_kind",
]

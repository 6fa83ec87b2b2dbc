"""Store faults under the reference engine: every case must serve exactly what a cold run serves.

A *cold run* is a fresh ``LLM`` without any store on the same model and prompt (greedy, so the
tokens are a deterministic function of the prompt). Each test breaks the tier at a precise point
of the engine's step (between the scheduler's lookup and the worker's load, or on save) and
checks three things: no exception reaches the caller, the outputs equal the cold run, and the
counters say what happened (so a fault that silently did not happen fails the test).

Faults of the store itself (a dead master) use a private Mooncake cluster in the package's
loopback-only network namespace (``conftest.loopback``); the rest use the in-process
``LocalCPUStore``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from hybridkv.connectors.stores.local import LocalCPUStore
from hybridkv.connectors.transfer import TRAILER_BYTES
from hybridkv.engine.checkpoints import random_model
from hybridkv.engine.llm import LLM
from hybridkv.engine.llm_options import RequestParams
from tests.engine.helpers import build_llm
from hybridkv.testing.mooncake_cluster import MasterOptions

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens

BS = 8
MAX_TOKENS = 8
TINY = dict(model_type="qwen2", vocab_size=256, hidden_size=64, intermediate_size=128,
            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            max_position_embeddings=1024, rms_norm_eps=1e-6, tie_word_embeddings=False,
            use_sliding_window=True, sliding_window=24,
            layer_types=["full_attention", "sliding_attention", "sliding_attention",
                         "full_attention"])


def prompt(n: int, seed: int) -> list[int]:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


P1, P2, P3, P4 = prompt(150, 1), prompt(120, 2), prompt(100, 3), prompt(130, 4)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    torch.set_num_threads(1)
    yield random_model(tmp_path_factory.mktemp("tiny-hybrid"), TINY, seed=7)


def engine(model: Path, store=None, **kw) -> LLM:
    return build_llm(model, device="cpu", block_size=BS, num_blocks=160, kv_store=store, **kw)


_COLD: dict[tuple[int, ...], list[int]] = {}


def cold(model: Path, p: list[int]) -> list[int]:
    """Tokens of a fresh engine without a store (memoized per prompt; one model per module)."""
    key = tuple(p)
    if key not in _COLD:
        (out,) = engine(model).generate([p], max_tokens=MAX_TOKENS, params=NO_EOS)
        _COLD[key] = out.token_ids
    return _COLD[key]


def serve(llm: LLM, *prompts: list[int]):
    return llm.generate(list(prompts), max_tokens=MAX_TOKENS, params=NO_EOS)


def before_loads(llm: LLM, fault: Callable[[list], None]) -> list[int]:
    """Run ``fault(loads)`` on every non-empty step's loads, after the scheduler's lookup and
    before the worker loads; returns a list that counts the calls."""
    calls: list[int] = []
    real = llm.connector.run_loads

    def wrapped(loads):
        if loads:
            calls.append(len(loads))
            fault(loads)
        return real(loads)

    llm.connector.run_loads = wrapped
    return calls


def key_of(llm: LLM, group: int, block_hash: bytes) -> bytes:
    return llm.connector.transfer.key(llm.connector.group_names[group], block_hash)


# ---------------------------------------------------------------------------------------------
def test_baseline_the_store_is_used_and_outputs_match(model: Path) -> None:
    """The fault tests' premise: without a fault, B loads what A saved and matches cold."""
    store = LocalCPUStore(64 << 20)
    a, b = engine(model, store), engine(model, store)
    assert serve(a, P1)[0].token_ids == cold(model, P1)
    assert a.connector.transfer.stats.saved > 0
    (out,) = serve(b, P1)
    assert out.num_external_tokens >= len(P1) - 2 * BS
    assert out.token_ids == cold(model, P1)
    assert b.connector.stats.loads_ok == 1 and b.connector.transfer.stats.corrupt == 0


# ---------------------------------------------------------------------------- evicted block
@pytest.mark.parametrize("which", ["first", "last"])
def test_block_evicted_between_lookup_and_load_is_recomputed(model: Path, which: str) -> None:
    store = LocalCPUStore(64 << 20)
    a, b = engine(model, store), engine(model, store)
    serve(a, P1)
    removed: list[int] = []

    def evict(loads):
        g, _, h = loads[0].blocks[0 if which == "first" else -1]
        removed.append(store.remove([key_of(b, g, h)]))

    calls = before_loads(b, evict)
    (out,) = serve(b, P1 + [11, 12, 13])
    assert calls == [1] and removed == [1]            # the fault happened once, on a real key
    assert b.connector.stats.matched_tokens > 0       # the lookup had found the blocks
    assert b.connector.stats.loads_failed == 1 and b.connector.stats.loads_ok == 0
    assert b.connector.transfer.stats.load_misses >= 1
    assert out.num_external_tokens == 0
    assert out.token_ids == cold(model, P1 + [11, 12, 13])
    # the engine recomputed and saved the blocks again: the next engine loads them
    (again,) = serve(engine(model, store), P1 + [11, 12, 13])
    assert again.num_external_tokens > 0 and again.token_ids == out.token_ids


def test_evicted_block_recompute_starts_at_the_local_hit(model: Path) -> None:
    """B already holds a prefix locally; the tier would extend it; the load fails -> B
    recomputes from its own hit, which it keeps."""
    store = LocalCPUStore(64 << 20)
    a, b = engine(model, store), engine(model, store, save=False)
    serve(a, P1)
    # B computes P1's first 64 tokens itself (the store cannot serve that prefix: A kept its
    # sliding-window blocks only where A's own requests may be replayed)
    serve(b, P1[:64] + [1, 2, 3])
    assert b.connector.stats.loads_ok == b.connector.stats.loads_failed == 0

    def evict(loads):
        g, _, h = loads[0].blocks[-1]
        store.remove([key_of(b, g, h)])

    calls = before_loads(b, evict)
    computed = b.stats.computed_tokens
    (out,) = serve(b, P1)
    assert calls == [1]
    local = out.num_cached_tokens
    assert local > 0 and b.connector.stats.matched_tokens > 0     # local hit + tier extension
    assert b.connector.stats.loads_failed == 1 and out.num_external_tokens == 0
    # recomputed from the local hit on: the prompt past it, then one token per decode step
    assert b.stats.computed_tokens - computed == len(P1) - local + MAX_TOKENS - 1
    assert out.token_ids == cold(model, P1)


# ------------------------------------------------------------------------------- full store
def test_store_too_small_for_any_block_drops_saves_and_counts_them(model: Path) -> None:
    store = LocalCPUStore(1024)                       # smaller than one payload
    a, b = engine(model, store), engine(model, store)
    (oa,) = serve(a, P1)
    st = a.connector.transfer.stats
    assert st.saved == 0 and st.save_dropped > 0
    assert store.stats.drops == st.save_dropped and len(store) == 0
    (ob,) = serve(b, P1)
    assert ob.num_external_tokens == 0 and b.connector.stats.loads_ok == 0
    assert oa.token_ids == ob.token_ids == cold(model, P1)
    assert b.connector.transfer.stats.save_dropped > 0


def test_full_store_evicting_under_load_serves_exact_outputs(model: Path) -> None:
    """A store that holds a handful of blocks: every save evicts older ones, lookups see a
    ragged subset, and whatever loads must still be exact."""
    probe = engine(model, LocalCPUStore(64 << 20))
    payload = probe.connector.transfer.payload_bytes(probe.connector.group_names[0])
    store = LocalCPUStore(6 * payload)
    a, b = engine(model, store), engine(model, store)
    outs_a = serve(a, P1, P2, P3)
    assert store.stats.evictions > 0 and store.used_bytes <= 6 * payload
    outs_b = serve(b, P3, P2, P1, P3[:90] + [5, 6])
    for out, p in zip(outs_a + outs_b, [P1, P2, P3, P3, P2, P1, P3[:90] + [5, 6]]):
        assert out.token_ids == cold(model, p)


# -------------------------------------------------------------------------- corrupt payload
def _truncate(data: bytes) -> bytes:
    return data[:-TRAILER_BYTES]                      # the block's bytes without its trailer


def _flip(data: bytes) -> bytes:
    mutable = bytearray(data)
    mutable[len(data) // 3] ^= 0x40
    return bytes(mutable)


@pytest.mark.parametrize("mode", ["direct", "staged"])
@pytest.mark.parametrize("damage", ["truncated", "flipped", "other_block"])
def test_corrupt_payload_is_rejected_and_recomputed(model: Path, damage: str, mode: str) -> None:
    store = LocalCPUStore(64 << 20)
    a, b = engine(model, store), engine(model, store)
    for llm in (a, b):  # the staged path (what Mooncake uses) over the same in-process store
        llm.connector.transfer.mode = mode
    serve(a, P1)
    damaged: list[bytes] = []

    def corrupt(loads):
        blocks = loads[0].blocks
        g, _, h = blocks[-1]
        key = key_of(b, g, h)
        data = store._entries.peek(key)[0]
        if damage == "truncated":
            new = _truncate(data)
        elif damage == "flipped":
            new = _flip(data)
        else:  # a valid payload, but another block's: its checksum is seeded with its own key
            og, _, oh = next(x for x in blocks if x[0] == g and x[2] != h)
            new = store._entries.peek(key_of(b, og, oh))[0]
        assert new != data
        store._entries.put(key, new, len(new))
        damaged.append(key)

    before_loads(b, corrupt)
    (out,) = serve(b, P1 + [9])
    assert len(damaged) == 1
    st = b.connector.transfer.stats
    assert st.corrupt == 1 and st.load_failed >= 1
    if damage == "truncated" and mode == "staged":
        assert store.stats.size_mismatches == 1       # the store refused the wrong size
    assert b.connector.stats.loads_failed == 1 and out.num_external_tokens == 0
    assert out.token_ids == cold(model, P1 + [9])


# ------------------------------------------------------------------------- Mooncake master
def test_mooncake_master_killed_mid_run_then_restarted(loopback: None, model: Path) -> None:
    from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig
    from hybridkv.testing import MooncakeCluster

    with MooncakeCluster([32 << 20], MasterOptions(client_ttl_s=2)) as cluster:
        cfg = MooncakeStoreConfig(master_address=cluster.master_address, key_prefix="faults/",
                                  retry_backoff_s=0.2, max_backoff_s=1.0)
        sa, sb = MooncakeStore(cfg), MooncakeStore(cfg)
        try:
            a, b = engine(model, sa), engine(model, sb)
            assert serve(a, P1)[0].token_ids == cold(model, P1)
            assert a.connector.transfer.stats.saved > 0

            # B admits P1 (in the store) and P2 (new); the master dies after B's lookup found
            # P1's blocks and before B loads them.
            def kill(loads):
                if cluster.master_running:
                    cluster.kill_master()

            calls = before_loads(b, kill)
            out1, out2 = serve(b, P1, P2)
            assert calls and not cluster.master_running
            assert b.connector.stats.matched_tokens > 0
            assert b.connector.stats.loads_failed == 1 and out1.num_external_tokens == 0
            assert out1.token_ids == cold(model, P1) and out2.token_ids == cold(model, P2)
            assert b.connector.transfer.stats.save_dropped > 0   # its saves hit a dead master
            assert not sb.healthy

            # A keeps serving while the master is down: lookups miss, saves are dropped
            dropped = a.connector.transfer.stats.save_dropped
            (out3,) = serve(a, P3)
            assert out3.token_ids == cold(model, P3) and out3.num_external_tokens == 0
            assert a.connector.transfer.stats.save_dropped > dropped

            # the master comes back (with an empty index); the same clients reconnect
            cluster.restart_master()
            assert sa.wait_healthy(15.0) and sb.wait_healthy(15.0)
            (out4,) = serve(engine(model, sa), P4)
            (out4b,) = serve(engine(model, sb), P4)
            assert out4b.num_external_tokens > 0
            assert out4.token_ids == out4b.token_ids == cold(model, P4)
            assert sa.clients_created == 1 and sb.clients_created == 1
        finally:
            sa.close()
            sb.close()

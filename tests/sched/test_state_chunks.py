"""The scheduler with state groups: prefill chunks end at checkpoint (export) positions.

Property (docs/state-groups.md §3): for any workload (shared prefixes, chunked
prefill on/off, prefill caps, budgets, speculative drafts, preemption), every checkpoint a
step asks the engine to write lies exactly at the end of that step's known tokens (so the
live state is there when the step ends), and a chunk that ends before the request's known
tokens without ending at a checkpoint was cut by the usual rules only (prefill cap, token
budget, max_model_len) — chunk sizes are otherwise unchanged.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv import KVCacheManager, SpecDecode
from hybridkv.core.specs import KVCacheConfig, KVCacheGroup, StateSpec
from hybridkv.sched import AcceptanceModel, Scheduler, SchedulerConfig
from tests.support.helpers import FA
from tests.sched.test_scheduler import _drive, _engine_request
from hybridkv.core.cache_options import CacheOptions


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_export_is_a_chunk_end(data) -> None:
    bs = data.draw(st.sampled_from([2, 4]), label="attention block")
    a = data.draw(st.sampled_from([bs, 2 * bs]), label="checkpoint granularity")
    retention = data.draw(st.sampled_from([None, 0, 2 * a]), label="retention")
    k = data.draw(st.sampled_from([0, 2]), label="drafts")
    cfg = KVCacheConfig((KVCacheGroup("full", FA(bs), ("f",)),
                         KVCacheGroup("state", StateSpec(a, conv_shape=(1, 4), state_shape=(2, 4)), ("s",))),
                        num_blocks=data.draw(st.integers(40, 120), label="blocks"))
    kv = KVCacheManager(cfg, CacheOptions(
        retention_interval=retention, max_model_len=64, spec_decode=SpecDecode("ngram", k) if k else None))
    chunked = data.draw(st.booleans(), label="chunked")
    budget = data.draw(st.integers(4, 40), label="budget")
    sched_cfg = SchedulerConfig(
        max_num_batched_tokens=budget if chunked else 64,  # unchunked prompts must fit a step
        max_num_seqs=data.draw(st.integers(1, 5), label="seqs"),
        enable_chunked_prefill=chunked,
        long_prefill_token_threshold=data.draw(st.sampled_from([0, 0, 5]), label="cap"),
        max_model_len=64)
    sched = Scheduler(kv, sched_cfg)
    shared = [data.draw(st.integers(0, 3)) for _ in range(data.draw(st.integers(0, 24)))]
    arrivals: dict = {}
    for i in range(data.draw(st.integers(1, 8), label="requests")):
        prefix = shared[:data.draw(st.integers(0, len(shared)))]
        tail = [100 + i * 50 + j for j in range(data.draw(st.integers(1, 16)))]
        arrivals.setdefault(data.draw(st.integers(0, 6)), []).append(
            _engine_request(f"r{i}", prefix + tail, data.draw(st.integers(1, 10))))
    def check(s: Scheduler, out) -> None:
        kv.check_integrity()
        cap = sched_cfg.long_prefill_token_threshold
        for x in out.scheduled:
            known_end = x.start + x.num_new_tokens - x.num_draft_tokens
            exports = [e.position for sb in x.state_blocks for e in sb.exports]
            assert len(x.state_blocks) == 1
            assert all(p == known_end for p in exports), (x, exports)
            if known_end < x.req.request.num_tokens and not exports:  # cut by the usual rules
                assert (cap and x.num_new_tokens == cap) or known_end == 64 or \
                    out.num_scheduled_tokens == sched_cfg.max_num_batched_tokens, x

    _drive(sched, AcceptanceModel(k, rate=0.5, seed=1) if k else None, arrivals, check=check)
    kv.check_integrity()
    assert kv.num_free_blocks == cfg.num_blocks - 1 or kv.enable_caching


def test_export_cuts_happen() -> None:
    """The property above is not vacuous: a 40-token prompt with a checkpoint every 8 tokens
    and a 64-token budget is computed in chunks ending at 8, 16, 24, 32 (then the rest)."""
    cfg = KVCacheConfig((KVCacheGroup("full", FA(4), ("f",)),
                         KVCacheGroup("state", StateSpec(8, conv_shape=(1, 4), state_shape=(2, 4)), ("s",))),
                        num_blocks=80)
    kv = KVCacheManager(cfg, CacheOptions(retention_interval=None, max_model_len=64))
    sched = Scheduler(kv, SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=2, max_model_len=64))
    ends = []
    _drive(sched, None, {0: [_engine_request("a", list(range(40)), 2)]},
           check=lambda s, out: ends.extend(x.start + x.num_new_tokens for x in out.scheduled))
    assert ends[:5] == [8, 16, 24, 32, 40]


def test_an_export_on_the_last_known_token_keeps_the_drafts() -> None:
    """A checkpoint every 4 tokens and 2 drafts per step: the step whose known part ends at
    token 8 exports there and still verifies both drafts (a cut is only for an export strictly
    inside the known tokens)."""
    cfg = KVCacheConfig((KVCacheGroup("full", FA(4), ("f",)),
                         KVCacheGroup("state", StateSpec(4, conv_shape=(1, 4), state_shape=(2, 4)), ("s",))),
                        num_blocks=40)
    kv = KVCacheManager(cfg, CacheOptions(retention_interval=None, spec_decode=SpecDecode("ngram", 2)))
    sched = Scheduler(kv)
    a = _engine_request("a", list(range(6)), 10)
    sched.add_request(a)
    seen = []
    for _ in range(4):
        out = sched.schedule()
        seen += [(x.start, x.num_new_tokens, x.num_draft_tokens,
                  [e.position for sb in x.state_blocks for e in sb.exports]) for x in out.scheduled]
        sched.update(out, [[7] if s else None for s in out.samples])   # every draft rejected
        a.spec_token_ids = [1, 2] if out.samples[0] else []
    assert seen == [(0, 4, 0, [4]), (4, 2, 0, []), (6, 3, 2, []), (7, 3, 2, [8])]
    kv.check_integrity()

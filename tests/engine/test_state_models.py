"""State models (Qwen3-Next gated delta net, Nemotron-H Mamba2) on the reference engine.

Oracles: transformers' full forward in float64 and transformers' ``generate`` (greedy tokens,
its own cached decode path with its recurrent kernels, float64). Logits must be within TOL of
float64 transformers or, at rows where transformers' own fp32 forward is further off than that
(a Qwen3-Next row of an 85-token sequence: transformers fp32 1.95e-3 from float64, the engine
1.56e-3), within twice transformers' own fp32 error (:func:`oracle_excess`). Prefix caching is
on: recurrent states and checkpoints live in the pool (engine/state_pages.py); batched and
sequential shared-prefix prompts hit checkpoints and still equal transformers. KV stores and
DFlash are refused; the state store's refusal to resume from a state it does not hold is tested
as behaviour. n-gram and draft-model speculative decoding work with prefix caching: only
accepted tokens reach the state and its checkpoints (property-tested and oracle-tested).
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridkv.core.manager import KVCacheManager
from hybridkv.core.specs import KVCacheConfig, is_state
from hybridkv.engine import PagedKVCache, SequenceInput
from hybridkv.engine import parse_model_config
from hybridkv.cli import main
from hybridkv.engine.models import StateMissingError
from hybridkv.engine.runner import EngineCore
from hybridkv.sched import Scheduler
from tests.engine.helpers import (
    SMALL_DRAFT,
    STATE_ARCHS,
    TOL,
    Built,
    TableOwner,
    blocks_for,
    build,
    build_llm,
    max_diff,
    new_cache,
    random_tokens,
)
from hybridkv.core.cache_options import CacheOptions
from hybridkv.engine.llm_options import RequestParams

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens


@dataclasses.dataclass
class StateBuilt(Built):
    """A :class:`Built` with a float64 copy of the transformers model (eager MoE experts: there
    is no fp64 grouped matmul)."""

    hf64: object = None

    def oracle64(self, tokens: Sequence[int]) -> torch.Tensor:
        key = ("fp64", tuple(int(t) for t in tokens))
        if key not in self._oracle:
            with torch.no_grad():
                self._oracle[key] = self.hf64(torch.tensor([list(key[1])])).logits[0]
        return self._oracle[key]


def _with_float64(built: Built) -> StateBuilt:
    hf64 = copy.deepcopy(built.hf).double()
    if hasattr(hf64, "set_experts_implementation"):  # transformers 5; 4.x experts are eager loops
        hf64.set_experts_implementation("eager")
    return StateBuilt(built.arch, built.hf, built.model, built.path, hf64=hf64)


def _oracle_missing(name: str) -> str | None:
    """Why the installed transformers cannot be this state model's oracle (None: it can)."""
    import transformers

    cls = STATE_ARCHS[name].config_cls
    if hasattr(transformers, cls):
        return None
    return f"transformers {transformers.__version__} has no {cls} (no oracle for {name})"


@pytest.fixture(scope="module")
def state_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, StateBuilt]:
    return {name: _with_float64(build(arch, tmp_path_factory.mktemp(name)))
            for name, arch in STATE_ARCHS.items() if _oracle_missing(name) is None}


@pytest.fixture(params=list(STATE_ARCHS))
def sbuilt(request: pytest.FixtureRequest, state_models: dict[str, StateBuilt]) -> StateBuilt:
    reason = _oracle_missing(request.param)
    if reason is not None:
        pytest.skip(reason)
    return state_models[request.param]


def oracle_excess(built: StateBuilt, outputs: Sequence, refs: Sequence | None = None) -> float:
    """Largest ``|engine - fp64| - (TOL + 2 max |fp32 reference - fp64|)`` over every computed
    row (recomputed ones included), the max taken over the sequence's rows: <= 0 means every row
    is within TOL of the exact model, or as close as an fp32 forward of the same sequence gets
    (times 2). The fp32 references are transformers' forward and, where ``refs`` gives one per
    output, another engine's run of the same sequence (itself transformers-checked). Per
    sequence, not per row: fp32 rounding depends on where chunks and checkpoints split the
    recurrence, so a row that one forward happens to round almost exactly says nothing about
    the noise of another, equally valid order (rows of two chunkings differ by up to 3.8e-4
    measured, more than TOL); a wrong state or token is off by orders more."""
    worst = -1.0
    for i, out in enumerate(outputs):
        full = list(out.prompt_token_ids) + list(out.token_ids)
        exact, hf32 = built.oracle64(full), built.oracle(full).double()
        positions, rows = out.logits
        assert positions, f"{out.request_id}: no logits recorded"
        err = (rows.double() - exact[positions]).abs().amax(-1)
        noise = float((hf32 - exact).abs().amax())
        if refs is not None:
            ref_positions, ref_rows = refs[i].logits
            assert list(refs[i].token_ids) == list(out.token_ids), "references of other tokens"
            noise = max(noise, float((ref_rows.double() - exact[ref_positions]).abs().amax()))
        worst = max(worst, float((err - (TOL + 2 * noise)).max()))
    return worst


def hf_greedy(built: StateBuilt, prompt: Sequence[int], n: int) -> list[int]:
    """Greedy continuation by transformers' full forward in float64 (argmax, append, repeat),
    memoized. Not ``generate``: for Nemotron-H transformers' cached decode path disagrees with
    its own full forward (a 75-token prompt: generate picks token 21 where the forward's argmax,
    margin 0.09, is 34), so the uncached forward is the oracle; :func:`test_generate_oracle`
    checks ``generate`` where it is consistent (Qwen3-Next)."""
    key = ("greedy", tuple(prompt), n)
    if key not in built._oracle:
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(built.oracle64(seq)[-1].argmax()))
        built._oracle[key] = seq[len(prompt):]
    return built._oracle[key]


def test_generate_oracle(state_models: dict[str, StateBuilt]) -> None:
    """Qwen3-Next: the engine's tokens equal transformers' ``generate`` (its cached recurrent
    decode kernels), alone and for the shared-prefix prompts."""
    built = state_models["qwen3_next"]
    llm = make_llm(built, block_size=4)
    prefix = random_tokens(70, 7)
    prompts = [random_tokens(37, 1)] + [prefix + random_tokens(n, 8 + n) for n in (5, 9, 13)]
    outs = llm.generate(prompts, max_tokens=6, params=NO_EOS)
    for p, o in zip(prompts, outs):
        with torch.no_grad():
            want = built.hf.generate(torch.tensor([p]), max_new_tokens=6, min_new_tokens=6, do_sample=False)
        assert o.token_ids == want[0, len(p):].tolist()


def make_llm(built: Built, **kw):
    kw.setdefault("num_blocks", 160)
    kw.setdefault("max_num_batched_tokens", 256)
    kw.setdefault("block_size", built.arch.block_sizes)
    return build_llm(built.path, device="cpu", record_logits=True, **kw)


def test_alone_equals_transformers(sbuilt: Built) -> None:
    llm = make_llm(sbuilt)
    prompt = random_tokens(37, 1)
    (out,) = llm.generate([prompt], max_tokens=8, params=NO_EOS)
    assert oracle_excess(sbuilt, [out]) <= 0
    assert out.token_ids == hf_greedy(sbuilt, prompt, 8)
    assert len(llm.model.states) == 0  # released at finish


def _check_hits(llm, outs) -> None:
    """The cached-token count each request reports is the hit the manager promised at
    admission, and the engine really skipped those tokens: the first computed position is the
    hit (recorded logits), so the state it continued from came from a checkpoint."""
    for o in outs:
        positions, _ = o.logits
        assert min(positions) == o.num_cached_tokens, (o.request_id, min(positions), o.num_cached_tokens)


@pytest.mark.parametrize("block_size", [4, 8, 16])
@pytest.mark.parametrize("retention", [0, None])
def test_batched_shared_prefix_hits(sbuilt: Built, block_size: int, retention: int | None) -> None:
    """Three prompts sharing a 70-token prefix, batched (admitted in one step: later ones hit
    checkpoints that earlier ones export in that very step), then the same three again (hits
    on stored checkpoints): every token equals transformers, the later requests hit, and each
    hit is a multiple of the checkpoint granularity the engine really skipped."""
    llm = make_llm(sbuilt, block_size=block_size, retention_interval=retention)
    assert llm.kv.enable_caching and llm.kv_config.has_state
    prefix = random_tokens(70, 7)
    prompts = [prefix + random_tokens(n, 8 + n) for n in (5, 9, 13)]
    first = llm.generate(prompts, max_tokens=6, params=NO_EOS)
    again = llm.generate(prompts, max_tokens=6, params=NO_EOS)
    for outs in (first, again):
        assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 6) for p in prompts]
        _check_hits(llm, outs)
        assert all(o.num_cached_tokens % block_size == 0 for o in outs)
    assert first[0].num_cached_tokens == 0 and first[2].num_cached_tokens > 0
    assert all(o.num_cached_tokens >= 70 // block_size * block_size for o in again)
    assert oracle_excess(sbuilt, first + again) <= 0
    llm.kv.check_integrity()


@pytest.mark.parametrize("block_size", [4, 16])
def test_sequential_hits_inside_and_across_checkpoints(sbuilt: Built, block_size: int) -> None:
    """One request at a time, so the expected hits follow from the checkpoint rule alone:
    retention N = None (a checkpoint every block): the 2nd prompt hits the last checkpoint
    inside the shared 70 tokens, across many earlier ones; N = 0: the 2nd prompt hits nothing
    (no checkpoint inside the prefix yet) but leaves one at the junction, which the 3rd hits;
    a multi-turn follow-up (prompt + answer + more) hits at least the replay boundary."""
    prefix = random_tokens(70, 17)  # unique suffixes long enough that the replay-boundary
    prompts = [prefix + random_tokens(n, 18 + n) for n in (40, 44, 48)]  # checkpoints lie past 70
    junction = 70 // block_size * block_size
    for retention, want in ((None, [0, junction, junction]), (0, [0, 0, junction])):
        llm = make_llm(sbuilt, block_size=block_size, retention_interval=retention)
        outs = [llm.generate([p], max_tokens=6, params=NO_EOS)[0] for p in prompts]
        assert [o.num_cached_tokens for o in outs] == want
        assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 6) for p in prompts]
        _check_hits(llm, outs)
        turn2 = prompts[0] + outs[0].token_ids + random_tokens(4, 40)
        (follow,) = llm.generate([turn2], max_tokens=4, params=NO_EOS)
        assert follow.num_cached_tokens >= (len(prompts[0]) - 1) // block_size * block_size
        assert follow.token_ids == hf_greedy(sbuilt, turn2, 4)
        _check_hits(llm, [follow])
        assert oracle_excess(sbuilt, outs + [follow]) <= 0
        llm.kv.check_integrity()


def test_chunked_prefill(sbuilt: Built) -> None:
    """A 7-token budget and 5-token prefill cap: chunks end inside blocks and mid-prompt, so the
    recurrent states are handed over at many boundaries; decodes share steps with chunks."""
    llm = make_llm(sbuilt, max_num_batched_tokens=7, long_prefill_token_threshold=5)
    prompts = [random_tokens(n, 5 + n) for n in (31, 17, 23)]
    outs = llm.generate(prompts, max_tokens=6, params=NO_EOS)
    assert llm.stats.steps >= (31 + 17 + 23) // 7
    assert oracle_excess(sbuilt, outs) <= 0
    assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 6) for p in prompts]


@pytest.mark.parametrize("retention", [0, None])
def test_preemption_resumes_from_checkpoints(sbuilt: Built, retention: int | None) -> None:
    """A pool too small for its requests (one request's worth of blocks + 1): preempted
    requests lose their live state and resume from their best checkpoint hit (or 0); every
    recomputed logit and every token still match transformers, and nothing leaks."""
    pool = blocks_for(make_llm(sbuilt, retention_interval=retention), 48) + 1
    llm = make_llm(sbuilt, num_blocks=pool, max_model_len=48, long_prefill_token_threshold=4,
                   retention_interval=retention)
    shared = random_tokens(12, 29)
    prompts = [shared + random_tokens(8, 30 + i) for i in range(5)]
    outs = llm.generate(prompts, max_tokens=20, params=NO_EOS)
    assert llm.stats.preemptions > 0 and any(o.num_preemptions for o in outs)
    resumed = []
    for o in outs:
        positions, _ = o.logits
        restarts = [p for i, p in enumerate(positions) if i and p <= positions[i - 1]]
        assert len(restarts) == o.num_preemptions  # each preemption recomputes from a hit
        assert all(p % 8 == 0 for p in restarts)
        resumed += restarts
    if retention == 0 and sbuilt.arch.name == "qwen3_next":  # resumes at the checkpoint after 8
        assert any(p > 0 for p in resumed), resumed            # (nemotron_h's 11-block pool: none)
    assert oracle_excess(sbuilt, outs) <= 0
    assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 20) for p in prompts]
    assert len(llm.model.states) == 0
    llm.kv.check_integrity()
    assert llm.kv.num_free_blocks == pool - 1


def test_abort_releases_state(sbuilt: Built) -> None:
    """An aborted request's recurrent state is dropped with its blocks; the others finish
    exactly."""
    llm = make_llm(sbuilt, max_num_batched_tokens=8)
    prompts = [random_tokens(20, 70), random_tokens(15, 71)]
    reqs = llm.submit(prompts, max_tokens=4, params=NO_EOS)
    for _ in range(3):
        llm.engine.step()
    victim = reqs[0].request_id
    (sb,) = llm.kv.state_blocks(reqs[0].request)     # its live state is an extent of the pool
    free = llm.kv.num_free_blocks
    llm.engine.abort_request(victim)
    assert llm.kv.num_free_blocks >= free + len(sb.live)
    with pytest.raises(KeyError):
        llm.kv.state_blocks(reqs[0].request)
    llm.engine.run()
    out = llm.collect(reqs)[1]
    assert out.token_ids == hf_greedy(sbuilt, prompts[1], 4)
    assert len(llm.model.states) == 0
    llm.kv.check_integrity()


# --------------------------------------------------------------------------- the state store
def _step(model, cache, owner: TableOwner, n: int, key: object):
    seq = owner.step(n)
    seq = SequenceInput(seq.token_ids, seq.start, seq.block_tables, state_key=key)
    (logits,) = model([seq], cache, logits="all")
    owner.done(n)
    return logits


def test_chunk_boundaries_are_exact(sbuilt: Built) -> None:
    """One pass vs. uneven chunks (1, 3, 7, 2, ...): the same logits and the same states, up to
    fp32 rounding of matmuls of other shapes (TOL)."""
    model = sbuilt.model
    cache, alloc = new_cache(sbuilt)
    tokens = random_tokens(29, 50)
    one = TableOwner(alloc, tokens=tokens)
    whole = _step(model, cache, one, 29, "one")
    split = TableOwner(alloc, tokens=tokens)
    rows = [_step(model, cache, split, n, "split") for n in (1, 3, 7, 2, 9, 6, 1)]
    assert max_diff(torch.cat(rows), whole) <= TOL
    assert max_diff(whole, sbuilt.oracle(tokens)) <= TOL
    a, b = model.states._states["one"], model.states._states["split"]
    assert a.position == b.position == 29 and a.ssm.keys() == b.ssm.keys() and a.ssm
    for layer in a.ssm:
        assert max_diff(a.ssm[layer], b.ssm[layer]) <= TOL
        assert max_diff(a.conv[layer], b.conv[layer]) <= TOL
    model.states.clear()


def test_missing_state_fails_loudly(sbuilt: Built) -> None:
    """A sequence resuming where the store holds no state (a faked prefix hit, a skipped chunk,
    an unkeyed continuation) raises instead of computing from a wrong state; a failed step
    leaves the stored state untouched."""
    model = sbuilt.model
    cache, alloc = new_cache(sbuilt)
    tokens = random_tokens(24, 60)
    a = TableOwner(alloc, tokens=tokens)
    _step(model, cache, a, 16, "a")
    hit = TableOwner(alloc, tokens=tokens)
    hit.share_prefix(a, 16)  # KV pages shared, recurrent state not
    with pytest.raises(StateMissingError, match="position 16"):
        _step(model, cache, hit, 8, "hit")
    with pytest.raises(StateMissingError):
        _step(model, cache, hit, 8, None)
    skipped = TableOwner(alloc, tokens=tokens, computed=18, tables=[list(t) for t in a.tables])
    with pytest.raises(StateMissingError, match="a state at position 16"):
        _step(model, cache, skipped, 2, "a")
    bad = SequenceInput(tokens[16:20], 16, [[0] * 3], state_key="a")  # null blocks: metadata refuses
    with pytest.raises(ValueError):
        model([bad], cache)
    assert model.states.position("a") == 16
    logits = _step(model, cache, a, 8, "a")
    assert max_diff(logits, sbuilt.oracle(tokens)[16:]) <= TOL
    model.states.clear()


# --------------------------------------------------------------------------- speculative decoding
@pytest.fixture(scope="module")
def small_drafter(tmp_path_factory: pytest.TempPathFactory):
    return build(SMALL_DRAFT, tmp_path_factory.mktemp("small_draft"), seed=5).path


def test_spec_decode_accepts_and_rejects(sbuilt: Built) -> None:
    """The n-gram drafter's lookup is replaced by an oracle that proposes the true greedy
    continuation with one wrong token every few steps, so steps accept all, some and none of
    their drafts (asserted); the tokens stay exactly greedy and the recorded logits exact."""
    llm = make_llm(sbuilt, spec="ngram:3", max_num_batched_tokens=16)
    prompts = [random_tokens(13, 93), random_tokens(21, 94)]
    full = [p + hf_greedy(sbuilt, p, 24) for p in prompts]
    calls = []

    def oracle_lookup(tokens, k):
        calls.append(len(tokens))
        for f in full:
            if list(tokens) == f[:len(tokens)]:
                drafts = list(f[len(tokens):len(tokens) + k])
                if drafts and len(calls) % 3 == 0:
                    drafts[len(calls) % len(drafts)] = (drafts[len(calls) % len(drafts)] + 1) % 128
                return drafts
        return []

    llm.drafter.lookup = oracle_lookup
    outs = llm.generate(prompts, max_tokens=24, params=NO_EOS)
    st = llm.stats
    assert st.draft_tokens > st.accepted_tokens > 0, (st.draft_tokens, st.accepted_tokens)
    assert [o.token_ids for o in outs] == [f[len(p):] for f, p in zip(full, prompts)]
    assert oracle_excess(sbuilt, outs) <= 0
    assert len(llm.model.states) == 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_spec_decode_equals_greedy(sbuilt: Built, method: str, small_drafter) -> None:
    """Real n-gram and draft-model (a random 1-layer Llama) drafters: mostly rejected drafts,
    exactly the greedy tokens."""
    kw = {"draft_model": small_drafter} if method == "draft_model" else {}
    llm = make_llm(sbuilt, spec=f"{method}:3", max_num_batched_tokens=16, **kw)
    motif = random_tokens(6, 90)
    prompts = [motif * 4 + random_tokens(3, 91), random_tokens(9, 92) + motif * 3]
    outs = llm.generate(prompts, max_tokens=16, params=NO_EOS)
    assert llm.stats.draft_tokens > 0
    assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 16) for p in prompts]
    assert oracle_excess(sbuilt, outs) <= 0
    assert len(llm.model.states) == 0


@pytest.mark.parametrize("method", ["ngram", "draft_model"])
def test_spec_decode_checkpoints_hit_by_later_turns(sbuilt: Built, method: str, small_drafter) -> None:
    """Speculative decoding with prefix caching on and a checkpoint every block (N = None):
    checkpoints are exported during verify steps (at accepted positions only). A second turn
    (prompt + answer + more tokens) hits a checkpoint inside the decoded answer, i.e. one a
    verify step wrote; had a rejected draft leaked into it, its tokens would differ from
    transformers'."""
    kw = {"draft_model": small_drafter} if method == "draft_model" else {}
    llm = make_llm(sbuilt, spec=f"{method}:3", max_num_batched_tokens=16, retention_interval=None,
                   block_size=4, **kw)
    motif = random_tokens(6, 95)
    prompt = motif * 3 + random_tokens(2, 96)
    (first,) = llm.generate([prompt], max_tokens=16, params=NO_EOS)
    assert llm.stats.draft_tokens > 0
    turn2 = prompt + first.token_ids + random_tokens(3, 97)
    (second,) = llm.generate([turn2], max_tokens=8, params=NO_EOS)
    assert second.num_cached_tokens > len(prompt)  # a checkpoint inside the decoded answer
    assert first.token_ids == hf_greedy(sbuilt, prompt, 16)
    assert second.token_ids == hf_greedy(sbuilt, turn2, 8)
    _check_hits(llm, [first, second])
    assert oracle_excess(sbuilt, [first, second]) <= 0
    llm.kv.check_integrity()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_rejected_drafts_never_advance_state(state_models: dict[str, StateBuilt], data) -> None:
    """Property: after any sequence of verify steps (1 known token + d drafts, a random number
    of them accepted), the stored state equals the state of the accepted tokens alone (one pass
    from 0), layer by layer, and a rewind to an unmarked length raises."""
    built = state_models[data.draw(st.sampled_from(sorted(state_models)), label="arch")]
    model = built.model
    cache, alloc = new_cache(built)
    tokens = random_tokens(5, data.draw(st.integers(0, 99), label="seed"))
    owner = TableOwner(alloc, tokens=list(tokens))
    _step(model, cache, owner, len(tokens), "spec")
    for _ in range(data.draw(st.integers(1, 5), label="steps")):
        d = data.draw(st.integers(1, 4), label="drafts")
        proposal = data.draw(st.lists(st.integers(0, 127), min_size=d + 1, max_size=d + 1), label="tokens")
        start = owner.computed
        owner.tokens = owner.tokens[:start] + proposal
        seq = owner.step(d + 1)
        model([SequenceInput(seq.token_ids, start, seq.block_tables, state_key="spec",
                             snapshot_from=start + 1)], cache, logits="none")
        accepted = data.draw(st.integers(0, d), label="accepted")
        model.accept_state("spec", start + 1 + accepted)
        owner.computed = start + 1 + accepted
        owner.tokens = owner.tokens[:owner.computed]
    with pytest.raises(StateMissingError):
        model.accept_state("spec", owner.computed - 1)  # snapshots are gone after a rewind
    ref = TableOwner(alloc, tokens=list(owner.tokens))
    _step(model, cache, ref, len(owner.tokens), "ref")
    a, b = model.states._states["spec"], model.states._states["ref"]
    assert a.position == b.position == len(owner.tokens)
    # fp32 states of magnitude up to ~25 accumulate in other orders: TOL relative to the state's
    # size (a rejected draft folded in moves a state by a token's contribution, orders more).
    for layer in b.ssm:
        for x, y in ((a.ssm[layer], b.ssm[layer]), (a.conv[layer], b.conv[layer])):
            assert max_diff(x, y) <= TOL * max(1.0, float(y.abs().max()))
    model.states.clear()


# --------------------------------------------------------------------------- differential property
_NO_CACHE: dict = {}


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_prefix_caching_never_changes_outputs(state_models: dict[str, StateBuilt], data) -> None:
    """Property: random prompt families (shared prefixes of random lengths), block sizes,
    checkpoint intervals, budgets, prefill caps, pool sizes (preemption) and n-gram drafts:
    the engine with prefix caching on produces exactly the tokens of the engine with prefix
    caching off (itself transformers-checked above), and every computed row is within the
    bound of :func:`oracle_excess` against transformers and the cache-off engine (rows of the
    two engines differ by fp32 noise of other chunkings: 3.8e-4 measured), over two rounds (the second hits checkpoints of the
    first); the pool is intact afterwards."""
    name = data.draw(st.sampled_from(sorted(state_models)), label="arch")
    built = state_models[name]
    shared = random_tokens(data.draw(st.integers(0, 40), label="shared"), data.draw(st.integers(0, 99)))
    prompts = [shared[:data.draw(st.integers(0, len(shared)))] + random_tokens(data.draw(st.integers(1, 12)), 200 + i)
               for i in range(data.draw(st.integers(2, 4), label="prompts"))]
    bs = data.draw(st.sampled_from([4, 8]), label="block")
    opts = dict(block_size=bs, max_num_batched_tokens=data.draw(st.sampled_from([6, 16, 64]), label="budget"),
                long_prefill_token_threshold=data.draw(st.sampled_from([0, 5]), label="cap"),
                retention_interval=data.draw(st.sampled_from([0, None, 2 * bs]), label="retention"))
    spec = data.draw(st.sampled_from([None, "ngram:2"]), label="spec")
    if spec:
        opts["spec"] = spec
    small = data.draw(st.booleans(), label="small pool")
    probe = make_llm(built, **opts)
    if small:
        opts.update(num_blocks=blocks_for(probe, 64) + 1, max_model_len=64)
    on = make_llm(built, **opts)
    outs_on = [o for _ in range(2) for o in on.generate(prompts, max_tokens=6, params=NO_EOS)]
    key = (name, tuple(map(tuple, prompts)))
    if key not in _NO_CACHE:
        off = make_llm(built, enable_prefix_caching=False)
        _NO_CACHE[key] = off.generate(prompts, max_tokens=6, params=NO_EOS)
    ref = _NO_CACHE[key] * 2
    assert [o.token_ids for o in outs_on] == [o.token_ids for o in ref]
    assert oracle_excess(built, outs_on, ref) <= 0
    on.kv.check_integrity()
    assert on.kv.num_free_blocks == on.kv_config.num_blocks - 1
    assert len(on.model.states) == 0


# --------------------------------------------------------------------------- refusals
def test_dflash_draft_state_model_and_kv_store_refused(sbuilt: Built) -> None:
    from hybridkv.connectors.stores.local import LocalCPUStore

    with pytest.raises(ValueError, match="'dflash' is not supported for"):
        make_llm(sbuilt, spec="dflash:3", draft_model=sbuilt.path)
    with pytest.raises(ValueError, match="a draft model must be attention-only"):
        make_llm(sbuilt, spec="draft_model:3", draft_model=sbuilt.path)
    with pytest.raises(ValueError, match="kv_store is not supported"):
        make_llm(sbuilt, kv_store=LocalCPUStore(1 << 20))


def test_engine_core_needs_the_state_group(sbuilt: Built) -> None:
    """A KV-cache config without the recurrent layers' state group is refused (the states
    live in the pool)."""
    llm = make_llm(sbuilt)
    groups = tuple(g for g in llm.kv_config.groups if not is_state(g.spec))
    cfg = KVCacheConfig(groups, num_blocks=llm.kv_config.num_blocks)
    kv = KVCacheManager(cfg, CacheOptions(enable_caching=True, max_model_len=llm.max_model_len))
    with pytest.raises(ValueError, match="needs their state group"):
        EngineCore(llm.model, kv, Scheduler(kv, llm.scheduler_config), PagedKVCache(cfg))


def test_config_errors() -> None:
    base = dict(model_type="nemotron_h", vocab_size=32, hidden_size=16, intermediate_size=32,
                num_attention_heads=2, head_dim=8, mamba_num_heads=2, mamba_head_dim=4, n_groups=1,
                ssm_state_size=4)
    with pytest.raises(ValueError, match="unsupported layer type 'moe'"):
        parse_model_config(dict(base, layers_block_type=["mamba", "moe"]))
    cfg = parse_model_config(dict(base, hybrid_override_pattern="M-*"))
    assert cfg.layer_kinds == ("linear", "mlp", "full")
    with pytest.raises(ValueError, match="multiple of n_groups"):
        parse_model_config(dict(base, n_groups=3, layers_block_type=["mamba"]))
    q = dict(model_type="qwen3_next", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
             num_attention_heads=2, layer_types=["linear_attention"], linear_num_key_heads=2,
             linear_num_value_heads=3, linear_key_head_dim=4, linear_value_head_dim=4)
    with pytest.raises(ValueError, match="multiple of linear_num_key_heads"):
        parse_model_config(q)


# --------------------------------------------------------------------------- CLI
def test_cli_generate(sbuilt: Built, capsys: pytest.CaptureFixture) -> None:
    a, b = random_tokens(40, 120), random_tokens(40, 120)[:36] + random_tokens(3, 121)
    argv = ["generate", "--model", str(sbuilt.path), "--prompt-ids", ",".join(map(str, a)), "--prompt-ids",
            ",".join(map(str, b)), "--max-tokens", "6", "--ignore-eos", "--device", "cpu", "--json"]
    assert main(argv) == 0
    outs = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["token_ids"] for o in outs] == [hf_greedy(sbuilt, a, 6), hf_greedy(sbuilt, b, 6)]
    # b shares 36 tokens with a; a's first chunk ends at its checkpoint after 16 tokens (one
    # unit below its replay boundary 32), which b, admitted in the same step, hits
    assert [o["prefix_cache_hit_tokens"] for o in outs] == [0, 16]
    assert main(argv + ["--spec", "ngram:3"]) == 0
    spec_outs = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["token_ids"] for o in spec_outs] == [o["token_ids"] for o in outs]
    assert main(argv + ["--spec", "dflash:3", "--draft-model", str(sbuilt.path)]) != 0
    err = capsys.readouterr().err
    assert "'dflash' is not supported" in err and "Traceback" not in err


@pytest.mark.parametrize("block_size", ["4", "16"])
def test_cli_generate_shared_prefix(sbuilt: Built, capsys: pytest.CaptureFixture, block_size: str) -> None:
    """``hybridkv generate --model DIR`` with three prompts sharing a 70-token prefix: the
    greedy tokens of transformers, and the later prompts report prefix-cache hits."""
    prefix = random_tokens(70, 130)
    prompts = [prefix + random_tokens(n, 131 + n) for n in (5, 9, 13)]
    argv = ["generate", "--model", str(sbuilt.path), "--max-tokens", "5", "--ignore-eos", "--device", "cpu",
            "--json", "--block-size", block_size, "--retention", "none"]
    for p in prompts:
        argv += ["--prompt-ids", ",".join(map(str, p))]
    assert main(argv) == 0
    outs = json.loads(capsys.readouterr().out)["outputs"]
    assert [o["token_ids"] for o in outs] == [hf_greedy(sbuilt, p, 5) for p in prompts]
    hits = [o["prefix_cache_hit_tokens"] for o in outs]
    assert hits[0] == 0 and all(h > 0 and h % int(block_size) == 0 for h in hits[1:]), hits


@pytest.mark.parametrize(("extra", "message"), [
    (["--state-dtype", "float8_e4m3fn"], "valid dtypes: bfloat16, float16, float32"),
    (["--num-blocks", "2"], "give --num-blocks >= 4"),
    (["--num-blocks", "3"], "give --num-blocks >= 4"),
])
def test_cli_state_errors(sbuilt: Built, capsys: pytest.CaptureFixture, extra: list[str], message: str) -> None:
    """An unsupported state dtype and a pool too small for one request's state: one line on
    stderr naming the valid values, exit status 2, no traceback."""
    argv = ["generate", "--model", str(sbuilt.path), "--prompt-ids", "1,2,3", "--device", "cpu", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err


@pytest.mark.parametrize("block_size", [4, 16])
def test_a_marked_position_is_hit_by_the_second_request(sbuilt: Built, block_size: int) -> None:
    """LLM.generate(checkpoints=) — N = 0 with the shared 70-token prefix's end marked: the 1st
    request already leaves a checkpoint at 70 rounded down to the block, so the 2nd prompt hits
    it (without the mark it hits 0, see above); every token equals transformers and the engine
    really continued from the checkpoint (recorded logits start at the hit)."""
    prefix = random_tokens(70, 17)
    prompts = [prefix + random_tokens(n, 18 + n) for n in (40, 44, 48)]
    mark = 70 // block_size * block_size
    llm = make_llm(sbuilt, block_size=block_size, retention_interval=0)
    marked = RequestParams(ignore_eos=True, checkpoints=[70])
    outs = [llm.generate([p], max_tokens=6, params=marked)[0] for p in prompts]
    assert [o.num_cached_tokens for o in outs] == [0, mark, mark]
    assert [o.token_ids for o in outs] == [hf_greedy(sbuilt, p, 6) for p in prompts]
    _check_hits(llm, outs)
    assert oracle_excess(sbuilt, outs) <= 0
    llm.kv.check_integrity()

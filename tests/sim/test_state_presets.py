"""State-group presets through the simulator (docs/state-groups.md §2.5, §2.8): the 200-token
bar, vLLM's forced block size as the baseline, and the retention (checkpoint) sweep CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hybridkv.cli import main
from hybridkv.core.specs import StateSpec
from hybridkv.cost.presets import get_gpu, get_preset, vllm_align_block_size
from hybridkv.sim import SimConfig, Simulator, items_from_trace
from hybridkv.sim.traffic.traces import TraceRequest

H100 = get_gpu("h100")


def test_state_presets_have_the_published_state_sizes() -> None:
    q = get_preset("qwen3-next-80b-a3b")
    assert [(g.name, len(g.layer_names)) for g in q.groups] == \
        [("full", 12), ("gdn0", 12), ("gdn1", 12), ("gdn2", 12)]
    assert q.groups[1].spec.page_size_bytes == 2_146_304
    assert q.kv_bytes_per_token()["total"] == 12 * 2 * 2 * 256 * 2       # attention only
    cfg = q.kv_config(num_blocks=1000)
    assert cfg.extent_blocks(1) == 66                                     # 2,146,304 / 32,768
    n = get_preset("nemotron-h-8b")
    assert n.groups[1].spec.page_size_bytes == 4_255_744
    assert n.kv_config(num_blocks=1000).extent_blocks(1) == 65           # / 65,536
    # vLLM: the attention block grows until one page holds a state (unify_kv_cache_spec_page_size)
    assert vllm_align_block_size(q) == 1056 and vllm_align_block_size(n) == 1040
    with pytest.raises(ValueError, match="has no state group"):
        vllm_align_block_size(get_preset("llama-3.1-8b"))


def _hits(preset, prompts, retention, compat=False) -> list[int]:
    """Run the prompts one after another; per request, the tokens its lookup hit."""
    items = items_from_trace([TraceRequest(f"r{i}", float(i), np.asarray(p), 4)
                              for i, p in enumerate(prompts)])
    sim = Simulator(SimConfig(preset, H100, num_blocks=20_000, retention_interval=retention,
                              sequential=True, vllm_compat=compat, optimum=False))
    hits = []
    before = 0
    for item in items:
        sim.run([item])
        total = sim.kv.stats().hits
        hits.append(total - before)
        before = total
    return hits


SHARED = list(range(5000, 5200))                      # a 200-token shared system prompt


def _prompts(n: int) -> list[list[int]]:
    return [SHARED + [100 * i + j for j in range(60)] for i in range(n)]


def test_200_shared_tokens_hit_192_on_the_qwen3_next_preset() -> None:
    q = get_preset("qwen3-next-80b-a3b")
    assert _hits(q, _prompts(2), retention=64)[1] >= 192
    assert _hits(q, _prompts(2), retention=16)[1] >= 192
    # N = 0 (replay boundaries + junction only): the 3rd occurrence hits, as in vLLM's align
    assert _hits(q, _prompts(3), retention=0)[1:] == [0, 192]


def test_vllm_forced_block_makes_the_same_prompts_hit_nothing() -> None:
    q = get_preset("qwen3-next-80b-a3b")
    align = q.with_block_size(vllm_align_block_size(q))
    assert all(isinstance(g.spec, StateSpec) for g in align.groups[1:])
    assert align.block_size == 1056
    assert _hits(align, _prompts(3), retention=0, compat=True) == [0, 0, 0]


def test_checkpoint_interval_sweep_cli(tmp_path: Path, capsys) -> None:
    """On a preset with recurrent-state groups, ``--retention-intervals`` sweeps where
    checkpoints are written, against checkpoint memory, with vLLM's align mode as baseline."""
    js = tmp_path / "ckpt.json"
    assert main(["sweep", "--preset", "qwen3-next-80b-a3b", "--workload", "system-prompt",
                 "--limit", "24", "--retention-intervals", "0,64,1024", "--cache-tokens", "400k",
                 "--no-progress", "--json", str(js)]) == 0
    out = capsys.readouterr().out
    assert "vLLM align (block 1056)" in out and "GB written" in out
    rows = json.loads(js.read_text())
    assert [r["label"] for r in rows] == ["N=0", "N=64", "N=1024", "vLLM align (block 1056)"]
    assert [r["retention_interval"] for r in rows] == [0, 64, 1024, 0]
    assert rows[-1]["vllm_compat"] and rows[-1]["block_size"] == 1056
    # the same memory budget in bytes for every configuration (up to one block)
    pools = [r["pool_bytes"] for r in rows]
    assert max(pools) - min(pools) <= 1056 * 12 * 2048
    assert all(0 <= r["token_hit_rate"] <= 1 and r["checkpoint_bytes_peak"] >= 0 for r in rows)
    # 2048-token system prompts: a checkpoint at 1024 and 2048 serves every later request
    assert rows[2]["token_hit_rate"] > rows[-1]["token_hit_rate"]


@pytest.mark.parametrize("argv,msg", [
    (["--preset", "qwen3-next-80b-a3b", "--sequential"], "drop --sequential"),
    (["--preset", "qwen3-next-80b-a3b", "--vllm-compat"], "drop --vllm-compat"),
    (["--preset", "qwen3-next-80b-a3b", "--executor", "processes"], "drop --executor"),
    (["--preset", "qwen3-next-80b-a3b", "--cache-tokens-list", "1M"], "sweep one thing at a time"),
])
def test_checkpoint_sweep_bad_options_are_one_line_errors(argv, msg, capsys) -> None:
    rc = main(["sweep", "--workload", "replay", "--retention-intervals", "0,64", "--no-progress"] + argv)
    err = capsys.readouterr().err
    assert rc != 0 and msg in err and "Traceback" not in err


def test_checkpoints_written_grow_as_the_interval_shrinks(tmp_path: Path) -> None:
    js = tmp_path / "ckpt.json"
    assert main(["sweep", "--preset", "qwen3-next-80b-a3b", "--workload", "system-prompt",
                 "--limit", "16", "--retention-intervals", "1024,256,64,16", "--cache-tokens", "2M",
                 "--no-progress", "--json", str(js)]) == 0
    rows = json.loads(js.read_text())
    written = [r["checkpoints_written"] for r in rows[:4]]
    assert written == sorted(written) and written[0] < written[-1]
    assert all(r["checkpoint_bytes_written"] == r["checkpoints_written"] * r["checkpoint_bytes_per_state"]
               for r in rows)
    assert rows[0]["checkpoint_bytes_per_state"] == 3 * 66 * 12 * 32768     # 36 layers' states


def test_a_checkpoint_row_is_the_runs_result_and_its_resident_checkpoints() -> None:
    """``run_checkpoint_config`` on a pool large enough that nothing is evicted: every
    checkpoint written stays resident, so the last sample (the peak: residency only grows)
    equals the bytes written, ``checkpoints x (3 state groups x 66 blocks x block bytes)``;
    the mean is the mean of the per-step samples of an identical run; the counts are that
    run's result; an empty workload samples nothing."""
    from hybridkv.sim.state_sweep import checkpoint_bytes, run_checkpoint_config
    q = get_preset("qwen3-next-80b-a3b")
    cfg = SimConfig(q, H100, num_blocks=20_000, retention_interval=64, optimum=False)
    items = items_from_trace([TraceRequest(f"r{i}", 0.05 * i, np.asarray(p), 4)
                              for i, p in enumerate(_prompts(3))])
    row = run_checkpoint_config("N=64", cfg, items)
    twin = Simulator(cfg)
    samples: list[int] = []
    twin.step_hooks.append(lambda start, end, out: samples.append(checkpoint_bytes(twin)))
    res = twin.run(items)
    block_bytes = twin.kv.config.block_bytes
    assert row.checkpoint_bytes_per_state == 3 * 66 * block_bytes
    assert row.checkpoints_written > 0 and res.evictions == 0
    assert row.checkpoint_bytes_written == row.checkpoints_written * 3 * 66 * block_bytes
    assert row.checkpoint_bytes_peak == samples[-1] == row.checkpoint_bytes_written
    assert len(samples) > 1 and row.checkpoint_bytes_mean == sum(samples) / len(samples)
    assert row.checkpoint_bytes_mean < row.checkpoint_bytes_peak
    assert (row.hit_tokens, row.prompt_tokens, row.token_hit_rate, row.evictions, row.preemptions) \
        == (res.hit_tokens, res.prompt_tokens, res.hit_rate, res.evictions, res.preemptions)
    assert row.hit_tokens > 0 and row.prompt_tokens == 3 * 260
    assert row.pool_bytes == 19_999 * block_bytes and row.wall_s > 0
    assert (row.label, row.retention_interval, row.block_size, row.vllm_compat) == ("N=64", 64, 16, False)
    empty = run_checkpoint_config("none", cfg, [])
    assert (empty.checkpoint_bytes_mean, empty.checkpoint_bytes_peak, empty.checkpoints_written) == (0.0, 0, 0)


def _marked_hits(marks: bool) -> list[int]:
    """The _prompts(3) requests, each marking its system prompt's end (200), one after
    another on the Qwen3-Next preset, retention 0; the marks served or not."""
    items = items_from_trace([TraceRequest(f"r{i}", float(i), np.asarray(p), 4, checkpoints=(200,))
                              for i, p in enumerate(_prompts(3))])
    sim = Simulator(SimConfig(get_preset("qwen3-next-80b-a3b"), H100, num_blocks=20_000,
                              retention_interval=0, sequential=True, optimum=False,
                              checkpoint_marks=marks))
    hits, before = [], 0
    for item in items:
        sim.run([item])
        hits.append(sim.kv.stats().hits - before)
        before = sim.kv.stats().hits
    return hits


def test_served_checkpoint_marks_make_the_second_request_hit() -> None:
    """SimConfig.checkpoint_marks; Simulator._new_request — the marked end of the 200-token
    system prompt (192 at block 16) is a checkpoint from the first request on: the second hits
    192 instead of 0 (the junction alone serves the third)."""
    assert (_marked_hits(True), _marked_hits(False)) == ([0, 192, 192], [0, 0, 192])


def test_checkpoint_marks_sweep_row(tmp_path: Path, capsys) -> None:
    """sweep --retention-intervals --checkpoint-marks — the system-prompt workload marks each
    system prompt's end; the intervals and the align baseline run without the marks, one more
    row, N=0 + marks, with them (and is the only row that serves them)."""
    js = tmp_path / "ckpt.json"
    assert main(["sweep", "--preset", "qwen3-next-80b-a3b", "--workload", "system-prompt",
                 "--workload-param", "num_requests=16", "--workload-param", "system_tokens=300-700",
                 "--retention-intervals", "0,256", "--checkpoint-marks", "--cache-tokens", "200k",
                 "--no-progress", "--json", str(js)]) == 0
    rows = json.loads(js.read_text())
    assert [r["label"] for r in rows] == ["N=0", "N=256", "vLLM align (block 1056)", "N=0 + marks"]
    assert "TTFT p50" in capsys.readouterr().out
    assert rows[-1]["token_hit_rate"] >= rows[0]["token_hit_rate"]
    assert all(r["ttft_p50_s"] is not None for r in rows)

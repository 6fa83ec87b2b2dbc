"""Deployments: the collective model, the collectives a step issues, the default deployment,
and the command lines that use them. Every expected value is computed by hand from the
published numbers the code cites (cost/collectives.py)."""

from __future__ import annotations

import json

import pytest

from hybridkv.cli import main
from hybridkv.cost.collectives import LINKS, all_gather_s, all_reduce_s, all_to_all_s
from hybridkv.cost.comm import comm_counts, link_for, step_comm_s
from hybridkv.cost.deployment import Deployment, default_deployment, expert_params, instance_budget
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import cost_model

US = 1e-6
H100 = get_gpu("h100")


def test_all_reduce_reads_the_published_table_and_its_bandwidth_tail() -> None:
    nv = LINKS["nvlink-h100"]
    assert all_reduce_s(nv, 524288, 8) == pytest.approx(22.1 * US)            # SGLang #2904 point
    assert all_reduce_s(nv, 393216, 8) == pytest.approx(19.4 * US)            # 16.7 + 5.4 / 2
    # beyond 1 MiB: 33.8 us + 1 MiB * 2 * 7/8 at 476 GB/s
    assert all_reduce_s(nv, 2 * 2**20, 8) == pytest.approx(33.8e-6 + 2**20 * 1.75 / 476e9)
    assert all_reduce_s(nv, 100, 3) == pytest.approx(3.7 * US)                # TP-2's first point
    assert all_reduce_s(nv, 10**6, 1) == 0.0 and all_reduce_s(nv, 0, 8) == 0.0


def test_all_gather_and_all_to_all_by_hand() -> None:
    assert all_gather_s(LINKS["nvlink-h100"], 370e6, 8) == pytest.approx(5.9e-6 + 370e6 * 7 / 8 / 370e9)
    # 2 x 46.3 us + 90 MB at 90 GB/s + 81 MB at 81 GB/s (DeepEP V2, EP 8 x 2)
    assert all_to_all_s(LINKS["ib-ndr"], 90e6, 81e6, 16) == pytest.approx(92.6e-6 + 2e-3)
    with pytest.raises(ValueError, match="group size"):
        all_reduce_s(LINKS["ib-ndr"], 1, 0)


def test_a_group_wider_than_a_node_uses_the_inter_node_link() -> None:
    assert link_for(H100, 8, 8).name == "nvlink-h100"
    assert link_for(H100, 16, 8).name == "ib-ndr"
    assert link_for(get_gpu("b200"), 4, 4).name == "nvlink-b200"


def test_tensor_parallel_decode_step_communication_by_hand() -> None:
    """Llama-3.1-8B, TP-8, 64 decodes: 1 + 2 x 32 all-reduces of 64 x 4096 x 2 = 524,288 B
    (22.1 us each) and one all-gather of 64 x 128,256 x 2 B of logits."""
    preset = get_preset("llama-3.1-8b")
    dep = Deployment(tp=8)
    c = comm_counts(preset, dep)
    assert (c.all_reduces, c.ar_bytes_per_token, c.gather_bytes_per_request, c.a2a_layers) == (65, 8192, 256512, 0)
    gather = 5.9e-6 + 64 * 256512 * 7 / 8 / 370e9
    assert step_comm_s(c, dep, H100, 64, 64) == pytest.approx(65 * 22.1e-6 + gather)
    model = cost_model(preset, H100, 8, deployment=dep)
    one = cost_model(preset, H100, 1).step([(1, 1024)] * 64)
    step = model.step([(1, 1024)] * 64)
    assert step.comm_s == pytest.approx(65 * 22.1e-6 + gather)
    assert step.time_s >= one.time_s / 6                   # communication is not free
    assert model.step_time_arrays([1] * 64, [1024] * 64) == pytest.approx(step.time_s)


def test_a_deployed_model_remembers_each_step_shapes_communication(monkeypatch) -> None:
    """comm_s equals step_comm_s for every shape, computes each shape once, and starts over
    once COMM_MEMO shapes are remembered (here 2)."""
    import hybridkv.cost.comm as comm
    preset = get_preset("llama-3.1-8b")
    dep = Deployment(tp=8)
    model = cost_model(preset, H100, 8, deployment=dep)
    c = comm_counts(preset, dep)
    calls: list[tuple[float, float]] = []

    def counted(counts, d, gpu, tokens, requests):
        calls.append((tokens, requests))
        return step_comm_s(counts, d, gpu, tokens, requests)
    monkeypatch.setattr(comm, "step_comm_s", counted)
    monkeypatch.setattr(comm, "COMM_MEMO", 2)
    for shape in [(64, 64), (64, 64), (130, 3), (64, 64), (7, 7), (64, 64)]:
        assert model.comm_s(*shape) == step_comm_s(c, dep, H100, *shape)
    assert calls == [(64, 64), (130, 3), (7, 7), (64, 64)]


def test_expert_parallel_counts_deepseek() -> None:
    """DeepSeek-V3: 61 layers, the first 3 dense: 58 MoE layers; top-8 x 7168 per token,
    FP8 dispatch (1 B) and BF16 combine (2 B)."""
    preset = get_preset("deepseek-v3")
    assert expert_params(preset) == 3 * 7168 * 2048 * 256 * 58
    dep = Deployment(1, 16, 16, 8, True)
    c = comm_counts(preset, dep)
    assert (c.all_reduces, c.a2a_layers, c.dispatch_bytes_per_token, c.combine_bytes_per_token) == (0, 58, 57344, 114688)
    per_layer = 2 * 46.3e-6 + 64 * 57344 / 90e9 + 64 * 114688 / 81e9
    assert step_comm_s(c, dep, H100, 64, 64) == pytest.approx(58 * per_layer)
    # a rank holds the dense weights whole and 1/16 of the experts (FP8: 1 byte each)
    experts = 3 * 7168 * 2048 * 256 * 58
    assert instance_budget(preset, H100, dep).weight_bytes == pytest.approx(671e9 - experts + experts / 16)


@pytest.mark.parametrize("preset, gpus, expected", [
    ("llama-3.1-8b", 8, (1, 8, 1, False)),         # 8 replicas
    ("llama-3.1-8b", 1, (1, 1, 1, False)),
    # TP-1 leaves 0.9 x 85.02 - 64.24 - 6.44 = 5.8 GB (79k tokens < 262,144): TP-2, 4 replicas
    ("gpt-oss-120b", 8, (2, 4, 1, False)),
    ("deepseek-v4-style", 16, (1, 16, 16, True)),  # DP attention + EP
])
def test_default_deployment(preset: str, gpus: int, expected: tuple) -> None:
    d = default_deployment(get_preset(preset), H100, gpus)
    assert (d.tp, d.dp, d.ep, d.dp_attention) == expected
    assert d.gpus == gpus and d.reason


def test_default_deployment_refuses_what_does_not_fit() -> None:
    # a rank: 0.9 x 85.02 - (17.2 + 653.8 / 8) - 6.44 < 0
    with pytest.raises(ValueError, match="DP attention \\+ EP-8 does not fit 8 x h100"):
        default_deployment(get_preset("deepseek-v4-style"), H100, 8)
    with pytest.raises(ValueError, match="expert parallelism shards"):
        Deployment(tp=4, ep=2)


def test_cost_cli_reports_comm_and_the_deployment(capsys) -> None:
    argv = ["cost", "--preset", "llama-3.1-8b", "--gpu", "h100", "--step", "1@1024x64", "--json"]
    assert main([*argv, "--tp", "8"]) == 0
    tp8 = json.loads(capsys.readouterr().out)
    assert main([*argv, "--tp", "1"]) == 0
    tp1 = json.loads(capsys.readouterr().out)
    assert tp8["steps"][0]["comm_s"] > 0 and tp1["steps"][0]["comm_s"] == 0
    assert tp8["time_s"] >= tp1["time_s"] / 6
    assert tp8["deployment"]["tp"] == 8
    assert main([*argv, "--tp", "16"]) == 0                          # over the inter-node link
    tp16 = json.loads(capsys.readouterr().out)
    assert tp16["steps"][0]["comm_s"] > tp8["steps"][0]["comm_s"]
    assert main([*argv, "--tp", "16", "--ep", "16"]) == 2
    assert "llama-3.1-8b has no routed experts" in capsys.readouterr().err
    # without --tp: one instance of simulate's default deployment (deepseek: a DP-16 rank)
    assert main(["cost", "--preset", "deepseek-v4-style", "--step", "1@1024x8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["deployment"]["name"] == "DP-16 attention + EP-16" and d["num_gpus"] == 1
    assert d["steps"][0]["comm_s"] > 0


def test_simulate_gpus_runs_the_default_deployment(tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    base = ["simulate", "--preset", "llama-3.1-8b", "--workload", "chat", "--limit", "12",
            "--no-progress", "--no-optimum"]
    assert main([*base, "--gpus", "8", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert {k: d["config"]["deployment"][k] for k in ("tp", "dp", "ep", "gpus")} == \
        {"tp": 1, "dp": 8, "ep": 1, "gpus": 8}
    assert "deployment: 8 x TP-1 on 8 GPUs" in capsys.readouterr().out
    assert main([*base, "--gpus", "8", "--tp", "8", "--dp", "1", "--json", str(out)]) == 0
    d = json.loads(out.read_text())
    assert d["config"]["deployment"]["tp"] == 8 and "TP-8, communication" in d["config"]["cost_model"]


@pytest.mark.parametrize("argv, words", [
    (["--preset", "llama-3.1-8b", "--tp", "2", "--ep", "2"], "--ep 2: llama-3.1-8b has no routed experts; drop --ep"),
    (["--preset", "llama-3.1-8b", "--gpus", "8", "--tp", "2", "--dp", "2"], "--gpus 8 must be --tp 2 x --dp 2 = 4"),
    (["--preset", "llama-3.1-8b", "--instances", "2", "--tp", "2"], "--instances N is --dp N; give one of them"),
    (["--preset", "gpt-oss-120b", "--tp", "4", "--ep", "2"], "--ep 2: expert parallelism shards the experts over one"),
])
def test_bad_deployments_are_one_line(argv, words, capsys) -> None:
    assert main(["simulate", "--workload", "replay", "--no-progress", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_a_larger_cache_keeps_the_deployment() -> None:
    """The next-step options for a larger cache name the deployment's flags, so the run they
    ask for is the same deployment (a rank of DP-16 + EP-16 leaves 12.1 GB: 123k tokens)."""
    import argparse
    from hybridkv.cli.capacity import larger_cache
    args = argparse.Namespace(deployment=Deployment(1, 16, 16, 8, True), gpu=get_gpu("h100"), gpus=1,
                              gpu_memory_fraction=0.9)
    more = larger_cache(args, get_preset("deepseek-v4-style"))
    assert more(100_000) == "--cache-tokens 100k --tp 1 --dp 16 --ep 16"
    assert more(250_000).endswith("(more than each instance of DP-16 attention + EP-16 holds: a larger --gpu)")


def test_next_steps_name_the_deployments_options() -> None:
    import argparse
    from hybridkv.cli.cluster import instances_option
    replicas = instances_option(argparse.Namespace(deployment=Deployment(2, 4, reason="default")))
    assert replicas(1) == "--tp 2 --dp 1" and replicas(6) == "--tp 2 --dp 6"
    ranks = instances_option(argparse.Namespace(deployment=Deployment(1, 16, 16, 8, True, "default")))
    assert ranks(2) is None and ranks(32) == "--tp 1 --dp 32 --ep 32"     # fewer may not hold the experts
    given = instances_option(argparse.Namespace(deployment=Deployment(1, 3, reason="--instances 3, ...")))
    assert given(2) == "--instances 2"


def test_moe_layers_exchange_tokens_instead_of_all_reducing() -> None:
    """gpt-oss-120b, TP-8 with EP-8: 1 + 36 attention all-reduces, 36 MoE layers all-to-all
    (top-4 x 2880); DeepSeek-V3 DP-2 x TP-4 attention + EP-8: 1 + 61 + 3 dense all-reduces."""
    c = comm_counts(get_preset("gpt-oss-120b"), Deployment(tp=8, ep=8))
    assert (c.all_reduces, c.a2a_layers, c.dispatch_bytes_per_token) == (37, 36, 4 * 2880)
    c = comm_counts(get_preset("deepseek-v3"), Deployment(4, 2, 8, 8, True))
    assert (c.all_reduces, c.a2a_layers) == (1 + 61 + 3, 58)


def test_h800_is_an_h100_with_a_slower_nvlink() -> None:
    """The h800 preset: H100 SXM memory, bandwidth and BF16/FP8 peaks; its NVLink entry is
    H100's scaled by 400 / 900 GB/s (busbw 476 -> 211.6 GB/s, ring 370 -> 164.4 GB/s) with
    DeepEP's own H800 all-to-all (153 / 158 GB/s)."""
    h800 = get_gpu("h800")
    assert (h800.memory_bytes, h800.mem_bw, h800.flops, h800.fp8_flops) \
        == (H100.memory_bytes, 3.35e12, 989e12, 1979e12)
    assert H100.gemm_flops("fp8") == 1979e12 and get_gpu("b200").gemm_flops("fp8") == 4500e12
    nv = link_for(h800, 8, 8)
    assert nv.name == "nvlink-h800" and link_for(h800, 16, 8).name == "ib-ndr"
    assert all_reduce_s(nv, 524288, 8) == pytest.approx(22.1 * US)            # H100's table
    assert all_reduce_s(nv, 2 * 2**20, 8) == pytest.approx(33.8e-6 + 2**20 * 1.75 / (476e9 * 4 / 9))
    assert all_gather_s(nv, 370e6, 8) == pytest.approx(5.9e-6 + 370e6 * 7 / 8 / (370e9 * 4 / 9))
    assert all_to_all_s(nv, 153e6, 158e6, 8) == pytest.approx(2 * 5.9e-6 + 2e-3)


def test_fp8_weights_leave_more_kv_memory() -> None:
    """vLLM's rule with 1-byte weights: 0.9 x 79.18 GiB - 8.03 GB - 6 GiB on one H100."""
    from hybridkv.cost.hardware import kv_budget
    p = get_preset("llama-3.1-8b")
    got = kv_budget(p.with_weight_dtype("fp8"), H100, 1).kv_bytes
    assert got == int(0.9 * int(79.18 * 2**30) - 8.03e9 - 6 * 2**30)
    assert got - kv_budget(p, H100, 1).kv_bytes == pytest.approx(8.03e9, abs=1)
    from hybridkv.cost.presets import GpuPreset
    with pytest.raises(ValueError, match="has no FP8 peak"):
        GpuPreset("cpu", 0, 1e11, 1e12).gemm_flops("fp8")

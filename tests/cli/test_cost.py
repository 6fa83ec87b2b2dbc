"""``hybridkv cost``: one step's time and split, as text and as JSON; bad steps are one line."""

from __future__ import annotations

import json

import pytest

from hybridkv.cli import main
from hybridkv.cost.presets import get_gpu, get_preset
from hybridkv.cost.profile import cost_model


def test_cost_json_is_the_library_cost(capsys) -> None:
    assert main(["cost", "--preset", "llama-3.1-8b", "--gpu", "h100", "--step", "2048@4096,1@1024x64",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    work = [(2048, 4096)] + [(1, 1024)] * 64
    expect = cost_model(get_preset("llama-3.1-8b"), get_gpu("h100")).step(work)
    assert out["time_s"] == pytest.approx(expect.time_s, rel=1e-12)
    step = out["steps"][0]
    assert step["requests"] == 65 and step["new_tokens"] == 2112 and step["bound"] == expect.bound
    assert step["compute_s"] + step["memory_s"] + step["attention_s"] + step["overhead_s"] \
        == pytest.approx(step["time_s"], rel=1e-12)
    assert out["cost_model"] == "calibrated" and step["roofline"]["model"] == "roofline"


def test_cost_text_names_the_terms_and_sums_steps(capsys) -> None:
    assert main(["cost", "--preset", "llama-3.1-8b", "--step", "1@1024x64", "--step", "8192@0"]) == 0
    text = capsys.readouterr().out
    assert "fitted to 24 steps measured on one NVIDIA H100" in text
    assert "step 1@1024x64 (64 requests, 64 new tokens)" in text and "bound by memory" in text
    assert "step 8192@0 (1 request, 8,192 new tokens)" in text and "bound by compute" in text
    assert "roofline:" in text and "total:" in text


def test_cost_roofline_and_tensor_parallel(capsys) -> None:
    assert main(["cost", "--preset", "llama-3.1-8b", "--step", "4096@0", "--cost-model", "roofline",
                 "--gpus", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    roof = cost_model(get_preset("llama-3.1-8b"), get_gpu("h100"), 2, kind="roofline")
    # plus TP-2's communication, by hand: 1 + 2 x 32 all-reduces of 4096 x 4096 x 2 B (19.9 us
    # at 1 MiB, the rest at 476 GB/s busbw) and the logits' all-gather (128,256 x 2 B)
    ar = 19.9e-6 + (4096 * 8192 - 2**20) * 2 * (1 / 2) / 476e9
    gather = 5.9e-6 + 128256 * 2 * (1 / 2) / 370e9
    assert out["num_gpus"] == 2 and out["time_s"] == pytest.approx(roof.step_time([(4096, 0)]) + 65 * ar + gather)
    assert out["steps"][0]["comm_s"] == pytest.approx(65 * ar + gather)
    assert out["steps"][0]["roofline"] is None


@pytest.mark.parametrize("args, words", [
    (["--step", "2048@,1@1024x64"], "argument --step: bad step item '2048@' in '2048@,1@1024x64'"),
    (["--step", "1@1024x0"], "bad step item '1@1024x0'"),
    (["--step", "5@5", "--gpu", "tpu"], "unknown GPU preset 'tpu'"),
    (["--step", "5@5", "--weight-dtype", "int4"], "argument --weight-dtype: invalid choice: 'int4'"),
    (["--step", "5@5", "--profile", "/nonexistent.json"], "cannot read profile '/nonexistent.json'"),
])
def test_bad_cost_input_is_one_line(capsys, args, words) -> None:
    with pytest.raises(SystemExit) as exc:
        rc = main(["cost", "--preset", "llama-3.1-8b", *args])
        raise SystemExit(rc)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1


def test_profile_and_roofline_conflict(capsys) -> None:
    from hybridkv.cost.profile import DEFAULT_PROFILE_PATH
    assert main(["cost", "--step", "5@5", "--profile", str(DEFAULT_PROFILE_PATH), "--cost-model",
                 "roofline"]) == 2
    assert "--profile applies to the calibrated cost model" in capsys.readouterr().err


def test_simulate_says_where_its_step_times_come_from(capsys) -> None:
    assert main(["simulate", "--preset", "llama-3.1-8b", "--workload", "chat", "--limit", "10",
                 "--no-progress", "--no-optimum", "--gpu", "h200"]) == 0
    assert "step times: calibrated: efficiencies measured on h100, carried over to h200" in \
        capsys.readouterr().out


def test_readme_quotes_the_real_cost_output(capsys) -> None:
    from pathlib import Path
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    head = "$ hybridkv cost --preset llama-3.1-8b --gpu h100 --step 2048@4096,1@1024x64\n"
    quoted = readme.split(head, 1)[1].split("```", 1)[0]
    assert main(["cost", "--preset", "llama-3.1-8b", "--gpu", "h100", "--step", "2048@4096,1@1024x64"]) == 0
    assert capsys.readouterr().out == quoted


def test_sweep_and_cluster_runs_take_a_profile(capsys) -> None:
    from hybridkv.cost.profile import DEFAULT_PROFILE_PATH
    assert main(["sweep", "--preset", "llama-3.1-8b", "--workload", "chat", "--limit", "10",
                 "--cache-tokens-list", "40k", "--no-progress", "--no-optimum",
                 "--profile", str(DEFAULT_PROFILE_PATH)]) == 0
    assert "step times: calibrated: profile of llama-3.1-8b on NVIDIA H100" in capsys.readouterr().out
    assert main(["simulate", "--preset", "llama-3.1-8b", "--workload", "chat", "--limit", "10",
                 "--instances", "2", "--no-progress", "--no-optimum", "--cost-model", "roofline"]) == 0
    assert "step times: roofline: mfu 0.5, mbu 0.8, 2 ms per step" in capsys.readouterr().out


def _cpu_profile(tmp_path):
    """The shipped H100 profile, its device replaced by a CPU's peaks (what `hybridkv profile`
    writes on a machine without a GPU: no ``gpu`` key)."""
    from hybridkv.cost.profile import DEFAULT_PROFILE_PATH
    d = json.loads(DEFAULT_PROFILE_PATH.read_text())
    d["device"] = {"name": "Test CPU", "peak_flops": 1e12, "peak_bw": 1e11}
    p = tmp_path / "cpu.profile.json"
    p.write_text(json.dumps(d))
    return p


def test_cost_with_a_cpu_profile_names_the_cpu(tmp_path, capsys) -> None:
    """Issue #44: a CPU profile printed "on 1 x h100" beside CPU step times, and the roofline
    line was the H100's."""
    p = _cpu_profile(tmp_path)
    assert main(["cost", "--preset", "llama-3.1-8b", "--step", "1@1024", "--profile", str(p)]) == 0
    head = capsys.readouterr().out.splitlines()[0]
    assert head == ("llama-3.1-8b on 1 x Test CPU (the profile's device; --gpu h100 only sizes "
                    "memory); calibrated: profile of llama-3.1-8b on Test CPU")
    assert main(["cost", "--preset", "llama-3.1-8b", "--step", "1@1024", "--profile", str(p), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["gpu"], out["device"]) == ("h100", "Test CPU")
    from hybridkv.cost.profile import load_profile
    cpu = load_profile(p).gpu_preset()
    roof = cost_model(get_preset("llama-3.1-8b"), cpu, 1, kind="roofline").step([(1, 1024)])
    assert out["steps"][0]["roofline"]["time_s"] == pytest.approx(roof.time_s, rel=1e-12)


def test_a_profile_of_another_model_is_warned_about(capsys) -> None:
    from hybridkv.cost.profile import DEFAULT_PROFILE_PATH
    assert main(["cost", "--preset", "gemma-3-27b", "--step", "1@1024", "--profile",
                 str(DEFAULT_PROFILE_PATH)]) == 0
    assert capsys.readouterr().err == (
        "hybridkv cost: warning: --profile 'llama-3.1-8b on NVIDIA H100 80GB HBM3' was measured on "
        "llama-3.1-8b, not gemma-3-27b: its fitted constants are applied to gemma-3-27b as they are "
        "(profile gemma-3-27b with `hybridkv profile` for step times of its own)\n")
    assert main(["cost", "--preset", "llama-3.1-8b", "--step", "1@1024", "--profile",
                 str(DEFAULT_PROFILE_PATH)]) == 0
    assert capsys.readouterr().err == ""
    assert main(["simulate", "--preset", "gemma-3-27b", "--workload", "chat", "--limit", "5",
                 "--no-progress", "--no-optimum", "--profile", str(DEFAULT_PROFILE_PATH)]) == 0
    assert "hybridkv simulate: warning: --profile 'llama-3.1-8b on NVIDIA H100 80GB HBM3' was " \
           "measured on llama-3.1-8b, not gemma-3-27b" in capsys.readouterr().err


def test_simulate_help_names_the_calibrated_default(capsys) -> None:
    """Issue #44: simulate --help called the default cost model "roofline"."""
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "step times from the calibrated cost model (fitted to steps measured on an H100, or to " \
           "--profile; --cost-model roofline: peak rates at fixed efficiencies)" in text
    assert "a roofline cost model for time" not in text


def test_cost_weight_dtype_fp8_is_the_fp8_preset(capsys) -> None:
    """``--weight-dtype fp8``: the preset with 1-byte weights and FP8 GEMMs, said in the JSON."""
    assert main(["cost", "--preset", "llama-3.1-8b", "--gpu", "h100", "--weight-dtype", "fp8",
                 "--step", "4096@0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    preset = get_preset("llama-3.1-8b").with_weight_dtype("fp8")
    expect = cost_model(preset, get_gpu("h100")).step([(4096, 0)])
    bf16 = cost_model(get_preset("llama-3.1-8b"), get_gpu("h100")).step([(4096, 0)])
    assert out["weight_dtype"] == "fp8" and out["time_s"] == pytest.approx(expect.time_s, rel=1e-12)
    assert out["time_s"] < bf16.time_s


def test_simulate_weight_dtype_fp8_sizes_the_cache_and_says_so(tmp_path) -> None:
    """``simulate --weight-dtype fp8``: 8.03 GB less of weights on the GPU, so vLLM's rule
    leaves that much more KV (128 KiB per token: 61,264 tokens more, whole blocks of 16), and
    the JSON names the dtype."""
    base = ["simulate", "--preset", "llama-3.1-8b", "--workload", "chat", "--limit", "5", "--no-progress",
            "--no-optimum", "--gpus", "1"]
    blocks = {}
    for dtype in ("bf16", "fp8"):
        out = tmp_path / f"{dtype}.json"
        assert main([*base, "--weight-dtype", dtype, "--json", str(out)]) == 0
        d = json.loads(out.read_text())
        assert d["config"]["weight_dtype"] == dtype
        blocks[dtype] = d["config"]["num_blocks"]
    p = get_preset("llama-3.1-8b")
    from hybridkv.cost.hardware import kv_budget
    want = [kv_budget(q, get_gpu("h100"), 1).tokens() // 16 for q in (p, p.with_weight_dtype("fp8"))]
    assert [blocks["bf16"], blocks["fp8"]] == want and want[1] - want[0] == 8_030_000_000 // 131072 // 16

"""``hybridkv plan`` end to end on a small workload: the chosen candidate's own ``simulate``
command meets the SLO, every cheaper candidate's command misses it (pruned ones included: the
bound is checked against the simulator), and the JSON has what the issue names."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from hybridkv.cli import main
from hybridkv.sim.plan.slo import SLO, metrics

WORKLOAD = ["--workload", "chat", "--workload-param", "num_conversations=8", "--workload-param",
            "turns=3", "--workload-param", "arrival_rate=40", "--preset", "llama-3.1-8b"]
SLO_TEXT = "ttft-p99=40ms"


@pytest.fixture(scope="module")
def plan(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    assert main(["plan", *WORKLOAD, "--slo", SLO_TEXT, "--max-gpus", "2", "--goodput-rows", "2",
                 "--goodput-runs", "2", "--no-progress", "--json", str(out)]) == 0
    return json.loads(out.read_text())


def _rerun(command: str, path: Path) -> dict:
    argv = shlex.split(command)
    assert argv[:2] == ["hybridkv", "simulate"]
    assert main([*argv[1:], "--no-progress", "--json", str(path)]) == 0
    return json.loads(path.read_text())


def test_the_choice_reruns_within_the_slo_and_every_cheaper_candidate_does_not(plan, tmp_path) -> None:
    slo = SLO.parse(SLO_TEXT)
    chosen = plan["candidates"][plan["chosen"]]
    assert chosen["meets_slo"] and chosen["gpus"] == 2
    again = _rerun(chosen["command"], tmp_path / "chosen.json")
    assert slo.meets(metrics(again))
    assert metrics(again)["ttft_p99_s"] == pytest.approx(chosen["ttft_p99_s"])
    cheaper = [c for c in plan["candidates"] if c["usd_per_mtok"] < chosen["usd_per_mtok"]]
    assert len(cheaper) == 4 and not any(c["meets_slo"] for c in cheaper)
    for i, c in enumerate(cheaper):
        assert not slo.meets(metrics(_rerun(c["command"], tmp_path / f"c{i}.json"))), c["command"]


def test_the_json_has_costs_saved_lines_goodput_and_the_search(plan) -> None:
    chosen = plan["candidates"][plan["chosen"]]
    w = plan["window"]
    usd = 2 * plan["prices_usd_per_gpu_hour"]["h100"] * w["span_s"] / 3600
    assert chosen["usd_per_mtok"] == pytest.approx(usd / ((w["prompt_tokens"] + w["output_tokens"]) / 1e6))
    for c in plan["candidates"]:
        assert {"command", "meets_slo", "usd_per_mtok", "gpus", "deployment", "options",
                "ttft_p99_s"} <= set(c)
        assert c["command"].endswith("--no-optimum")
    assert [s["feature"] for s in plan["saved"]] == ["cpu-tier", "hints", "kv-routing"]
    for s in plan["saved"]:                              # the choice (one instance) uses none
        assert s["searched"] and s["gpus_saved"] == 0 and s["usd_per_mtok_saved"] == 0
        assert s["with_candidate"] == plan["chosen"]
    g = next(g for g in plan["goodput"] if g["deployment"] == chosen["deployment"])
    assert g["rate_scale"] >= 1 and g["runs"][0]["rate_scale"] == 1
    s = plan["search"]
    assert s["simulations"] >= 4 and s["simulations"] + s["pruned"] >= len(plan["candidates"])


def test_a_goodput_run_at_another_load_reruns_to_the_same_numbers(plan, tmp_path) -> None:
    """The goodput search's commands carry --rate-scale; rerun, they give the same TTFT."""
    runs = [r for g in plan["goodput"] for r in g["runs"] if r["rate_scale"] != 1 and r["simulated"]
            and not r["stopped_early"]]
    assert runs and all("--rate-scale" in r["command"] for r in runs)
    again = _rerun(runs[0]["command"], tmp_path / "g.json")
    assert metrics(again)["ttft_p99_s"] == pytest.approx(runs[0]["ttft_p99_s"])


def test_simulate_takes_the_first_seconds_of_a_workload(tmp_path) -> None:
    from hybridkv.sim import items_from_trace
    from hybridkv.sim.traffic.workitems import first_seconds
    from hybridkv.sim.traffic.workloads import get_workload
    items = items_from_trace(get_workload("chat", num_conversations=8, turns=3, arrival_rate=40))
    want = len(first_seconds(items, 0.2))
    assert 0 < want < len(items)
    out = _rerun(f"hybridkv simulate {shlex.join(WORKLOAD)} --duration 0.2 --no-optimum", tmp_path / "d.json")
    assert out["requests"] == want
    with pytest.raises(SystemExit) as exc:                 # argparse refuses the value
        main(["simulate", "--workload", "replay", "--rate-scale", "0"])
    assert exc.value.code == 2


@pytest.mark.parametrize("argv, message", [
    (["--slo", "ttft-p99=2s", "--gpus", "2"], "--gpus is what a plan searches or sets; use --gpus-per-instance"),
    (["--slo", "ttft-p99=2s", "--hints", "magic"], "unknown hint kind 'magic'"),
    (["--slo", "latency=2s"], "is not METRIC-pNN=TIME"),
    (["--slo", "ttft-p99=2s", "--tier-policy", "offload-on-evict"], "--tier-policy applies to some"),
    (["--slo", "ttft-p99=2s", "--trac", "x"], "unrecognized arguments: --trac x"),
    (["--slo", "ttft-p99=2s", "--gpu", "h100,tpu"], "unknown GPU 'tpu'"),
    (["--slo", "ttft-p99=2s", "--gpu-hour-usd", "h100"], "expected KIND=USD"),
    (["--slo", "ttft-p99=2s", "--goodput-precision", "1"], "--goodput-precision must be > 1"),
])
def test_bad_plan_options_get_one_line(argv, message, capsys) -> None:
    try:
        status = main(["plan", "--workload", "replay", "--no-progress", *argv])
    except SystemExit as exc:
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1

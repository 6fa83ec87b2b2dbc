"""Plumbing shared by the examples: a tiny model, a local Mooncake cluster, child processes.

The engine flow of each example stays in the example itself; this module only holds what every
example needs around it:

* :func:`tiny_model` - a random hybrid checkpoint (qwen2: full + sliding-window layers);
* :func:`local_mooncake` - a ``mooncake_master`` and one storage node on 127.0.0.1, inside a
  loopback-only network namespace when this process may create one (root), because Mooncake's
  transfer ports listen on every interface even when told ``127.0.0.1``;
* :func:`run_child` - run ``SCRIPT --role ROLE --job JOB.json`` as a separate process (it
  inherits the namespace) and read back the JSON it writes;
* :func:`open_mooncake` / :func:`serve` - what a child does: connect a ``MooncakeStore`` and
  time one request on an ``LLM``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

_REPO_SRC = Path(__file__).resolve().parent.parent / "src"
try:  # run from a checkout without `pip install -e .`: use the checkout's sources
    import hybridkv  # noqa: F401
except ImportError:  # pragma: no cover - depends on how the examples are run
    sys.path.insert(0, str(_REPO_SRC))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(_REPO_SRC), os.environ.get("PYTHONPATH", "")) if p)

#: The examples' default model: 4 layers (full, sliding, sliding, full), window 32, float32.
TINY_HYBRID: dict[str, Any] = dict(
    model_type="qwen2", vocab_size=512, hidden_size=128, intermediate_size=256,
    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
    use_sliding_window=True, sliding_window=32,
    layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
)


def tiny_model(directory: Path, seed: int = 0) -> Path:
    """Write the random :data:`TINY_HYBRID` checkpoint (same seed, same weights)."""
    from hybridkv.engine.checkpoints import random_model

    return random_model(directory, TINY_HYBRID, seed=seed)


def vocab_size(model_dir: Path) -> int:
    return int(json.loads((Path(model_dir) / "config.json").read_text())["vocab_size"])


def random_prompt(n: int, vocab: int, seed: int) -> list[int]:
    import torch

    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@contextlib.contextmanager
def local_mooncake(storage_bytes: int = 256 << 20, isolate: bool = True) -> Iterator[Any]:
    """A started ``MooncakeCluster`` (master + one storage node on 127.0.0.1).

    With ``isolate`` the calling thread first enters a private network namespace that has only
    ``lo``; the cluster and every child started from this thread live there. Without the
    privilege for that (not root) it says so and runs on the host's loopback instead.
    """
    from hybridkv.testing import MooncakeCluster, NetnsUnavailable, loopback_netns

    with contextlib.ExitStack() as stack:
        if isolate:
            try:
                stack.enter_context(loopback_netns())
                print("network : private namespace, loopback only")
            except NetnsUnavailable as exc:
                print(f"network : host loopback ({exc}); Mooncake's transfer ports are reachable "
                      "from other interfaces while this runs")
        else:
            print("network : host loopback (--no-netns)")
        t0 = time.perf_counter()
        cluster = stack.enter_context(MooncakeCluster([storage_bytes]))
        print(f"mooncake: master {cluster.master_address} + 1 storage node "
              f"({storage_bytes >> 20} MiB) ready in {time.perf_counter() - t0:.2f} s")
        yield cluster


def run_child(script: str, role: str, job: dict[str, Any], timeout_s: float = 120.0
              ) -> tuple[dict[str, Any], float]:
    """Run ``script --role role`` as its own process; return (its JSON result, wall seconds).

    Exits this process with the child's log tail if the child fails.
    """
    with tempfile.TemporaryDirectory(prefix="hybridkv-example-") as tmp:
        job_path, result_path = Path(tmp) / "job.json", Path(tmp) / "result.json"
        job_path.write_text(json.dumps(dict(job, result=str(result_path))))
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, script, "--role", role, "--job", str(job_path)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout_s)
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not result_path.exists():
            tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-30:])
            sys.exit(f"the {role} process failed (exit code {proc.returncode}):\n{tail}")
        return json.loads(result_path.read_text()), wall


def read_job(path: str) -> dict[str, Any]:
    return json.loads(Path(path).read_text())


def write_result(job: dict[str, Any], result: dict[str, Any]) -> None:
    Path(job["result"]).write_text(json.dumps(result))


def open_mooncake(master_address: str) -> Any:
    """A ``MooncakeStore`` client of the cluster (pure client: its objects live on the storage
    node, so they outlive this process). Exits if the master cannot be reached."""
    from hybridkv.connectors.stores import MooncakeStore, MooncakeStoreConfig

    store = MooncakeStore(MooncakeStoreConfig(master_address=master_address,
                                              protocol="tcp", metadata_server="P2PHANDSHAKE"))
    if not store.healthy:
        sys.exit(f"cannot reach the Mooncake master at {master_address}")
    return store


def serve(llm: Any, prompt: list[int], max_tokens: int) -> tuple[Any, float, float]:
    """Run one request to completion; return (GenerationOutput, TTFT s, total s).

    The engine saves what it cached to its store (if any) before this returns.
    """
    from hybridkv.engine import RequestParams

    (req,) = llm.submit([prompt], max_tokens=max_tokens, params=RequestParams(ignore_eos=True))
    t0 = time.perf_counter()
    while req.num_output_tokens == 0:
        llm.engine.step()
    ttft = time.perf_counter() - t0
    llm.engine.run()  # the remaining tokens; flushes the connector's last saves
    total = time.perf_counter() - t0
    return llm.collect([req])[0], ttft, total


def engine_kwargs(job: dict[str, Any]) -> dict[str, Any]:
    """LLM arguments every process of an example uses (same block size and pool)."""
    from hybridkv.engine import CacheConfig, RuntimeConfig

    return dict(runtime=RuntimeConfig(device="cpu"),
                cache=CacheConfig(block_size=job["block_size"], kv_cache_bytes=job["kv_cache_mib"] << 20))

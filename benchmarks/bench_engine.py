"""Reference-engine speed on CPU: prefill and decode tokens/s for a small model, and TTFT with
vs without prefix-cache hits on a shared-prefix workload.

The models are random checkpoints written by ``hybridkv.engine.checkpoints`` (no download, no
transformers): a Llama-style model (hidden 256, 4 layers, GQA 8/2, vocab 8192) and the same
size with interleaved sliding-window layers (Qwen2-style, window 256). Every ratio compares
numbers measured in the same run.

    python benchmarks/bench_engine.py [--threads N] [--json]

One torch thread by default: on a shared 2-core machine more threads mostly add contention
(spin-waiting on tiny matmuls), which made two-thread runs vary by 5-10x between repeats.

* prefill: one 1024-token prompt in one step, and 8 x 256-token prompts in one step;
* decode: 8 requests decoding 64 tokens each after their prefill (decode steps only timed);
* TTFT: 16 requests, each a 960-token shared system prompt plus 32 own tokens, served one
  after another; time from submit to the first generated token, prefix caching on (the
  first request warms the cache) vs off. Best of 3 for every number.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hybridkv.engine.checkpoints import random_model
from hybridkv.engine.llm import LLM
from hybridkv.engine.llm_options import CacheConfig, RequestParams, RuntimeConfig
from hybridkv.sched import SchedulerConfig

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens

SMALL = dict(model_type="llama", vocab_size=8192, hidden_size=256, intermediate_size=1024,
             num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
             max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False)
HYBRID = dict(SMALL, model_type="qwen2", use_sliding_window=True, sliding_window=256,
              layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"])


def tokens(n: int, seed: int, vocab: int = 8192) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def make(path: Path, enable_prefix_caching: bool = True) -> LLM:
    return LLM(path, cache=CacheConfig(block_size=16, num_blocks=2048, enable_prefix_caching=enable_prefix_caching),
               scheduler=SchedulerConfig(max_num_batched_tokens=4096, max_num_seqs=32),
               runtime=RuntimeConfig(device="cpu"))


def best(fn, repeat: int = 3) -> float:
    return min(fn() for _ in range(repeat))


def prefill_tps(path: Path, prompts: list[list[int]]) -> float:
    """Tokens/s of one step prefilling every prompt (caching off, so nothing is skipped)."""
    def once() -> float:
        llm = make(path, enable_prefix_caching=False)
        llm.submit(prompts, max_tokens=1, params=NO_EOS)
        t0 = time.perf_counter()
        llm.engine.step()
        return time.perf_counter() - t0
    return sum(map(len, prompts)) / best(once)


def decode_tps(path: Path, batch: int, steps: int, prompt_len: int = 128) -> float:
    """Decode tokens/s of ``batch`` requests after their prefill step."""
    def once() -> float:
        llm = make(path, enable_prefix_caching=False)
        llm.submit([tokens(prompt_len, 100 + i) for i in range(batch)], max_tokens=steps + 1, params=NO_EOS)
        llm.engine.step()  # prefill (and the first token)
        t0 = time.perf_counter()
        llm.engine.run()
        return time.perf_counter() - t0
    return batch * steps / best(once)


def ttft(path: Path, caching: bool, n: int = 16, system: int = 960, own: int = 32) -> tuple[float, int]:
    """Median time to first token over ``n`` sequential shared-prefix requests (after one
    warm-up request), and the prefix-cache hit tokens of the last one."""
    def once() -> tuple[float, int]:
        llm = make(path, enable_prefix_caching=caching)
        sys_prompt = tokens(system, 1)
        llm.generate([sys_prompt + tokens(own, 2)], max_tokens=1, params=NO_EOS)  # warm-up
        times, hit = [], 0
        for i in range(n):
            (req,) = llm.submit([sys_prompt + tokens(own, 10 + i)], max_tokens=4, params=NO_EOS)
            t0 = time.perf_counter()
            while req.num_output_tokens == 0:
                llm.engine.step()
            times.append(time.perf_counter() - t0)
            llm.engine.run()
            hit = req.num_cached_tokens
        return statistics.median(times), hit
    return min((once() for _ in range(3)), key=lambda x: x[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (default 1; 0: torch's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in (("llama (full)", SMALL), ("qwen2 (full + sliding)", HYBRID)):
            path = random_model(Path(tmp) / name.split()[0], cfg, seed=0)
            make(path).generate([tokens(300, 0)], max_tokens=8, params=NO_EOS)  # warm-up
            r: dict[str, float] = {}
            r["prefill_1x1024_tps"] = prefill_tps(path, [tokens(1024, 3)])
            r["prefill_8x256_tps"] = prefill_tps(path, [tokens(256, 4 + i) for i in range(8)])
            r["decode_b1_tps"] = decode_tps(path, 1, 32)
            r["decode_b8_tps"] = decode_tps(path, 8, 32)
            cold, _ = ttft(path, caching=False)
            warm, hit = ttft(path, caching=True)
            r["ttft_cold_ms"] = cold * 1e3
            r["ttft_hit_ms"], r["hit_tokens"] = warm * 1e3, hit
            r["ttft_speedup"] = r["ttft_cold_ms"] / r["ttft_hit_ms"]
            r["decode_b8_over_b1"] = r["decode_b8_tps"] / r["decode_b1_tps"]
            results[name] = r
    if args.json:
        print(json.dumps({"threads": torch.get_num_threads(), "results": results}, indent=2))
        return
    print(f"torch threads: {torch.get_num_threads()}; CPU; fp32; block size 16; best of 3")
    print(f"{'model':<24}{'prefill 1x1024':>16}{'prefill 8x256':>15}{'decode b1':>11}{'decode b8':>11}"
          f"{'b8/b1':>7}{'TTFT cold':>11}{'TTFT hit':>10}{'hit':>6}{'speedup':>9}")
    for name, r in results.items():
        print(f"{name:<24}{r['prefill_1x1024_tps']:>12.0f} t/s{r['prefill_8x256_tps']:>11.0f} t/s"
              f"{r['decode_b1_tps']:>7.0f} t/s{r['decode_b8_tps']:>7.0f} t/s{r['decode_b8_over_b1']:>7.2f}"
              f"{r['ttft_cold_ms']:>8.1f} ms{r['ttft_hit_ms']:>7.1f} ms{r['hit_tokens']:>6.0f}"
              f"{r['ttft_speedup']:>8.2f}x")


if __name__ == "__main__":
    main()

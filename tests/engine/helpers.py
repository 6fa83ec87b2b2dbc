"""Shared helpers for the engine tests: tiny HF models, a trivial block allocator, a fake
per-sequence block-table owner and the transformers oracle.

The allocator reuses freed blocks first (LIFO) and the tests NaN-poison every freed block and
the null block 0, so any read outside what a sequence owns turns its logits into NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from hybridkv.core.manager import KVCacheManager
from hybridkv.engine.checkpoints import randomize
from hybridkv.core.specs import KVCacheConfig
from hybridkv.engine import PagedCausalLM, PagedKVCache, SequenceInput, load_model, make_kv_cache_config

TOL = 1e-4
NAN = float("nan")


# --------------------------------------------------------------------------- HF models
@dataclass(frozen=True)
class Arch:
    """One tiny architecture under test."""

    name: str
    config_cls: str
    model_cls: str
    kwargs: dict[str, Any]
    block_sizes: dict[str, int]
    scale: dict[str, float] = field(default_factory=dict)
    """Parameters whose name contains a key are multiplied by its value after randomizing."""


GPT_OSS_GATE_UP_SCALE = 6.0
COMMON = dict(vocab_size=128, hidden_size=64, intermediate_size=96, attn_implementation="eager")

ARCHS: dict[str, Arch] = {
    # Llama with GQA, tied embeddings and llama3 RoPE scaling.
    "llama": Arch("llama", "LlamaConfig", "LlamaForCausalLM", dict(
        COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        tie_word_embeddings=True,
        rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                             high_freq_factor=4.0, original_max_position_embeddings=32),
    ), {"full": 16}),
    # Qwen2 with interleaved full/sliding layers (window 12, not a block multiple), q/k/v bias.
    "qwen2_swa": Arch("qwen2_swa", "Qwen2Config", "Qwen2ForCausalLM", dict(
        COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        use_sliding_window=True, sliding_window=12,
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
    ), {"full": 16, "sliding": 8}),
    # Qwen3: per-head q/k norm, head_dim 32 != hidden / heads, sliding layers from max_window_layers.
    "qwen3_swa": Arch("qwen3_swa", "Qwen3Config", "Qwen3ForCausalLM", dict(
        COMMON, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
        attention_bias=True, use_sliding_window=True, sliding_window=9, max_window_layers=1,
    ), {"full": 8, "sliding": 16}),
    # Mistral: every layer sliding (window 10).
    "mistral": Arch("mistral", "MistralConfig", "MistralForCausalLM", dict(
        COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1, sliding_window=10,
    ), {"sliding": 4}),
    # Gemma 3: sandwich norms, (1 + w) RMSNorm, scaled embeddings, GeGLU, separate RoPE base for
    # sliding layers (window 11), query_pre_attn_scalar != head_dim, final logit soft-capping.
    "gemma3": Arch("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", dict(
        COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        query_pre_attn_scalar=24, sliding_window=11, final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
    ), {"full": 8, "sliding": 8}),
    # gpt-oss: alternating sliding (window 7) / full layers, attention sinks, biases, YaRN,
    # top-2 of 4 experts with the clamped SwiGLU at the published limit 7.0, which every
    # transformers version applies; the experts' input weights are scaled up so that the clamp
    # cuts a good share of the activations (tests/engine/test_gpt_oss.py counts it), their output
    # weights down so that attention still dominates (greedy text repeats: n-gram drafts hit).
    "gpt_oss": Arch("gpt_oss", "GptOssConfig", "GptOssForCausalLM", dict(
        COMMON, intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, sliding_window=7, num_local_experts=4, num_experts_per_tok=2,
    ), {"full": 4, "sliding": 4}, scale={"experts.gate_up_proj": GPT_OSS_GATE_UP_SCALE,
                                         "experts.down_proj": GPT_OSS_GATE_UP_SCALE ** -2}),
    # DeepSeek-V3 MLA, no q LoRA, interleaved RoPE, dense MLPs.
    "deepseek": Arch("deepseek", "DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
        q_lora_rank=None, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=12,
        first_k_dense_replace=2, n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=2,
    ), {"mla": 8}),
    # DeepSeek-V3 MLA with q LoRA, half-split RoPE and YaRN (softmax mscale quirk).
    "deepseek_qlora_yarn": Arch("deepseek_qlora_yarn", "DeepseekV3Config", "DeepseekV3ForCausalLM", dict(
        COMMON, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=24,
        q_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, rope_interleave=False,
        attention_bias=True, max_position_embeddings=128,
        first_k_dense_replace=2, n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=2,
        rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                             original_max_position_embeddings=32, mscale=1.0, mscale_all_dim=1.0,
                             beta_fast=32, beta_slow=1),
    ), {"mla": 16}),
}


# State models (recurrent layers + paged full attention): kept out of ARCHS because the engine
# runs them with prefix caching and speculative decoding off (tests/engine/test_state_models.py).
STATE_ARCHS: dict[str, Arch] = {
    # Qwen3-Next: gated delta net layers (2 key heads serving 4 value heads), gated attention with
    # partial RoPE (factor 0.25), MoE (top-2 of 4 + shared expert) except on mlp_only layer 2.
    "qwen3_next": Arch("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM", dict(
        COMMON, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
        linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        shared_expert_intermediate_size=48, decoder_sparse_step=1, mlp_only_layers=[2],
    ), {"full": 8}),
    # Nemotron-H: Mamba2 (4 heads, 2 B/C groups), MLP-only layers, one attention layer (no RoPE).
    "nemotron_h": Arch("nemotron_h", "NemotronHConfig", "NemotronHForCausalLM", dict(
        COMMON, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        layers_block_type=["linear_attention", "mlp", "full_attention", "linear_attention", "mlp"],
        mamba_num_heads=4, mamba_head_dim=8, n_groups=2, ssm_state_size=8, conv_kernel=4, chunk_size=16,
    ), {"full": 8}),
}


# A drafter for the draft-model tests: one Llama layer, the shared vocabulary.
SMALL_DRAFT = Arch("small_draft", "LlamaConfig", "LlamaForCausalLM", dict(
    COMMON, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2,
    num_key_value_heads=1,
), {"full": 8})


def randomize_(module: torch.nn.Module, seed: int) -> None:
    """Give every parameter a distinctive value (the engine's own checkpoint randomizer), so
    swapped or skipped parameters change the logits clearly."""
    randomize(module, seed)


@dataclass
class Built:
    """An HF oracle model and the engine model loaded from its saved directory."""

    arch: Arch
    hf: Any
    model: PagedCausalLM
    path: Path
    _oracle: dict = field(default_factory=dict, repr=False)

    def oracle(self, tokens: Sequence[int]) -> torch.Tensor:
        """transformers' fp32 logits ``[len(tokens), vocab]`` for a full forward (memoized)."""
        key = tuple(int(t) for t in tokens)
        if key not in self._oracle:
            with torch.no_grad():
                self._oracle[key] = self.hf(torch.tensor([list(key)])).logits[0].float()
        return self._oracle[key]

    def kv_config(self, num_blocks: int = 96) -> KVCacheConfig:
        return make_kv_cache_config(self.model, self.arch.block_sizes, num_blocks)


def hf_config_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` as the installed transformers spells them: 4.x has no ``rope_parameters`` (it
    takes ``rope_theta`` plus a ``rope_scaling`` dict), so the 5.x spelling is translated."""
    import transformers

    if int(transformers.__version__.split(".")[0]) >= 5 or "rope_parameters" not in kwargs:
        return dict(kwargs)
    out = dict(kwargs)
    rope = dict(out.pop("rope_parameters"))
    out["rope_theta"] = rope.pop("rope_theta")
    if rope.get("rope_type", "default") != "default":
        out["rope_scaling"] = rope
    return out


def build(arch: Arch, directory: Path, seed: int = 0) -> Built:
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, arch.config_cls)(**hf_config_kwargs(arch.kwargs))
    hf = getattr(transformers, arch.model_cls)(config).eval()
    randomize_(hf, seed)
    with torch.no_grad():
        for name, p in hf.named_parameters():
            for key, factor in arch.scale.items():
                if key in name:
                    p.mul_(factor)
    hf.save_pretrained(directory)
    return Built(arch, hf, load_model(directory), directory)


# --------------------------------------------------------------------------- block tables
class Allocator:
    """Trivial ref-counted block pool; freed blocks are reused first and NaN-poisoned."""

    def __init__(self, cache: PagedKVCache) -> None:
        self.cache = cache
        self.free_ids = list(range(cache.num_blocks - 1, 0, -1))
        self.refs: dict[int, int] = {}

    def alloc(self) -> int:
        block = self.free_ids.pop()
        self.refs[block] = 1
        return block

    def share(self, block: int) -> int:
        self.refs[block] += 1
        return block

    def free(self, block: int) -> None:
        self.refs[block] -= 1
        if self.refs[block] == 0:
            del self.refs[block]
            self.cache.fill_blocks([block], NAN)
            self.free_ids.append(block)


@dataclass
class TableOwner:
    """Stands in for the block manager for one sequence: grows its block tables, nulls and frees
    sliding-window blocks no future query can read, and shares prefix blocks."""

    alloc: Allocator
    tokens: list[int] = field(default_factory=list)
    computed: int = 0
    tables: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.tables:
            self.tables = [[] for _ in self.alloc.cache.config.groups]

    def share_prefix(self, other: TableOwner, num_tokens: int) -> None:
        """Prefix-cache hit: reuse ``other``'s blocks for the first ``num_tokens`` tokens."""
        assert self.computed == 0 and self.tokens[:num_tokens] == other.tokens[:num_tokens]
        for gi, group in enumerate(self.alloc.cache.config.groups):
            bs = group.spec.block_size
            assert num_tokens % bs == 0
            window = group.spec.window_tokens
            lo = 0 if window is None else max(0, num_tokens - window + 1)
            for j in range(num_tokens // bs):
                block = other.tables[gi][j]
                needed = (j + 1) * bs > lo
                self.tables[gi].append(self.alloc.share(block) if needed and block else 0)
        self.computed = num_tokens

    def step(self, num_new: int) -> SequenceInput:
        """Input for the next ``num_new`` tokens of ``self.tokens``; call :meth:`done` after."""
        start, end = self.computed, self.computed + num_new
        assert end <= len(self.tokens)
        for gi, group in enumerate(self.alloc.cache.config.groups):
            bs, window, table = group.spec.block_size, group.spec.window_tokens, self.tables[gi]
            if window is not None:  # blocks wholly before the first query's window
                lo = max(0, start - window + 1)
                for j in range(lo // bs):
                    if table[j]:
                        self.alloc.free(table[j])
                        table[j] = 0
            while len(table) * bs < end:
                table.append(self.alloc.alloc())
        return SequenceInput(self.tokens[start:end], start, [list(t) for t in self.tables])

    def done(self, num_new: int) -> None:
        self.computed += num_new


def new_cache(built: Built, num_blocks: int = 96) -> tuple[PagedKVCache, Allocator]:
    """A cache whose null block is NaN everywhere, plus its allocator."""
    cache = PagedKVCache(built.kv_config(num_blocks))
    cache.fill_blocks([0], NAN)
    return cache, Allocator(cache)


def oracle_diff(built: Built, outputs: Sequence[Any]) -> float:
    """Largest |engine - transformers| over every logits row the engine computed for the
    outputs of an ``LLM(runtime=RuntimeConfig(record_logits=True))`` (recomputed positions included). Also checks that
    each generated token is the oracle's argmax wherever the oracle's top-2 margin is clear."""
    worst = 0.0
    for out in outputs:
        full = list(out.prompt_token_ids) + list(out.token_ids)
        ref = built.oracle(full)
        positions, rows = out.logits
        assert positions, f"{out.request_id}: no logits recorded"
        assert max(positions) < len(full) - 1 or not out.token_ids
        worst = max(worst, max_diff(rows, ref[positions]))
        p = len(out.prompt_token_ids)
        for i, tok in enumerate(out.token_ids):
            top2 = ref[p - 1 + i].topk(2).values
            if float(top2[0] - top2[1]) > 1e-3:
                assert tok == int(ref[p - 1 + i].argmax()), f"{out.request_id}: token {i} is not greedy"
    return worst


def blocks_for(llm: Any, tokens: int) -> int:
    """Blocks one request of ``tokens`` tokens can hold at most (the manager's fit rule)."""
    return KVCacheManager.blocks_for_request(llm.kv_config, tokens,
                                             retention_interval=llm.kv.retention_interval,
                                             vllm_compat=llm.kv.vllm_compat)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max())


def random_tokens(n: int, seed: int, vocab: int = 128) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (n,), generator=g).tolist()


def null_block_is_nan(cache: PagedKVCache) -> bool:
    """True when block 0 of every layer still holds only NaN (nothing wrote it)."""
    for name in cache.layer_names:
        t = cache.layer(name)
        page = t[:, 0] if t.dim() == 5 else t[0]
        if not torch.isnan(page).all():
            return False
    return True


# --------------------------------------------------------------------------- LLM options
def llm_options(**options: Any) -> dict[str, Any]:
    """Short test call sites: route flat option names (``num_blocks=64, device="cpu"``,
    ``kv_store=store``) to the LLM's config objects by their field names; ``spec`` passes
    through, with ``draft_model`` it becomes a ``SpeculativeConfig``. An unknown name raises
    (so a typo is not silently ignored)."""
    from dataclasses import fields, replace

    from hybridkv.engine.llm_options import (ENGINE_SCHEDULER, CacheConfig, RuntimeConfig, SpeculativeConfig,
                                             StoreConfig)

    out: dict[str, Any] = {}
    for arg, default in (("cache", CacheConfig()), ("scheduler", ENGINE_SCHEDULER),
                         ("runtime", RuntimeConfig()), ("store", StoreConfig())):
        names = {f.name for f in fields(default)}
        mine = {k: options.pop(k) for k in list(options) if k in names}
        if mine:
            out[arg] = replace(default, **mine)
    draft_model = options.pop("draft_model", None)
    if draft_model is not None:
        options["spec"] = SpeculativeConfig(options.pop("spec"), draft_model=draft_model)
    unknown = set(options) - {"spec"}
    if unknown:
        raise TypeError(f"unknown LLM options {sorted(unknown)}")
    return {**out, **options}


def build_llm(path: Any, **options: Any):
    """``LLM(path, ...)`` from flat options (see :func:`llm_options`)."""
    from hybridkv.engine.llm import LLM

    return LLM(path, **llm_options(**options))

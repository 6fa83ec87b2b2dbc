"""Model presets for the simulator, built from published configurations (the GPU presets live
in :mod:`hybridkv.cost.gpus` and are re-exported here).

Every number cites its source: the Hugging Face ``config.json`` field it comes from (the repo
is named on each preset). Layers are grouped
vLLM-style: one :class:`~hybridkv.core.specs.KVCacheGroup` per attention type, layer names
``layers.<i>`` in model order (``mtp.<i>`` for speculative draft layers).

Presets are plain data; :meth:`ModelPreset.with_block_size` gives a copy with another block
size, :meth:`ModelPreset.with_weight_dtype` one whose weights run in FP8 (or BF16), and
:meth:`ModelPreset.kv_config` a :class:`~hybridkv.core.specs.KVCacheConfig`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hybridkv.core.specs import (
    MLA,
    AttentionSpec,
    ChunkedLocal,
    CompressorState,
    FullAttention,
    KVCacheConfig,
    KVCacheGroup,
    SlidingWindow,
    SparseMLA,
    StateSpec,
    is_state,
)
from hybridkv.core.validation import check_int
from hybridkv.cost.gpus import GPU_PRESETS, WEIGHT_DTYPES, GpuPreset, get_gpu
from hybridkv.cost.shapes import MLAShape, ModelShapes, MoEShape, StateShape

__all__ = [
    "GPU_PRESETS",
    "MODEL_PRESETS",
    "GpuPreset",
    "WEIGHT_DTYPES",
    "ModelPreset",
    "get_gpu",
    "get_preset",
    "vllm_align_block_size",
]

DEFAULT_BLOCK_SIZE = 16
"""vLLM's default block size for full-attention / SWA models."""



@dataclass(frozen=True, slots=True)
class ModelPreset:
    """A model as the KV-cache manager and the cost model see it.

    Attributes:
        name: preset name (see :data:`MODEL_PRESETS`).
        groups: KV-cache groups at the preset's default block sizes (the first group is the
            *main* group; its block size is :attr:`block_size`).
        num_params: total parameters (for weight bytes).
        active_params: parameters used per token (= ``num_params`` for dense models; the
            routed-expert subset for MoE).
        num_layers: decoder layers of the target model (draft layers not counted).
        hidden_size: model width.
        attn_width: query width per layer, ``num_attention_heads * head_dim`` (for MLA the mean
            of the QK and V head dims times the heads); attention costs ``4 * attn_width`` FLOPs
            per (query, key) pair per layer.
        weight_bytes_per_param: bytes per parameter of the released checkpoint's weights.
        gemm_dtype: the dtype the weight GEMMs run in, a key of :data:`WEIGHT_DTYPES`: the
            cost models charge their FLOPs at the GPU's peak for it
            (:meth:`GpuPreset.gemm_flops`); attention stays at the BF16 peak.
        spec_decode: default speculative decoding as ``(method, num_speculative_tokens)``, or None.
        source: where the numbers come from.
        shapes: layer widths (MLP, vocabulary, MoE, MLA, recurrent heads) for the calibrated
            cost model and the profiler, or None (the cost model then treats every parameter
            as a per-token GEMM weight and takes the query heads from ``attn_width``).
        context_len: the model's context length in tokens (its ``config.json``
            ``max_position_embeddings``), or None where the preset does not know it (the
            illustrative presets). A prompt that reaches it cannot run on the real model
            (:func:`hybridkv.sim.traffic.workload_fit.context_warning`).
        eagle3_drafter: the KV-cache group of the model's published EAGLE-3 drafter (its
            decoder layer, ``is_draft``), which :meth:`with_drafter` adds for ``eagle3``
            speculative decoding; None where no drafter is recorded (the drafter's KV is then
            not counted).
    """

    name: str
    groups: tuple[KVCacheGroup, ...]
    num_params: int
    active_params: int
    num_layers: int
    hidden_size: int
    attn_width: int
    weight_bytes_per_param: float = 2.0
    gemm_dtype: str = "bf16"
    spec_decode: tuple[str, int] | None = None
    source: str = ""
    shapes: ModelShapes | None = None
    context_len: int | None = None
    eagle3_drafter: KVCacheGroup | None = None

    def __post_init__(self) -> None:
        if not self.groups:
            raise ValueError(f"ModelPreset {self.name!r} has no groups")
        if not 0 < self.active_params <= self.num_params:
            raise ValueError(
                f"ModelPreset {self.name!r}: need 0 < active_params <= num_params, got "
                f"{self.active_params} and {self.num_params}"
            )
        if self.gemm_dtype not in WEIGHT_DTYPES:
            raise ValueError(f"ModelPreset {self.name!r}: gemm_dtype must be one of "
                             f"{', '.join(WEIGHT_DTYPES)}, got {self.gemm_dtype!r}")

    @property
    def block_size(self) -> int:
        """Block size of the main (first) group."""
        return self.groups[0].spec.block_size

    @property
    def target_groups(self) -> tuple[KVCacheGroup, ...]:
        """Groups of the target model (draft groups excluded)."""
        return tuple(g for g in self.groups if not g.is_draft)

    def with_block_size(self, block_size: int) -> ModelPreset:
        """A copy whose main group has ``block_size`` tokens per block.

        Every group's block size is scaled by ``block_size / self.block_size`` so ratios between
        groups are kept (for single-block-size presets every group gets ``block_size``).

        Raises:
            ValueError: if a scaled size is not a positive integer, or the new sizes break a
                spec's constraint (chunk or MLA compression divisibility).
        """
        check_int("block_size", block_size, 1)
        new_groups = []
        for g in self.groups:
            scaled = g.spec.block_size * block_size
            if scaled % self.block_size:
                raise ValueError(
                    f"{self.name}: block size {block_size} scales group {g.name!r} "
                    f"(block {g.spec.block_size} at main block {self.block_size}) to a "
                    f"non-integer size; use a multiple of "
                    f"{self.block_size // math.gcd(self.block_size, g.spec.block_size)}"
                )
            spec = dataclasses.replace(g.spec, block_size=scaled // self.block_size)
            new_groups.append(dataclasses.replace(g, spec=spec))
        return dataclasses.replace(self, groups=tuple(new_groups))

    def with_weight_dtype(self, dtype: str | None) -> ModelPreset:
        """A copy run in weight dtype ``dtype`` (a key of :data:`WEIGHT_DTYPES`): its weights
        take that many bytes per parameter and its GEMMs run in it. None: this preset."""
        if dtype is None:
            return self
        if dtype not in WEIGHT_DTYPES:
            raise ValueError(f"unknown weight dtype {dtype!r}; valid: {', '.join(WEIGHT_DTYPES)}")
        return dataclasses.replace(self, weight_bytes_per_param=WEIGHT_DTYPES[dtype], gemm_dtype=dtype)

    def with_drafter(self, method: str | None, shared: bool = False) -> ModelPreset:
        """This preset with the drafter's KV of speculative ``method`` (at the main group's
        block size): ``eagle3`` adds :attr:`eagle3_drafter` when the preset records one and has
        no draft group yet; anything else returns the preset unchanged.

        ``shared=False``: the drafter's layers are a group of their own. Every block id spans
        the largest group's layer slots, so a one-layer drafter group pays as many bytes per
        block as the target's largest group (vllm#50169, #54661). ``shared=True``: they join
        the first target group with the same spec, which then carries the draft mark (its
        blocks prove the drafter's boundary in drop mode); one block id per token block then
        holds target and drafter alike.

        Raises:
            ValueError: ``shared`` and no target group has the drafter's spec (naming them).
        """
        d = self.eagle3_drafter
        if method != "eagle3" or d is None or any(g.is_draft for g in self.groups):
            return self
        spec = dataclasses.replace(d.spec, block_size=self.block_size)
        if not shared:
            return dataclasses.replace(self, groups=self.groups + (dataclasses.replace(d, spec=spec),))
        for i, g in enumerate(self.groups):
            if g.spec == spec:
                host = dataclasses.replace(g, layer_names=g.layer_names + d.layer_names, is_draft=True)
                return dataclasses.replace(self, groups=self.groups[:i] + (host,) + self.groups[i + 1:])
        raise ValueError(
            f"{self.name}: no target group has the drafter's spec {spec!r} to share; groups: "
            f"{', '.join(f'{g.name} {type(g.spec).__name__}' for g in self.groups)}")

    def kv_bytes_per_token(self) -> dict[str, int]:
        """KV bytes one token costs per group (summed over the group's layers), plus ``"total"``."""
        out = {g.name: g.spec.bytes_per_token * len(g.layer_names) for g in self.groups}
        out["total"] = sum(out.values())
        return out

    def kv_config(self, *, num_blocks: int | None = None, memory_bytes: int | None = None) -> KVCacheConfig:
        """The :class:`KVCacheConfig` of this preset's groups (give one of the two sizes)."""
        if num_blocks is None:                   # not given: KVCacheConfig's default (None)
            return KVCacheConfig(self.groups, memory_bytes=memory_bytes)
        return KVCacheConfig(self.groups, num_blocks=num_blocks, memory_bytes=memory_bytes)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights."""
        return self.num_params * self.weight_bytes_per_param


def _layers(indices: list[int], prefix: str = "layers") -> tuple[str, ...]:
    return tuple(f"{prefix}.{i}" for i in indices)


def _parts(indices: Iterable[int], part: str) -> tuple[str, ...]:
    return tuple(f"layers.{i}.{part}" for i in indices)


def _group(name: str, spec: AttentionSpec, indices: list[int], *, prefix: str = "layers",
           is_draft: bool = False) -> KVCacheGroup:
    return KVCacheGroup(name, spec, _layers(indices, prefix), is_draft=is_draft)


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


def llama_3_1_8b() -> ModelPreset:
    """meta-llama/Llama-3.1-8B(-Instruct): dense, 32 full-attention layers, GQA 8 KV heads."""
    # config.json: num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
    # num_key_value_heads=8, head_dim = hidden_size / num_attention_heads = 128, torch_dtype=bfloat16.
    spec = FullAttention(block_size=DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=128)
    return ModelPreset(
        name="llama-3.1-8b",
        groups=(_group("full", spec, list(range(32))),),
        num_params=8_030_000_000,  # model card: 8.03B parameters
        active_params=8_030_000_000,
        num_layers=32,
        hidden_size=4096,
        attn_width=32 * 128,
        source="hf.co/meta-llama/Llama-3.1-8B config.json",
        # config.json: intermediate_size=14336, vocab_size=128256, tie_word_embeddings=false.
        shapes=ModelShapes(hidden_size=4096, num_heads=32, head_dim=128, intermediate_size=14336,
                           vocab_size=128256),
        context_len=131_072,  # config.json: max_position_embeddings=131072
        # EAGLE-3 drafter yuhuili/EAGLE3-LLaMA3.1-Instruct-8B (config.json: one Llama decoder
        # layer, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096): head_dim 128.
        eagle3_drafter=_group("eagle3", FullAttention(block_size=DEFAULT_BLOCK_SIZE, num_kv_heads=8,
                                                      head_dim=128), [0], prefix="eagle3", is_draft=True),
    )


def gemma_3_27b() -> ModelPreset:
    """google/gemma-3-27b-it: 62 layers, 5 sliding (window 1024) : 1 global."""
    # config.json text_config: num_hidden_layers=62, hidden_size=5376, num_attention_heads=32,
    # num_key_value_heads=16, head_dim=128, sliding_window=1024, sliding_window_pattern=6
    # (layer i is global iff (i + 1) % 6 == 0: 10 global, 52 sliding).
    full = [i for i in range(62) if (i + 1) % 6 == 0]
    local = [i for i in range(62) if (i + 1) % 6 != 0]
    return ModelPreset(
        name="gemma-3-27b",
        groups=(
            _group("full", FullAttention(DEFAULT_BLOCK_SIZE, num_kv_heads=16, head_dim=128), full),
            _group("swa", SlidingWindow(DEFAULT_BLOCK_SIZE, num_kv_heads=16, head_dim=128,
                                        window=1024), local),
        ),
        # Gemma 3 technical report, Table 1 (27B): 1,416M embedding + 25,600M non-embedding
        # parameters; the 417M SigLIP vision encoder is excluded (not run per text token).
        num_params=27_016_000_000,
        active_params=27_016_000_000,
        num_layers=62,
        hidden_size=5376,
        attn_width=32 * 128,
        source="hf.co/google/gemma-3-27b-it config.json",
        # config.json text_config: intermediate_size=21504, vocab_size=262208; Gemma ties the
        # LM head to the embedding.
        shapes=ModelShapes(hidden_size=5376, num_heads=32, head_dim=128, intermediate_size=21504,
                           vocab_size=262208, tie_word_embeddings=True),
        context_len=131_072,  # config.json text_config: max_position_embeddings=131072 (128K context)
    )


def gpt_oss_120b() -> ModelPreset:
    """openai/gpt-oss-120b: 36 layers alternating sliding (128) and full attention, MoE."""
    # config.json: num_hidden_layers=36, hidden_size=2880, num_attention_heads=64,
    # num_key_value_heads=8, head_dim=64, sliding_window=128, layer_types alternates
    # "sliding_attention" (even i) / "full_attention" (odd i); num_local_experts=128,
    # num_experts_per_tok=4. Model card: 116.8B total, 5.1B active parameters; MoE weights in
    # MXFP4 (~4.25 bits), the rest bf16 -> about 0.55 bytes per parameter (estimate).
    return ModelPreset(
        name="gpt-oss-120b",
        groups=(
            _group("full", FullAttention(DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=64),
                   list(range(1, 36, 2))),
            _group("swa", SlidingWindow(DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=64, window=128),
                   list(range(0, 36, 2))),
        ),
        num_params=116_800_000_000,
        active_params=5_100_000_000,
        num_layers=36,
        hidden_size=2880,
        attn_width=64 * 64,
        weight_bytes_per_param=0.55,
        source="hf.co/openai/gpt-oss-120b config.json; OpenAI gpt-oss model card",
        # config.json: intermediate_size=2880 (per expert), vocab_size=201088, untied.
        shapes=ModelShapes(hidden_size=2880, num_heads=64, head_dim=64, intermediate_size=0,
                           vocab_size=201088, moe=MoEShape(128, 4, 2880)),
        context_len=131_072,  # config.json: max_position_embeddings=131072
    )


def llama_4_scout() -> ModelPreset:
    """meta-llama/Llama-4-Scout-17B-16E: chunked local attention (8192) on 3 of 4 layers."""
    # config.json text_config: num_hidden_layers=48, hidden_size=5120, num_attention_heads=40,
    # num_key_value_heads=8, head_dim=128, attention_chunk_size=8192, no_rope_layers: every 4th
    # layer (i % 4 == 3) is a NoPE global (full) layer, the others use RoPE + chunked attention;
    # num_local_experts=16. Model card: 109B total, 17B active parameters.
    full = [i for i in range(48) if i % 4 == 3]
    chunked = [i for i in range(48) if i % 4 != 3]
    return ModelPreset(
        name="llama-4-scout",
        groups=(
            _group("full", FullAttention(DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=128), full),
            _group("chunked", ChunkedLocal(DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=128,
                                           chunk_size=8192), chunked),
        ),
        num_params=109_000_000_000,
        active_params=17_000_000_000,
        num_layers=48,
        hidden_size=5120,
        attn_width=40 * 128,
        source="hf.co/meta-llama/Llama-4-Scout-17B-16E config.json",
        # config.json text_config: intermediate_size=8192 (per expert, and the shared expert),
        # num_experts_per_tok=1, vocab_size=202048, untied; every layer is MoE.
        shapes=ModelShapes(hidden_size=5120, num_heads=40, head_dim=128, intermediate_size=0,
                           vocab_size=202048, moe=MoEShape(16, 1, 8192, 8192)),
        context_len=10_485_760,  # config.json text_config: max_position_embeddings=10485760 (10M context)
    )


# DeepSeek-V3 config.json: q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
# qk_rope_head_dim=64, v_head_dim=128, n_routed_experts=256, num_experts_per_tok=8,
# moe_intermediate_size=2048, n_shared_experts=1, intermediate_size=18432 (the first 3 dense
# layers; the shapes record the MoE layers), first_k_dense_replace=3, vocab_size=129280, untied.
_DEEPSEEK_V3_SHAPES = ModelShapes(
    hidden_size=7168, num_heads=128, head_dim=192, intermediate_size=18432, vocab_size=129280,
    moe=MoEShape(256, 8, 2048, 2048, dense_layers=3), mla=MLAShape(1536, 512, 128, 64, 128))


def deepseek_v3() -> ModelPreset:
    """deepseek-ai/DeepSeek-V3: 61 MLA layers (one 576-value latent per token), MoE, FP8 weights."""
    # config.json: num_hidden_layers=61, hidden_size=7168, kv_lora_rank=512,
    # qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, num_attention_heads=128,
    # num_nextn_predict_layers=1 (MTP, not enabled by default here), quantization fp8.
    # Paper / model card: 671B total, 37B active parameters (+14B MTP module).
    spec = MLA(block_size=64, kv_lora_rank=512, qk_rope_head_dim=64)  # vLLM's MLA block size
    return ModelPreset(
        name="deepseek-v3",
        groups=(_group("mla", spec, list(range(61))),),
        num_params=671_000_000_000,
        active_params=37_000_000_000,
        num_layers=61,
        hidden_size=7168,
        attn_width=128 * (128 + 64 + 128) // 2,  # heads * mean(qk head dim 192, v head dim 128)
        weight_bytes_per_param=1.0,
        source="hf.co/deepseek-ai/DeepSeek-V3 config.json; DeepSeek-V3 technical report",
        shapes=_DEEPSEEK_V3_SHAPES,
        context_len=163_840,  # config.json: max_position_embeddings=163840
    )


def deepseek_v4_style() -> ModelPreset:
    """A DeepSeek-V4-*style* hybrid. ILLUSTRATIVE, NOT an official DeepSeek-V4 configuration.

    Shape chosen to exercise the manager: an MLA full-attention group (block 256), two sliding
    window groups with smaller blocks (block 64 / window 512 and block 8 / window 128) and an
    MTP draft group (one MLA layer, ``is_draft=True``) with ``("mtp", 1)`` speculative decoding.
    Sizes (61 layers, width 7168, 671B / 37B parameters, FP8) are borrowed from DeepSeek-V3.
    """
    full = [i for i in range(61) if i % 2 == 0]          # 31 layers
    swa_wide = [i for i in range(61) if i % 4 == 1]      # 15 layers
    swa_narrow = [i for i in range(61) if i % 4 == 3]    # 15 layers
    return ModelPreset(
        name="deepseek-v4-style",
        groups=(
            _group("mla", MLA(block_size=256, kv_lora_rank=512, qk_rope_head_dim=64), full),
            # the sliding groups store one 512-wide latent per token (illustrative)
            _group("swa512", SlidingWindow(64, window=512, num_kv_heads=1, head_dim=512), swa_wide),
            _group("swa128", SlidingWindow(8, window=128, num_kv_heads=1, head_dim=512), swa_narrow),
            _group("mtp", MLA(block_size=256, kv_lora_rank=512, qk_rope_head_dim=64), [0],
                   prefix="mtp", is_draft=True),
        ),
        num_params=671_000_000_000,
        active_params=37_000_000_000,
        num_layers=61,
        hidden_size=7168,
        attn_width=128 * (128 + 64 + 128) // 2,
        weight_bytes_per_param=1.0,
        spec_decode=("mtp", 1),
        source="illustrative; sizes from DeepSeek-V3 (not an official DeepSeek-V4 config)",
        shapes=_DEEPSEEK_V3_SHAPES,
        context_len=None,  # illustrative preset: no published context length
    )


def deepseek_v4_flash() -> ModelPreset:
    """deepseek-ai/DeepSeek-V4-Flash: 43 layers of hybrid compressed attention in five KV groups.

    Every layer attends to a 128-token sliding window; 21 layers add compressed sparse
    attention (CSA: one latent per 4 tokens, an indexer picks the top 512) and 20 heavily
    compressed attention (HCA: one latent per 128 tokens). vLLM keeps five KV-cache groups:
    the compressed latents (block 256, full history), the sliding windows in two groups of 22
    layers (block 64; the MTP layer is the 44th), and the two compressors' input buffers
    (block 4, window 8: ratio 4 with overlapping groups; block 8, window 128: ratio 128).
    """
    # config.json: num_hidden_layers=43, hidden_size=4096, num_attention_heads=64,
    # num_key_value_heads=1, head_dim=512, qk_rope_head_dim=64, q_lora_rank=1024,
    # sliding_window=128, compress_ratios=[0, 0, 4, 128, 4, ..., 128, 4, 0] (layers 0-1 window
    # only; layers 2, 4, ..., 42 ratio 4; 3, 5, ..., 41 ratio 128; the trailing 0 is the MTP
    # layer), index_head_dim=128, index_topk=512, num_nextn_predict_layers=1,
    # n_routed_experts=256, num_experts_per_tok=6, moe_intermediate_size=2048,
    # vocab_size=129280, max_position_embeddings=1048576, expert_dtype fp4, fp8 weights else.
    # Block sizes {256, 64, 4, 8} and five groups: vllm#42948 (13,440 blocks for a 32K prefix:
    # 128 + 512 + 512 + 8,192 + 4,096), vllm#51163 (256 CSA/MLA, 64 sliding window, 8 and 4
    # the C128 and C4 compressor states); the windows 128, 128, 8, 128 as in the hybrid table
    # of ModelEngine-Group/unified-cache-management#1322.
    # Bytes: a latent is 448 + 64 values at fp8 (FlashMLA's V4 layout adds scales: 584 B), an
    # indexer key 128 fp8 values; vLLM gives a group one spec, so the HCA layers take the CSA
    # layers' page (assumed; it pads them alike). The compressor buffers hold the KV and gate
    # projections (2 x 512 values) in fp32 (an estimate).
    csa = list(range(2, 43, 2))                           # 21 layers, ratio 4
    hca = list(range(3, 42, 2))                           # 20 layers, ratio 128
    window = SlidingWindow(64, num_kv_heads=1, head_dim=256, dtype="fp8", window=128)  # 512 B/token
    compressed = SparseMLA(256, kv_lora_rank=448, qk_rope_head_dim=64, compress_ratio=4, dtype="fp8",
                           index_head_dim=128)
    return ModelPreset(
        name="deepseek-v4-flash",
        groups=(   # a layer's parts live in several groups: layers.<i>.<part>
            KVCacheGroup("compressed", compressed, _parts(sorted(csa + hca), "compressed")),
            KVCacheGroup("swa_a", window, _parts(range(22), "swa")),
            KVCacheGroup("swa_b", window, _parts(range(22, 43), "swa") + ("mtp.0.swa",), is_draft=True),
            KVCacheGroup("c4_state", CompressorState(4, num_kv_heads=2, head_dim=512, dtype="float32",
                                                       window=8, compress_ratio=4),
                         _parts(csa, "compressor")),
            KVCacheGroup("c128_state", CompressorState(8, num_kv_heads=2, head_dim=512, dtype="float32",
                                                         window=128, compress_ratio=128),
                         _parts(hca, "compressor")),
        ),
        # model card: 284B total parameters, 13B activated per token
        num_params=284_000_000_000,
        active_params=13_000_000_000,
        num_layers=43,
        hidden_size=4096,
        attn_width=64 * 512,
        weight_bytes_per_param=0.55,   # fp4 experts (~277B parameters) + fp8 rest: an estimate
        spec_decode=("mtp", 1),
        source="hf.co/deepseek-ai/DeepSeek-V4-Flash config.json; KV groups: vllm#42948, "
               "vllm#51163, unified-cache-management#1322",
        shapes=ModelShapes(hidden_size=4096, num_heads=64, head_dim=512, intermediate_size=0,
                           vocab_size=129280, moe=MoEShape(256, 6, 2048, 2048)),
        context_len=1_048_576,  # config.json: max_position_embeddings=1048576
    )


def _state_groups(name: str, spec: StateSpec, indices: list[int], per_group: int) -> list[KVCacheGroup]:
    """Recurrent layers split into groups of ``per_group`` layers (the attention group's layer
    count, so every layer slot of a block id is used; docs/state-groups.md §2.2). The groups
    have one spec: the manager looks them up together."""
    return [_group(f"{name}{k}", spec, indices[i:i + per_group])
            for k, i in enumerate(range(0, len(indices), per_group))]


def qwen3_next_80b_a3b() -> ModelPreset:
    """Qwen/Qwen3-Next-80B-A3B(-Instruct): 36 gated-delta-net + 12 gated full-attention layers, MoE.

    The recurrent layers are state groups (checkpoint granularity = the attention block size,
    16 tokens, independent of the state's size): a 200-token shared prompt can hit 192 tokens.
    """
    # config.json (= transformers' Qwen3NextConfig defaults): num_hidden_layers=48,
    # full_attention_interval=4 (layers 3, 7, ..., 47 full attention), hidden_size=2048,
    # num_attention_heads=16, num_key_value_heads=2, head_dim=256, linear_num_key_heads=16,
    # linear_num_value_heads=32, linear_key_head_dim=128, linear_value_head_dim=128,
    # linear_conv_kernel_dim=4, bf16 weights. Model card: 80B total, 3B activated.
    # GDN state per layer: conv (k - 1) x (2*16*128 + 32*128) bf16, recurrent 32 x 128 x 128
    # fp32 (the state dtype vLLM keeps) = 2,146,304 B.
    full = [i for i in range(48) if i % 4 == 3]
    gdn = [i for i in range(48) if i % 4 != 3]
    state = StateSpec(DEFAULT_BLOCK_SIZE, conv_shape=(3, 2 * 16 * 128 + 32 * 128), conv_dtype="bfloat16",
                      state_shape=(32, 128, 128), state_dtype="float32")
    return ModelPreset(
        name="qwen3-next-80b-a3b",
        groups=(_group("full", FullAttention(DEFAULT_BLOCK_SIZE, num_kv_heads=2, head_dim=256), full),
                *_state_groups("gdn", state, gdn, len(full))),
        num_params=80_000_000_000,
        active_params=3_000_000_000,
        num_layers=48,
        hidden_size=2048,
        attn_width=16 * 256,
        # config.json: moe_intermediate_size=512, shared_expert_intermediate_size=512,
        # num_experts=512, num_experts_per_tok=10, vocab_size=151936, untied.
        shapes=ModelShapes(hidden_size=2048, num_heads=16, head_dim=256, intermediate_size=0,
                           vocab_size=151936, moe=MoEShape(512, 10, 512, 512),
                           state=StateShape("gated-delta-net", 32, 128, 128)),
        source="hf.co/Qwen/Qwen3-Next-80B-A3B-Instruct config.json (transformers Qwen3NextConfig "
               "defaults); model card (80B total, 3B activated)",
        context_len=262_144,  # config.json: max_position_embeddings=262144
    )


def nemotron_h_8b() -> ModelPreset:
    """A Nemotron-H-8B-*like* hybrid: 24 Mamba2 + 4 attention layers (+ 24 MLP layers, no KV).

    Per-layer shapes are transformers' ``NemotronHConfig`` defaults (Mamba2: 128 heads x 64,
    8 groups x 128 state, conv kernel 4; attention: 32 heads, 8 KV heads x 128, no RoPE); the
    layer counts and the 8B size follow the Nemotron-H paper (arXiv 2504.03624, 8B: 52 layers
    of which 24 Mamba2, 4 self-attention, 24 FFN). The attention layer positions are
    illustrative (they do not change the cache).
    """
    mamba_heads, head_dim, groups, state_size = 128, 64, 8, 128
    attn = [7, 18, 29, 40]
    mamba = [i for i in range(52) if i % 2 == 0 and i not in attn][:24]
    state = StateSpec(DEFAULT_BLOCK_SIZE, conv_shape=(3, mamba_heads * head_dim + 2 * groups * state_size),
                      conv_dtype="bfloat16", state_shape=(mamba_heads, head_dim, state_size),
                      state_dtype="float32")
    return ModelPreset(
        name="nemotron-h-8b",
        groups=(_group("attn", FullAttention(DEFAULT_BLOCK_SIZE, num_kv_heads=8, head_dim=128), attn),
                *_state_groups("mamba", state, mamba, len(attn))),
        num_params=8_000_000_000,
        active_params=8_000_000_000,
        num_layers=28,        # the layers that keep a cache; the 24 MLP-only blocks keep none
        hidden_size=4096,
        attn_width=32 * 128,
        # NemotronHConfig defaults: intermediate_size=21504 (squared-ReLU MLP; the profiler
        # times a SwiGLU of the same parameter count), vocab_size=131072, untied.
        shapes=ModelShapes(hidden_size=4096, num_heads=32, head_dim=128,
                           intermediate_size=21504 * 2 // 3, vocab_size=131072,
                           state=StateShape("mamba2", 128, 128, 64)),
        source="illustrative layer layout; shapes from transformers NemotronHConfig defaults, "
               "counts from the Nemotron-H paper (arXiv 2504.03624)",
        context_len=None,  # a Nemotron-H-8B-like shape: its context length is not stated here
    )


def vllm_align_block_size(preset: ModelPreset) -> int:
    """The attention block size vLLM 0.33 forces on a hybrid with recurrent layers ("align"
    mode): the smallest multiple of 16 tokens whose attention page holds one layer's state
    (``unify_kv_cache_spec_page_size``; 1056 for Qwen3-Next with fp32 state). Raises
    ValueError for a preset without state groups."""
    states = [g.spec.page_size_bytes for g in preset.groups if is_state(g.spec)]
    attn = [g.spec.bytes_per_token for g in preset.groups if not is_state(g.spec)]
    if not states or not attn:
        raise ValueError(f"preset {preset.name!r} has no state group next to attention; "
                         "vLLM's forced block size applies to hybrids with recurrent layers")
    tokens = -(-max(states) // min(attn))
    return -(-tokens // 16) * 16


MODEL_PRESETS: dict[str, Callable[[], ModelPreset]] = {
    "llama-3.1-8b": llama_3_1_8b,
    "gemma-3-27b": gemma_3_27b,
    "gpt-oss-120b": gpt_oss_120b,
    "llama-4-scout": llama_4_scout,
    "deepseek-v3": deepseek_v3,
    "deepseek-v4-style": deepseek_v4_style,
    "deepseek-v4-flash": deepseek_v4_flash,
    "qwen3-next-80b-a3b": qwen3_next_80b_a3b,
    "nemotron-h-8b": nemotron_h_8b,
}
"""Model presets by name (each value builds a fresh preset)."""


def get_preset(name: str) -> ModelPreset:
    """The model preset ``name``; raises ValueError listing the valid names."""
    try:
        return MODEL_PRESETS[name]()
    except KeyError:
        raise ValueError(
            f"unknown model preset {name!r}; valid presets: {', '.join(MODEL_PRESETS)}"
        ) from None


# --------------------------------------------------------------------------------------------
# GPUs
# --------------------------------------------------------------------------------------------

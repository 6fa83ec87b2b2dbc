"""The ``LLM`` API surface, the ``generate`` command, persistent block-table rows and the
metadata options the drafters rely on (non-causal blocks, unchecked slots)."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hybridkv.core.specs import FullAttention, KVCacheConfig, KVCacheGroup
from hybridkv.engine import BlockTableRows, SequenceInput, build_step_metadata
from hybridkv.cli import main
from hybridkv.cli.base import build_parser
from hybridkv.cli.generate import run as run_generate
from hybridkv.core.spec_decode import SpecDecode
from hybridkv.engine.llm import LLM, max_len_that_fits
from hybridkv.engine.llm_options import ENGINE_SCHEDULER, CacheConfig, RequestParams, RuntimeConfig, StoreConfig
from tests.engine.helpers import Built, build_llm, random_tokens

NO_EOS = RequestParams(ignore_eos=True)  # run every request to its max_tokens


def cli(argv: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


def with_tokenizer(built: Built, directory: Path) -> Path:
    """A copy of the model directory with a word-level tokenizer.json: token i is ``w{i}``."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    shutil.copytree(built.path, directory)
    vocab = {f"w{i}": i for i in range(built.model.config.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(directory / "tokenizer.json"))
    return directory


def test_cli_json_prompt_ids_and_prefix_hits(built_models: dict[str, Built], capsys) -> None:
    built = built_models["qwen2_swa"]
    a = random_tokens(40, 120)
    b = a[:36] + random_tokens(3, 121)
    rc, out, _ = cli(["generate", "--model", str(built.path), "--prompt-ids", ",".join(map(str, a)),
                      "--prompt-ids", ",".join(map(str, b)), "--max-tokens", "6", "--block-size",
                      "full=16,sliding=8", "--ignore-eos", "--device", "cpu", "--json"], capsys)
    assert rc == 0
    result = json.loads(out)
    outs = result["outputs"]
    assert [o["prompt_token_ids"] for o in outs] == [a, b]
    want = build_llm(built.path, block_size={"full": 16, "sliding": 8}, device="cpu").generate(
        [a, b], max_tokens=6, params=NO_EOS)
    assert [o["token_ids"] for o in outs] == [w.token_ids for w in want]
    assert outs[0]["prefix_cache_hit_tokens"] == 0 and outs[1]["prefix_cache_hit_tokens"] == 32
    assert result["stats"]["hits"] == 32


def test_cli_spec_decoding_gives_the_same_tokens(built_models: dict[str, Built], drafter_dirs, capsys) -> None:
    built = built_models["llama"]
    prompt = ",".join(map(str, [3, 4, 5, 6] * 6))
    base = ["generate", "--model", str(built.path), "--prompt-ids", prompt, "--max-tokens", "12",
            "--ignore-eos", "--device", "cpu", "--json"]
    plain = json.loads(cli(base, capsys)[1])["outputs"][0]["token_ids"]
    for spec, draft in (("ngram:3", None), ("dflash:4", drafter_dirs("llama", "dflash"))):
        argv = base + ["--spec", spec] + (["--draft-model", str(draft)] if draft else [])
        rc, out, _ = cli(argv, capsys)
        assert rc == 0
        result = json.loads(out)
        assert result["outputs"][0]["token_ids"] == plain
        assert result["stats"]["draft_tokens"] > 0


def test_cli_text_prompt_with_tokenizer(built_models: dict[str, Built], tmp_path: Path, capsys) -> None:
    built = built_models["llama"]
    model_dir = with_tokenizer(built, tmp_path / "with_tok")
    words = " ".join(f"w{t}" for t in random_tokens(12, 130))
    rc, out, _ = cli(["generate", "--model", str(model_dir), "--prompt", words, "--max-tokens", "5",
                      "--ignore-eos", "--device", "cpu", "--json"], capsys)
    assert rc == 0
    o = json.loads(out)["outputs"][0]
    assert o["prompt_token_ids"] == [int(w[1:]) for w in words.split()]
    assert o["text"] == " ".join(f"w{t}" for t in o["token_ids"])
    rc, out, _ = cli(["generate", "--model", str(model_dir), "--prompt", words, "--max-tokens", "3",
                      "--ignore-eos", "--device", "cpu"], capsys)
    assert rc == 0 and "prefix-cache hit 0/12 prompt tokens" in out


def test_cli_errors(built_models: dict[str, Built], capsys) -> None:
    path = str(built_models["llama"].path)
    rc, _, err = cli(["generate", "--model", path, "--prompt", "hello", "--device", "cpu"], capsys)
    assert rc == 2 and "has no tokenizer" in err
    rc, _, err = cli(["generate", "--model", path, "--prompt-ids", "1,2", "--spec", "dflash:3",
                      "--device", "cpu"], capsys)
    assert rc == 2 and "needs --draft-model DIR" in err
    rc, _, err = cli(["generate", "--model", path, "--prompt-ids", "1,2", "--draft-model", path], capsys)
    assert rc == 2 and err == "hybridkv generate: error: --draft-model needs --spec draft_model:K or dflash:K\n"
    vocab = built_models["llama"].model.config.vocab_size
    rc, _, err = cli(["generate", "--model", path, "--prompt-ids", f"1,2,{vocab}", "--device", "cpu"], capsys)
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err
    assert f"prompt token id {vocab} is outside the vocabulary of {path!r}: ids are in [0, {vocab})" in err
    with pytest.raises(SystemExit):
        main(["generate", "--model", path, "--prompt-ids", "1,-3"])
    assert "--prompt-ids: token ids are >= 0 (below the model's vocabulary size), got -3 in '1,-3'" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["generate", "--model", path, "--prompt-ids", "1,x"])
    with pytest.raises(SystemExit):
        main(["generate", "--model", path, "--prompt-ids", "1", "--retention", "x"])
    assert "argument --retention: retention interval must be 'none' or an integer >= 0, got 'x'" \
        in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["generate", "--model", path, "--prompt-ids", "1", "--max-tokens", "0"])
    assert exit_.value.code == 2
    assert "argument --max-tokens: must be an integer >= 1, got '0'" in capsys.readouterr().err


def test_cli_names_a_model_directory_that_is_not_one(tmp_path: Path, capsys) -> None:
    for model, what in ((tmp_path / "absent", "is not a directory"), (tmp_path, "has no config.json")):
        rc, _, err = cli(["generate", "--model", str(model), "--prompt-ids", "1"], capsys)
        assert rc == 2 and f"model {str(model)!r} {what}" in err


def test_add_generate_parser_registers_a_subcommand() -> None:
    parser = build_parser("")             # every registered command, generate among them
    args = parser.parse_args(["generate", "--model", "m", "--prompt-ids", "1,2,3", "--spec", "ngram:2",
                              "--block-size", "full=16,sliding=8", "--json"])
    assert args.command == "generate" and args.prompt_ids == [[1, 2, 3]] and args.json
    assert args.block_size == {"full": 16, "sliding": 8}
    assert args.func is run_generate                  # the subcommand dispatches to it


def test_llm_stop_tokens_salts_and_batching(built_models: dict[str, Built]) -> None:
    built = built_models["gemma3"]
    llm = build_llm(built.path, block_size=8, device="cpu", num_blocks=64)
    prompt = random_tokens(20, 140)
    (free,) = llm.generate([prompt], max_tokens=5, params=NO_EOS)
    (stopped,) = llm.generate([prompt], max_tokens=5,
                              params=RequestParams(stop_token_ids=[free.token_ids[0]], ignore_eos=True))
    assert stopped.token_ids == free.token_ids[:1] and stopped.finish_reason == "stopped"
    outs = llm.generate([prompt, prompt], max_tokens=[2, 4],
                        params=RequestParams(cache_salt=["x", None], ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [2, 4] and outs[0].num_cached_tokens == 0
    with pytest.raises(ValueError, match="one entry per prompt"):
        llm.generate([prompt], max_tokens=[1, 2])
    assert "gemma3_text" in repr(llm) and llm.eos_token_ids == (1,)


def test_default_max_model_len_fits_the_pool(built_models: dict[str, Built]) -> None:
    built = built_models["qwen2_swa"]
    llm = build_llm(built.path, block_size={"full": 16, "sliding": 8}, device="cpu", num_blocks=20)
    assert llm.max_model_len == max_len_that_fits(llm.kv_config, 4096)
    # one full block per 16 tokens plus the sliding window's blocks (window + one alignment
    # unit kept for the final-length promise + a chunk): 19 usable blocks
    assert 16 * 12 <= llm.max_model_len <= 16 * 17
    out = llm.generate([random_tokens(30, 150)], max_tokens=4, params=NO_EOS)[0]
    assert len(out.token_ids) == 4


def test_llm_options_are_grouped_in_config_objects(built_models: dict[str, Built]) -> None:
    built = built_models["qwen2_swa"]
    # the short path: a model directory (and a speculative method), every other option defaulted
    llm = LLM(built.path, spec="ngram:2", runtime=RuntimeConfig(device="cpu"))
    assert llm.scheduler.config == replace(ENGINE_SCHEDULER, max_model_len=llm.max_model_len)
    assert llm.cache_config == CacheConfig() and llm.spec == SpecDecode("ngram", 2)
    assert len(llm.generate([random_tokens(12, 160)], max_tokens=3, params=NO_EOS)[0].token_ids) == 3
    # bad options are caught before the model loads, naming the option and the valid range
    with pytest.raises(ValueError, match="cache must be a CacheConfig, got dict"):
        LLM(built.path, cache={"block_size": 16})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"CacheConfig.num_blocks must be None or an integer >= 2, got 1"):
        CacheConfig(num_blocks=1)
    with pytest.raises(ValueError, match=r"CacheConfig.block_size must be an integer >= 1, got 0"):
        CacheConfig(block_size={"full": 16, "sliding": 0})
    with pytest.raises(ValueError, match="hash_algo must be one of xxh3_128, sha256, got 'md5'"):
        CacheConfig(hash_algo="md5")
    with pytest.raises(ValueError, match=r"ngram_sizes must be \(min_n, max_n\) with 1 <= min_n <= max_n"):
        RuntimeConfig(ngram_sizes=(3, 1))
    with pytest.raises(ValueError, match="drafts with ngram, draft_model, dflash; 'eagle' is not implemented"):
        LLM(built.path, spec="eagle:3", runtime=RuntimeConfig(device="cpu"))
    with pytest.raises(ValueError, match="give kv_store too"):
        LLM(built.path, store=StoreConfig(save=False))
    with pytest.raises(TypeError):
        LLM(built.path, num_blocks=64)  # type: ignore[call-arg]  # flat options are gone


# --------------------------------------------------------------------------- rows & metadata
def test_block_table_rows_are_reused_and_never_cleared() -> None:
    rows = BlockTableRows(num_groups=2, num_rows=2, width=2)
    rows.write("x", [[7, 8, 9, 10], [3]])          # grows the first table to width >= 4
    assert rows.row_of("x") == 0 and rows.num_valid("x", 0) == 4
    rows.release("x")
    rows.write("a", [[1], [4, 5]])                  # a takes x's row: the tail stays stale
    assert rows.row_of("a") == 0
    assert rows.row("a", 0).tolist()[:4] == [1, 8, 9, 10]
    assert rows.row("a", 0, valid_only=True).tolist() == [1]
    rows.write("b", [[2], [6]])
    assert rows.row_of("b") == 1
    with pytest.raises(RuntimeError, match="no free block-table row"):
        rows.assign("c")


CFG = KVCacheConfig((KVCacheGroup("g", FullAttention(block_size=2, num_kv_heads=1, head_dim=4,
                                                     dtype="float32"), ("l",)),), num_blocks=8)


def test_non_causal_block_mask() -> None:
    seq = SequenceInput([1, 2, 3], start=2, block_tables=[[5, 6, 7]], causal=False)
    (g,) = build_step_metadata([seq], CFG).groups
    assert g.sequences[0].mask.all()  # cached keys and every block token, both directions
    causal = build_step_metadata([SequenceInput([1, 2, 3], 2, [[5, 6, 7]])], CFG).groups[0]
    assert causal.sequences[0].mask.tolist()[0] == [True, True, True, False, False]


def test_unchecked_slots_follow_whatever_the_table_holds() -> None:
    stale = torch.tensor([5, 0, 3])
    seq = SequenceInput([9], start=2, block_tables=[stale])
    with pytest.raises(ValueError, match="maps to block 0"):
        build_step_metadata([seq], CFG)
    g = build_step_metadata([seq], CFG, check_blocks=False).groups[0]
    assert g.slot_mapping.tolist() == [0 * 2 + 0]  # position 2 -> entry 1 -> null block 0
    meta = build_step_metadata([SequenceInput([9], 4, [stale])], CFG, check_blocks=False)
    assert meta.groups[0].slot_mapping.tolist() == [3 * 2 + 0]
    assert build_step_metadata([seq], CFG, group_indices=[], check_blocks=False).groups == (None,)


@pytest.mark.parametrize("extra", [
    dict(model_type="llama", tie_word_embeddings=True),
    dict(model_type="gemma3_text", head_dim=16, sliding_window=8, query_pre_attn_scalar=16,
         layer_types=["sliding_attention", "full_attention"]),
    dict(model_type="gpt_oss", head_dim=16, sliding_window=8, num_local_experts=4, num_experts_per_tok=2),
    dict(model_type="deepseek_v3", kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
         qk_nope_head_dim=8, v_head_dim=8, first_k_dense_replace=2),
], ids=lambda e: e["model_type"])
def test_random_checkpoints_load_and_run(tmp_path: Path, extra: dict) -> None:
    """``engine.checkpoints.random_model`` writes directories the engine loads (benchmarks and
    smoke runs need no transformers); the CLI runs on them."""
    from hybridkv.engine.checkpoints import random_model

    cfg = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256, **extra)
    path = random_model(tmp_path / "m", cfg, seed=1)
    rc = main(["generate", "--model", str(path), "--prompt-ids", "1,2,3,4,5", "--max-tokens", "4",
               "--block-size", "4", "--ignore-eos", "--device", "cpu", "--json"])
    assert rc == 0

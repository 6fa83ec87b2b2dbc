"""The command-line value types (``hybridkv.cli.options``): each range's ends, both sides.

tests/test_bad_inputs.py runs whole command lines with values below a range or far above it;
here every ranged option of every command is tried at its ends: the top and the bottom are
accepted, one past either is refused with a message naming the range. A range's ends are read
from the parser it builds (white box); counts come from their suffix table (k = 10**3 ...).
"""

from __future__ import annotations

import argparse
import re

import pytest

from hybridkv.cli import DESCRIPTION, build_parser
from hybridkv.cli import options as o
from hybridkv.core.spec_decode import SPEC_OFF


def refused(parse, text: str, match: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=match):
        parse(text)


def closure(fn) -> dict:
    """White box: the values a parser closes over (``lo``/``hi`` of :func:`o.int_in`,
    ``lo_open`` of :func:`o.fraction`, the per-item parser ``one`` of :func:`o.parse_int_list`)."""
    cells = (c.cell_contents for c in fn.__closure__ or ())
    return dict(zip(fn.__code__.co_freevars, cells))


def bounds(parse) -> dict:
    """``{"lo": .., "hi": ..}`` of a ranged integer or integer list, ``{"lo_open": ..}`` of a
    fraction, ``{}`` for any other type."""
    cells = closure(parse) if callable(parse) and hasattr(parse, "__code__") else {}
    if "one" in cells:
        cells = closure(cells["one"])
    return {k: v for k, v in cells.items() if k in ("lo", "hi", "lo_open")}


def ranged_options() -> list[tuple[str, str, object]]:
    """``(command, option, type)`` of every option whose type is a range."""
    parser = build_parser(DESCRIPTION)
    out = []
    for cmd, p in parser.commands.items():
        for action in p._actions:
            if bounds(action.type):
                out.append((cmd, action.option_strings[0], action.type))
    return out


def test_the_census_of_ranged_options_is_not_empty() -> None:
    """The range tests below see the options they are meant to: the bounded integers, the
    fractions and the instance list of each command."""
    names = {(c, opt) for c, opt, _ in ranged_options()}
    assert {("simulate", "--gpus"), ("simulate", "--gpu-memory-fraction"),
            ("simulate", "--acceptance-rate"), ("simulate", "--instances"), ("cost", "--gpus"),
            ("profile", "--warmup"), ("sweep", "--instances-list"),
            ("generate", "--max-tokens")} <= names


def option_type(cmd: str, option: str):
    """The type of ``option`` of ``cmd``, from a parser built now (inside the calling test, so
    the parser builders it calls are traced to it)."""
    parser = build_parser(DESCRIPTION)
    (action,) = (a for a in parser.commands[cmd]._actions if option in a.option_strings)
    return action.type


@pytest.mark.parametrize("cmd, option", [(c, opt) for c, opt, _ in ranged_options()])
def test_every_ranged_option_accepts_both_ends_and_refuses_one_past_either(cmd, option) -> None:
    """The top of a range is inside it (``[lo, hi]`` is closed), ``hi + 1`` is not; likewise
    ``lo`` and ``lo - 1``. A fraction's ends are 0 and 1 (0 refused where the range is open);
    an option without a top takes a very large value."""
    parse = option_type(cmd, option)
    ends = bounds(parse)
    if "lo_open" in ends:
        assert parse("1") == 1.0 and parse("0.5") == 0.5
        refused(parse, "1.0001", r"must be in (\(0|\[0), 1\], got '1.0001'")
        refused(parse, "-0.0001", "must be in")
        if ends["lo_open"]:
            refused(parse, "0", r"must be in \(0, 1\], got '0'")
        else:
            assert parse("0") == 0.0
        return
    lo, hi = ends["lo"], ends["hi"]
    one = (lambda v: parse(v)[0]) if "one" in closure(parse) else parse
    rng = f"[{lo}, {hi}]" if hi is not None else f">= {lo}"
    assert one(str(lo)) == lo
    refused(parse, str(lo - 1), re.escape(f"must be an integer {rng}, got '{lo - 1}'"))
    if hi is None:
        assert one(str(10**18)) == 10**18
    else:
        assert one(str(hi)) == hi and one(f" {hi} ") == hi
        refused(parse, str(hi + 1), rf"must be an integer \[{lo}, {hi}\], got '{hi + 1}'")


def test_block_size_is_a_power_of_two_up_to_the_top() -> None:
    for size in (1, 2, 16, 2048, o.MAX_BLOCK_SIZE):
        assert o.parse_block_size(str(size)) == size
    for bad in ("3", "12", "4095", "24"):
        refused(o.parse_block_size, bad, rf"power of two in \[1, 4096\] \(e.g. 16, 64, 256\), got '{bad}'")
    refused(o.parse_block_size, "8192", r"must be an integer \[1, 4096\]")


def test_spec_k_tops_at_64() -> None:
    """``--spec METHOD:K``: K in [1, 64]; ``none`` turns a preset's method off."""
    spec = o.spec_argument("eagle:64")
    assert (spec.method, spec.num_speculative_tokens) == ("eagle", 64)
    assert o.spec_argument("mtp:1").num_speculative_tokens == 1
    refused(o.spec_argument, "eagle:65", r"'eagle:65': K \(speculative tokens per step\) must be in \[1, 64\]")
    assert o.spec_argument("none") is SPEC_OFF


@pytest.mark.parametrize("text, value", [
    ("0", 0), ("4096", 4096), ("500k", 500_000), ("3M", 3_000_000), ("1.5G", 1_500_000_000),
    ("2t", 2 * 10**12), ("1e9", 10**9), (" 7K ", 7000), ("1_000", 1000), ("2_5k", 25_000),
    ("0.5k", 500), ("_1__0k_", 10_000)])
def test_counts_read_their_suffix(text, value) -> None:
    assert o.parse_count(text) == value


@pytest.mark.parametrize("text, message", [
    ("", "not a count: ''"), ("k", "not a count: 'k'"), ("1x", "not a count: '1x'"),
    ("inf", "not a finite count: 'inf'"), ("-1k", "not a non-negative whole count: '-1k'"),
    ("1.0001k", "not a non-negative whole count: '1.0001k'"), ("0.5", "not a non-negative whole")])
def test_bad_counts_are_named(text, message) -> None:
    refused(o.parse_count, text, message)


def test_positive_counts_and_count_lists() -> None:
    assert o.positive_count("1") == 1
    refused(o.positive_count, "0", "must be >= 1, got '0'")
    refused(o.positive_count, "0k", "must be >= 1, got '0k'")
    assert o.parse_count_list("1M, 3M,10k") == [10**6, 3 * 10**6, 10**4]
    assert o.parse_count_list("5") == [5]
    refused(o.parse_count_list, "1M, ,3", r"item 2 of '1M, ,3' is empty \(example: 1M,3M,10M\)")
    refused(o.parse_count_list, "1,2,x", "item 3 of '1,2,x': not a count: 'x'")


def test_int_lists_keep_the_first_of_each_value_in_order() -> None:
    parse = o.parse_int_list(1, 8)
    assert parse("4,1,4,8,1") == [4, 1, 8]
    refused(parse, "1,,2", r"item 2 of '1,,2' is empty \(example: 1,2,4\)")
    refused(parse, "1,9", r"item 2 of '1,9': must be an integer \[1, 8\], got '9'")
    refused(parse, "0", r"item 1 of '0': must be an integer \[1, 8\]")
    refused(o.int_in(0), "1.5", "not an integer: '1.5'")


def test_retention_intervals() -> None:
    for text in ("none", "dense", " NONE ", "Dense"):
        assert o.parse_retention(text) is None
    assert o.parse_retention("0") == 0 and o.parse_retention("1024") == 1024
    for bad in ("-1", "x", "1.5"):
        refused(o.parse_retention, bad, f"'none' or an integer >= 0, got '{bad}'")
    assert o.parse_retention_list("none,0,1024") == [None, 0, 1024]
    refused(o.parse_retention_list, "0,", r"item 2 of '0,' is empty \(example: none,0,1024\)")


def test_policies_and_the_all_list() -> None:
    from hybridkv.core.eviction import POLICIES, resolve_policy
    assert o.parse_policy("recommended") == "recommended"       # kept as given
    refused(o.parse_policy, "nope", "nope")
    swept = o.sweepable_policies()
    assert "priority" not in swept and len(set(swept)) == len(swept)
    assert set(swept) == {resolve_policy(p) for p in POLICIES} - {"priority"}
    everything = o.parse_policy_list(" all ")
    assert isinstance(everything, o.AllPolicies) and list(everything) == list(swept)
    names = o.parse_policy_list("lru, s3fifo,lru")
    assert names == ["lru", "s3fifo"] and not isinstance(names, o.AllPolicies)


def test_generate_values() -> None:
    assert o.prompt_ids("1, 2,3,") == [1, 2, 3]
    assert o.prompt_ids("0") == [0]
    refused(o.prompt_ids, ",", "^--prompt-ids needs at least one token id$")
    assert o.prompt_ids(" 4 ,5 , 6") == [4, 5, 6]
    refused(o.prompt_ids, "1 2,3", r"^--prompt-ids takes comma-separated integers, got '1 2,3'$")
    refused(o.prompt_ids, "1,a", "comma-separated integers, got '1,a'")
    refused(o.prompt_ids, "3,-1", "token ids are >= 0 .* got -1 in '3,-1'")
    assert o.engine_block_size("16") == 16
    assert o.engine_block_size("full=16, sliding=8,mla=1") == {"full": 16, "sliding": 8, "mla": 1}
    refused(o.engine_block_size, "0", r"must be an integer >= 1, got '0' \(N or KIND=N")
    for bad in ("full=0", "full=x", "chunk=16", "full=16,sliding"):
        refused(o.engine_block_size, bad, f"N or KIND=N,... with KIND in full, sliding, mla .*got '{bad}'")


def test_non_negative_numbers() -> None:
    assert o.non_negative_number("0") == 0.0 and o.non_negative_number("2.5") == 2.5
    for bad, msg in (("-0.1", "finite number >= 0"), ("inf", "finite number >= 0"),
                     ("nan", "finite number >= 0"), ("x", "not a number: 'x'")):
        refused(o.non_negative_number, bad, msg)
    refused(o.fraction(True), "x", "not a number: 'x'")


def test_name_options_replaces_field_names_with_the_options_that_set_them() -> None:
    opts = {"max_model_len": "--max-model-len", "num_blocks": "--num-blocks"}
    assert o.name_options("max_model_len=3 is too small", opts) == "--max-model-len 3 is too small"
    assert o.name_options("CacheConfig.num_blocks must be >= 2", opts) == "--num-blocks must be >= 2"
    assert o.name_options("num_blocks_total stays", opts) == "num_blocks_total stays"
    assert o.name_options("max_model_len=3", {}) == "max_model_len=3"


def test_fractions_of_both_kinds_at_their_ends() -> None:
    """``[0, 1]`` takes both ends; ``(0, 1]`` takes 1 and refuses 0; past 1 both refuse."""
    closed, half_open = o.fraction(False), o.fraction(True)
    assert (closed("0"), closed("1"), half_open("1"), half_open("1e-9")) == (0.0, 1.0, 1.0, 1e-9)
    refused(half_open, "0", r"^must be in \(0, 1\], got '0'$")
    refused(closed, "1.5", r"^must be in \[0, 1\], got '1.5'$")
    refused(closed, "nan", r"^must be in \[0, 1\], got 'nan'$")


def test_engine_spec_methods_and_none() -> None:
    """``generate --spec``: a method the reference engine drafts with, or ``none``; a method it
    does not implement and a malformed spec are refused with the usage."""
    assert o.engine_spec_argument("ngram:3") == "ngram:3"
    assert o.engine_spec_argument("none") == "none"
    refused(o.engine_spec_argument, "eagle:2", r"got 'eagle:2' \(the reference engine does not "
                                               r"implement 'eagle'\)$")
    refused(o.engine_spec_argument, "ngram:x", r"^METHOD:K with METHOD in ngram, draft_model, "
                                               r"dflash and K an integer >= 1, or none, got 'ngram:x'$")


def test_prefix_retention_step_and_profile_arguments(tmp_path) -> None:
    """The library's parsers behind ``--prefix-retention``, ``--step`` and ``--profile``: their
    value through, their ValueError as a usage error with the library's message."""
    ret = o.parse_prefix_retention("64:3:1.5")
    assert str(ret) == "64:3:1.5"
    refused(o.parse_prefix_retention, "x", r"^prefix retention must be TOKENS:PRIORITY\[:TTL_S\] "
                                           r"\(e.g. 2048:100:600\), got 'x'$")
    assert o.step_argument("4@128x2,1@0") == [(4, 128), (4, 128), (1, 0)]
    refused(o.step_argument, "x", r"^bad step item 'x' in 'x': expected N@C")
    from hybridkv.cost.profile import default_profile
    default_profile().save(tmp_path / "p.json")
    back = o.profile_argument(str(tmp_path / "p.json"))
    assert back.calibration == default_profile().calibration and back.device == default_profile().device
    refused(o.profile_argument, "/nonexistent.json", r"^cannot read profile '/nonexistent.json'")


def test_gpu_is_declared_once_and_parsed_to_its_preset() -> None:
    """--gpu of simulate, sweep, cost and profile: one declaration whose type resolves the preset
    object (a string default too); profile's default is no preset."""
    from hybridkv.cost.gpus import GPU_PRESETS
    assert o.gpu_preset(" h200 ") is GPU_PRESETS["h200"]
    refused(o.gpu_preset, "tpu", re.escape(f"unknown GPU preset 'tpu'; valid GPUs: {', '.join(GPU_PRESETS)}"))
    parser = build_parser(DESCRIPTION)
    for cmd, extra in (("simulate", []), ("sweep", []), ("cost", ["--step", "5@5"])):
        assert parser.parse_args([cmd, *extra]).gpu is GPU_PRESETS["h100"], cmd
        assert parser.parse_args([cmd, *extra, "--gpu", "h200"]).gpu is GPU_PRESETS["h200"], cmd
    assert parser.parse_args(["profile", "--out", "p.json"]).gpu is None
    assert parser.parse_args(["profile", "--out", "p.json", "--gpu", "h200"]).gpu is GPU_PRESETS["h200"]

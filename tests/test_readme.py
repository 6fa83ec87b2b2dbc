"""Every fenced code block of README.md runs, so the README cannot drift from the code.

* ``python`` blocks run in order in one namespace (later blocks use earlier names).
* ``bash`` blocks are split into commands (``\\`` continuations joined, ``&&`` split,
  trailing comments dropped) and each is run in an empty folder with these rewrites, all
  listed in :func:`rewrite`: ``hybridkv simulate|sweep`` gets ``--limit 40 --no-progress``
  (small limits, same code paths), ``hybridkv plan`` ``--limit 20 --max-gpus 4
  --no-progress``, ``hybridkv profile`` ``--no-progress`` (it must name
  ``--device cpu``); ``--model DIR`` gets a tiny checkpoint made by the test
  (without the engine extras the command must instead say how to install them);
  ``pip install`` must name extras that pyproject.toml defines (the install itself is what
  CI and the plain-install check do); ``bash .ci/install_mooncake.sh`` must exist;
  ``python3 -m pytest`` runs with ``--collect-only`` (running the suite inside itself would
  recurse). An unknown command fails the test, so a new kind of block needs a rule here.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(\w+)\n(.*?)^```", README, re.S | re.M)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    env["MPLBACKEND"] = "Agg"
    return env


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a bash block, as argv lists."""
    text = re.sub(r"\\\n\s*", " ", body)
    out = []
    for line in text.splitlines():
        line = re.sub(r"\s+#.*$", "", line).strip()
        if not line or line.startswith("#"):
            continue
        out += [shlex.split(part) for part in line.split("&&") if part.strip()]
    return out


def test_the_readme_has_the_blocks_this_test_knows() -> None:
    langs = [lang for lang, _ in BLOCKS]
    assert set(langs) <= {"bash", "python"}, langs
    assert langs.count("python") >= 3 and langs.count("bash") >= 3


def test_python_blocks_run() -> None:
    ns: dict = {"__name__": "readme"}
    for i, (lang, body) in enumerate(BLOCKS):
        if lang == "python":
            exec(compile(body, f"README.md python block {i}", "exec"), ns)  # noqa: S102
    res = ns["res"]                         # the simulator example's result
    assert 0 <= res.block_hit_rate <= res.optimal_block_hit_rate <= 1
    ns["kv"].check_integrity()             # raises if the manager's state is inconsistent


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path | None:
    """A tiny random Llama checkpoint with a word-level tokenizer (None without the engine extras)."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
        from tokenizers import Tokenizer, models, pre_tokenizers
    except ImportError:
        return None
    from tests.engine.helpers import ARCHS, build
    d = tmp_path_factory.mktemp("readme_model")
    built = build(ARCHS["llama"], d)
    tok = Tokenizer(models.WordLevel({f"w{i}": i for i in range(built.model.config.vocab_size)},
                                     unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.save(str(d / "tokenizer.json"))
    return d


def rewrite(argv: list[str], tiny_model: Path | None) -> tuple[list[str] | None, str]:
    """(the command to run, or None when it is checked statically; what is expected)."""
    if argv[:2] == ["pip", "install"]:
        extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
        for spec in argv[2:]:
            if spec.startswith("-"):
                continue
            m = re.fullmatch(r"\.?\[([\w,]+)\]", spec.strip("\"'").lstrip("."))
            assert m and set(m.group(1).split(",")) <= extras, f"README installs {spec}; extras: {extras}"
        return None, ""
    if argv[0] == "bash":
        assert (REPO / argv[1]).is_file(), argv
        return None, ""
    if argv[:3] == ["python3", "-m", "pytest"]:
        return [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                str(REPO / "tests")], "ok"
    assert argv[0] == "hybridkv", f"no rule for README command {argv}"
    cmd = [sys.executable, "-m", "hybridkv.cli", *argv[1:]]
    if argv[1] in ("simulate", "sweep"):
        cmd += ["--no-progress"] + ([] if "--limit" in argv else ["--limit", "40"])
    if argv[1] == "plan":             # the same search on 20 requests and at most 4 GPUs
        if "--limit" in cmd:
            cmd[cmd.index("--limit") + 1] = "20"
        cmd += ["--no-progress", "--max-gpus", "4"] + ([] if "--limit" in cmd else ["--limit", "20"])
    if argv[1] == "profile":
        assert "cuda" not in argv, "a README profile command runs in CI: --device cpu"
        cmd += ["--no-progress"]
    if argv[1] == "generate":
        if tiny_model is None:
            return cmd, "engine-missing"
        cmd[cmd.index("DIR")] = str(tiny_model)
        cmd += ["--device", "cpu"]
    return cmd, "ok"


def _commands() -> list[list[str]]:
    return [argv for lang, body in BLOCKS if lang == "bash" for argv in shell_commands(body)]


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a)[:60])
def test_shell_commands_run(argv: list[str], tiny_model: Path | None, tmp_path: Path) -> None:
    cmd, expect = rewrite(argv, tiny_model)
    if cmd is None:
        return
    res = subprocess.run(cmd, cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert "Traceback" not in res.stderr, res.stderr
    if expect == "engine-missing":
        assert res.returncode == 2 and 'pip install "hybridkv[engine]"' in res.stderr
        return
    assert res.returncode == 0, (cmd, res.stdout[-2000:], res.stderr[-2000:])
    for option in ("--json", "--plot"):
        if option in argv and argv.index(option) + 1 < len(argv) and not argv[argv.index(option) + 1].startswith("-"):
            assert (tmp_path / argv[argv.index(option) + 1]).stat().st_size > 0

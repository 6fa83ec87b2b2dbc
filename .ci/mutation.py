#!/usr/bin/env python3
"""Run mutmut on one named target: ``python3 .ci/mutation.py TARGET [mutmut arguments]``.

A target (``[tool.hybridkv.mutation.TARGET]`` in pyproject.toml) names the files mutmut mutates
(``mutate``) and the tests that judge them (``tests``: pytest arguments, paths or
``--deselect``). The checkout's files (tracked and untracked, never ignored ones, so no
compiled ``.so``) are copied to ``.mutation/TARGET/``, whose pyproject's ``[tool.mutmut]``
takes the target's two lists; mutmut runs there (niced; one worker unless ``run`` is given
``--max-children``), and its state stays there between runs, so ``python3 .ci/mutation.py
TARGET results`` and ``... TARGET run NAME...`` work as in a plain checkout. Each call copies the current files
again (tests added since the last run are seen by the next one).

mutmut does not mutate decorated functions, so in the copy only, every ``@cython.locals(...)``
decorator of the target's ``mutate`` files becomes blank lines (line numbers stay; every other
decorator stays). The decorator is a no-op when the source runs as Python
(``hybridkv._cython_shim``), so the copy behaves like the checkout and its hot, typed functions
get mutants too.

``export`` copies nothing and runs nothing: it reads mutmut's verdicts from the target's state
(:func:`export`) and writes them as JSON, the per-mutant record of a run.

    python3 .ci/mutation.py sched                  # mutmut run --max-children 1 (niced)
    python3 .ci/mutation.py sched results          # the survivors
    python3 .ci/mutation.py sched show NAME        # one mutant's diff
    python3 .ci/mutation.py sched run NAME...      # re-check named mutants
    python3 .ci/mutation.py sched --fresh-stats    # re-trace which tests call which function
    python3 .ci/mutation.py sched export [PATH]    # the verdicts as JSON (stdout without PATH)
    python3 .ci/mutation.py --list                 # the targets
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def targets() -> dict[str, dict]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return data["tool"]["hybridkv"]["mutation"]


def strip_cython_locals(source: str) -> str:
    """``source`` with each ``@cython.locals(...)`` decorator (all its lines) replaced by empty
    lines, so line numbers stay and the file stays valid Python; every other line, other
    decorators included, is unchanged. Source that does not parse is returned as it is."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    spans = []
    for node in ast.walk(tree):
        for dec in getattr(node, "decorator_list", ()):
            func = dec.func if isinstance(dec, ast.Call) else None
            if (isinstance(func, ast.Attribute) and func.attr == "locals"
                    and isinstance(func.value, ast.Name) and func.value.id == "cython"):
                spans.append((dec.lineno, dec.end_lineno))
    if not spans:
        return source
    lines = source.splitlines(keepends=True)
    for first, last in spans:
        for k in range(first - 1, last):
            lines[k] = lines[k][len(lines[k].rstrip("\r\n")):]   # keep only the line ending
    return "".join(lines)


def sync(dest: Path, mutate: list[str] = ()) -> None:
    """Copy the checkout's tracked and untracked-not-ignored files into ``dest`` (changed ones
    only, so mutmut's per-function hashes see exactly what changed), and drop files that left.
    Python files matching a ``mutate`` pattern are copied through :func:`strip_cython_locals`
    (and compared with ``dest`` after it)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=ROOT, check=True, capture_output=True).stdout.decode().split("\0")
    files = {f for f in listed if f and (ROOT / f).is_file()}
    for f in files:
        src, dst = ROOT / f, dest / f
        data = src.read_bytes()
        if f.endswith(".py") and any(fnmatch.fnmatch(f, pat) for pat in mutate):
            data = strip_cython_locals(data.decode()).encode()
        if dst.is_file() and dst.read_bytes() == data:
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        if data == src.read_bytes():
            shutil.copy2(src, dst)
        else:
            dst.write_bytes(data)                # a fresh mtime: mutmut regenerates its mutants
    for top in ("src", "tests"):
        for path in (dest / top).rglob("*"):
            rel = path.relative_to(dest).as_posix()
            if path.is_file() and rel not in files and "__pycache__" not in rel:
                path.unlink()


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join('"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"' for v in values) + "]"


def set_target(pyproject: Path, target: dict) -> None:
    """Point the copy's ``[tool.mutmut]`` at the target's files and tests."""
    text = pyproject.read_text()
    for key, values in (("only_mutate", target["mutate"]),
                        ("pytest_add_cli_args_test_selection", target["tests"])):
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {toml_list(values)}", text, count=1,
                          flags=re.M)
        if n != 1:
            sys.exit(f"pyproject.toml's [tool.mutmut] has no {key} line to point at the target")
    pyproject.write_text(text)


# mutmut 3.8's verdict, in its words, per worker exit code (``mutmut.stats.status_by_exit_code``;
# any other code is "suspicious"). 36 is also tests/conftest.py's CPU-budget exit.
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed", 3: "killed", 0: "survived", 5: "no tests", 33: "no tests",
    36: "timeout", -24: "timeout", 24: "timeout", 152: "timeout", 255: "timeout",
    None: "not checked", 2: "check was interrupted by user", 34: "skipped", 35: "suspicious",
    37: "caught by type check", -11: "segfault", -9: "segfault",
}
COUNTED = ("killed", "timeout", "survived", "no tests", "not checked")   # the rest: "other"
LISTED = ("survived", "timeout", "no tests")                             # names given per module


def mutant_order(name: str) -> tuple[str, int]:
    """Sort key of a mutant name (``module.xǁClassǁmethod__mutmut_N``): by function, then by N
    as a number, so ``_9`` comes before ``_10``."""
    head, _, n = name.rpartition("__mutmut_")
    return (head, int(n)) if n.isdigit() else (name, -1)


def verdicts(state: Path, mutate: list[str]) -> dict[str, dict]:
    """Per mutated module of a mutmut state directory (the folder holding ``mutants/``), the
    verdicts of its mutants, from the ``mutants/PATH.meta`` JSON file mutmut 3.8 keeps for each
    source file ``PATH`` (its ``exit_code_by_key``: mutant name -> the worker's exit code, null
    while not checked). Only modules whose source is still in ``state`` and matches a ``mutate``
    pattern count (as in ``mutmut results``). Each module maps to its ``mutants`` count, one
    count per :data:`COUNTED` status plus ``other`` (any other status: suspicious, skipped,
    segfault, interrupted, caught by type check), and ``names``: the sorted names of each
    :data:`LISTED` status, and ``other``'s names with their status."""
    out: dict[str, dict] = {}
    root = state / "mutants"
    for meta in sorted(root.rglob("*.py.meta")):
        module = meta.relative_to(root).as_posix()[:-len(".meta")]
        if not (state / module).is_file() or not any(fnmatch.fnmatch(module, p) for p in mutate):
            continue
        codes = json.loads(meta.read_text())["exit_code_by_key"]
        status = {name: STATUS_BY_EXIT_CODE.get(code, "suspicious") for name, code in codes.items()}
        names = {s: sorted((n for n, v in status.items() if v == s), key=mutant_order)
                 for s in LISTED}
        other = {n: v for n, v in sorted(status.items(), key=lambda kv: mutant_order(kv[0]))
                 if v not in COUNTED}
        counts = {s: sum(v == s for v in status.values()) for s in COUNTED}
        out[module] = {"mutants": len(status), **counts, "other": len(other),
                       "names": {**names, "other": other}}
    return out


def export(state: Path, name: str, target: dict, *, mutmut_version: str | None, commit: str,
           dirty: bool) -> dict:
    """The record of target ``name``'s mutmut state at ``state``: the target's name and
    definition, the mutmut version and checkout commit it is stamped with (``dirty``: the
    checkout had changes not committed), the per-module :func:`verdicts` and their ``total``
    counts. Raises ``FileNotFoundError`` when ``state`` holds no mutmut state."""
    if not (state / "mutants").is_dir():
        raise FileNotFoundError(f"no mutmut state in {state / 'mutants'}: run "
                                f"`python3 .ci/mutation.py {name}` first")
    modules = verdicts(state, target["mutate"])
    keys = ("mutants", *COUNTED, "other")
    total = {k: sum(m[k] for m in modules.values()) for k in keys}
    return {"target": name, "mutate": list(target["mutate"]), "tests": list(target["tests"]),
            "mutmut": mutmut_version, "commit": commit, "dirty": dirty,
            "total": total, "modules": modules}


def checkout_commit() -> tuple[str, bool]:
    """The checkout's HEAD commit and whether files that the copy takes (tracked, or untracked
    and not ignored) differ from it."""
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    changes = subprocess.run([*git, "status", "--porcelain"], check=True, capture_output=True,
                             text=True).stdout.strip()
    return head, bool(changes)


def installed_mutmut() -> str | None:
    try:
        return importlib.metadata.version("mutmut")
    except importlib.metadata.PackageNotFoundError:
        return None


def main(argv: list[str]) -> int:
    known = targets()
    if not argv or argv[0] in ("-h", "--help", "--list"):
        print(__doc__ if argv[:1] != ["--list"] else "")
        for name, t in known.items():
            print(f"{name:12} mutates {', '.join(t['mutate'])}; tests {' '.join(t['tests'])}")
        return 0
    name, args = argv[0], argv[1:]
    if name not in known:
        sys.exit(f"unknown mutation target {name!r}; valid: {', '.join(known)}")
    dest = ROOT / ".mutation" / name
    if args[:1] == ["export"]:
        if len(args) > 2:
            sys.exit(f"export takes at most one path, got {len(args) - 1}: {' '.join(args[1:])}")
        commit, dirty = checkout_commit()
        try:
            record = export(dest, name, known[name], mutmut_version=installed_mutmut(),
                            commit=commit, dirty=dirty)
        except FileNotFoundError as exc:
            sys.exit(str(exc))
        text = json.dumps(record, indent=1, ensure_ascii=False) + "\n"
        if len(args) == 2:
            Path(args[1]).write_text(text, encoding="utf-8")
        else:
            sys.stdout.write(text)
        return 0
    dest.mkdir(parents=True, exist_ok=True)
    sync(dest, known[name]["mutate"])
    set_target(dest / "pyproject.toml", known[name])
    if "--fresh-stats" in args:
        args.remove("--fresh-stats")
        (dest / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)
    if not args or args[0].startswith("-"):
        args = ["run", *args]
    if args[0] == "run" and "--max-children" not in args:   # one worker unless told otherwise
        args = ["run", "--max-children", "1", *args[1:]]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # mutmut puts mutants/src first
    env.setdefault("HYBRIDKV_TEST_CPU_BUDGET", "20")
    mutmut = shutil.which("mutmut") or sys.exit("mutmut is not installed: pip install -e '.[mutation]'")
    return subprocess.run(["nice", "-n", "15", mutmut, *args], cwd=dest, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

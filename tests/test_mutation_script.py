""".ci/mutation.py's copy of the checkout: ``@cython.locals`` decorators of the mutated files
become blank lines (so mutmut, which skips decorated functions, mutates them), nothing else
changes, and an unchanged file is not rewritten (mutmut keeps its verdicts)."""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("ci_mutation", ROOT / ".ci" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SOURCE = textwrap.dedent('''\
    import functools
    from hybridkv import _cython_shim as cython

    class A:
        @cython.locals(i=cython.Py_ssize_t,
                       n=cython.Py_ssize_t)   # two lines
        def f(self, n):
            return sum(i for i in range(n))

        @staticmethod
        @cython.locals(x=int)
        def g(x):
            @cython.locals(y=int)
            def inner(y):
                return y + 1
            return inner(x)

    @functools.lru_cache(maxsize=None)
    def h(k):
        return cython.locals(k=int)(abs)(k)   # a call, not a decorator
    ''')


def test_only_the_cython_locals_decorators_become_blank_lines() -> None:
    out = _script().strip_cython_locals(SOURCE)
    before, after = SOURCE.splitlines(), out.splitlines()
    assert len(after) == len(before)
    changed = [k + 1 for k, (a, b) in enumerate(zip(before, after)) if a != b]
    assert changed == [5, 6, 11, 13]
    assert all(after[k - 1] == "" for k in changed)
    decorators = [ast.unparse(d) for node in ast.walk(ast.parse(out))
                  for d in getattr(node, "decorator_list", ())]
    assert sorted(decorators) == ["functools.lru_cache(maxsize=None)", "staticmethod"]
    space: dict = {}
    exec(compile(out, "stripped", "exec"), space)      # still valid, and behaves the same
    assert space["A"]().f(4) == 6 and space["A"].g(2) == 3 and space["h"](-5) == 5


def test_source_without_the_decorator_or_unparsable_is_unchanged() -> None:
    strip = _script().strip_cython_locals
    plain = "@property\ndef f(self):\n    return 1\r\n"
    assert strip(plain) == plain
    assert strip("def (:\n") == "def (:\n"
    assert strip("@cython.locals(i=int)\r\ndef f(i):\r\n    return i\r\n") == "\r\ndef f(i):\r\n    return i\r\n"


def test_the_scheduler_copy_has_no_decorated_function() -> None:
    """The sched target's hot functions (``update``, ``_schedule_batched``) lose their only
    decorator in the mutation copy; every line number stays."""
    source = (ROOT / "src" / "hybridkv" / "sched" / "scheduler.py").read_text()
    out = _script().strip_cython_locals(source)
    assert "cython.locals" in source and "@cython" not in out
    assert len(out.splitlines()) == len(source.splitlines())
    decorated = {n.name for n in ast.walk(ast.parse(out))
                 if isinstance(n, ast.FunctionDef) and n.decorator_list}
    assert not decorated & {"update", "_schedule_batched"}


def test_sync_rewrites_only_what_changed(tmp_path: Path, monkeypatch) -> None:
    repo, dest = tmp_path / "repo", tmp_path / "copy"
    (repo / "src").mkdir(parents=True)
    (repo / "src" / "m.py").write_text("@cython.locals(i=int)\ndef f(i):\n    return i\n")
    (repo / "src" / "other.py").write_text("@cython.locals(i=int)\ndef g(i):\n    return i\n")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    script = _script()
    monkeypatch.setattr(script, "ROOT", repo)
    script.sync(dest, ["src/m.py"])
    assert (dest / "src" / "m.py").read_text() == "\ndef f(i):\n    return i\n"
    assert (dest / "src" / "other.py").read_text().startswith("@cython.locals")  # not mutated
    copies = list((dest / "src").iterdir())
    for p in copies:
        os.utime(p, (1_000_000, 1_000_000))            # a copy rewritten would get a new mtime
    script.sync(dest, ["src/m.py"])                    # nothing changed: nothing rewritten
    assert [p.stat().st_mtime for p in copies] == [1_000_000, 1_000_000]
    (repo / "src" / "m.py").write_text("@cython.locals(i=int)\ndef f(i):\n    return -i\n")
    script.sync(dest, ["src/m.py"])
    assert (dest / "src" / "m.py").read_text() == "\ndef f(i):\n    return -i\n"

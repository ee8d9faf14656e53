"""xcs.jit rewrites only the source that compiles to the loaded function (rewrite.py): an edited
file, a missing file, lambdas, one-line ``try:`` statements and ``__future__`` flags."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
import warnings

import pytest

from nablax import xcs

MODULE = """\
import time

from nablax import xcs


@xcs.mark_orchestration
def ask(q):
    time.sleep(0.01)
    return q.upper()


def pipeline(q):
    a = ask(q)
    b = ask(q + "2")
    return a + "|" + b


try: one_line = xcs.jit(lambda q: ask(q) + "!")
except ValueError: one_line = None

pair = (xcs.jit(lambda q: ask(q)), xcs.jit(lambda q: ask(q) + ask(q)))


def annotated(q):
    def inner(x: int) -> str:
        return str(x)
    return inner.__annotations__, ask(q)
"""


def _load(tmp_path, name: str, source: str):
    path = tmp_path / f"{name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod, path


def test_source_edited_after_import_runs_the_loaded_code(tmp_path):
    mod, path = _load(tmp_path, "xcs_src_edit", MODULE)
    path.write_text(MODULE.replace('a + "|" + b', 'b + "#" + a'))  # edited, not re-imported
    import linecache

    linecache.checkcache(str(path))
    with pytest.warns(RuntimeWarning, match="not the code that is loaded.*runs unmodified"):
        f = xcs.jit(mod.pipeline)
    assert f("x") == "X|X2" == mod.pipeline("x")  # the loaded code, not the file's new text


def test_unedited_source_is_rewritten_without_warning(tmp_path):
    mod, _ = _load(tmp_path, "xcs_src_same", MODULE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = xcs.jit(mod.pipeline)
    assert f("y") == "Y|Y2"
    assert len(f.last_plan().nodes) == 2  # both calls went through the engine


def test_lambdas_on_a_try_line_and_several_on_one_line(tmp_path):
    mod, _ = _load(tmp_path, "xcs_src_lambda", MODULE)
    assert mod.one_line("k") == "K!"
    assert [n.name for n in mod.one_line.last_plan().nodes] == ["ask"]
    single, double = mod.pair
    assert single("a") == "A" and double("b") == "BB"
    assert len(single.last_plan().nodes) == 1 and len(double.last_plan().nodes) == 2


def test_future_flags_are_the_functions_own(tmp_path):
    """The module has no ``from __future__ import annotations``: annotations stay objects (the
    rewriter's own module has the import, which must not leak into the user's code)."""
    mod, _ = _load(tmp_path, "xcs_src_future", MODULE)
    ann, up = xcs.jit(mod.annotated)("z")
    assert ann == {"x": int, "return": str} and up == "Z"
    mod2, _ = _load(tmp_path, "xcs_src_future2", "from __future__ import annotations\n" + MODULE)
    ann2, _ = xcs.jit(mod2.annotated)("z")
    assert ann2 == {"x": "int", "return": "str"}


def test_no_source_file_runs_unmodified(tmp_path):
    ns: dict = {}
    exec(textwrap.dedent("def g(q):\n    return q * 2\n"), ns)
    with pytest.warns(RuntimeWarning, match="not available"):
        g = xcs.jit(ns["g"])
    assert g("ab") == "abab"

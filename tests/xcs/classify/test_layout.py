"""The classifier package's layout: its modules are layered in the order its docstring lists them
(``records.py`` at the bottom), no import cycle runs through ``nablax.xcs`` even counting
``TYPE_CHECKING`` imports, and the package's name does not hide the function ``xcs.classify``."""

from __future__ import annotations

import ast
import importlib
import re
import types
from pathlib import Path

import pytest

import nablax.xcs
from nablax import xcs

XCS = Path(nablax.xcs.__file__).resolve().parent
PACKAGE = XCS / "classify"


def _module_name(path: Path) -> str:
    parts = path.relative_to(XCS.parents[1]).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every nablax module ``path`` imports (``TYPE_CHECKING`` and function-level imports
    included), ``from pkg import sub`` resolved to the submodule when it is one."""
    name = _module_name(path)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = (name if is_pkg else name.rpartition(".")[0]).split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            out.add(source)
            out.update(f"{source}.{a.name}" for a in node.names)
    return out


def _xcs_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in XCS.rglob("*.py")}
    packages = {m for m, p in files.items() if p.name == "__init__.py"}
    return {m: (_imports(p) & files.keys()) - packages - {m} for m, p in files.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                return stack[stack.index(t) :] + [t]
            if t not in state and (found := visit(t)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_cycle_in_xcs_even_counting_type_checking_imports():
    graph = _xcs_graph()
    assert "nablax.xcs.classify.records" in graph and graph["nablax.xcs.classify.records"] == set()
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checker_sees_a_type_checking_cycle():
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycle(graph) == ["a", "b", "a"]


def _listed_order() -> list[str]:
    """The modules in the order ``classify/__init__.py``'s docstring lists them, lowest first."""
    doc = importlib.import_module("nablax.xcs.classify").__doc__ or ""
    return re.findall(r"^- ``(\w+)\.py``", doc, flags=re.M)


def test_classify_modules_import_only_the_modules_listed_below_them():
    order = _listed_order()
    on_disk = sorted(p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__")
    assert sorted(order) == on_disk, "list every module in classify/__init__.py's docstring"
    assert order[0] == "records"
    graph = _xcs_graph()
    prefix = "nablax.xcs.classify."
    for i, mod in enumerate(order):
        targets = graph[prefix + mod]
        inside = {t.removeprefix(prefix) for t in targets if t.startswith(prefix)}
        above = inside - set(order[:i])
        assert not above, f"classify/{mod}.py imports {sorted(above)}, listed above it"
        outside = {t for t in targets if not t.startswith(prefix)}
        assert outside <= {"nablax.xcs.markers"}, (mod, outside)
    assert graph[prefix + "records"] == set()


def test_the_function_xcs_classify_keeps_its_name():
    """``nablax.xcs.classify`` is the public function, after every module of the package that
    shares its name has been imported; the modules are reached with ``from ... import``."""
    for stem in _listed_order():
        importlib.import_module(f"nablax.xcs.classify.{stem}")
    assert isinstance(xcs.classify, types.FunctionType)
    assert xcs.classify.__module__ == "nablax.xcs.classify.analysis"
    from nablax.xcs.classify import analysis

    assert analysis.classify is xcs.classify
    with pytest.raises((ImportError, AttributeError)):  # the documented limitation
        exec("import nablax.xcs.classify.analysis as a", {})

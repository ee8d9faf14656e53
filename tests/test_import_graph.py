"""The import graph of ``src/nablax`` has no cycles and follows the package layers (DESIGN.md,
"Package layout" and convention 14).

The graph is built from the source with ``ast``, never by importing: every ``import``/``from ...
import`` statement counts, at module level or inside a function (a function-level import is still
a dependency, it only runs later), and those under ``if TYPE_CHECKING:`` too (an annotation that
needs a module above is a layering fault a type checker hides; late bindings go through
core/hooks.py instead). Relative imports are
resolved against the importing module, and ``from . import x`` of a submodule ``x`` is an edge to
that submodule. Edges *to* a package's ``__init__`` are left out, as in
``shared/tools/import_cycles.py`` (the check review uses): importing ``a.b.c`` always runs ``a``'s
and ``a.b``'s ``__init__`` first, so counting them would make every package that re-exports its
submodules a cycle.
"""

from __future__ import annotations

import ast
import collections
import textwrap
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"

# Lowest first; a module may import from its own layer and the layers below it. A module belongs
# to the layer with the longest prefix of its name (DESIGN.md: imports go `xcs -> core ->
# kernels`; in core: graph/IR, then realization, then Tensor, then ops, sharding and transforms).
LAYERS = [
    (
        "base",
        (
            "nablax.errors",
            "nablax._config",
            "nablax._config_object",
            "nablax.tree",
            "nablax._caches",
        ),
    ),
    ("kernels", ("nablax.kernels",)),
    (
        "core IR",
        (
            "nablax.core.graph",
            "nablax.core.context",
            "nablax.core.primitive",
            "nablax.core.dtypes",
            "nablax.core.host",
            "nablax.core.mesh",  # the layout types Tensor's annotations need
        ),
    ),
    (
        "core realize",
        (
            "nablax.core.realize",
            "nablax.core.connected",
            "nablax.core.cpu_threads",
            "nablax.core.host_limits",
            "nablax.core.recompiles",
            "nablax.core.host_memory",
            "nablax.core.gc_threshold",
        ),
    ),
    ("core build", ("nablax.core.build",)),
    ("core tensor", ("nablax.core.tensor",)),
    ("core prims", ("nablax.core.prims",)),
    ("core ops/transforms", ("nablax.core",)),
    ("models", ("nablax.nn", "nablax.optim", "nablax._io", "nablax._files")),
    ("xcs", ("nablax.xcs",)),
    ("application", ("nablax", "nablax.cli", "nablax.demo")),
]


def find_modules(src: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` of every ``.py`` file of ``package`` under ``src``."""
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = path.relative_to(src).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _known(name: str, mods: dict) -> str | None:
    """The module ``name`` refers to: itself, or its longest prefix that is a module."""
    while name and name not in mods:
        name = name.rpartition(".")[0]
    return name or None


def _targets(node: ast.AST, module: str, is_pkg: bool, mods: dict) -> list[str]:
    if isinstance(node, ast.Import):
        return [t for a in node.names if (t := _known(a.name, mods))]
    if node.level:
        base = (module if is_pkg else module.rpartition(".")[0]).split(".")
        base = base[: len(base) - (node.level - 1)]
        source = ".".join(base + ([node.module] if node.module else []))
    else:
        source = node.module or ""
    out = []
    for a in node.names:  # ``from pkg import sub`` imports the submodule ``pkg.sub``
        t = _known(f"{source}.{a.name}" if f"{source}.{a.name}" in mods else source, mods)
        if t:
            out.append(t)
    return out


def import_graph(src: Path, package: str) -> tuple[dict, dict]:
    """``(graph, packages)``: ``graph[m][t]`` lists where module ``m`` imports module ``t``
    (``"path:line"``); ``packages`` is the set of package (``__init__``) modules."""
    mods = find_modules(src, package)
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    graph: dict = {m: collections.defaultdict(list) for m in mods}
    for m, path in mods.items():
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):  # TYPE_CHECKING imports included
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            where = f"{path.relative_to(src.parent)}:{node.lineno}"
            for t in _targets(node, m, m in packages, mods):
                if t != m and where not in graph[m][t]:
                    graph[m][t].append(where)
    return graph, packages


def module_edges(graph: dict, packages: set) -> dict[str, set[str]]:
    """The edges that count for cycles: those to a package ``__init__`` are left out."""
    return {m: {t for t in ts if t not in packages} for m, ts in graph.items()}


def _sccs(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (iterative Tarjan)."""
    index: dict = {}
    low: dict = {}
    stack: list = []
    on: set = set()
    out = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def _shortest_path(edges: dict, start: str, goal: str, within: set) -> list[str]:
    prev = {start: None}
    queue = collections.deque([start])
    while queue:
        v = queue.popleft()
        if v == goal:
            path = []
            while v is not None:
                path.append(v)
                v = prev[v]
            return path[::-1]
        for w in sorted(edges[v]):
            if w in within and w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError("no path inside a strongly connected component")  # pragma: no cover


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One shortest cycle through every import edge that lies on a cycle, as module paths
    ``[a, b, ..., a]`` (rotated to start at their smallest name, duplicates dropped)."""
    found: dict = {}
    for comp in _sccs(edges):
        members = set(comp)
        for a in comp:
            for b in sorted(edges[a] & members):
                path = [a] + _shortest_path(edges, b, a, members)
                ring = path[:-1]
                k = ring.index(min(ring))
                ring = ring[k:] + ring[:k]
                found.setdefault(tuple(ring), ring + ring[:1])
    return sorted(found.values())


def describe_cycle(cycle: list[str], graph: dict) -> str:
    lines = [" -> ".join(cycle)]
    for a, b in zip(cycle, cycle[1:]):
        lines.append(f"    {a} -> {b}: {', '.join(graph[a][b])}")
    return "\n".join(lines)


def layer_of(module: str) -> int:
    best, level = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, level = len(p), i
    assert level is not None, f"{module} is in no layer: add it to LAYERS"
    return level


def layer_violations(graph: dict, packages: set) -> list[str]:
    """Imports of a module of a higher layer (package ``__init__`` targets left out, as for
    cycles: ``import nablax as nx`` in xcs reads the public names of the layers below)."""
    out = []
    for m, targets in sorted(graph.items()):
        for t, where in sorted(targets.items()):
            if t not in packages and layer_of(t) > layer_of(m):
                out.append(
                    f"{m} ({LAYERS[layer_of(m)][0]}) imports {t} ({LAYERS[layer_of(t)][0]}) "
                    f"at {', '.join(where)}"
                )
    return out


# ---- the checks on nablax ----------------------------------------------------------------------


def test_no_import_cycles():
    graph, packages = import_graph(SRC, "nablax")
    cycles = find_cycles(module_edges(graph, packages))
    assert not cycles, (
        f"{len(cycles)} import cycle(s) among src/nablax modules (function-level and "
        f"TYPE_CHECKING imports count; move shared code to a lower module, let the higher layer "
        f"bind itself through core/hooks.py, or pass a callable):\n"
        + "\n".join(describe_cycle(c, graph) for c in cycles)
    )


def test_imports_follow_the_layers():
    graph, packages = import_graph(SRC, "nablax")
    bad = layer_violations(graph, packages)
    assert not bad, "imports from a higher layer (see LAYERS):\n" + "\n".join(bad)


def test_the_graph_sees_every_kind_of_import():
    """The parser finds module-level, function-level, relative, ``from . import submodule`` and
    absolute imports in the real source (so the two checks above cannot pass vacuously)."""
    graph, packages = import_graph(SRC, "nablax")
    assert len(graph) > 50 and "nablax.core.ops" in packages
    edges = module_edges(graph, packages)
    assert "nablax.core.realize" in edges["nablax.core.tensor"]  # module level, relative
    assert "nablax.xcs.classify.analysis" in edges["nablax.cli"]  # inside a function
    assert "nablax.core.prims._rules" in edges["nablax.core.sharding"]  # from .prims import _rules
    assert "nablax.core.tensor" in edges["nablax.xcs.transforms"]  # absolute, in a function
    assert "nablax.core.ops" not in edges["nablax.core.sharding"]  # the package: left out
    assert "nablax.xcs.classify.source" in edges["nablax.xcs.classify.effects"]  # TYPE_CHECKING


# ---- the checker itself, on a small package with known cycles -----------------------------------


def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_checker_reports_each_cycle_with_its_import_lines(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from . import a, b\n",
            "pkg/a.py": "from .b import f\n",
            "pkg/b.py": "def f():\n    from . import a\n    from .sub import c\n",
            "pkg/sub/__init__.py": "",
            "pkg/sub/c.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from . import d\n"
            "import pkg.sub.d\n",
            "pkg/sub/d.py": "def g():\n    from ..b import f\n    from .. import a as _a\n",
        },
    )
    graph, packages = import_graph(tmp_path, "pkg")
    assert packages == {"pkg", "pkg.sub"}
    edges = module_edges(graph, packages)
    assert edges == {
        "pkg": {"pkg.a", "pkg.b"},
        "pkg.a": {"pkg.b"},
        "pkg.b": {"pkg.a", "pkg.sub.c"},
        "pkg.sub": set(),
        "pkg.sub.c": {"pkg.sub.d"},  # the TYPE_CHECKING import and the absolute one
        "pkg.sub.d": {"pkg.a", "pkg.b"},
    }
    cycles = find_cycles(edges)
    assert cycles == [
        ["pkg.a", "pkg.b", "pkg.a"],
        ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.sub.d", "pkg.a"],
        ["pkg.b", "pkg.sub.c", "pkg.sub.d", "pkg.b"],
    ]
    text = describe_cycle(cycles[0], graph)
    assert text.splitlines() == [
        "pkg.a -> pkg.b -> pkg.a",
        f"    pkg.a -> pkg.b: {Path(tmp_path.name, 'pkg', 'a.py')}:1",
        f"    pkg.b -> pkg.a: {Path(tmp_path.name, 'pkg', 'b.py')}:2",
    ]


def test_checker_counts_type_checking_imports(tmp_path):
    """An import under ``if TYPE_CHECKING:`` is an edge: it closes a cycle as any other does."""
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "",
            "pkg/low.py": "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from .high import H\n",
            "pkg/high.py": "from .low import L\n",
        },
    )
    graph, packages = import_graph(tmp_path, "pkg")
    edges = module_edges(graph, packages)
    assert edges["pkg.low"] == {"pkg.high"} and edges["pkg.high"] == {"pkg.low"}
    assert find_cycles(edges) == [["pkg.high", "pkg.low", "pkg.high"]]


def test_checker_finds_no_cycle_in_a_layered_package(tmp_path):
    _write(
        tmp_path,
        {
            "pkg/__init__.py": "from .top import run\n",
            "pkg/low.py": "X = 1\n",
            "pkg/mid.py": "from . import low\n",
            "pkg/top.py": "def run():\n    from .mid import low\n    from pkg import mid\n",
        },
    )
    graph, packages = import_graph(tmp_path, "pkg")
    edges = module_edges(graph, packages)
    assert edges["pkg.top"] == {"pkg.mid"} and edges["pkg.mid"] == {"pkg.low"}
    assert find_cycles(edges) == []


def test_layers_flag_an_upward_import():
    graph = {
        "nablax.core.tensor": {"nablax.core.ops.elementwise": ["src/nablax/core/tensor.py:9"]},
        "nablax.core.ops.elementwise": {"nablax.core.tensor": ["x.py:1"]},
        "nablax.kernels.cache": {"nablax.core.realize": ["src/nablax/kernels/cache.py:3"]},
        "nablax.xcs.runtime": {"nablax.core.tensor": ["y.py:2"], "nablax": ["y.py:3"]},
    }
    assert layer_violations(graph, {"nablax", "nablax.core"}) == [
        "nablax.core.tensor (core tensor) imports nablax.core.ops.elementwise (core ops/transforms)"
        " at src/nablax/core/tensor.py:9",
        "nablax.kernels.cache (kernels) imports nablax.core.realize (core realize) at "
        "src/nablax/kernels/cache.py:3",
    ]

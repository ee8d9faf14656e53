"""Every cache of ``nablax.xcs`` is a registered, bounded ``nablax._caches.Cache``: using xcs fills
each of them, ``nx.cache_info()`` reports them with their bound, ``nx.clear_caches()`` empties
them, and no xcs module keeps other module-level mutable state than the process-wide state that
``xcs/_context.py`` names."""

from __future__ import annotations

import ast
from pathlib import Path

import jax.numpy as jnp
import numpy as np

import nablax as nx
from nablax import xcs
from nablax.xcs.classify.analysis import classify_target

XCS = Path(xcs.__file__).resolve().parent
EXPECTED = {
    "xcs.classifier",  # classifications (classify/analysis.py)
    "xcs.source_files",  # parsed source files (classify/source.py)
    "xcs.source_facts",  # facts of each function's code (classify/source.py)
    "xcs.module_files",  # module name -> its file (classify/objects.py)
    "xcs.target_modules",  # files imported by classify_target (classify/target.py)
    "xcs.shared_types",  # argument types passed as they are (_snapshot.py)
    "xcs.mutates_arguments",  # functions that change their arguments (_snapshot.py)
    "xcs.grad_bodies",  # functions rewritten for xcs.grad (hybrid.py)
}


@xcs.mark_orchestration(effects=False)
def _lookup(items):
    return len(items)


def _appends(history, x):
    history.append(x)
    return len(history)


def _program(items):
    n = _lookup(items)
    return _appends(items, n)


def _hybrid_loss(x):
    return jnp.sum(x * x) * _lookup([1, 2])


def _use_xcs(tmp_path: Path) -> None:
    """Use xcs so that every one of its caches holds something."""
    xcs.classify(_program)
    target = tmp_path / "user_code.py"
    target.write_text("import numpy as np\n\n\ndef score(x):\n    return np.tanh(x).sum()\n")
    assert dict(classify_target(str(target)))["score"].kind == "tensor"
    assert xcs.jit(_program)([1, 2, 3]) == 4
    g = xcs.grad(_hybrid_loss)(jnp.array([1.0, 2.0]))
    np.testing.assert_allclose(np.asarray(g), [4.0, 8.0])


def test_every_xcs_cache_is_registered_bounded_and_emptied_by_clear_caches(tmp_path):
    nx.clear_caches()
    _use_xcs(tmp_path)
    info = {k: v for k, v in nx.cache_info().items() if k.startswith("xcs.")}
    assert set(info) == EXPECTED
    for name, stats in info.items():
        assert stats.size > 0, f"{name} holds nothing after xcs was used"
        assert stats.maxsize is not None and stats.size <= stats.maxsize, name
    nx.clear_caches()
    after = {k: v.size for k, v in nx.cache_info().items() if k.startswith("xcs.")}
    assert after == dict.fromkeys(EXPECTED, 0)
    # and everything still works from empty caches
    _use_xcs(tmp_path)


def test_classify_target_imports_a_file_again_only_after_the_cache_is_cleared(tmp_path):
    target = tmp_path / "counted.py"
    target.write_text("import builtins\nbuiltins.__dict__.setdefault('_xcs_runs', []).append(1)\n")
    import builtins

    runs = builtins.__dict__.setdefault("_xcs_runs", [])
    start = len(runs)
    try:
        classify_target(str(target))
        classify_target(str(target))
        assert len(runs) == start + 1  # cached by path and modification time
        nx.clear_caches()
        classify_target(str(target))
        assert len(runs) == start + 2
    finally:
        builtins.__dict__.pop("_xcs_runs", None)


# ---- no other module-level state ------------------------------------------------------------

_CONTAINERS = {
    "dict",
    "list",
    "set",
    "OrderedDict",
    "defaultdict",
    "deque",
    "WeakKeyDictionary",
    "WeakValueDictionary",
    "WeakSet",
    "local",
    "ContextVar",
}
# process-wide on purpose (xcs/_context.py says why); per-thread state lives in xcs/_context.py
ALLOWED = {
    "scheduler.py": {"_pools", "_queue"},
    "markers.py": {"EPOCH"},
    "transforms.py": {"_HOST"},
    "_context.py": {"_ENGINE", "_GRAD_OWNER", "_THREAD"},
}


def _mutable_globals(path: Path) -> set[str]:
    """Module-level names bound to an empty container, a list, or a container/state constructor
    (``dict()``, ``OrderedDict()``, ``threading.local()``, ``ContextVar(...)``, ...)."""
    out = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        empty = isinstance(value, (ast.Dict, ast.Set)) and not (
            value.keys if isinstance(value, ast.Dict) else value.elts
        )
        called = isinstance(value, ast.Call) and (
            getattr(value.func, "id", None) or getattr(value.func, "attr", None)
        )
        if empty or isinstance(value, ast.List) or called in _CONTAINERS:
            out.update(t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__")
    return out


def test_xcs_keeps_no_other_module_level_mutable_state():
    found = {}
    for path in sorted(XCS.rglob("*.py")):
        rel = str(path.relative_to(XCS))
        extra = _mutable_globals(path) - ALLOWED.get(rel, set())
        if extra:
            found[rel] = sorted(extra)
    assert not found, (
        f"module-level mutable state in xcs: {found}. Fix: a cache is a registered "
        "nablax._caches.Cache; per-thread state goes on xcs/_context.py's XCS; process-wide "
        "state is named in xcs/_context.py's docstring and in ALLOWED here"
    )


def test_the_state_scan_sees_each_kind(tmp_path):
    path = tmp_path / "m.py"
    path.write_text(
        "import threading, contextvars, collections\n"
        "A = {}\nB = []\nC = threading.local()\nD = contextvars.ContextVar('d')\n"
        "E = collections.OrderedDict()\nF = {'k': 1}\nG = (1, 2)\nH = frozenset()\n"
        "__all__ = ['A']\n"
    )
    assert _mutable_globals(path) == {"A", "B", "C", "D", "E"}

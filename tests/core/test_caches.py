"""The one ``Cache`` type and its registry: ``nx.cache_info()`` reports every in-memory cache,
``nx.clear_caches()`` empties them all (issue 17, point 5)."""

from __future__ import annotations

import ast
import threading
from pathlib import Path

import numpy as np
import pytest

import nablax as nx
from nablax import _caches

SRC = Path(__file__).resolve().parents[2] / "src" / "nablax"


def _fill_every_cache():
    """Use nablax so that each registered cache holds something."""
    import nablax.kernels.executor  # noqa: F401 - registers "kernels.executor"
    from nablax.xcs.classify import analysis

    x = nx.tensor(np.arange(6.0, dtype=np.float32).reshape(2, 3))
    (x * 2 + 1).sum().item()  # realization cache
    nx.grad(lambda t: (t * t).sum())(x).numpy()  # autodiff plans
    nx.einsum("ij,kj->ik", x, x).numpy()  # einsum shapes and specs
    x[0, 1:].numpy()  # getitem shapes

    @nx.compile
    def f(t):
        return t * 3

    f(x).numpy()
    analysis.classify(_fill_every_cache)
    return f


def test_cache_info_lists_every_registered_cache_and_keeps_the_realization_fields():
    nx.clear_caches()
    f = _fill_every_cache()
    info = nx.cache_info()
    assert isinstance(info, nx.CacheReport) and isinstance(info, dict)
    assert set(info) == set(_caches.infos())
    for name in (
        "realize.executables",
        "autodiff.plans",
        "compile.executables",
        "kernels.executor",
        "xcs.classifier",
        "ops.einsum_shapes",
        "ops.einsum_specs",
        "ops.getitem_shapes",
    ):
        assert isinstance(info[name], nx.CacheStats) and info[name].name == name
    for name in ("realize.executables", "autodiff.plans", "ops.einsum_shapes", "xcs.classifier"):
        assert info[name].size > 0, name
    # the realization cache's fields are attributes, as when cache_info() returned only them
    legacy = nx.core.realize.cache_info()
    assert (info.compiles, info.hits, info.executables) == (
        legacy.compiles,
        legacy.hits,
        legacy.executables,
    )
    assert info["realize.executables"].size == legacy.executables
    assert info["compile.executables"].size == f.cache_info().executables == 1
    assert "CacheInfo(" in repr(info) and "'compile.executables'" in repr(info)


def test_clear_caches_empties_every_registered_cache():
    f = _fill_every_cache()
    nx.clear_caches()
    info = nx.cache_info()
    for name, stats in info.items():
        assert stats.size == 0, name
        assert stats.hits in (0, None) and stats.misses in (0, None), name
    assert f.cache_info().executables == 0 and f.cache_info().size == 0
    assert nx.core.transforms.plan.plan_info() == (0, 0, 0)


def test_compiled_executables_are_summed_over_live_functions_and_cleared():
    nx.clear_caches()

    @nx.compile
    def g(t):
        return t + 1

    @nx.compile
    def h(t):
        return t - 1

    for n in (2, 3, 4):
        g(nx.ones(n)).numpy()
    h(nx.ones(5)).numpy()
    h(nx.ones(5)).numpy()
    stats = nx.cache_info()["compile.executables"]
    assert stats.size == g.cache_info().executables + h.cache_info().executables == 4
    assert stats.hits == 1 and stats.misses == 4
    nx.clear_caches()
    assert nx.cache_info()["compile.executables"].size == 0
    assert g.cache_info().executables == 0
    np.testing.assert_allclose(g(nx.ones(2)).numpy(), [2.0, 2.0])  # still works: retraces


def test_lru_bound_and_counters():
    c = _caches.Cache("test.lru", 3, register=False)
    for k in range(5):
        c.put(k, k * 10)
    assert len(c) == 3 and c.info().evictions == 2
    assert c.get(0) is None and c.get(1) is None  # the oldest went first
    assert c.get(2) == 20  # 2 becomes the most recent
    c.put(5, 50)  # evicts 3, the least recently used
    assert 3 not in c and 2 in c
    made = []
    assert c.get_or_make(9, lambda: made.append(1) or 90) == 90
    assert c.get_or_make(9, lambda: made.append(1) or 91) == 90
    assert made == [1]
    assert c.info() == _caches.CacheStats("test.lru", 2, 3, 3, 3, 4)
    c.clear()
    assert c.info() == _caches.CacheStats("test.lru", 0, 0, 0, 3, 0)


def test_maxsize_can_follow_an_option_and_none_is_unbounded():
    limit = [2]
    c = _caches.Cache("test.dynamic", lambda: limit[0], register=False)
    for k in range(4):
        c.put(k, k)
    assert len(c) == 2
    limit[0] = 3
    for k in range(10, 14):
        c.put(k, k)
    assert len(c) == 3 and c.info().maxsize == 3
    u = _caches.Cache("test.unbounded", None, register=False)
    for k in range(10_000):
        u.put(k, k)
    assert len(u) == 10_000 and u.info().evictions == 0


def test_registry_names_are_unique_and_constructed_caches_register():
    name = "test.registered-once"
    c = _caches.Cache(name, 4)
    try:
        c.put("k", 1)
        assert nx.cache_info()[name].size == 1
        nx.clear_caches()
        assert len(c) == 0
        with pytest.raises(ValueError, match="already registered"):
            _caches.Cache(name, 4)
    finally:
        with _caches._registry_lock:
            del _caches._registry[name]


def test_threads_hammering_get_or_make_keep_counts_consistent():
    c = _caches.Cache("test.threads", 16, register=False)
    made = []
    lock = threading.Lock()
    n_threads, n_calls, n_keys = 8, 2000, 24

    def make(k):
        with lock:
            made.append(k)
        return k * k

    errors = []

    def work(seed):
        rng = np.random.default_rng(seed)
        for k in rng.integers(0, n_keys, n_calls):
            k = int(k)
            if c.get_or_make(k, lambda k=k: make(k)) != k * k:
                errors.append(k)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = c.info()
    assert not errors
    assert info.hits + info.misses == n_threads * n_calls
    assert info.misses == len(made)  # every miss made the value exactly once
    assert info.size == 16 and info.evictions == info.misses - 16


def _memo_names(path: Path) -> list[str]:
    """Module-level plain-dict / OrderedDict / lru_cache memos named like caches in ``path``."""
    tree = ast.parse(path.read_text())
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            value = ast.unparse(node.value)
            plain = value in ("{}", "dict()") or value.endswith("OrderedDict()")
            for t in targets:
                if (
                    isinstance(t, ast.Name)
                    and plain
                    and any(w in t.id.lower() for w in ("cache", "memo"))
                ):
                    found.append(f"{path.relative_to(SRC)}:{node.lineno} {t.id}")
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                if "lru_cache" in ast.unparse(d):
                    found.append(
                        f"{path.relative_to(SRC)}:{node.lineno} @{ast.unparse(d)} {node.name}"
                    )
    return found


# Memos that stay plain dicts on purpose (see the issue-17 report): per-op hot paths keyed by a
# finite set of dtypes/ops, where a locked Cache lookup would cost ~1 us on every tensor op.
_HOT_PATH_MEMOS = {
    "core/dtypes.py _promote_cache",
    "core/dtypes.py _weak_cache",
    "core/prims/elementwise_build.py _kind_cache",
    "core/prims/_util.py _bcast_cache",
}


def test_no_other_module_level_memo_dicts():
    found = [m for p in sorted(SRC.rglob("*.py")) for m in _memo_names(p)]
    left = [m for m in found if f"{m.split(':')[0]} {m.split()[-1]}" not in _HOT_PATH_MEMOS]
    assert not left, "use nablax._caches.Cache for these memos:\n" + "\n".join(left)

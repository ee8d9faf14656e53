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


def test_no_module_level_memo_dicts():
    # the per-op hot paths (dtype promotion, broadcast shapes, element-wise dtype rules) are
    # _caches.DictCache objects: plain dicts read without a lock, yet bounded and registered
    found = [m for p in sorted(SRC.rglob("*.py")) for m in _memo_names(p)]
    assert not found, (
        "use nablax._caches.Cache (or DictCache on a per-op path) for these memos:\n"
        + "\n".join(found)
    )


# ---- DictCache: the per-op memos -----------------------------------------------------------------


def test_dict_cache_bound_is_first_in_first_out_and_clear_keeps_the_dict():
    c = _caches.DictCache("test.dict", 3, register=False)
    data = c.data
    assert [c.put(k, k * 10) for k in range(5)] == [0, 10, 20, 30, 40]
    assert data == {2: 20, 3: 30, 4: 40} and c.info().evictions == 2
    c.put(3, 31)  # an update of a held key evicts nothing
    assert data == {2: 20, 3: 31, 4: 40} and c.info() == _caches.CacheStats(
        "test.dict", None, None, 3, 3, 2
    )
    assert c.get(4) == 40 and c.get(0, "gone") == "gone" and 2 in c and len(c) == 3
    c.clear()
    assert c.data is data and data == {} and c.info().evictions == 0  # readers keep their dict
    with pytest.raises(ValueError, match="maxsize must be a positive int"):
        _caches.DictCache("test.dict-bad", 0, register=False)


def test_dict_cache_puts_from_threads_stay_within_the_bound():
    c = _caches.DictCache("test.dict-threads", 50, register=False)

    def work(seed):
        for k in np.random.default_rng(seed).integers(0, 500, 3000):
            c.put(int(k), int(k))
            assert c.data.get(int(k), int(k)) == int(k)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(c) == 50 and all(k == v for k, v in c.data.items())


def test_cache_on_evict_and_evict():
    dropped = []
    c = _caches.Cache("test.on-evict", 3, register=False, on_evict=lambda k, v: dropped.append(k))
    for k in range(5):
        c.put(k, k)
    assert dropped == [0, 1]
    assert c.evict(2) == 2 and dropped == [0, 1, 2, 3] and list(c.values()) == [4]
    assert c.evict(10) == 1 and len(c) == 0 and c.info().evictions == 5
    c.put("a", 1)
    c.clear()  # clearing is not evicting
    assert dropped == [0, 1, 2, 3, 4]


def test_clear_caches_empties_the_per_op_memos_and_ops_stay_right():
    from nablax.core import dtypes
    from nablax.core.prims import _util, elementwise, fused, shape
    from nablax.core.prims.elementwise import builders, dtype_rules

    def use():
        a = np.arange(6, dtype=np.int8).reshape(2, 3)
        b = np.linspace(-1.0, 1.0, 3, dtype=np.float32)
        got = {
            "int_scalar": (nx.tensor(a) + 300).numpy(),  # weak int wraps into int8
            "promote": (nx.tensor(a) * nx.tensor(b)).numpy(),  # int8 x float32, broadcast
            "float_scalar": (nx.tensor(b) * 1.5 - 2).numpy(),
            "arccosh_grad": nx.grad(lambda t: nx.arccosh(t).sum())(nx.tensor([2.0, 3.0])).numpy(),
            "transpose": nx.tensor(a).transpose((1, 0)).numpy(),  # a checked permutation
            "reshape": nx.tensor(a).reshape(3, -1).numpy(),  # a resolved -1
        }
        opt = nx.optim.adam(0.1)
        p = {"w": nx.tensor(b)}
        updates, _ = opt.update({"w": nx.tensor(b)}, opt.init(p), p)
        got["adam"] = updates["w"].numpy()
        return got

    def expected():
        a = np.arange(6, dtype=np.int8).reshape(2, 3)
        b = np.linspace(-1.0, 1.0, 3, dtype=np.float32)
        return {
            "int_scalar": (a.astype(np.int32) + 300).astype(np.int8),
            "promote": a.astype(np.float32) * b,
            "float_scalar": b * np.float32(1.5) - np.float32(2),
            "arccosh_grad": 1 / np.sqrt(np.array([2.0, 3.0], np.float32) ** 2 - 1),
            "adam": -0.1 * np.sign(b),  # first Adam step: lr * g / (|g| + eps)
            "transpose": a.T,
            "reshape": a.reshape(3, 2),
        }

    memos = {
        "dtypes.promote": dtypes._promote_cache,
        "dtypes.promote_scalar": dtypes._weak_cache,
        "ops.broadcast_shapes": _util._bcast_cache,
        "ops.elementwise_dtypes": dtype_rules._kind_cache,
        "ops.integer_ranges": dtype_rules._INT_WRAP,
        "ops.adam_float_dtypes": fused._FLOAT,
        "ops.jax_probes": elementwise._JAX_PROBES,
        "ops.transpose_perms": shape._PERMS,
        "ops.reshape_shapes": shape._RESHAPES,
    }
    for _ in range(2):  # the second round runs on emptied memos: same values
        nx.clear_caches()
        for name, got in use().items():
            want = expected()[name]
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=name)
            assert got.dtype == want.dtype, name
        info = nx.cache_info()
        for name, memo in memos.items():
            assert len(memo) > 0 and info[name].size == len(memo), name
        assert info["ops.scalar_rules"].size > 0
    nx.clear_caches()
    info = nx.cache_info()
    for name, memo in memos.items():
        assert len(memo) == 0 and info[name].size == 0, name
    assert info["ops.scalar_rules"].size == 0
    assert all(len(c) == 0 for c in builders._SCALAR_RULES)


# ---- the realization cache is a Cache --------------------------------------------------------------


def test_realization_cache_is_a_bounded_cache_and_a_failed_compile_stores_nothing(monkeypatch):
    from nablax.core import realize

    nx.clear_caches()
    assert isinstance(realize._S.cache, _caches.Cache)
    real_compile = realize._compile
    calls = []

    def failing(key, consts):
        calls.append(key)
        raise RuntimeError("compile failed (test)")

    monkeypatch.setattr(realize, "_compile", failing)
    with pytest.raises(RuntimeError, match="compile failed"):
        (nx.ones(3) * 2 + 1).numpy()
    assert len(realize._S.cache) == 0  # no half-made entry for that structure
    monkeypatch.setattr(realize, "_compile", real_compile)
    # the same structure realizes normally (it used to find the empty entry: 'NoneType' call)
    np.testing.assert_allclose((nx.ones(3) * 2 + 1).numpy(), [3.0, 3.0, 3.0])
    assert nx.cache_info()["realize.executables"].size == 1

    with nx.config.override(max_executables=2):
        for n in range(2, 6):
            (nx.ones(n) + 1).numpy()
        stats = nx.cache_info()["realize.executables"]
        assert (stats.size, stats.maxsize, stats.evictions) == (2, 2, 3)
        assert nx.cache_info().evictions == 3


def test_compiled_function_cache_is_an_lru_cache_whose_evictions_leave_the_fast_path():
    calls = []

    @nx.compile(max_cache_size=2)
    def f(t):
        calls.append(t.shape)
        return t * 2

    def ones(n):  # realized arguments: calls take the fast path (signature -> entry)
        return nx.tensor(np.ones(n, np.float32))

    assert isinstance(f._cache, _caches.Cache) and f._cache.maxsize == 2
    for n in (2, 3, 3, 4):  # 4 evicts 2, the least recently stored
        np.testing.assert_allclose(f(ones(n)).numpy(), np.full(n, 2.0))
    assert calls == [(2,), (3,), (4,)] and len(f._fast) == 2
    # 2's fast-path entry went with it: traced again (not served by a stale fast entry)
    np.testing.assert_allclose(f(ones(2)).numpy(), [2.0, 2.0])
    assert calls == [(2,), (3,), (4,), (2,)]
    info = f.cache_info()
    assert (info.size, info.evictions, info.traces, info.hits) == (2, 2, 4, 1)
    assert len(f._fast) == 2


def test_retrace_watch_remembers_a_bounded_lru_of_signatures():
    from nablax.core.transforms.compile.scalars import RetraceWatch

    w = RetraceWatch("f")
    assert isinstance(w.last, _caches.Cache)
    for k in range(RetraceWatch._KEEP + 10):
        w.note(("sig", k), (k,), lambda: ["x"])
    assert len(w.last) == RetraceWatch._KEEP and w.count == 0
    w.note(("sig", 0), (1,), lambda: ["x"])  # forgotten: a first trace again, not a retrace
    assert w.count == 0
    w.note(("sig", RetraceWatch._KEEP + 9), (-1,), lambda: ["x"])  # held: its value changed
    assert w.count == 1 and w.changed == {"x": [RetraceWatch._KEEP + 9, -1]}
    w.clear()
    assert len(w.last) == 0 and w.count == 0

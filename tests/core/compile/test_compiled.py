"""``nx.compile``: trace cache counts, static arguments, mixed outputs, graph breaks, LRU eviction
and the compositions with autodiff and vmap (against JAX)."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_hits_skip_tracing_and_match_eager():
    calls = []

    @nx.compile
    def f(w, x):
        calls.append(1)
        return nx.tanh(x @ w).sum(axis=0) * 2.0

    w, x = _x((3, 4)), _x((5, 3), 1)
    for k in range(4):
        got = f(nx.tensor(w), nx.tensor(x + k))
        want = np.tanh((x + k) @ w).sum(axis=0) * 2.0
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)
        assert got.is_realized
    assert len(calls) == 1  # traced once: hits never run the Python function
    info = f.cache_info()
    assert (info.hits, info.misses, info.traces, info.executables, info.size) == (3, 1, 1, 1, 1)
    f(nx.tensor(_x((3, 2))), nx.tensor(x))  # a new shape is a new signature
    assert f.cache_info().traces == 2 and len(calls) == 2
    f.clear_cache()
    assert f.cache_info() == type(f.cache_info())(0, 0, 0, 0, 0, 0)


def test_mixed_outputs_and_pytrees_come_back_whole():
    @nx.compile
    def f(p, n):
        return {"y": p["w"] * n, "meta": ("tag", 3, None), "list": [p["b"] + 1, 2.5]}

    p = {"w": nx.tensor([1.0, 2.0]), "b": nx.tensor(0.5)}
    for _ in range(2):
        out = f(p, nx.tensor(3.0))
        assert out["meta"] == ("tag", 3, None) and out["list"][1] == 2.5
        assert out["y"].tolist() == [3.0, 6.0] and out["list"][0].item() == 1.5
    assert f.cache_info().hits == 1


def test_static_arguments_are_part_of_the_key():
    f = nx.compile(
        lambda x, n, *, mode: x * n if mode == "mul" else x + n,
        static_argnums=1,
        static_argnames="mode",
    )
    x = nx.tensor([1.0, 2.0])
    assert f(x, 3, mode="mul").tolist() == [3.0, 6.0]
    assert f(x, 3, mode="add").tolist() == [4.0, 5.0]
    assert f(x, 3, mode="mul").tolist() == [3.0, 6.0]
    assert f.cache_info().traces == 2 and f.cache_info().hits == 1
    with pytest.raises(TypeError, match="static argument 1 is a list.*not hashable"):
        f(x, [3], mode="mul")
    # non-static Python numbers are traced, as in jax.jit (tests/core/compile/test_scalars.py)
    g = nx.compile(lambda x, k: x * k)
    assert g(x, 2).tolist() == [2.0, 4.0] and g(x, 3).tolist() == [3.0, 6.0]
    assert g.cache_info().traces == 1


def test_lru_eviction_at_max_cache_size():
    f = nx.compile(lambda x: x + 1, max_cache_size=2)
    for n in (1, 2, 3, 1):
        f(nx.ones(n))
    info = f.cache_info()
    assert info.size == 2 and info.evictions == 2 and info.traces == 4


def _breaks(x):
    if x.sum() > 0:  # a Python if on a traced value: a graph break
        return x * 2
    return -x


def test_fullgraph_true_raises_graph_break_naming_the_line():
    f = nx.compile(_breaks, fullgraph=True)
    with pytest.raises(nx.errors.GraphBreakError, match=r"test_compiled.py:\d+ \(if x.sum\(\) > 0"):
        f(nx.ones(3))


def test_fullgraph_false_falls_back_to_eager_with_one_warning():
    f = nx.compile(_breaks)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert f(nx.ones(3)).tolist() == [2.0, 2.0, 2.0]
        assert f(-nx.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert len(caught) == 1 and "runs eagerly" in str(caught[0].message)
    assert f.cache_info().executables == 0
    # nothing traced on the placeholders is left pending for later eager programs
    assert (nx.ones(2) * 3).sum().item() == 6.0


def test_global_random_key_inside_compile_is_an_error():
    f = nx.compile(lambda x: x + nx.random.normal(shape=(3,)))
    with pytest.raises(nx.errors.ConcretizationError, match="explicit key"):
        f(nx.ones(3))
    g = nx.compile(lambda x, k: x + nx.random.normal(k, (3,)))
    k = nx.random.key(1)
    np.testing.assert_array_equal(
        g(nx.zeros(3), k).numpy(), np.asarray(jax.random.normal(jax.random.PRNGKey(1), (3,)))
    )


def _dyn_step(w, x, y):
    def loss(w):
        logp = nx.log_softmax(nx.relu(x @ w + 1.0), axis=-1)
        return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))

    value, g = nx.value_and_grad(loss)(w)
    return w - 0.1 * g, value, x.reshape(-1), x.sum(0)


def test_dynamic_dims_reuse_one_trace_across_sizes():
    f = nx.compile(_dyn_step, dynamic_dims={1: {0: "batch"}, 2: {0: "batch"}})
    w = nx.tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5))
    rng = np.random.default_rng(0)
    for n in (3, 5, 8, 13, 21):
        x = nx.tensor(rng.standard_normal((n, 4)).astype(np.float32))
        y = nx.tensor(rng.integers(0, 5, n).astype(np.int32))
        got, want = f(w, x, y), _dyn_step(w, x, y)
        for g, e in zip(got, want):
            assert g.shape == e.shape
            np.testing.assert_allclose(g.numpy(), e.numpy(), rtol=1e-6, atol=1e-7)
    info = f.cache_info()
    assert (info.traces, info.executables, info.hits, info.size) == (1, 5, 4, 1)
    f(w, x, y)  # a size seen before: no new executable
    assert f.cache_info().executables == 5


def test_dynamic_dims_errors_and_fallback():
    f = nx.compile(_dyn_step, dynamic_dims={1: {0: "batch"}, 2: {0: "batch"}})
    w = nx.ones((4, 5))
    with pytest.raises(ValueError, match=r"'batch' is 3 in args\[1\].*but 4 in args\[2\]"):
        f(w, nx.ones((3, 4)), nx.zeros((4,), nx.int32))
    with pytest.raises(TypeError, match="dynamic_dims must look like"):
        nx.compile(_dyn_step, dynamic_dims={1: [0]})
    # code that needs a concrete size (a Python comparison) cannot serve every size: it is
    # traced per size, with one warning
    g = nx.compile(
        lambda x: x[: x.shape[0] // 2] if x.shape[0] > 2 else x, dynamic_dims={0: {0: "n"}}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert g(nx.ones((4, 2))).shape == (2, 2)
        assert g(nx.ones((6, 2))).shape == (3, 2)
    assert len(caught) == 1 and "each size is traced" in str(caught[0].message).lower()


# ---- compositions -------------------------------------------------------------------------------


def _loss_nx(w, x):
    return (nx.sin(x @ w) ** 2).mean()


def _loss_j(w, x):
    return (jnp.sin(x @ w) ** 2).mean()


def test_compile_of_grad_and_grad_of_compile_match_jax():
    w, x = _x((3, 2)), _x((4, 3), 1)
    want = jax.grad(_loss_j)(w, x)
    g = nx.compile(nx.grad(_loss_nx))
    for _ in range(2):
        np.testing.assert_allclose(g(nx.tensor(w), nx.tensor(x)).numpy(), want, rtol=1e-5)
    assert g.cache_info().hits == 1
    c = nx.compile(_loss_nx)
    np.testing.assert_allclose(
        nx.grad(c)(nx.tensor(w), nx.tensor(x)).numpy(), want, rtol=1e-5, atol=1e-7
    )


def test_compile_of_vmap_of_grad_and_vmap_of_compile_match_jax():
    w, xs = _x((3, 2)), _x((5, 4, 3), 1)
    want = jax.vmap(jax.grad(_loss_j), in_axes=(None, 0))(w, xs)
    h = nx.compile(nx.vmap(nx.grad(_loss_nx), in_axes=(None, 0)))
    for _ in range(2):
        np.testing.assert_allclose(
            h(nx.tensor(w), nx.tensor(xs)).numpy(), want, rtol=1e-5, atol=1e-7
        )
    c = nx.compile(_loss_nx)
    np.testing.assert_allclose(
        nx.vmap(c, in_axes=(None, 0))(nx.tensor(w), nx.tensor(xs)).numpy(),
        jax.vmap(_loss_j, in_axes=(None, 0))(w, xs),
        rtol=1e-5,
    )


def test_compiled_training_step_matches_jax():
    w, x = _x((3, 2)), _x((4, 3), 1)

    @nx.compile
    def step(w, x):
        loss, g = nx.value_and_grad(_loss_nx)(w, x)
        return w - 0.1 * g, loss

    @jax.jit
    def step_j(w, x):
        loss, g = jax.value_and_grad(_loss_j)(w, x)
        return w - 0.1 * g, loss

    wn, wj = nx.tensor(w), w
    for _ in range(5):
        wn, ln = step(wn, nx.tensor(x))
        wj, lj = step_j(wj, x)
        np.testing.assert_allclose(ln.item(), float(lj), rtol=1e-5)
    np.testing.assert_allclose(wn.numpy(), wj, rtol=1e-5, atol=1e-6)
    assert step.cache_info().traces == 1


def test_calls_from_many_threads_agree():
    from concurrent.futures import ThreadPoolExecutor

    f = nx.compile(lambda x: (x * 2).sum(), max_cache_size=3)

    def call(n):
        return f(nx.ones((n % 5 + 1, 2))).item()

    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(call, range(64)))
    assert got == [4.0 * (n % 5 + 1) for n in range(64)]
    info = f.cache_info()
    assert info.hits + info.misses == 64 and info.size <= 3


def test_compiled_function_called_while_tracing_runs_inline():
    # a compiled function called by a function being compiled is part of the outer trace (it
    # was a graph break: the outer function ran eagerly)
    inner = nx.compile(lambda x: nx.tanh(x) * 2)
    outer = nx.compile(lambda x, w: inner(x @ w) + 1)
    x, w = _x((4, 3)), _x((3, 2), 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            got = outer(nx.tensor(x), nx.tensor(w))
            np.testing.assert_allclose(got.numpy(), np.tanh(x @ w) * 2 + 1, rtol=1e-5)
    assert caught == []
    info = outer.cache_info()
    assert (info.traces, info.executables, info.hits) == (1, 1, 1)
    assert inner.cache_info().misses == 0  # never called on its own


def test_lazy_arguments_are_computed_by_one_program():
    @nx.compile
    def f(a, b, c):
        return a + 1, b + 1, c + 1

    args = [nx.zeros_like(nx.ones(s)) for s in ((3,), (4,), (3,))]  # pending arguments
    r0 = nx.cache_info().realizations
    out = f(*args)
    assert [o.tolist() for o in out] == [[1.0] * 3, [1.0] * 4, [1.0] * 3]
    assert nx.cache_info().realizations - r0 == 1  # not one program per lazy argument
    assert all(a.is_realized for a in args)


def test_pytree_arguments_of_realized_tensors_take_the_fast_path_soundly():
    """Lists/tuples/dicts of realized tensors and numbers skip the general path once their
    signature is known; the key still holds the structure, shapes, dtypes and number kinds."""
    traces = []

    def step(params, state, t):
        traces.append(1)
        return [p * t + state["s"] for p in params], {"s": state["s"] + 1.0}

    f = nx.compile(step)
    a, b = np.arange(3.0, dtype=np.float32), np.ones((2, 2), np.float32)
    params, state = [nx.tensor(a), nx.tensor(b)], {"s": nx.tensor(np.float32(0.5))}
    for k in range(4):  # the step counter is traced: one trace for all of them
        out, state2 = f(params, state, k)
        np.testing.assert_allclose(out[0].numpy(), a * k + 0.5)
        np.testing.assert_allclose(out[1].numpy(), b * k + 0.5)
        assert state2["s"].item() == 1.5
    info = f.cache_info()
    assert (len(traces), info.hits, info.misses) == (1, 3, 1)
    assert len(f._fast) == 1  # white box: the signature with its list and dict structure

    # what changes the program is never served by the fast path's entry
    out, _ = f((params[0], params[1]), state, 2)  # a tuple, not a list: another structure
    f(params, state, 2.0)  # a float step: another kind of number
    f([nx.tensor(a.astype(np.float16)), params[1]], state, 2)  # another dtype inside the list
    assert len(traces) == 4
    # a lazy tensor inside the list takes the general path (computed, then run)
    lazy = nx.tensor(a) * 2.0
    out, _ = f([lazy, params[1]], state, 3)
    np.testing.assert_allclose(out[0].numpy(), a * 2 * 3 + 0.5)
    assert len(traces) == 4
    with pytest.raises(OverflowError, match="does not fit int32"):
        f(params, state, 2**40)
    # a dict argument: a changed value under the same key is read, never replayed from the past
    state["s"] = nx.tensor(np.float32(10.0))
    out, state2 = f(params, state, 1)
    np.testing.assert_allclose(out[0].numpy(), a + 10.0)
    assert state2["s"].item() == 11.0 and len(traces) == 4


def test_own_memos_are_bounded_and_emptied_by_clear_cache(monkeypatch):
    from nablax.core.transforms.compile import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod, "_MEMO_MAX", 4)

    @nx.compile(static_argnums=(-1,))
    def f(*args):
        return sum(a * 2 for a in args[:-1]) + args[-1]

    x = nx.tensor(np.arange(3.0, dtype=np.float32))
    for n in range(1, 9):  # 8 argument counts: 8 static-position memos, at most 4 kept
        got = f(*([x] * n), 1.0)
        np.testing.assert_allclose(got.numpy(), 2 * n * np.arange(3.0) + 1.0)
        assert len(f._static_at) <= 4
    f.clear_cache()
    assert len(f._static_at) == 0 and len(f._per_size) == 0
    np.testing.assert_allclose(f(x, x, 3.0).numpy(), 4 * np.arange(3.0) + 3.0)

"""``nx.compile`` on ordinary code (issue: a transformer step that unpacked keys fell back to
eager; a partial raised AttributeError; 1, 1.0 and True shared a trace; out-of-range
static_argnums were ignored). References: eager nablax and ``jax.jit``."""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx


def _step(k, x, ws):
    k1, k2 = nx.random.split(k)  # unpacking a tensor of static length
    out = x
    for w, kk in zip(ws, nx.random.split(k2, len(ws))):  # iterating one
        out = nx.tanh(out @ w) + 0.1 * nx.random.normal(kk, out.shape)
    return (out + nx.random.normal(k1, out.shape)).sum()


def test_unpacking_and_iterating_keys_is_no_graph_break():
    ws = [nx.tensor(np.eye(3, dtype=np.float32) * (i + 1)) for i in range(3)]
    x = nx.ones((2, 3))
    c = nx.compile(_step)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break would warn
        vals = [c(nx.random.key(s), x, ws).item() for s in range(3)]
    info = c.cache_info()
    assert (info.traces, info.executables, info.hits) == (1, 1, 2)
    eager = [_step(nx.random.key(s), x, ws).item() for s in range(3)]
    np.testing.assert_allclose(vals, eager, rtol=1e-5)


def test_iterating_rows_under_grad_keeps_the_gradient():
    def f(x):
        return sum(r.sum() * float(i + 1) for i, r in enumerate(x))

    g = nx.grad(f)(nx.ones((3, 2))).numpy()
    expect = jax.grad(lambda x: sum(r.sum() * (i + 1.0) for i, r in enumerate(x)))(jnp.ones((3, 2)))
    np.testing.assert_allclose(g, expect)


def test_iterating_under_vmap_and_compile_matches_a_loop():
    xs = nx.tensor(np.arange(12.0, dtype=np.float32).reshape(4, 3))
    got = nx.vmap(lambda row: sum(v * v for v in row))(xs).numpy()
    np.testing.assert_allclose(got, (xs.numpy() ** 2).sum(axis=1))
    got = nx.compile(lambda m: [r.sum() for r in m])(xs)
    np.testing.assert_allclose([t.item() for t in got], xs.numpy().sum(axis=1))


def test_eager_iteration_still_realizes_once():
    x = nx.arange(6).reshape(3, 2) * 2
    rows = list(x)
    assert all(r.is_realized for r in rows)
    assert [r.tolist() for r in rows] == [[0, 2], [4, 6], [8, 10]]


def test_partial_and_callable_objects():
    def f(a, x):
        return x * a

    p = nx.compile(functools.partial(f, 3.0))
    assert p(nx.ones(2)).tolist() == [3.0, 3.0]
    assert "partial(" in p.__qualname__ and "f" in p.__qualname__

    class Affine:
        def __init__(self, b):
            self.b = b

        def __call__(self, x):
            return x + self.b

    c = nx.compile(Affine(2.0))
    assert c(nx.ones(2)).tolist() == [3.0, 3.0]
    assert c.__qualname__.endswith("Affine")


@pytest.mark.parametrize("value", [1, 1.0, True])
def test_static_values_keyed_by_type_and_value(value):
    def f(x, s):
        return x * s, type(s).__name__

    c = nx.compile(f, static_argnums=(1,))
    for v in (1, 1.0, True):  # warm the three signatures in one order
        c(nx.ones(2), v)
    out, name = c(nx.ones(2), value)
    ref = jax.jit(lambda x, s: f(x, s)[0], static_argnums=(1,))(jnp.ones(2), value)
    assert name == type(value).__name__
    assert out.dtype == ref.dtype
    assert c.cache_info().traces == 3


def test_static_tuples_keyed_by_element_types():
    c = nx.compile(lambda x, s: (x, tuple(type(e).__name__ for e in s)), static_argnums=(1,))
    assert c(nx.ones(1), (1, 2))[1] == ("int", "int")
    assert c(nx.ones(1), (1.0, 2))[1] == ("float", "int")
    assert c.cache_info().traces == 2


def test_out_of_range_static_argnums_raise_like_jax():
    with pytest.raises(ValueError, match=r"static_argnums=\(3,\).*1 positional argument \(x\)"):
        nx.compile(lambda x: x, static_argnums=(3,))
    with pytest.raises(ValueError):
        jax.jit(lambda x: x, static_argnums=(3,))(1)
    # *args functions and negative indices in range are fine
    c = nx.compile(lambda *a: a[0] * a[1], static_argnums=(1,))
    assert c(nx.ones(2), 3).tolist() == [3.0, 3.0]
    nx.compile(lambda x, y: x * y, static_argnums=(-1,))(nx.ones(2), 2)


def test_graph_break_warning_names_the_fix_that_applies():
    def f(x):
        if x.sum().item() > 0:  # a graph break
            return x * 2
        return x

    c = nx.compile(f)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert c(nx.ones(2)).tolist() == [2.0, 2.0]
    msgs = [str(m.message) for m in w if "nx.compile" in str(m.message)]
    assert len(msgs) == 1
    assert "fullgraph=False" not in msgs[0]
    assert "nx.cond" in msgs[0] and "fullgraph=True" in msgs[0]

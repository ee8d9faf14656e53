"""Autodiff and memory: what a differentiation trace keeps alive, and for how long.

Nodes point at their producers and hold only weak references to their outputs; after realization a
node drops its inputs unless a live differentiation trace still needs them (graph.Trace). These tests
hold weak references to intermediate ``TensorImpl``/``Node`` objects and check when they die.
"""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.graph import Node


def _node(t: nx.Tensor) -> Node:
    return t._impl.src[0]


def _alive(refs) -> list[bool]:
    return [r() is not None for r in refs]


def _live_nodes() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Node)


X = np.array([0.5, -1.0, 2.0, 0.25], np.float32)


def _f(refs):
    """sum(sin(2x) + 1), recording weak references to its intermediates (impl and node)."""

    def f(x):
        h = x * 2.0
        s = nx.sin(h)
        refs.extend([weakref.ref(h._impl), weakref.ref(_node(h)), weakref.ref(_node(s))])
        return (s + 1.0).sum()

    return f


def _grad_ref(x):
    return np.asarray(jax.grad(lambda v: (jnp.sin(v * 2.0) + 1.0).sum())(x))


# ---- (a) plain eager code ----------------------------------------------------------------------


def test_eager_intermediates_are_freed_after_realization():
    refs: list = []
    r = _f(refs)(nx.tensor(X))
    assert _alive(refs) == [False, True, True]  # the impls died with f; the pending graph lives
    assert r.item() == pytest.approx(float((np.sin(2 * X) + 1).sum()), rel=1e-6)
    # freed by reference counting alone: no cycles, no gc.collect() needed
    assert _alive(refs) == [False, False, False]
    assert r._impl.src is None


def test_eager_intermediate_held_by_user_keeps_only_its_value():
    x = nx.tensor(X)
    h = x * 2.0
    node = weakref.ref(_node(h))
    r = (nx.sin(h) + 1.0).sum()
    r_node = weakref.ref(_node(r))
    r.item()
    assert h.is_realized and h._impl.src is None  # realized with r, in the same program
    gc.collect()
    assert node() is None and r_node() is None
    np.testing.assert_allclose(h.numpy(), 2 * X)


# ---- (b) realization inside a transform --------------------------------------------------------


def test_values_realized_inside_grad_still_differentiate():
    def f(x):
        h = nx.sin(x * 2.0)
        print(h)  # realizes h inside the trace
        c = (h * h).sum().item()  # a Python float: a constant for the derivative
        assert h.is_realized
        return (h + 1.0).sum() * c + (nx.exp(h) * x).sum()

    def f_j(x):
        h = jnp.sin(x * 2.0)
        c = jax.lax.stop_gradient((h * h).sum())
        return (h + 1.0).sum() * c + (jnp.exp(h) * x).sum()

    got = nx.grad(f)(nx.tensor(X))
    np.testing.assert_allclose(got.numpy(), jax.grad(f_j)(X), rtol=1e-5, atol=1e-6)
    # second order, realizing inside both levels
    got2 = nx.grad(lambda x: nx.grad(f)(x).sum())(nx.tensor(X))
    want2 = jax.grad(lambda x: jax.grad(f_j)(x).sum())(X)
    np.testing.assert_allclose(got2.numpy(), want2, rtol=1e-4, atol=1e-5)


def test_vjp_output_realized_before_pullback():
    refs: list = []
    out, f_vjp = nx.vjp(_f(refs), nx.tensor(X))
    out.item()
    (g,) = f_vjp(nx.tensor(1.0))
    np.testing.assert_allclose(g.numpy(), _grad_ref(X), rtol=1e-5, atol=1e-6)


# ---- (c) the forward graph is freed once the transform is over ---------------------------------


def test_forward_graph_freed_after_grad_returns():
    refs: list = []
    g = nx.grad(_f(refs))(nx.tensor(X))
    assert any(_alive(refs)), "the pending gradient graph uses the forward values"
    np.testing.assert_allclose(g.numpy(), _grad_ref(X), rtol=1e-5, atol=1e-6)
    assert _alive(refs) == [False, False, False]
    assert g._impl.src is None


def test_forward_graph_freed_after_value_and_grad():
    refs: list = []
    v, g = nx.value_and_grad(_f(refs))(nx.tensor(X))
    nx.realize(v, g)
    gc.collect()
    assert _alive(refs) == [False, False, False]
    assert v._impl.src is None and g._impl.src is None


def test_value_realized_inside_trace_releases_graph_after_transform():
    refs: list = []
    f = _f(refs)

    def f_logged(x):
        loss = f(x)
        loss.item()  # e.g. logging inside the loss function
        return loss

    v, g = nx.value_and_grad(f_logged)(nx.tensor(X))
    nx.realize(v, g)
    gc.collect()
    assert _alive(refs) == [False, False, False], "forward graph still reachable from the value"


# ---- (d) eager training loops do not grow ------------------------------------------------------


def _loop_data():
    r = np.random.default_rng(0)
    x = nx.tensor(r.standard_normal((8, 4)).astype(np.float32))
    y = nx.tensor(r.standard_normal((8,)).astype(np.float32))
    w = nx.tensor(r.standard_normal((4,)).astype(np.float32))
    return w, x, y


def _loss(w, x, y):
    return ((nx.tanh(x @ w) - y) ** 2).mean()


def _jax_loop(w, x, y, steps, lr):
    g = jax.jit(jax.grad(lambda w: ((jnp.tanh(x @ w) - y) ** 2).mean()))
    for _ in range(steps):
        w = w - lr * g(w)
    return w


def test_training_loop_with_grad_does_not_grow():
    w, x, y = _loop_data()
    w0 = w.numpy()
    counts = []
    for i in range(20):
        w = w - 0.1 * nx.grad(_loss)(w, x, y)
        w.numpy()
        if i % 5 == 4:
            counts.append(_live_nodes())
    assert max(counts[1:]) <= counts[0], f"live Node objects grow: {counts}"
    want = _jax_loop(w0, x.numpy(), y.numpy(), 20, 0.1)
    np.testing.assert_allclose(w.numpy(), want, rtol=1e-4, atol=1e-5)


def test_training_loop_with_value_and_grad_and_history_does_not_grow():
    w, x, y = _loop_data()
    w0 = w.numpy()
    history, counts = [], []
    for i in range(20):
        loss, g = nx.value_and_grad(_loss)(w, x, y)
        w = w - 0.1 * g
        history.append(loss)  # the losses are kept; their graphs must not be
        loss.item()  # realizes the updated w in the same program
        assert w.is_realized
        if i % 5 == 4:
            counts.append(_live_nodes())
    assert max(counts[1:]) <= counts[0], f"live Node objects grow: {counts}"
    np.testing.assert_allclose(
        w.numpy(), _jax_loop(w0, x.numpy(), y.numpy(), 20, 0.1), rtol=1e-4, atol=1e-5
    )


def test_backward_loop_does_not_grow():
    w, x, y = _loop_data()
    counts = []
    for i in range(20):
        w = nx.tensor(w.numpy()).requires_grad_()
        _loss(w, x, y).backward()
        w = w - 0.1 * w.grad
        w.numpy()
        if i % 5 == 4:
            counts.append(_live_nodes())
    assert max(counts[1:]) <= counts[0], f"live Node objects grow: {counts}"


# ---- (e) nx.vjp keeps the forward graph exactly as long as f_vjp ---------------------------------


def test_vjp_keeps_forward_graph_while_f_vjp_lives():
    refs: list = []
    out, f_vjp = nx.vjp(_f(refs), nx.tensor(X))
    out.numpy()  # the output is realized before the pullback is used
    gc.collect()
    assert _alive(refs)[1:] == [True, True]
    for k in (1.0, 2.0):  # the pullback can be called more than once
        (g,) = f_vjp(nx.tensor(k))
        np.testing.assert_allclose(g.numpy(), k * _grad_ref(X), rtol=1e-5, atol=1e-6)
    gc.collect()
    assert _alive(refs)[1:] == [True, True]
    del f_vjp, g, out
    gc.collect()
    assert _alive(refs) == [False, False, False]


def test_vjp_releases_forward_graph_after_f_vjp_dies():
    refs: list = []
    out, f_vjp = nx.vjp(_f(refs), nx.tensor(X))
    out.numpy()
    (g,) = f_vjp(nx.tensor(1.0))
    g.numpy()
    del f_vjp, g
    gc.collect()
    assert _alive(refs) == [False, False, False], "forward graph still reachable from `out`"
    assert out.item() == pytest.approx(float((np.sin(2 * X) + 1).sum()), rel=1e-6)

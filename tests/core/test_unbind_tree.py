"""``nx.unbind`` / ``Tensor.unbind`` and ``nx.tree.register_pytree_node`` (issue 14, part B):
values against NumPy, derivatives against ``jax.grad`` / ``jax.jvp``, vmap against ``jax.vmap``."""

from __future__ import annotations

import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

BF16 = np.dtype(jnp.bfloat16)
A = (np.arange(24, dtype=np.float32).reshape(2, 3, 4) - 11.5) / 7

# ---- unbind ----------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.bool_, BF16])
def test_unbind_matches_numpy(axis, dtype):
    a = A.astype(dtype) if dtype != np.bool_ else A > 0
    x = nx.tensor(a)
    before = nx.cache_info().realizations
    parts = nx.unbind(x, axis)
    assert nx.cache_info().realizations == before  # lazy, like split
    want = list(np.moveaxis(a, axis, 0))
    assert isinstance(parts, tuple) and len(parts) == len(want)
    for p, w in zip(parts, want):
        assert p.shape == w.shape and p.dtype == w.dtype
        np.testing.assert_array_equal(p.numpy(), w)


def test_unbind_method_sizes_and_one_node():
    x = nx.tensor(A)
    assert [p.tolist() for p in x.unbind(1)] == [p.tolist() for p in nx.unbind(x, axis=1)]
    assert [p.tolist() for p in x.unbind()] == [a.tolist() for a in A]
    assert nx.unbind(nx.ones((0, 3))) == ()
    (only,) = nx.unbind(nx.ones((1, 3)) * 2)
    assert only.shape == (3,) and only.tolist() == [2.0, 2.0, 2.0]
    a, b = nx.unbind(x * 1, 0)
    # both parts come from the one multi-output split node
    split_a = a._impl.src[0].inputs[0]
    split_b = b._impl.src[0].inputs[0]
    assert split_a[0] is split_b[0] and split_a[0].prim.name == "split"


def _weighted(m, x, axis):
    parts = m.unbind(x, axis) if m is nx else jnp.unstack(x, axis=axis)
    return sum((k + 1.0) * m.sin(p) * p for k, p in enumerate(parts)).sum()


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_unbind_derivatives_match_jax(axis):
    want = jax.grad(lambda x: _weighted(jnp, x, axis))(jnp.asarray(A))
    got = nx.grad(lambda x: _weighted(nx, x, axis))(nx.tensor(A))
    np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-5, atol=1e-6)
    t = np.cos(A)
    _, jt = jax.jvp(lambda x: jnp.unstack(x, axis=axis), (jnp.asarray(A),), (jnp.asarray(t),))
    _, nt = nx.jvp(lambda x: nx.unbind(x, axis), (nx.tensor(A),), (nx.tensor(t),))
    assert len(nt) == len(jt)
    for a, b in zip(nt, jt):
        np.testing.assert_array_equal(a.numpy(), np.asarray(b))
    # second order: grad of grad
    h = jax.grad(lambda x: jax.grad(lambda y: _weighted(jnp, y, axis))(x).sum())(jnp.asarray(A))
    nh = nx.grad(lambda x: nx.grad(lambda y: _weighted(nx, y, axis))(x).sum())(nx.tensor(A))
    np.testing.assert_allclose(nh.numpy(), np.asarray(h), rtol=1e-5, atol=1e-5)


def test_unbind_under_vmap_matches_jax_vmap():
    def f(m, x):
        parts = m.unbind(x, 1) if m is nx else jnp.unstack(x, axis=1)
        return m.stack(parts[::-1], 0), parts[0] * 2

    want = jax.vmap(lambda x: f(jnp, x))(jnp.asarray(A))
    got = nx.vmap(lambda x: f(nx, x))(nx.tensor(A))
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.numpy(), np.asarray(w))
    gw = jax.vmap(jax.grad(lambda x: _weighted(jnp, x, 0)))(jnp.asarray(A))
    gn = nx.vmap(nx.grad(lambda x: _weighted(nx, x, 0)))(nx.tensor(A))
    np.testing.assert_allclose(gn.numpy(), np.asarray(gw), rtol=1e-5, atol=1e-6)


def test_unbind_inside_compile():
    f = nx.compile(lambda x: [p * 2 for p in nx.unbind(x, 2)])
    for p, w in zip(f(nx.tensor(A)), np.moveaxis(A, 2, 0)):
        np.testing.assert_array_equal(p.numpy(), w * 2)


# ---- register_pytree_node --------------------------------------------------------------------


class Point:
    """A custom container: two tensor children and a static label."""

    def __init__(self, x, y, label="p"):
        self.x, self.y, self.label = x, y, label


nx.tree.register_pytree_node(
    Point,
    lambda p: ((p.x, p.y), p.label),
    lambda label, children: Point(*children, label),
)


class Named:
    """Registered with key paths (``flatten_with_keys_func``)."""

    def __init__(self, w):
        self.w = w


nx.tree.register_pytree_node(
    Named,
    lambda n: ((n.w,), None),
    lambda aux, ch: Named(*ch),
    lambda n: (((jax.tree_util.GetAttrKey("w"), n.w),), None),
)


def test_register_pytree_node_has_jax_signature():
    ours = inspect.signature(nx.tree.register_pytree_node).parameters
    theirs = inspect.signature(jax.tree_util.register_pytree_node).parameters
    assert list(ours) == list(theirs)
    assert [p.default for p in ours.values()] == [p.default for p in theirs.values()]


def test_registered_node_flattens_in_nablax_and_jax():
    p = Point(nx.ones(2), nx.zeros(3), "a")
    leaves, treedef = nx.tree.flatten(p)
    assert len(leaves) == 2 and leaves[0] is p.x
    q = nx.tree.unflatten(treedef, [nx.full((2,), 5.0), nx.zeros(3)])
    assert isinstance(q, Point) and q.label == "a" and q.x.tolist() == [5.0, 5.0]
    assert len(jax.tree_util.tree_leaves(Point(jnp.ones(2), jnp.ones(1)))) == 2
    assert [k for k, _ in nx.tree.leaves_with_path({"n": Named(nx.ones(1))})] == ["['n'].w"]


def _energy(m, p):
    return (m.sin(p.x) * p.y).sum() + (p.x * p.x).sum()


def test_grad_with_a_registered_node_as_argument_and_result():
    x, y = np.linspace(-1, 1, 3, dtype=np.float32), np.arange(3.0, dtype=np.float32)
    want = jax.grad(lambda p: _energy(jnp, p))(Point(jnp.asarray(x), jnp.asarray(y)))
    got = nx.grad(lambda p: _energy(nx, p))(Point(nx.tensor(x), nx.tensor(y), "q"))
    assert isinstance(got, Point) and got.label == "q"
    np.testing.assert_allclose(got.x.numpy(), np.asarray(want.x), rtol=1e-6)
    np.testing.assert_allclose(got.y.numpy(), np.asarray(want.y), rtol=1e-6)
    # a registered node as the function's output (vjp) and as its aux output
    out, f_vjp = nx.vjp(lambda p: Point(p.x * 2, nx.sin(p.y)), Point(nx.tensor(x), nx.tensor(y)))
    assert isinstance(out, Point)
    (ct,) = f_vjp(Point(nx.ones(3), nx.ones(3)))
    np.testing.assert_allclose(ct.x.numpy(), 2 * np.ones(3), rtol=1e-6)
    np.testing.assert_allclose(ct.y.numpy(), np.cos(y), rtol=1e-6)
    g, aux = nx.grad(lambda p: (_energy(nx, p), Point(p.x, p.y, "aux")), has_aux=True)(
        Point(nx.tensor(x), nx.tensor(y))
    )
    assert isinstance(aux, Point) and aux.label == "aux"
    np.testing.assert_allclose(g.x.numpy(), np.asarray(want.x), rtol=1e-6)


def test_vmap_with_a_registered_node_as_argument_and_result():
    xs = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    ys = np.cos(xs)

    def f(m, p):
        return Point(p.x + p.y, m.sum(p.x * p.y), p.label + "!")

    want = jax.vmap(lambda p: f(jnp, p))(Point(jnp.asarray(xs), jnp.asarray(ys)))
    got = nx.vmap(lambda p: f(nx, p))(Point(nx.tensor(xs), nx.tensor(ys)))
    assert isinstance(got, Point) and got.label == want.label == "p!"
    np.testing.assert_allclose(got.x.numpy(), np.asarray(want.x), rtol=1e-6)
    np.testing.assert_allclose(got.y.numpy(), np.asarray(want.y), rtol=1e-6)
    # in_axes per argument: the registered node batched, a plain tensor broadcast
    got = nx.vmap(lambda p, s: p.x * s, in_axes=(0, None))(
        Point(nx.tensor(xs), nx.tensor(ys)), nx.tensor(ys[0])
    )
    np.testing.assert_allclose(got.numpy(), xs * ys[0], rtol=1e-6)
    gw = jax.vmap(jax.grad(lambda p: _energy(jnp, p)))(Point(jnp.asarray(xs), jnp.asarray(ys)))
    gn = nx.vmap(nx.grad(lambda p: _energy(nx, p)))(Point(nx.tensor(xs), nx.tensor(ys)))
    np.testing.assert_allclose(gn.x.numpy(), np.asarray(gw.x), rtol=1e-6)
    np.testing.assert_allclose(gn.y.numpy(), np.asarray(gw.y), rtol=1e-6)

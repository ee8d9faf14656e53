"""Derived primitives (``vjp[name]``/``jvp[name]`` made from JAX's derivative of a lowering) live in
the bounded, registered store ``primitive.DERIVED``: the registry-generated checks here run over
every one made by real derivatives (shape rule against the lowering, all four rules present),
``nx.clear_caches()`` empties the store, and a dropped record is made again with the same
results."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.graph import Var, toposort
from nablax.core.primitive import DERIVED, REGISTRY, all_primitives

RULES = ("jvp", "vjp", "batch", "shard")


def _gelu_ref(x):
    return jax.nn.gelu(x, approximate=True)


def _loss(x):
    return (nx.nn.functional.gelu(x, approximate="tanh") ** 2).sum()


def _loss_ref(x):
    return (_gelu_ref(x) ** 2).sum()


def _derived_graph():
    """Second- and third-order derivatives of the fused GELU (rules derived from JAX), so the
    graph holds ``vjp[gelu]``, ``vjp[vjp[gelu]]`` and their JVP forms."""
    x = np.linspace(-2, 2, 12, dtype=np.float32).reshape(3, 4)
    h = nx.grad(lambda v: nx.grad(_loss)(v).sum())(nx.tensor(x))
    t = nx.jvp(nx.grad(_loss), (nx.tensor(x),), (nx.ones((3, 4)),))[1]
    return x, h, t


def test_higher_order_derivatives_through_derived_primitives_match_jax():
    x, h, t = _derived_graph()
    want_h = jax.grad(lambda v: jax.grad(_loss_ref)(v).sum())(x)
    want_t = jax.jvp(jax.grad(_loss_ref), (x,), (jnp.ones((3, 4)),))[1]
    np.testing.assert_allclose(h.numpy(), want_h, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(t.numpy(), want_t, rtol=2e-5, atol=2e-5)


def test_every_derived_primitive_has_rules_and_a_true_shape_rule():
    nx.clear_caches()
    x, h, t = _derived_graph()
    nodes = toposort([h._impl.src[0], t._impl.src[0]])
    made = [p for p in all_primitives() if p.name not in REGISTRY]
    assert made and all(p in DERIVED.values() for p in made), made
    seen = set()
    true: dict = {}  # node -> ShapeDtypeStructs of its lowering's outputs (JAX's, not the rules')
    for node in nodes:  # producers first
        ins = []
        for r in node.inputs:
            if type(r) is Var and r[0] in true:
                ins.append(true[r[0]][r[1]])
            elif type(r) is Var:  # a computed producer outside the pending graph
                v = r[0].values[r[1]]
                ins.append(jax.ShapeDtypeStruct(v.shape, v.dtype))
            else:
                v = r.value
                ins.append(jax.ShapeDtypeStruct(np.shape(v), np.dtype(r.dtype)))
        got = jax.eval_shape(lambda *a, n=node: n.prim.lower(n.params, *a), *ins)
        true[node] = list(got) if isinstance(got, (tuple, list)) else [got]
        if node.prim.name in REGISTRY:
            continue
        seen.add(node.prim)
        for kind in RULES:
            assert getattr(node.prim, kind) is not None, (node.prim.name, kind)
        claimed = node.prim.abstract_eval(node.params, *[(i.shape, i.dtype) for i in ins])
        assert [(tuple(s), np.dtype(d)) for s, d in claimed] == [
            (tuple(g.shape), np.dtype(g.dtype)) for g in true[node]
        ], node.prim.name
    assert seen <= set(DERIVED.values()) and len(seen) >= 2


def test_store_is_bounded_registered_and_cleared():
    assert DERIVED.maxsize is not None
    assert "core.derived_primitives" in nx.cache_info()
    _derived_graph()
    assert len(DERIVED) > 0
    before = [p.name for p in DERIVED.values()]
    nx.clear_caches()
    assert len(DERIVED) == 0
    # made again on demand, with the same names and the same values
    x, h, _ = _derived_graph()
    assert sorted(p.name for p in DERIVED.values()) == sorted(before)
    want = jax.grad(lambda v: jax.grad(_loss_ref)(v).sum())(x)
    np.testing.assert_allclose(h.numpy(), want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("order", [1, 2])
def test_derived_primitives_batch_like_a_python_loop(order):
    g = nx.grad(_loss) if order == 1 else nx.grad(lambda v: nx.grad(_loss)(v).sum())
    xs = np.linspace(-1.5, 1.5, 24, dtype=np.float32).reshape(2, 3, 4)
    got = nx.vmap(g)(nx.tensor(xs)).numpy()
    want = np.stack([g(nx.tensor(x)).numpy() for x in xs])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)

"""The graph IR (core/graph.py): node inputs are exactly ``Var`` or ``Literal``, every node is made
by ``build._node`` through the ``bind`` family, and ``graph.encode`` is the one numbering. The registry-generated check that
every primitive's graph holds only the two input types is in test_ops.py (``_record_graph``); this
file attacks the pieces: the one constructor, structure keys, and the shared scalar literals of the
element-wise fast path."""

from __future__ import annotations

import ast
import math
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core import realize
from nablax.core.graph import Literal, Node, Var, encode, toposort

SRC = pathlib.Path(nx.__file__).parent


def _nodes(*ts):
    return toposort([t._impl.src[0] for t in ts if t._impl.src is not None])


PRIVATE = ("_node", "_node1", "make_node")  # core/build.py's node constructors


def test_only_build_creates_nodes():
    """No module but core/build.py instantiates ``Node`` (``Node(...)`` or ``object.__new__``),
    and no module but core/build.py calls or imports its private constructor ``_node``: every other
    node is made through ``bind``/``bind_known``/``bind_refs``/``bind_unary``/``bind_scalar``/
    ``bind_pair``."""
    bad = []
    for path in SRC.rglob("*.py"):
        if path.name == "build.py" and path.parent.name == "core":
            continue
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Call):
                names = [a.id for a in [n.func, *n.args] if isinstance(a, ast.Name)]
                f = n.func
                called = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if called == "setup" and path.name == "graph.py":
                    continue  # hands the classes to the compiled walks (core/_graphc.c)
                if "Node" in names or called in PRIVATE:
                    bad.append(f"{path.relative_to(SRC)}:{n.lineno}")
            elif isinstance(n, ast.ImportFrom) and n.module and n.module.endswith("build"):
                private = [a.name for a in n.names if a.name in PRIVATE]
                if private:
                    bad.append(f"{path.relative_to(SRC)}:{n.lineno} imports {private}")
    assert not bad, f"nodes made outside core/build.py's bind family: {bad}"
    assert "__init__" not in Node.__dict__  # Node(...) is not a constructor anyone can call


def test_bind_known_derives_metadata_like_bind():
    """``bind_known`` (known output shape) computes depth, trace and batch layout exactly as
    ``bind`` (shape rule) does, for impls, literals and graph references alike."""
    from nablax.core import build
    from nablax.core.primitive import REGISTRY

    add = REGISTRY["add"]
    x = nx.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    y = (x * 2.0).exp()
    a, b = y._impl, (x + 1.0)._impl
    params = (np.dtype(np.float32),)
    (g,) = build.bind(add, [a, b], params)
    (k,) = build.bind_known(add, [a, b.src], params, ((a.shape, a.dtype),))
    for u in (g, k):
        n = u.src[0]
        assert n.depth == 3 and n.trace is None and n.bdims is None
        assert n.inputs == (a.src, b.src)
    np.testing.assert_allclose(
        nx.Tensor._wrap(k).numpy(),
        np.exp(np.arange(6).reshape(2, 3) * 2) + np.arange(6).reshape(2, 3) + 1,
        rtol=1e-6,
    )


def test_bind_refs_matches_bind_known():
    """``bind_refs`` (references, trace and batch layout given) makes the node ``bind_known``
    makes: the same inputs, depth (one more than the deepest ``Var`` input, 1 on literals only),
    trace and value."""
    from nablax.core import build
    from nablax.core.graph import Trace
    from nablax.core.primitive import REGISTRY

    add = REGISTRY["add"]
    x = nx.tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    x.numpy()
    y = ((x * 2.0).exp() + 1.0)._impl  # depth 3
    params = (np.dtype(np.float32),)
    aval = ((y.shape, y.dtype),)
    trace = Trace(None)
    for refs in [(y.src, x._impl.lit), (x._impl.lit, x._impl.lit)]:
        (k,) = build.bind_known(add, list(refs), params, aval, trace=trace, bdims=None)
        (r,) = build.bind_refs(add, params, refs, aval, trace, None)
        nk, nr = k.src[0], r.src[0]
        assert nr.inputs == nk.inputs == refs
        assert nr.depth == nk.depth == (4 if refs[0] is y.src else 1)
        assert nr.trace is nk.trace is trace and nr.bdims is None
        want = np.arange(6).reshape(2, 3) * (2.0 if refs[0] is x._impl.lit else 1.0)
        if refs[0] is y.src:
            want = np.exp(want * 2) + 1 + want
        np.testing.assert_allclose(nx.Tensor._wrap(r).numpy(), want, rtol=1e-6)


def test_inputs_are_var_or_literal_under_every_transform():
    x = nx.tensor(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))
    w = nx.tensor(np.ones((3, 2), np.float32))

    def f(x):
        h = nx.where(x > 0, x * 2.0, 0.5) @ w
        return (nx.exp(h) + 1).sum() + nx.full((), 3.0) * 2

    outs = [f(x), nx.grad(f)(x), nx.vmap(f)(x[None]), nx.jvp(f, (x,), (x,))[1]]
    for node in _nodes(*outs):
        for inp in node.inputs:
            assert type(inp) in (Var, Literal), (node, inp)
    np.testing.assert_allclose(
        nx.grad(f)(x).numpy(),
        jax.grad(
            lambda v: (
                jnp.exp(jnp.where(v > 0, v * 2.0, 0.5) @ jnp.ones((3, 2), jnp.float32)) + 1
            ).sum()
        )(jnp.asarray(x.numpy())),
        rtol=1e-6,
    )


def test_var_is_a_value_pair_and_literal_of_a_realized_tensor_is_kept():
    x = nx.tensor(np.ones(3, np.float32))
    y = x * 2
    (node, j) = y._impl.src
    assert j == 0 and y._impl.src == Var((node, 0)) and hash(y._impl.src) == hash((node, 0))
    z = y + x
    assert z._impl.src[0].inputs[1] is x._impl.lit  # no new object per use of a realized tensor
    y.numpy()
    assert y._impl.src is None and type(y._impl.lit) is Literal
    assert y._impl.lit.value is y._impl.value


def test_encode_is_canonical_and_keys_ignore_values():
    def build(a, s):
        x = nx.tensor(np.full(4, a, np.float32))
        return (x * s + 1.0).exp() * x

    k1 = realize._structure(dict.fromkeys(_nodes(build(1.0, 2.0))))[1]
    k2 = realize._structure(dict.fromkeys(_nodes(build(5.0, 3.0))))[1]
    assert k1 == k2  # same structure, other array values and scalars: one program
    k3 = realize._structure(dict.fromkeys(_nodes(build(1.0, 2))))[1]
    assert k3 == k1  # an int scalar is materialized in float32 too: same key, same program
    t = build(1.0, 2.0)
    steps, n, ext = encode(_nodes(t), {})
    assert n == len(steps) and [type(e) for e in ext].count(Literal) == len(ext)
    assert len([e for e in ext if not e.is_scalar]) == 1  # the array x, once, though read twice


@pytest.mark.parametrize(
    "a, b",
    [(0.0, -0.0), (-0.0, 0.0), (1, True), (True, 1), (2, 2.0), (1e-30, 0.0)],
)
def test_shared_scalar_literals_never_mix_values(a, b):
    """The per-op literal cache shares only exact matches: signed zeros, bool vs int and int vs
    float stay apart (a wrong share would be a silent wrong answer)."""
    x = nx.tensor(np.array([1.0, -1.0, 0.0, 3.0], np.float32))
    for op in ("__mul__", "__add__", "__truediv__", "__rtruediv__"):
        for _ in range(2):  # the second time, from the cache
            for v in (a, b):
                y = getattr(x, op)(v)
                lit = [i for i in y._impl.src[0].inputs if type(i) is Literal and i.is_scalar][0]
                assert type(lit.value) is type(v) and lit.weak
                assert math.copysign(1, lit.value) == math.copysign(1, v), (op, a, b)
                with np.errstate(divide="ignore", invalid="ignore"):
                    want = getattr(x.numpy(), op)(np.float32(v))
                np.testing.assert_allclose(y.numpy(), want, rtol=1e-6, err_msg=f"{op} {v!r}")


def test_shared_scalar_literals_nan_and_integer_limits():
    x = nx.tensor(np.array([1.0, 2.0], np.float32))
    assert all(math.isnan(v) for v in (x * float("nan")).tolist())
    assert (x * 3.0).tolist() == [3.0, 6.0] and (x * 3.0).tolist() == [3.0, 6.0]
    i = nx.tensor(np.array([1, 2], np.int32))
    assert (i * 7).tolist() == [7, 14] and (i * 7).tolist() == [7, 14]
    with pytest.raises(OverflowError, match="does not fit"):
        i * 2**40
    with pytest.raises(OverflowError, match="does not fit"):
        i * 2**40  # checked again: an out-of-range int is never cached


def test_backward_plans_key_scalars_by_value():
    """Replayed backward passes see the scalar values of their forward graph (rules fold them)."""
    x = nx.tensor(np.array([0.5, 2.0], np.float32))
    for s in (2.0, 3.0, 2.0, 3.0, -0.0, 0.0):
        g = nx.grad(lambda v, s=s: (v**s * s).sum())(x).numpy()
        want = jax.grad(lambda v, s=s: (v**s * s).sum())(jnp.asarray([0.5, 2.0], jnp.float32))
        np.testing.assert_allclose(g, np.asarray(want), rtol=1e-6)

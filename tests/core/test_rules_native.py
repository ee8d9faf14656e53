"""Native jvp/vjp rules of the shape, reduce, index and linalg primitives, against JAX.

First order: ``nx.vjp`` / ``nx.jvp`` vs ``jax.vjp`` / ``jax.jvp`` on random inputs (broadcasting,
size-1 axes, strides, ties, duplicate and out-of-range indices, mixed dtypes). Second order:
``grad(<grad f, w>)``, ``jvp(grad f)`` and ``grad(jvp f)`` of composites. Each case realizes all
nablax results in one program and runs the JAX reference under one ``jax.jit``, to stay fast.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.build import bind
from nablax.core.prims import index as _index
from nablax.core.prims import linalg as _linalg
from nablax.core.prims import reduce as _reduce
from nablax.core.prims import shape as _shape
from nablax.core.tensor import Tensor

RTOL, ATOL = 2e-5, 2e-5
BF16 = jnp.bfloat16


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)))


def _rnd(rng, shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _close(got, want, what: str, rtol=RTOL, atol=ATOL) -> None:
    g_leaves = jax.tree_util.tree_leaves(got)
    w_leaves = jax.tree_util.tree_leaves(want)
    assert len(g_leaves) == len(w_leaves), what
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"{what}[{k}]: shape {g.shape} != {w.shape}"
        assert g.dtype == w.dtype, f"{what}[{k}]: dtype {g.dtype} != {w.dtype}"
        tol = (3e-2, 3e-2) if g.dtype in (np.float16, np.dtype(BF16)) else (rtol, atol)
        np.testing.assert_allclose(
            g.astype(np.float64), w.astype(np.float64), *tol, err_msg=f"{what}[{k}]"
        )


def _prim(prim, params):
    return lambda x: Tensor._wrap(bind(prim, [x._impl], params)[0])


# ---- first order ------------------------------------------------------------------------------
# (name, nablax fn, jax fn, input shapes/dtypes or arrays). Functions take float inputs only;
# integer indices are closed over.

IDX = np.array([0, 2, 2, -1, 1])
OOB = np.array([[0, 7], [-9, 2]], np.int32)  # out of range: reads clamp, updates are dropped
TIES = np.array([[1, 3, 3, 0], [2, 2, 2, 2], [5, -1, 5, 4]], np.float32)
MASK = np.array([[True, False, True, True], [False, False, True, False], [True] * 4])
ZEROS = np.array([[1.5, 0, 2, -1, 3], [0.5, 2, -1, 1.5, 2], [0, 3, 1, 0, -2]], np.float32)

FIRST = [
    (
        "reshape_transpose",
        lambda a: (a.reshape(4, 3), nx.transpose(a.reshape(3, 2, 2), (2, 0, 1))),
        lambda a: (a.reshape(4, 3), jnp.transpose(a.reshape(3, 2, 2), (2, 0, 1))),
        [(3, 4)],
    ),
    (
        "broadcast",
        lambda a, b: (nx.broadcast_to(a, (2, 3, 5)), nx.broadcast_to(b, (2, 4))),
        lambda a, b: (jnp.broadcast_to(a, (2, 3, 5)), jnp.broadcast_to(b, (2, 4))),
        [(3, 1), ((4,), BF16)],
    ),
    (
        "concatenate",
        lambda a, b, c: (nx.concatenate([a, b, a], 1), nx.concatenate([a, c], 0)),
        lambda a, b, c: (jnp.concatenate([a, b, a], 1), jnp.concatenate([a, c], 0)),
        [(3, 4), (3, 2), ((1, 4), BF16)],  # mixed dtypes: c's cotangent comes back in bfloat16
    ),
    (
        "pad_flip",
        lambda a: (nx.pad(a, ((1, 2), (0, 3)), constant_values=2.0), nx.flip(a, 1)),
        lambda a: (jnp.pad(a, ((1, 2), (0, 3)), constant_values=2.0), jnp.flip(a, 1)),
        [(3, 4)],
    ),
    (
        "slice_strided",
        lambda a, b: (
            _prim(_shape.slice_p, ((1, 0, 2), (3, 7, 3), (1, 3, 1)))(a),
            _prim(_shape.slice_p, ((0, 2), (5, 7), (2, 2)))(b),
        ),
        lambda a, b: (
            jax.lax.slice(a, (1, 0, 2), (3, 7, 3), (1, 3, 1)),
            jax.lax.slice(b, (0, 2), (5, 7), (2, 2)),
        ),
        [(4, 7, 3), (6, 8)],
    ),
    (
        "split",
        lambda a: (nx.split(a, [1, 3], axis=1), nx.split(a, [3, 1], axis=1), nx.split(a, 2, 1)[1]),
        lambda a: (jnp.split(a, [1, 3], axis=1), [a[:, :3], a[:, 3:1], a[:, 1:]], a[:, 2:]),
        [(3, 4)],
    ),
    (
        "sum",
        lambda a, b: (a.sum(0), nx.sum(a, (0, 2), keepdims=True), b.sum()),
        lambda a, b: (a.sum(0), jnp.sum(a, (0, 2), keepdims=True), b.sum()),
        [(2, 3, 4), ((3, 4), BF16)],
    ),
    (
        "max_min_ties",
        lambda a: (a.max(1), a.min(), nx.max(a, 0, keepdims=True)),
        lambda a: (a.max(1), a.min(), jnp.max(a, 0, keepdims=True)),
        [TIES],
    ),
    (
        "cumsum",
        lambda a: (nx.cumsum(a, 1), _prim(_reduce.cumsum_p, (0, True))(a)),
        lambda a: (jnp.cumsum(a, 1), jax.lax.cumsum(a, 0, reverse=True)),
        [(3, 4)],
    ),
    (
        "prod",
        lambda a, b, c: (nx.prod(a, 1), nx.prod(a, 0), nx.prod(b), nx.prod(c, 1)),
        lambda a, b, c: (jnp.prod(a, 1), jnp.prod(a, 0), jnp.prod(b), jnp.prod(c, 1)),
        [ZEROS, (2, 3, 3), (3, 0)],  # zeros are exact (no division); empty reductions
    ),
    (
        "sort_topk",
        lambda a: (nx.sort(a, 0), nx.sort(a), nx.topk(a, 2)[0], nx.topk(a, 2, axis=0)[0]),
        lambda a: (
            jnp.sort(a, 0),
            jnp.sort(a),
            jax.lax.top_k(a, 2)[0],
            jnp.moveaxis(jax.lax.top_k(jnp.moveaxis(a, 0, -1), 2)[0], -1, 0),
        ),
        [TIES],
    ),
    (
        "gather",
        lambda a, b: (
            a[IDX],
            a[1:, IDX[:2]],
            a[::-1, 3:0:-2],
            a[:, nx.tensor(OOB)],
            b[..., 1, None],
            b[:, MASK],
        ),
        lambda a, b: (
            a[IDX],
            a[1:, IDX[:2]],
            a[::-1, 3:0:-2],
            a[:, OOB],
            b[..., 1, None],
            b[:, MASK],
        ),
        [(3, 4), (2, 3, 4)],
    ),
    (
        "gather_ellipsis",
        lambda a: a[..., nx.tensor(IDX[:3]), None],
        lambda a: a[..., IDX[:3], None],
        [(2, 3, 4)],
    ),
    (
        "scatter_dup",
        lambda a, v: (a.at[IDX].add(v), a.at[IDX].set(v)),
        lambda a, v: (a.at[IDX].add(v), a.at[IDX].set(v)),
        [(3, 4), (5, 4)],
    ),
    (
        "scatter_oob",
        lambda a, v: (a.at[:, nx.tensor(OOB)].add(v), a.at[:, nx.tensor(OOB)].set(v)),
        lambda a, v: (a.at[:, OOB].add(v), a.at[:, OOB].set(v)),
        [(3, 4), (3, 2, 2)],
    ),
    (
        "scatter_bcast",
        lambda a, v, w: (
            a.at[IDX, 1:3].add(v),
            a.at[1:, ::2].set(w),
            a.at[np.array([2, 0])].set(v),
        ),
        lambda a, v, w: (
            a.at[IDX, 1:3].add(v),
            a.at[1:, ::2].set(w),
            a.at[np.array([2, 0])].set(v),
        ),
        [(3, 4), (1,), (2, 2)],
    ),
    (
        "matmul",
        lambda m, n, v, b, c: (m @ n, b @ c, b @ v, v @ c, v @ v, nx.dot(b, c)),
        lambda m, n, v, b, c: (m @ n, b @ c, b @ v, v @ c, v @ v, jnp.dot(b, c)),
        [(3, 4), (4, 2), (4,), (2, 1, 3, 4), (5, 4, 2)],  # broadcast batch axes, 1-D operands
    ),
    (
        "einsum",
        lambda a, b, c, d, e: (
            nx.einsum("ij,jk->j", a, b),  # i, k: summed in one operand, broadcast back
            nx.einsum("ij,jk", a, b),
            nx.einsum("ij,ij->ij", c, a),  # size-1 label broadcasts
            nx.einsum("i...j,j->...i", d, a[0]),
            nx.einsum("ab,bc,ca->a", a, b, e),
        ),
        lambda a, b, c, d, e: (
            jnp.einsum("ij,jk->j", a, b),
            jnp.einsum("ij,jk", a, b),
            jnp.einsum("ij,ij->ij", c, a),
            jnp.einsum("i...j,j->...i", d, a[0]),
            jnp.einsum("ab,bc,ca->a", a, b, e),
        ),
        [(3, 4), (4, 2), (3, 1), (2, 3, 1, 4), (2, 3)],
    ),
    (
        "einsum_diagonal_fallback",
        lambda a: nx.einsum("ii->i", a),
        lambda a: jnp.einsum("ii->i", a),
        [(3, 3)],
    ),
    (
        "einsum_mixed_dtype",
        lambda a, b: nx.einsum("ij,jk->ik", a, b),
        lambda a, b: jnp.einsum("ij,jk->ik", a, b, preferred_element_type=jnp.float32),
        [((3, 4), BF16), (4, 2)],
    ),
]


def _inputs(rng, specs) -> list[np.ndarray]:
    out = []
    for s in specs:
        if isinstance(s, np.ndarray):
            out.append(s)
        elif isinstance(s[0], tuple):
            out.append(_rnd(rng, s[0], s[1]))
        else:
            out.append(_rnd(rng, s))
    return out


@pytest.mark.parametrize("name,fn,jfn,specs", FIRST, ids=[c[0] for c in FIRST])
def test_first_order_matches_jax(name, fn, jfn, specs):
    rng = _rng(name)
    args = _inputs(rng, specs)
    out_j = jax.eval_shape(jfn, *args)
    ct = jax.tree_util.tree_map(lambda o: _rnd(rng, o.shape, o.dtype), out_j)
    tans = [_rnd(rng, a.shape, a.dtype) for a in args]

    @jax.jit
    def ref(args, ct, tans):
        out, pull = jax.vjp(jfn, *args)
        return out, pull(ct), jax.jvp(jfn, tuple(args), tuple(tans))[1]

    want = ref(args, ct, tans)
    out, pull = nx.vjp(fn, *[nx.tensor(a) for a in args])
    cts = pull(jax.tree_util.tree_map(nx.tensor, ct))
    _, t_out = nx.jvp(fn, tuple(nx.tensor(a) for a in args), tuple(nx.tensor(t) for t in tans))
    got = (out, cts, t_out)
    nx.realize(*jax.tree_util.tree_leaves(got))
    for what, g, w in zip(("value", "vjp", "jvp"), got, want):
        _close(jax.tree_util.tree_map(np.asarray, g), w, f"{name} {what}")


# ---- second order -----------------------------------------------------------------------------

W44 = np.random.default_rng(7).standard_normal((4, 4)).astype(np.float32)
IDX4 = np.array([0, 2, 2, 1])

SECOND = [
    (
        "softmax",
        lambda a: (nx.softmax(a, axis=-1) ** 2).sum(),
        lambda a: (jax.nn.softmax(a, axis=-1) ** 2).sum(),
    ),
    (
        "logsumexp",
        lambda a: nx.logsumexp(a * a, axis=1).sum(),
        lambda a: jax.nn.logsumexp(a * a, axis=1).sum(),
    ),
    (
        "matmul_chain",
        lambda a: nx.tanh(a @ nx.tensor(W44) @ a.T).sum(),
        lambda a: jnp.tanh(a @ W44 @ a.T).sum(),
    ),
    (
        "getitem",
        lambda a: (a[IDX4] ** 3).sum() + (a[1:, ::2] ** 2).sum(),
        lambda a: (a[IDX4] ** 3).sum() + (a[1:, ::2] ** 2).sum(),
    ),
    (
        "scatter",
        lambda a: (
            (a.at[IDX4].add(a[IDX4[::-1], ::-1] ** 2) ** 2).sum()
            + (a.at[1:, 2].set(a[0, :2] ** 2) ** 2).sum()
            + (a.at[np.array([2, 0])].set(a[1:] ** 2) ** 2).sum()
        ),
        lambda a: (
            (a.at[IDX4].add(a[IDX4[::-1], ::-1] ** 2) ** 2).sum()
            + (a.at[1:, 2].set(a[0, :2] ** 2) ** 2).sum()
            + (a.at[np.array([2, 0])].set(a[1:] ** 2) ** 2).sum()
        ),
    ),
    (
        "max_sum",
        lambda a: (nx.max(a * a, axis=0) ** 2).sum() + nx.sum(a**3, axis=1).max(),
        lambda a: (jnp.max(a * a, axis=0) ** 2).sum() + jnp.sum(a**3, axis=1).max(),
    ),
    (
        "prod",
        lambda a: nx.prod(nx.sin(a), axis=1).sum() + nx.prod(a.at[0, 1].set(0.0), axis=1).sum(),
        lambda a: jnp.prod(jnp.sin(a), axis=1).sum() + jnp.prod(a.at[0, 1].set(0.0), axis=1).sum(),
    ),
    (
        "cumsum_sort_topk",
        lambda a: (
            (nx.cumsum(a, 1) ** 3).sum()
            + (nx.sort(a, 0) ** 3 * nx.arange(4.0)).sum()
            + (nx.topk(a, 2)[0] ** 3).sum()
        ),
        lambda a: (
            (jnp.cumsum(a, 1) ** 3).sum()
            + (jnp.sort(a, 0) ** 3 * jnp.arange(4.0)).sum()
            + (jax.lax.top_k(a, 2)[0] ** 3).sum()
        ),
    ),
    (
        "concat_pad_split",
        lambda a: (
            (nx.pad(nx.concatenate([a, a * a], 1), 1, constant_values=1.0) ** 3).sum()
            + sum((p**3).sum() * (i + 1) for i, p in enumerate(nx.split(a, [1, 3], 1)))
        ),
        lambda a: (
            (jnp.pad(jnp.concatenate([a, a * a], 1), 1, constant_values=1.0) ** 3).sum()
            + sum((p**3).sum() * (i + 1) for i, p in enumerate(jnp.split(a, [1, 3], 1)))
        ),
    ),
    (
        "einsum",
        lambda a: (
            (nx.einsum("i...j,j->...i", a.reshape(3, 1, 4), a[0]) ** 2).sum()
            + (nx.einsum("ii->i", a[:, :3]) ** 3).sum()
        ),
        lambda a: (
            (jnp.einsum("i...j,j->...i", a.reshape(3, 1, 4), a[0]) ** 2).sum()
            + (jnp.einsum("ii->i", a[:, :3]) ** 3).sum()
        ),
    ),
    (
        "strided_slice",
        lambda a: (_prim(_shape.slice_p, ((0, 1), (3, 4), (2, 2)))(a) ** 3).sum(),
        lambda a: (jax.lax.slice(a, (0, 1), (3, 4), (2, 2)) ** 3).sum(),
    ),
]


@pytest.mark.parametrize("name,f,jf", SECOND, ids=[c[0] for c in SECOND])
def test_second_order_matches_jax(name, f, jf):
    rng = _rng(name)
    x, w, v = (_rnd(rng, (3, 4)) for _ in range(3))

    @jax.jit
    def ref(x, w, v):
        return (
            jax.grad(lambda a: (jax.grad(jf)(a) * w).sum())(x),
            jax.jvp(jax.grad(jf), (x,), (v,))[1],
            jax.grad(lambda a: jax.jvp(jf, (a,), (v,))[1])(x),
        )

    want = ref(x, w, v)
    tx, tw, tv = nx.tensor(x), nx.tensor(w), nx.tensor(v)
    got = (
        nx.grad(lambda a: (nx.grad(f)(a) * tw).sum())(tx),
        nx.jvp(nx.grad(f), (tx,), (tv,))[1],
        nx.grad(lambda a: nx.jvp(f, (a,), (tv,))[1])(tx),
    )
    nx.realize(*got)
    for what, g, w_ in zip(("grad(grad)", "jvp(grad)", "grad(jvp)"), got, want):
        _close(g.numpy(), w_, f"{name} {what}", rtol=1e-4, atol=1e-4)


# ---- dtypes -----------------------------------------------------------------------------------


def test_integer_inputs_get_no_cotangent():
    x = nx.tensor(np.ones((2, 3), np.float32))
    i = nx.arange(6).reshape(2, 3)
    _, pull = nx.vjp(lambda a, b: nx.concatenate([a, b], 0), x, i)
    ga, gb = pull(nx.ones((4, 3)))
    assert ga.dtype == np.float32 and gb is None
    _, pull = nx.vjp(lambda a, b: nx.einsum("ij,kj->ik", a, b), x, i)
    ga, gb = pull(nx.ones((2, 2)))
    assert ga.dtype == np.float32 and gb is None
    np.testing.assert_allclose(ga.numpy(), np.tile(np.array([[3, 5, 7]], np.float32), (2, 1)))
    _, pull = nx.vjp(lambda a, v: a.at[0].add(v), x, nx.tensor([1, 2, 3]))
    ga, gv = pull(nx.ones((2, 3)))
    assert ga.dtype == np.float32 and gv is None


@pytest.mark.parametrize(
    "prim,params,inputs",
    [
        (_reduce.reduce_sum_p, ((0,),), [np.ones((2, 3), np.int32)]),
        (_reduce.reduce_max_p, ((1,),), [np.ones((2, 3), np.int32)]),
        (_reduce.cumsum_p, (0, False), [np.ones((2, 3), np.bool_)]),
        (_shape.reshape_p, ((3, 2),), [np.ones((2, 3), np.int32)]),
        (_shape.pad_p, (((1, 0), (0, 0)), 0), [np.ones((2, 3), np.int32)]),
        (_index.gather_p, ((("t",),),), [np.ones((2, 3), np.int32), np.array([1, 0], np.int32)]),
        (
            _linalg.einsum_p,
            ("ij,jk->ik", np.dtype(np.int32), None),  # (spec, dtype, precision)
            [np.ones((2, 3), np.int32), np.ones((3, 2), np.int32)],
        ),
    ],
    ids=["sum", "max", "cumsum", "reshape", "pad", "gather", "einsum"],
)
def test_integer_primitives_give_none(prim, params, inputs):
    xs = [nx.tensor(a) for a in inputs]
    outs = [Tensor._wrap(o) for o in bind(prim, [x._impl for x in xs], params)]
    cts = [nx.ones(o.shape, o.dtype) for o in outs]
    assert prim.vjp(params, cts, xs, outs) == [None] * len(xs)


def _mixed(m, a, b):
    mm = m.einsum("ij,jk->ik", a, b, **({} if m is nx else {"preferred_element_type": jnp.float32}))
    c = m.concatenate([a, b.T], 0)  # promotes to float32
    return mm.sum() + c.max() + m.prod(a[:, ::-1], axis=1).sum().astype(np.float32)


@pytest.mark.parametrize("dtype", [np.float16, BF16], ids=["float16", "bfloat16"])
def test_cotangents_keep_input_dtype(dtype):
    a = np.arange(1, 7, dtype=np.float32).reshape(2, 3).astype(dtype)
    b = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)
    ga, gb = nx.grad(lambda a, b: _mixed(nx, a, b), argnums=(0, 1))(nx.tensor(a), nx.tensor(b))
    assert ga.dtype == dtype and gb.dtype == np.float32
    ja, jb = jax.jit(jax.grad(lambda a, b: _mixed(jnp, a, b), argnums=(0, 1)))(a, b)
    _close(ga.numpy(), ja, "grad a")
    _close(gb.numpy(), jb, "grad b")


def test_einsum_native_spec_parsing():
    # diagonals (a label repeated in one operand) keep the JAX-derived rule; the rest is native
    assert _linalg._explicit("ii->i", ((3, 3),)) is None
    terms, out = _linalg._explicit("...ij,...jk->...ik", ((2, 1, 3, 4), (5, 4, 2)))
    assert len(terms[0]) == 4 and len(terms[1]) == 3 and len(out) == 4
    assert terms[0][1] not in out  # the size-1 batch axis of a is summed: its cotangent too


@pytest.mark.parametrize(
    "expr",
    ["x @ w.T", "x[0] @ w.T", "w.T @ y", "w.T @ v.T", "(x @ w.T) @ w"],
    ids=["a@w.T", "1d@w.T", "w.T@b", "w.T@v.T", "reused"],
)
def test_matmul_with_a_transposed_operand_differentiates_without_transposes(expr):
    """``x @ w.T`` on a differentiated ``w`` is one einsum on ``w``: its gradient comes out in
    ``w``'s own axis order, not as a transposed product that XLA copies every step. The values and
    gradients (first and second order) equal JAX's."""
    from nablax.core.graph import toposort

    rng = _rng(expr)
    x, y = rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((3, 2))
    w, v = rng.standard_normal((3, 5)).astype(np.float32), rng.standard_normal((2, 3))
    y, v = y.astype(np.float32), v.astype(np.float32)

    def make(lib, x, y):
        return lambda w, v: lib.sin(eval(expr, {"x": x, "y": y, "w": w, "v": v})).sum()

    f, jf = make(nx, nx.tensor(x), nx.tensor(y)), make(jnp, x, y)
    value, grads = nx.value_and_grad(f, (0, 1))(nx.tensor(w), nx.tensor(v))
    roots = [t._impl.src.node for t in (value, *grads) if t._impl.src is not None]
    prims = {node.prim.name for node in toposort(roots)}
    assert "einsum" in prims and "transpose" not in prims, prims
    jvalue, jgrads = jax.value_and_grad(jf, (0, 1))(w, v)
    np.testing.assert_allclose(value.item(), jvalue, rtol=RTOL, atol=ATOL)
    for g, jg in zip(grads, jgrads):
        np.testing.assert_allclose(g.numpy(), jg, rtol=RTOL, atol=ATOL)
    hess = nx.jacrev(nx.grad(f))(nx.tensor(w), nx.tensor(v))
    np.testing.assert_allclose(hess.numpy(), jax.hessian(jf)(w, v), rtol=1e-4, atol=1e-4)

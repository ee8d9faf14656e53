"""Autodiff, generated from the op table (``op_specs.py``) and the primitive registry
(DESIGN.md, convention 3), plus finite differences, higher order, pytrees and ``backward()``.

Every differentiable op spec (float32 inputs, float output) is checked against JAX: ``nx.vjp`` vs
``jax.vjp`` of the reference with a random cotangent, ``nx.jvp`` vs ``jax.jvp`` with random
tangents. Ops that are piecewise constant (floor, sign, round, ...) must give zeros, as in JAX.
"""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.core import realize as _realize
from nablax.core.primitive import REGISTRY
from nablax.core.prims import _rules
from nablax.core.transforms import plan

try:
    from . import op_specs as S
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    import op_specs as S


RTOL, ATOL = 1e-4, 1e-5


# ---- generated from op_specs -----------------------------------------------------------------


def _float_slots(tree, path=()):
    """Paths (tuples of keys) of the float NumPy arrays in a case's ``(args, kwargs)``: the inputs
    to differentiate (``Static`` values, integer arrays and Python scalars stay fixed)."""
    if isinstance(tree, np.ndarray) and tree.dtype.kind == "f":
        return [path]
    if isinstance(tree, (list, tuple)):
        return [p for i, v in enumerate(tree) for p in _float_slots(v, (*path, i))]
    if isinstance(tree, dict):
        return [p for k, v in tree.items() for p in _float_slots(v, (*path, k))]
    return []


def _replace(tree, path, value):
    if not path:
        return value
    k, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, k: _replace(tree[k], rest, value)}
    items = list(tree)
    items[k] = _replace(items[k], rest, value)
    return type(tree)(items) if isinstance(tree, tuple) else items


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _as_function(fn, case, convert):
    """``fn`` of the case's float inputs (the rest fixed), returning the flat list of its outputs.
    Substituted inputs are tensors / jax values already, which ``convert`` passes through."""
    tree = (case.args, case.kwargs)
    slots = _float_slots(tree)

    def f(*xs):
        t = tree
        for p, x in zip(slots, xs):
            t = _replace(t, p, x)
        return S.outputs(fn(*convert(t[0]), **convert(t[1])))

    return f, [_get(tree, p) for p in slots]


def _float_outputs(outs) -> list[int]:
    return [k for k, o in enumerate(outs) if jnp.issubdtype(np.dtype(o.dtype), jnp.floating)]


def _closures(spec, case):
    """``(f_nx, f_ref, primals)``: functions of the case's float inputs returning the tuple of its
    float outputs; None when no output is float (comparisons, argmax, ...)."""
    keep = _float_outputs(_ref_outputs(spec, case))
    if not keep:
        return None
    f_nx, primals = _as_function(spec.fn, case, S.to_nx)
    f_ref, _ = _as_function(spec.ref, case, S.to_jnp)
    return (
        lambda *xs: tuple(f_nx(*xs)[k] for k in keep),
        lambda *xs: tuple(f_ref(*xs)[k] for k in keep),
        primals,
    )


# Cases per spec: every case of the specs whose derivative depends on the case's structure
# (broadcasting, axes, index patterns, contraction specs); the first few elsewhere (the op table's
# other cases vary values or dtypes, which the value tests cover). Keeps the suite fast.
_ALL_CASES = {
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "maximum",
    "arctan2",
    "where",
    "einsum",
    "matmul",
    "dot",
    "getitem",
    "sum",
    "prod",
    "max",
    "concatenate",
    "split",
    "pad",
    "at.set",
    "at.add",
    "setitem",
    "var",
    "logsumexp",
    "softmax",
    "log_softmax",
    "take",
    "repeat",
    "tile",
}
_MAX_CASES = 3
# Primitives whose derivative is whatever the user defined (not the reference's): their specs check
# values only; a dedicated test below checks the derivative (see _CHECKED_HERE).
_USER_DEFINED = {"custom_vjp_call"}
# Forward mode only, as in JAX: reverse mode raises a clear error (checked below).
_FORWARD_ONLY = {"while_loop"}


def _ref_outputs(spec, case):
    ref = lambda: spec.ref(*S.to_jnp(case.args), **S.to_jnp(case.kwargs))  # noqa: E731
    # data-dependent result shapes (boolean masks) cannot be traced: run those references
    return S.outputs(jax.eval_shape(ref) if spec.lazy else ref())


def _has_float_output(spec, case) -> bool:
    return bool(_float_outputs(_ref_outputs(spec, case)))


def _grad_params():
    out = []
    for spec in S.SPECS:
        if S.F32 not in spec.dtypes or spec.prims & _USER_DEFINED:
            continue
        cases = [
            (i, c)
            for i, c in enumerate(spec.cases(S.F32))
            # a case with wrong values (strict xfail in test_ops) adds nothing here
            if c.xfail is None and _float_slots((c.args, c.kwargs))
        ]
        if not cases:
            continue
        if not _has_float_output(spec, cases[0][1]):
            cases = cases[:1]  # integer/bool results: one zero-gradient check is enough
        elif spec.name not in _ALL_CASES:
            cases = cases[:_MAX_CASES]
        for i, case in cases:
            label = f"-{case.label}" if case.label else ""
            out.append(pytest.param(spec, case, id=f"{spec.name}-{i}{label}"))
    return out


GRAD_PARAMS = _grad_params()


def _random(rng, aval):
    return rng.standard_normal(tuple(aval.shape)).astype(np.float32).astype(aval.dtype)


def _check(got, want, spec, what):
    rtol, atol = RTOL * spec.tol_scale, ATOL * spec.tol_scale
    want = np.asarray(want)
    if want.dtype != np.float32:  # float16/bfloat16 outputs of astype
        rtol, atol = S.tolerance(want.dtype, spec.tol_scale)
    # scale atol with the magnitude of the reference (sums of many float32 terms)
    finite = np.abs(want[np.isfinite(want)].astype(np.float64))
    scale = max(1.0, float(np.max(finite, initial=0.0)))
    S.assert_close(np.asarray(got), want, rtol, atol * scale, f"{spec.name}: {what}")


@pytest.mark.parametrize("spec,case", GRAD_PARAMS)
def test_derivatives_match_jax(spec, case):
    """nx.vjp vs jax.vjp (random cotangent) and nx.jvp vs jax.jvp (random tangents)."""
    made = _closures(spec, case)
    if made is None:
        return _assert_not_differentiable(spec, case)
    f_nx, f_ref, primals = made
    rng = np.random.default_rng(sum(map(ord, spec.name)))
    out_avals = jax.eval_shape(f_ref, *primals) if spec.lazy else f_ref(*primals)
    cts = tuple(_random(rng, o) for o in out_avals)
    tans = tuple(_random(rng, jax.ShapeDtypeStruct(np.shape(p), np.float32)) for p in primals)

    def reference(primals, cts, tans):
        out, pull = jax.vjp(f_ref, *primals)
        return out, pull(cts), jax.jvp(f_ref, primals, tans)[1]

    if spec.prims & _FORWARD_ONLY:
        return _check_forward_only(spec, f_nx, f_ref, primals, tans)
    reference = jax.jit(reference) if spec.lazy else reference  # one compile, not one per op
    out_ref, ct_ref, t_ref = reference(tuple(primals), cts, tans)
    out, pull = nx.vjp(f_nx, *[nx.tensor(p) for p in primals])
    ct_got = pull(tuple(nx.tensor(c) for c in cts))
    out2, t_got = nx.jvp(f_nx, tuple(nx.tensor(p) for p in primals), tuple(map(nx.tensor, tans)))
    assert isinstance(ct_got, tuple) and len(ct_got) == len(primals)
    assert len(t_got) == len(t_ref)
    for k, (g, w) in enumerate([*zip(ct_got, ct_ref), *zip(t_got, t_ref)]):
        assert isinstance(g, nx.Tensor), type(g)
        assert g.shape == tuple(w.shape) and g.dtype == w.dtype, (k, g.shape, g.dtype, w.shape)
    nx.realize(out, ct_got, out2, t_got)  # one program
    for k, (o, o2, r) in enumerate(zip(out, out2, out_ref)):
        _check(o.numpy(), r, spec, f"nx.vjp primal output {k}")
        _check(o2.numpy(), r, spec, f"nx.jvp primal output {k}")
    for k, (g, w) in enumerate(zip(ct_got, ct_ref)):
        _check(g.numpy(), w, spec, f"nx.vjp cotangent of input {k}")
    for k, (t, w) in enumerate(zip(t_got, t_ref)):
        _check(t.numpy(), w, spec, f"nx.jvp tangent of output {k}")
    _check_plan_replay(f_nx, primals, cts, ct_got)


def _check_forward_only(spec, f_nx, f_ref, primals, tans):
    out_ref, t_ref = jax.jvp(f_ref, tuple(primals), tans)
    out, t_got = nx.jvp(f_nx, tuple(nx.tensor(p) for p in primals), tuple(map(nx.tensor, tans)))
    for o, t, r, w in zip(out, t_got, out_ref, t_ref):
        _check(o.numpy(), r, spec, "nx.jvp primal output")
        _check(t.numpy(), w, spec, "nx.jvp tangent output")
    _, pull = nx.vjp(f_nx, *[nx.tensor(p) for p in primals])
    with pytest.raises(ValueError, match=r"nx\.while_loop: reverse-mode.*fori_loop.*nx\.scan"):
        pull(tuple(nx.ones_like(o) for o in out))


def _pending_structure(tensors):
    """The realization cache key of the pending graph behind ``tensors``."""
    nodes = [t._impl.src[0] for t in tensors if t._impl.src is not None]
    return _realize._structure(_realize._collect(nodes, {}))[1]


def _check_plan_replay(f_nx, primals, cts, ct_first):
    """The first reverse pass over a structure recorded a plan (transforms/plan.py); the next one
    replays it. The replayed cotangents equal the first ones exactly, and the replayed graph has
    the same realization key as the graph the rules build (rules forced with plans off)."""
    hits = plan.plan_info()[1]
    out_r, pull = nx.vjp(f_nx, *[nx.tensor(p) for p in primals])
    replayed = pull(tuple(nx.tensor(c) for c in cts))
    if plan.plan_info()[1] == hits:  # unplannable structure: the rules ran again
        return
    with _config.override(backward_plans=False):
        out_b, pull = nx.vjp(f_nx, *[nx.tensor(p) for p in primals])
        by_rules = pull(tuple(nx.tensor(c) for c in cts))
    # both forward outputs are alive (they are outputs of the realization in both graphs)
    assert _pending_structure([*replayed, *out_r]) == _pending_structure([*by_rules, *out_b])
    for g, g0 in zip(replayed, ct_first):
        np.testing.assert_array_equal(g.numpy(), g0.numpy())


def _assert_not_differentiable(spec, case):
    """Float inputs but no float output (comparisons, argmax, ...): the gradient of a float function
    of the results (cast to float32) is zero, as in JAX."""
    f_nx, primals = _as_function(spec.fn, case, S.to_nx)
    f_ref, _ = _as_function(spec.ref, case, S.to_jnp)
    argnums = tuple(range(len(primals)))
    want = jax.grad(lambda *xs: sum(o.astype(jnp.float32).sum() for o in f_ref(*xs)), argnums)(
        *map(jnp.asarray, primals)
    )
    got = nx.grad(lambda *xs: sum(o.astype(nx.float32).sum() for o in f_nx(*xs)), argnums)(
        *map(nx.tensor, primals)
    )
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_array_equal(g.numpy(), np.asarray(w))


# ---- registry checks -------------------------------------------------------------------------

# Primitives that no op spec builds, gradient-checked by a dedicated test of this file (the test
# named here asserts that its graph really contains the primitive).
_CHECKED_HERE = {
    "custom_vjp_call": "test_custom_vjp_matches_jax",
    # markers of computed inputs are computed at once (no node in any program); this test
    # differentiates through a pending one
    "trace_input": "test_markers_of_pending_and_computed_inputs_match_jax",
}


def test_every_primitive_has_rules():
    missing = sorted(
        f"{name}: {kind}"
        for name, p in REGISTRY.items()
        for kind in ("jvp", "vjp")
        if getattr(p, kind) is None
    )
    assert not missing, f"primitives without differentiation rules: {missing}"


def _graph_prims(spec, case) -> set:
    from nablax.core.graph import toposort

    outs = S.outputs(spec.fn(*S.to_nx(case.args), **S.to_nx(case.kwargs)))
    roots = [o._impl.src[0] for o in outs if isinstance(o, nx.Tensor) and not o.is_realized]
    return {n.prim.name for n in toposort(roots)}


def test_every_differentiable_primitive_is_gradient_checked():
    """Every primitive with non-zero rules is built by a case that test_derivatives_match_jax
    compares with JAX (collected from the graphs those cases really build)."""
    checked: set = set()
    for p in GRAD_PARAMS:
        spec, case = p.values
        if _closures(spec, case) is not None:
            checked |= _graph_prims(spec, case)
    differentiable = {
        name
        for name, p in REGISTRY.items()
        if not (p.jvp is _rules.zero_jvp and p.vjp is _rules.zero_vjp)
    }
    missing = sorted(differentiable - checked - set(_CHECKED_HERE))
    assert not missing, (
        f"primitives with derivative rules that no gradient-checked op spec builds: {missing}. "
        "Add a float32 case to tests/core/op_specs.py"
    )
    stale = sorted(set(_CHECKED_HERE) - set(REGISTRY))
    assert not stale, f"_CHECKED_HERE names unregistered primitives: {stale}"


# ---- points where the derivative is a convention: match JAX --------------------------------


def _tie_cases():
    ties = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, 2.0, -1.0]], np.float32)
    zeros = np.array([-1.0, 0.0, 0.0, 2.0], np.float32)
    bounds = np.array([-1.0, -0.5, 1.0, 2.0], np.float32)
    nan_branch = np.array([-1.0, 0.5, 2.0], np.float32)
    return [
        ("max_all", lambda m, x: m.max(x), ties),
        ("max_axis", lambda m, x: m.max(x, axis=1), ties),
        ("min_axis0", lambda m, x: m.min(x, axis=0), ties),
        ("maximum_self", lambda m, x: m.maximum(x, x * 1.0), ties),
        ("minimum_bcast", lambda m, x: m.minimum(x, x[:, :1]), ties),
        ("relu_at_0", lambda m, x: m.relu(x), zeros),
        ("clip_at_bounds", lambda m, x: m.clip(x, -1.0, 1.0), bounds),
        ("sort_ties", lambda m, x: m.sort(x, axis=1), ties),
        ("topk_ties", lambda m, x: m.topk(x, 2)[0], ties),
        ("argmax_weighted", lambda m, x: x * m.argmax(x, axis=1)[:, None], ties),
        ("where_nan_branch", lambda m, x: m.where(x > 0, m.sqrt(x), 0.0), nan_branch),
        ("floor_round_sign", lambda m, x: m.floor(x) + m.round(x) + m.sign(x) * x, ties),
    ]


# The jax spellings of the nablax functions used by the hand-written tests below: those tests are
# written once as ``f(m, x)`` and run with ``m = nx`` and ``m = J``.
J = SimpleNamespace(
    **{
        n: getattr(jnp, n)
        for n in (
            "max min maximum minimum clip sort argmax where sqrt floor round sign sin cos exp log "
            "tanh sum mean var std einsum cumsum take_along_axis matmul float32"
        ).split()
    },
    **{
        n: getattr(jax.nn, n)
        for n in "relu softmax log_softmax logsumexp gelu silu softplus one_hot sigmoid".split()
    },
    topk=jax.lax.top_k,
)


@pytest.mark.parametrize("name,f,x", _tie_cases(), ids=[c[0] for c in _tie_cases()])
def test_ties_and_kinks_match_jax(name, f, x):
    rng = np.random.default_rng(1)
    ct = rng.standard_normal(jax.eval_shape(lambda v: f(J, v), x).shape).astype(np.float32)
    tan = rng.standard_normal(x.shape).astype(np.float32)

    @jax.jit
    def reference(x, ct, tan):
        out, pull = jax.vjp(lambda v: f(J, v), x)
        return out, pull(ct)[0], jax.jvp(lambda v: f(J, v), (x,), (tan,))[1]

    out_ref, want, t_want = reference(x, ct, tan)
    out, f_vjp = nx.vjp(lambda v: f(nx, v), nx.tensor(x))
    (got,) = f_vjp(nx.tensor(ct))
    t_got = nx.jvp(lambda v: f(nx, v), (nx.tensor(x),), (nx.tensor(tan),))[1]
    np.testing.assert_allclose(out.numpy(), out_ref, rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-6, atol=1e-7, equal_nan=True)
    np.testing.assert_allclose(t_got.numpy(), t_want, rtol=1e-6, atol=1e-7, equal_nan=True)


def test_mean_of_empty_axis_gradient():
    # jax: d/dx of mean(x, axis=0).sum() for x of shape (0, 3) is an empty (0, 3) array
    x = np.zeros((0, 3), np.float32)
    want = jax.grad(lambda v: jnp.mean(v, axis=0).sum())(x)
    got = nx.grad(lambda v: nx.mean(v, axis=0).sum())(nx.tensor(x))
    assert got.shape == want.shape == (0, 3)
    t = nx.jvp(lambda v: nx.mean(v, axis=0), (nx.tensor(x),), (nx.tensor(x),))[1]
    np.testing.assert_array_equal(t.numpy(), jax.jvp(lambda v: jnp.mean(v, axis=0), (x,), (x,))[1])


# ---- finite differences for composites -------------------------------------------------------


def _fd_grad(f, x: np.ndarray, eps: float) -> np.ndarray:
    """Central differences of the scalar nablax function ``f`` at float32 ``x``."""
    g = np.zeros(x.shape, np.float64)
    for i in np.ndindex(x.shape):
        hi, lo = x.copy(), x.copy()
        hi[i] += eps
        lo[i] -= eps
        g[i] = (f(nx.tensor(hi)).item() - f(nx.tensor(lo)).item()) / (2 * eps)
    return g


def _composites():
    r = np.random.default_rng(7)
    a34 = r.standard_normal((3, 4)).astype(np.float32)
    away = np.array([[-1.6, -0.4, 0.3, 1.7], [0.6, -0.7, 2.2, -2.5]], np.float32)  # far from 0, ±1
    idx = np.array([[2, 0], [1, 3], [3, 3]], np.int32)
    labels = np.array([1, 0, 3], np.int32)
    b = r.standard_normal((4, 2)).astype(np.float32)
    bat = r.standard_normal((2, 4, 3)).astype(np.float32)
    return [
        ("softmax", lambda m, x: m.softmax(x, axis=-1), a34),
        ("softmax_axis0", lambda m, x: m.softmax(x, axis=0), a34),
        ("log_softmax", lambda m, x: m.log_softmax(x), a34),
        ("logsumexp", lambda m, x: m.logsumexp(x, axis=1), a34),
        ("var", lambda m, x: m.var(x, axis=0), a34),
        ("var_ddof1", lambda m, x: m.var(x, axis=1, ddof=1), a34),
        ("std", lambda m, x: m.std(x), a34),
        ("gelu_tanh", lambda m, x: m.gelu(x), a34),
        ("gelu_erf", lambda m, x: m.gelu(x, approximate=False), a34),
        ("silu", lambda m, x: m.silu(x), a34),
        ("softplus", lambda m, x: m.softplus(x * 4.0), a34),
        ("clip", lambda m, x: m.clip(x, -1.0, 1.0) * x, away),
        ("where", lambda m, x: m.where(x > 0, x * x, m.sin(x)), away),
        ("take_along_axis", lambda m, x: m.take_along_axis(x * x, idx, axis=1), a34),
        (
            "one_hot_xent",
            lambda m, x: -(m.one_hot(labels, 4, dtype=m.float32) * m.log_softmax(x)).sum(),
            a34,
        ),
        ("matmul", lambda m, x: m.matmul(m.tanh(x), b), a34),
        ("einsum_batched", lambda m, x: m.einsum("bij,bjk->bik", x, x.transpose(0, 2, 1)), bat),
        ("einsum_trace", lambda m, x: m.einsum("ij,ij->i", x, m.sin(x)), a34),
        ("cumsum", lambda m, x: m.cumsum(x * x, axis=1), a34),
    ]


@pytest.mark.parametrize("name,f,x", _composites(), ids=[c[0] for c in _composites()])
def test_composite_gradients_match_finite_differences_and_jax(name, f, x):
    w = np.random.default_rng(3).standard_normal(np.shape(jax.eval_shape(lambda v: f(J, v), x)))
    w = w.astype(np.float32)
    scalar_nx = lambda v: (f(nx, v) * nx.tensor(w)).sum()  # noqa: E731
    got = nx.grad(scalar_nx)(nx.tensor(x)).numpy()
    fd = _fd_grad(scalar_nx, x, eps=2e-3)
    np.testing.assert_allclose(got, fd, rtol=2e-2, atol=5e-3, err_msg=f"{name}: vs finite diff.")
    want = jax.jit(jax.grad(lambda v: (f(J, v) * w).sum()))(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"{name}: vs jax.grad")


# ---- higher order ----------------------------------------------------------------------------


def _close(got, want, rtol=1e-4, atol=1e-5, what=""):
    np.testing.assert_allclose(
        np.asarray(got), np.asarray(want), rtol=rtol, atol=atol, err_msg=what
    )


def _entropy(m, t):
    x = np.array([0.3, -1.2, 2.0, 0.1], np.float32)
    return -(m.softmax(t * x) * m.log_softmax(t * x)).sum()


_SCALAR_FNS = [
    ("sin", lambda m, x: m.sin(x)),
    ("x_exp_x", lambda m, x: x * m.exp(x)),
    ("cube", lambda m, x: x**3),
    ("tanh_chain", lambda m, x: m.tanh(m.tanh(2.0 * x) * x + 1.0)),
    ("softmax_entropy", _entropy),
    ("log_sigmoid", lambda m, x: m.log(m.sigmoid(x)) / (1.0 + x * x)),
]


@pytest.mark.parametrize("name,f", _SCALAR_FNS, ids=[n for n, _ in _SCALAR_FNS])
def test_grad_of_grad_matches_jax(name, f):
    xs = (-1.3, 0.4, 0.9)
    order = 2 if name in ("softmax_entropy", "log_sigmoid") else 3  # (compile time)
    fns = [lambda x: f(nx, x)]
    jfns = [lambda x: f(J, x)]
    for _ in range(order):
        fns.append(nx.grad(fns[-1]))
        jfns.append(jax.grad(jfns[-1]))
    got = [[d(nx.tensor(x)) for d in fns[2:]] for x in xs]
    nx.realize(got)
    want = jax.jit(lambda x: [d(x) for d in jfns[2:]])
    for x, gs in zip(xs, got):
        for k, (g, w) in enumerate(zip(gs, want(np.float32(x))), start=2):
            _close(g.numpy(), w, rtol=1e-4 * k, atol=1e-5 * k, what=f"{name} order {k} at {x}")


def _mlp_loss(m, w1, w2, x, y):
    h = m.tanh(x @ w1)
    return ((h @ w2 - y) ** 2).mean() + 0.01 * (w1 * w1).sum()


def _mlp_data():
    r = np.random.default_rng(11)
    f = lambda *s: r.standard_normal(s).astype(np.float32)  # noqa: E731
    return f(3, 4), f(4, 2), f(5, 3), f(5, 2)  # w1, w2, x, y


def test_hessian_vector_products_match_jax():
    w1, w2, x, y = _mlp_data()
    v = np.random.default_rng(12).standard_normal(w1.shape).astype(np.float32)
    loss_nx = lambda a, b: _mlp_loss(nx, a, b, nx.tensor(x), nx.tensor(y))  # noqa: E731
    loss_j = lambda a, b: _mlp_loss(J, a, b, x, y)  # noqa: E731
    t1, t2 = nx.tensor(w1), nx.tensor(w2)
    # forward over reverse
    g, hvp = nx.jvp(lambda a: nx.grad(loss_nx)(a, t2), (t1,), (nx.tensor(v),))
    # reverse over reverse
    rr = nx.grad(lambda a: (nx.grad(loss_nx)(a, t2) * nx.tensor(v)).sum())(t1)
    # reverse over forward
    rf = nx.grad(lambda a: nx.jvp(lambda b: loss_nx(b, t2), (a,), (nx.tensor(v),))[1])(t1)
    # mixed second derivative d/dw2 <grad_w1 loss, v>
    mixed = nx.grad(lambda b: (nx.grad(loss_nx)(t1, b) * nx.tensor(v)).sum())(t2)
    nx.realize(g, hvp, rr, rf, mixed)

    @jax.jit
    def reference(w1, w2, v):
        g, hvp = jax.jvp(lambda a: jax.grad(loss_j)(a, w2), (w1,), (v,))
        mixed = jax.grad(lambda b: (jax.grad(loss_j)(w1, b) * v).sum())(w2)
        return g, hvp, mixed

    jg, jhvp, jmixed = reference(w1, w2, v)
    _close(g.numpy(), jg, what="gradient")
    for name, h in (("jvp(grad)", hvp), ("grad(grad)", rr), ("grad(jvp)", rf)):
        _close(h.numpy(), jhvp, rtol=2e-4, atol=2e-5, what=name)
    _close(mixed.numpy(), jmixed, rtol=2e-4, atol=2e-5, what="mixed")


def test_grad_of_value_and_grad():
    f_nx = lambda x: (nx.sin(x) * x).sum()  # noqa: E731
    f_j = lambda x: (jnp.sin(x) * x).sum()  # noqa: E731

    def outer(m, vg, f, x):
        v, g = vg(f)(x)
        return v * v + (g * g).sum()

    x = np.array([0.5, -1.0, 2.0], np.float32)
    got = nx.grad(lambda x: outer(nx, nx.value_and_grad, f_nx, x))(nx.tensor(x))
    want = jax.jit(jax.grad(lambda x: outer(J, jax.value_and_grad, f_j, x)))(x)
    _close(got.numpy(), want)
    # value_and_grad of a gradient norm (second order inside value_and_grad)
    v, g = nx.value_and_grad(lambda x: (nx.grad(f_nx)(x) ** 2).sum())(nx.tensor(x))
    jv, jg = jax.jit(jax.value_and_grad(lambda x: (jax.grad(f_j)(x) ** 2).sum()))(x)
    _close(v.numpy(), jv)
    _close(g.numpy(), jg)


# ---- argnums, has_aux, pytrees ---------------------------------------------------------------


def _f3(m, a, b, c):
    return (m.sin(a) * b).sum() + (b @ c).sum() * a.sum() + (c**2).mean()


def _abc():
    r = np.random.default_rng(21)
    return (
        r.standard_normal((2, 3)).astype(np.float32),
        r.standard_normal((2, 3)).astype(np.float32),
        r.standard_normal((3, 2)).astype(np.float32),
    )


@pytest.mark.parametrize("argnums", [0, 2, (0,), (0, 2), (2, 0), (1, 2, 0)])
def test_argnums_match_jax(argnums):
    abc = _abc()
    args = [nx.tensor(v) for v in abc]
    v, g = nx.value_and_grad(lambda *a: _f3(nx, *a), argnums=argnums)(*args)
    g2 = nx.grad(lambda *a: _f3(nx, *a), argnums=argnums)(*args)
    jv, jg = jax.jit(jax.value_and_grad(lambda *a: _f3(J, *a), argnums=argnums))(*abc)
    _close(v.numpy(), jv)
    if isinstance(argnums, int):
        assert isinstance(g, nx.Tensor) and isinstance(g2, nx.Tensor)
        g, g2, jg = (g,), (g2,), (jg,)
    assert isinstance(g, tuple) and len(g) == len(jg)
    for a, b, w in zip(g, g2, jg):
        _close(a.numpy(), w)
        _close(b.numpy(), w)


def test_has_aux_matches_jax():
    abc = _abc()

    def f(m, a, b, c):
        loss = _f3(m, a, b, c)
        return loss, {"loss": loss, "scaled": a * 2.0, "tag": "step"}

    args = [nx.tensor(v) for v in abc]
    g, aux = nx.grad(lambda *a: f(nx, *a), argnums=(0, 1), has_aux=True)(*args)
    (v, aux2), g2 = nx.value_and_grad(lambda *a: f(nx, *a), has_aux=True)(*args)
    out, f_vjp, aux3 = nx.vjp(lambda a: f(nx, a, args[1], args[2]), args[0], has_aux=True)
    jf = lambda *a: (lambda r: (r[0], {k: r[1][k] for k in ("loss", "scaled")}))(f(J, *a))  # noqa: E731
    jg, jaux = jax.jit(jax.grad(jf, argnums=(0, 1), has_aux=True))(*abc)
    for a, w in zip(g, jg):
        _close(a.numpy(), w)
    _close(g2.numpy(), jg[0])
    _close(f_vjp(nx.tensor(1.0))[0].numpy(), jg[0])
    for au in (aux, aux2, aux3):
        assert au["tag"] == "step"
        _close(au["loss"].numpy(), jaux["loss"])
        _close(au["scaled"].numpy(), jaux["scaled"])
    _close(v.numpy(), jaux["loss"])
    _close(out.numpy(), jaux["loss"])


@nx.tree.register_dataclass
class Params:
    w: object
    b: object


def _tree_loss(m, p, extra):
    # p: {"layers": [Params, Params], "scale": (s,)}; extra: a tuple with a float and an int
    h = extra[0]
    for layer in p["layers"]:
        h = m.tanh(h @ layer.w + layer.b)
    return (h * p["scale"][0]).sum() + (extra[0] ** 2).sum() * extra[1]


def _tree_data(conv):
    r = np.random.default_rng(31)
    f = lambda *s: conv(r.standard_normal(s).astype(np.float32))  # noqa: E731
    p = {"layers": [Params(f(3, 4), f(4)), Params(f(4, 2), f(2))], "scale": (f(2),)}
    return p, (f(5, 3), 3)


def test_pytree_inputs_match_jax():
    p, extra = _tree_data(nx.tensor)
    jp, jextra = _tree_data(jnp.asarray)
    gp, gx = nx.grad(lambda p, e: _tree_loss(nx, p, e), argnums=(0, 1))(p, (extra[0], 3.0))
    jgp, jgx = jax.jit(jax.grad(lambda p, e: _tree_loss(J, p, e), argnums=(0, 1)))(
        jp, (jextra[0], 3.0)
    )
    assert nx.tree.structure(gp) == nx.tree.structure(p)
    assert isinstance(gp["layers"][1], Params) and isinstance(gp["scale"], tuple)
    got = nx.tree.leaves((gp, gx))
    want = jax.tree_util.tree_leaves((jgp, jgx))
    assert len(got) == len(want)
    for a, w in zip(got, want):
        _close(a.numpy(), w)
    # jvp with pytree primals and tangents
    tp = nx.tree.map(lambda t: nx.ones_like(t) * 0.5, p)
    jtp = jax.tree_util.tree_map(lambda t: jnp.ones_like(t) * 0.5, jp)
    _, t = nx.jvp(lambda p: _tree_loss(nx, p, extra), (p,), (tp,))
    _, jt = jax.jit(lambda p, t: jax.jvp(lambda q: _tree_loss(J, q, jextra), (p,), (t,)))(jp, jtp)
    _close(t.numpy(), jt)


def test_vjp_with_pytree_outputs_matches_jax():
    a, b, c = _abc()

    def f(m, x, y):
        return {"prod": x * y, "pair": (m.sin(x).sum(axis=0), [m.exp(y) @ c])}

    r = np.random.default_rng(41)
    cts = jax.tree_util.tree_map(
        lambda o: r.standard_normal(o.shape).astype(np.float32),
        jax.eval_shape(lambda x, y: f(J, x, y), a, b),
    )
    out, f_vjp = nx.vjp(lambda x, y: f(nx, x, y), nx.tensor(a), nx.tensor(b))
    assert isinstance(out, dict) and isinstance(out["pair"], tuple)
    assert isinstance(out["pair"][1], list)
    got = f_vjp(jax.tree_util.tree_map(nx.tensor, cts))
    jout, want = jax.jit(
        lambda a, b, c: (lambda o, p: (o, p(c)))(*jax.vjp(lambda x, y: f(J, x, y), a, b))
    )(a, b, cts)
    assert isinstance(got, tuple) and len(got) == 2
    for o, w in zip(nx.tree.leaves(out), jax.tree_util.tree_leaves(jout)):
        _close(o.numpy(), w)
    for g, w in zip(got, want):
        _close(g.numpy(), w)


# ---- jacobians and custom_vjp ----------------------------------------------------------------


def test_jacobians_match_jax():
    a, b, _ = _abc()
    f = lambda m, x, y: m.tanh(x * y).sum(axis=1) * x[:, 0]  # noqa: E731
    x, y = nx.tensor(a), nx.tensor(b)
    for name, nfn, jfn in (("jacrev", nx.jacrev, jax.jacrev), ("jacfwd", nx.jacfwd, jax.jacfwd)):
        got = nfn(lambda u, v: f(nx, u, v), argnums=(0, 1))(x, y)
        want = jax.jit(jfn(lambda u, v: f(J, u, v), argnums=(0, 1)))(a, b)
        assert isinstance(got, tuple) and len(got) == 2
        for g, w in zip(got, want):
            assert g.shape == w.shape, (name, g.shape, w.shape)
            _close(g.numpy(), w, what=name)
    s = lambda m, x: (m.sin(x) * x[::-1]).sum() + (x**3).prod()  # noqa: E731
    v = np.array([0.3, -0.8, 1.1], np.float32)
    want = jax.jit(jax.hessian(lambda u: s(J, u)))(v)
    _close(nx.hessian(lambda u: s(nx, u))(nx.tensor(v)).numpy(), want)


def _clipped_sin(m, custom):
    """sin(x) * k with a hand-written backward: the cotangent is clipped to [-1, 1] first."""

    def f(x, k):
        return m.sin(x) * k

    def fwd(x, k):
        s = m.sin(x)
        return s * k, (s, m.cos(x), k)

    def bwd(res, g):
        sin_x, cos_x, k = res
        gc = m.clip(g, -1.0, 1.0)
        return gc * cos_x * k, (gc * sin_x).sum()

    f = custom(f)
    f.defvjp(fwd, bwd)
    return f


def test_custom_vjp_matches_jax():
    from nablax.core.graph import toposort

    x = np.array([0.3, -1.2, 2.0], np.float32)
    k = np.float32(1.5)
    cf_nx, cf_j = _clipped_sin(nx, nx.custom_vjp), _clipped_sin(J, jax.custom_vjp)
    ct = np.array([3.0, -0.5, -2.0], np.float32)
    loss_nx = lambda u, kk: (cf_nx(u, kk) * nx.tensor(ct)).sum()  # noqa: E731
    loss_j = lambda u, kk: (cf_j(u, kk) * ct).sum()  # noqa: E731
    got = nx.grad(loss_nx, argnums=(0, 1))(nx.tensor(x), nx.tensor(k))
    want = jax.jit(jax.grad(loss_j, argnums=(0, 1)))(x, k)
    for g, w in zip(got, want):
        _close(g.numpy(), w)
    # the graph really goes through the custom_vjp primitive (see _CHECKED_HERE)
    out, _ = nx.vjp(lambda u: cf_nx(u, nx.tensor(k)), nx.tensor(x))
    assert "custom_vjp_call" in {n.prim.name for n in toposort([out._impl.src[0]])}
    # without differentiation the function runs as written
    _close(cf_nx(nx.tensor(x), nx.tensor(k)).numpy(), np.sin(x) * k, rtol=1e-6)


def test_grad_of_grad_through_custom_vjp():
    def make(m, custom):
        f = custom(lambda x: m.sin(x))
        f.defvjp(lambda x: (m.sin(x), m.cos(x)), lambda cos_x, g: (cos_x * g,))
        return f

    f_nx, f_j = make(nx, nx.custom_vjp), make(J, jax.custom_vjp)
    x = np.float32(0.7)
    want = jax.grad(jax.grad(f_j))(x)  # -sin(0.7)
    _close(nx.grad(nx.grad(f_nx))(nx.tensor(x)).numpy(), want, what="grad(grad)")
    t = nx.jvp(nx.grad(f_nx), (nx.tensor(x),), (nx.tensor(1.0),))[1]
    _close(t.numpy(), want, what="jvp(grad)")


# ---- PyTorch-style backward() ----------------------------------------------------------------


def _leaves():
    w1, w2, x, y = _mlp_data()
    return nx.tensor(w1), nx.tensor(w2), nx.tensor(x), nx.tensor(y)


def test_backward_matches_grad_and_accumulates():
    w1, w2, x, y = _leaves()
    g1, g2 = nx.grad(lambda a, b: _mlp_loss(nx, a, b, x, y), argnums=(0, 1))(w1, w2)
    assert not w1.requires_grad
    w1.requires_grad_()
    w2.requires_grad_()
    assert w1.requires_grad and w1.grad is None
    loss = _mlp_loss(nx, w1, w2, x, y)
    _close(loss.numpy(), _mlp_loss(J, w1.numpy(), w2.numpy(), x.numpy(), y.numpy()))
    loss.backward()
    _close(w1.grad.numpy(), g1.numpy())
    _close(w2.grad.numpy(), g2.numpy())
    loss.backward()  # same loss again: accumulates
    _close(w1.grad.numpy(), 2 * g1.numpy())
    _mlp_loss(nx, w1, w2, x, y).backward()  # a new forward pass: accumulates too
    _close(w1.grad.numpy(), 3 * g1.numpy())
    _close(w2.grad.numpy(), 3 * g2.numpy())
    w1.grad = None
    assert w1.grad is None
    _mlp_loss(nx, w1, w2, x, y).backward()
    _close(w1.grad.numpy(), g1.numpy())  # cleared, then one pass
    _close(w2.grad.numpy(), 4 * g2.numpy())  # not cleared
    assert x.grad is None  # not a leaf: untouched


def test_backward_through_realized_intermediates(capsys):
    w1, w2, x, y = _leaves()
    want = nx.grad(lambda a: _mlp_loss(nx, a, w2, x, y))(w1).numpy()
    w1.requires_grad_()
    h = nx.tanh(x @ w1)
    print(h)  # realizes h
    scale = (h * h).mean().item()  # a Python float from a realized value: a constant
    assert h.is_realized and "[" in capsys.readouterr().out
    loss = ((h @ w2 - y) ** 2).mean() + 0.01 * (w1 * w1).sum()
    loss.item()
    loss.backward()
    _close(w1.grad.numpy(), want)
    w1.grad = None
    (loss * scale).backward()
    _close(w1.grad.numpy(), want * scale)


def test_backward_with_explicit_gradient_and_requires_grad_off():
    w = nx.tensor(np.array([0.5, -1.0, 2.0], np.float32)).requires_grad_()
    ct = np.array([1.0, 2.0, -3.0], np.float32)
    out = nx.sin(w) * w
    out.backward(nx.tensor(ct))
    _, f_vjp = jax.vjp(lambda v: jnp.sin(v) * v, w.numpy())
    _close(w.grad.numpy(), f_vjp(ct)[0])
    w.requires_grad_(False)
    assert not w.requires_grad
    _close(w.numpy(), [0.5, -1.0, 2.0])


def test_markers_of_pending_and_computed_inputs_match_jax():
    """A differentiated input gets a ``trace_input`` marker. The marker of a computed tensor is
    computed at once (programs read the array itself, no identity node or program boundary), yet
    the reverse pass still reaches it; the marker of a pending tensor is a graph node like any
    other. Both give JAX's gradient, also nested (a Hessian-vector product)."""
    from nablax.core.graph import toposort
    from nablax.core.transforms.trace import mark, marker_of, open_trace

    x_np = np.array([0.5, -1.5, 2.0], np.float32)
    f = lambda a: (a**3).sum() + (a * a[::-1]).sum()
    jf = lambda a: (a**3).sum() + (a * a[::-1]).sum()

    x = nx.tensor(x_np)
    with open_trace() as trace:
        m = mark(x, trace)
        assert m._impl.value is x._impl.value and m._impl.src is not None
        assert marker_of(m).values == [x._impl.value]
        assert trace.kept and trace.kept[-1]() is marker_of(m)
    pending = nx.tensor(x_np / 2) * 2.0
    with open_trace() as trace:
        assert mark(pending, trace)._impl.value is None  # pending stays pending

    want = np.asarray(jax.grad(jf)(jnp.asarray(x_np)))
    np.testing.assert_allclose(nx.grad(f)(x).numpy(), want, rtol=1e-6)
    g = nx.grad(f)(nx.tensor(x_np / 2) * 2.0)
    assert "trace_input" in {n.prim.name for n in toposort([g._impl.src[0]])}
    np.testing.assert_allclose(g.numpy(), want, rtol=1e-6)

    v = np.array([1.0, 0.5, -2.0], np.float32)
    hvp = lambda a: nx.grad(lambda b: (nx.grad(f)(b) * nx.tensor(v)).sum())(a)
    jhvp = jax.grad(lambda b: (jax.grad(jf)(b) * v).sum())(jnp.asarray(x_np))
    np.testing.assert_allclose(hvp(nx.tensor(x_np)).numpy(), np.asarray(jhvp), rtol=1e-5)
    np.testing.assert_allclose(hvp(nx.tensor(x_np / 2) * 2.0).numpy(), np.asarray(jhvp), rtol=1e-5)
    w = nx.tensor(x_np).requires_grad_()
    f(w).backward()
    np.testing.assert_allclose(w.grad.numpy(), want, rtol=1e-6)

"""Compositions of transforms against the same compositions in JAX.

The property: for every composition of two or three of ``jacrev``, ``jacfwd``, ``hessian``,
``grad`` and ``vmap``, applied to a few functions (R^n -> R^m and R^n -> R), nablax returns a
tensor that can be read and equals JAX's result, or raises the same error type at call time when
JAX does (``grad`` of a non-scalar function). A nested transform never leaves a tensor with a
stray batch axis behind.

Then the cases that used to go wrong, one by one: batch levels of size 1 (the one-row basis of
``jacrev`` of a scalar function), a ``vmap`` around a ``vjp`` function whose function uses ``vmap``
itself (levels are positional: the new level must stay apart from the function's own), forward mode
through a ``vmap`` of a closed-over primal, and ``nx.jvp(..., has_aux=True)``.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

_NAMES = ("jacrev", "jacfwd", "hessian", "grad", "vmap")
_NX = {n: getattr(nx, n) for n in _NAMES}
_JX = {n: getattr(jax, n) for n in _NAMES}


def _vec(m):
    """R^3 -> R^2."""
    return lambda x: m.sin(x[:2]) * (x * x).sum() + x[1:] ** 3


def _scalar(m):
    """R^3 -> R."""
    return lambda x: (m.tanh(x) * x[::-1]).sum() * x[0]


def _vec2(m):
    """R^2 -> R^2 (three transforms deep, derivatives of order up to 6: kept small)."""
    return lambda x: m.sin(x) * (x * x).sum() + x[::-1] ** 3


def _scalar2(m):
    """R^2 -> R."""
    return lambda x: (m.tanh(x) * x[::-1]).sum() * x[0]


_FUNCS = {"vec": _vec, "scalar": _scalar}
_FUNCS_SMALL = {"vec": _vec2, "scalar": _scalar2}


def _compose(lib: dict, names: tuple, f):
    for n in reversed(names):  # names[0] is the outermost transform
        f = lib[n](f)
    return f


def _x(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1.0, 1.0, shape).astype(np.float32)


def _close(got, want, rtol=1e-4, atol=1e-5, what=""):
    assert isinstance(got, nx.Tensor), (what, type(got))
    assert got._impl.batch_shape == (), (what, "stray batch axes", got._impl.batch_shape)
    assert got.shape == np.shape(want), (what, got.shape, np.shape(want))
    np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=rtol, atol=atol, err_msg=what)


def _check_composition(names: tuple, funcs: dict, n: int) -> None:
    for fname, make in funcs.items():
        # each vmap in the composition maps one more leading axis of the input
        x = _x((2,) * names.count("vmap") + (n,), seed=len(names))
        what = f"{'∘'.join(names)} of {fname}"
        try:
            want = np.asarray(jax.jit(_compose(_JX, names, make(jnp)))(x))  # one compile: fast
        except Exception as e:  # noqa: BLE001 - JAX refuses it: so must nablax, at call time
            with pytest.raises(type(e)):
                _compose(_NX, names, make(nx))(nx.tensor(x))
            continue
        _close(_compose(_NX, names, make(nx))(nx.tensor(x)), want, what=what)


@pytest.mark.parametrize("names", list(itertools.product(_NAMES, repeat=2)), ids="∘".join)
def test_every_composition_of_two_matches_jax(names):
    _check_composition(names, _FUNCS, 3)


@pytest.mark.parametrize("names", list(itertools.product(_NAMES, repeat=3)), ids="∘".join)
def test_every_composition_of_three_matches_jax(names):
    _check_composition(names, _FUNCS_SMALL, 2)


# ---- jacrev of jacrev --------------------------------------------------------------------


def test_jacrev_of_jacrev_of_a_scalar_function_is_readable():
    # jacrev of a scalar function pulls back a one-row basis: a size-1 vmap level, which the
    # outer backward pass used to keep on the result (shape (n, n), but unreadable)
    f_nx, f_j = _scalar(nx), _scalar(jnp)
    x = _x((3,))
    _close(nx.jacrev(nx.jacrev(f_nx))(nx.tensor(x)), jax.jacrev(jax.jacrev(f_j))(x))
    _close(
        nx.jacrev(nx.jacrev(nx.jacrev(f_nx)))(nx.tensor(x)),
        jax.jacrev(jax.jacrev(jax.jacrev(f_j)))(x),
    )
    xs = _x((4, 3), 1)
    _close(
        nx.vmap(nx.jacrev(nx.jacrev(f_nx)))(nx.tensor(xs)),
        jax.vmap(jax.jacrev(jax.jacrev(f_j)))(xs),
    )
    # the simplest form of the same bug: a size-1 vmap inside grad, over a closed-over argument
    xs1 = _x((1, 3), 2)
    g_nx = nx.grad(lambda w: nx.vmap(lambda a: (a * nx.sin(w)).sum())(nx.tensor(xs1)).sum())
    g_j = jax.grad(lambda w: jax.vmap(lambda a: (a * jnp.sin(w)).sum())(xs1).sum())
    _close(g_nx(nx.tensor(x)), g_j(x))


def test_jacrev_of_jacrev_with_argnums_pytrees_and_aux_matches_jax():
    def f(m):
        def run(p, y):
            h = m.tanh(p["w"] * y + p["b"])
            return (h * y[::-1]).sum() * p["b"], {"h": h}

        return run

    p = {"w": _x((3,), 3), "b": np.float32(0.4)}
    y = _x((3,), 4)
    p_nx = {k: nx.tensor(v) for k, v in p.items()}
    inner_nx = nx.jacrev(f(nx), argnums=(0, 1), has_aux=True)
    inner_j = jax.jacrev(f(jnp), argnums=(0, 1), has_aux=True)
    got, aux = nx.jacrev(inner_nx, argnums=(0, 1), has_aux=True)(p_nx, nx.tensor(y))
    want, aux_j = jax.jacrev(inner_j, argnums=(0, 1), has_aux=True)(p, y)
    g_leaves, g_def = jax.tree_util.tree_flatten(got)
    w_leaves, w_def = jax.tree_util.tree_flatten(want)
    assert g_def == w_def
    for g, w in zip(g_leaves, w_leaves):
        _close(g, w)
    _close(aux["h"], aux_j["h"])


# ---- vmap of a vjp function whose function uses vmap --------------------------------------


def _uses_vmap(m, vmap):
    """Two nested vmaps inside, over mapped arguments and closures from both levels."""

    def h(x):
        def row(a):
            return vmap(lambda b: m.tanh(a * b + x[0]) * x)(m.stack([x, x * x, -x]))

        return vmap(row)(m.stack([x, 3.0 * x]))

    return h


def test_vmapped_vjp_function_of_a_function_that_uses_vmap_matches_jax():
    # used to raise NotImplementedError ("cannot tell their batch levels apart"): the new level
    # is now kept innermost, apart from the function's own levels
    h_nx, h_j = _uses_vmap(nx, nx.vmap), _uses_vmap(jnp, jax.vmap)
    x = _x((3,))
    _, pull = nx.vjp(h_nx, nx.tensor(x))
    _, pull_j = jax.vjp(h_j, x)
    cts = _x((4, 2, 3, 3), 5)
    _close(nx.vmap(pull)(nx.tensor(cts))[0], jax.vmap(pull_j)(cts)[0])
    # a cotangent that is the same for every example (broadcast level)
    _close(
        nx.vmap(pull, in_axes=None, axis_size=2)(nx.tensor(cts[0]))[0],
        jax.vmap(pull_j, in_axes=None, axis_size=2)(cts[0])[0],
    )
    # all the Jacobians of it, and under an enclosing vmap
    for name in ("jacrev", "jacfwd"):
        _close(_NX[name](h_nx)(nx.tensor(x)), _JX[name](h_j)(x), what=name)
    s_nx, s_j = (lambda v: h_nx(v).sum()), (lambda v: h_j(v).sum())
    _close(nx.hessian(s_nx)(nx.tensor(x)), jax.hessian(s_j)(x))
    xs = _x((2, 3), 6)
    _close(nx.vmap(nx.jacrev(h_nx))(nx.tensor(xs)), jax.vmap(jax.jacrev(h_j))(xs))

    # a vjp function vmapped inside an enclosing vmap
    def nested(m, vjp, vmap, h):
        def per(x):
            _, p = vjp(h, x)
            return vmap(p)(m.ones((4, 2, 3, 3)) * x.sum())[0]

        return vmap(per)

    _close(
        nested(nx, nx.vjp, nx.vmap, h_nx)(nx.tensor(xs)),
        nested(jnp, jax.vjp, jax.vmap, h_j)(xs),
    )


def test_vjp_inside_vmap_over_a_closed_over_primal_matches_jax():
    # the primal is the same for every example, the cotangent is not, and the function pads the
    # primal to enter its own vmap: the cotangent keeps the enclosing level through the padding
    h_nx, h_j = _uses_vmap(nx, nx.vmap), _uses_vmap(jnp, jax.vmap)
    x = _x((3,))
    cts = _x((4, 2, 3, 3), 7)
    got = nx.vmap(lambda c: nx.vjp(h_nx, nx.tensor(x))[1](c)[0])(nx.tensor(cts))
    want = jax.vmap(lambda c: jax.vjp(h_j, x)[1](c)[0])(cts)
    _close(got, want)


def test_forward_mode_through_vmap_of_a_closed_over_primal_matches_jax():
    # jacfwd(vmap(f)): the tangent basis is batched, the primal is not; vmap pads the primal
    f_nx = lambda x: nx.sin(x[:2]) * x.sum()  # noqa: E731
    f_j = lambda x: jnp.sin(x[:2]) * x.sum()  # noqa: E731
    x = _x((2, 3))
    _close(nx.jacfwd(nx.vmap(f_nx))(nx.tensor(x)), jax.jacfwd(jax.vmap(f_j))(x))
    basis = np.eye(6, dtype=np.float32).reshape(6, 2, 3)
    got = nx.vmap(lambda t: nx.jvp(nx.vmap(f_nx), (nx.tensor(x),), (t,))[1])(nx.tensor(basis))
    want = jax.vmap(lambda t: jax.jvp(jax.vmap(f_j), (x,), (t,))[1])(basis)
    _close(got, want)
    _close(
        nx.hessian(nx.vmap(lambda v: f_nx(v).sum()))(nx.tensor(x)),
        jax.hessian(jax.vmap(lambda v: f_j(v).sum()))(x),
    )


# ---- jvp with has_aux --------------------------------------------------------------------


def _with_aux(m):
    def f(x, y):
        z = m.sin(x) * y
        return {"z": z, "s": z.sum()}, {"x2": x * x, "n": 3, "pair": (y, m.cos(y))}

    return f


def test_jvp_has_aux_matches_jax():
    x, y = _x((3,)), _x((3,), 1)
    tx, ty = _x((3,), 2), _x((3,), 3)
    out, t_out, aux = nx.jvp(
        _with_aux(nx), (nx.tensor(x), nx.tensor(y)), (nx.tensor(tx), nx.tensor(ty)), has_aux=True
    )
    out_j, t_j, aux_j = jax.jvp(_with_aux(jnp), (x, y), (tx, ty), has_aux=True)
    for got, want in ((out, out_j), (t_out, t_j)):
        _close(got["z"], want["z"])
        _close(got["s"], want["s"])
    _close(aux["x2"], aux_j["x2"])
    _close(aux["pair"][0], aux_j["pair"][0])
    _close(aux["pair"][1], aux_j["pair"][1])
    assert aux["n"] == 3
    # the aux is the primal value, not differentiated; has_aux=False still returns a pair
    assert len(nx.jvp(lambda v: v * 2.0, (nx.tensor(x),), (nx.tensor(tx),))) == 2


def test_jvp_has_aux_composes_with_vmap_and_grad():
    x, tx = _x((3,)), _x((4, 3), 1)

    def f(m):
        return lambda v: ((m.tanh(v) * v).sum(), m.exp(v))

    got = nx.vmap(lambda t: nx.jvp(f(nx), (nx.tensor(x),), (t,), has_aux=True)[1:])(nx.tensor(tx))
    want = jax.vmap(lambda t: jax.jvp(f(jnp), (x,), (t,), has_aux=True)[1:])(tx)
    _close(got[0], want[0])
    _close(got[1], want[1])
    # forward over reverse with aux: a Hessian-vector product and the gradient's aux
    hvp = nx.jvp(nx.grad(f(nx), has_aux=True), (nx.tensor(x),), (nx.tensor(tx[0]),), has_aux=True)
    hvp_j = jax.jvp(jax.grad(f(jnp), has_aux=True), (x,), (tx[0],), has_aux=True)
    for g, w in zip(hvp, hvp_j):
        _close(g, w)


def test_jvp_has_aux_requires_a_pair():
    with pytest.raises(TypeError, match=r"nx.jvp: with has_aux=True, .* must return a pair"):
        nx.jvp(lambda v: v * 2.0, (nx.ones(3),), (nx.ones(3),), has_aux=True)


def test_an_unreadable_result_is_refused_at_call_time():
    # the guard every transform result passes: a batch level no enclosing vmap owns is a clear
    # NotImplementedError naming the API, never a tensor that fails later when read
    from nablax.core.transforms.vjp import check_readable
    from nablax.core.transforms.vmap import incr_batch_dims

    def f():
        pass

    stray = incr_batch_dims(nx.ones((2, 3)))  # one batch level, no vmap around
    with pytest.raises(
        NotImplementedError, match=r"nx.jvp: the tangent of output 0 of .*f .*\(2,\)"
    ):
        check_readable("jvp", f, "the tangent of output 0", stray)
    inside = nx.vmap(lambda v: check_readable("vjp", f, "x", v) * 2.0)(nx.ones((2, 3)))
    _close(inside, np.full((2, 3), 2.0, np.float32))  # a level its vmap owns is fine

"""The shared programs and helpers of the control-flow tests (core/transforms/control_flow/).

Every program is written once, as ``prog(L, ...)``: ``L`` is :data:`NX` (nablax tensors,
``nx.*`` control flow and transforms) or :data:`JX` (``jax.numpy`` arrays, ``jax.lax`` control
flow, JAX transforms), so nablax runs exactly the Python functions JAX runs. Values, gradients,
JVPs and vmapped results are compared with JAX's and, for vmap, with a Python loop over examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

import nablax as nx

RTOL, ATOL = 1e-5, 1e-5


@dataclass(frozen=True)
class Lib:
    """One side of a comparison: array module, control-flow module and transforms."""

    m: Any  # nx or jnp
    cf: Any  # nx or jax.lax
    grad: Any
    vjp: Any
    jvp: Any
    vmap: Any
    checkpoint: Any

    def arr(self, a):
        return nx.tensor(a) if self.m is nx else jnp.asarray(a)


NX = Lib(nx, nx, nx.grad, nx.vjp, nx.jvp, nx.vmap, nx.checkpoint)


JX = Lib(jnp, lax, jax.grad, jax.vjp, jax.jvp, jax.vmap, jax.checkpoint)


def _r(shape, seed=0, scale=1.0):
    return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _np(x):
    return x.numpy() if isinstance(x, nx.Tensor) else np.asarray(x)


def _close(got, want, what="", rtol=RTOL, atol=ATOL):
    g_leaves, g_def = jax.tree_util.tree_flatten(got, is_leaf=lambda v: isinstance(v, nx.Tensor))
    w_leaves, w_def = jax.tree_util.tree_flatten(want)
    assert len(g_leaves) == len(w_leaves), f"{what}: {g_def} vs {w_def}"
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        g, w = _np(g), np.asarray(w)
        assert g.shape == w.shape, f"{what}[{k}]: shape {g.shape} vs {w.shape}"
        np.testing.assert_allclose(g, w, rtol, atol, err_msg=f"{what}[{k}]")


def _both(prog, *args):
    """``prog(L, *args)`` for nablax and for JAX (NumPy arguments converted by each side)."""
    got = prog(NX, *jax.tree_util.tree_map(NX.arr, args))
    want = prog(JX, *jax.tree_util.tree_map(JX.arr, args))
    return got, want


def _check(prog, *args, what="value"):
    got, want = _both(prog, *args)
    _close(got, want, what)
    return got


def _grads(prog, args, argnums, what="grad"):
    """nx.grad vs jax.grad of the scalar ``prog(L, *args)``."""
    got = nx.grad(lambda *a: prog(NX, *a), argnums=argnums)(*map(NX.arr, args))
    want = jax.grad(lambda *a: prog(JX, *a), argnums=argnums)(*map(JX.arr, args))
    _close(got, want, what)


def _prim(t):
    """The primitive name of the node producing the pending tensor ``t``."""
    assert not t.is_realized
    return t._impl.src[0].prim.name


def _has_shape(msg, shape):
    dims = [str(d) for d in shape]
    forms = {str(tuple(shape)), "(" + ",".join(dims) + ")", "[" + ",".join(dims) + "]"}
    forms.add("[" + ", ".join(dims) + "]")
    return any(f in msg for f in forms)


def _rnn(L, W, U, b, h0, xs):
    """h = tanh(h @ W + x @ U + b); loss = sum of all hidden states squared."""

    def step(h, x):
        h = L.m.tanh(h @ W + x @ U + b)
        return h, h

    h, hs = L.cf.scan(step, h0, xs)
    return (hs**2).sum() + 0.1 * h.sum()


RNN_ARGS = (_r((4, 4), 1, 0.5), _r((3, 4), 2, 0.5), _r((4,), 3), _r((2, 4), 4), _r((5, 2, 3), 5))


def _cond_prog(L, x, c):
    """cond on the sign of x.sum(); both branches close over ``c``."""

    def pos(v):
        return L.m.tanh(v * c) + c

    def neg(v):
        return v**2 * c - 1.0

    return L.cf.cond(x.sum() > 0, pos, neg, x)


def _switch_prog(L, i, x, c):
    branches = [lambda v: v * c, lambda v: L.m.sin(v) + c, lambda v: v**3 - c]
    return L.cf.switch(i, branches, x)


def _newton_sqrt(L, a):
    def cond_fun(s):
        _, err, i = s
        return L.m.logical_and(err > 1e-6, i < 100)

    def body_fun(s):
        x, _, i = s
        new = 0.5 * (x + a / x)
        return new, L.m.abs(new - x).max(), i + 1

    return L.cf.while_loop(cond_fun, body_fun, (a, a.max() + 1.0, L.arr(np.int32(0))))


def _fori_prog(L, lo, hi, x):
    def body(i, c):
        return c * 0.5 + i.astype(L.m.float32) * x

    return L.cf.fori_loop(lo, hi, body, x)


def _scan_tree_prog(L, h, a, b):
    def f(c, x):
        a_t, b_t = x[0], x[1]["b"]
        h = L.m.tanh(c["h"] * 0.9 + a_t)
        return {"h": h, "n": c["n"] + 1}, {"y": h * b_t, "z": (a_t.sum(),)}

    return L.cf.scan(f, {"h": h, "n": L.arr(np.int32(0))}, (a, {"b": b}))


def _scan_f(L, x):
    ts = L.arr(np.array([0.1, 0.2, 0.3], np.float32))
    c, ys = L.cf.scan(lambda c, t: (L.m.sin(c * x + t), c), x, ts)
    return c + ys.sum()


def _cond_f(L, x):
    return L.cf.cond(x > 0, lambda v: v**3 + v, lambda v: L.m.sin(v) * v, x)


def _jvps(prog, primals, tangents, what):
    got = nx.jvp(lambda *a: prog(NX, *a), tuple(map(NX.arr, primals)), tuple(map(NX.arr, tangents)))
    want = jax.jvp(
        lambda *a: prog(JX, *a), tuple(map(JX.arr, primals)), tuple(map(JX.arr, tangents))
    )
    _close(got, want, what)


def _vmaps(prog, args, in_axes=0, what="vmap"):
    """nx.vmap vs jax.vmap vs a Python loop of nablax calls over the examples."""
    got = nx.vmap(lambda *a: prog(NX, *a), in_axes=in_axes)(*map(NX.arr, args))
    want = jax.vmap(lambda *a: prog(JX, *a), in_axes=in_axes)(*map(JX.arr, args))
    _close(got, want, what)
    axes = in_axes if isinstance(in_axes, tuple) else (in_axes,) * len(args)
    n = next(a.shape[0] for a, ax in zip(args, axes) if ax is not None)
    per = [
        prog(NX, *(NX.arr(a[k] if ax is not None else a) for a, ax in zip(args, axes)))
        for k in range(n)
    ]
    loop = jax.tree_util.tree_map(
        lambda *v: np.stack([_np(e) for e in v]), *per, is_leaf=lambda v: isinstance(v, nx.Tensor)
    )
    _close(got, loop, what + " vs loop")
    return got


ERR = (ValueError, TypeError)

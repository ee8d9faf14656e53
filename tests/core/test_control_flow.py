"""Control flow (API.md section 9): ``nx.cond``, ``nx.switch``, ``nx.while_loop``, ``nx.fori_loop``,
``nx.scan`` and ``nx.checkpoint``, against ``jax.lax``.

Every program below is written once, as ``prog(L, ...)``: ``L`` is :data:`NX` (nablax tensors,
``nx.*`` control flow and transforms) or :data:`JX` (``jax.numpy`` arrays, ``jax.lax`` control
flow, JAX transforms), so nablax runs exactly the Python functions JAX runs. Values, gradients,
JVPs and vmapped results are compared with JAX's and, for vmap, with a Python loop over examples.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import nablax as nx
from nablax.core.graph import toposort
from nablax.errors import ConcretizationError, GraphBreakError

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


# ---- programs shared by several tests (generic over L) -----------------------------------------


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


# ---- 1. values ---------------------------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true", "false"])
def test_cond_values_pytree_operands_and_closure(sign):
    x, y, c = sign * np.abs(_r(3)), _r(3, 1), _r(3, 2)

    def prog(L, x, y, c):
        def tb(ops):
            return {"s": ops["a"] * c + ops["b"], "t": (ops["a"].sum(),)}

        def fb(ops):
            return {"s": ops["a"] - ops["b"] * c, "t": ((ops["b"] * c).sum(),)}

        return L.cf.cond(x.sum() > 0, tb, fb, {"a": x, "b": y})

    got = _check(prog, x, y, c)
    assert set(got) == {"s", "t"} and isinstance(got["t"], tuple)
    want_s = x * c + y if sign > 0 else x - y * c
    _close(got["s"], want_s, "vs numpy")
    _check(_cond_prog, x, c, what="closure")


def test_cond_accepts_python_and_numpy_operands():
    out = nx.cond(True, lambda a, k: a * k, lambda a, k: a - k, np.arange(3.0, dtype="f4"), 2.0)
    _close(out, np.arange(3.0) * 2.0)
    out = nx.cond(np.bool_(False), lambda a: a + 1, lambda a: a - 1, jnp.ones(2, jnp.float32))
    _close(out, np.zeros(2, np.float32))


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 7])
def test_switch_values_clamped_index(index):
    x, c = _r(3), _r(3, 1)
    _check(_switch_prog, np.int32(index), x, c, what=f"tensor index {index}")
    got = _switch_prog(NX, index, NX.arr(x), NX.arr(c))  # a Python int index
    _close(got, _switch_prog(JX, index, x, c), f"int index {index}")


def _newton_sqrt(L, a):
    def cond_fun(s):
        _, err, i = s
        return L.m.logical_and(err > 1e-6, i < 100)

    def body_fun(s):
        x, _, i = s
        new = 0.5 * (x + a / x)
        return new, L.m.abs(new - x).max(), i + 1

    return L.cf.while_loop(cond_fun, body_fun, (a, a.max() + 1.0, L.arr(np.int32(0))))


def test_while_loop_newton_sqrt_to_tolerance():
    a = np.array([2.0, 9.0, 0.25, 30.0], np.float32)
    got = _check(_newton_sqrt, a)
    _close(got[0], np.sqrt(a), "vs numpy sqrt")
    assert 3 < int(got[2].item()) < 100


def test_while_loop_collatz_int_loop():
    def prog(L, n0):
        def body(s):
            n, k = s
            return L.m.where(n % 2 == 0, n // 2, 3 * n + 1), k + 1

        return L.cf.while_loop(lambda s: s[0] != 1, body, (n0, L.arr(np.int32(0))))

    got = _check(prog, np.int32(27))
    assert got[1].dtype == nx.int32 and got[1].item() == 111  # 27 takes 111 steps to reach 1


def test_while_loop_python_number_init():
    out = nx.while_loop(lambda n: n < 5, lambda n: n + 1, 0)
    assert int(_np(out)) == 5 and np.issubdtype(_np(out).dtype, np.integer)


def _fori_prog(L, lo, hi, x):
    def body(i, c):
        return c * 0.5 + i.astype(L.m.float32) * x

    return L.cf.fori_loop(lo, hi, body, x)


def test_fori_loop_static_and_tensor_bounds():
    x = _r(3)
    got = _check(lambda L, x: _fori_prog(L, 1, 6, x), x, what="static bounds")
    _check(lambda L, lo, hi, x: _fori_prog(L, lo, hi, x), np.int32(1), np.int32(6), x)
    ref = x.copy()
    for i in range(1, 6):
        ref = ref * 0.5 + i * x
    _close(got, ref, "vs python loop")


def _scan_tree_prog(L, h, a, b):
    def f(c, x):
        a_t, b_t = x[0], x[1]["b"]
        h = L.m.tanh(c["h"] * 0.9 + a_t)
        return {"h": h, "n": c["n"] + 1}, {"y": h * b_t, "z": (a_t.sum(),)}

    return L.cf.scan(f, {"h": h, "n": L.arr(np.int32(0))}, (a, {"b": b}))


def test_scan_pytree_carry_xs_ys():
    h, a, b = _r(3), _r((4, 3), 1), _r(4, 2)
    (carry, ys) = _check(_scan_tree_prog, h, a, b)
    assert carry["n"].item() == 4 and ys["y"].shape == (4, 3) and ys["z"][0].shape == (4,)
    ref = h
    for t in range(4):
        ref = np.tanh(ref * 0.9 + a[t])
    _close(carry["h"], ref, "vs python loop", rtol=1e-5, atol=1e-6)


def test_scan_ys_none_reverse_length_unroll():
    xs = _r((5, 3))
    carry, ys = nx.scan(lambda c, x: (c + x, None), nx.zeros(3), nx.tensor(xs))
    assert ys is None
    _close(carry, xs.sum(0), "ys=None")

    def rev(L, xs):
        return L.cf.scan(
            lambda c, x: (c * 0.5 + x, c), L.arr(np.zeros(3, np.float32)), xs, reverse=True
        )

    _check(rev, xs, what="reverse")

    def nox(L, c0):
        return L.cf.scan(lambda c, x: (c * 1.5 - 0.25, c.sum()), c0, None, length=4)

    carry, ys = _check(nox, _r(3, 1), what="xs=None, length=4")
    assert ys.shape == (4,)

    def unrolled(L, xs):
        return L.cf.scan(
            lambda c, x: (L.m.sin(c + x), c * x), L.arr(np.ones(3, np.float32)), xs, unroll=2
        )

    _check(unrolled, xs, what="unroll=2")


# ---- 2. reverse mode: grad / vjp ---------------------------------------------------------------


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true", "false"])
def test_grad_through_cond_operands_and_closed_over_tensor(sign):
    x, c = sign * np.abs(_r(3)), _r(3, 1)
    _grads(lambda L, x, c: (_cond_prog(L, x, c) ** 2).sum(), (x, c), (0, 1))


def test_grad_through_switch():
    x, c = _r(3), _r(3, 1)
    for i in (0, 1, 2):
        prog = lambda L, x, c, i=i: (_switch_prog(L, L.arr(np.int32(i)), x, c) ** 2).sum()  # noqa: E731
        _grads(prog, (x, c), (0, 1), f"branch {i}")


def test_grad_scan_rnn_all_arguments():
    _grads(_rnn, RNN_ARGS, (0, 1, 2, 3, 4), "rnn")


def test_value_and_grad_and_vjp_scan_rnn():
    args_nx, args_jx = map(NX.arr, RNN_ARGS), map(JX.arr, RNN_ARGS)
    got = nx.value_and_grad(lambda *a: _rnn(NX, *a), argnums=(0, 4))(*args_nx)
    want = jax.value_and_grad(lambda *a: _rnn(JX, *a), argnums=(0, 4))(*args_jx)
    _close(got, want, "value_and_grad")

    def hs(L, W, xs):
        return L.cf.scan(
            lambda h, x: (L.m.tanh(h @ W + x), h * 2.0), L.arr(np.ones(4, np.float32)), xs
        )

    W, xs, ct = _r((4, 4), 1, 0.5), _r((3, 4), 2), (_r(4, 3), _r((3, 4), 4))
    out, f_vjp = nx.vjp(lambda W, xs: hs(NX, W, xs), nx.tensor(W), nx.tensor(xs))
    out_j, f_vjp_j = jax.vjp(lambda W, xs: hs(JX, W, xs), W, xs)
    _close(out, out_j, "vjp primal")
    _close(f_vjp(tuple(map(nx.tensor, ct))), f_vjp_j(tuple(map(jnp.asarray, ct))), "vjp")


def test_grad_fori_loop_static_bounds():
    _grads(lambda L, x: (_fori_prog(L, 0, 4, L.m.sin(x)) ** 2).sum(), (_r(3),), 0)


def test_checkpoint_values_grads_and_node():
    def block(L, x, w):
        return L.m.tanh(x @ w) @ w.T + x

    def prog(L, x, w):
        return (L.checkpoint(lambda x, w: block(L, x, w))(x, w) ** 2).sum()

    x, w = _r((2, 3)), _r((3, 3), 1)
    _check(prog, x, w)
    _grads(prog, (x, w), (0, 1), "checkpoint grad")
    plain = nx.grad(lambda x, w: (block(NX, x, w) ** 2).sum(), argnums=(0, 1))(
        nx.tensor(x), nx.tensor(w)
    )
    got = nx.grad(lambda x, w: prog(NX, x, w), argnums=(0, 1))(nx.tensor(x), nx.tensor(w))
    _close(got, [_np(p) for p in plain], "vs no checkpoint")
    y = nx.checkpoint(lambda x, w: block(NX, x, w))(nx.tensor(x), nx.tensor(w))
    assert _prim(y) == "checkpoint"
    assert nx.remat is nx.checkpoint


def _scan_f(L, x):
    ts = L.arr(np.array([0.1, 0.2, 0.3], np.float32))
    c, ys = L.cf.scan(lambda c, t: (L.m.sin(c * x + t), c), x, ts)
    return c + ys.sum()


def _cond_f(L, x):
    return L.cf.cond(x > 0, lambda v: v**3 + v, lambda v: L.m.sin(v) * v, x)


@pytest.mark.parametrize("f, x0", [(_scan_f, 0.7), (_cond_f, 0.8), (_cond_f, -0.6)])
def test_second_order_through_scan_and_cond(f, x0):
    got = nx.grad(nx.grad(lambda x: f(NX, x)))(nx.tensor(np.float32(x0)))
    want = jax.grad(jax.grad(lambda x: f(JX, x)))(jnp.float32(x0))
    _close(got, want, f"{f.__name__} at {x0}", rtol=1e-4)


# ---- 3. forward mode ---------------------------------------------------------------------------


def _jvps(prog, primals, tangents, what):
    got = nx.jvp(lambda *a: prog(NX, *a), tuple(map(NX.arr, primals)), tuple(map(NX.arr, tangents)))
    want = jax.jvp(
        lambda *a: prog(JX, *a), tuple(map(JX.arr, primals)), tuple(map(JX.arr, tangents))
    )
    _close(got, want, what)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true", "false"])
def test_jvp_cond(sign):
    x, c, tx, tc = sign * np.abs(_r(3)), _r(3, 1), _r(3, 2), _r(3, 3)
    _jvps(_cond_prog, (x, c), (tx, tc), "cond")


def test_jvp_scan_and_while_loop():
    tangents = tuple(_r(a.shape, 10 + k) for k, a in enumerate(RNN_ARGS))
    _jvps(_rnn, RNN_ARGS, tangents, "scan rnn")
    a = np.array([2.0, 9.0, 0.25], np.float32)
    _jvps(lambda L, a: _newton_sqrt(L, a)[0], (a,), (np.ones(3, np.float32),), "while newton")


def test_jacfwd_jacrev_of_scan():
    def f(L, x):
        return L.cf.scan(
            lambda c, t: (L.m.tanh(c * x + t), c * c), x, L.arr(np.ones((3, 2), np.float32))
        )[1]

    x = _r(2)
    _close(nx.jacfwd(lambda v: f(NX, v))(nx.tensor(x)), jax.jacfwd(lambda v: f(JX, v))(x), "jacfwd")
    _close(nx.jacrev(lambda v: f(NX, v))(nx.tensor(x)), jax.jacrev(lambda v: f(JX, v))(x), "jacrev")


# ---- 4. reverse mode through while_loop ---------------------------------------------------------


def test_reverse_mode_through_while_loop_raises_clear_error():
    a = nx.tensor(np.array([2.0, 9.0], np.float32))
    for transform in (nx.grad, nx.value_and_grad):
        with pytest.raises((ValueError, TypeError, NotImplementedError)) as info:
            transform(lambda a: _newton_sqrt(NX, a)[0].sum())(a)
        msg = str(info.value)
        assert "nx.while_loop" in msg and "fori_loop" in msg and "scan" in msg, msg
    # forward mode and plain values still work afterwards
    _close(_newton_sqrt(NX, a)[0], np.sqrt([2.0, 9.0]))


# ---- 5. vmap -----------------------------------------------------------------------------------


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


def test_vmap_cond_batched_predicate():
    X = _r((5, 3))
    X[1] = np.abs(X[1]) + 0.1
    X[2] = -np.abs(X[2]) - 0.1
    _vmaps(_cond_prog, (X, _r(3, 1)), in_axes=(0, None))


def test_vmap_switch_batched_index():
    idx = np.array([0, 2, 1, 5, -1], np.int32)
    _vmaps(_switch_prog, (idx, _r((5, 3)), _r((5, 3), 1)))


def test_vmap_while_loop_per_example_trip_counts():
    def count(L, x):
        return L.cf.while_loop(
            lambda s: s[0] <= 10.0, lambda s: (s[0] * 2.0, s[1] + 1), (x, L.arr(np.int32(0)))
        )

    x = np.array([0.1, 1.0, 3.0, 0.01, 20.0], np.float32)
    _, n = _vmaps(count, (x,))
    assert _np(n).tolist() == [7, 4, 2, 10, 0]


def test_vmap_scan_batched_xs_and_closed_over_batched_tensor():
    def rnn_h(L, h0, xs):
        return L.cf.scan(lambda h, x: (L.m.tanh(h * 0.8 + x), h.sum()), h0, xs)

    _vmaps(rnn_h, (_r((3, 4)), _r((3, 5, 4), 1)), what="batched h0 and xs")
    xs = _r((4, 3), 2)

    def closes(L, a):
        seq = L.arr(xs)  # unbatched; the body closes over the batched ``a``
        return L.cf.scan(lambda c, x: (c * a + x, c), L.arr(np.zeros(3, np.float32)), seq)

    _vmaps(closes, (np.array([0.5, -1.0, 2.0], np.float32),), what="closed-over batched a")


def test_vmap_of_grad_of_scan_loss():
    def loss(L, w, xs):
        return (
            L.cf.scan(lambda h, x: (L.m.tanh(h * w + x), h), L.arr(np.zeros(3, np.float32)), xs)[1]
            ** 2
        ).sum()

    w, XS = _r(3), _r((4, 5, 3), 1)
    got = nx.vmap(nx.grad(lambda w, xs: loss(NX, w, xs)), in_axes=(None, 0))(
        nx.tensor(w), nx.tensor(XS)
    )
    want = jax.vmap(jax.grad(lambda w, xs: loss(JX, w, xs)), in_axes=(None, 0))(w, XS)
    _close(got, want, "vmap(grad(scan))")


def test_grad_of_vmap_of_cond():
    def f(L, w, X):
        return (L.vmap(lambda x: _cond_prog(L, x, w))(X) ** 2).sum()

    X = _r((5, 3))
    X[0], X[1] = np.abs(X[0]) + 0.1, -np.abs(X[1]) - 0.1
    _grads(f, (_r(3, 1), X), (0, 1), "grad(vmap(cond))")


# ---- Python control flow on tensors keeps raising, naming nx.cond -------------------------------


def test_python_if_inside_body_and_under_vmap_names_cond():
    def body(c, x):
        if (c + x).sum() > 0:
            return c + x, c
        return c - x, c

    with pytest.raises((GraphBreakError, ConcretizationError)) as info:
        nx.scan(body, nx.ones(3), nx.tensor(_r((4, 3))))
    assert "nx.cond" in str(info.value) and "nx.where" in str(info.value), str(info.value)
    with pytest.raises(Exception) as info:
        nx.vmap(lambda x: x if x.sum() > 0 else -x)(nx.tensor(_r((4, 3))))
    assert "nx.cond" in str(info.value) and "nx.where" in str(info.value), str(info.value)


# ---- 6. compile --------------------------------------------------------------------------------


def test_compile_traces_each_branch_once():
    calls = {"pos": 0, "neg": 0}

    def pos(v, c):
        calls["pos"] += 1
        return nx.tanh(v * c) + c

    def neg(v, c):
        calls["neg"] += 1
        return v**2 * c - 1.0

    def f(x, c):
        return nx.cond(x.sum() > 0, pos, neg, x, c)

    x, c = _r(3), _r(3, 1)
    eager = f(nx.tensor(x), nx.tensor(c))
    assert calls == {"pos": 1, "neg": 1}, "eager: each branch traced once per call"
    g = nx.compile(f)
    calls.update(pos=0, neg=0)
    first = g(nx.tensor(x), nx.tensor(c))
    assert calls == {"pos": 1, "neg": 1}
    second = g(nx.tensor(-np.abs(x)), nx.tensor(c))  # other branch taken, same shapes
    assert calls == {"pos": 1, "neg": 1}
    _close(first, eager, "compiled vs eager")
    _close(first, _cond_prog(JX, x, c), "compiled vs jax")
    _close(second, _cond_prog(JX, -np.abs(x), c), "compiled other branch vs jax")


def test_compile_scan_and_its_gradient():
    calls = [0]

    def step(h, x, W):
        calls[0] += 1
        return nx.tanh(h @ W + x)

    def loss(W, xs):
        return (nx.scan(lambda h, x: (step(h, x, W), h), nx.zeros(4), xs)[0] ** 2).sum()

    def jloss(W, xs):
        return (lax.scan(lambda h, x: (jnp.tanh(h @ W + x), h), jnp.zeros(4), xs)[0] ** 2).sum()

    W, xs = _r((4, 4), 1, 0.5), _r((6, 4), 2)
    g = nx.compile(nx.value_and_grad(loss))
    _close(g(nx.tensor(W), nx.tensor(xs)), jax.value_and_grad(jloss)(W, xs), "first call")
    traced = calls[0]
    assert traced >= 1
    _close(g(nx.tensor(W * 0.5), nx.tensor(xs)), jax.value_and_grad(jloss)(W * 0.5, xs), "second")
    assert calls[0] == traced, "no retrace with the same shapes"
    _close(nx.compile(loss)(nx.tensor(W), nx.tensor(xs)), jloss(W, xs), "compile(loss)")


# ---- 7. one node per call ----------------------------------------------------------------------


def test_one_node_per_call_independent_of_length():
    def graph(T):
        xs = nx.tensor(np.ones((T, 4), np.float32))
        c, _ = nx.scan(
            lambda c, x: (nx.tanh(c * 0.5 + x), c), nx.tensor(np.zeros(4, np.float32)), xs
        )
        assert _prim(c) == "scan"
        return [n.prim.name for n in toposort([c._impl.src[0]])]

    short, long = graph(10), graph(1000)
    assert long.count("scan") == 1 and len(long) == len(short) and len(long) <= 4, long


def test_primitive_names():
    x, c = nx.tensor(_r(3)), nx.tensor(_r(3, 1))
    assert _prim(_cond_prog(NX, x, c)) == "cond"
    assert _prim(_switch_prog(NX, nx.tensor(np.int32(1)), x, c)) == "cond"
    assert _prim(_newton_sqrt(NX, nx.abs(x) + 1.0)[0]) == "while_loop"
    assert _prim(_fori_prog(NX, 0, 3, x)) == "scan"  # static bounds: scan (reverse-differentiable)
    assert _prim(_fori_prog(NX, nx.tensor(np.int32(0)), nx.tensor(np.int32(3)), x)) == "while_loop"


# ---- 8. error messages -------------------------------------------------------------------------

ERR = (ValueError, TypeError)


def test_carry_dtype_and_shape_changes_raise():
    xs = nx.tensor(_r((3, 2)))
    with pytest.raises(ERR, match=r"^nx\.scan:") as info:
        nx.scan(
            lambda c, x: ({"h": c["h"] + x, "n": c["n"] + 0.5}, None),
            {"h": nx.zeros(2), "n": nx.tensor(np.int32(0))},
            xs,
        )
    msg = str(info.value)
    assert "['n']" in msg and "int32" in msg and "float32" in msg, msg

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(
            lambda s: s["n"] < 3, lambda s: {"n": s["n"] + 1.5}, {"n": nx.tensor(np.int32(0))}
        )
    msg = str(info.value)
    assert "['n']" in msg and "int32" in msg and "float32" in msg, msg

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(
            lambda s: s["n"] < 3,
            lambda s: {"n": s["n"] + 1, "h": nx.stack([s["h"], s["h"]])},
            {"n": 0, "h": nx.zeros(3)},
        )
    msg = str(info.value)
    assert "['h']" in msg and _has_shape(msg, (3,)) and _has_shape(msg, (2, 3)), msg


def test_cond_branch_mismatches_raise():
    x = nx.tensor(_r(3))

    def same_fn(v):
        return {"out": v}

    def shape_fn(v):
        return {"out": v.sum()}

    def tree_fn(v):
        return {"out": v, "extra": v}

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, same_fn, shape_fn, x)
    msg = str(info.value)
    assert "same_fn" in msg and "shape_fn" in msg and "['out']" in msg, msg
    assert _has_shape(msg, (3,)) and _has_shape(msg, ()), msg

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, same_fn, tree_fn, x)
    assert "same_fn" in str(info.value) and "tree_fn" in str(info.value), str(info.value)

    with pytest.raises(ERR, match=r"^nx\.switch:") as info:
        nx.switch(1, [same_fn, same_fn, shape_fn], x)
    assert "shape_fn" in str(info.value) and "['out']" in str(info.value), str(info.value)

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, lambda v: v, lambda v: v.astype(nx.int32), x)
    assert "float32" in str(info.value) and "int32" in str(info.value), str(info.value)


def test_scan_and_while_argument_errors():
    with pytest.raises(ERR, match=r"^nx\.scan:") as info:
        nx.scan(lambda c, x: (c, None), nx.zeros(2), (nx.ones((5, 2)), nx.ones(4)))
    assert re.search(r"\b5\b", str(info.value)) and re.search(r"\b4\b", str(info.value)), str(
        info.value
    )
    with pytest.raises(ERR, match=r"^nx\.scan:"):
        nx.scan(lambda c, x: (c, None), nx.zeros(2), nx.ones((5, 2)), length=3)
    with pytest.raises(ERR, match=r"^nx\.scan:"):
        nx.scan(lambda c, x: (c, None), nx.zeros(2), None)  # neither xs nor length

    def cond_fun(v):
        return v > 0

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(cond_fun, lambda v: v - 1.0, nx.ones(3))
    assert "cond_fun" in str(info.value) and _has_shape(str(info.value), (3,)), str(info.value)


# ---- 9. models against JAX ---------------------------------------------------------------------


def test_rnn_forward_and_grad_against_jax_lax_scan():
    rng = np.random.default_rng(7)
    D, H, B, T = 5, 8, 3, 12
    p = {
        "W": (rng.standard_normal((H, H)) / np.sqrt(H)).astype(np.float32),
        "U": (rng.standard_normal((D, H)) / np.sqrt(D)).astype(np.float32),
        "b": (0.1 * rng.standard_normal(H)).astype(np.float32),
        "V": (rng.standard_normal((H, 2)) / np.sqrt(H)).astype(np.float32),
    }
    xs, tgt = (
        rng.standard_normal((T, B, D)).astype(np.float32),
        rng.standard_normal((T, B, 2)).astype(np.float32),
    )

    def model(L, p, xs, tgt):
        def step(h, inp):
            x, y = inp
            h = L.m.tanh(h @ p["W"] + x @ p["U"] + p["b"])
            return h, ((h @ p["V"] - y) ** 2).mean()

        _, losses = L.cf.scan(step, L.arr(np.zeros((B, H), np.float32)), (xs, tgt))
        return losses.mean()

    tree_nx = jax.tree_util.tree_map(nx.tensor, p)
    got = nx.value_and_grad(lambda p: model(NX, p, nx.tensor(xs), nx.tensor(tgt)))(tree_nx)
    want = jax.value_and_grad(lambda p: model(JX, p, xs, tgt))(p)
    _close(got, want, "rnn value_and_grad")


def test_newton_solver_vector_equation_against_jax():
    """Solve x**3 + 2 x = a element-wise by Newton's method; d x / d a by forward mode."""

    def solve(L, a):
        def body(s):
            x, _, k = s
            step = (x**3 + 2.0 * x - a) / (3.0 * x**2 + 2.0)
            return x - step, L.m.abs(step).max(), k + 1

        def keep_going(s):
            return L.m.logical_and(s[1] > 1e-6, s[2] < 50)

        return L.cf.while_loop(
            keep_going, body, (L.m.zeros_like(a), L.arr(np.float32(1.0)), L.arr(np.int32(0)))
        )[0]

    a = np.array([-3.0, 0.5, 1.0, 12.0, 40.0], np.float32)
    x = _check(solve, a)
    _close(_np(x) ** 3 + 2 * _np(x), a, "residual", rtol=1e-5, atol=1e-4)
    t = np.ones_like(a)
    _jvps(solve, (a,), (t,), "newton jvp")
    _, dx = nx.jvp(lambda a: solve(NX, a), (nx.tensor(a),), (nx.tensor(t),))
    _close(dx, 1.0 / (3 * _np(x) ** 2 + 2.0), "implicit derivative", rtol=1e-4)


# ---- 10. shard_map -----------------------------------------------------------------------------


def test_shard_map_with_scan_values_and_grad():
    mesh = nx.DeviceMesh((1,), ("dp",))
    W, U, b = (nx.tensor(a) for a in RNN_ARGS[:3])
    h0, xs = nx.tensor(RNN_ARGS[3]), nx.tensor(RNN_ARGS[4])  # xs: (T, batch, D), batch on "dp"
    xs_spec = nx.ShardingSpec(mesh, [nx.DimSpec([]), nx.DimSpec(["dp"]), nx.DimSpec([])])
    h_spec = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])

    def f(W, U, b, h0, xs):
        return _rnn(NX, W, U, b, h0, xs)

    sharded = nx.shard_map(f, mesh, in_specs={3: h_spec, 4: xs_spec})
    want = jax.value_and_grad(lambda *a: _rnn(JX, *a), argnums=(0, 1, 2, 3, 4))(*RNN_ARGS)
    _close(sharded(W, U, b, h0, xs), want[0], "value")
    _close(nx.grad(sharded, argnums=(0, 1, 2, 3, 4))(W, U, b, h0, xs), want[1], "grad")
    _close(nx.grad(f, argnums=(0, 4))(W, U, b, h0, xs), (want[1][0], want[1][4]), "unsharded")


def test_custom_vjp_inside_a_body_is_not_differentiated_silently():
    """JAX's derivative of the lowering would skip the user's bwd: a clear error instead, also
    for a custom_vjp function in a cond nested in a scan."""
    f = nx.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: (x * 2, None), lambda r, g: (g * 3,))

    def nested(x):
        step = lambda c, v: (nx.cond(v > 0, f, lambda u: u, c) + v, c)  # noqa: E731
        return nx.scan(step, x, nx.ones(2))[0]

    assert nested(nx.tensor(1.0)).item() == 7.0  # values are fine: (1 * 2 + 1) * 2 + 1
    with pytest.raises(NotImplementedError, match=r"nx.scan: differentiating through the custom"):
        nx.grad(nested)(nx.tensor(1.0))

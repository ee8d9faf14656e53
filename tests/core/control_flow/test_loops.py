"""``nx.while_loop``, ``nx.fori_loop`` and ``nx.scan`` (control_flow/loops.py): values and models
against ``jax.lax``."""

from __future__ import annotations

import jax
import numpy as np

import nablax as nx

from .programs import (
    JX,
    NX,
    _check,
    _close,
    _fori_prog,
    _jvps,
    _newton_sqrt,
    _np,
    _r,
    _scan_tree_prog,
)


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


def test_fori_loop_static_and_tensor_bounds():
    x = _r(3)
    got = _check(lambda L, x: _fori_prog(L, 1, 6, x), x, what="static bounds")
    _check(lambda L, lo, hi, x: _fori_prog(L, lo, hi, x), np.int32(1), np.int32(6), x)
    ref = x.copy()
    for i in range(1, 6):
        ref = ref * 0.5 + i * x
    _close(got, ref, "vs python loop")


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

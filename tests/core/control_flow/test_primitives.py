"""The rules of the control-flow primitives (control_flow/primitives.py) under every transform:
grad/vjp, jvp, vmap, compile, shard_map, against JAX; one node per call."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import nablax as nx
from nablax.core.graph import toposort

from .programs import (
    JX,
    NX,
    RNN_ARGS,
    _check,
    _close,
    _cond_f,
    _cond_prog,
    _fori_prog,
    _grads,
    _jvps,
    _newton_sqrt,
    _np,
    _prim,
    _r,
    _rnn,
    _scan_f,
    _switch_prog,
    _vmaps,
)


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


@pytest.mark.parametrize("f, x0", [(_scan_f, 0.7), (_cond_f, 0.8), (_cond_f, -0.6)])
def test_second_order_through_scan_and_cond(f, x0):
    got = nx.grad(nx.grad(lambda x: f(NX, x)))(nx.tensor(np.float32(x0)))
    want = jax.grad(jax.grad(lambda x: f(JX, x)))(jnp.float32(x0))
    _close(got, want, f"{f.__name__} at {x0}", rtol=1e-4)


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


def test_reverse_mode_through_while_loop_raises_clear_error():
    a = nx.tensor(np.array([2.0, 9.0], np.float32))
    for transform in (nx.grad, nx.value_and_grad):
        with pytest.raises((ValueError, TypeError, NotImplementedError)) as info:
            transform(lambda a: _newton_sqrt(NX, a)[0].sum())(a)
        msg = str(info.value)
        assert "nx.while_loop" in msg and "fori_loop" in msg and "scan" in msg, msg
    # forward mode and plain values still work afterwards
    _close(_newton_sqrt(NX, a)[0], np.sqrt([2.0, 9.0]))


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

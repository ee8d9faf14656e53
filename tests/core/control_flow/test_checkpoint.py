"""nx.checkpoint / nx.remat: gradients equal the plain function's and JAX's, and the backward
program recomputes the checkpointed layers (behind XLA optimization barriers, which stop XLA from
merging the recomputation with the forward pass). Peak memory is measured by
bench/bench_control_flow.py (process RSS), not asserted here."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core import realize as _realize

L, D, H, B = 8, 64, 256, 64


def _weights():
    rng = np.random.default_rng(0)
    ws = [(rng.standard_normal((D, H)) / 8).astype(np.float32) for _ in range(L)]
    vs = [(rng.standard_normal((H, D)) / 16).astype(np.float32) for _ in range(L)]
    return ws, vs, rng.standard_normal((B, D)).astype(np.float32)


def _layer(lib):
    return lambda h, w, v: h + lib.tanh(lib.tanh(h @ w) * 1.5) @ v


def _loss(lib, wrap):
    def loss(ws, vs, x):
        f = wrap(_layer(lib))
        h = x
        for w, v in zip(ws, vs):
            h = f(h, w, v)
        return (h**2).mean()

    return loss


@pytest.fixture
def spy(monkeypatch):
    """The jitted programs (and their arguments) the realizations ran."""
    seen: list = []
    orig = _realize._compile

    def compile_(key, consts):
        fn = orig(key, consts)

        def run(*args):
            seen.append((fn, args))
            return fn(*args)

        return run

    monkeypatch.setattr(_realize, "_compile", compile_)
    return seen


def _grads_and_barriers(spy, wrap):
    ws, vs, x = _weights()
    nx.clear_caches()  # compile afresh, so the spy sees this program
    spy.clear()
    g = nx.grad(_loss(nx, wrap), argnums=(0, 1))(
        [nx.tensor(w) for w in ws], [nx.tensor(v) for v in vs], nx.tensor(x)
    )
    got = [t.numpy() for t in g[0] + g[1]]
    barriers = sum(fn.lower(*a).as_text().count("optimization_barrier") for fn, a in spy)
    return got, barriers


def test_checkpoint_matches_jax_and_recomputes(spy):
    plain, barriers_plain = _grads_and_barriers(spy, lambda f: f)
    remat, barriers_remat = _grads_and_barriers(spy, nx.checkpoint)
    ws, vs, x = _weights()
    want = jax.grad(_loss(jnp, jax.checkpoint), argnums=(0, 1))(ws, vs, x)
    for a, b, w in zip(plain, remat, want[0] + want[1]):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(b, np.asarray(w), rtol=1e-4, atol=1e-6)
    # every layer is recomputed in the backward pass, behind its own barrier
    assert barriers_plain == 0 and barriers_remat >= L, (barriers_plain, barriers_remat)


def test_checkpoint_is_one_node_per_call_and_composes():
    f = nx.checkpoint(lambda x, w, scale: nx.sin(x @ w) * scale)
    x, w = nx.ones((2, 3)), nx.full((3, 4), 0.1)
    y = f(x, w, 2.0)  # a Python number leaf is static
    assert y._impl.src[0].prim.name == "checkpoint"
    np.testing.assert_allclose(y.numpy(), np.sin(np.full((2, 4), 0.3)) * 2, rtol=1e-6)
    xs = np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3)
    g = nx.vmap(nx.grad(lambda r: f(r[None], w, 1.0).sum()))(nx.tensor(xs))
    ref = jax.vmap(jax.grad(lambda r: jnp.sin(r[None] @ np.full((3, 4), 0.1, np.float32)).sum()))
    np.testing.assert_allclose(g.numpy(), ref(xs), rtol=1e-5, atol=1e-6)
    hess = nx.hessian(lambda v: nx.checkpoint(lambda u: (nx.sin(u) ** 2).sum())(v))
    np.testing.assert_allclose(
        hess(nx.tensor(xs[0])).numpy(),
        jax.hessian(lambda u: (jnp.sin(u) ** 2).sum())(xs[0]),
        rtol=1e-5,
        atol=1e-6,
    )
    assert nx.remat is nx.checkpoint
    with pytest.raises(TypeError, match="nx.checkpoint: expected a function"):
        nx.checkpoint(3)

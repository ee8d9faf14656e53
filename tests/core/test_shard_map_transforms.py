"""``nx.shard_map`` as one differentiable graph node, against JAX (core/transforms/shard_map.py).

Every value and derivative is compared with JAX on the unsharded ``jax.numpy`` function and with
nablax's own unsharded function, on 1-d and 2-d meshes of 8 virtual CPU devices. XLA_FLAGS must be
set before JAX starts, so when this session has fewer devices the single test
``test_on_eight_virtual_devices`` runs this file again in a fresh process that has them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

N_DEV = 8
HAVE = len(jax.devices()) >= N_DEV
needs8 = pytest.mark.skipif(not HAVE, reason="runs in the 8-device subprocess")
RTOL, ATOL = 2e-4, 2e-5


@pytest.mark.skipif(HAVE, reason="this process has the devices: the tests below run here")
def test_on_eight_virtual_devices():
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={N_DEV}")
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:xdist", "-p", "no:cacheprovider"]
    r = subprocess.run(
        [*cmd, str(Path(__file__).resolve())],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        cwd=str(Path(__file__).resolve().parents[2]),
    )
    assert r.returncode == 0, r.stdout[-8000:] + r.stderr[-4000:]
    assert " passed" in r.stdout and "failed" not in r.stdout, r.stdout[-2000:]


# ---- helpers ---------------------------------------------------------------------------------


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(got, want, what=""):
    g_leaves, w_leaves = jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)
    assert len(g_leaves) == len(w_leaves), what
    for k, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        g = g.numpy() if isinstance(g, nx.Tensor) else np.asarray(g)
        np.testing.assert_allclose(g, np.asarray(w), RTOL, ATOL, err_msg=f"{what}[{k}]")


def _mesh(kind):
    if kind == "1d":
        return nx.DeviceMesh((8,), ("dp",))
    if kind == "2d":
        return nx.DeviceMesh((2, 4), ("dp", "tp"))
    return nx.DeviceMesh((4, 2), ("dp", "tp"))


def _spec(mesh, *axes):
    return nx.ShardingSpec(mesh, [nx.DimSpec([a] if isinstance(a, str) else list(a)) for a in axes])


def _layout(s):
    return [d.axes for d in s.dims]


# f(m, x, w) for m = nx or jnp: the same program, sharded by nablax or unsharded in JAX
def _mlp(m, x, w):
    return (m.tanh(x @ w) ** 2).sum() + (x * 0.5).sum()


def _layer(m, x, w):
    return m.tanh(x @ w) * 2.0


X, W = _x((8, 16)), _x((16, 8), 1)
# (mesh, in_specs as (x axes, w axes) or None, out axes or None)
CONFIGS = [
    ("1d", ((("dp",), ()), None), None),
    ("1d", (((), ()), ((), ("dp",))), None),
    ("2d", ((("dp",), ()), ((), ("tp",))), None),
    ("2d", (((), ("tp",)), (("tp",), ())), None),  # contracted dimension split: partial sums
    ("2d", ((("dp",), ("tp",)), None), ((), ())),  # out_specs: replicated
    ("4x2", ((("dp", "tp"), ()), ((), ())), (("dp",), ("tp",))),
]
IDS = ["1d-rows", "1d-cols", "2d-rows-cols", "2d-contracted", "2d-out-replicated", "2d-two-axes"]


def _sharded(fn, cfg, scalar_out):
    kind, specs, out = cfg
    mesh = _mesh(kind)
    in_specs = {k: _spec(mesh, *axes) for k, axes in enumerate(specs) if axes is not None}
    out_specs = None
    if out is not None:
        out_specs = _spec(mesh) if scalar_out else _spec(mesh, *out)
    return mesh, nx.shard_map(lambda x, w: fn(nx, x, w), mesh, in_specs, out_specs)


# ---- values, plans, first-order derivatives --------------------------------------------------


@needs8
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_values_and_plan(cfg):
    mesh, f = _sharded(_layer, cfg, scalar_out=False)
    y = f(nx.tensor(X), nx.tensor(W))
    assert not y.is_realized  # one lazy node
    _close(y, _layer(jnp, X, W), "value")
    _close(y, _layer(nx, nx.tensor(X), nx.tensor(W)), "value vs unsharded nablax")
    kind, specs, out = cfg
    if out is not None:
        assert _layout(y.sharding) == list(out)
    elif specs == ((("dp",), ()), ((), ("tp",))):
        assert _layout(y.sharding) == [("dp",), ("tp",)]  # rows follow x, columns w
    elif specs[0] == ((), ("tp",)):
        assert _layout(y.sharding) == [(), ()]  # the split dimension was contracted
    assert nx.ShardingSpec.from_named(mesh, y.to_jax().sharding, 2) == y.sharding  # XLA made it


@needs8
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_grad_and_value_and_grad_match_jax(cfg):
    _, f = _sharded(_mlp, cfg, scalar_out=True)
    want = jax.value_and_grad(lambda x, w: _mlp(jnp, x, w), argnums=(0, 1))(X, W)
    got = nx.value_and_grad(f, argnums=(0, 1))(nx.tensor(X), nx.tensor(W))
    _close(got, want, "value_and_grad")
    _close(nx.grad(f, argnums=1)(nx.tensor(X), nx.tensor(W)), want[1][1], "grad")
    unsharded = nx.grad(lambda x, w: _mlp(nx, x, w), argnums=(0, 1))(nx.tensor(X), nx.tensor(W))
    _close(got[1], unsharded, "vs nablax unsharded")


@needs8
@pytest.mark.parametrize("cfg", CONFIGS[:4], ids=IDS[:4])
def test_gradients_are_laid_out_like_their_primals(cfg):
    mesh, f = _sharded(_mlp, cfg, scalar_out=True)
    gx, gw = nx.grad(f, argnums=(0, 1))(nx.tensor(X), nx.tensor(W))
    for g, axes in zip((gx, gw), cfg[1]):
        if axes is not None:
            assert _layout(g.sharding) == list(axes)


@needs8
@pytest.mark.parametrize("cfg", CONFIGS, ids=IDS)
def test_vjp_jvp_and_backward_match_jax(cfg):
    _, f = _sharded(_layer, cfg, scalar_out=False)
    ct, tx, tw = _x((8, 8), 2), _x(X.shape, 3), _x(W.shape, 4)
    out, f_vjp = nx.vjp(f, nx.tensor(X), nx.tensor(W))
    j_out, j_vjp = jax.vjp(lambda x, w: _layer(jnp, x, w), X, W)
    _close(out, j_out, "vjp out")
    _close(f_vjp(nx.tensor(ct)), j_vjp(ct), "vjp")
    got = nx.jvp(f, (nx.tensor(X), nx.tensor(W)), (nx.tensor(tx), nx.tensor(tw)))
    _close(got, jax.jvp(lambda x, w: _layer(jnp, x, w), (X, W), (tx, tw)), "jvp")
    x, w = nx.tensor(X).requires_grad_(), nx.tensor(W).requires_grad_()
    (f(x, w) ** 2).sum().backward()
    want = jax.grad(lambda x, w: (_layer(jnp, x, w) ** 2).sum(), argnums=(0, 1))(X, W)
    _close((x.grad, w.grad), want, "backward")


# ---- higher order, vmap, compile -------------------------------------------------------------


def _sin_sum(m, x):
    return (m.sin(x) * x).sum()


@needs8
@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_higher_order(kind):
    mesh = _mesh(kind)
    h = nx.shard_map(lambda x: _sin_sum(nx, x), mesh, in_specs=(_spec(mesh, "dp", ()),))
    jh = lambda x: _sin_sum(jnp, x)  # noqa: E731
    v = _x(X.shape, 5)
    gg = nx.grad(lambda x: (nx.grad(h)(x) ** 2).sum())(nx.tensor(X))
    _close(gg, jax.grad(lambda x: (jax.grad(jh)(x) ** 2).sum())(X), "grad(grad)")
    _close(nx.jvp(nx.grad(h), (nx.tensor(X),), (nx.tensor(v),))[1],
           jax.jvp(jax.grad(jh), (X,), (v,))[1], "jvp(grad)")  # fmt: skip
    small = nx.shard_map(lambda x: nx.sin(x) * x[::-1], mesh)
    js = lambda x: jnp.sin(x) * x[::-1]  # noqa: E731
    _close(nx.jacrev(small)(nx.tensor(X[0])), jax.jacrev(js)(X[0]), "jacrev")
    _close(nx.jacfwd(small)(nx.tensor(X[0])), jax.jacfwd(js)(X[0]), "jacfwd")
    hs = nx.shard_map(lambda x: _sin_sum(nx, x), mesh)
    _close(nx.hessian(hs)(nx.tensor(X[0])), jax.hessian(jh)(X[0]), "hessian")


XS = _x((3, 8, 16), 6)


@needs8
@pytest.mark.parametrize("kind", ["1d", "2d"])
def test_vmap_of_shard_map_and_shard_map_of_vmap(kind):
    mesh = _mesh(kind)
    rows = _spec(mesh, "dp", ())
    f = nx.shard_map(lambda x, w: _layer(nx, x, w), mesh, in_specs={0: rows})
    jf = jax.vmap(lambda x, w: _layer(jnp, x, w), in_axes=(0, None))
    got = nx.vmap(f, in_axes=(0, None))(nx.tensor(XS), nx.tensor(W))
    _close(got, jf(XS, W), "vmap(shard_map)")
    assert got.to_jax().sharding.spec[0] is None  # the batch axis is not split
    g = nx.shard_map(nx.vmap(lambda x, w: _layer(nx, x, w), in_axes=(0, None)), mesh)
    _close(g(nx.tensor(XS), nx.tensor(W)), jf(XS, W), "shard_map(vmap)")
    # f closes over a per-example tensor of the enclosing vmap
    w8 = _x((8, 16), 7)
    inner = nx.vmap(lambda x: nx.shard_map(lambda m: (m * x).sum(axis=1), mesh)(nx.tensor(w8)))
    _close(inner(nx.tensor(XS[:, 0])), XS[:, 0] @ w8.T, "vmap(shard_map) with a batched closure")


@needs8
def test_grad_and_vmap_compose():
    mesh = _mesh("2d")
    f = nx.shard_map(lambda x, w: _layer(nx, x, w), mesh, in_specs={0: _spec(mesh, "dp", ())})
    jl = lambda x, w: _layer(jnp, x, w)  # noqa: E731
    got = nx.grad(lambda w: nx.vmap(f, in_axes=(0, None))(nx.tensor(XS), w).sum())(nx.tensor(W))
    want = jax.grad(lambda w: jax.vmap(jl, in_axes=(0, None))(XS, w).sum())(W)
    _close(got, want, "grad(vmap(shard_map))")
    per = nx.vmap(nx.grad(lambda x, w: f(x, w).sum(), argnums=1), in_axes=(0, None))
    jper = jax.vmap(jax.grad(lambda x, w: jl(x, w).sum(), argnums=1), in_axes=(0, None))
    _close(per(nx.tensor(XS), nx.tensor(W)), jper(XS, W), "vmap(grad(shard_map))")


@needs8
def test_compile_records_the_node_without_a_graph_break():
    mesh = _mesh("2d")
    f = nx.shard_map(lambda x, w: _mlp(nx, x, w), mesh, in_specs=(_spec(mesh, "dp", ()), None))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a graph break would warn and run eagerly
        cf = nx.compile(f)
        cg = nx.compile(nx.value_and_grad(f, argnums=(0, 1)))
        want = jax.value_and_grad(lambda x, w: _mlp(jnp, x, w), argnums=(0, 1))(X, W)
        for _ in range(2):
            _close(cf(nx.tensor(X), nx.tensor(W)), want[0], "compile(shard_map)")
            _close(cg(nx.tensor(X), nx.tensor(W)), want, "compile(value_and_grad(shard_map))")
    for c in (cf, cg):
        info = c.cache_info()
        assert (info.traces, info.hits, info.executables) == (1, 1, 1), info


@needs8
def test_repeated_calls_do_not_recompile():
    mesh = _mesh("1d")
    rows = _spec(mesh, "dp", ())
    nx.clear_caches()
    seen = []
    for step in range(4):
        x, w = _x(X.shape, 10 + step), _x(W.shape, 20 + step)
        scale = 0.5 + step
        f = nx.shard_map(lambda x, w, s=scale: _mlp(nx, x, w) * s, mesh, in_specs={0: rows})
        v, (gx, gw) = nx.value_and_grad(f, argnums=(0, 1))(nx.tensor(x), nx.tensor(w))
        nx.realize(v, gx, gw)
        want = jax.value_and_grad(lambda x, w, s=scale: _mlp(jnp, x, w) * s, (0, 1))(x, w)
        _close((v, (gx, gw)), want, f"step {step}")
        seen.append(nx.cache_info().compiles)
    # the first program bakes its scalars in; the second takes them as arguments; no more
    assert seen[-1] == seen[1] <= 2, seen


# ---- pytrees, closures, custom rules ---------------------------------------------------------


@needs8
def test_pytree_arguments_results_and_specs():
    mesh = _mesh("2d")
    rows, cols = _spec(mesh, "dp", ()), _spec(mesh, (), "tp")

    def f(m, p, xs):
        h = m.tanh(xs[0] @ p["w"]) + p["b"]
        return {"h": h, "stats": [h.sum(), (xs[1] * 2.0)]}

    sf = nx.shard_map(
        lambda p, xs: f(nx, p, xs),
        mesh,
        in_specs={0: {"w": cols, "b": None}, 1: (rows, None)},
        out_specs={"h": rows, "stats": [None, rows]},
    )
    b, x2 = _x((8,), 8), _x((8, 4), 9)
    p = {"w": nx.tensor(W), "b": nx.tensor(b)}
    out = sf(p, (nx.tensor(X), nx.tensor(x2)))
    _close(out, f(jnp, {"w": W, "b": b}, (X, x2)), "values")
    assert _layout(out["h"].sharding) == [("dp",), ()]
    assert _layout(out["stats"][0].sharding) == []
    g = nx.grad(lambda p: sf(p, (nx.tensor(X), nx.tensor(x2)))["stats"][0])(p)
    jg = jax.grad(lambda p: f(jnp, p, (X, x2))["stats"][0])({"w": W, "b": b})
    assert set(g) == {"w", "b"}
    _close(g, jg, "grad of a dict")


@needs8
def test_closures_are_inputs_of_the_node():
    mesh = _mesh("1d")
    rows = _spec(mesh, "dp", ())
    # a traced closure: its gradient flows (not silently zero)
    gw = nx.grad(lambda w: nx.shard_map(lambda x: _mlp(nx, x, w), mesh, (rows,))(nx.tensor(X)))(
        nx.tensor(W)
    )
    _close(gw, jax.grad(lambda w: _mlp(jnp, X, w))(W), "closure grad")
    assert np.abs(gw.numpy()).sum() > 0
    # a pending closure, and outputs that are an argument or do not depend on the arguments
    pend = nx.tensor(W) * 2.0
    f = nx.shard_map(lambda x: (x, pend, x @ pend), mesh, (rows,))
    _close(f(nx.tensor(X)), (X, W * 2, X @ (W * 2)), "pass-through outputs")
    gx = nx.grad(lambda x: sum(o.sum() for o in f(x)))(nx.tensor(X))
    _close(gx, 1 + np.broadcast_to((W * 2).sum(1), X.shape), "pass-through gradient")
    # a captured tensor placed over the mesh: the plan starts from its layout
    placed = nx.tensor(W).shard(mesh, _spec(mesh, (), "dp"))
    y = nx.shard_map(lambda x: x @ placed, mesh, (_spec(mesh, (), ()),))(nx.tensor(X))
    assert _layout(y.sharding) == [(), ("dp",)]
    _close(y, X @ W, "placed closure")
    # no tensor argument at all
    _close(nx.grad(lambda x: nx.shard_map(lambda: (x * x).sum(), mesh)())(nx.tensor(X)), 2 * X)


@needs8
def test_custom_vjp_inside_uses_its_rule():
    mesh = _mesh("2d")

    @nx.custom_vjp
    def clip_grad(x):
        return x

    clip_grad.defvjp(lambda x: (x, None), lambda res, g: (nx.clip(g, -0.5, 0.5),))
    f = nx.shard_map(lambda x: (clip_grad(x) * 3.0).sum(), mesh, (_spec(mesh, "dp", "tp"),))
    _close(nx.grad(f)(nx.tensor(X)), np.full(X.shape, 0.5, np.float32), "custom bwd used")


# ---- Tensor.shard and .sharding of eager ops -------------------------------------------------


@needs8
def test_shard_inside_vmap_and_grad_is_a_lazy_constraint():
    mesh = _mesh("2d")
    xs = nx.tensor(XS)
    out = nx.vmap(lambda x: nx.exp(x).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec(["tp"])]))(xs)
    _close(out, np.exp(XS), "values")
    spec = out.to_jax().sharding.spec
    assert spec[0] is None and tuple(spec[1:]) == ("dp", "tp"), spec  # batch axis unsharded
    rows = [nx.DimSpec(["dp"]), nx.DimSpec([])]
    g = nx.grad(lambda x: (x.shard(mesh, rows) ** 3).sum())(nx.tensor(X))
    _close(g, 3 * X**2, "grad through shard")  # not cut by the placement
    assert _layout(g.sharding) == [("dp",), ()]
    placed = nx.tensor(X).shard(mesh, rows)  # realized: placed at once
    assert placed.is_realized
    assert nx.ShardingSpec.from_named(mesh, placed.to_jax().sharding, 2) == placed.sharding


EAGER_OPS = {
    "split": lambda x: nx.split(x, 2, axis=1)[1],
    "chunk": lambda x: nx.chunk(x, 4, axis=0)[0],
    "take": lambda x: nx.take(x, nx.tensor(np.array([0, 3, 5], np.int32)), axis=1),
    "scatter": lambda x: x.at[1].set(0.0),
    "elementwise": lambda x: nx.exp(x) * 2.0 + x,
    "matmul": lambda x: x @ nx.tensor(W),
    "reduction": lambda x: x.sum(axis=1),
    "reshape": lambda x: x.reshape(8, 4, 4),
    "reshape_merge": lambda x: x.reshape(-1),
    "reshape_unit_dims": lambda x: x.reshape(1, 8, 1, 16),
    "unbind": lambda x: nx.unbind(x, axis=1)[2],
    "transpose": lambda x: x.T,
}


@needs8
@pytest.mark.parametrize("name", sorted(EAGER_OPS))
@pytest.mark.parametrize("axes", [("dp", ()), ("dp", "tp"), ((), "tp")], ids=str)
def test_sharding_of_eager_ops_follows_the_plan(name, axes):
    mesh = _mesh("2d")
    spec = _spec(mesh, *axes)
    op = EAGER_OPS[name]
    y = op(nx.tensor(X).shard(mesh, spec))
    plan = nx.shard_map(op, mesh, (spec,))(nx.tensor(X)).sharding
    assert y.sharding == plan, (y.sharding, plan)  # pending: propagated like shard_map's plan
    np.testing.assert_allclose(y.numpy(), op(nx.tensor(X)).numpy(), RTOL, ATOL)
    real = y.to_jax().sharding  # realized: .sharding says where the data is (never None)
    assert y.sharding is not None and len(real.device_set) == N_DEV
    assert y.sharding == nx.ShardingSpec.from_named(mesh, real, y.ndim)

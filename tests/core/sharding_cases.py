"""Run by test_sharding.py in a fresh process with 8 virtual CPU devices (XLA_FLAGS must be set
before JAX starts). Each check raises AssertionError on failure; prints "ok <name>" per check."""

from __future__ import annotations

import numpy as np

import nablax as nx


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def data_parallel_mlp_step():
    mesh = nx.DeviceMesh((8,), ("dp",))
    w1, w2, x, y = _x((16, 32)), _x((32, 4), 1), _x((64, 16), 2), _x((64, 4), 3)

    def step(w1, w2, x, y):
        def loss(w1, w2):
            return ((nx.tanh(x @ w1) @ w2 - y) ** 2).mean()

        value, (g1, g2) = nx.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2, value

    batch = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    f = nx.shard_map(step, mesh, in_specs={2: batch, 3: batch})
    got = f(*map(nx.tensor, (w1, w2, x, y)))
    want = step(*map(nx.tensor, (w1, w2, x, y)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
    assert got[0].sharding.dims == [nx.DimSpec([]), nx.DimSpec([])], got[0].sharding  # replicated
    xs = nx.tensor(x).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    assert len(xs.to_jax().sharding.device_set) == 8


def tensor_parallel_matmul():
    mesh = nx.DeviceMesh((2, 4), ("dp", "tp"))
    a, b = _x((8, 16)), _x((16, 12), 1)
    sa = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    sb = nx.ShardingSpec(mesh, [nx.DimSpec([]), nx.DimSpec(["tp"])])
    f = nx.shard_map(lambda a, b: a @ b, mesh, in_specs=(sa, sb))
    out = f(nx.tensor(a), nx.tensor(b))
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    # inferred: rows follow a's split, columns b's
    assert out.sharding.dims == [nx.DimSpec(["dp"]), nx.DimSpec(["tp"])], out.sharding
    ew = nx.shard_map(lambda a: nx.exp(a) * 2, mesh, in_specs=(sa,))(nx.tensor(a))
    assert ew.sharding.dims == [nx.DimSpec(["dp"]), nx.DimSpec([])], ew.sharding
    red = nx.shard_map(lambda a: a.sum(axis=1), mesh, in_specs=(sa,))(nx.tensor(a))
    assert red.sharding.dims == [nx.DimSpec(["dp"])], red.sharding
    np.testing.assert_allclose(red.numpy(), a.sum(axis=1), rtol=1e-5)
    # out_specs overrides the inferred plan
    rep = nx.ShardingSpec(mesh, [nx.DimSpec([]), nx.DimSpec([])])
    out = nx.shard_map(lambda a, b: a @ b, mesh, in_specs=(sa, sb), out_specs=rep)(
        nx.tensor(a), nx.tensor(b)
    )
    assert out.sharding == rep


def errors():
    mesh = nx.DeviceMesh((2, 4), ("dp", "tp"))
    cases = [
        (lambda: nx.ones((6, 4)).shard(mesh, [nx.DimSpec(["tp"]), nx.DimSpec([])]), "divisible"),
        (lambda: nx.ShardingSpec(mesh, [nx.DimSpec(["xx"])]), "mesh axis 'xx'"),
        (lambda: nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec(["dp"])]), "used twice"),
        (lambda: nx.ones((8, 4)).shard(mesh, [nx.DimSpec(["dp"])]), "rank 2"),
        (lambda: nx.DeviceMesh((4, 4), ("a", "b")), "needs 16 devices"),
    ]
    for fn, text in cases:
        try:
            fn()
        except ValueError as e:
            assert text in str(e), (text, str(e))
        else:
            raise AssertionError(f"no error for {text}")


if __name__ == "__main__":
    assert len(nx.devices()) == 8, nx.devices()
    for check in (data_parallel_mlp_step, tensor_parallel_matmul, errors):
        check()
        print("ok", check.__name__)

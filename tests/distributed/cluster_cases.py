"""Run by test_launch_and_cluster.py under ``python -m nablax.launch --nproc 2 --devices-per-proc
2``: every rank joins the job, runs each check over a 4-device mesh that spans both processes and
saves its results to ``<out>/rank<i>.npz``; the test compares them with NumPy. Prints
``ok <name>`` per check."""

from __future__ import annotations

import sys
from pathlib import Path

import nablax as nx

nx.distributed.initialize()  # first thing: from the launcher's environment

import jax  # noqa: E402
import numpy as np  # noqa: E402

OUT = Path(sys.argv[1])
RANK = nx.distributed.process_index()
results: dict[str, np.ndarray] = {}


def data(shape, seed):
    """The same arrays on every process (and in the test)."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def cluster():
    assert nx.distributed.process_count() == 2
    assert len(nx.devices()) == 4 and len(jax.local_devices()) == 2
    assert {d.process_index for d in nx.devices()} == {0, 1}
    try:
        nx.distributed.initialize()
    except RuntimeError as e:
        assert "already joined" in str(e), e
    else:
        raise AssertionError("a second initialize() did not raise")


def jit_sum():
    """jax.jit over a global tensor built from each process's half of the rows."""
    mesh = nx.DeviceMesh((4,), ("dp",))
    x = data((8, 3), 0)
    half = x[4 * RANK : 4 * RANK + 4]
    g = nx.distributed.global_tensor(half, mesh, [["dp"], []])
    assert g.shape == (8, 3) and not g.to_jax().is_fully_addressable
    results["jit_sum"] = np.asarray(jax.jit(lambda a: a.sum())(g.to_jax()))
    np.testing.assert_array_equal(nx.distributed.to_local(g).numpy(), half)


def data_parallel_step():
    """One SGD step of an MLP; the batch is split over 4 devices of 2 processes."""
    mesh = nx.DeviceMesh((4,), ("dp",))
    w1, w2, x, y = data((6, 8), 1), data((8, 2), 2), data((16, 6), 3), data((16, 2), 4)

    def step(w1, w2, x, y):
        def loss(w1, w2):
            return ((nx.tanh(x @ w1) @ w2 - y) ** 2).mean()

        value, (g1, g2) = nx.value_and_grad(loss, argnums=(0, 1))(w1, w2)
        return w1 - 0.1 * g1, w2 - 0.1 * g2, value

    batch = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    xs = nx.tensor(x).shard(mesh, batch)  # every process holds all of x: Tensor.shard places it
    ys = nx.distributed.global_tensor(y[8 * RANK : 8 * RANK + 8], mesh, batch)  # its own half
    f = nx.shard_map(step, mesh, in_specs={2: batch, 3: batch})
    w1n, w2n, value = f(nx.tensor(w1), nx.tensor(w2), xs, ys)
    # replicated results are readable on every process
    results["dp_w1"], results["dp_w2"], results["dp_loss"] = w1n.numpy(), w2n.numpy(), value.numpy()


def tensor_parallel_matmul():
    """a @ b with b's columns split over 4 devices of 2 processes: the result is split too."""
    mesh = nx.DeviceMesh((4,), ("tp",))
    a, b = data((5, 6), 5), data((6, 8), 6)
    sb = nx.ShardingSpec(mesh, [nx.DimSpec([]), nx.DimSpec(["tp"])])
    out = nx.shard_map(lambda a, b: a @ b, mesh, in_specs={1: sb})(nx.tensor(a), nx.tensor(b))
    assert out.sharding.dims == [nx.DimSpec([]), nx.DimSpec(["tp"])], out.sharding
    assert not out.to_jax().is_fully_addressable
    results["tp_local"] = nx.distributed.to_local(out).numpy()
    results["tp_full"] = nx.distributed.gather(out).numpy()
    try:
        out.numpy()
    except Exception as e:  # what reading a value that lies partly on the other process says
        results["tp_numpy_error"] = np.array(f"{type(e).__name__}: {e}")
    else:
        raise AssertionError("out.numpy() read data of the other process")


for check in (cluster, jit_sum, data_parallel_step, tensor_parallel_matmul):
    check()
    print("ok", check.__name__, flush=True)
np.savez(OUT / f"rank{RANK}.npz", **results)

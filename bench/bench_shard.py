"""Data-parallel MLP training step on 8 virtual CPU devices: ``nx.shard_map`` against ``jax.jit``
with ``NamedSharding`` inputs, in one process.

Run from the repository root::

    python bench/bench_shard.py            # about 20 s on 2 cores
    python bench/bench_shard.py --quick

The script sets ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts. The
model is ``bench_mlp.py``'s (784-512-512-10, batch 128, softmax cross-entropy, SGD); the batch is
split over a (8,) ``dp`` mesh axis, parameters are replicated. Eight virtual devices share the
machine's cores, so this measures partitioning overhead and correctness, not a speed-up. Reported
(no target in the issue): median step time of each and the ratio, and the loss agreement.
"""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse  # noqa: E402 - XLA_FLAGS must be set before JAX is imported
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import nablax as nx  # noqa: E402
from _common import environment  # noqa: E402
from _common import fmt as _fmt  # noqa: E402
from bench_mlp import LR, init_params, jax_loss, make_batches, nx_loss  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    rounds = 4 if args.quick else 12
    t_start = time.perf_counter()
    print(environment(None), f"| {len(jax.devices())} devices", flush=True)

    mesh = nx.DeviceMesh((8,), ("dp",))
    batch_spec = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    label_spec = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"])])

    def nx_step(w1, b1, w2, b2, w3, b3, x, y):
        params = [(w1, b1), (w2, b2), (w3, b3)]
        loss, grads = nx.value_and_grad(nx_loss)(params, x, y)
        new = [p - LR * g for pair in zip(params, grads) for p, g in zip(*pair)]
        return (*new, loss)

    step = nx.shard_map(nx_step, mesh, in_specs={6: batch_spec, 7: label_spec})

    jmesh = Mesh(jax.devices()[:8], ("dp",))
    dp, rep = NamedSharding(jmesh, PartitionSpec("dp")), NamedSharding(jmesh, PartitionSpec())

    @jax.jit
    def j_step(params, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss

    p0, batches = init_params(), make_batches()
    nx_params = [nx.tensor(a) for w, b in p0 for a in (w, b)]
    nx_batches = [(nx.tensor(x), nx.tensor(y)) for x, y in batches]
    j_params = jax.device_put([(jnp.asarray(w), jnp.asarray(b)) for w, b in p0], rep)
    j_batches = [(jax.device_put(x, dp), jax.device_put(y, dp)) for x, y in batches]

    state = {"nx": [nx_params, 0], "jax": [j_params, 0]}

    def run_nx():
        s = state["nx"]
        x, y = nx_batches[s[1] % len(nx_batches)]
        s[1] += 1
        *s[0], loss = step(*s[0], x, y)
        return loss.item()

    def run_j():
        s = state["jax"]
        x, y = j_batches[s[1] % len(j_batches)]
        s[1] += 1
        s[0], loss = j_step(s[0], x, y)
        return float(loss)

    la = [run_nx() for _ in range(3)]
    lb = [run_j() for _ in range(3)]
    rel = max(abs(a - b) / abs(b) for a, b in zip(la, lb))
    times: dict = {"nablax": [], "jax.jit": []}
    for _ in range(rounds):
        for name, fn in (("nablax", run_nx), ("jax.jit", run_j)):
            t0 = time.perf_counter()
            for _ in range(5):
                fn()
            times[name].append((time.perf_counter() - t0) / 5)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print()
    print("| case | nablax | jax.jit | ratio |")
    print("|---|---:|---:|---|")
    print(
        f"| data-parallel MLP step, 8 virtual devices (ms) | {_fmt(med['nablax'])} | "
        f"{_fmt(med['jax.jit'])} | {med['nablax'] / med['jax.jit']:.2f}x jax.jit (reported) |"
    )
    print()
    print(f"- losses over 3 steps, nablax vs jax: max relative difference {rel:.1e}")
    print(f"- new w1 sharding (the inferred plan): {state['nx'][0][0].sharding}")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

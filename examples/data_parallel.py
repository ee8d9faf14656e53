"""Data-parallel training over several processes, with ``python -m nablax.launch``.

Every process runs this same script. The batch of each step is split over a mesh of every
process's devices (``nx.distributed.global_tensor`` from each process's share of the rows); the
model and the Adam state are replicated. The step is one ``nx.compile`` function: XLA's SPMD
partitioner turns the mean over the batch into a local sum plus an all-reduce, so each process
computes on its rows only and every process ends each step with the same weights::

    python -m nablax.launch --nproc 2 --devices-per-proc 2 examples/data_parallel.py
    python examples/data_parallel.py --devices 4      # one process, 4 devices: the same losses

Both print the loss of every step; they agree to float32 rounding (``tests/distributed`` checks
it). On real hosts, run one process per host instead (see ``python -m nablax.launch --help``).
"""

from __future__ import annotations

import argparse
import sys

import nablax as nx

STEPS, BATCH = 8, 64


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=None, help="one process with this many devices")
    ap.add_argument("--out", default=None, help="write the losses to this file (rank 0)")
    return ap.parse_args(argv)


def main(argv=None) -> list[float]:
    args = parse(argv)
    # first thing, before any tensor op: join the launcher's job, or set up one local process
    if args.devices is None:
        nx.distributed.initialize()
    else:
        import jax

        jax.config.update("jax_num_cpu_devices", args.devices)

    import numpy as np

    from nablax import nn, optim

    rank, n_proc = nx.process_index(), nx.process_count()
    mesh = nx.DeviceMesh((len(nx.devices()),), ("dp",))
    rng = np.random.default_rng(0)  # the same data on every process
    x_all = rng.standard_normal((STEPS, BATCH, 16)).astype(np.float32)
    y_all = (x_all[..., :4].sum(-1) > 0).astype(np.int32)

    model = nn.MLP([16, 64, 2], key=nx.random.key(0))  # the same weights on every process
    opt = optim.adam(1e-2)
    state = opt.init(model)

    @nx.compile
    def step(model, state, x, y):
        loss, grads = nx.value_and_grad(lambda m: nn.functional.cross_entropy(m(x), y))(model)
        updates, state = opt.update(grads, state, model)
        return optim.apply_updates(model, updates), state, loss

    rows = BATCH // n_proc  # this process's share of every batch
    losses = []
    for i in range(STEPS):
        mine = slice(rank * rows, (rank + 1) * rows)
        x = nx.distributed.global_tensor(x_all[i, mine], mesh, [["dp"], []])
        y = nx.distributed.global_tensor(y_all[i, mine], mesh, [["dp"]])
        model, state, loss = step(model, state, x, y)
        losses.append(loss.item())  # the loss is replicated: every process can read it
        print(f"step {i}: loss {losses[-1]:.6f}", flush=True)
    if args.out and rank == 0:
        with open(args.out, "w") as f:
            f.write("\n".join(repr(v) for v in losses))
    return losses


if __name__ == "__main__":
    main(sys.argv[1:])

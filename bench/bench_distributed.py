"""Data-parallel training across processes: one process x 4 devices against 2 processes x 2 devices.

Run from the repository root::

    python bench/bench_distributed.py              # about 2 minutes on 2 cores
    python bench/bench_distributed.py --quick      # one round of each layout (a smoke run)
    python bench/bench_distributed.py --markdown   # also: the table as markdown for the README

The same data-parallel step runs in two layouts of 4 virtual CPU devices:

- **1x4**: one process with 4 devices (``jax_num_cpu_devices=4``); the gradient all-reduce stays
  inside the process;
- **2x2**: two processes with 2 devices each, started by ``python -m nablax.launch --nproc 2
  --devices-per-proc 2``; they join with ``nx.distributed.initialize()`` and the all-reduce goes
  through the gloo collectives over TCP on 127.0.0.1.

Each layout runs as its own worker (this script with ``--worker``); the layouts take turns, in an
order that alternates every round, so load from elsewhere hits both alike. Inside a worker the
peers below take turns in blocks of steps (``bench/_common.time_blocks``); every block ends with
the whole training state computed. Rank 0 reports its clock (the all-reduce keeps the ranks in
step). Workload: MLP 256-1024-1024-10 (ReLU), softmax cross-entropy, Adam (lr 1e-3), a global
batch of 256 rows split over the 4 devices, parameters and Adam state replicated, float32.

Peers in every worker, from the same weights:

- **nx.compile**: ``nn.MLP`` + ``F.cross_entropy`` + ``optim.adam`` under ``nx.compile``, the
  batch built with ``nx.distributed.global_tensor`` from this process's rows (as
  ``examples/data_parallel.py`` does). XLA's SPMD partitioner inserts the all-reduce.
- **jax.jit**: the reference: the same model and a hand-written Adam in ``jax.jit`` on a batch
  sharded over the ``dp`` axis.
- **shard_map + pmean**: the step written per device with ``jax.shard_map``: local gradients,
  ``lax.pmean`` over ``dp``, then Adam. The collective is explicit.
- **shard_map, no collective**: the same per-device step without the ``pmean``: every device
  trains its own copy on its own rows. Its time is the step's time without the collective.
- **all-reduce alone**: ``lax.psum`` over ``dp`` of buffers shaped like the gradients (5.3 MB per
  device), nothing else.

The collective's share of a step is reported as ``1 - (no collective) / (step)``: what the
all-reduce adds, including the wait for the slowest device or process at it; and, as a lower
bound, ``(all-reduce alone) / (step)``: the transfer and summation only. With 4 virtual devices on a machine
with fewer cores, the devices share the cores: this measures the cost of the layout and of the
collectives, not a speed-up over one device. No target is set in the issue; ratios are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import nablax as nx
from _common import environment, fmt, jax_mlp_loss, load_warning, time_blocks, xla_cpu_threads

SIZES = (256, 1024, 1024, 10)
BATCH = 256  # global rows per step, split over the 4 devices
N_DEVICES = 4
N_BATCHES = 4  # distinct batches, cycled
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
BLOCK = 5  # steps per timed block
PEERS = (
    "nx.compile",
    "jax.jit",
    "shard_map + pmean",
    "shard_map, no collective",
    "all-reduce alone",
)
LAYOUTS = {"1x4": "one process, 4 devices", "2x2": "2 processes x 2 devices (nablax.launch)"}


# ---- the worker: one layout, every peer ------------------------------------------------------


def init_params(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """He-normal weights in PyTorch's ``(out, in)`` layout (``nn.Linear``'s), zero biases."""
    rng = np.random.default_rng(seed)
    return [
        ((rng.standard_normal((o, i)) * np.sqrt(2.0 / i)).astype(np.float32), np.zeros(o, "f4"))
        for i, o in zip(SIZES[:-1], SIZES[1:])
    ]


def make_batches() -> list[tuple[np.ndarray, np.ndarray]]:
    """The same ``N_BATCHES`` global batches on every process: features and integer labels."""
    rng = np.random.default_rng(1)
    out = []
    for _ in range(N_BATCHES):
        x = rng.standard_normal((BATCH, SIZES[0])).astype(np.float32)
        out.append((x, (np.abs(x[:, :10]).argmax(1)).astype(np.int32)))
    return out


jax_loss = jax_mlp_loss  # the same model and loss in JAX, weights (out, in)


def jax_adam(params, m, v, t, g):
    """``torch.optim.Adam``'s update (step ``t`` already counted) of every leaf."""
    m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
    v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
    tf = t.astype(jnp.float32)
    c1, c2 = 1 - B1**tf, 1 - B2**tf
    upd = lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v) / jnp.sqrt(c2) + EPS)
    return jax.tree.map(upd, params, m, v), m, v


def jax_step(params, m, v, t, x, y):
    t = t + 1
    loss, g = jax.value_and_grad(jax_loss)(params, x, y)
    return (*jax_adam(params, m, v, t, g), t, loss)


def pmean_body(params, m, v, t, x, y):
    """Per device: the gradient of its rows, averaged over ``dp``, then Adam."""
    t = t + 1
    loss, g = jax.value_and_grad(jax_loss)(params, x, y)
    loss, g = jax.lax.pmean((loss, g), "dp")
    return (*jax_adam(params, m, v, t, g), t, loss)


def local_body(params, m, v, t, x, y):
    """The same step with no collective: each device updates its own copy (leading axis 1)."""
    squeeze = lambda tree: jax.tree.map(lambda a: a[0], tree)
    expand = lambda tree: jax.tree.map(lambda a: a[None], tree)
    t = t + 1
    params, m, v = squeeze(params), squeeze(m), squeeze(v)
    loss, g = jax.value_and_grad(jax_loss)(params, x, y)
    return (*expand(jax_adam(params, m, v, t, g)), t, loss[None])


class Worker:
    """Every peer of one layout; ``run()`` times them and returns what rank 0 reports."""

    def __init__(self) -> None:
        from nablax import nn, optim

        self.rank, self.n_proc = nx.process_index(), nx.process_count()
        self.mesh = nx.DeviceMesh((len(nx.devices()),), ("dp",))
        jmesh = self.mesh.jax_mesh
        self.rep, self.dp = NamedSharding(jmesh, P()), NamedSharding(jmesh, P("dp"))
        p0, batches = init_params(), make_batches()
        n_dev = len(nx.devices())

        # nablax: nn + optim under nx.compile, the batch from this process's rows
        self.opt = optim.adam(LR, B1, B2, EPS)
        model = nn.MLP(list(SIZES), key=nx.random.key(0))
        model = model.replace(
            layers=tuple(
                layer.replace(weight=nx.tensor(w), bias=nx.tensor(b))
                for layer, (w, b) in zip(model.layers, p0)
            )
        )
        rows = BATCH // self.n_proc
        mine = slice(self.rank * rows, (self.rank + 1) * rows)
        self.nx_batches = [
            (
                nx.distributed.global_tensor(x[mine], self.mesh, [["dp"], []]),
                nx.distributed.global_tensor(y[mine], self.mesh, [["dp"]]),
            )
            for x, y in batches
        ]
        opt, F = self.opt, nn.functional

        def nx_step(model, state, x, y):
            loss, grads = nx.value_and_grad(lambda m: F.cross_entropy(m(x), y))(model)
            updates, state = opt.update(grads, state, model)
            return optim.apply_updates(model, updates), state, loss

        self.nx_step = nx.compile(nx_step)
        self.nx_state = [model, opt.init(model), None]

        # JAX: replicated parameters and Adam state, the batch split over dp
        params = [(self.put(w, self.rep), self.put(b, self.rep)) for w, b in p0]
        zeros_np = [(np.zeros_like(w), np.zeros_like(b)) for w, b in p0]
        zeros = [(self.put(w, self.rep), self.put(b, self.rep)) for w, b in zeros_np]
        t0 = self.put(np.zeros((), np.int32), self.rep)
        self.j_batches = [(self.put(x, self.dp), self.put(y, self.dp)) for x, y in batches]
        self.j_state = {name: [params, zeros, zeros, t0] for name in ("jit", "pmean")}
        self.j_jit = jax.jit(jax_step)
        rep_specs = (P(), P(), P(), P(), P("dp"), P("dp"))
        self.j_pmean = jax.jit(
            jax.shard_map(pmean_body, mesh=jmesh, in_specs=rep_specs, out_specs=P())
        )
        stacked = lambda tree: jax.tree.map(
            lambda a: self.put(np.broadcast_to(a, (n_dev, *a.shape)), self.dp), tree
        )
        self.j_state["local"] = [stacked(p0), stacked(zeros_np), stacked(zeros_np), t0]
        local_specs = (P("dp"), P("dp"), P("dp"), P(), P("dp"), P("dp"))
        self.j_local = jax.jit(
            jax.shard_map(
                local_body,
                mesh=jmesh,
                in_specs=local_specs,
                out_specs=(P("dp"), P("dp"), P("dp"), P(), P("dp")),
            )
        )
        self.grad_bufs = stacked(p0)  # gradient-shaped: one copy per device
        self.j_psum = jax.jit(
            jax.shard_map(
                lambda g: jax.lax.psum(g, "dp"), mesh=jmesh, in_specs=P("dp"), out_specs=P("dp")
            )
        )
        self.calls = {name: 0 for name in PEERS}

    def put(self, a: np.ndarray, sharding: NamedSharding) -> jax.Array:
        """A global array from the value every process holds (each keeps its devices' part)."""
        a = np.asarray(a)
        return jax.make_array_from_callback(a.shape, sharding, lambda idx: a[idx])

    def _batch(self, name: str, batches: list):
        i = self.calls[name]
        self.calls[name] += 1
        return batches[i % len(batches)]

    def step(self, name: str):
        """One step of peer ``name``; returns its loss (a tensor or an array, not read)."""
        if name == "nx.compile":
            s = self.nx_state
            x, y = self._batch(name, self.nx_batches)
            s[0], s[1], s[2] = self.nx_step(s[0], s[1], x, y)
            return s[2]
        if name == "all-reduce alone":
            self.grad_bufs = self.j_psum(self.grad_bufs)
            return None
        key, fn = {
            "jax.jit": ("jit", self.j_jit),
            "shard_map + pmean": ("pmean", self.j_pmean),
            "shard_map, no collective": ("local", self.j_local),
        }[name]
        s = self.j_state[key]
        x, y = self._batch(name, self.j_batches)
        *s[:], loss = fn(*s, x, y)  # the new state in place, then the loss
        return loss

    def sync(self, name: str) -> None:
        if name == "nx.compile":
            nx.block_until_ready(self.nx_state[:2])
        elif name == "all-reduce alone":
            jax.block_until_ready(self.grad_bufs)
        else:
            key = {"jax.jit": "jit", "shard_map + pmean": "pmean"}.get(name, "local")
            jax.block_until_ready(self.j_state[key])

    def run(self, rounds: int) -> dict:
        losses: dict[str, list[float]] = {}
        for name in PEERS[:3]:  # 3 untimed steps each (compiles); their losses must agree
            losses[name] = [float(np.asarray(self._loss(self.step(name)))) for _ in range(3)]
        for name in PEERS[3:]:
            self.step(name)
            self.sync(name)
        peers = {n: (lambda n=n: self.step(n), lambda n=n: self.sync(n)) for n in PEERS}
        times = time_blocks(peers, rounds, BLOCK)
        return {"times": times, "losses": losses, "xla_threads": xla_cpu_threads()}

    def _loss(self, loss):
        return loss.numpy() if isinstance(loss, nx.Tensor) else loss


def worker(args: argparse.Namespace) -> int:
    if args.devices is None:
        nx.distributed.initialize()  # from the launcher's environment
    else:
        jax.config.update("jax_num_cpu_devices", args.devices)
    w = Worker()
    out = w.run(args.rounds)
    if w.rank == 0:
        out.update(processes=w.n_proc, devices=len(nx.devices()))
        Path(args.out).write_text(json.dumps(out))
    return 0


# ---- the driver: run both layouts, in turns, and report ----------------------------------------


def run_layout(layout: str, rounds: int, timeout: float) -> dict:
    """One worker run of ``layout``; returns rank 0's results (raises with its output on failure)."""
    script = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        work = [script, "--worker", "--rounds", str(rounds), "--out", out]
        if layout == "1x4":
            cmd = [sys.executable, *work, "--devices", str(N_DEVICES)]
        else:
            launch = ["-m", "nablax.launch", "--nproc", "2", "--devices-per-proc", "2"]
            cmd = [sys.executable, *launch, "--timeout", str(timeout), *work]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout + 30)
        if p.returncode != 0:
            raise RuntimeError(
                f"bench_distributed: the {layout} worker exited with code {p.returncode}:\n"
                f"{p.stdout[-4000:]}\n{p.stderr[-4000:]}"
            )
        return json.loads(Path(out).read_text())


def report(results: dict[str, list[dict]], markdown: bool) -> list[str]:
    med = {
        lay: {n: statistics.median(t for r in runs for t in r["times"][n]) * 1e3 for n in PEERS}
        for lay, runs in results.items()
    }
    best = {
        lay: {n: min(t for r in runs for t in r["times"][n]) * 1e3 for n in PEERS}
        for lay, runs in results.items()
    }
    lines = [
        "| peer | 1x4 median (ms) | 2x2 median (ms) | 2x2 / 1x4 | 1x4 best | 2x2 best |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for n in PEERS:
        a, b = med["1x4"][n], med["2x2"][n]
        lines.append(
            f"| {n} | {fmt(a)} | {fmt(b)} | {b / a:.2f}x | "
            f"{fmt(best['1x4'][n])} | {fmt(best['2x2'][n])} |"
        )
    table = lines[:]
    notes = []
    for lay in LAYOUTS:
        m = med[lay]
        local = m["shard_map, no collective"]
        notes.append(
            f"- {lay} ({LAYOUTS[lay]}): nx.compile / jax.jit = "
            f"{m['nx.compile'] / m['jax.jit']:.2f}x. The collective's share of the step: "
            f"{1 - local / m['nx.compile']:.0%} of nx.compile's and "
            f"{1 - local / m['shard_map + pmean']:.0%} of shard_map + pmean's "
            f"(1 - no collective / step: the all-reduce and the wait for the slowest device); "
            f"the all-reduce alone is {m['all-reduce alone'] / m['nx.compile']:.0%} of "
            f"nx.compile's step"
        )
    for lay, runs in results.items():
        threads = {r["xla_threads"] for r in runs}
        notes.append(
            f"- {lay}: {runs[0]['processes']} process(es), {runs[0]['devices']} devices in all, "
            f"XLA CPU intra-op threads per process {sorted(threads)}, "
            f"{sum(len(r['times'][PEERS[0]]) for r in runs)} blocks of {BLOCK} steps per peer"
        )
    ref = results["1x4"][0]["losses"]["jax.jit"]
    worst = max(
        abs(a - b) / abs(b)
        for runs in results.values()
        for r in runs
        for name in PEERS[:3]
        for a, b in zip(r["losses"][name], ref)
    )
    notes.append(
        f"- losses of the first 3 steps, every peer with a loss in both layouts against 1x4 "
        f"jax.jit: max relative difference {worst:.1e}"
    )
    out = ["", *table, "", *notes] if markdown else [*table, "", *notes]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="one round of each layout")
    ap.add_argument("--markdown", action="store_true", help="print the table for the README")
    ap.add_argument("--rounds", type=int, default=None, help="layout rounds (default 3)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--devices", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per worker run")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args)
    t_start = time.perf_counter()
    layout_rounds = 1 if args.quick else (args.rounds or 3)
    block_rounds = 4 if args.quick else 8
    print(environment(None), flush=True)
    if warning := load_warning():
        print("warning:", warning, flush=True)
    results: dict[str, list[dict]] = {lay: [] for lay in LAYOUTS}
    for r in range(layout_rounds):
        order = list(LAYOUTS) if r % 2 == 0 else list(LAYOUTS)[::-1]
        for lay in order:
            t0 = time.perf_counter()
            results[lay].append(run_layout(lay, block_rounds, args.timeout))
            print(
                f"round {r + 1}/{layout_rounds}: {lay} worker {time.perf_counter() - t0:.1f} s",
                flush=True,
            )
    print()
    print("\n".join(report(results, args.markdown)))
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

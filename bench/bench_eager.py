"""Eager-mode overhead of nablax against NumPy, JAX (eager and ``jax.jit``) and PyTorch.

Run from the repository root::

    python bench/bench_eager.py            # about a minute on 2 cores
    python bench/bench_eager.py --quick    # fewer repetitions
    python bench/bench_eager.py --out bench/results.json

Everything runs in one process, side by side, and the script prints one markdown table. Cases:

1. A chain of 2000 elementwise ops (``x = x * 1.0001 + 0.5``, 1000 times) on a 4x4 float32
   tensor, realized at the end: per-op cost in steady state (median over repetitions, after a
   warm-up that pays any compilation). ``jax.jit`` is one call of the whole jitted chain / 2000.
   Target: nablax <= 3 us/op.
2. The same chain on 1024x1024: per-chain time. Target: nablax <= 1.2x ``jax.jit``.
3. First realization of a *new* 10-op and 2000-op graph (caches cleared, a shape never seen
   before) against the first call of a fresh ``jax.jit`` of a new Python function on the same
   computation: both pay tracing, lowering and XLA compilation. Target: nablax <= 2x.

Every number is wall-clock time with the result ready (``block_until_ready`` for JAX values).
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt

try:  # PyTorch is optional: `pip install -e ".[bench]"`
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

CHAIN_ITERS = 1000  # each iteration is 2 ops (multiply, add)
CHAIN_OPS = 2 * CHAIN_ITERS
COLUMNS = ("nablax", "numpy", "jax eager", "jax.jit", "torch")


@dataclass
class Row:
    """One table row: seconds (or us/op) per backend, and the verdict against the target."""

    case: str
    unit: str
    values: dict[str, float | None]
    ratio: str
    notes: list[str] = field(default_factory=list)


# ---- timing helpers --------------------------------------------------------------------------


def median_times(fns: dict[str, Callable[[], object]], reps: dict[str, int]) -> dict[str, float]:
    """Median wall-clock seconds of each ``fns[name]()`` over ``reps[name]`` runs.

    Each function first runs once untimed (compilation, allocator and thread-pool warm-up); then
    the backends take turns, one run each per round, so that load from other processes on a small
    machine hits every backend alike instead of skewing whichever happened to run at the time.
    """
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(max(reps.values())):
        for name, fn in fns.items():
            if r < reps[name]:
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def chain(x, n_iters: int = CHAIN_ITERS):
    """``x * 1.0001 + 0.5`` repeated: works for NumPy, JAX, PyTorch and nablax values alike."""
    for _ in range(n_iters):
        x = x * 1.0001 + 0.5
    return x


def make_fresh_jax_fn(n_iters: int) -> Callable:
    """A new Python function object each call, so ``jax.jit`` has nothing cached for it."""

    def fresh(x):
        for _ in range(n_iters):
            x = x * 1.0001 + 0.5
        return x

    return fresh


# ---- steady-state runners (one per backend) --------------------------------------------------


def runners(shape: tuple[int, ...]) -> dict[str, Callable[[], object] | None]:
    """Closures that run the whole chain once on ``shape`` and wait for the result."""
    a = np.ones(shape, np.float32)
    xn = nx.tensor(a)  # realized leaf: every repetition builds the same graph structure
    xj = jnp.asarray(a)
    jitted = jax.jit(chain)

    def run_nablax():
        chain(xn).to_jax().block_until_ready()

    def run_numpy():
        chain(a)

    def run_jax_eager():
        chain(xj).block_until_ready()

    def run_jax_jit():
        jitted(xj).block_until_ready()

    run_torch = None
    if torch is not None:
        xt = torch.from_numpy(a.copy())

        def run_torch():
            chain(xt)

    return {
        "nablax": run_nablax,
        "numpy": run_numpy,
        "jax eager": run_jax_eager,
        "jax.jit": run_jax_jit,
        "torch": run_torch,
    }


def nablax_breakdown(shape: tuple[int, ...], reps: int) -> tuple[float, float]:
    """Median graph-building time per op and realization time (cache hit) per chain, seconds."""
    xn = nx.tensor(np.ones(shape, np.float32))
    chain(xn).to_jax().block_until_ready()  # make sure the structure is compiled
    build, realize = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        y = chain(xn)
        t1 = time.perf_counter()
        y.to_jax().block_until_ready()
        t2 = time.perf_counter()
        build.append((t1 - t0) / CHAIN_OPS)
        realize.append(t2 - t1)
    return statistics.median(build), statistics.median(realize)


# ---- cases -----------------------------------------------------------------------------------


def _verdict(value: float, target: float, fmt: str) -> str:
    ok = "ok" if value <= target else "MISS"
    return fmt.format(value=value, target=target) + f" {ok}"


def case_small(reps: dict[str, int]) -> Row:
    """Case 1: 2000-op chain on 4x4, microseconds per op."""
    run = {k: f for k, f in runners((4, 4)).items() if f is not None}
    before = nx.cache_info()
    n = {k: reps["jit_calls"] if k == "jax.jit" else reps["small"] for k in run}
    secs = median_times(run, n)
    vals: dict[str, float | None] = {
        k: secs[k] / CHAIN_OPS * 1e6 if k in secs else None for k in COLUMNS
    }
    after = nx.cache_info()
    build, realize = nablax_breakdown((4, 4), reps["small"])
    notes = [
        f"nablax 4x4 steady state: graph building {build * 1e6:.2f} us/op, realization "
        f"(cache hit) {realize * 1e3:.2f} ms per {CHAIN_OPS}-op graph "
        f"({realize / CHAIN_OPS * 1e6:.2f} us/op)",
        f"nablax cache during case 1: {after.compiles - before.compiles} compile(s), "
        f"{after.hits - before.hits} hit(s)",
    ]
    ratio = _verdict(vals["nablax"], 3.0, "{value:.2f} us/op (target <= {target:g})")
    return Row(f"4x4 chain, {CHAIN_OPS} ops", "us/op", vals, ratio, notes)


def case_large(reps: dict[str, int]) -> Row:
    """Case 2: 2000-op chain on 1024x1024, milliseconds per chain."""
    run = {k: f for k, f in runners((1024, 1024)).items() if f is not None}
    n = {k: reps["large_fast"] if k in ("nablax", "jax.jit") else reps["large_slow"] for k in run}
    secs = median_times(run, n)
    vals: dict[str, float | None] = {k: secs[k] * 1e3 if k in secs else None for k in COLUMNS}
    ratio = _verdict(
        vals["nablax"] / vals["jax.jit"], 1.2, "{value:.2f}x jax.jit (target <= {target:g}x)"
    )
    return Row(f"1024x1024 chain, {CHAIN_OPS} ops", "ms/chain", vals, ratio)


_fresh_cols = itertools.count(5)  # a column count no earlier graph used: never a cache hit


def first_realization(n_iters: int, reps: int) -> tuple[float, float]:
    """Median seconds of the first realization of a new graph, for nablax and ``jax.jit``."""
    nx_times, jax_times = [], []
    for _ in range(reps):
        a = np.ones((4, next(_fresh_cols)), np.float32)
        nx.clear_caches()
        x = nx.tensor(a)
        t0 = time.perf_counter()
        chain(x, n_iters).to_jax().block_until_ready()
        nx_times.append(time.perf_counter() - t0)

        a = np.ones((4, next(_fresh_cols)), np.float32)
        xj = jnp.asarray(a)
        f = jax.jit(make_fresh_jax_fn(n_iters))
        t0 = time.perf_counter()
        f(xj).block_until_ready()
        jax_times.append(time.perf_counter() - t0)
    return statistics.median(nx_times), statistics.median(jax_times)


def case_first(n_iters: int, reps: int) -> Row:
    """Case 3: compile latency of a never-seen graph, milliseconds."""
    t_nx, t_jax = first_realization(n_iters, reps)
    vals: dict[str, float | None] = dict.fromkeys(COLUMNS)
    vals.update({"nablax": t_nx * 1e3, "jax.jit": t_jax * 1e3})
    ratio = _verdict(t_nx / t_jax, 2.0, "{value:.2f}x jax.jit (target <= {target:g}x)")
    return Row(f"first realization, new {2 * n_iters}-op graph", "ms", vals, ratio)


# ---- report ----------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    """The markdown table of all rows."""
    lines = [
        "| case | " + " | ".join(COLUMNS) + " | ratio vs target |",
        "|---|" + "---:|" * len(COLUMNS) + "---|",
    ]
    for r in rows:
        cells = " | ".join(_fmt(r.values.get(c)) for c in COLUMNS)
        lines.append(f"| {r.case} ({r.unit}) | {cells} | {r.ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every case and print the table; return 0 (targets missed are reported, not fatal)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about 20 s)")
    p.add_argument("--out", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    if args.quick:
        reps = {"small": 5, "jit_calls": 50, "large_fast": 2, "large_slow": 1}
        first = {"small": 3, "large": 1}
    else:
        reps = {"small": 20, "jit_calls": 200, "large_fast": 5, "large_slow": 3}
        first = {"small": 5, "large": 3}

    t0 = time.perf_counter()
    print(environment(torch), flush=True)
    rows = [case_small(reps)]
    print("case 1 done", flush=True)
    rows.append(case_large(reps))
    print("case 2 done", flush=True)
    rows.append(case_first(5, first["small"]))
    rows.append(case_first(CHAIN_ITERS, first["large"]))
    print()
    print(table(rows))
    print()
    for r in rows:
        for note in r.notes:
            print(f"- {note}")
    print(f"- total benchmark time {time.perf_counter() - t0:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(
                {"environment": environment(torch), "rows": [asdict(r) for r in rows]}, f, indent=2
            )
        print(f"- results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

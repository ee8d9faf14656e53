"""Per-example gradients with ``nx.vmap(nx.grad(f))`` against JAX, in one process.

Run from the repository root::

    python bench/bench_vmap.py            # under a minute on 2 cores
    python bench/bench_vmap.py --quick    # fewer repetitions (about 15 s)

Everything is float32. The loss is written for ONE example; ``vmap`` maps it over the batch while
the parameters stay shared (``in_axes=(None, 0, 0)``), giving one gradient per example. Cases:

1. Linear model ``loss(w, x, y) = (x @ w - y) ** 2`` with ``x, w`` of shape ``(512,)`` and a
   scalar ``y``; batch 256; the result has shape ``(256, 512)``.
2. MLP 784-512-512-10 (ReLU), softmax cross-entropy of one example with an int32 class label
   (picked with ``take_along_axis``), gradients w.r.t. the parameter pytree (a list of ``(W, b)``
   tuples); batch 128; the result is a pytree of per-example gradients (``W1``: (128, 784, 512)).
3. Graph-building overhead of vmapped code: a 200-op chain of cheap elementwise ops (multiply,
   add, ``tanh``, subtract) built, never realized, on an unbatched ``(16,)`` tensor and under
   ``nx.vmap`` on a ``(64, 16)`` tensor; microseconds per op. Every eager ``nx.vmap`` call runs
   the function again and batches it op by op (nablax replays nothing implicitly). The script
   checks that nothing realizes while timing (``nx.cache_info().realizations`` does not move).

Backends for cases 1 and 2:

- **nablax**: ``nx.vmap(nx.grad(loss), in_axes=(None, 0, 0))(params, x, y)``, then waiting for
  every gradient (``nx.realize`` of the whole result, then ``block_until_ready``). One call is
  timed in full: the loss runs again in Python under the vmap and grad interpreters (the
  backward pass replayed from its plan, keyed by the forward graph's structure), then the graph is
  realized (structure-keyed executable cache hit, one XLA program). A note also times
  ``nx.compile`` of the same function, which traces once and replays.
- **jax.jit(vmap(grad))**: ``jax.jit(jax.vmap(jax.grad(loss), in_axes=(None, 0, 0)))`` and
  ``jax.block_until_ready``.
- **python loop**: a Python loop over the examples calling a jitted ``jax.grad`` once per
  example (inputs pre-split per example outside the timing), then stacking the gradients.

Steady-state times are the median (and best) over repeated calls after a warm-up call that pays
compilation; the backends take turns, one call each per round (the slow loop only every few
rounds), so load from other processes hits them alike. First-call latency is that of a graph
never compiled: nablax after ``nx.clear_caches()``, a fresh ``jax.jit`` of a new Python function
(both pay tracing and XLA compilation). Also printed: the gradient agreement with JAX (max abs
difference) and ``nx.cache_info()`` after the run.
Targets: nablax <= 1.3x ``jax.jit(vmap(grad))`` (cases 1, 2); vmapped graph building <= 1.5x
unbatched graph building per op (case 3).

If a nablax case raises, its traceback is printed, the other cases still run, and the script
exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt

try:  # PyTorch is optional and not benchmarked here; imported only to name its version
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

LIN_DIM, LIN_BATCH = 512, 256
SIZES = (784, 512, 512, 10)
MLP_BATCH = 128
CHAIN_ITERS = 50  # each iteration is 4 ops (multiply, add, tanh, subtract)
CHAIN_OPS = 4 * CHAIN_ITERS
CHAIN_FEATURES, CHAIN_BATCH = 16, 64
COLUMNS = ("nablax", "jax.jit(vmap(grad))", "python loop")
FAILURES: list[str] = []  # nablax (or other) failures: printed as they happen, exit status 1


@dataclass
class Row:
    """One table row: a value per column (None: not measured) and the verdict."""

    case: str
    values: dict[str, float | None]
    ratio: str


@dataclass
class CaseResult:
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---- helpers ---------------------------------------------------------------------------------


def _attempt(what: str, fn: Callable[[], object]) -> tuple[bool, object]:
    """``(True, fn())``, or ``(False, None)`` after printing the traceback of what ``fn`` raised."""
    try:
        return True, fn()
    except Exception:
        print(f"\n!! {what} failed:", flush=True)
        traceback.print_exc(file=sys.stdout)
        sys.stdout.flush()
        FAILURES.append(what)
        return False, None


def interleaved(
    fns: dict[str, Callable[[], object]], reps: dict[str, int]
) -> tuple[dict[str, float], dict[str, float]]:
    """Median and minimum seconds of ``fns[name]()`` over ``reps[name]`` timed calls.

    The backends take turns, one call each per round; a backend with fewer repetitions than
    rounds runs in evenly spread rounds only. The result of each call is kept until its clock
    stops, so freeing it is not timed. Callers warm every function up first.
    """
    rounds = max(reps.values())
    times: dict[str, list[float]] = {name: [] for name in fns}
    for r in range(rounds):
        for name, fn in fns.items():
            n = reps[name]
            if (r * n) // rounds == ((r + 1) * n) // rounds:  # spreads n calls over the rounds
                continue
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            del out
            times[name].append(dt)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    return med, low


def _verdict(value: float, target: float, fmt: str) -> str:
    return fmt.format(value=value, target=target) + (" ok" if value <= target else " MISS")


def max_abs_diff(a, b) -> float:
    """Largest absolute difference between two pytrees of arrays with the same structure."""
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(la) == len(lb), (len(la), len(lb))
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(la, lb))


def nx_wait(tree):
    """Realize every tensor of ``tree`` (one program) and wait for the values; returns ``tree``."""
    nx.realize(tree)
    for leaf in nx.tree.leaves(tree):
        leaf.block_until_ready()
    return tree


def nx_to_numpy(tree):
    return [leaf.numpy() for leaf in nx.tree.leaves(tree)]


# ---- losses of ONE example -------------------------------------------------------------------


def linear_loss(w, x, y):
    """Squared error of a linear model on one example; the same code for nablax and JAX."""
    return (x @ w - y) ** 2


def nx_mlp_loss(params, x, y):
    """Softmax cross-entropy of the MLP on one example (``x``: (784,), ``y``: int32 scalar)."""
    h = x
    for w, b in params[:-1]:
        h = nx.relu(h @ w + b)
    w, b = params[-1]
    logp = nx.log_softmax(h @ w + b, axis=-1)
    return -nx.take_along_axis(logp, y.reshape(1), axis=0).sum()


def make_jax_mlp_loss() -> Callable:
    """A new Python function each call (a fresh ``jax.jit`` of it has nothing cached)."""

    def loss(params, x, y):
        h = x
        for w, b in params[:-1]:
            h = jax.nn.relu(h @ w + b)
        w, b = params[-1]
        logp = jax.nn.log_softmax(h @ w + b, axis=-1)
        return -jnp.take_along_axis(logp, y.reshape(1), axis=0).sum()

    return loss


def make_jax_linear_loss() -> Callable:
    """A new Python function each call (a fresh ``jax.jit`` of it has nothing cached)."""

    def loss(w, x, y):
        return (x @ w - y) ** 2

    return loss


# ---- data ------------------------------------------------------------------------------------


def linear_data(seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(LIN_DIM).astype(np.float32)
    x = rng.standard_normal((LIN_BATCH, LIN_DIM)).astype(np.float32)
    y = rng.standard_normal(LIN_BATCH).astype(np.float32)
    return w, x, y


def mlp_data(seed: int = 0):
    """He-normal weights, small random biases, float32 inputs, int32 labels in ``[0, 10)``."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        b = rng.standard_normal(fan_out) * 0.1
        params.append((w.astype(np.float32), b.astype(np.float32)))
    x = rng.standard_normal((MLP_BATCH, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], MLP_BATCH).astype(np.int32)
    return params, x, y


# ---- cases 1 and 2: per-example gradients ----------------------------------------------------


def per_example_case(
    label: str,
    nx_loss: Callable,
    make_jax_loss: Callable[[], Callable],
    params_np,
    x_np: np.ndarray,
    y_np: np.ndarray,
    reps: dict[str, int],
    first_reps: int,
) -> CaseResult:
    """Time nablax ``vmap(grad)``, ``jax.jit(vmap(grad))`` and a loop of jitted ``jax.grad``."""
    res = CaseResult()
    in_axes = (None, 0, 0)
    to_nx = lambda a: nx.tensor(a)
    p_nx = jax.tree.map(to_nx, params_np)
    x_nx, y_nx = nx.tensor(x_np), nx.tensor(y_np)
    p_j = jax.tree.map(jnp.asarray, params_np)
    x_j, y_j = jnp.asarray(x_np), jnp.asarray(y_np)
    # Per-example arrays for the loop, split once (from NumPy: slicing a jax.Array compiles).
    xs_j, ys_j = [jnp.asarray(r) for r in x_np], [jnp.asarray(r) for r in y_np]

    nx_fn = nx.vmap(nx.grad(nx_loss), in_axes=in_axes)
    jax_fn = jax.jit(jax.vmap(jax.grad(make_jax_loss()), in_axes=in_axes))
    grad_one = jax.jit(jax.grad(make_jax_loss()))

    build_s: list[float] = []
    wait_s: list[float] = []

    def run_nablax():
        t0 = time.perf_counter()
        g = nx_fn(p_nx, x_nx, y_nx)  # graph building (Python)
        t1 = time.perf_counter()
        nx_wait(g)  # realization: cache lookup, one XLA program, waiting for it
        build_s.append(t1 - t0)
        wait_s.append(time.perf_counter() - t1)
        return g

    def run_jax():
        return jax.block_until_ready(jax_fn(p_j, x_j, y_j))

    def run_loop():
        gs = [grad_one(p_j, xi, yi) for xi, yi in zip(xs_j, ys_j)]
        return jax.block_until_ready(jax.tree.map(lambda *g: jnp.stack(g), *gs))

    # Agreement (and the warm-up calls that pay compilation).
    ref = run_jax()
    ok, got = _attempt(f"nablax {label}: vmap(grad) call", run_nablax)
    if ok:
        diff = max_abs_diff(nx_to_numpy(got), ref)
        scale = max(float(np.max(np.abs(np.asarray(r)))) for r in jax.tree.leaves(ref))
        shapes = ", ".join(str(tuple(t.shape)) for t in nx.tree.leaves(got))
        res.notes.append(
            f"{label}: gradients nablax vs jax.jit(vmap(grad)): max abs diff {diff:.2e} "
            f"(largest |grad| {scale:.3g}; {'ok' if diff <= 1e-4 * max(scale, 1.0) else 'MISS'}); "
            f"shapes {shapes}"
        )
        del got
    loop_diff = max_abs_diff(run_loop(), ref)
    res.notes.append(f"{label}: python loop vs jax.jit(vmap(grad)): max abs diff {loop_diff:.2e}")
    del ref

    # First call of a never-compiled graph.
    first: dict[str, list[float]] = {"nablax": [], "jax": []}
    nx_first_ok = ok
    for _ in range(first_reps):
        if nx_first_ok:
            nx.clear_caches()
            fresh_nx = nx.vmap(nx.grad(nx_loss), in_axes=in_axes)

            def first_nx(fresh_nx=fresh_nx):
                t0 = time.perf_counter()
                nx_wait(fresh_nx(p_nx, x_nx, y_nx))
                return time.perf_counter() - t0

            nx_first_ok, t = _attempt(f"nablax {label}: first call after clear_caches", first_nx)
            if nx_first_ok:
                first["nablax"].append(t)
        fresh_j = jax.jit(jax.vmap(jax.grad(make_jax_loss()), in_axes=in_axes))
        t0 = time.perf_counter()
        jax.block_until_ready(fresh_j(p_j, x_j, y_j))
        first["jax"].append(time.perf_counter() - t0)

    # Steady state, interleaved.
    fns: dict[str, Callable[[], object]] = {}
    if ok:
        nx_ok, _ = _attempt(f"nablax {label}: warm-up call", run_nablax)  # recompile after clear
        if nx_ok:
            fns["nablax"] = run_nablax
    fns["jax.jit(vmap(grad))"] = run_jax
    fns["python loop"] = run_loop
    before = nx.cache_info()
    build_s.clear()
    wait_s.clear()
    med, low = interleaved(
        fns, {k: reps["loop"] if k == "python loop" else reps["fast"] for k in fns}
    )
    after = nx.cache_info()

    ms = {k: (med[k] * 1e3 if k in med else None) for k in COLUMNS}
    best = {k: (low[k] * 1e3 if k in low else None) for k in COLUMNS}
    jit_col = "jax.jit(vmap(grad))"
    if ms["nablax"] is not None:
        ratio = (
            _verdict(
                ms["nablax"] / ms[jit_col], 1.3, "{value:.2f}x jax.jit (target <= {target:g}x)"
            )
            + f"; {ms['nablax'] / ms['python loop']:.2f}x loop"
        )
        best_ratio = (
            f"{best['nablax'] / best[jit_col]:.2f}x jax.jit; "
            f"{best['nablax'] / best['python loop']:.2f}x loop"
        )
        res.notes.append(
            f"{label}: nablax call split (median): graph building "
            f"{statistics.median(build_s) * 1e3:.3g} ms (the loss run under vmap and grad, the "
            f"backward pass replayed from its plan), realizing and waiting "
            f"{statistics.median(wait_s) * 1e3:.3g} ms; "
            f"jax.jit(vmap(grad)) call {ms[jit_col]:.3g} ms"
        )
        res.notes.append(
            f"{label}: nablax during steady-state timing: {after.compiles - before.compiles} "
            f"compile(s), {after.hits - before.hits} cache hit(s), "
            f"{after.realizations - before.realizations} realization(s) for "
            f"{reps['fast']} timed calls"
        )
    else:
        ratio = best_ratio = "nablax FAILED"
    res.rows.append(Row(f"{label}, median (ms)", ms, ratio))
    res.rows.append(Row(f"{label}, best (ms)", best, best_ratio))

    fvals: dict[str, float | None] = dict.fromkeys(COLUMNS)
    fvals[jit_col] = statistics.median(first["jax"]) * 1e3
    if first["nablax"]:
        fvals["nablax"] = statistics.median(first["nablax"]) * 1e3
        fratio = f"{fvals['nablax'] / fvals[jit_col]:.2f}x jax.jit"
    else:
        fratio = "nablax FAILED"
    res.rows.append(Row(f"{label}, first call, new graph (ms)", fvals, fratio))

    # The same per-example gradients under nx.compile (issue 5): no graph building per call.
    compiled = nx.compile(nx.vmap(nx.grad(nx_loss), in_axes=in_axes))
    ok_c, _ = _attempt(
        f"nablax {label}: compiled call", lambda: nx_wait(compiled(p_nx, x_nx, y_nx))
    )
    if ok_c:
        cmed, _ = interleaved(
            {"compiled": lambda: nx_wait(compiled(p_nx, x_nx, y_nx)), "jax": run_jax},
            {"compiled": reps["fast"], "jax": reps["fast"]},
        )
        res.notes.append(
            f"{label}: nx.compile(nx.vmap(nx.grad(loss))) median {cmed['compiled'] * 1e3:.3g} ms "
            f"= {cmed['compiled'] / cmed['jax']:.2f}x jax.jit(vmap(grad)) in the same rounds"
        )
    return res


# ---- case 3: graph-building overhead under vmap ----------------------------------------------


def chain(y):
    """``CHAIN_OPS`` cheap elementwise ops."""
    for _ in range(CHAIN_ITERS):
        y = y * 1.0001 + 0.5
        y = nx.tanh(y)
        y = y - 0.25
    return y


def graph_building_case(reps: int) -> CaseResult:
    """Microseconds per op of building (never realizing) the chain, unbatched and vmapped."""
    res = CaseResult()
    rng = np.random.default_rng(2)
    x = nx.tensor(rng.standard_normal(CHAIN_FEATURES).astype(np.float32))
    xb = nx.tensor(rng.standard_normal((CHAIN_BATCH, CHAIN_FEATURES)).astype(np.float32))
    vchain = nx.vmap(chain)
    fns = {"unbatched": lambda: chain(x), "vmap": lambda: vchain(xb)}
    for name, fn in fns.items():  # warm-up; shapes checked once
        ok, out = _attempt(f"nablax graph building ({name})", fn)
        if not ok:
            fns = {}
            break
        want = (CHAIN_BATCH, CHAIN_FEATURES) if name != "unbatched" else (CHAIN_FEATURES,)
        if tuple(out.shape) != want:
            print(f"\n!! nablax graph building ({name}): shape {out.shape}, expected {want}")
            FAILURES.append(f"nablax graph building ({name}): wrong shape")
        del out
    label = f"graph building, {CHAIN_OPS}-op chain"
    if not fns:
        vals = dict.fromkeys(COLUMNS)
        res.rows.append(Row(f"{label}, unbatched ({CHAIN_FEATURES},) (µs/op)", vals, "FAILED"))
        res.rows.append(
            Row(f"{label}, vmap ({CHAIN_BATCH}, {CHAIN_FEATURES}) (µs/op)", vals, "FAILED")
        )
        return res

    before = nx.cache_info()
    ok, timed = _attempt(
        "nablax graph building (timed)", lambda: interleaved(fns, dict.fromkeys(fns, reps))
    )
    after = nx.cache_info()
    if not ok:
        return res
    med, low = timed
    us = {k: v / CHAIN_OPS * 1e6 for k, v in med.items()}
    us_best = {k: v / CHAIN_OPS * 1e6 for k, v in low.items()}
    realized = after.realizations - before.realizations
    un = dict.fromkeys(COLUMNS)
    un["nablax"] = us["unbatched"]
    vm = dict.fromkeys(COLUMNS)
    vm["nablax"] = us["vmap"]
    res.rows.append(Row(f"{label}, unbatched ({CHAIN_FEATURES},) (µs/op)", un, "baseline (median)"))
    res.rows.append(
        Row(
            f"{label}, vmap ({CHAIN_BATCH}, {CHAIN_FEATURES}) (µs/op)",
            vm,
            _verdict(
                us["vmap"] / us["unbatched"],
                1.5,
                "{value:.2f}x unbatched (target <= {target:g}x)",
            ),
        )
    )
    res.notes.append(
        f"graph building: best {us_best['unbatched']:.2f} µs/op unbatched, "
        f"{us_best['vmap']:.2f} µs/op under vmap ({us_best['vmap'] / us_best['unbatched']:.2f}x); "
        f"realizations while timing: {realized} "
        f"({'ok, nothing realized' if realized == 0 else 'MISS: building realized something'})"
    )
    return res


# ---- report ----------------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    lines = [
        "| case | " + " | ".join(COLUMNS) + " | ratio |",
        "|---|" + "---:|" * len(COLUMNS) + "---|",
    ]
    for r in rows:
        cells = " | ".join(_fmt(r.values.get(c)) for c in COLUMNS)
        lines.append(f"| {r.case} | {cells} | {r.ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run every case and print the table; 0, or 1 if a case raised (missed targets are not)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions (about 15 s)")
    args = p.parse_args(argv)
    if args.quick:
        lin_reps, mlp_reps = {"fast": 30, "loop": 5}, {"fast": 5, "loop": 2}
        chain_reps, first_reps = 30, 1
    else:
        lin_reps, mlp_reps = {"fast": 200, "loop": 20}, {"fast": 20, "loop": 5}
        chain_reps, first_reps = 200, 3

    t_start = time.perf_counter()
    print(environment(torch), flush=True)
    print(
        f"per-example gradients, float32: linear {LIN_DIM} batch {LIN_BATCH}; MLP "
        f"{'-'.join(map(str, SIZES))} batch {MLP_BATCH}; timed calls: linear "
        f"{lin_reps['fast']} (loop {lin_reps['loop']}), MLP {mlp_reps['fast']} "
        f"(loop {mlp_reps['loop']}), graph building {chain_reps}; first call x{first_reps}",
        flush=True,
    )

    cases: list[tuple[str, Callable[[], CaseResult]]] = [
        (
            "case 1 (linear)",
            lambda: per_example_case(
                f"linear {LIN_DIM}, batch {LIN_BATCH}",
                linear_loss,
                make_jax_linear_loss,
                *linear_data(),
                lin_reps,
                first_reps,
            ),
        ),
        (
            "case 2 (MLP)",
            lambda: per_example_case(
                f"MLP {'-'.join(map(str, SIZES))}, batch {MLP_BATCH}",
                nx_mlp_loss,
                make_jax_mlp_loss,
                *mlp_data(),
                mlp_reps,
                first_reps,
            ),
        ),
        ("case 3 (graph building)", lambda: graph_building_case(chain_reps)),
    ]
    rows: list[Row] = []
    notes: list[str] = []
    for name, run in cases:
        t0 = time.perf_counter()
        ok, res = _attempt(name, run)
        if ok:
            rows.extend(res.rows)
            notes.extend(res.notes)
        print(f"{name} done ({time.perf_counter() - t0:.1f} s)", flush=True)

    print()
    print(table(rows))
    print()
    for note in notes:
        print(f"- {note}")
    print(
        f"- nx.cache_info() after the run: {nx.cache_info()} (counters restart at each "
        "nx.clear_caches(); the first-call measurements call it)"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(
            f"- warning: load average {load:.1f} on {os.cpu_count()} cores: other processes "
            "compete for the CPU; medians are noisy"
        )
    if FAILURES:
        print(f"- FAILED ({len(FAILURES)}): " + "; ".join(FAILURES) + " (tracebacks above)")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())

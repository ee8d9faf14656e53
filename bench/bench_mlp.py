"""MLP training step: plain eager nablax against ``jax.jit`` and PyTorch eager, in one process.

Run from the repository root::

    python bench/bench_mlp.py              # about 30 s on 2 cores
    python bench/bench_mlp.py --quick      # fewer steps
    python bench/bench_mlp.py --profile    # also: nablax step split, cProfile of the step

The model is an MLP 784-512-512-10 (ReLU), batch 128, float32, softmax cross-entropy (mean over
the batch, integer class labels picked with ``take_along_axis``), plain SGD with ``lr = 0.01``;
parameters are a pytree (a list of ``(W, b)`` tuples). All backends start from the same parameters
and cycle through the same few batches.

- **nablax** is written as ordinary eager code, no ``compile``::

      loss, grads = nx.value_and_grad(loss_fn)(params, x, y)
      params = nx.tree.map(lambda p, g: p - lr * g, params, grads)
      loss.item()   # realizes the step: loss and the new params, one cached program

- **jax.jit** jits a step function doing ``jax.value_and_grad`` and the same update.
- **torch** (if installed) runs the same model eagerly: ``loss.backward()``, SGD under
  ``no_grad``, on 2 threads.

Every backend reads the loss to the host at the end of each step (``float(loss)``, which waits
for the loss), as a training loop that logs its loss does. Reading the loss does not wait for the
parameter update: nablax runs the loss's part of the step as one program and dispatches the rest
(backward pass and update) as a second, asynchronous one, so Python builds the next step's graph
while it runs; ``jax.jit`` likewise returns the new parameters as futures. To charge that
asynchronous work to the backend that caused it, steps are timed in blocks of 10 that end by
waiting for every parameter. Reported: the median steady-state step time (nablax and ``jax.jit``
take turns, one block each per round, so load from other processes hits both alike; PyTorch is
timed on its own afterwards, because its OpenMP workers busy-wait after each op and slow down
whichever backend runs next: interleaved, they doubled nablax's step time on 2 cores), the
first-step latency of a fresh graph / fresh ``jax.jit`` (both pay tracing and XLA compilation),
the nablax step split into graph building (Python, until realization starts) and realization
(cache lookup, dispatch, waiting for the loss), the loss agreement of nablax and JAX after 5
steps, and ``nx.cache_info()`` after the run.
Targets: nablax step <= 1.5x ``jax.jit``; nablax faster than PyTorch eager.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

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

SIZES = (784, 512, 512, 10)
BATCH = 128
LR = 0.01
N_BATCHES = 4  # distinct batches, cycled
AGREE_STEPS = 5
BLOCK = 10  # steps per timed block (see steady_state)
COLUMNS = ("nablax", "jax.jit", "torch")


# ---- data and parameters (NumPy, shared by every backend) ------------------------------------


def init_params(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """He-normal weights, zero biases, float32."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params.append((w.astype(np.float32), np.zeros(fan_out, np.float32)))
    return params


def make_batches(seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """``N_BATCHES`` batches of float32 inputs and int32 class labels in ``[0, 10)``."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((BATCH, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], BATCH).astype(np.int32),
        )
        for _ in range(N_BATCHES)
    ]


# ---- nablax: plain eager code ----------------------------------------------------------------


def nx_loss(params, x, y):
    """Mean softmax cross-entropy of the MLP on ``(x, y)``."""
    h = x
    for w, b in params[:-1]:
        h = nx.relu(h @ w + b)
    w, b = params[-1]
    logp = nx.log_softmax(h @ w + b, axis=-1)
    return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))


_nx_value_and_grad = nx.value_and_grad(nx_loss)


def nx_build_step(params, x, y):
    """One SGD step as lazy tensors: ``(loss, new_params)``; nothing runs yet."""
    loss, grads = _nx_value_and_grad(params, x, y)
    return loss, nx.tree.map(lambda p, g: p - LR * g, params, grads)


class NablaxRunner:
    """Eager nablax training state; ``step()`` runs one realized step and returns the loss."""

    def __init__(self, params_np, batches_np):
        self.params = [(nx.tensor(w), nx.tensor(b)) for w, b in params_np]
        self.batches = [(nx.tensor(x), nx.tensor(y)) for x, y in batches_np]
        self.i = 0
        self.build_s: list[float] = []
        self.realize_s: list[float] = []

    def step(self) -> float:
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        t0 = time.perf_counter()
        loss, self.params = nx_build_step(self.params, x, y)
        t1 = time.perf_counter()
        value = loss.item()  # one program: the loss and the (connected, live) new params
        t2 = time.perf_counter()
        self.build_s.append(t1 - t0)
        self.realize_s.append(t2 - t1)
        return value

    def sync(self) -> None:
        """Wait until every parameter is computed."""
        for p in nx.tree.leaves(self.params):
            p.block_until_ready()


# ---- JAX: jax.jit of the whole step ----------------------------------------------------------


def jax_loss(params, x, y):
    """The same loss as :func:`nx_loss`, in JAX."""
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    logp = jax.nn.log_softmax(h @ w + b, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def make_jax_step() -> Callable:
    """A new jitted step function (a fresh Python function, so nothing is cached for it)."""

    def step(params, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        return loss, jax.tree.map(lambda p, g: p - LR * g, params, grads)

    return jax.jit(step)


class JaxRunner:
    def __init__(self, params_np, batches_np, step_fn: Callable | None = None):
        self.params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params_np]
        self.batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in batches_np]
        self.fn = step_fn or make_jax_step()
        self.i = 0

    def step(self) -> float:
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        loss, self.params = self.fn(self.params, x, y)
        return float(loss)

    def sync(self) -> None:
        jax.block_until_ready(self.params)


# ---- PyTorch eager ---------------------------------------------------------------------------


class TorchRunner:
    def __init__(self, params_np, batches_np):
        self.params = [
            (
                torch.from_numpy(w.copy()).requires_grad_(),
                torch.from_numpy(b.copy()).requires_grad_(),
            )
            for w, b in params_np
        ]
        self.batches = [
            (torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64)))
            for x, y in batches_np
        ]
        self.i = 0

    def step(self) -> float:
        F = torch.nn.functional
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        h = x
        for w, b in self.params[:-1]:
            h = F.relu(h @ w + b)
        w, b = self.params[-1]
        logp = F.log_softmax(h @ w + b, dim=-1)
        loss = -logp.gather(1, y[:, None]).mean()
        loss.backward()
        with torch.no_grad():
            for w, b in self.params:
                w -= LR * w.grad
                b -= LR * b.grad
                w.grad = None
                b.grad = None
        return float(loss.detach())

    def sync(self) -> None:
        """PyTorch eager is synchronous on the CPU: nothing left to wait for."""


# ---- measurements ----------------------------------------------------------------------------


def agreement() -> tuple[list[float], list[float], float]:
    """Losses of ``AGREE_STEPS`` steps of nablax and JAX from identical parameters and data,
    and their largest relative difference."""
    params, batches = init_params(), make_batches()
    a, b = NablaxRunner(params, batches), JaxRunner(params, batches)
    la = [a.step() for _ in range(AGREE_STEPS)]
    lb = [b.step() for _ in range(AGREE_STEPS)]
    rel = max(abs(p - q) / max(abs(q), 1e-12) for p, q in zip(la, lb))
    return la, lb, rel


def first_step(reps: int) -> tuple[float, float]:
    """Median seconds of the first step of a never-compiled graph: nablax with its caches
    cleared, and a fresh ``jax.jit``. Both include tracing, lowering and XLA compilation."""
    params, batches = init_params(), make_batches()
    nx_times, jax_times = [], []
    for _ in range(reps):
        nx.clear_caches()
        r = NablaxRunner(params, batches)
        t0 = time.perf_counter()
        r.step()
        nx_times.append(time.perf_counter() - t0)

        j = JaxRunner(params, batches)
        t0 = time.perf_counter()
        j.step()
        jax_times.append(time.perf_counter() - t0)
    return statistics.median(nx_times), statistics.median(jax_times)


def steady_state(
    runners: dict[str, object], steps: int, warmup: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median and minimum seconds per step of each runner.

    Steps are timed in blocks of ``BLOCK`` consecutive steps that end with ``sync()`` (every
    parameter computed), so work a backend leaves running asynchronously after reading its loss
    is charged to it, not to the backend timed next. The runners take turns, one block each per
    round, so load from other processes hits every backend alike.
    """
    for r in runners.values():
        for _ in range(warmup):
            r.step()
        r.sync()
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(max(1, steps // BLOCK)):
        for name, r in runners.items():
            t0 = time.perf_counter()
            for _ in range(BLOCK):
                r.step()
            r.sync()
            times[name].append((time.perf_counter() - t0) / BLOCK)
    med = {k: statistics.median(v) for k, v in times.items()}
    low = {k: min(v) for k, v in times.items()}
    return med, low


def program_split(steps: int) -> tuple[float, float, float] | None:
    """Median ms per step of graph building, realization, and the XLA programs inside it.

    Times the cached executables by wrapping ``nablax.core.realize._compile`` (a private hook,
    for this diagnosis only; ``None`` if it is not there). The wrapper waits for each program's
    results, so nothing overlaps here: "programs" is their run time per step (the loss's program
    plus the asynchronous rest), and realization minus programs is nablax's own work: structure
    keys, cache lookups, dispatch, storing the results, copying the loss to the host.
    """
    try:
        from nablax.core import realize as realize_mod

        original = realize_mod._compile
    except (ImportError, AttributeError):
        return None
    running = [0.0]

    def timed_compile(*args, **kwargs):
        fn = original(*args, **kwargs)

        def timed(*a):
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn(*a))
            running[0] += time.perf_counter() - t0
            return out

        return timed

    realize_mod._compile = timed_compile
    program_s: list[float] = []
    try:
        nx.clear_caches()
        r = NablaxRunner(init_params(), make_batches())
        for _ in range(steps + 3):
            running[0] = 0.0
            r.step()
            program_s.append(running[0])
    finally:
        realize_mod._compile = original
        nx.clear_caches()
    med = statistics.median
    return (
        med(r.build_s[3:]) * 1e3,
        med(r.realize_s[3:]) * 1e3,
        med(program_s[3:]) * 1e3,
    )


def profile_nablax(steps: int) -> str:
    """cProfile of ``steps`` steady-state nablax steps: the top functions by cumulative time."""
    r = NablaxRunner(init_params(), make_batches())
    for _ in range(3):
        r.step()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        r.step()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
    return out.getvalue()


# ---- report ----------------------------------------------------------------------------------


def _verdict(value: float, target: float, fmt: str) -> str:
    return fmt.format(value=value, target=target) + (" ok" if value <= target else " MISS")


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; return 0 (missed targets are reported, not fatal)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps (about 10 s)")
    p.add_argument("--steps", type=int, default=None, help="timed steps per backend (default 100)")
    p.add_argument("--profile", action="store_true", help="also print a cProfile of nablax")
    args = p.parse_args(argv)
    steps = args.steps or (20 if args.quick else 100)
    warmup = 3 if args.quick else 5
    first_reps = 1 if args.quick else 3

    if torch is not None:
        torch.set_num_threads(2)
    t_start = time.perf_counter()
    print(environment(torch), flush=True)
    print(
        f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, softmax cross-entropy, "
        f"SGD lr={LR}; {steps} timed steps after {warmup} warm-up steps",
        flush=True,
    )

    la, lb, rel = agreement()
    t_first_nx, t_first_jax = first_step(first_reps)

    nx.clear_caches()
    params, batches = init_params(), make_batches()
    nxr = NablaxRunner(params, batches)
    before_warm = nx.cache_info()
    med, low = steady_state({"nablax": nxr, "jax.jit": JaxRunner(params, batches)}, steps, warmup)
    info = nx.cache_info()
    if torch is not None:  # a block of its own: see the module docstring
        med_t, low_t = steady_state({"torch": TorchRunner(params, batches)}, steps, warmup)
        med.update(med_t)
        low.update(low_t)
    build = statistics.median(nxr.build_s[warmup:])
    real = statistics.median(nxr.realize_s[warmup:])

    ms = {k: v * 1e3 for k, v in med.items()}
    best = {k: v * 1e3 for k, v in low.items()}
    median_ratio = _verdict(
        ms["nablax"] / ms["jax.jit"], 1.5, "{value:.2f}x jax.jit (target <= {target:g}x)"
    )
    best_ratio = f"{best['nablax'] / best['jax.jit']:.2f}x jax.jit"
    if "torch" in ms:
        median_ratio += "; " + _verdict(
            ms["nablax"] / ms["torch"], 1.0, "{value:.2f}x torch (target < {target:g}x)"
        )
        best_ratio += f"; {best['nablax'] / best['torch']:.2f}x torch"
    rows = [
        ("steady-state step, median (ms)", {k: ms.get(k) for k in COLUMNS}, median_ratio),
        ("steady-state step, best (ms)", {k: best.get(k) for k in COLUMNS}, best_ratio),
    ]
    rows.append(
        (
            "first step, new graph (ms)",
            {"nablax": t_first_nx * 1e3, "jax.jit": t_first_jax * 1e3, "torch": None},
            f"{t_first_nx / t_first_jax:.2f}x jax.jit",
        )
    )

    print()
    print("| case | " + " | ".join(COLUMNS) + " | ratio |")
    print("|---|" + "---:|" * len(COLUMNS) + "---|")
    for case, vals, ratio in rows:
        print(f"| {case} | " + " | ".join(_fmt(vals[c]) for c in COLUMNS) + f" | {ratio} |")
    print()
    steady_compiles = info.compiles - before_warm.compiles
    print(
        f"- nablax step breakdown (median): graph building {build * 1e3:.2f} ms "
        f"(value_and_grad + tree.map, Python), realization {real * 1e3:.2f} ms "
        f"(cache lookups + dispatch + waiting for the loss); jax.jit step {ms['jax.jit']:.2f} ms"
    )
    print(
        f"- nablax vs JAX losses over {AGREE_STEPS} steps from identical params: "
        f"max relative difference {rel:.1e} ({'ok' if rel <= 1e-4 else 'MISS'}, target ~1e-4); "
        f"nablax {la[-1]:.6f}, jax {lb[-1]:.6f} at step {AGREE_STEPS}"
    )
    print(
        f"- nx.cache_info() after {warmup + steps} steps: {info} "
        f"({steady_compiles} compile(s) for the whole run: constant, not growing with steps)"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(
            f"- warning: load average {load:.1f} on {os.cpu_count()} cores: other processes "
            "compete for the CPU; medians are noisy, PyTorch's multi-threaded one most of all"
        )
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.profile:
        split = program_split(steps)
        if split is not None:
            b_ms, r_ms, p_ms = split
            print(
                f"- profile, nablax step split: graph building {b_ms:.2f} ms + realization "
                f"{r_ms:.2f} ms = XLA programs {p_ms:.2f} ms + nablax bookkeeping "
                f"{r_ms - p_ms:.2f} ms, all run one after the other (no overlap); overhead over "
                f"the programs {b_ms + r_ms - p_ms:.2f} ms per step"
            )
        print()
        print(f"cProfile of {steps} steady-state nablax steps (cumulative):")
        print(profile_nablax(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())

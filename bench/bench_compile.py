"""``nx.compile`` against ``jax.jit``, in one process.

Run from the repository root::

    python bench/bench_compile.py            # about 20 s on 2 cores
    python bench/bench_compile.py --quick

Cases:

- **cache-hit call overhead**: a compiled ``x + 1`` on a realized 4x4 float32 tensor, called in a
  loop (each call dispatches the cached executable; nothing waits for the result, as with
  ``jax.jit``). Target: <= 1.5x ``jax.jit``'s per-call time.
- **MLP training step** (the model of ``bench_mlp.py``: 784-512-512-10, batch 128, softmax
  cross-entropy, SGD) as one ``nx.compile``-d function ``step(params, x, y) -> (params, loss)``
  against ``jax.jit`` of the same step, each reading its loss every step. Target: <= 1.1x.
- **int step counter** (issue 17): a 100-step loop ``w = f(w, step)`` over a 4x4 tensor with the
  step passed as a Python int (a decay computed from it). Both trace the int as a weakly typed
  value, so each loop is one trace and 100 cache hits. Target: <= 1.5x ``jax.jit`` (the cache-hit
  overhead). For scale, the same loop with the step marked static (one trace and one compilation
  per value: what ``nx.compile`` did for every Python int before) is timed over a few steps.

nablax and JAX take turns (blocks of calls per round), medians reported. The data-parallel MLP
step on 8 virtual devices is in ``bench_shard.py`` (it needs XLA_FLAGS set before JAX starts).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt
from bench_mlp import LR, init_params, jax_loss, make_batches, nx_loss

COLUMNS = ("nablax", "jax.jit")


def _interleave(fns: dict, rounds: int, per_round: int) -> dict:
    """Median seconds per call of each function; they take turns, ``per_round`` calls each."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                fn()
            times[name].append((time.perf_counter() - t0) / per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def trivial_call(rounds: int) -> dict:
    f = nx.compile(lambda x: x + 1)
    jf = jax.jit(lambda x: x + 1)
    x = nx.tensor(np.ones((4, 4), np.float32))
    xj = jnp.ones((4, 4), jnp.float32)
    f(x).block_until_ready()
    jf(xj).block_until_ready()
    out = _interleave({"nablax": lambda: f(x), "jax.jit": lambda: jf(xj)}, rounds, 2000)
    assert f.cache_info().traces == 1
    return out


def mlp_step(rounds: int) -> tuple[dict, float, object]:
    @nx.compile
    def step(params, x, y):
        loss, grads = nx.value_and_grad(nx_loss)(params, x, y)
        return nx.tree.map(lambda p, g: p - LR * g, params, grads), loss

    @jax.jit
    def step_j(params, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        return jax.tree.map(lambda p, g: p - LR * g, params, grads), loss

    p0, batches = init_params(), make_batches()
    state = {
        "nablax": [[(nx.tensor(w), nx.tensor(b)) for w, b in p0], 0],
        "jax.jit": [[(jnp.asarray(w), jnp.asarray(b)) for w, b in p0], 0],
    }
    nx_b = [(nx.tensor(x), nx.tensor(y)) for x, y in batches]
    j_b = [(jnp.asarray(x), jnp.asarray(y)) for x, y in batches]

    def run_nx():
        s = state["nablax"]
        x, y = nx_b[s[1] % len(nx_b)]
        s[1] += 1
        s[0], loss = step(s[0], x, y)
        return loss.item()

    def run_j():
        s = state["jax.jit"]
        x, y = j_b[s[1] % len(j_b)]
        s[1] += 1
        s[0], loss = step_j(s[0], x, y)
        return float(loss)

    la = [run_nx() for _ in range(3)]
    lb = [run_j() for _ in range(3)]
    rel = max(abs(a - b) / abs(b) for a, b in zip(la, lb))
    out = _interleave({"nablax": run_nx, "jax.jit": run_j}, rounds, 10)
    return out, rel, step.cache_info()


def _decay_step(w, step):
    return w * (0.99 ** (step / 10)) + step % 3


def step_counter(rounds: int, steps: int = 100) -> tuple[dict, float, object, float]:
    """Per-loop seconds of ``steps`` calls with an int step counter (nablax, jax.jit), the max
    relative difference of the final values, the cache counters, and seconds per step when the
    step is static (one compilation per value)."""
    f, jf = nx.compile(_decay_step), jax.jit(_decay_step)
    w0 = np.ones((4, 4), np.float32)
    w, wj = nx.tensor(w0), jnp.asarray(w0)

    def loop_nx():
        x = w
        for s in range(steps):
            x = f(x, s)
        return x.block_until_ready()

    def loop_j():
        x = wj
        for s in range(steps):
            x = jf(x, s)
        return x.block_until_ready()

    a, b = loop_nx().numpy(), np.asarray(loop_j())
    rel = float(np.max(np.abs(a - b) / np.abs(b)))
    out = _interleave({"nablax": loop_nx, "jax.jit": loop_j}, rounds, 3)
    info = f.cache_info()
    static = nx.compile(_decay_step, static_argnums=1)
    n_static = 5
    with nx.config.override(compile_retrace_warning=0):
        t0 = time.perf_counter()
        x = w
        for s in range(n_static):
            x = static(x, s)
        x.block_until_ready()
    return out, rel, info, (time.perf_counter() - t0) / n_static


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer rounds")
    args = p.parse_args(argv)
    rounds = 5 if args.quick else 15
    t_start = time.perf_counter()
    print(environment(None), flush=True)
    triv = trivial_call(rounds)
    mlp, rel, info = mlp_step(rounds)
    counter, c_rel, c_info, static_s = step_counter(rounds)
    rows = [
        ("compiled x + 1 on 4x4, cache hit (µs/call)", triv, 1.5, 1e6),
        ("MLP training step, compiled (ms/step)", mlp, 1.1, 1e3),
        ("100-step loop, Python int step counter (ms/loop)", counter, 1.5, 1e3),
    ]
    print()
    print("| case | " + " | ".join(COLUMNS) + " | ratio |")
    print("|---|" + "---:|" * len(COLUMNS) + "---|")
    for case, vals, target, scale in rows:
        ratio = vals["nablax"] / vals["jax.jit"]
        verdict = "ok" if ratio <= target else "MISS"
        cells = " | ".join(_fmt(vals[c] * scale) for c in COLUMNS)
        print(f"| {case} | {cells} | {ratio:.2f}x jax.jit (target <= {target}x) {verdict} |")
    print()
    print(f"- MLP losses, nablax vs jax.jit over 3 steps: max relative difference {rel:.1e}")
    print(f"- compiled MLP step: {info}")
    print(
        f"- int step counter: {c_info.traces} trace(s) for all loops ({c_info}); final values vs "
        f"jax.jit: max relative difference {c_rel:.1e}; the step marked static instead (one "
        f"trace and compilation per value): {static_s * 1e3:.1f} ms/step, "
        f"{static_s * 100 / counter['nablax']:.0f}x the traced loop"
    )
    print("- data-parallel MLP step on 8 virtual devices: see bench/bench_shard.py")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"- warning: load average {load:.1f} on {os.cpu_count()} cores: medians are noisy")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

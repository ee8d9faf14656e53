"""The kernel layer: executor overhead, and tuned against heuristic configs, in one process.

Run from the repository root::

    python bench/bench_kernels.py            # about a minute on 2 cores
    python bench/bench_kernels.py --quick

Cases:

- **executor overhead**: ``Executor(kernel, a, b)`` on a cached config against calling the jitted
  kernel directly (``jax.jit(partial(kernel.run, cfg=cfg))``) on tiny 8x8 inputs, so dispatch is
  all there is to measure. Target: <= 10 us extra per call (ejKernel: ~77 us).
- **tuned vs heuristic**: for ``library.matmul`` and ``library.attention`` at a few shapes, every
  candidate config is timed by the Tuner; then the tuned and the heuristic configs are timed again,
  taking turns, as compiled calls, with a second copy of the heuristic as an A/A pair that
  measures the noise. Target: the tuned one is never slower beyond noise (max(5 %, A/A)).

The persistent cache has its own bench (``bench_kernel_cache.py``).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

from _common import (
    environment,  # bench/ is on sys.path when run as a script
    fmt,
)
from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Invocation,
    PersistentCache,
    Tuner,
    library,
)


def _turns(fns: dict, rounds: int, per_round: int, sync: bool = False) -> dict:
    """Median seconds per call of each function; they take turns, ``per_round`` calls each."""
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(per_round):
                out = fn()
            if sync:
                jax.block_until_ready(out)
            times[name].append((time.perf_counter() - t0) / per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def executor_overhead(rounds: int, store: PersistentCache) -> dict:
    ex = Executor(ConfigSelectorChain(ConfigCache(), AutotunePolicy(), Tuner(), store))
    a, b = jnp.ones((8, 8), jnp.float32), jnp.ones((8, 8), jnp.float32)
    k = library.MATMUL
    jax.block_until_ready(ex(k, a, b))  # choose (tunes once) and compile
    inv = Invocation(k.versioned_id, (a, b), {})
    cfg = ex.chooser.choose(inv, k)
    direct = jax.jit(functools.partial(k.run, cfg=cfg))
    jax.block_until_ready(direct(a, b))
    t = _turns(
        {"executor": lambda: ex(k, a, b), "jitted kernel": lambda: direct(a, b)}, rounds, 2000
    )
    extra = (t["executor"] - t["jitted kernel"]) * 1e6
    return {
        "executor_us": t["executor"] * 1e6,
        "direct_us": t["jitted kernel"] * 1e6,
        "extra_us": extra,
        "ok": extra <= 10.0,
    }


def _calls(quick: bool) -> list:
    sds = jax.ShapeDtypeStruct
    mm = [(256, 256, 256), (512, 512, 512), (128, 784, 512)]
    at = [(1, 256, 4, 64, False), (1, 256, 4, 64, True), (2, 512, 8, 64, True)]
    if quick:
        mm, at = mm[:2], at[:2]
    calls = []
    for m, kk, n in mm:
        calls.append((library.MATMUL, (sds((m, kk), "float32"), sds((kk, n), "float32")), {}))
    for bsz, s, h, d, causal in at:
        qkv = tuple(sds((bsz, s, h, d), "float32") for _ in range(3))
        calls.append((library.ATTENTION, qkv, {"causal": causal, "scale": None}))
    return calls


def tuned_vs_heuristic(quick: bool, rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    tuner = Tuner(warmup=2, iters=7 if quick else 15)
    rows = []
    for kernel, structs, kw in _calls(quick):
        inv = Invocation(kernel.versioned_id, structs, kw)
        heur = kernel.heuristic_cfg(inv)
        result = tuner.tune(kernel, inv, list(kernel.candidate_cfgs(inv)), baseline=heur)
        arrays = [jnp.asarray(rng.standard_normal(s.shape), s.dtype) for s in structs]
        # "heuristic again" is a second compiled copy of the heuristic: the A/A pair measures
        # the machine's noise, the bar for "the tuned config is never slower beyond noise"
        fns = {
            name: jax.jit(functools.partial(kernel.run, cfg=cfg, **kw))
            for name, cfg in (("tuned", result.best), ("heuristic", heur), ("again", heur))
        }
        for f in fns.values():
            jax.block_until_ready(f(*arrays))
        t = _turns({n: (lambda f=f, a=arrays: f(*a)) for n, f in fns.items()}, rounds, 3, sync=True)
        speedup = t["heuristic"] / t["tuned"]
        noise = abs(t["again"] / t["heuristic"] - 1.0)
        rows.append(
            {
                "op": kernel.versioned_id,
                "call": inv.signature,
                "heuristic": repr(heur),
                "tuned": repr(result.best),
                "heuristic_ms": t["heuristic"] * 1e3,
                "tuned_ms": t["tuned"] * 1e3,
                "speedup": speedup,
                "noise": noise,
                "ok": speedup >= 1.0 - max(0.05, noise),
                "candidates": len(result.timings),
            }
        )
        print(
            f"  {kernel.versioned_id:<13} {inv.signature[:60]:<60} tuned {fmt(t['tuned'] * 1e3)} ms "
            f"heuristic {fmt(t['heuristic'] * 1e3)} ms  x{speedup:.2f} (A/A noise {noise:.0%})",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--out", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    print(environment())
    with tempfile.TemporaryDirectory() as d:
        store = PersistentCache(f"{d}/k.sqlite")
        ov = executor_overhead(5 if args.quick else 15, store)
        store.close()
    print("\nexecutor overhead on a cached config (8x8 matmul, per call):")
    print(
        f"  executor {fmt(ov['executor_us'])} us, jitted kernel {fmt(ov['direct_us'])} us, "
        f"extra {fmt(ov['extra_us'])} us (target <= 10 us): {'ok' if ov['ok'] else 'MISS'}"
    )
    print("\ntuned vs heuristic config (compiled calls, taking turns):")
    rows = tuned_vs_heuristic(args.quick, 5 if args.quick else 11)
    print("\n| op | call | heuristic | tuned | heuristic ms | tuned ms | speedup | A/A noise |")
    print("|---|---|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['op']} | {r['call']} | {r['heuristic']} | {r['tuned']} | "
            f"{fmt(r['heuristic_ms'])} | {fmt(r['tuned_ms'])} | {r['speedup']:.2f}x"
            f"{'' if r['ok'] else ' **MISS**'} | {r['noise']:.0%} |"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"overhead": ov, "tuned_vs_heuristic": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

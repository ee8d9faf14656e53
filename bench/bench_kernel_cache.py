"""Speed of the kernel config caches (``nablax.kernels.cache``) at 10,000 entries.

Run from the repository root::

    python bench/bench_kernel_cache.py            # about 10 s on 2 cores
    python bench/bench_kernel_cache.py --quick
    python bench/bench_kernel_cache.py --out bench/kernel_cache.json

A fresh SQLite file in a temporary folder is filled with 10,000 entries (each with 8 candidate
timings, as an autotuned entry has), then:

- **put**: a new key, each its own ``BEGIN IMMEDIATE`` upsert (WAL, ``synchronous=NORMAL``).
  Target: median <= 1 ms.
- **get (hit)**: a random stored key, query plus rebuilding the config from JSON.
  Target: median <= 20 µs.
- **cold open**: a new ``PersistentCache`` object on the existing file plus its first ``get``, as a
  new process pays it. Target: median <= 50 ms.
- for reference, the memory ``ConfigCache.get`` hit that sits on the executor's hot path
  (target ~1 µs).
- **4 writers**: 4 processes put 200 new keys each into one fresh file at the same time.
  Target: 0 entries lost (800 stored).

Times are per call (``time.perf_counter`` around each call), medians reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time

from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt
from nablax.kernels.cache import ConfigCache, PersistentCache

DEVICE = "cpu|bench-device|n=1|jax=0|jaxlib=0"
OP = "matmul@v1"
N_ENTRIES = 10_000


@dataclasses.dataclass(frozen=True)
class MatmulCfg:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    num_warps: int = 4
    num_stages: int = 2
    split_k: int | None = None
    order: tuple = (0, 1)


def _cfg(i: int) -> MatmulCfg:
    return MatmulCfg(block_m=16 << (i % 4), block_n=16 << (i % 3), split_k=i % 5 or None)


def _key(i: int) -> str:
    return f"{OP}|(f32[{i},512],f32[512,{i % 977}])|()"


def _timings(i: int) -> list:
    return [(_cfg(i + j), 1e-4 * (j + 1), None) for j in range(7)] + [
        (_cfg(i + 7), float("inf"), "RESOURCE_EXHAUSTED: out of shared memory")
    ]


def _per_call(fn, args_list) -> float:
    """Median seconds of ``fn(*args)`` over ``args_list``."""
    times = []
    for args in args_list:
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def fill(cache: PersistentCache) -> float:
    t0 = time.perf_counter()
    for i in range(N_ENTRIES):
        cache.put(DEVICE, OP, _key(i), _cfg(i), timings=_timings(i), signature=f"f32[{i},512]")
    return time.perf_counter() - t0


def measure(path: str, n: int) -> dict:
    cache = PersistentCache(path)
    fill_s = fill(cache)
    assert len(cache) == N_ENTRIES
    rng = random.Random(0)
    hits = [(DEVICE, OP, _key(rng.randrange(N_ENTRIES))) for _ in range(n)]
    assert all(cache.get(*k) is not None for k in hits[:10])
    new = [
        (DEVICE, OP, f"new-{i}", _cfg(i)) for i in range(N_ENTRIES, N_ENTRIES + max(n // 10, 100))
    ]
    out = {
        "fill_s": fill_s,
        "put_s": _per_call(lambda *a: cache.put(*a, timings=_timings(1)), new),
        "get_s": _per_call(cache.get, hits),
    }
    cache.close()

    def cold(*key):
        c = PersistentCache(path)
        assert c.get(*key) is not None
        c.close()

    out["cold_open_s"] = _per_call(cold, hits[:20])
    mem = ConfigCache()
    for d, op, key in hits:
        mem.put(d, op, key, _cfg(0))
    out["memory_get_s"] = _per_call(mem.get, hits)
    return out


def _writer(path: str, w: int, n: int, start) -> None:
    cache = PersistentCache(path)
    start.wait()  # all writers start together, so that they really overlap
    for i in range(n):
        cache.put(DEVICE, OP, f"w{w}-{i}", _cfg(i), timings=_timings(i))
    cache.close()


def writers(path: str, n_procs: int = 4, n_puts: int = 200) -> dict:
    """``n_procs`` processes put ``n_puts`` keys each at once; count what the file holds."""
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_writer, args=(path, w, n_puts, start)) for w in range(n_procs)]
    for p in procs:
        p.start()
    time.sleep(3.0)  # let every child import nablax before the start signal
    t0 = time.perf_counter()
    start.set()
    for p in procs:
        p.join(300)
    seconds = time.perf_counter() - t0
    failed = [p.exitcode for p in procs if p.exitcode != 0]
    cache = PersistentCache(path)
    keys = {e.call_key for e in cache.entries(resolve=False)}
    cache.close()
    want = {f"w{w}-{i}" for w in range(n_procs) for i in range(n_puts)}
    return {"writers_lost": len(want - keys), "writers_failed": failed, "writers_s": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer timed calls")
    p.add_argument("--out", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    print(environment(None), flush=True)
    with tempfile.TemporaryDirectory() as d:
        res = measure(os.path.join(d, "kernels.sqlite"), 1000 if args.quick else 5000)
        res.update(writers(os.path.join(d, "writers.sqlite")))
    rows = [
        ("PersistentCache.put, new key (ms)", res["put_s"] * 1e3, 1.0),
        ("PersistentCache.get, hit (µs)", res["get_s"] * 1e6, 20.0),
        ("cold open + first get (ms)", res["cold_open_s"] * 1e3, 50.0),
        ("ConfigCache.get, hit (µs)", res["memory_get_s"] * 1e6, 1.0),
    ]
    print()
    print(f"| case, {N_ENTRIES} entries | median | target | |")
    print("|---|---:|---:|---|")
    for case, value, target in rows:
        print(
            f"| {case} | {_fmt(value)} | <= {_fmt(target)} | {'ok' if value <= target else 'MISS'} |"
        )
    lost, failed = res["writers_lost"], res["writers_failed"]
    print(
        f"| 4 writers x 200 puts: entries lost | {lost} | 0 | "
        f"{'ok' if lost == 0 and not failed else 'MISS'} |"
    )
    print()
    print(f"- filling {N_ENTRIES} entries one put at a time took {res['fill_s']:.1f} s")
    print(f"- 4 writers x 200 puts took {res['writers_s']:.2f} s (exit codes not 0: {failed})")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"- warning: load average {load:.1f} on {os.cpu_count()} cores: medians are noisy")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"environment": environment(None), "entries": N_ENTRIES, **res}, f, indent=2)
        print(f"- results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

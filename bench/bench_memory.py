"""Peak memory of a long eager chain: nablax against NumPy running the same loop.

Run from the repository root::

    python bench/bench_memory.py             # about 20 s
    python bench/bench_memory.py --ops 20000 --size 64

The loop is ``x = x * a + b`` on a ``size x size`` float32 array, ``ops`` element-wise ops in all
(two per iteration), and the result is read at the end (``.numpy()``). nablax records the whole
chain lazily; a graph deeper than ``nx.config.max_graph_depth`` is realized on the way, so the
pending graph (nodes, their weak references, the realization's work lists) is what it holds.

Peak resident memory (``ru_maxrss``) is a high-water mark of a whole process, so each peer runs in
a fresh subprocess (timing benchmarks interleave peers in one process; a peak cannot be measured
that way). Both processes import nablax (and with it JAX and NumPy) before the loop, so the
comparison is of the loop, not of the imports: printed are the peak of each process, the
baseline after imports, and the growth. Target: nablax's peak <= 1.2x NumPy's for
the same loop; the growth is printed to show where it goes.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

_CHILD = r"""
import json, resource, sys, time
import numpy as np
import nablax as nx
peer, ops, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
warm = nx.ones((size, size)) * 2.0  # load XLA's CPU client, compile once
warm.numpy()
base = rss_mb()
t0 = time.perf_counter()
if peer == "numpy":
    x = np.ones((size, size), np.float32)
    for _ in range(ops // 2):
        x = x * np.float32(1.0001) + np.float32(0.0001)
    val = float(x[0, 0])
else:
    x = nx.ones((size, size))
    for _ in range(ops // 2):
        x = x * 1.0001 + 0.0001
    val = float(x.numpy()[0, 0])
wall = time.perf_counter() - t0
print(json.dumps({"peak": rss_mb(), "base": base, "wall": wall, "value": val}))
"""


def run_peer(peer: str, ops: int, size: int) -> dict:
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, peer, str(ops), str(size)],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=100_000, help="element-wise ops in the chain")
    ap.add_argument("--size", type=int, default=4, help="the array is size x size")
    ap.add_argument("--repeats", type=int, default=2, help="subprocesses per peer (min peak)")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    print(
        f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}; chain of {args.ops} ops on {args.size}x{args.size} float32"
    )
    res: dict[str, dict] = {}
    for _ in range(args.repeats):  # alternate the peers; keep each one's lowest peak
        for peer in ("numpy", "nablax"):
            r = run_peer(peer, args.ops, args.size)
            if peer not in res or r["peak"] < res[peer]["peak"]:
                res[peer] = r
    np_r, nx_r = res["numpy"], res["nablax"]
    agree = abs(np_r["value"] - nx_r["value"]) <= 1e-3 * max(1.0, abs(np_r["value"]))
    print(
        f"{'PASS' if agree else 'FAIL'} correctness: result[0,0] numpy {np_r['value']:.6g}, "
        f"nablax {nx_r['value']:.6g}"
    )
    print("\n| peer | peak RSS (MB) | after imports (MB) | growth (MB) | loop wall (s) |")
    print("|---|---:|---:|---:|---:|")
    for peer, r in res.items():
        print(
            f"| {peer} | {r['peak']:.0f} | {r['base']:.0f} | {r['peak'] - r['base']:.1f} | "
            f"{r['wall']:.2f} |"
        )
    ratio = nx_r["peak"] / np_r["peak"]
    print(
        f"\n{'PASS' if ratio <= 1.2 else 'MISS'} peak RSS of a {args.ops}-op eager chain: nablax "
        f"{nx_r['peak']:.0f} MB = {ratio:.2f}x NumPy's {np_r['peak']:.0f} MB (target <= 1.2x; both "
        f"processes import nablax first; growth during the loop: nablax "
        f"{nx_r['peak'] - nx_r['base']:.1f} MB, NumPy {np_r['peak'] - np_r['base']:.1f} MB)"
    )
    print(
        f"- own peak (parent process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
    )
    print(f"- total benchmark time {time.perf_counter() - t0:.1f} s")
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())

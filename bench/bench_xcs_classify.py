"""How accurate ``nablax.xcs.classify`` is on the labeled corpus of the tests, and how long it
takes per function.

Run from the repository root::

    python bench/bench_xcs_classify.py                      # about 15 s on 2 cores
    python bench/bench_xcs_classify.py --quick --out bench/xcs_classify.json

**Accuracy.** Every corpus function (``tests/xcs/corpus/*.py``) is labeled with its kind and its
effects; the script prints the share classified right per corpus file, per kind, overall, and
for the hold-out files (``holdout*.py``: written after the rules, never tuned on) on their own,
then each miss with its reasons.

**Timing.** Cases, each timed per corpus function, then summarized over the functions by median
and 90th percentile:

- **cold**: after ``clear_cache()`` (classifications *and* parsed source files dropped), so the
  time includes reading and parsing the function's whole source file.
- **uncached**: classifications dropped, parsed files kept: the analysis itself (name resolution,
  helpers followed recursively).
- **cached**: a cache hit, the cost ``xcs.jit`` pays on every call it routes (it reads
  ``classify(fn).kind`` and ``.effects``). Target: 1-3 µs.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path

from _common import environment  # bench/ is on sys.path when run as a script
from _common import fmt as _fmt
from nablax.xcs.classify import analysis

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "xcs" / "corpus"


KINDS = ("tensor", "orchestration", "hybrid", "pure")


def corpus() -> list[tuple[str, object, str, bool]]:
    """Every labeled callable of the test corpus: ``(file.name, callable, kind, effects)``
    (modules imported under private names)."""
    out = []
    for path in sorted(CORPUS.glob("*.py")):
        name = f"_bench_corpus_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        out += [
            (f"{path.stem}.{n}", obj, kind, fx)
            for n, obj, kind, fx in module.CASES
            if obj is not None
        ]
    return out


def _score(rows: list) -> dict:
    n = len(rows)
    kind = sum(c.kind == k for _, _, k, _, c in rows)
    fx = sum(c.effects == e for _, _, _, e, c in rows)
    return {"n": n, "kind": kind / max(1, n), "effects": fx / max(1, n)}


def accuracy(cases: list) -> dict:
    """Print kind and effects accuracy per file, per kind, on hold-outs and overall."""
    analysis.clear_cache()
    rows = [(name, obj, kind, fx, analysis.classify(obj)) for name, obj, kind, fx in cases]
    groups = sorted({r[0].split(".")[0] for r in rows})
    table = {g: _score([r for r in rows if r[0].split(".")[0] == g]) for g in groups}
    table |= {f"kind={k}": _score([r for r in rows if r[2] == k]) for k in KINDS}
    table["hold-outs (holdout*.py)"] = _score([r for r in rows if r[0].startswith("holdout")])
    table["development files"] = _score([r for r in rows if not r[0].startswith("holdout")])
    table["all"] = _score(rows)
    print(f"classify() accuracy on {len(rows)} labeled corpus functions (kind and effects)")
    print()
    print("| group | functions | kind | effects |")
    print("|---|---:|---:|---:|")
    for group, s in table.items():
        print(f"| {group} | {s['n']} | {s['kind']:.1%} | {s['effects']:.1%} |")
    print()
    for name, _, kind, fx, c in rows:
        if (c.kind, c.effects) != (kind, fx):
            got = f"{c.kind}/effects={c.effects}"
            print(f"- miss {name}: labeled {kind}/effects={fx}, got {got}: {c.reasons[0]}")
    return table


def _once(fn, reset) -> float:
    reset()
    t0 = time.perf_counter()
    analysis.classify(fn)
    return time.perf_counter() - t0


def time_uncached(fns: list, reps: int, cold: bool) -> list[float]:
    """Median seconds of one classification per function, caches reset before each."""
    reset = analysis.clear_cache if cold else analysis._CACHE.clear  # parsed files kept
    return [statistics.median(_once(fn, reset) for _ in range(reps)) for fn in fns]


def time_cached(fns: list, calls: int) -> list[float]:
    """Seconds per cache-hit call, per function."""
    out = []
    for fn in fns:
        analysis.classify(fn)
        t0 = time.perf_counter()
        for _ in range(calls):
            analysis.classify(fn)
        out.append((time.perf_counter() - t0) / calls)
    return out


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer repetitions")
    p.add_argument("--out", metavar="PATH", help="also write the results as JSON")
    args = p.parse_args(argv)
    reps, calls = (3, 500) if args.quick else (7, 3000)
    t_start = time.perf_counter()
    cases = corpus()
    names, fns = [c[0] for c in cases], [c[1] for c in cases]
    print(environment(sys.modules.get("torch")), flush=True)
    print()
    scores = accuracy(cases)
    print(flush=True)
    results = {
        "cold (sources re-parsed)": time_uncached(list(fns), reps, cold=True),
        "uncached (analysis only)": time_uncached(list(fns), reps, cold=False),
        "cached (cache hit)": time_cached(list(fns), calls),
    }
    print()
    print(f"classify() time per function, over {len(fns)} corpus functions")
    print()
    print("| case | median µs | p90 µs | max µs |")
    print("|---|---:|---:|---:|")
    summary = {}
    for case, secs in results.items():
        us = [s * 1e6 for s in secs]
        row = {"median_us": statistics.median(us), "p90_us": _p90(us), "max_us": max(us)}
        summary[case] = row
        print(f"| {case} | {' | '.join(_fmt(v) for v in row.values())} |")
    slowest = max(zip(results["uncached (analysis only)"], names))
    hit = summary["cached (cache hit)"]["median_us"]
    print()
    print(f"- slowest uncached: {slowest[1]} ({slowest[0] * 1e3:.2f} ms)")
    print(f"- cache hit target 1-3 µs: {'ok' if hit <= 3 else 'MISS'} ({_fmt(hit)} µs median)")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > (os.cpu_count() or 1):
        print(f"- warning: load average {load:.1f} on {os.cpu_count()} cores: medians are noisy")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.out:
        out = {"functions": len(fns), "accuracy": scores, "cases": summary}
        Path(args.out).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

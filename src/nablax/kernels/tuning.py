"""Tuning the bundled kernels ahead of time (``nablax tune``) and listing the database
(``nablax cache``).

``common_calls`` lists representative shapes of the bundled kernels; ``tune_calls`` tunes each on
this device (synthetic inputs, progress per call) and stores the winners in the persistent
database, so later processes start with tuned configs.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Iterable
from typing import Any

import jax

from .cache import CacheEntry, cfg_from_json
from .executor import Executor
from .invocation import Invocation

_MATMUL_SHAPES = [(128, 784, 512), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024)]
_ATTN_SHAPES = [(1, 128, 4, 64), (2, 256, 8, 64), (1, 512, 8, 64)]


def common_calls(ops: Iterable[str] = ("matmul", "attention"), quick: bool = False) -> list:
    """``(kernel, Invocation)`` pairs of representative float32 shapes of the bundled kernels."""
    from . import library

    sds = jax.ShapeDtypeStruct
    calls = []
    if "matmul" in ops:
        for m, k, n in _MATMUL_SHAPES[: 2 if quick else None]:
            args = (sds((m, k), "float32"), sds((k, n), "float32"))
            calls.append((library.MATMUL, Invocation(library.MATMUL.versioned_id, args, {})))
    if "attention" in ops:
        for b, s, h, d in _ATTN_SHAPES[: 1 if quick else None]:
            qkv = tuple(sds((b, s, h, d), "float32") for _ in range(3))
            for causal in (False, True):
                kw = {"causal": causal, "scale": None}
                calls.append(
                    (library.ATTENTION, Invocation(library.ATTENTION.versioned_id, qkv, kw))
                )
    return calls


def tune_calls(executor: Executor, calls: list, force: bool = False, out=None) -> list[dict]:
    """Tune each call (skipping ones already tuned unless ``force``), printing one line each."""
    out = out or sys.stdout
    chain = executor.chooser
    rows = []
    for n, (kernel, inv) in enumerate(calls, 1):
        prefix = f"[{n}/{len(calls)}] {kernel.versioned_id} {inv.signature}"
        if not force:
            hit = chain._cached(_key(inv), chain.policy)
            if hit is not None and hit.source != "heuristic":
                print(f"{prefix}: cached {hit.cfg}", file=out, flush=True)
                rows.append({"op": inv.op_id, "call": inv.signature, "cfg": repr(hit.cfg)})
                continue
        t0 = time.perf_counter()
        choice, result = chain.tune(inv, kernel)
        heur = kernel.heuristic_cfg(inv)
        by_cfg = {t.cfg: t.median_s for t in result.timings}
        best = by_cfg.get(choice.cfg, math.nan)  # a tuner with ejKernel's protocol reports none
        h = by_cfg.get(heur, math.nan)
        ok = math.isfinite(h) and math.isfinite(best)
        speed = f", {h / best:.2f}x vs heuristic {heur}" if ok else ""
        print(
            f"{prefix}: {choice.cfg} {best * 1e3:.3f} ms ({len(result.timings)} candidates, "
            f"{time.perf_counter() - t0:.1f} s{speed})",
            file=out,
            flush=True,
        )
        rows.append(
            {
                "op": inv.op_id,
                "call": inv.signature,
                "cfg": repr(choice.cfg),
                "best_ms": best * 1e3,
                "heuristic_ms": h * 1e3,
            }
        )
    return rows


def recorded_calls(store: Any) -> list:
    """The invocations recorded with NABLAX_OPS_RECORD=1 that belong to bundled kernels."""
    import json

    from . import library

    kernels = {k.versioned_id: k for k in (library.MATMUL, library.ATTENTION)}
    calls = []
    for op_id, _, sig_json, _count in store.recorded():
        kernel = kernels.get(op_id)
        data = json.loads(sig_json)
        if kernel is None or data.get("method") is not None:
            continue
        shapes = data.get("shapes")
        if not shapes:
            continue
        args = tuple(jax.ShapeDtypeStruct(tuple(s), d) for s, d in shapes)
        calls.append((kernel, Invocation(op_id, args, data.get("static_kwargs", {}))))
    return calls


def _key(inv: Invocation) -> tuple:
    from .store.fingerprint import device_fingerprint

    return (device_fingerprint(), inv.op_id, inv.call_key)


def entry_row(e: CacheEntry) -> dict:
    finite = [t for t in e.timings if math.isfinite(t[1])]
    best = min((t[1] for t in finite), default=math.nan)
    return {
        "op": e.op_id,
        "key": e.call_key[:12],
        "call": e.signature,
        "cfg": repr(e.cfg),
        "source": e.source,
        "best_ms": best * 1e3,
        "candidates": len(e.timings),
        "failed": sum(1 for t in e.timings if t[2] is not None),
        "when": time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created)),
    }


def describe_entry(e: CacheEntry) -> str:
    lines = [
        f"op:       {e.op_id}",
        f"call key: {e.call_key}",
        f"call:     {e.signature}",
        f"device:   {e.device}",
        f"config:   {e.cfg!r} ({e.source})",
        f"nablax:   {e.package_version}",
        f"stored:   {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(e.created))}",
    ]
    if e.timings:
        lines.append("timings:")
        for cfg_json, secs, err in sorted(e.timings, key=lambda t: t[1]):
            try:
                cfg = repr(cfg_from_json(cfg_json))
            except Exception:  # noqa: BLE001 - show the raw text of a config class that moved
                cfg = cfg_json
            what = f"{secs * 1e3:10.4f} ms" if math.isfinite(secs) else "       inf   "
            lines.append(f"  {what}  {cfg}" + (f"  ({err})" if err else ""))
    return "\n".join(lines)

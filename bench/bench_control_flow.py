"""Control flow: ``nx.scan`` against ``jax.lax.scan`` and an unrolled Python loop, and
``nx.checkpoint``'s memory, in one process.

Run from the repository root::

    python bench/bench_control_flow.py            # about 2 min on 2 idle cores
    python bench/bench_control_flow.py --quick    # fewer blocks, 200-step unrolled loop (~40 s)

The model is an Elman RNN, ``h = tanh(h @ W + x_t @ U + b)``, 1000 steps, hidden 256, batch 32,
input 256, float32; the loss is ``mean(h_final ** 2) + mean(ys ** 2)`` where ``ys`` stacks every
step's ``h``. Every peer starts from the same NumPy weights and inputs. Cases:

1. **Scan speed.** Forward (the loss) and forward+backward (the loss and its gradients w.r.t.
   ``W``, ``U``, ``b``): eager nablax (``nx.scan`` inside a plain Python function, no
   ``nx.compile``; ``nx.value_and_grad`` for the gradients), the same functions under
   ``nx.compile``, and ``jax.jit`` of ``jax.lax.scan`` (``jax.jit(jax.value_and_grad(...))``).
   Values and gradients are compared with JAX's before timing. Every step reads its loss to the
   host; steps are timed in blocks ending with every result (the gradients too) computed, the
   peers taking turns block by block (order rotated each round). Also: the first call of a
   never-compiled function (caches cleared / a fresh ``nx.compile`` / a fresh ``jax.jit``).
   Target: eager nablax and ``nx.compile`` <= 1.1x ``jax.jit`` (median over blocks).
2. **Graph building.** Time from calling the eager nablax function to holding its lazy result
   (nothing realized), for 10, 100 and 1000 steps: the forward loss and ``value_and_grad``; the
   first call after ``nx.clear_caches()`` and the median of later calls. Target: <= 1 ms and
   independent of the trip count (the 1000-step build within 25% or 0.1 ms of the 10-step one).
3. **Why scan exists.** The same RNN as an unrolled Python loop (``x[t]`` indexing) in eager
   nablax against the ``nx.scan`` version: graph building, first call (caches cleared: building,
   XLA compilation, running) and steady calls. Forward with 1000 steps (200 with ``--quick``);
   forward+backward with 200 steps in both modes (with 1000 unrolled steps, compiling the
   backward pass ran for minutes, then LLVM failed with "Cannot allocate memory" and the process
   crashed, on a 2-core, 23 GB machine).
4. **Checkpoint memory.** A residual MLP of 20 layers ``x + gelu(x @ W1) @ W2`` (width 512,
   hidden 2048, batch 256), loss ``mean(x ** 2)``, gradients w.r.t. every weight, with and without
   every layer wrapped in ``nx.checkpoint`` (``jax.checkpoint`` for JAX). Gradients must agree
   (with and without, and with JAX). Memory is XLA's own accounting of the compiled programs
   (``memory_analysis()``: argument, output and temporary bytes): the ``nx.compile`` program and
   ``jax.jit``'s, and the programs eager nablax compiles (captured by wrapping the private
   ``nablax.core.realize._compile`` for this diagnosis only). Also the peak RSS of a fresh
   subprocess per eager variant (``VmHWM``; includes the weights and XLA's runtime; Linux only).
   Target: the backward pass's temporary memory is lower with checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
from _common import environment, load_warning, med_best, threads, time_blocks, verdict
from _common import fmt as _fmt

STEPS, BATCH, IN, HIDDEN = 1000, 32, 256, 256
SCAN_TARGET = 1.1  # nablax / jax.jit
BUILD_TARGET_MS = 1.0
BUILD_LENGTHS = (10, 100, 1000)
UNROLL_BWD_STEPS = 200
DEPTH, WIDTH, EXPAND, MLP_BATCH = 20, 512, 4, 256
PEERS = ("nablax", "nx.compile", "jax.jit")
MB = 2.0**20


# ---- the RNN: data, nablax and JAX versions ---------------------------------------------------


def rnn_data(steps: int = STEPS, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights (scaled so ``tanh`` stays unsaturated) and inputs, float32."""
    rng = np.random.default_rng(seed)
    return {
        "W": (rng.standard_normal((HIDDEN, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32),
        "U": (rng.standard_normal((IN, HIDDEN)) / np.sqrt(IN)).astype(np.float32),
        "b": (0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "xs": rng.standard_normal((steps, BATCH, IN)).astype(np.float32),
    }


def nx_rnn(W, U, b, xs):
    """The loss with ``nx.scan``: one graph node for the whole loop."""

    def step(h, x):
        h = nx.tanh(h @ W + x @ U + b)
        return h, h

    h, ys = nx.scan(step, nx.zeros((BATCH, HIDDEN)), xs)
    return (h**2).mean() + (ys**2).mean()


def nx_rnn_unrolled(W, U, b, xs):
    """The same loss as a Python loop: every step's ops are recorded in the graph."""
    h = nx.zeros((BATCH, HIDDEN))
    ys = []
    for t in range(xs.shape[0]):
        h = nx.tanh(h @ W + xs[t] @ U + b)
        ys.append(h)
    return (h**2).mean() + (nx.stack(ys) ** 2).mean()


def jax_rnn(W, U, b, xs):
    """The same loss with ``jax.lax.scan``."""

    def step(h, x):
        h = jnp.tanh(h @ W + x @ U + b)
        return h, h

    h, ys = jax.lax.scan(step, jnp.zeros((BATCH, HIDDEN), jnp.float32), xs)
    return jnp.mean(h**2) + jnp.mean(ys**2)


_nx_rnn_vg = nx.value_and_grad(nx_rnn, argnums=(0, 1, 2))
_nx_unrolled_vg = nx.value_and_grad(nx_rnn_unrolled, argnums=(0, 1, 2))


def make_fns(kind: str) -> dict[str, Callable]:
    """``{peer: f(W, U, b, xs)}`` returning the loss (``fwd``) or ``(loss, grads)`` (``vg``);
    new ``nx.compile`` / ``jax.jit`` objects each call, so nothing is cached for them."""
    nx_fn = nx_rnn if kind == "fwd" else nx.value_and_grad(nx_rnn, argnums=(0, 1, 2))

    def fresh(*a):  # a new function object each time: jax.jit has nothing cached for it
        if kind == "fwd":
            return jax_rnn(*a)
        return jax.value_and_grad(jax_rnn, argnums=(0, 1, 2))(*a)

    return {"nablax": nx_fn, "nx.compile": nx.compile(nx_fn), "jax.jit": jax.jit(fresh)}


class Peer:
    """``step()``: call, read the loss to the host; ``sync()``: wait for every result of the
    block (the gradients too). Results stay referenced until then: nothing is dropped lazy."""

    def __init__(self, fn: Callable, args: tuple):
        self.fn, self.args, self.held = fn, args, []

    def step(self) -> float:
        out = self.fn(*self.args)
        self.held.append(out)
        return float(out[0] if isinstance(out, tuple) else out)

    def sync(self) -> None:
        for leaf in nx.tree.leaves(self.held):  # nablax tensors and JAX arrays alike
            leaf.block_until_ready()
        self.held.clear()


def peer_args(data: dict[str, np.ndarray]) -> dict[str, tuple]:
    nx_args = tuple(nx.tensor(data[k]) for k in ("W", "U", "b", "xs"))
    jax_args = tuple(jnp.asarray(data[k]) for k in ("W", "U", "b", "xs"))
    return {"nablax": nx_args, "nx.compile": nx_args, "jax.jit": jax_args}


def _max_rel(a, ref) -> float:
    """Largest absolute difference, relative to the reference's largest magnitude."""
    a, ref = np.asarray(a), np.asarray(ref)
    return float(np.max(np.abs(a - ref)) / max(float(np.max(np.abs(ref))), 1e-30))


def scan_agreement(data) -> tuple[list[str], bool]:
    """Loss and gradients of every peer against ``jax.jit``'s (also the warm-up calls)."""
    args = peer_args(data)
    lines, ok = [], True
    for kind, names in (("fwd", ("loss",)), ("vg", ("loss", "dW", "dU", "db"))):
        outs = {k: nx.tree.leaves(f(*args[k])) for k, f in make_fns(kind).items()}
        for k in PEERS[:2]:
            d = [_max_rel(a, r) for a, r in zip(outs[k], outs["jax.jit"])]
            ok &= d[0] <= 1e-5 and max(d) <= 1e-4
            diffs = ", ".join(f"{n} {v:.1e}" for n, v in zip(names, d))
            lines.append(f"{kind} {k} vs jax.jit, max rel. diff: {diffs}")
    return lines, ok


def scan_speed(data, kind: str, rounds: int, block: int) -> tuple[dict, dict]:
    """Median and best seconds per step of each peer (blocks interleaved)."""
    args = peer_args(data)
    peers = {k: Peer(f, args[k]) for k, f in make_fns(kind).items()}
    for p in peers.values():  # warm-up: compile, fill caches
        for _ in range(2):
            p.step()
        p.sync()
    return med_best(time_blocks({k: (p.step, p.sync) for k, p in peers.items()}, rounds, block))


def first_calls(data, kind: str) -> dict[str, float]:
    """Seconds of the first call of a never-compiled function, result and gradients computed."""
    args, out = peer_args(data), {}
    for name in PEERS:
        nx.clear_caches()
        p = Peer(make_fns(kind)[name], args[name])
        t0 = time.perf_counter()
        p.step()
        p.sync()
        out[name] = time.perf_counter() - t0
    return out


# ---- case 2: graph building -------------------------------------------------------------------


def build_times(reps: int) -> dict[tuple[str, int], tuple[float, float]]:
    """``{(kind, steps): (first build s, median later build s)}`` for the eager scan function;
    the lazy results are dropped unrealized (nothing runs). Later calls take turns over the
    lengths, so load hits them alike."""
    fns = {"fwd": nx_rnn, "vg": _nx_rnn_vg}
    args = {n: tuple(nx.tensor(v) for v in rnn_data(n).values()) for n in BUILD_LENGTHS}
    first = {}
    for kind, fn in fns.items():
        for n in BUILD_LENGTHS:
            nx.clear_caches()
            t0 = time.perf_counter()
            res = fn(*args[n])
            first[(kind, n)] = time.perf_counter() - t0
            del res
    times: dict[tuple[str, int], list[float]] = {k: [] for k in first}
    for r in range(reps + 3):
        for kind, fn in fns.items():
            for n in BUILD_LENGTHS:
                t0 = time.perf_counter()
                res = fn(*args[n])
                dt = time.perf_counter() - t0
                del res
                if r >= 3:  # the first rounds warm up
                    times[(kind, n)].append(dt)
    return {k: (first[k], statistics.median(v)) for k, v in times.items()}


# ---- case 3: unrolled Python loop against scan -------------------------------------------------


def eager_profile(fn: Callable, args: tuple, steady: int) -> dict[str, float]:
    """Seconds of the first call after ``nx.clear_caches()`` (``first_build``: until the lazy
    result; ``first_total``: until every result is computed) and medians of ``steady`` later
    calls (``build``, ``total``); ``compiles``: XLA programs nablax compiled for the first."""
    nx.clear_caches()
    builds, totals, rec = [], [], {}
    for _ in range(steady + 1):
        p = Peer(fn, args)
        t0 = time.perf_counter()
        out = fn(*args)
        t1 = time.perf_counter()
        p.held.append(out)
        p.sync()
        builds.append(t1 - t0)
        totals.append(time.perf_counter() - t0)
        if not rec:
            rec = {"compiles": nx.cache_info().compiles, "value": nx.tree.leaves(out)[0].item()}
    rec.update(first_build=builds[0], first_total=totals[0])
    rec.update(build=statistics.median(builds[1:]), total=statistics.median(totals[1:]))
    return rec


# ---- case 4: checkpoint memory ----------------------------------------------------------------


def mlp_data(seed: int = 2) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    rng = np.random.default_rng(seed)
    hid = EXPAND * WIDTH
    params = [
        (
            (rng.standard_normal((WIDTH, hid)) / np.sqrt(WIDTH)).astype(np.float32),
            (0.5 * rng.standard_normal((hid, WIDTH)) / np.sqrt(hid)).astype(np.float32),
        )
        for _ in range(DEPTH)
    ]
    return params, rng.standard_normal((MLP_BATCH, WIDTH)).astype(np.float32)


def nx_layer(x, W1, W2):
    return x + nx.gelu(x @ W1) @ W2


def jax_layer(x, W1, W2):
    return x + jax.nn.gelu(x @ W1) @ W2


def make_mlp(layer):
    """The loss of the residual MLP built from ``layer`` (nablax tensors or JAX arrays)."""

    def loss(params, x):
        for W1, W2 in params:
            x = layer(x, W1, W2)
        return (x**2).mean()

    return loss


MLPS = {  # (nablax loss, JAX loss) per variant
    "plain": (make_mlp(nx_layer), make_mlp(jax_layer)),
    "ckpt": (make_mlp(nx.checkpoint(nx_layer)), make_mlp(jax.checkpoint(jax_layer))),
}


def _stats(compiled) -> dict[str, float]:
    """XLA's memory accounting of a compiled program, MB."""
    m = compiled.memory_analysis()
    d = {
        "args": m.argument_size_in_bytes / MB,
        "out": m.output_size_in_bytes / MB,
        "temp": m.temp_size_in_bytes / MB,
    }
    d["total"] = d["args"] + d["out"] + d["temp"] - m.alias_size_in_bytes / MB
    return d


def nx_compile_memory(loss_fn, params, x) -> tuple[dict[str, float], object]:
    """Memory of the program ``nx.compile(nx.value_and_grad(loss_fn))`` runs (its cached entry's
    ``jax.jit`` program: private attributes, read for this diagnosis only), and its result."""
    f = nx.compile(nx.value_and_grad(loss_fn))
    out = f(params, x)
    (entry,) = f._cache.values()
    arrays = [leaf._realized_value() for leaf in nx.tree.leaves((params, x))]
    return _stats(entry.fn.lower(*arrays, *entry.captured).compile()), out


def nx_eager_memory(loss_fn, params, x) -> tuple[list[dict[str, float]], object]:
    """Memory of each program eager ``nx.value_and_grad`` compiles (caches cleared), captured by
    wrapping the private ``nablax.core.realize._compile``, and the result."""
    from nablax.core import realize as realize_mod

    original = realize_mod._compile
    found: list[dict[str, float]] = []

    def capturing(*a, **kw):
        fn, compiled = original(*a, **kw), []

        def run(*args):
            if not compiled:
                compiled.append(fn.lower(*args).compile())
                found.append(_stats(compiled[0]))
            return compiled[0](*args)

        return run

    nx.clear_caches()
    realize_mod._compile = capturing
    try:
        p = Peer(nx.value_and_grad(loss_fn), (params, x))
        p.step()
        out = p.held[0]
        p.sync()
    finally:
        realize_mod._compile = original
        nx.clear_caches()
    return found, out


def _hwm_mb() -> float:
    """This process's peak RSS so far (``VmHWM``), MB."""
    with open("/proc/self/status") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("VmHWM:")) / 1024.0


def rss_child(variant: str) -> None:
    """In a fresh process: two eager steps of ``variant``; prints its peak RSS and the RSS after
    setup (weights created, XLA started), MB."""
    params_np, x_np = mlp_data()
    params = [(nx.tensor(a), nx.tensor(b)) for a, b in params_np]
    x = nx.tensor(x_np)
    (nx.ones((4, 4)) * 2.0).numpy()
    base = _hwm_mb()
    p = Peer(nx.value_and_grad(MLPS[variant][0]), (params, x))
    for _ in range(2):
        p.step()
        p.sync()
    print(json.dumps({"peak": _hwm_mb(), "base": base}))


def rss_subprocess(variant: str) -> dict[str, float]:
    """``rss_child`` in a fresh process. The peak is ``VmHWM`` (Linux), not ``getrusage``'s
    ``ru_maxrss``: on Linux that survives ``fork`` + ``exec``, so a child of this large process
    would report at least the parent's size."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = f"import sys; sys.path.insert(0, {here!r}); import bench_control_flow as b; "
    out = subprocess.run(
        [sys.executable, "-c", code + f"b.rss_child({variant!r})"],
        capture_output=True,
        text=True,
        check=True,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def _grad_diff(a: list, ref: list) -> float:
    return max(_max_rel(g, r) for g, r in zip(a, ref))


def checkpoint_case(rounds: int, rss: int) -> tuple[list[str], list[str], list[str]]:
    """Gradient agreement, memory and step times: (table lines, PASS/MISS lines, notes)."""
    params_np, x_np = mlp_data()
    args = {
        "nx": ([(nx.tensor(a), nx.tensor(b)) for a, b in params_np], nx.tensor(x_np)),
        "jax": ([(jnp.asarray(a), jnp.asarray(b)) for a, b in params_np], jnp.asarray(x_np)),
    }
    mem: dict[str, dict[str, float]] = {}
    grads: dict[str, list] = {}
    eager: dict[str, list[dict[str, float]]] = {}
    for tag, (nx_loss, jax_loss) in MLPS.items():
        eager[tag], out = nx_eager_memory(nx_loss, *args["nx"])
        grads[f"nablax {tag}"] = nx.tree.leaves(out[1])
        mem[f"nx.compile {tag}"], out = nx_compile_memory(nx_loss, *args["nx"])
        grads[f"nx.compile {tag}"] = nx.tree.leaves(out[1])
        jf = jax.jit(jax.value_and_grad(jax_loss))
        mem[f"jax.jit {tag}"] = _stats(jf.lower(*args["jax"]).compile())
        grads[f"jax.jit {tag}"] = jax.tree.leaves(jf(*args["jax"])[1])

    table = [
        "| program | arguments (MB) | outputs (MB) | temporaries (MB) | total (MB) |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = list(mem.items()) + [
        (f"nablax eager {tag}, program {i + 1}/{len(progs)}", m)
        for tag, progs in eager.items()
        for i, m in enumerate(progs)
    ]
    for k, m in rows:
        table.append(
            f"| {k} | " + " | ".join(f"{m[c]:.1f}" for c in ("args", "out", "temp", "total")) + " |"
        )

    ref = grads["jax.jit plain"]
    diffs = {k: _grad_diff(v, ref) for k, v in grads.items() if k != "jax.jit plain"}
    same = _grad_diff(grads["nablax ckpt"], grads["nablax plain"])
    lines = [
        f"{verdict(same <= 1e-5 and max(diffs.values()) <= 1e-4)} checkpoint gradients: eager "
        f"nablax with vs without nx.checkpoint max rel. diff {same:.1e}; against jax.jit (no "
        "checkpoint): " + ", ".join(f"{k} {v:.1e}" for k, v in diffs.items())
    ]
    for who in ("nx.compile", "jax.jit"):
        p, c = mem[f"{who} plain"]["temp"], mem[f"{who} ckpt"]["temp"]
        lines.append(
            f"{verdict(c < p)} checkpoint memory, {who} program: temporaries {c:.1f} MB with "
            f"checkpoint vs {p:.1f} MB without ({c / p:.2f}x)"
        )
    peak = {t: max(m["total"] for m in v) for t, v in eager.items()}
    held = {t: sum(m["out"] for m in v[:-1]) for t, v in eager.items()}
    lines.append(
        f"{verdict(peak['ckpt'] < peak['plain'])} checkpoint memory, eager nablax: largest program "
        f"footprint {peak['ckpt']:.1f} MB with checkpoint vs {peak['plain']:.1f} MB without "
        f"({peak['ckpt'] / peak['plain']:.2f}x; {len(eager['ckpt'])} and {len(eager['plain'])} "
        f"programs; outputs of the forward program held for the backward one: "
        f"{held['ckpt']:.1f} vs {held['plain']:.1f} MB)"
    )
    if rss:
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "ckpt": []}
        for _ in range(rss):  # alternate the variants; keep each one's lowest peak
            for v in runs:
                runs[v].append(rss_subprocess(v))
        r = {v: min(d, key=lambda e: e["peak"]) for v, d in runs.items()}
        lines.append(
            f"{verdict(r['ckpt']['peak'] < r['plain']['peak'])} checkpoint memory, peak RSS of a "
            f"fresh process (two eager nablax steps, lowest of {rss}): {r['ckpt']['peak']:.0f} MB "
            f"with checkpoint vs {r['plain']['peak']:.0f} MB without "
            f"({r['ckpt']['peak'] / r['plain']['peak']:.2f}x; growth past setup "
            f"{r['ckpt']['peak'] - r['ckpt']['base']:.0f} vs "
            f"{r['plain']['peak'] - r['plain']['base']:.0f} MB, XLA's compiler included; RSS also "
            "counts memory the allocator keeps and varies by 100 MB or more between runs)"
        )

    peers = {}  # step times: the price of recomputation
    for tag, (nx_loss, jax_loss) in MLPS.items():
        peers[f"nablax {tag}"] = Peer(nx.value_and_grad(nx_loss), args["nx"])
        peers[f"jax.jit {tag}"] = Peer(jax.jit(jax.value_and_grad(jax_loss)), args["jax"])
    for p in peers.values():
        p.step()
        p.sync()
    med, _ = med_best(time_blocks({k: (p.step, p.sync) for k, p in peers.items()}, rounds, 1))
    notes = [
        f"- checkpoint step time (value_and_grad, median of {rounds}): "
        + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in med.items())
        + f"; recomputation costs nablax {med['nablax ckpt'] / med['nablax plain']:.2f}x, "
        f"jax {med['jax.jit ckpt'] / med['jax.jit plain']:.2f}x"
    ]
    return table, lines, notes


# ---- report ----------------------------------------------------------------------------------


def _md(header: list[str], rows: list[list[str]], align: str) -> None:
    """Print a markdown table; ``align`` has an ``l`` or ``r`` per column."""
    print("| " + " | ".join(header) + " |")
    print("|" + "".join("---|" if a == "l" else "---:|" for a in align))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    print(flush=True)


def report_scan(rounds: int, summary: list[str]) -> None:
    """Case 1: agreement, then the timing table."""
    data = rnn_data()
    agree, agree_ok = scan_agreement(data)
    for line in agree:
        print(f"- {line}", flush=True)
    summary.append(
        f"{verdict(agree_ok)} scan correctness: eager nablax and nx.compile equal jax.jit (loss "
        "rel. 1e-5, gradients rel. 1e-4)"
    )
    rows = []
    for kind, label, block in (("fwd", "forward", 2), ("vg", "forward+backward", 1)):
        med, best = scan_speed(data, kind, rounds, block)
        first = first_calls(data, kind)
        for what, d in (("median", med), ("best block", best), ("first call", first)):
            ratio = "; ".join(f"{k} {d[k] / d['jax.jit']:.2f}x" for k in PEERS[:2])
            rows.append(
                [f"scan {label}, {what} (ms)"] + [_fmt(d[k] * 1e3) for k in PEERS] + [ratio]
            )
        for k in PEERS[:2]:
            r = med[k] / med["jax.jit"]
            summary.append(
                f"{verdict(r <= SCAN_TARGET)} scan {label}, {k}: {med[k] * 1e3:.1f} ms = {r:.2f}x "
                f"jax.jit {med['jax.jit'] * 1e3:.1f} ms (target <= {SCAN_TARGET}x; median of "
                f"{rounds} blocks of {block}, best blocks {best[k] / best['jax.jit']:.2f}x)"
            )
    print()
    _md(["case", *PEERS, "vs jax.jit"], rows, "lrrrl")


def report_build(reps: int, summary: list[str]) -> None:
    """Case 2: graph building per trip count."""
    builds = build_times(reps)
    rows = []
    for kind, label in (("fwd", "forward"), ("vg", "value_and_grad")):
        for i, what in ((0, "first call"), (1, f"median of {reps}")):
            rows.append(
                [f"{label}, {what}"] + [f"{builds[(kind, n)][i] * 1e3:.3f}" for n in BUILD_LENGTHS]
            )
        ms = [builds[(kind, n)][1] * 1e3 for n in BUILD_LENGTHS]
        under, flat = max(ms) <= BUILD_TARGET_MS, ms[-1] <= max(1.25 * ms[0], ms[0] + 0.1)
        summary.append(
            f"{verdict(under and flat)} scan graph building, {label}: "
            + ", ".join(f"{n} steps {v:.3f} ms" for n, v in zip(BUILD_LENGTHS, ms))
            + f" (target <= {BUILD_TARGET_MS:g} ms: {'met' if under else 'missed'}; independent "
            f"of the trip count: {'yes' if flat else 'no'}, 1000/10 steps {ms[-1] / ms[0]:.2f}x)"
        )
    _md(["graph building, eager nablax (ms)", *map(str, BUILD_LENGTHS)], rows, "lrrr")


def report_unrolled(fwd_steps: int, steady: int, summary: list[str], notes: list[str]) -> None:
    """Case 3: the unrolled Python loop against scan, eager nablax."""
    rows = []
    for label, steps, fns in (
        ("forward", fwd_steps, (nx_rnn_unrolled, nx_rnn)),
        ("forward+backward", UNROLL_BWD_STEPS, (_nx_unrolled_vg, _nx_rnn_vg)),
    ):
        d = rnn_data(steps)
        a = tuple(nx.tensor(d[k]) for k in ("W", "U", "b", "xs"))
        u, s = (eager_profile(fn, a, steady) for fn in fns)
        rel = abs(u["value"] - s["value"]) / abs(s["value"])
        summary.append(
            f"{verdict(rel <= 1e-5)} unrolled loop equals scan, {label} {steps} steps: loss rel. "
            f"diff {rel:.1e}"
        )
        for name, r in (("unrolled loop", u), ("nx.scan", s)):
            rows.append(
                [f"{label}, {steps} steps", name]
                + [_fmt(r[c] * 1e3) for c in ("first_build", "first_total")]
                + [str(r["compiles"])]
                + [_fmt(r[c] * 1e3) for c in ("build", "total")]
            )
        notes.append(
            f"- {label}, {steps} steps: the unrolled loop's first call takes "
            f"{u['first_total'] / s['first_total']:.1f}x the scan's, a steady call "
            f"{u['total'] / s['total']:.1f}x, graph building {u['build'] / s['build']:.0f}x"
        )
        print(f"case 3 {label} done", flush=True)
    notes.append(
        "- the unrolled loop's first build includes the realizations its graph depth forces "
        f"(nx.config.max_graph_depth {nx.config.max_graph_depth}: parts of the graph are compiled "
        "and run while it is built); 'programs' counts every XLA program of the first call"
    )
    print()
    header = ["eager nablax", "version", "build, first (ms)", "first call (ms)", "programs"]
    _md(header + ["build, steady (ms)", "call, steady (ms)"], rows, "llrrrrr")


def main(argv: list[str] | None = None) -> int:
    """Run every case and print the tables; return 0 (missed targets are reported, not fatal)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer blocks, 200-step unrolled loop")
    p.add_argument("--blocks", type=int, help="timed blocks per peer (default 20; 3 with --quick)")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS subprocesses")
    args = p.parse_args(argv)
    t_start = time.perf_counter()
    print(environment(), flush=True)
    print(threads(), flush=True)
    print(
        f"RNN h = tanh(h @ W + x_t @ U + b): {STEPS} steps, hidden {HIDDEN}, batch {BATCH}, "
        f"input {IN}, float32; loss mean(h**2) + mean(ys**2)",
        flush=True,
    )
    summary: list[str] = []
    notes: list[str] = []
    report_scan(args.blocks or (3 if args.quick else 20), summary)
    report_build(10 if args.quick else 30, summary)
    report_unrolled(200 if args.quick else STEPS, 2 if args.quick else 4, summary, notes)
    if args.quick:
        notes.append(f"- --quick: the unrolled forward loop has 200 steps ({STEPS} without)")
    table, lines, ck_notes = checkpoint_case(
        2 if args.quick else 4, 0 if args.no_rss else 1 if args.quick else 2
    )
    print(
        f"checkpoint: {DEPTH} layers x + gelu(x @ W1) @ W2, width {WIDTH}, hidden "
        f"{EXPAND * WIDTH}, batch {MLP_BATCH}; value_and_grad w.r.t. every weight"
    )
    print("\n".join(table))
    print()
    for line in summary + lines + notes + ck_notes:
        print(line)
    warn = load_warning()
    if warn:
        print(f"- warning: {warn}")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

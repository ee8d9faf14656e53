"""Helpers shared by the benchmark scripts (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import cProfile
import gc
import io
import os
import platform
import pstats
import statistics
import time
from collections.abc import Callable

import jax
import numpy as np

import nablax as nx
from nablax.core import cpu_threads, gc_threshold, graph, host_memory


def environment(torch_module=None) -> str:
    """One line naming the machine, its current load and the library versions."""
    tv = torch_module.__version__ if torch_module is not None else "not installed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"python {platform.python_version()}, jax {jax.__version__} "
        f"({jax.default_backend()}), numpy {np.__version__}, torch {tv}, "
        f"{platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}, "
        f"interpreter speed {interpreter_us():.1f} us per sum(range(1000)), "
        f"graph walks {'compiled' if graph.COMPILED else 'pure Python'}"
    )


def interpreter_us() -> float:
    """This machine's Python speed now: the median µs of ``sum(range(1000))`` over 30 runs.
    Shared 2-core machines vary by up to 2x from day to day; graph-building figures (pure
    Python) scale with it, so a reader can compare runs (the build targets were set where this
    read about 15.7 µs)."""
    ts = []
    for _ in range(30):
        t0 = time.perf_counter()
        for _ in range(10):
            sum(range(1000))
        ts.append((time.perf_counter() - t0) / 10)
    return statistics.median(ts) * 1e6


def xla_cpu_threads() -> int | None:
    """Size of XLA's CPU intra-op (Eigen) thread pool, counted from this process's thread names
    (Linux only; call after JAX has run a computation). ``None`` if unknown."""
    return len(cpu_threads.pool_threads()) or None


def threads(torch_module=None) -> str:
    """One line stating the thread counts each backend computes with."""
    jax.block_until_ready(jax.numpy.ones((64, 64)) @ jax.numpy.ones((64, 64)))  # starts the pool
    # nablax's scheduling policy for that pool (core/cpu_threads.py), set now rather than at
    # nablax's first compile, so that every peer's epochs, jax.jit's included, run under it
    cpu_threads.apply()
    pool = cpu_threads.pool_threads()
    if pool:
        batch = sum(1 for t in pool if os.sched_getscheduler(t) == os.SCHED_BATCH)
        policy = "SCHED_BATCH" if batch == len(pool) else "normal" if not batch else "mixed"
        xla = (
            f"{len(pool)} (counted; policy {policy}, nablax option batch_xla_threads="
            f"{nx.config.batch_xla_threads}, the same threads for jax.jit)"
        )
    else:
        xla = "unknown"
    parts = [f"XLA CPU intra-op threads {xla}"]
    if torch_module is not None:
        parts.append(
            f"torch intra-op threads {torch_module.get_num_threads()} "
            f"(inter-op {torch_module.get_num_interop_threads()})"
        )
    # nablax's host-memory setting (core/host_memory.py), also set now for every peer
    retained = host_memory.apply() or host_memory._state["applied"]
    parts.append(
        f"host memory: glibc thresholds {'raised' if retained else 'default'} (nablax option "
        f"retain_host_memory={nx.config.retain_host_memory}, process-wide: every peer)"
    )
    # nablax's garbage-collector setting (core/gc_threshold.py), also set now for every peer
    gc_threshold.apply()
    parts.append(
        f"Python gc thresholds {gc.get_threshold()} (nablax option gc_threshold="
        f"{nx.config.gc_threshold}, process-wide: every peer)"
    )
    flags = os.environ.get("XLA_FLAGS")
    if flags:
        parts.append(f"XLA_FLAGS={flags!r}")
    return "threads: " + ", ".join(parts)


def fmt(v: float | None) -> str:
    """A table cell: 3 significant digits, no more decimals than useful, an em dash for None."""
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"


def time_blocks(
    peers: dict[str, tuple[Callable[[], object], Callable[[], object]]],
    rounds: int,
    block: int,
    settle_s: float = 0.01,
    warm: int = 0,
) -> dict[str, list[float]]:
    """Seconds per step of each timed block, per peer.

    ``peers[name] = (step, sync)``: a block is ``block`` calls of ``step()`` followed by one
    ``sync()``, which must return only when everything the steps computed is ready (every updated
    parameter), so asynchronous work is charged to the peer that caused it. The peers take turns,
    one block each per round, in an order rotated every round (no peer always runs right after the
    same one), so load from other processes hits them alike. Before each block the script sleeps
    ``settle_s`` (untimed): thread pools that spin-wait after their last task (PyTorch's OpenMP
    workers) go idle instead of competing with the next peer's clock. ``warm`` untimed blocks of
    the same peer run right before each timed one (after the sleep): the timed block then sees that
    peer's own steady state (its threads awake, its data in the caches), not the state the previous
    peer left behind.
    """
    names = list(peers)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            step, sync = peers[name]
            if settle_s:
                time.sleep(settle_s)
            for _ in range(warm * block):
                step()
            if warm:
                sync()
            t0 = time.perf_counter()
            for _ in range(block):
                step()
            sync()
            times[name].append((time.perf_counter() - t0) / block)
    return times


def med_best(times: dict[str, list[float]]) -> tuple[dict[str, float], dict[str, float]]:
    """The median and the minimum of each peer's block times."""
    return (
        {k: statistics.median(v) for k, v in times.items()},
        {k: min(v) for k, v in times.items()},
    )


def verdict(ok: bool) -> str:
    """``PASS`` or ``MISS``, the word every target line starts with."""
    return "PASS" if ok else "MISS"


def load_warning() -> str | None:
    """A note when other processes compete for the CPU (load average above the core count)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load > 0.75 * (os.cpu_count() or 1):
        return (
            f"load average {load:.1f} on {os.cpu_count()} cores: other processes compete for the "
            "CPU, so medians are noisy (compare the best-of-blocks figures too)"
        )
    return None


def profile(run: Callable[[], None], top: int) -> str:
    """cProfile of ``run()``: the top ``top`` functions by own time, then by cumulative time."""
    prof = cProfile.Profile()
    prof.enable()
    run()
    prof.disable()
    out = io.StringIO()
    stats = pstats.Stats(prof, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def jax_mlp_loss(params, x, y):
    """Softmax cross-entropy of a ReLU MLP in JAX: ``params`` a list of ``(w, b)`` with weights
    in PyTorch's ``(out, in)`` layout, integer labels ``y`` (the reference of the training benches)."""
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w.T + b)
    w, b = params[-1]
    logp = jax.nn.log_softmax(h @ w.T + b, axis=-1)
    return -jax.numpy.mean(jax.numpy.take_along_axis(logp, y[:, None], axis=1))

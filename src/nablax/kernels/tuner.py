"""``Tuner``: time every candidate config on compiled, synchronized runs and pick the fastest.

Each candidate is compiled ahead of time (``jax.jit(...).lower(...).compile()``) and run
``warmup`` times; then ``iters`` rounds time every candidate once each, taking turns, with
``block_until_ready`` after each run. A candidate's score is its median, with the spread (90th
minus 10th percentile) reported beside it. Timing always happens on
concrete arrays: the call's own arrays when they are concrete, or synthetic arrays of the same
shapes and dtypes when the executor was called under tracing (``jax.jit``, ``jax.grad``, ...) or
with lazy nablax Tensors, so a trace is never what gets timed. A candidate that fails to compile or
run scores ``inf``; the failure is reported as a warning and kept in the result (and stored by the
caller), never skipped silently. When tuning takes longer than a second a progress line is written
to stderr. ``budget_s`` bounds one tuning: candidates left when it is spent are recorded as not
timed (``inf``, with the reason).

>>> import dataclasses, jax.numpy as jnp
>>> from nablax.kernels import Kernel, Invocation, Tuner
>>> @dataclasses.dataclass(frozen=True)
... class Reps:
...     n: int
>>> class Repeat(Kernel):
...     def run(self, x, *, cfg):
...         for _ in range(cfg.n):
...             x = jnp.sin(x)
...         return x
>>> k = Repeat("repeat")
>>> inv = Invocation(k.versioned_id, (jnp.ones((256, 256)),), {})
>>> result = Tuner(warmup=1, iters=3).tune(k, inv, [Reps(200), Reps(1)])
>>> result.best
Reps(n=1)
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from .invocation import Invocation, _is_array, array_desc


@dataclasses.dataclass(frozen=True)
class CandidateTiming:
    """One candidate's score: median and spread in seconds (``inf`` when it failed)."""

    cfg: Any
    median_s: float
    spread_s: float
    error: str | None = None


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The fastest config (None when every candidate failed) and every candidate's timing."""

    best: Any
    timings: tuple[CandidateTiming, ...]
    synthetic: bool
    elapsed_s: float


class Tuner:
    """Times candidate configs (see the module docstring).

    ``warmup`` untimed runs and ``iters`` timed runs per candidate; ``budget_s`` seconds at most
    per tuning (the first candidate is always timed); ``progress``: True/False, or None to show a
    progress line on stderr once tuning has taken over a second; ``min_gain``: how much faster
    (0.03 = 3 %) a candidate must be to replace the baseline (see :meth:`tune`).
    """

    def __init__(
        self,
        warmup: int = 2,
        iters: int = 10,
        budget_s: float = 60.0,
        progress: bool | None = None,
        min_gain: float = 0.03,
    ) -> None:
        if warmup < 0 or iters < 1 or budget_s <= 0:
            raise ValueError(
                f"nablax.kernels.Tuner: need warmup >= 0, iters >= 1 and budget_s > 0, got "
                f"warmup={warmup}, iters={iters}, budget_s={budget_s}"
            )
        self.warmup, self.iters, self.budget_s, self.progress = warmup, iters, budget_s, progress
        self.min_gain = min_gain

    def tune(
        self, kernel: Any, inv: Invocation, candidates: Sequence[Any], baseline: Any = None
    ) -> TuneResult:
        """Time ``candidates`` for ``inv`` and return the fastest (ties: the earlier).

        ``baseline`` (the heuristic's config, timed too) is kept unless the fastest candidate
        beats it by more than ``min_gain`` in the median of the per-round ratios and in at least
        three rounds out of four: a noisy machine then never swaps a good default for one that
        only looked faster.
        """
        candidates = list(dict.fromkeys(candidates))  # unique, in order
        if baseline is not None and baseline not in candidates:
            candidates.append(baseline)
        start = time.perf_counter()
        bar = _Progress(kernel.versioned_id, len(candidates), self.progress, start)
        with jax.ensure_compile_time_eval():  # run for real even inside an enclosing trace
            arrays, synthetic = _concrete_arrays(inv)
            compiled, failed = self._compile_all(kernel, inv, candidates, arrays, start, bar)
            times = self._rounds(compiled, arrays, start)
        bar.close()
        timings = []
        for cfg in candidates:
            if cfg in failed:
                timings.append(CandidateTiming(cfg, math.inf, math.inf, failed[cfg]))
                continue
            ts = sorted(times[cfg])
            spread = float(np.percentile(ts, 90) - np.percentile(ts, 10))
            timings.append(CandidateTiming(cfg, float(np.median(ts)), spread))
        _report_failures(kernel, inv, timings)
        finite = [t for t in timings if math.isfinite(t.median_s)]
        best = min(finite, key=lambda t: t.median_s).cfg if finite else None
        if best is not None and baseline in times and best != baseline:
            if not self._clearly_faster(times[best], times[baseline]):
                best = baseline
        return TuneResult(best, tuple(timings), synthetic, time.perf_counter() - start)

    def _clearly_faster(self, fast: list[float], base: list[float]) -> bool:
        ratios = [f / b for f, b in zip(fast, base) if b > 0]
        if not ratios:
            return False
        wins = sum(r < 1.0 for r in ratios)
        return float(np.median(ratios)) < 1.0 - self.min_gain and wins >= 0.75 * len(ratios)

    def _compile_all(self, kernel, inv, candidates, arrays, start, bar) -> tuple[dict, dict]:
        """Compile each candidate and run it ``warmup`` times (at least once, which also checks
        that it runs); failures and candidates past the budget are returned with the reason."""
        from ._call import CallSpec

        compiled: dict = {}
        failed: dict = {}
        for n, cfg in enumerate(candidates):
            if n and time.perf_counter() - start > self.budget_s:
                failed[cfg] = f"not timed: tuning budget of {self.budget_s:g} s spent"
                continue
            try:
                fn = jax.jit(CallSpec(kernel, inv, cfg).plain).lower(*arrays).compile()
                for _ in range(max(self.warmup, 1)):
                    jax.block_until_ready(fn(*arrays))
                compiled[cfg] = fn
            except Exception as e:  # noqa: BLE001 - a failing candidate is data, reported below
                failed[cfg] = f"{type(e).__name__}: {e}"[:500]
            bar.update(n + 1, len(compiled))
        return compiled, failed

    def _rounds(self, compiled: dict, arrays: list, start: float) -> dict:
        """``iters`` rounds, each timing every candidate once: taking turns spreads the machine's
        load changes over all candidates instead of penalizing whichever ran during a spike."""
        times: dict = {cfg: [] for cfg in compiled}
        for r in range(self.iters):
            for cfg, fn in compiled.items():
                times[cfg].append(self.time_once(fn, arrays, cfg))
            if r >= 2 and time.perf_counter() - start > self.budget_s:
                break
        return times

    def time_once(self, compiled: Any, arrays: list, cfg: Any) -> float:
        """Seconds of one synchronized run of ``compiled(*arrays)``. Tests override this to feed
        deterministic times."""
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*arrays))
        return time.perf_counter() - t0


def _concrete_arrays(inv: Invocation) -> tuple[list, bool]:
    """The call's array leaves when they are concrete jax arrays, else synthetic ones."""
    leaves = jax.tree_util.tree_leaves((inv.args, inv.kwargs))
    arrays = [x for x in leaves if _is_array(x) and not isinstance(x, np.generic)]
    if all(isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer) for x in arrays):
        try:
            if all(x.is_fully_addressable for x in arrays):
                return arrays, False
        except AttributeError:  # pragma: no cover - older jax arrays
            return arrays, False
    rng = np.random.default_rng(0)
    return [jax.device_put(_synthetic(x, rng)) for x in arrays], True


def _synthetic(x: Any, rng: np.random.Generator) -> np.ndarray:
    shape, dtype = tuple(int(d) for d in x.shape), np.dtype(x.dtype)
    if np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.complexfloating):
        return rng.standard_normal(shape).astype(dtype)
    if dtype == np.bool_:
        return np.zeros(shape, dtype)
    return rng.integers(0, 2, size=shape).astype(dtype)


def _report_failures(kernel: Any, inv: Invocation, timings: list[CandidateTiming]) -> None:
    failed = [t for t in timings if t.error is not None and not t.error.startswith("not timed")]
    if failed:
        lines = "; ".join(f"{t.cfg}: {t.error.splitlines()[0][:200]}" for t in failed)
        warnings.warn(
            f"nablax.kernels.Tuner: {len(failed)} of {len(timings)} candidate config(s) of "
            f"{kernel.versioned_id} failed for ({inv.signature}) and scored inf: {lines}",
            RuntimeWarning,
            stacklevel=4,
        )


class _Progress:
    """A progress line on stderr, shown once tuning has run for a second (or always/never)."""

    def __init__(self, name: str, total: int, mode: bool | None, start: float) -> None:
        self.name, self.total, self.mode, self.start = name, total, mode, start
        self.shown = False
        self.tty = sys.stderr.isatty()

    def update(self, done: int, ok: int) -> None:
        elapsed = time.perf_counter() - self.start
        if self.mode is False or (self.mode is None and elapsed < 1.0):
            return
        width = 20
        filled = int(width * done / max(self.total, 1))
        line = (
            f"nablax tune {self.name} [{'#' * filled}{'.' * (width - filled)}] compiled "
            f"{done}/{self.total} ({done - ok} failed) {elapsed:.1f}s"
        )
        print(("\r" + line) if self.tty else line, end="" if self.tty else "\n", file=sys.stderr)
        self.shown = True

    def close(self) -> None:
        if self.shown and self.tty:
            print(file=sys.stderr)


def describe_arrays(inv: Invocation) -> str:
    leaves = jax.tree_util.tree_leaves((inv.args, inv.kwargs))
    return ", ".join(array_desc(x) for x in leaves if _is_array(x))

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

**Training calls.** A kernel whose class sets ``tune_grad = True`` (the bundled attention) is tuned
on forward plus backward when the call needs a gradient: when its arrays are JAX autodiff tracers
(the executor called under ``jax.grad``, ``jax.vjp``, ``jax.value_and_grad``). The timed function
is then ``jax.vjp`` of the kernel's custom-VJP call with its cotangent, exactly what training runs,
and the winner is stored under its own key (:func:`tuning_key`), beside the forward-only one.

The baseline rule (see :meth:`Tuner.tune`): the heuristic's config is timed beside the candidates
and kept unless a candidate is clearly faster, by more than ``min_gain``; ``min_gain=0`` means the
fastest candidate wins. ejKernel's entry points are here too: :meth:`Tuner.measure` (seconds per
call of a function) and :meth:`Tuner.autotune` (the fastest of ``make_fn(cfg)`` over candidates).

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

import contextlib
import dataclasses
import math
import sys
import time
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import jax
import numpy as np
from jax._src import core as _jax_core  # eval_context: see outside_traces
from jax._src.interpreters import ad as _jax_ad  # autodiff tracer types: see wants_grad

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
    objective: str = "forward"  # or "forward+backward" (see the module docstring)


class Tuner:
    """Times candidate configs (see the module docstring).

    ``warmup`` untimed runs and ``iters`` timed runs per candidate; ``budget_s`` seconds at most
    per tuning (the first candidate is always timed); ``progress``: True/False, or None to show a
    progress line on stderr once tuning has taken over a second; ``min_gain``: how much faster
    (0.03 = 3 %) a candidate must be to replace the baseline, 0 for "the fastest candidate wins"
    (see :meth:`tune`; ``AutotunePolicy(min_gain=...)`` overrides it per chain or scope).

    Besides :meth:`tune` (what the selection chain calls), it offers ejKernel's two entry points,
    :meth:`measure` and :meth:`autotune`, with the same safeguards.
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
                f"warmup={warmup}, iters={iters}, budget_s={budget_s}. Fix: e.g. "
                f"Tuner(warmup=2, iters=10, budget_s=60)"
            )
        self.warmup, self.iters, self.budget_s, self.progress = warmup, iters, budget_s, progress
        self.min_gain = check_min_gain(min_gain, "Tuner", allow_none=False)

    def tune(
        self,
        kernel: Any,
        inv: Invocation,
        candidates: Sequence[Any],
        baseline: Any = None,
        min_gain: float | None = None,
        grad: bool | None = None,
    ) -> TuneResult:
        """Time ``candidates`` for ``inv`` and return the fastest (ties: the earlier).

        ``grad``: time forward plus backward (True), the forward alone (False), or decide by
        :func:`wants_grad` (None: a ``tune_grad`` kernel called under differentiation).

        The baseline rule: ``baseline`` (the heuristic's config; the chain passes it) is timed too
        and kept unless the fastest candidate beats it by more than ``min_gain`` (this tuner's
        ``min_gain`` when None) in the median of the per-round time ratios and in at least three
        rounds out of four: a noisy machine then never swaps a good default for one that only
        looked faster. ``min_gain=0`` turns the rule off: the fastest candidate by median wins, and
        the baseline is not timed unless it is one of the candidates.
        """
        gain = self.min_gain if min_gain is None else check_min_gain(min_gain, "Tuner.tune")
        from ._call import CallSpec

        grad = wants_grad(kernel, inv) if grad is None else bool(grad)

        def build(cfg: Any) -> Any:
            spec = CallSpec(kernel, inv, cfg, inv.call_key)
            return _forward_backward(spec.forward()) if grad else spec.tune_fn()

        with outside_traces():  # concrete arrays even inside an enclosing trace
            arrays, synthetic = _concrete_arrays(inv)
        name = f"{kernel.versioned_id} for ({inv.signature})" + (
            " forward+backward" if grad else ""
        )
        result = self._run(kernel.versioned_id, name, candidates, build, arrays, synthetic,
                           baseline if gain > 0 else None, gain)  # fmt: skip
        return dataclasses.replace(result, objective="forward+backward") if grad else result

    def measure(self, fn: Any, *args: Any, **kwargs: Any) -> float:
        """Seconds one call of ``fn(*args, **kwargs)`` takes: the median of ``iters`` synchronized
        runs of ``jax.jit(fn)`` compiled ahead of time, after ``warmup`` runs (ejKernel's
        ``Tuner.measure``). Array leaves of the arguments are the jitted function's inputs, other
        leaves are constants. Tracers (a call under ``jax.jit``) and ``jax.ShapeDtypeStruct``s are
        replaced by concrete arrays of the same shape and dtype, so a trace is never what is timed.

        >>> import jax.numpy as jnp
        >>> from nablax.kernels import Tuner
        >>> t = Tuner(warmup=1, iters=3).measure(lambda a, *, k: jnp.tanh(a) * k, jnp.ones(64), k=2)
        >>> 0.0 < t < 1.0
        True
        """
        with outside_traces():
            arrays, rebuild, _ = _split_call(args, kwargs)
            compiled = jax.jit(_calling(fn, rebuild)).lower(*arrays).compile()
            for _ in range(self.warmup):
                jax.block_until_ready(compiled(*arrays))
            times = [self.time_once(compiled, arrays, None) for _ in range(self.iters)]
        return float(np.median(times))

    def autotune(
        self,
        make_fn: Any,
        args: tuple,
        kwargs: dict,
        candidates: Any,
        *,
        baseline: Any = None,
        min_gain: float | None = None,
    ) -> Any:
        """The fastest of ``candidates`` for ``make_fn(cfg)(*args, **kwargs)`` (ejKernel's
        ``Tuner.autotune``), or None when every candidate failed (each failure is reported in a
        ``RuntimeWarning``). Candidates are compiled ahead of time and timed in interleaved rounds
        on concrete arrays, within ``budget_s``, as in :meth:`tune`, whose baseline rule applies
        when ``baseline`` is given. A subclass that overrides :meth:`measure` (ejKernel's extension
        point) is timed by its ``measure``, one call per candidate.

        >>> import jax, jax.numpy as jnp
        >>> from nablax.kernels import Tuner
        >>> def make_fn(n):                   # config: how many tanh steps (same shapes)
        ...     return lambda x: jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ y), x)
        >>> Tuner(warmup=1, iters=3).autotune(make_fn, (jnp.eye(64),), {}, [2000, 2])
        2
        """
        candidates = list(candidates)
        if not candidates:
            raise ValueError(
                "nablax.kernels.Tuner.autotune: candidates is empty. Fix: pass at least one config"
            )
        if not callable(make_fn):
            raise TypeError(
                f"nablax.kernels.Tuner.autotune: make_fn must be a callable cfg -> function, got "
                f"{type(make_fn).__name__}. Fix: pass e.g. lambda cfg: functools.partial(run, "
                f"cfg=cfg)"
            )
        if type(self).measure is not Tuner.measure:
            return self._autotune_by_measure(make_fn, args, kwargs, candidates)
        gain = self.min_gain if min_gain is None else check_min_gain(min_gain, "Tuner.autotune")
        with outside_traces():
            arrays, rebuild, synthetic = _split_call(args, kwargs)

        def build(cfg: Any) -> Any:
            return _calling(make_fn(cfg), rebuild)

        fn_name = getattr(make_fn, "__qualname__", type(make_fn).__name__)
        name = f"{fn_name} for ({', '.join(array_desc(a) for a in arrays)})"
        result = self._run(fn_name, name, candidates, build, arrays, synthetic,
                           baseline if gain > 0 else None, gain)  # fmt: skip
        return result.best

    def _autotune_by_measure(self, make_fn, args, kwargs, candidates) -> Any:
        best, best_t, failed = None, math.inf, []
        for cfg in dict.fromkeys(candidates):
            try:
                t = float(self.measure(make_fn(cfg), *args, **kwargs))
            except Exception as e:  # noqa: BLE001 - a failing candidate is data, reported below
                failed.append(f"{cfg}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
                continue
            if t < best_t:
                best, best_t = cfg, t
        if failed:
            warnings.warn(
                f"nablax.kernels.Tuner.autotune: {len(failed)} of {len(candidates)} candidate "
                f"config(s) failed and scored inf: {'; '.join(failed)}",
                RuntimeWarning,
                stacklevel=3,
            )
        return best

    def _run(self, label, name, candidates, build, arrays, synthetic, baseline, gain):
        """Compile, time in rounds and pick (the engine of ``tune`` and ``autotune``)."""
        candidates = list(dict.fromkeys(candidates))  # unique, in order
        if baseline is not None and baseline not in candidates:
            candidates.append(baseline)
        start = time.perf_counter()
        bar = _Progress(label, len(candidates), self.progress, start)
        with outside_traces():  # compiled and timed as the executor runs it, see outside_traces
            compiled, failed = self._compile_all(build, candidates, arrays, start, bar)
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
        _report_failures(name, timings)
        finite = [t for t in timings if math.isfinite(t.median_s)]
        best = min(finite, key=lambda t: t.median_s).cfg if finite else None
        if best is not None and baseline in times and best != baseline:
            if not self._clearly_faster(times[best], times[baseline], gain):
                best = baseline
        return TuneResult(best, tuple(timings), synthetic, time.perf_counter() - start)

    @staticmethod
    def _clearly_faster(fast: list[float], base: list[float], gain: float) -> bool:
        ratios = [f / b for f, b in zip(fast, base) if b > 0]
        if not ratios:
            return False
        wins = sum(r < 1.0 for r in ratios)
        return float(np.median(ratios)) < 1.0 - gain and wins >= 0.75 * len(ratios)

    def _compile_all(self, build, candidates, arrays, start, bar) -> tuple[dict, dict]:
        """Compile each candidate and run it ``warmup`` times (at least once, which also checks
        that it runs); failures and candidates past the budget are returned with the reason."""
        compiled: dict = {}
        failed: dict = {}
        for n, cfg in enumerate(candidates):
            if n and time.perf_counter() - start > self.budget_s:
                failed[cfg] = f"not timed: tuning budget of {self.budget_s:g} s spent"
                continue
            try:
                fn = jax.jit(build(cfg)).lower(*arrays).compile()
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
        """Seconds of one synchronized run of ``compiled(*arrays)`` (``cfg`` is None when called
        from :meth:`measure`). Tests override this to feed deterministic times."""
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*arrays))
        return time.perf_counter() - t0


@contextlib.contextmanager
def outside_traces() -> Iterator[None]:
    """Run JAX operations for real even when the caller is inside a trace (the executor called
    under ``jax.jit`` or ``jax.grad``), while functions traced *inside* the block (``jax.jit(fn)
    .lower``, a ``pallas_call``'s kernel body) are staged exactly as they are outside it.

    ``jax.ensure_compile_time_eval()`` is not that: it constant-folds every operation with
    constant inputs, nested traces included, so a Pallas kernel body traced under it evaluates
    ``pl.program_id`` (no evaluation rule) or captures its ``jnp.zeros`` accumulator as a constant,
    and every Pallas candidate failed to compile. This context only resets the current trace to
    JAX's evaluation trace.

    >>> import jax, jax.numpy as jnp
    >>> @jax.jit
    ... def f(x):
    ...     with outside_traces():
    ...         concrete = jnp.ones(3) * 2
    ...     return x + concrete.sum()
    >>> float(f(1.0))
    7.0
    """
    with _jax_core.eval_context():
        yield


# JAX's autodiff tracers: a kernel called with them is inside jax.grad / jax.vjp / jax.jvp
# (LinearizeTracer is what reverse mode uses since JAX's direct linearization; JVPTracer before).
_AD_TRACERS = tuple(
    t for t in (getattr(_jax_ad, "LinearizeTracer", None), getattr(_jax_ad, "JVPTracer", None)) if t
)


# Set by the layer above (nablax core, through executor.register_tensor_type): whether a lazy
# tensor argument is differentiated (inside nx.grad), as a JAX autodiff tracer is under jax.grad.
_tensor_differentiated: Any = None


def set_tensor_differentiated(pred: Any) -> None:
    """Let :func:`wants_grad` see that a lazy tensor argument is being differentiated."""
    global _tensor_differentiated
    _tensor_differentiated = pred


def differentiated(leaves: Any) -> bool:
    """Whether any of ``leaves`` is being differentiated: a JAX autodiff tracer, or a lazy tensor
    the layer above reports (:func:`set_tensor_differentiated`)."""
    pred = _tensor_differentiated
    for x in leaves:
        if isinstance(x, _AD_TRACERS) or (pred is not None and pred(x)):
            return True
    return False


def wants_grad(kernel: Any, inv: Invocation) -> bool:
    """Whether tuning ``inv`` times forward plus backward: the kernel opts in (``tune_grad =
    True``) and an array of the call is a JAX autodiff tracer (called under ``jax.grad``) or a
    nablax tensor differentiated by ``nx.grad``.

    >>> import jax, jax.numpy as jnp
    >>> from nablax.kernels import Invocation, library
    >>> inv = Invocation("attention@v1", (jnp.ones((1, 2, 1, 4)),) * 3, {})
    >>> wants_grad(library.ATTENTION, inv)
    False
    >>> seen = []
    >>> def f(q):
    ...     seen.append(wants_grad(library.ATTENTION, Invocation("attention@v1", (q, q, q), {})))
    ...     return q.sum()
    >>> _ = jax.grad(f)(jnp.ones((1, 2, 1, 4)))
    >>> seen
    [True]
    """
    if not getattr(kernel, "tune_grad", False):
        return False
    return differentiated(jax.tree_util.tree_leaves((inv.args, inv.kwargs)))


def tuning_key(kernel: Any, inv: Invocation) -> str:
    """The cache key a tuned config of ``inv`` is stored under: the call key, with
    ``":fwd+bwd"`` appended when the tuning times forward plus backward (:func:`wants_grad`).

    >>> import jax.numpy as jnp
    >>> from nablax.kernels import Invocation, library
    >>> inv = Invocation("attention@v1", (jnp.ones((1, 2, 1, 4)),) * 3, {})
    >>> tuning_key(library.ATTENTION, inv) == inv.call_key
    True
    """
    return inv.call_key + ":fwd+bwd" if wants_grad(kernel, inv) else inv.call_key


def _forward_backward(forward: Any) -> Any:
    """``f(*arrays) -> (out, grads)``: the call and its backward pass with a cotangent of ones,
    differentiated with respect to the floating-point arrays (what a training step runs)."""
    import jax.numpy as jnp

    def f(*arrays: Any) -> Any:
        diff = [i for i, a in enumerate(arrays) if jnp.issubdtype(a.dtype, jnp.inexact)]

        def g(*d: Any) -> Any:
            full = list(arrays)
            for i, x in zip(diff, d):
                full[i] = x
            return forward(*full)

        y, pull = jax.vjp(g, *[arrays[i] for i in diff])
        return y, pull(jax.tree_util.tree_map(jnp.ones_like, y))

    return f


def check_min_gain(value: Any, where: str, allow_none: bool = True) -> float | None:
    """``min_gain`` must be a number in [0, 1) (None: use the tuner's own where allowed)."""
    if value is None and allow_none:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not 0.0 <= float(value) < 1.0:
        raise ValueError(
            f"nablax.kernels.{where}: min_gain must be a number in [0, 1) (0.03 = a candidate "
            f"must be 3 % faster than the heuristic's config to replace it; 0 = the fastest "
            f"candidate wins), got {value!r}. Fix: e.g. min_gain=0.05 or min_gain=0"
        )
    return float(value)


def concrete_call(inv: Invocation) -> tuple[tuple, dict, bool]:
    """``inv``'s ``(args, kwargs)`` with concrete arrays (synthetic ones of the same shapes and
    dtypes for tracers and ShapeDtypeStructs), and whether any is synthetic."""
    arrays, rebuild, synthetic = _split_call(inv.args, inv.kwargs)
    args, kwargs = rebuild(arrays)
    return args, kwargs, synthetic


def _calling(fn: Any, rebuild: Any) -> Any:
    def core(*arrays: Any) -> Any:
        a, k = rebuild(arrays)
        return fn(*a, **k)

    return core


def _split_call(args: tuple, kwargs: dict) -> tuple[list, Any, bool]:
    """The concrete array leaves of ``(args, kwargs)`` (synthetic ones for tracers and
    ShapeDtypeStructs), a function rebuilding ``(args, kwargs)`` from arrays, and whether any
    array is synthetic."""
    leaves, treedef = jax.tree_util.tree_flatten((tuple(args), dict(kwargs)))
    pos = [i for i, x in enumerate(leaves) if _is_array(x) and not isinstance(x, np.generic)]
    arrays, synthetic = _concrete([leaves[i] for i in pos])

    def rebuild(arrs: Sequence[Any]) -> tuple[tuple, dict]:
        full = list(leaves)
        for i, a in zip(pos, arrs):
            full[i] = a
        return jax.tree_util.tree_unflatten(treedef, full)

    return arrays, rebuild, synthetic


def _concrete_arrays(inv: Invocation) -> tuple[list, bool]:
    """The call's array leaves when they are concrete jax arrays, else synthetic ones."""
    leaves = jax.tree_util.tree_leaves((inv.args, inv.kwargs))
    return _concrete([x for x in leaves if _is_array(x) and not isinstance(x, np.generic)])


def _concrete(arrays: list) -> tuple[list, bool]:
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


def _report_failures(name: str, timings: list[CandidateTiming]) -> None:
    failed = [t for t in timings if t.error is not None and not t.error.startswith("not timed")]
    if failed:
        lines = "; ".join(f"{t.cfg}: {t.error.splitlines()[0][:200]}" for t in failed)
        warnings.warn(
            f"nablax.kernels.Tuner: {len(failed)} of {len(timings)} candidate config(s) of "
            f"{name} failed and scored inf: {lines}",
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

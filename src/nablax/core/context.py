"""The interpreter context: everything a transform or a realization needs to know about *this
thread's* state, in one object per thread (as JAX's trace state).

- ``traces``: the open differentiation traces (``grad``/``vjp``/``jvp`` calls), innermost last;
- ``vmap_depth``: how many ``nx.vmap`` calls enclose the running code;
- ``vjp_depth``: the ``vmap_depth`` at which the running backward pass's transform was opened
  (levels from there on that only a cotangent has come from vmaps around a ``vjp`` function);
- ``custom_fwd``: ``(custom_vjp function, trace)`` for each custom ``fwd`` rule running (inside
  it, a call of the same function at that trace is its primal function, as in JAX);
- ``tracing_depth``: > 0 while ``nx.compile`` / ``nx.shard_map`` stage a function on placeholders;
- ``pending``: weak references to the outputs of nodes built since this thread's last realization
  (live pending tensors connected to a realized program are computed with it, see realize.py);
- ``epoch``: how many programs this thread has run (a change during staging is a graph break);
- ``autocast``: the compute dtype of ``nx.autocast`` around the running code, or None
  (core/autocast.py; read when ops are built, part of ``nx.compile``'s cache key);
- ``cf_depth``: how many control-flow bodies (``nx.cond``/``while_loop``/``scan``/...) this thread
  is staging (the control-flow staging module: a control-flow node inside a body keeps no
  residuals, JAX differentiates the enclosing node's whole lowering);
- ``scalar_args``: ``nx.compile`` placeholder node -> the Python number argument it stands for
  (a ``scalars.ScalarArg``; weak keys): a program that needs such a value while tracing is a
  ``ConcretizationError`` naming ``static_argnums``, not a graph break (``nx.compile``'s
  staging);
- ``random_key``, ``random_generation``: this thread's stream of the global random key and the
  seed generation it belongs to (prims/random.py; the seed itself is process-wide, see below).

Transforms push and pop these fields and nothing else holds transform state, so no thread can
observe another's tracing: while one thread stages a function under ``nx.compile``, eager code in
another thread runs as usual, and its realizations never pick up the first thread's placeholders.

Graph nodes and tensors themselves are shared: a tensor built in one thread can be read in another
(realization is serialized by the realization lock).

Process-wide state
------------------
What stays shared by every thread, on purpose (each is named where it lives):

- ``realize._S``: the realization cache (executables by graph structure), its counters and the
  realization lock. Programs are shared so that every thread reuses them; one lock because a
  realization writes values into graph nodes that other threads can hold.
- ``graph._next_seq``: the node counter. Sequence numbers order nodes by creation across threads
  (a realization's canonical node order, ``forget_traced``'s "built since" test).
- ``transforms.trace.LEAVES`` and ``GRAD_ROOT``: the ``requires_grad`` leaves and their trace.
  A leaf is a tensor, and tensors are shared: ``loss.backward()`` in any thread fills the
  ``.grad`` of a parameter made in another, so the registry cannot be per thread.
- ``prims.random._SEED``: the seed and its generation. ``nx.random.seed(s)`` in one thread
  restarts every thread's stream (each from ``fold_in(key(s), n)``, see ``nx.random.seed``);
  the streams themselves are per thread (above).
- ``primitive.REGISTRY`` and the other registries filled at import (one entry per definition).
- ``transforms.plan._S`` (recorded backward passes), ``transforms.compile.info.LIVE`` (live
  ``nx.compile`` functions, each with its signature cache), ``primitive.DERIVED`` and every other
  cache registered in ``nablax._caches``: keyed by structure, so sharing them is what makes them
  pay; each is bounded and emptied by ``nx.clear_caches()``.
- Options (``nablax._config``): process-wide values; ``nx.config.override`` scopes a value to
  one thread or task (contextvars), so per-thread overrides need no field here.
- ``cpu_threads._changed``, ``host_memory._state``, ``gc_threshold._state``: what nablax
  changed in the process (thread scheduling, malloc thresholds, the garbage collector's
  threshold), which is process-wide by nature.

The xcs layer keeps its own per-thread context (``nablax/xcs/_context.py``), above the core.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

_PRUNE_MIN = 4096


class Context(threading.local):
    """This thread's interpreter state (see the module docstring)."""

    def __init__(self) -> None:
        self.traces: list = []
        self.vmap_depth = 0
        self.vjp_depth = 0
        self.custom_fwd: list = []
        self.tracing_depth = 0
        self.pending: list = []
        self.prune_at = _PRUNE_MIN
        self.epoch = 0
        self.autocast: Any = None  # a numpy dtype inside nx.autocast
        self.cf_depth = 0  # control-flow bodies being staged
        self.scalar_args: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self.random_key: Any = None  # a Tensor: this thread's global random stream
        self.random_generation = -1  # the seed generation random_key belongs to


CTX = Context()


def note_pending(wr) -> None:
    """Record a new node output; drop dead or realized entries once the list has grown
    (amortized O(1))."""
    ctx = CTX
    pending = ctx.pending
    pending.append(wr)
    if len(pending) > ctx.prune_at:
        prune_pending(ctx)


def prune_pending(ctx: Context | None = None) -> None:
    ctx = ctx or CTX
    ctx.pending[:] = [w for w in ctx.pending if (i := w()) is not None and i.value is None]
    reset_prune_threshold(ctx)


def reset_prune_threshold(ctx: Context | None = None) -> None:
    ctx = ctx or CTX
    ctx.prune_at = max(_PRUNE_MIN, 2 * len(ctx.pending))

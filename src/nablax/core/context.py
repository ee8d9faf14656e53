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
  (core/autocast.py; read when ops are built, part of ``nx.compile``'s cache key).

Transforms push and pop these fields and nothing else holds transform state, so no thread can
observe another's tracing: while one thread stages a function under ``nx.compile``, eager code in
another thread runs as usual, and its realizations never pick up the first thread's placeholders.

Graph nodes and tensors themselves are shared: a tensor built in one thread can be read in another
(realization is serialized by the realization lock).
"""

from __future__ import annotations

import threading
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

"""The lazy graph: nodes, constants, and the walk that collects a pending subgraph.

A :class:`Node` is one call of a primitive. All outputs of the call share the node. An output is
addressed by the node itself when the primitive has one output (almost all of them: this saves an
allocation per op on the hot path) and by ``(node, index)`` for multi-output primitives; that
address is the ``src`` of a pending ``TensorImpl``. Node inputs are one of:

- a ``Node`` or ``(node, index)``: an output of another node (pending, or materialized in
  ``node.values``);
- a ``jax.Array``: a realized value (a *leaf* of any program that uses it);
- a :class:`Const`: a Python scalar with the dtype it takes in this op (weakly typed scalars);
- a bare Python scalar (``bool``/``int``/``float``/``complex``): shorthand used by elementwise
  primitives, materialized in the node's computation dtype ``params[0]`` (saves an object per op on
  the hottest path).

Nodes point at their producers, never at the ``TensorImpl`` objects of their inputs, and hold only
weak references to their own outputs. So a tensor object the user dropped really is gone, and at
realization the weak references tell which intermediates the user still holds: those are produced by
the same program. After realization a node keeps its output values and drops its inputs, so upstream
memory is freed.
"""

from __future__ import annotations

import gc
import itertools
from collections.abc import Callable
from typing import Any

SCALAR_TYPES = frozenset((bool, int, float, complex))


class Const:
    """A Python scalar operand, with the dtype it is materialized in."""

    __slots__ = ("value", "dtype")

    def __init__(self, value: Any, dtype) -> None:
        self.value = value
        self.dtype = dtype

    @property
    def shape(self) -> tuple:
        return ()

    def __repr__(self) -> str:
        return f"Const({self.value!r}, {self.dtype})"


class Trace:
    """One differentiation scope (a ``grad``/``vjp``/``jvp`` call, or the ``requires_grad`` leaves).

    Nodes built from a traced input remember the deepest trace they depend on (``Node.trace``).
    While that trace, or one enclosing it, is alive, a realized node keeps its inputs (the backward
    pass walks them) and its tensors keep pointing at it; afterwards the node behaves like plain
    eager code and frees its inputs when realized. ``owner``: optional weak reference whose death
    ends the trace (``vjp`` keeps its trace alive as long as the returned ``f_vjp`` exists).
    """

    __slots__ = ("level", "parent", "active", "owner", "keep_alive", "kept", "__weakref__")

    level: int
    parent: Trace | None
    active: bool
    owner: Callable[[], Any] | None
    keep_alive: Callable[[], bool] | None
    kept: list[Any]

    def __init__(self, parent: Trace | None) -> None:
        self.parent = parent
        self.level = 0 if parent is None else parent.level + 1
        self.active = True
        self.owner = None
        self.keep_alive = None  # callable -> bool, for the requires_grad root
        self.kept = []  # weak refs to nodes realized while this trace needed their inputs

    def alive(self) -> bool:
        t: Trace | None = self
        while t is not None:
            if t.keep_alive is not None:
                if t.keep_alive():
                    return True
            elif t.active and (t.owner is None or t.owner() is not None):
                return True
            t = t.parent
        return False


def end_trace(trace: Trace) -> None:
    """The trace is over: nodes it kept go to a still-live enclosing trace, or are released like
    eager code (inputs dropped, tensors no longer pointing at their node)."""
    trace.active = False
    kept, trace.kept = trace.kept, []
    for wr in kept:
        node = wr()
        if node is None:
            continue
        heir = node.trace
        while heir is not None and not _self_alive(heir):
            heir = heir.parent
        if heir is not None:
            heir.kept.append(wr)
        else:
            release(node)


def _self_alive(t: Trace) -> bool:
    if t.keep_alive is not None:
        return t.keep_alive()
    return t.active and (t.owner is None or t.owner() is not None)


def release(node: Node) -> None:
    """Turn a realized node kept for a trace back into an ordinary realized node."""
    vals = node.values
    if vals is None or any(v is None for v in vals):
        return
    node.inputs = None
    for wr in node.outs:
        impl = wr()
        if impl is not None and impl.value is not None:
            impl.src = None


def deeper(a: Trace | None, b: Trace | None) -> Trace | None:
    """The trace of a node with inputs traced by ``a`` and ``b`` (the more deeply nested one)."""
    if a is None:
        return b
    if b is None or a.level >= b.level:
        return a
    return b


_next_seq = itertools.count().__next__


def seq_of(node: Node) -> float:
    return node.seq


class Node:
    """One primitive application in the lazy graph."""

    # ``avals`` (output (shape, dtype) pairs) is set only on traced nodes, for the transforms; it is
    # deliberately not initialized here to keep eager op building cheap.
    __slots__ = (
        "prim",
        "params",
        "inputs",
        "values",
        "outs",
        "depth",
        "seq",
        "trace",
        "avals",
        "bdims",
        "__weakref__",
    )

    prim: Any
    params: tuple[Any, ...]
    inputs: tuple[Any, ...] | None
    values: list[Any] | None
    outs: tuple[Any, ...]
    depth: int
    seq: float  # an int (creation order); nx.shard_map staging renumbers some in between
    trace: Trace | None
    avals: tuple[Any, ...]
    bdims: Any

    def __init__(self, prim, params: tuple, inputs: tuple, depth: int, trace=None) -> None:
        self.prim = prim
        self.params = params
        self.inputs = (
            inputs  # None once all outputs are materialized (and no live trace needs them)
        )
        self.values = None  # output values once realized (None entries: not computed)
        self.outs = ()  # weak references to the output TensorImpls
        self.depth = depth
        # creation order: a node is created after its inputs, so sorting by ``seq`` is a
        # topological order, and a canonical one (the same program always gets the same order,
        # however its nodes are found), which keeps realization keys stable
        self.seq = _next_seq()
        self.trace = trace  # deepest Trace this node depends on, or None (see Trace)
        # (batch dims of each input, output batch shape) when an input is vmap-batched, else None
        self.bdims = None

    def __repr__(self) -> str:
        return f"Node({self.prim.name}, params={self.params})"


def split_ref(ref: Any) -> tuple[Node, int] | None:
    """``(node, index)`` for an input that is a node output, else ``None`` (a value or scalar)."""
    t = type(ref)
    if t is Node:
        return ref, 0
    if t is tuple:
        return ref
    return None


def out_ref(src: Any) -> tuple[Node, int]:
    """``(node, index)`` of a pending ``TensorImpl.src`` (a ``Node`` or a ``(node, index)`` pair)."""
    return (src, 0) if type(src) is Node else src


def src_node(src: Any) -> Node:
    """The node of a pending ``TensorImpl.src`` (a ``Node`` or a ``(node, index)`` pair)."""
    return src if type(src) is Node else src[0]


def toposort(roots: list[Node]) -> list[Node]:
    """Pending nodes reachable from ``roots``, producers before consumers (iterative, no recursion).

    Realization inlines a faster variant of this walk; transforms and tests use this one.
    """
    seen: dict = dict.fromkeys(roots)
    stack = list(roots)
    while stack:
        for inp in stack.pop().inputs or ():
            ref = split_ref(inp)
            if ref is None:
                continue
            m, j = ref
            if m not in seen and (m.values is None or m.values[j] is None):
                seen[m] = None
                stack.append(m)
    return sorted(seen, key=seq_of)  # created after every input: topological


class gc_paused:
    """Pause Python's cyclic garbage collector for a block, restoring the caller's setting.

    Graph walks (realization, the backward pass) allocate many short-lived objects but create no
    reference cycles (the graph is a DAG; traces hold only weak references). Letting those
    allocations trigger collections would rescan the whole live graph over and over; reference
    counting still frees everything as usual.
    """

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self._was:
            gc.enable()

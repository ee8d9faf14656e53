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


class Node:
    """One primitive application in the lazy graph."""

    __slots__ = ("prim", "params", "inputs", "values", "outs", "depth", "__weakref__")

    def __init__(self, prim, params: tuple, inputs: tuple, depth: int) -> None:
        self.prim = prim
        self.params = params
        self.inputs = inputs  # None once all outputs are materialized
        self.values: list | None = None  # output values once realized (None entries: not computed)
        self.outs: tuple = ()  # weak references to the output TensorImpls
        self.depth = depth

    def __repr__(self) -> str:
        return f"Node({self.prim.name}, params={self.params})"


# Weak references to the outputs of every node built since the last realization. At realization,
# live pending tensors connected to the program are run with it (see realize._connected), so that in
# an eager training loop reading only ``loss`` also computes the updated weights in the same program.
PENDING: list = []
_prune_at = [4096]


def note_pending(wr) -> None:
    """Record a new output; drop dead or realized entries when the list has grown (amortized O(1))."""
    PENDING.append(wr)
    if len(PENDING) > _prune_at[0]:
        prune_pending()


def prune_pending() -> None:
    PENDING[:] = [w for w in PENDING if (i := w()) is not None and i.value is None]
    reset_prune_threshold()


def reset_prune_threshold() -> None:
    _prune_at[0] = max(4096, 2 * len(PENDING))


def split_ref(ref: Any) -> tuple[Node, int] | None:
    """``(node, index)`` for an input that is a node output, else ``None`` (a value or scalar)."""
    t = type(ref)
    if t is Node:
        return ref, 0
    if t is tuple:
        return ref
    return None


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
    return sorted(seen, key=lambda n: n.depth)  # deeper than every pending input: topological

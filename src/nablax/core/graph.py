"""The lazy graph: nodes, constants, and the walk that collects a pending subgraph.

A :class:`Node` is one call of a primitive. All outputs of the call share the node; an output is
addressed by ``(node, index)`` (the ``src`` of a pending ``TensorImpl``). Node inputs are one of:

- ``(node, index)``: an output of another node (pending, or materialized in ``node.values``);
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
    _prune_at[0] = max(4096, 2 * len(PENDING))


def is_pending(ref: Any) -> bool:
    """True for an input ``(node, index)`` whose value is not computed yet."""
    if type(ref) is not tuple:
        return False
    vals = ref[0].values
    return vals is None or vals[ref[1]] is None


def toposort(roots: list[Node]) -> list[Node]:
    """Pending nodes reachable from ``roots``, producers before consumers (iterative, no recursion)."""
    order: list[Node] = []
    done: set[Node] = set()
    stack = list(roots)
    while stack:
        n = stack[-1]
        if n in done:
            stack.pop()
            continue
        pushed = False
        for inp in n.inputs:
            if type(inp) is tuple:
                m = inp[0]
                if m not in done:
                    vals = m.values
                    if vals is None or vals[inp[1]] is None:
                        stack.append(m)
                        pushed = True
        if not pushed:
            stack.pop()
            done.add(n)
            order.append(n)
    return order

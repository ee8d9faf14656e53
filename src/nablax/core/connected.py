"""Which live pending tensors a realization computes along with the values it was asked for.

When a value is read, the other live pending tensors *connected* to it (sharing a node or a leaf
array with its graph: the new parameters of a training step whose loss is read) are computed in
the same realization (see :mod:`.realize`), so an eager step never leaves work behind.
:func:`connected` finds them with one scan of the context's pending list and a memoized search
through their pending graphs.
"""

from __future__ import annotations

from .context import CTX, reset_prune_threshold
from .graph import SCALAR_TYPES, Var


def connected(seen: dict) -> list:
    """Nodes of live pending tensors (outside the program) that share a node or a leaf with it."""
    # One scan of PENDING both finds the candidates and prunes dead or realized entries (entries
    # realized by the coming program are dropped by the next scan).
    in_prog = set(seen)
    leaves = _Leaves(seen)  # the leaf arrays' ids, computed when a walk first needs them
    touching: dict = {}  # node -> bool, memo across candidates
    extra = []
    live = []
    ctx = CTX
    for wr in ctx.pending:
        impl = wr()
        if impl is None or impl.value is not None:
            continue
        live.append(wr)
        node = impl.src[0]
        if node in in_prog or node in touching:
            continue
        if _touches(node, in_prog, leaves, touching):
            extra.append(node)
            in_prog.add(node)
    ctx.pending[:] = live
    reset_prune_threshold(ctx)
    return extra


class _Leaves:
    """The ids of the realized arrays the collected nodes read, computed on the first question
    (a training step's rest is found through the program's nodes before any leaf is asked)."""

    __slots__ = ("seen", "ids")

    def __init__(self, seen: dict) -> None:
        self.seen = seen
        self.ids: set | None = None

    def has(self, array) -> bool:
        ids = self.ids
        if ids is None:
            ids = self.ids = _leaf_ids(self.seen)
        return id(array) in ids


def _leaf_ids(seen: dict) -> set:
    """ids of the realized arrays the collected nodes read."""
    ids = set()
    for node in seen:
        for inp in node.inputs:
            if type(inp) is Var:
                m, j = inp
                if m not in seen and m.values is not None and m.values[j] is not None:
                    ids.add(id(m.values[j]))
            elif type(inp.value) not in SCALAR_TYPES:
                ids.add(id(inp.value))
    return ids


def _reads_program(node, in_prog) -> bool:
    for inp in node.inputs:
        if type(inp) is Var and inp[0] in in_prog:
            return True
    return False


def _reads_leaf(node, leaves: _Leaves) -> bool:
    for inp in node.inputs:
        if type(inp) is Var:
            vals = inp[0].values
            if vals is not None and vals[inp[1]] is not None and leaves.has(vals[inp[1]]):
                return True
        elif type(inp.value) not in SCALAR_TYPES and leaves.has(inp.value):
            return True
    return False


def _touches(start, in_prog, leaves: _Leaves, memo: dict) -> bool:
    """Whether the pending graph behind ``start`` reads a node of ``in_prog`` or one of the leaf
    arrays of ``leaves``.

    A depth-first search that stops at the first pending node reading a program node (checked
    when the node is reached) or a leaf array (checked when the node is left, its pending inputs
    all decided, so that the leaf ids are computed only when no program node was found first).
    Every node it decides is memoized (``memo`` is shared by all candidates of one realization):
    the nodes on the path to a hit touch, a node left without one does not. So the cost is
    linear in the pending nodes whatever their sharing: residual streams reuse each value
    several times, and a walk that followed paths instead of nodes took exponential time (112 s
    at 16 layers); and a training step's rest is usually decided a few nodes in."""
    got = memo.get(start)
    if got is not None:
        return got
    if _reads_program(start, in_prog):
        memo[start] = True
        return True
    path = [start]
    todo = [iter(start.inputs)]
    while path:
        for inp in todo[-1]:
            if type(inp) is not Var:
                continue
            m, j = inp
            vals = m.values
            if m in in_prog or (vals is not None and vals[j] is not None):
                continue  # a program node was checked on arrival; a computed one is a leaf
            got = memo.get(m)
            if got is None:
                if not _reads_program(m, in_prog):
                    path.append(m)  # decide it first
                    todo.append(iter(m.inputs))
                    break
                got = memo[m] = True
            if got:
                for n in path:
                    memo[n] = True
                return True
        else:  # every pending input of the node is decided and none touches
            n = path.pop()
            todo.pop()
            if _reads_leaf(n, leaves):
                memo[n] = True
                for p in path:
                    memo[p] = True
                return True
            memo[n] = False
    return False

"""Shared machinery of the differentiation interpreters.

A transform call opens a :class:`~nablax.core.graph.Trace` and replaces each differentiated input by
a *marker*: an identity node owned by that trace. Every node built from a marker records the trace
(``Node.trace``), so after the user's function ran, the graph between the markers and the outputs is
exactly the set of traced nodes reachable backwards from the outputs. The interpreters walk that
set (:func:`collect`), keep the part that really depends on their own markers (:func:`depends`),
and apply each primitive's ``jvp``/``vjp`` rule, which builds more lazy nablax ops.
"""

from __future__ import annotations

import weakref
from typing import Any
from weakref import ref as _weakref

import jax
import numpy as np

from ..build import TensorImpl, bind_known, bind_leaf, impl_from_array
from ..context import CTX
from ..graph import SCALAR_TYPES, Node, Trace, Var, _compiled, end_trace, new_var, seq_of
from ..ops.creation import full
from ..primitive import primitive
from ..tensor import Tensor

# ---- trace stack -----------------------------------------------------------------------------


class _LeafRegistry:
    """``requires_grad`` leaves: marker node -> the tensor object whose ``.grad`` receives it.

    Tensors are tracked by identity (``Tensor.__eq__`` is element-wise, so no WeakSet).
    """

    def __init__(self) -> None:
        self.by_marker: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._ids: dict[int, weakref.ref] = {}

    def add(self, t) -> None:
        key = id(t)
        self._ids[key] = weakref.ref(t, lambda _: self._forget(key))

    def _forget(self, key: int) -> None:
        self._ids.pop(key, None)
        if not self._ids:  # the last requires_grad tensor is gone: release what was kept for it
            end_trace(GRAD_ROOT)
            GRAD_ROOT.active = True

    def discard(self, t) -> None:
        if id(t) in self._ids:
            self._forget(id(t))

    def __contains__(self, t) -> bool:
        r = self._ids.get(id(t))
        return r is not None and r() is t

    def alive(self) -> bool:
        return bool(self._ids)


# Process-wide on purpose (core/context.py, "Process-wide state"): a requires_grad leaf is a
# tensor, shared by every thread, and backward() in any thread fills its .grad
LEAVES = _LeafRegistry()
GRAD_ROOT = Trace(None)  # the trace of requires_grad leaves: alive while any such tensor lives
GRAD_ROOT.keep_alive = LEAVES.alive


class open_trace:
    """Context manager: a new trace nested in the current transform's, on this thread's stack.

    Transform traces do not hang off the requires_grad root: one live ``requires_grad`` tensor
    elsewhere must not keep every ``grad`` call's graph alive.
    """

    def __init__(self) -> None:
        traces = CTX.traces
        self.trace = Trace(traces[-1] if traces else None)

    def __enter__(self) -> Trace:
        CTX.traces.append(self.trace)
        return self.trace

    def __exit__(self, *exc) -> None:
        CTX.traces.pop()


# ---- markers ---------------------------------------------------------------------------------

trace_input_p = primitive(
    "trace_input",
    lambda params, x: (x,),
    lambda params, x: x,
    jvp=lambda params, tangents, primals, outs: [tangents[0]],
    vjp=lambda params, cts, primals, outs: [cts[0]],
    batch=lambda params, bds, x: x,
    shard=lambda params, layouts, in_avals, out_avals: (layouts[0],),
    doc="Identity node marking a differentiated input of a transform (see transforms/trace.py).",
)


def mark(t: Tensor, trace: Trace) -> Tensor:
    """A new tensor equal to ``t`` whose node is a marker owned by ``trace``."""
    impl = t._impl
    b = impl.batch_shape
    if impl.src is None and not b:  # a computed leaf (a parameter): its node, directly
        out = bind_leaf(trace_input_p, (), impl.lit, impl.shape, impl.dtype, trace)
    else:
        (out,) = bind_known(trace_input_p, (impl,), (), ((impl.shape, impl.dtype),), trace=trace)
    if impl.value is not None and not b:
        # Already computed: so is the marker. Programs then read the array itself instead of
        # copying it through an identity node (and a program boundary); ``src`` stays, so the
        # reverse pass still finds the marker, and the trace keeps the node until it ends.
        node = out.src[0]
        node.values = [impl.value]
        out.value, out.lit, out.sharding = impl.value, impl.lit, impl.sharding
        trace.kept.append(_weakref(node))
    return Tensor._wrap(out)


def _mark_leaves_py(leaves, trace: Trace, prim, is_float):
    """``(markers, marker nodes)`` of ``leaves`` when every one is a computed, unbatched
    ``Tensor`` whose dtype ``is_float`` accepts (a model's parameters: :func:`mark`'s leaf case,
    for all of them at once), else None (the caller marks leaf by leaf).

    ``_mark_leaves`` is this function, or its compiled equivalent (core/_graphc.c's
    ``mark_leaves``) when the optional extension is built."""
    for leaf in leaves:
        if type(leaf) is not Tensor:
            return None
        impl = leaf._impl
        if (
            type(impl) is not TensorImpl
            or impl.src is not None
            or impl.value is None
            or impl.batch_shape
            or not is_float(impl.dtype)
        ):
            return None
    markers, nodes = [], []
    for leaf in leaves:
        impl = leaf._impl
        out = bind_leaf(prim, (), impl.lit, impl.shape, impl.dtype, trace)
        node = out.src[0]
        node.values = [impl.value]
        out.value, out.lit, out.sharding = impl.value, impl.lit, impl.sharding
        trace.kept.append(_weakref(node))
        markers.append(Tensor._wrap(out))
        nodes.append(node)
    return markers, nodes


_mark_leaves = _mark_leaves_py if _compiled is None else _compiled.mark_leaves


def marker_of(t: Tensor) -> Node:
    src = t._impl.src
    assert src is not None and src[0].prim is trace_input_p, "not a marked tensor"
    return src[0]


class Opaque:
    """A static parameter that carries a Python object but never changes the structure key (it
    compares equal to every other ``Opaque``): used where a rule needs per-call data (custom_vjp)
    that the lowering does not. It goes last in ``params``: backward plans (plan.py) never replay
    a node that carries one, since its rule is user code that must run on every pass."""

    __slots__ = ("obj",)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def __eq__(self, other: object) -> bool:
        return type(other) is Opaque

    def __hash__(self) -> int:
        return 0x0BAC

    def __repr__(self) -> str:
        return "Opaque(...)"


# ---- walking the traced graph ----------------------------------------------------------------


def _collect_py(roots, stop) -> list[Node]:
    """Traced nodes reachable backwards from ``roots``, producers first; ``stop`` nodes (the
    transform's own markers) are included but not expanded.

    ``collect`` is this function, or its compiled equivalent (core/_graphc.c's
    ``trace_collect``) when the optional extension is built (see graph.COMPILED)."""
    seen = dict.fromkeys(r for r in roots if r.trace is not None)
    stack = list(seen)
    while stack:
        n = stack.pop()
        if n in stop or n.inputs is None:
            continue
        for inp in n.inputs:
            if type(inp) is Var:
                m = inp[0]
                if m.trace is not None and m not in seen:
                    seen[m] = None
                    stack.append(m)
    return sorted(seen, key=seq_of)


collect = _collect_py if _compiled is None else _compiled.trace_collect


def depends(order, markers) -> set:
    """Nodes of ``order`` (topologically sorted) whose value depends on one of ``markers``."""
    dep = set()
    for n in order:
        if n in markers:
            dep.add(n)
            continue
        for inp in n.inputs or ():
            if type(inp) is Var and inp[0] in dep:
                dep.add(n)
                break
    return dep


# ---- avals and tensors for node outputs ------------------------------------------------------


def _known_avals(n: Node):
    avals = []
    nb = len(n.bdims[1]) if n.bdims is not None else 0
    for j, wr in enumerate(n.outs):
        impl = wr()
        if impl is not None:
            avals.append((impl.shape, impl.dtype))
        elif n.values is not None and n.values[j] is not None:
            v = n.values[j]  # physical: drop the batch axes
            avals.append((tuple(v.shape)[nb:], np.dtype(v.dtype)))
        else:
            return None
    return avals


def node_avals(node: Node, memo: dict) -> list:
    """Output avals of ``node``, recomputed with shape rules where no tensor or value knows them."""
    r = getattr(node, "avals", None) or memo.get(node)
    if r is not None:
        return r
    stack = [node]
    while stack:
        n = stack[-1]
        if n in memo:
            stack.pop()
            continue
        known = getattr(n, "avals", None) or _known_avals(n)
        if known is not None:
            memo[n] = known
            stack.pop()
            continue
        ins = n.inputs
        assert ins is not None  # no output or value knows the avals: the node is pending
        missing = [inp[0] for inp in ins if type(inp) is Var and inp[0] not in memo]
        if missing:
            stack.extend(missing)
            continue
        in_avals = [input_aval(inp, n, memo, k) for k, inp in enumerate(ins)]
        memo[n] = list(n.prim.abstract_eval(n.params, *in_avals))
        stack.pop()
    return memo[node]


def input_aval(inp, node: Node, memo: dict, k: int):
    """Logical ``(shape, dtype)`` of input ``k`` of ``node``."""
    if type(inp) is Var:
        return node_avals(inp[0], memo)[inp[1]]
    v = inp.value
    if type(v) in SCALAR_TYPES:
        return ((), inp.dtype)
    nb = node.bdims[0][k] if node.bdims is not None else 0
    return (tuple(v.shape)[nb:], np.dtype(v.dtype))


def tensor_of(inp, node: Node, memo: dict, k: int):
    """The value input ``k`` of ``node`` stands for: a Tensor (a node output or a realized array) or
    the Python scalar itself for a weakly typed scalar (rules can use it as it is)."""
    if type(inp) is Var:
        return output_tensor(inp[0], inp[1], memo)
    v = inp.value
    if type(v) in SCALAR_TYPES:
        return v if inp.weak else full((), v, inp.dtype)
    impl = impl_from_array(v)
    nb = node.bdims[0][k] if node.bdims is not None else 0
    if nb:  # a realized vmap-batched value: split off its batch axes
        impl.batch_shape, impl.shape = impl.shape[:nb], impl.shape[nb:]
    return Tensor._wrap(impl)


def output_tensor(node: Node, j: int, memo: dict) -> Tensor:
    """A tensor for output ``j`` of ``node`` (its live ``TensorImpl`` when there is one)."""
    impl = node.outs[j]() if node.outs else None
    if impl is not None:
        return Tensor._wrap(impl)
    shape, dtype = node_avals(node, memo)[j]
    value = node.values[j] if node.values is not None else None
    bshape = node.bdims[1] if node.bdims is not None else ()
    return Tensor._wrap(TensorImpl(new_var(Var, (node, j)), value, shape, dtype, bshape))


class LazyOutputs:
    """``outs`` argument of rules: output tensors created only when a rule reads them."""

    __slots__ = ("_node", "_memo", "_cache")

    def __init__(self, node: Node, memo: dict) -> None:
        self._node = node
        self._memo = memo
        self._cache: dict = {}

    def __len__(self) -> int:
        return len(self._node.outs)

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(len(self))[j]]
        t = self._cache.get(j)
        if t is None:
            t = self._cache[j] = output_tensor(self._node, j, self._memo)
        return t

    def __iter__(self):
        return (self[j] for j in range(len(self)))


def ref_key(inp):
    """Cotangent/tangent key of a node input: the ``Var`` itself, or None for a ``Literal``."""
    return inp if type(inp) is Var else None


_BF16 = np.dtype(jax.numpy.bfloat16)
_FLOAT_DTYPES = frozenset(
    [_BF16, *(np.dtype(n) for n in ("float16", "float32", "float64", "complex64", "complex128"))]
)


def is_float(dtype) -> bool:
    """A float or complex dtype (the differentiable ones)."""
    if dtype in _FLOAT_DTYPES:  # nablax's own dtypes: a set lookup
        return True
    d = np.dtype(dtype)
    return d.kind in "fc" or d == _BF16

"""Building graph nodes: ``TensorImpl`` (a tensor's state) and the ``bind`` family, the one way
a node is made.

A ``TensorImpl`` is in one of two states:

- *pending*: ``src`` is the ``Var`` naming the node output that will produce it, ``value is None``;
- *realized*: ``value`` is a ``jax.Array``, ``lit`` its ``Literal`` (what a node built on it takes
  as input) and ``src is None``.

``shape`` is the *logical* shape, the one the user sees. Under ``nx.vmap`` a tensor also has a
``batch_shape``: its physical value has shape ``batch_shape + shape``, the leading axes being the
batch axes of the enclosing vmaps, outermost first (see core/transforms/vmap.py).

:func:`bind` runs a primitive's shape rule on impl/``Literal`` inputs and makes the node; the fast
entries for inputs whose output shape the caller already knows are :func:`bind_known` (any inputs,
including graph references, with an explicit trace or batch layout when a transform decides them)
and, for the element-wise hot path, :func:`bind_unary`, :func:`bind_scalar` and
:func:`bind_pair`. The node's
metadata (depth, differentiation trace, batch layout) is computed here and only here, and
``_node`` (private to this module) is the one place a ``Node`` is created: a structure test
(tests/core/test_build_path.py) rejects any other.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from ..errors import op_error
from . import dtypes, graph
from .context import CTX, note_pending
from .graph import Literal, Node, Var, _next_seq, deeper, new_var
from .host import ADOPT_BYTES, PY_SCALAR_TYPES, host_array, inexact
from .primitive import primitive, zero_jvp, zero_vjp
from .realize import realize_impls

_wref = weakref.ref
_new = object.__new__
_cfg_get = _config.get


class TensorImpl:
    (
        """State of one tensor: pending node output or realized ``jax.Array``.

    ``src`` is the ``Var`` of the producing node output. A realized tensor whose node is still
    needed by a live differentiation trace keeps ``src`` as well as its ``value``, so that ops
    built on it later stay connected to the trace.
    """
        ""
    )

    __slots__ = ("src", "value", "lit", "shape", "dtype", "batch_shape", "sharding", "__weakref__")

    src: Var | None
    value: Any
    lit: Literal | None
    shape: tuple[Any, ...]
    dtype: Any
    batch_shape: tuple[Any, ...]
    sharding: Any  # a ShardingSpec set by ``Tensor.shard`` / ``nx.shard_map``, else None

    def __init__(self, src, value, shape: tuple, dtype, batch_shape: tuple = ()) -> None:
        self.src = src
        self.value = value
        self.lit = None if value is None else Literal(value, dtype)  # set again when realized
        self.shape = shape  # logical
        self.dtype = dtype
        self.batch_shape = batch_shape  # vmap batch axes in front of ``shape`` (physically)
        self.sharding = None

    @property
    def batch_dims(self) -> int:
        return len(self.batch_shape)

    @property
    def ref(self) -> Var | Literal:
        """What a consuming node takes as input: ``src`` while a node output, else the value's
        ``Literal``."""
        return self.src if self.src is not None else self.lit  # type: ignore[return-value]

    @property
    def depth(self) -> int:
        return 0 if self.src is None else self.src[0].depth


def impl_from_array(arr: jax.Array) -> TensorImpl:
    """A realized impl around a ``jax.Array`` (shares the buffer)."""
    if getattr(arr, "weak_type", False):
        arr = jax.lax.convert_element_type(arr, arr.dtype)  # nablax tensors are strongly typed
    return TensorImpl(None, arr, tuple(arr.shape), np.dtype(arr.dtype))


def _node_py(prim, params: tuple, inputs: tuple, depth: int, avals, trace=None, bdims=None):
    """Create the node of one primitive call and a pending impl per output: every ``Node`` of the
    graph is made here (callers: the ``bind`` family below).

    ``inputs``: ``Var``/``Literal`` per operand; ``depth``: the node's depth (1 + its deepest
    input's); ``avals``: ``(shape, dtype)`` per output; ``trace``: the deepest differentiation
    trace an input depends on (see graph.Trace); ``bdims``: ``(batch dims of each input, output
    batch shape)`` when an input is vmap-batched. Returns the list of output impls. The new outputs
    join this thread's pending list, and a node deeper than ``max_graph_depth`` is computed at once
    (an automatic cut, checked every 64 levels).

    ``_node`` is this function, or its compiled equivalent (core/_graphc.c's ``node``) when the
    optional extension is built (see graph.COMPILED).
    """
    if len(avals) == 1:  # almost every primitive
        ((shape, dtype),) = avals
        return [_node1(prim, params, inputs, depth, shape, dtype, trace, bdims)]
    node = _new(Node)
    node.prim = prim
    node.params = params
    node.inputs = inputs
    node.values = None
    node.depth = depth
    node.seq = _next_seq()
    node.trace = trace
    node.bdims = bdims
    if trace is not None:
        node.avals = tuple(avals)
    bshape = () if bdims is None else bdims[1]
    impls = []
    for j, (shape, dtype) in enumerate(avals):
        impl = _new(TensorImpl)
        impl.src = new_var(Var, (node, j))
        impl.value = impl.lit = impl.sharding = None
        impl.shape = shape
        impl.dtype = dtype
        impl.batch_shape = bshape
        impls.append(impl)
    outs = node.outs = tuple([_wref(t) for t in impls])
    pending = CTX.pending
    if len(pending) + len(outs) < 4096:  # inlined fast path of note_pending
        pending.extend(outs)
    else:
        for wr in outs:
            note_pending(wr)
    if not depth & 63 and depth > _cfg_get("max_graph_depth"):  # checked every 64 levels: cheap
        realize_impls(impls, cut=True)
    return impls


def _meta_py(inputs) -> tuple:
    """``(refs, depth, trace, batched)`` of a node on ``inputs`` (``TensorImpl``, ``Literal`` or
    ``Var`` each): what it takes as input, its inputs' deepest depth (its own is one more), the
    deepest differentiation trace among them, and whether any input is vmap-batched.

    ``_meta`` is this function, or its compiled equivalent (core/_graphc.c's ``meta``) when the
    optional extension is built (see graph.COMPILED)."""
    refs = []
    depth = 0
    trace = None
    batched = False
    for i in inputs:
        ti = type(i)
        if ti is Literal:
            refs.append(i)
            continue
        if ti is Var:
            src = i
        else:
            if i.batch_shape:
                batched = True
            src = i.src
            if src is None:
                refs.append(i.lit)
                continue
        refs.append(src)
        n = src[0]
        if n.depth > depth:
            depth = n.depth
        t = n.trace
        if t is not None and t is not trace and (trace is None or t.level > trace.level):
            trace = t  # graph.deeper, inlined (the hot path)
    return tuple(refs), depth, trace, batched


def bind(prim, inputs, params: tuple = ()) -> list[TensorImpl]:
    """Generic node builder: run the shape rule, then create the node and its outputs.

    ``inputs`` are ``TensorImpl`` or :class:`Literal` objects. Shape/dtype errors raise here, when
    the op is built, not at realization.
    """
    out_avals = prim.abstract_eval(params, *[(i.shape, i.dtype) for i in inputs])
    refs, depth, trace, batched = _meta(inputs)
    bdims = batch_info(prim.name, inputs) if batched else None
    return _node(prim, params, refs, depth + 1, out_avals, trace, bdims)


_DERIVE: Any = object()  # bind_known: compute this piece of metadata from the inputs


def bind_known(
    prim, inputs, params: tuple, avals, *, trace: Any = _DERIVE, bdims: Any = _DERIVE
) -> list[Any]:  # pending TensorImpls: their ``src`` is set (callers read the new node)
    """The node of ``prim`` on ``inputs`` whose output ``avals`` (``(shape, dtype)`` each) the
    caller already knows (a transform, a recorded backward plan): no shape rule runs.

    ``inputs`` are ``TensorImpl``, ``Literal`` or graph references (``Var``). ``trace``: the
    differentiation trace the node belongs to when the transform decides it (a marker of a new
    trace, a replayed backward node), else the deepest of its inputs'. ``bdims``: ``(batch dims of
    each input, output batch shape)`` or ``None``, when the transform decides the batch layout
    (vmap's views, a body's inputs), else computed from the inputs' batch shapes.
    """
    refs, depth, derived, batched = _meta(inputs)
    if trace is _DERIVE:
        trace = derived
    if bdims is _DERIVE:
        bdims = batch_info(prim.name, inputs) if batched else None
    return _node(prim, params, refs, depth + 1, avals, trace, bdims)


def bind_refs(prim, params: tuple, refs: tuple, avals, trace, bdims) -> list[Any]:
    """The node of ``prim`` on the graph references ``refs`` (``Var``/``Literal`` each) when the
    caller knows everything :func:`bind_known` would derive but the depth: the output ``avals``,
    the node's ``trace`` and ``bdims`` (a replayed backward plan, a transform's marker of a
    computed leaf). Returns the output impls."""
    depth = 0
    for r in refs:
        if type(r) is Var:
            d = r[0].depth
            if d > depth:
                depth = d
    return _node(prim, params, refs, depth + 1, avals, trace, bdims)


def _node1_py(prim, params: tuple, inputs: tuple, depth: int, shape, dtype, trace, bdims):
    """:func:`_node` of a single-output primitive (almost every node; the element-wise fast
    entries call it directly): returns the one output impl, without an avals tuple or a loop.

    ``_node1`` is this function, or its compiled equivalent (core/_graphc.c's ``node1``) when the
    optional extension is built (see graph.COMPILED); tests/core/test_graph_compiled.py compares
    the two."""
    node = _new(Node)
    node.prim = prim
    node.params = params
    node.inputs = inputs
    node.values = None
    node.depth = depth
    node.seq = _next_seq()
    node.trace = trace
    node.bdims = bdims
    if trace is not None:
        node.avals = ((shape, dtype),)
    impl = _new(TensorImpl)
    impl.src = new_var(Var, (node, 0))
    impl.value = impl.lit = impl.sharding = None
    impl.shape = shape
    impl.dtype = dtype
    impl.batch_shape = () if bdims is None else bdims[1]
    wr = _wref(impl)
    node.outs = (wr,)
    pending = CTX.pending
    if len(pending) < 4096:  # inlined fast path of note_pending
        pending.append(wr)
    else:
        note_pending(wr)
    if not depth & 63 and depth > _cfg_get("max_graph_depth"):  # as in _node
        realize_impls([impl], cut=True)
    return impl


def _deep_cut(impls: list, depth: int) -> None:
    """The compiled constructors' check, every 64 levels, of a graph deeper than
    ``max_graph_depth``."""
    if depth > _cfg_get("max_graph_depth"):
        realize_impls(impls, cut=True)


def _load_constructors():
    """``(_node, _node1, _meta)``: compiled when the optional extension is built, else the
    Python ones."""
    compiled = graph._compiled
    if compiled is None:
        return _node_py, _node1_py, _meta_py
    compiled.setup_build(TensorImpl, _next_seq, CTX, note_pending, _deep_cut)
    return compiled.node, compiled.node1, compiled.meta


_node, _node1, _meta = _load_constructors()


def bind_leaf(
    prim, params: tuple, lit: Any, shape: tuple, dtype, trace
) -> Any:  # a pending TensorImpl: its ``src`` is set (callers read the new node)
    """The node of ``prim`` on one leaf literal ``lit`` (a computed, unbatched value), owned by
    ``trace``, output ``(shape, dtype)``: a transform's marker of a parameter (depth 1, no batch
    layout). Returns the output impl."""
    return _node1(prim, params, (lit,), 1, shape, dtype, trace, None)


def bind_unary(prim, params: tuple, x: TensorImpl, shape: tuple, dtype) -> TensorImpl:
    """Fast entry of the element-wise builders: ``prim`` on one impl ``x``, output ``(shape,
    dtype)`` (the same batch layout as ``x``)."""
    ref: Any = x.src
    if ref is None:
        ref, depth, trace = x.lit, 1, None
    else:
        n = ref[0]
        depth, trace = n.depth + 1, n.trace
    b = x.batch_shape
    return _node1(prim, params, (ref,), depth, shape, dtype, trace, ((len(b),), b) if b else None)


def bind_scalar(prim, params: tuple, x: TensorImpl, lit: Literal, first: bool, dtype) -> TensorImpl:
    """Fast entry of the element-wise builders: ``prim`` on the impl ``x`` and the scalar ``lit``
    (``lit`` first when ``first``), output of ``x``'s shape and ``dtype``."""
    ref: Any = x.src
    if ref is None:
        ref, depth, trace = x.lit, 1, None
    else:
        n = ref[0]
        depth, trace = n.depth + 1, n.trace
    b = x.batch_shape
    if b:
        bdims = ((0, len(b)) if first else (len(b), 0), b)
        return _node1(
            prim, params, (lit, ref) if first else (ref, lit), depth, x.shape, dtype, trace, bdims
        )
    return _node1(
        prim, params, (lit, ref) if first else (ref, lit), depth, x.shape, dtype, trace, None
    )


def bind_pair(prim, params: tuple, a: TensorImpl, b: TensorImpl, shape: tuple, dtype) -> TensorImpl:
    """Fast entry of the element-wise builders: ``prim`` on the impls ``a`` and ``b`` (output
    ``(shape, dtype)``), the metadata as :func:`_meta` and :func:`batch_info` compute it."""
    depth = 0
    trace = None
    ra: Any = a.src
    if ra is None:
        ra = a.lit
    else:
        n = ra[0]
        depth, trace = n.depth, n.trace
    rb: Any = b.src
    if rb is None:
        rb = b.lit
    else:
        n = rb[0]
        if n.depth > depth:
            depth = n.depth
        if n.trace is not None:
            trace = deeper(trace, n.trace)
    bdims = batch_info(prim.name, (a, b)) if a.batch_shape or b.batch_shape else None
    return _node1(prim, params, (ra, rb), depth + 1, shape, dtype, trace, bdims)


def batch_info(op: str, inputs) -> tuple:
    """``(batch dims of each input, output batch shape)`` of an op on vmap-batched inputs: batch
    shapes are aligned at the front (outermost vmap first) and broadcast (size 1 stretches)."""
    bds = []
    out: list = []
    for i in inputs:
        b = () if type(i) is Literal else i.batch_shape
        bds.append(len(b))
        for k, d in enumerate(b):
            if k == len(out):
                out.append(d)
            elif out[k] != d and d != 1:
                if out[k] != 1:
                    raise op_error(
                        ValueError,
                        op,
                        f"vmap batch axes of sizes {out[k]} and {d} at level {k} do not match",
                    )
                out[k] = d
    return tuple(bds), tuple(out)


def _dimension_lower(params):
    return jnp.asarray(params[0], dtype=params[1])


# A symbolic size used as a value (``x.sum() / x.shape[0]`` with ``dynamic_dims``): lowered with
# JAX's shape polymorphism. It exists only inside ``nx.compile`` traces (core/transforms/staging.py).
dimension_p = primitive(
    "dimension_value",
    lambda params: (((), params[1]),),
    _dimension_lower,
    jvp=zero_jvp,
    vjp=zero_vjp,
    batch=lambda params, bds: _dimension_lower(params),  # no inputs: never batched itself
    shard=lambda params, lays, ins, outs: ((),),
    differentiable=False,
    doc="The value of a symbolic dimension size (nx.compile dynamic_dims).",
)


def dimension_value(d, dtype=None) -> TensorImpl:
    """A 0-d tensor holding the symbolic size ``d`` (int32 unless ``dtype`` says otherwise)."""
    dt = dtypes.canonicalize(dtype) if dtype is not None else np.dtype(np.int32)
    return bind_known(dimension_p, (), (d, dt), (((), dt),))[0]


def value_impl(x: Any, dtype=None, op: str = "tensor") -> TensorImpl:
    """A realized impl of anything array-like that is not a ``Tensor`` (``to_impl`` in
    core/tensor.py handles those): a ``jax.Array`` is shared (cast on the device if ``dtype``
    differs), host data is converted exactly (core/host.py), a symbolic size becomes a
    ``dimension_value`` node."""
    if isinstance(x, jax.Array):
        if dtype is None:
            return impl_from_array(x)
        return impl_from_array(jnp.asarray(x, dtype=dtypes.canonicalize(dtype)))
    if type(x) in PY_SCALAR_TYPES:
        dt = dtypes.scalar_dtype(x) if dtype is None else dtypes.canonicalize(dtype)
        try:
            return impl_from_array(jnp.asarray(x, dtype=dt))
        except (OverflowError, ValueError, TypeError) as e:  # e.g. an int too large for int32
            raise inexact(type(e), op, repr(x), dt, str(e)) from None
    if jax.export.is_symbolic_dim(x):  # a symbolic size (nx.compile with dynamic_dims)
        return dimension_value(x, dtype)
    a = host_array(x, None if dtype is None else dtypes.canonicalize(dtype), op)
    # ``a`` is ours alone: large ones are 64-byte aligned, and the CPU client adopts them as is
    arr = jnp.asarray(a, dtype=a.dtype) if a.nbytes >= ADOPT_BYTES else jnp.asarray(a)
    return impl_from_array(arr)

"""Building graph nodes: ``TensorImpl`` (a tensor's state) and :func:`make_node`, the one node
constructor.

A ``TensorImpl`` is in one of two states:

- *pending*: ``src`` is the ``Var`` naming the node output that will produce it, ``value is None``;
- *realized*: ``value`` is a ``jax.Array``, ``lit`` its ``Literal`` (what a node built on it takes
  as input) and ``src is None``.

``shape`` is the *logical* shape, the one the user sees. Under ``nx.vmap`` a tensor also has a
``batch_shape``: its physical value has shape ``batch_shape + shape``, the leading axes being the
batch axes of the enclosing vmaps, outermost first (see core/transforms/vmap.py).

:func:`make_node` creates a node and its output impls: every node of the graph is made there
(op builders, transforms, backward-plan replay). :func:`bind` runs a primitive's shape rule on
impl/``Literal`` inputs and calls it.
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from ..errors import op_error
from . import dtypes
from .context import CTX, note_pending
from .graph import Literal, Node, Var, _next_seq, deeper, new_var
from .host import ADOPT_BYTES, PY_SCALAR_TYPES, host_array, inexact
from .primitive import Primitive
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


def make_node(prim, params: tuple, inputs: tuple, depth: int, avals, trace=None, bdims=None):
    """Create the node of one primitive call and a pending impl per output: every ``Node`` of the
    graph is made here.

    ``inputs``: ``Var``/``Literal`` per operand; ``depth``: the node's depth (1 + its deepest
    input's); ``avals``: ``(shape, dtype)`` per output; ``trace``: the deepest differentiation
    trace an input depends on (see graph.Trace); ``bdims``: ``(batch dims of each input, output
    batch shape)`` when an input is vmap-batched. Returns the list of output impls. The new outputs
    join this thread's pending list, and a node deeper than ``max_graph_depth`` is computed at once
    (an automatic cut, checked every 64 levels).
    """
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
    if len(avals) == 1:  # almost every primitive: no loop
        ((shape, dtype),) = avals
        impl = _new(TensorImpl)
        impl.src = new_var(Var, (node, 0))
        impl.value = impl.lit = impl.sharding = None
        impl.shape = shape
        impl.dtype = dtype
        impl.batch_shape = bshape
        impls = [impl]
        wr = _wref(impl)
        node.outs = (wr,)
        pending = CTX.pending
        if len(pending) < 4096:  # inlined fast path of note_pending
            pending.append(wr)
        else:
            note_pending(wr)
    else:
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
        if len(pending) + len(outs) < 4096:  # as above
            pending.extend(outs)
        else:
            for wr in outs:
                note_pending(wr)
    if not depth & 63 and depth > _cfg_get("max_graph_depth"):  # checked every 64 levels: cheap
        realize_impls(impls, cut=True)
    return impls


def bind(prim, inputs, params: tuple = ()) -> list[TensorImpl]:
    """Generic node builder: run the shape rule, then create the node and its outputs.

    ``inputs`` are ``TensorImpl`` or :class:`Literal` objects. Shape/dtype errors raise here, when
    the op is built, not at realization.
    """
    avals = [(i.shape, i.dtype) for i in inputs]
    out_avals = prim.abstract_eval(params, *avals)
    refs = []
    depth = 0
    trace = None
    batched = False
    for i in inputs:
        if type(i) is Literal:
            refs.append(i)
            continue
        if i.batch_shape:
            batched = True
        src = i.src
        if src is None:
            refs.append(i.lit)
        else:
            refs.append(src)
            n = src[0]
            if n.depth > depth:
                depth = n.depth
            if n.trace is not None:
                trace = deeper(trace, n.trace)
    bdims = batch_info(prim.name, inputs) if batched else None
    return make_node(prim, params, tuple(refs), depth + 1, out_avals, trace, bdims)


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
dimension_p = Primitive(
    "dimension_value",
    lambda params: (((), params[1]),),
    _dimension_lower,
    jvp=lambda params, tangents, primals, outs: [None],
    vjp=lambda params, cts, primals, outs: [],
    shard=lambda params, lays, ins, outs: ((),),
    differentiable=False,
    doc="The value of a symbolic dimension size (nx.compile dynamic_dims).",
)


def dimension_value(d, dtype=None) -> TensorImpl:
    """A 0-d tensor holding the symbolic size ``d`` (int32 unless ``dtype`` says otherwise)."""
    dt = dtypes.canonicalize(dtype) if dtype is not None else np.dtype(np.int32)
    return make_node(dimension_p, (d, dt), (), 1, (((), dt),))[0]


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

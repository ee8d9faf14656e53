"""``Tensor`` (the user's object) and ``TensorImpl`` (its state).

A ``TensorImpl`` is in one of two states:

- *pending*: ``src = (node, index)`` names the node output that will produce it, ``value is None``;
- *realized*: ``value`` is a ``jax.Array`` and ``src is None``.

``shape`` is the *logical* shape, the one the user sees. Under ``nx.vmap`` a tensor also has a
``batch_shape``: its physical value has shape ``batch_shape + shape``, the leading ``batch_dims``
axes being the batch axes of the enclosing vmaps, outermost first (see core/transforms/vmap.py). ``Tensor`` is a thin facade over an impl, so that
``x[i] = v`` can rebind ``x`` to a new impl while tensors computed from ``x`` earlier keep the old one.

This module also holds the node-building helpers every op uses (:func:`bind`, :func:`to_impl`) and
``nx.realize``. It imports only the layers below it (graph, context, realize.py); what the layers
above provide comes back through the ``Tensor`` methods they install (``astype``, ...) and the
``_sharding_of`` hook core/sharding.py sets (see tests/test_import_graph.py).
"""

from __future__ import annotations

import weakref
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from ..errors import ConcretizationError, op_error
from . import dtypes
from .context import note_pending
from .graph import Const, Node, deeper, src_node
from .primitive import Primitive
from .realize import realize_impls

_wref = weakref.ref


class TensorImpl:
    (
        """State of one tensor: pending node output or realized ``jax.Array``.

    ``src`` is the producing ``Node`` (single-output primitives) or ``(node, index)``. A realized
    tensor whose node is still needed by a live differentiation trace keeps ``src`` as well as its
    ``value``, so that ops built on it later stay connected to the trace.
    """
        ""
    )

    __slots__ = ("src", "value", "shape", "dtype", "batch_shape", "sharding", "__weakref__")

    def __init__(self, src, value, shape: tuple, dtype, batch_shape: tuple = ()) -> None:
        self.src = src
        self.value = value
        self.shape = shape  # logical
        self.dtype = dtype
        self.batch_shape = batch_shape  # vmap batch axes in front of ``shape`` (physically)
        self.sharding = None

    @property
    def batch_dims(self) -> int:
        return len(self.batch_shape)

    @property
    def ref(self):
        """What a consuming node stores as its input: the value if realized, else ``(node, idx)``."""
        return self.src if self.src is not None else self.value

    @property
    def depth(self) -> int:
        return 0 if self.src is None else src_node(self.src).depth


def impl_from_array(arr: jax.Array) -> TensorImpl:
    """A realized impl around a ``jax.Array`` (shares the buffer)."""
    if getattr(arr, "weak_type", False):
        arr = jax.lax.convert_element_type(arr, arr.dtype)  # nablax tensors are strongly typed
    return TensorImpl(None, arr, tuple(arr.shape), np.dtype(arr.dtype))


def make_outputs(
    prim, params: tuple, refs: tuple, depth: int, out_avals, trace=None, bdims=None
) -> list[TensorImpl]:
    """Create the node for one primitive call and one pending impl per output aval.

    ``bdims``: ``(input batch dims, output batch shape)`` when an input is vmap-batched."""
    node = Node(prim, params, refs, depth, trace)
    if trace is not None:
        node.avals = tuple(out_avals)
    bshape = ()
    if bdims is not None:
        node.bdims = bdims
        bshape = bdims[1]
    if prim.multiple_results:
        impls = [TensorImpl((node, i), None, s, d, bshape) for i, (s, d) in enumerate(out_avals)]
    else:
        ((s, d),) = out_avals
        impls = [TensorImpl(node, None, s, d, bshape)]
    node.outs = tuple(_wref(t) for t in impls)
    for wr in node.outs:
        note_pending(wr)
    if not depth & 63 and depth > _config.get("max_graph_depth"):  # checked every 64 levels
        realize_impls(impls)
    return impls


def bind(prim, inputs, params: tuple = ()) -> list[TensorImpl]:
    """Generic node builder: run the shape rule, then create the node and its outputs.

    ``inputs`` are ``TensorImpl`` or :class:`Const` objects. Shape/dtype errors raise here, when the
    op is built, not at realization.
    """
    avals = [(i.shape, i.dtype) for i in inputs]
    out_avals = prim.abstract_eval(params, *avals)
    refs = []
    depth = 0
    trace = None
    batched = False
    for i in inputs:
        if type(i) is Const:
            refs.append(i)
            continue
        if i.batch_shape:
            batched = True
        if i.src is None:
            refs.append(i.value)
        else:
            refs.append(i.src)
            n = src_node(i.src)
            if n.depth > depth:
                depth = n.depth
            if n.trace is not None:
                trace = deeper(trace, n.trace)
    bdims = batch_info(prim.name, inputs) if batched else None
    return make_outputs(prim, params, tuple(refs), depth + 1, out_avals, trace, bdims)


def batch_info(op: str, inputs) -> tuple:
    """``(batch dims of each input, output batch shape)`` of an op on vmap-batched inputs: batch
    shapes are aligned at the front (outermost vmap first) and broadcast (size 1 stretches)."""
    bds = []
    out: list = []
    for i in inputs:
        b = () if type(i) is Const else i.batch_shape
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


_PY_SCALAR_TYPES = (bool, int, float, complex)
_ACCEPTED = (
    "pass Python numbers (bool, int, float, complex), nested lists/tuples of them, NumPy arrays "
    "or scalars, objects with __array__ or the buffer protocol, a jax.Array or an nx.Tensor"
)
_ALIGN = 64  # the CPU client adopts host buffers aligned like this without copying them
_ADOPT_BYTES = 1 << 17  # from this size on, one aligned host copy beats JAX's own copy path


def to_impl(x: Any, dtype=None, op: str = "tensor") -> TensorImpl:
    """Any array-like (Tensor, jax/NumPy array, nested lists, scalars) as a ``TensorImpl``.

    ``op`` names the public function in error messages (``nx.<op>: ...``). Host memory the user
    still owns (NumPy arrays, ``__array__`` objects, buffers) is always copied, so a later write to
    it never changes a tensor; a ``jax.Array`` (immutable) is shared. Host data converts exactly or
    raises: integers that do not fit the target dtype raise ``OverflowError`` (also where JAX
    would wrap an int64 array to int32), NaN to an integer dtype ``ValueError``, complex values
    with an imaginary part to a real dtype and non-numeric data ``TypeError``. Floats follow
    NumPy/JAX (rounded; too large for the dtype: ``inf``). A ``jax.Array`` or Tensor with another
    ``dtype`` is cast on the device, like ``astype``.
    """
    if type(x) is Tensor and dtype is None:
        return x._impl
    if isinstance(x, Tensor):
        return _cast(x._impl, dtype)
    if isinstance(x, jax.Array):
        if dtype is None:
            return impl_from_array(x)
        return impl_from_array(jnp.asarray(x, dtype=dtypes.canonicalize(dtype)))
    if type(x) in _PY_SCALAR_TYPES:
        dt = dtypes.scalar_dtype(x) if dtype is None else dtypes.canonicalize(dtype)
        try:
            return impl_from_array(jnp.asarray(x, dtype=dt))
        except (OverflowError, ValueError, TypeError) as e:  # e.g. an int too large for int32
            raise _inexact(type(e), op, repr(x), dt, str(e)) from None
    if jax.export.is_symbolic_dim(x):  # a symbolic size (nx.compile with dynamic_dims)
        return dimension_value(x, dtype)
    a = _host_array(x, None if dtype is None else dtypes.canonicalize(dtype), op)
    # ``a`` is ours alone: large ones are 64-byte aligned, and the CPU client adopts them as is
    arr = jnp.asarray(a, dtype=a.dtype) if a.nbytes >= _ADOPT_BYTES else jnp.asarray(a)
    return impl_from_array(arr)


def _cast(impl: TensorImpl, dtype) -> TensorImpl:
    if dtype is None or impl.dtype == dtypes.canonicalize(dtype):
        return impl
    return Tensor._wrap(impl).astype(dtype)._impl  # the method core/ops/elementwise.py installs


def _dimension_lower(params):
    return jnp.asarray(params[0], dtype=params[1])


# A symbolic size used as a value (``x.sum() / x.shape[0]`` with ``dynamic_dims``): lowered with
# JAX's shape polymorphism. It exists only inside ``nx.compile`` traces (core/transforms/staging.py).
dimension_p = Primitive(
    "dimension_value",
    lambda params: (((), params[1]),),
    _dimension_lower,
    differentiable=False,
    doc="The value of a symbolic dimension size (nx.compile dynamic_dims).",
)
dimension_p.jvp = lambda params, tangents, primals, outs: [None]
dimension_p.vjp = lambda params, cts, primals, outs: []
dimension_p.shard = lambda params, lays, ins, outs: ((),)


def dimension_value(d, dtype=None) -> TensorImpl:
    """A 0-d tensor holding the symbolic size ``d`` (int32 unless ``dtype`` says otherwise)."""
    dt = dtypes.canonicalize(dtype) if dtype is not None else np.dtype(np.int32)
    node = Node(dimension_p, (d, dt), (), 1, None)
    impl = TensorImpl(node, None, (), dt)
    node.outs = (_wref(impl),)
    return impl


def _not_numeric(x: Any, op: str, detail: str = "") -> TypeError:
    what = f"{type(x).__name__} {x!r}"
    what = what if len(what) <= 60 else what[:57] + "..."
    return op_error(TypeError, op, f"cannot make a tensor from {what}{detail}", _ACCEPTED)


def _inexact(cls, op: str, value: str, dt, why: str):
    return op_error(
        cls,
        op,
        f"{value} cannot be converted to {dt} exactly ({why})",
        "pass a dtype that holds the values (e.g. dtype=nx.float32), or cast the NumPy data "
        "yourself first if wrapping/truncation is what you want",
    )


def _is_numeric(dt: np.dtype) -> bool:
    if dt.kind in "biufc":
        return True  # bfloat16 & co. (ml_dtypes) have kind 'V' but are numbers
    return dt.kind == "V" and dt.names is None and bool(jnp.issubdtype(dt, np.number))


def _host_array(x: Any, target, op: str) -> np.ndarray:
    """``x`` as a NumPy array of the canonical (or requested) dtype that no one else holds."""
    fresh = isinstance(x, (list, tuple, range, np.generic))  # np.asarray builds a new array
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested sequences, among others
        raise _not_numeric(x, op, f": {e}") from None
    if a.dtype.kind == "O":
        if not isinstance(x, (list, tuple)):
            raise _not_numeric(x, op, " (dtype object)" if isinstance(x, np.ndarray) else "")
        a, target = _python_numbers(x, a, target, op), None  # exact, already in its dtype
        fresh = True
    elif not _is_numeric(a.dtype):
        raise _not_numeric(x, op, f" (dtype {a.dtype})")
    if target is None:
        # a Python int beyond int64 made NumPy pick uint64; JAX's dtype for Python ints is int32
        big = a.dtype == np.uint64 and isinstance(x, (list, tuple))
        target = dtypes.int32 if big else dtypes.canonicalize(a.dtype)
    if a.dtype != target:
        _check_exact(a, target, op)
        if a.dtype.kind == "c" and target.kind != "c":
            a = a.real
    elif fresh and (a.nbytes < _ADOPT_BYTES or not a.ctypes.data % _ALIGN):
        return a
    return _private_copy(a, target)


def _python_numbers(x, a: np.ndarray, target, op: str) -> np.ndarray:
    """Nested Python data NumPy could only hold as objects: ints beyond int64 (maybe with floats),
    or something that is not a number."""
    kinds = set()
    for v in a.flat:
        if isinstance(v, (bool, np.bool_)):
            kinds.add("b")
        elif isinstance(v, (int, np.integer)):
            kinds.add("i")
        elif isinstance(v, (float, np.floating)):
            kinds.add("f")
        elif isinstance(v, (complex, np.complexfloating)):
            kinds.add("c")
        else:
            raise _not_numeric(x, op, f" (it holds {type(v).__name__} {v!r:.40})")
    if target is None:  # the dtype JAX gives such data (weakly typed Python numbers)
        target = (
            dtypes.complex64 if "c" in kinds else dtypes.float32 if "f" in kinds else dtypes.int32
        )
    if target.kind in "iu":
        info = np.iinfo(target)
        for v in a.flat:
            if isinstance(v, (int, np.integer)) and not info.min <= int(v) <= info.max:
                raise _inexact(OverflowError, op, str(int(v)), target, "out of range")
    try:
        return np.array(a.tolist(), dtype=target)
    except (OverflowError, ValueError, TypeError) as e:
        raise _inexact(type(e), op, "a value", target, str(e)) from None


def _check_exact(a: np.ndarray, target: np.dtype, op: str) -> None:
    """Raise unless every value of ``a`` converts to ``target`` (ints in range, floats finite and
    in range for integer targets, no imaginary parts dropped)."""
    src = a.dtype
    if not a.size or target.kind == "b":
        return
    if src.kind == "c" and target.kind != "c" and np.any(a.imag):
        raise _inexact(TypeError, op, "complex data", target, "it has imaginary parts")
    if target.kind not in "iu" or src.kind == "b":
        return  # floats: rounding and overflow to inf, as NumPy and JAX
    info = np.iinfo(target)
    if src.kind in "iu":
        si = np.iinfo(src)
        if si.min >= info.min and si.max <= info.max:
            return
        lo, hi = a.min(), a.max()
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise _inexact(
                OverflowError, op, f"value {bad}", target, f"outside [{info.min}, {info.max}]"
            )
        return
    f = np.asarray(a.real if src.kind == "c" else a, dtype=np.float64)
    if np.isnan(f).any():
        raise _inexact(ValueError, op, "NaN", target, "integers have no NaN")
    lo, hi = f.min(), f.max()
    if not (info.min - 1 < lo and hi < info.max + 1):  # values truncate toward zero
        bad = lo if not info.min - 1 < lo else hi
        raise _inexact(
            OverflowError, op, f"value {bad}", target, f"outside [{info.min}, {info.max}]"
        )


def exact_scalar(v: Any, dt: np.dtype, op: str):
    """A Python/NumPy scalar as the Python value that becomes a constant of ``dt``, checked as
    :func:`to_impl` checks host data: ints must fit, floats for an integer dtype must be finite and
    in range (they truncate toward zero), an imaginary part is never dropped; non-numbers raise
    ``TypeError`` naming ``op``."""
    if isinstance(v, np.generic) and _is_numeric(v.dtype):
        v = v.item()
    t = type(v)
    if t not in _PY_SCALAR_TYPES:
        raise _not_numeric(v, op)
    if t is complex and dt.kind != "c":
        if v.imag:
            raise _inexact(TypeError, op, repr(v), dt, "it has an imaginary part")
        v, t = v.real, float
    if dt.kind not in "iu":
        return v  # bool: truthiness; floats: rounding and overflow to inf, as NumPy and JAX
    info = np.iinfo(dt)
    if t is float:
        if v != v:
            raise _inexact(ValueError, op, "NaN", dt, "integers have no NaN")
        if not info.min - 1 < v < info.max + 1:
            raise _inexact(OverflowError, op, repr(v), dt, f"outside [{info.min}, {info.max}]")
        return int(v)
    if not info.min <= v <= info.max:
        raise _inexact(OverflowError, op, repr(v), dt, f"outside [{info.min}, {info.max}]")
    return v


def _private_copy(a: np.ndarray, target: np.dtype) -> np.ndarray:
    """A C-contiguous copy of ``a`` in ``target``; large ones 64-byte aligned (adopted by JAX)."""
    nbytes = a.size * target.itemsize
    if nbytes < _ADOPT_BYTES:
        return np.array(a, dtype=target, order="C", copy=True)
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    out = raw[start : start + nbytes].view(target).reshape(a.shape)
    np.copyto(out, a, casting="unsafe")
    return out


def _batched_read(t, what: str):
    raise ConcretizationError(
        f"nx.vmap: cannot {what} a tensor inside a vmapped function: it has a different value "
        f"for each example (per-example shape {t.shape}, batch {t._impl.batch_shape}). Fix: use "
        f"nx.where(cond, a, b) to choose per example instead of Python if/while, and read values "
        f"after nx.vmap returns"
    )


class Tensor:
    """A lazy-eager n-dimensional array.

    Operations record a graph; values are computed (one XLA program for all pending work) when one
    is needed: ``numpy()``, ``item()``, ``print``, ``bool()``, ``float()``, iteration, or
    ``nx.realize``.

    >>> import nablax as nx
    >>> x = nx.tensor([[1., 2.], [3., 4.]])
    >>> y = x @ x.T + 1
    >>> y.is_realized
    False
    >>> y.tolist()
    [[6.0, 12.0], [12.0, 26.0]]
    """

    __slots__ = ("_impl", "_grad", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators (np_array + tensor)
    __array_priority__ = 1000

    def __init__(self, data: Any, dtype=None) -> None:
        self._impl = to_impl(data, dtype)

    @classmethod
    def _wrap(cls, impl: TensorImpl) -> Tensor:
        t = object.__new__(cls)
        t._impl = impl
        return t

    # ---- attributes -------------------------------------------------------------------------
    @property
    def shape(self) -> tuple:
        return self._impl.shape

    @property
    def dtype(self) -> np.dtype:
        return self._impl.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def sharding(self):
        """The ``ShardingSpec`` of this tensor, or ``None`` (see core/sharding.py)."""
        s = self._impl.sharding
        if s is None:  # computed only when read: nothing extra on the op-building path
            return _sharding_of(self._impl)
        return s

    @property
    def is_realized(self) -> bool:
        return self._impl.value is not None

    # ---- realization ------------------------------------------------------------------------
    def _realized_value(self) -> jax.Array:
        impl = self._impl
        if impl.batch_shape:
            _batched_read(self, "read the value of")
        if impl.value is None:
            realize_impls([impl])
        return impl.value

    def to_jax(self) -> jax.Array:
        """The value as a ``jax.Array`` (realizes)."""
        return self._realized_value()

    def block_until_ready(self) -> Tensor:
        """Realize this tensor and wait until its value is computed; returns ``self``.

        Programs run asynchronously (reading a value waits only for that value), so timing code
        should call this, like ``jax.Array.block_until_ready``.
        """
        self._realized_value().block_until_ready()
        return self

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array (realizes)."""
        return np.asarray(self._realized_value())

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = np.asarray(self._realized_value())
        return a if dtype is None else a.astype(dtype)

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(
                f"Tensor.item: only a tensor with exactly one element can become a Python scalar, "
                f"got shape {self.shape}. Fix: index it first, e.g. x[0].item()"
            )
        return self.numpy().item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def _scalar(self, kind: str):
        if self.size != 1:
            raise TypeError(
                f"{kind}(Tensor): only one-element tensors can be converted to Python scalars, "
                f"got shape {self.shape}"
            )
        return self.numpy().reshape(())[()]

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex"))

    def __index__(self) -> int:
        if not dtypes.is_integer(self.dtype) or self.ndim:
            raise TypeError(
                f"only 0-d integer tensors can be used as an index, got {self.dtype}{list(self.shape)}"
            )
        return int(self.numpy())

    def __bool__(self) -> bool:
        if self._impl.batch_shape:
            _batched_read(self, "take the truth value (Python if/while/and/or) of")
        if self.size != 1:
            raise ValueError(
                f"The truth value of a tensor with shape {self.shape} is ambiguous. "
                f"Fix: use x.any() / x.all(), or nx.where for element-wise choices"
            )
        return bool(self._scalar("bool"))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        v = self._realized_value()
        for i in range(self.shape[0]):
            yield Tensor._wrap(impl_from_array(v[i]))

    def __repr__(self) -> str:
        if self._impl.batch_shape:
            return (
                f"tensor(<batched by nx.vmap: {self._impl.batch_shape} examples>, "
                f"shape={self.shape}, dtype={self.dtype})"
            )
        a = self.numpy()
        body = np.array2string(a, separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype})"

    def __str__(self) -> str:
        return str(self.numpy())

    __hash__ = object.__hash__

    def __reduce__(self):
        return (Tensor, (self.numpy(),))


def _no_sharding_rules(impl):
    raise AssertionError("nablax: core/sharding.py was not imported")  # nablax/__init__ imports it


# ``Tensor.sharding`` of a tensor without an explicit spec: layouts propagated through the ops'
# sharding rules. core/sharding.py, a layer above this module, sets it when it is imported.
_sharding_of = _no_sharding_rules


def realize(*tensors) -> None:
    """Compute all pending work behind ``tensors`` as one program (pytrees of tensors allowed).

    >>> import nablax as nx
    >>> a = nx.ones(3) * 2
    >>> b = a + 1
    >>> nx.realize(a, b)
    >>> a.is_realized and b.is_realized
    True
    """
    if len(tensors) == 1 and type(tensors[0]) is Tensor:  # the common nx.realize(x)
        impl = tensors[0]._impl
        if impl.value is None:
            realize_impls([impl])
        return
    impls = []
    for t in jax.tree_util.tree_leaves(tensors):  # a Tensor is a leaf (not a pytree node)
        if isinstance(t, Tensor) and t._impl.value is None:
            impls.append(t._impl)
    if impls:
        realize_impls(impls)

"""Indexing: ``x[idx]``, ``x.at[idx].set/add``, ``x[idx] = v``, ``take``, ``take_along_axis``,
``one_hot``.

Every index expression becomes one ``gather`` (read) or ``scatter`` (update) node whose static
parameter is the *index structure* (ints, slices, ``None``, ``...`` and placeholders for integer
index tensors, which are node inputs). Semantics are NumPy's, computed with NumPy itself on a
zero-strided dummy array, so shapes and errors match NumPy exactly and are raised when the op is
built. Integer index tensors whose values are unknown follow ``x[idx]`` in JAX: a negative index
counts from the end once, then out-of-range reads clamp to the nearest element (and get no
gradient) and out-of-range updates are dropped; concrete NumPy/list indices are bounds-checked like
NumPy. ``take`` / ``take_along_axis`` follow ``jnp.take``'s ``mode=`` instead (default ``"fill"``).

Boolean masks depend on data: the mask is realized and turned into integer indices (eager code only).
"""

from __future__ import annotations

import math
import operator

import jax
import jax.numpy as jnp
import numpy as np

from ... import _caches
from ...errors import ShapeError, op_error
from .. import dtypes
from ..build import TensorImpl, bind, impl_from_array
from ..host import exact_scalar
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from ._util import broadcast_shapes, is_concrete, norm_axis
from .creation import iota, zeros
from .elementwise import astype, clip, equal, logical_and, mod, where
from .shape import _reshape, expand_dims, reshape

_T = ("t",)  # placeholder for an index tensor in the structure


def _dummy(shape) -> np.ndarray:
    return np.broadcast_to(np.int8(0), shape)


def _rebuild(structure, idx_values):
    it = iter(idx_values)
    out = []
    for item in structure:
        if item is _T or item == _T:
            out.append(next(it))
        elif item[0] == "i":
            out.append(item[1])
        elif item[0] == "s":
            out.append(slice(item[1], item[2], item[3]))
        elif item[0] == "n":
            out.append(None)
        elif item[0] == "b":
            out.append(item[1])
        else:
            out.append(Ellipsis)
    return tuple(out)


_shape_cache = _caches.Cache("ops.getitem_shapes", 4096)


def _gather_shape(x_shape, structure, idx_avals) -> tuple:
    key = (x_shape, structure, tuple(idx_avals))
    r = _shape_cache.get(key)
    if r is None:
        r = _gather_shape_uncached(x_shape, structure, idx_avals)
        if is_concrete(key):
            _shape_cache.put(key, r)
    return r


def _gather_shape_uncached(x_shape, structure, idx_avals) -> tuple:
    if not all(type(d) is int for s in (x_shape, *(a[0] for a in idx_avals)) for d in s):
        return _symbolic_gather_shape(x_shape, structure, idx_avals)
    dummies = [np.zeros(s, dtype=np.intp) for s, _ in idx_avals]
    try:
        return _dummy(x_shape)[_rebuild(structure, dummies)].shape
    except IndexError as e:
        raise op_error(IndexError, "getitem", f"{e} (tensor shape {x_shape})") from None


def _symbolic_gather_shape(x_shape, structure, idx_avals) -> tuple:
    """Result shape when a size is symbolic (``nx.compile`` with ``dynamic_dims``): JAX's own
    shape rule on abstract values (no NumPy stand-ins)."""
    structs = [jax.ShapeDtypeStruct(s, np.int32) for s, _ in idx_avals]
    out = jax.eval_shape(
        lambda a, *ix: a[_rebuild(structure, ix)], jax.ShapeDtypeStruct(x_shape, np.int8), *structs
    )
    return tuple(out.shape)


def _gather_aval(params, x, *idx):
    return ((_gather_shape(x[0], params[0], idx), x[1]),)


def _gather_lower(params, x, *idx):
    if len(params) == 1:  # ``x[idx]``: out-of-range reads clamp (JAX indexing)
        return x[_rebuild(params[0], idx)]
    # ``(structure, fill)``: out-of-range reads give the fill value (see :func:`fill_code`)
    return x.at[_rebuild(params[0], idx)].get(mode="fill", fill_value=fill_value(params[1]))


gather_p = primitive(
    "gather",
    _gather_aval,
    _gather_lower,
    doc="x[index] (params: (structure,)); with (structure, fill), out-of-range reads give fill.",
)


def fill_code(v):
    """A fill value as a gather parameter: ``None`` (JAX's default fill: NaN, the most negative
    int, the largest unsigned, True) or a hashable exact code (floats by their hex form, so
    ``-0.0`` and ``0.0`` are different programs and NaN equals NaN)."""
    if v is None:
        return None
    if isinstance(v, float):
        return ("f", v.hex())
    if isinstance(v, complex):
        return ("c", v.real.hex(), v.imag.hex())
    return ("x", v)


def fill_value(code):
    """The Python value of :func:`fill_code`'s ``code``."""
    if code is None:
        return None
    if code[0] == "f":
        return float.fromhex(code[1])
    if code[0] == "c":
        return complex(float.fromhex(code[1]), float.fromhex(code[2]))
    return code[1]


def _scatter_aval(params, x, v, *idx):
    return (x,)


def _scatter_lower(params, x, v, *idx):
    structure, mode = params
    ref = x.at[_rebuild(structure, idx)]
    v = v.astype(x.dtype)
    return ref.set(v) if mode == "set" else ref.add(v)


scatter_p = primitive("scatter", _scatter_aval, _scatter_lower)

# ---- index parsing ---------------------------------------------------------------------------


def _as_int(v, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, Tensor):
        return int(v)
    try:
        return int(np.asarray(v).__index__()) if not isinstance(v, int) else v
    except TypeError:
        raise IndexError(f"nx.getitem: {what} must be an int or None, got {v!r}") from None


def _parse(x: TensorImpl, idx):
    """Index expression -> (structure, index impls, NumPy stand-in index or None).

    The stand-in is the same index with NumPy values (masks as masks, concrete integer arrays as
    themselves, pending index tensors as zeros); it is returned only when NumPy must validate it
    (mask lengths, bounds of concrete indices).
    """
    if not isinstance(idx, tuple):
        idx = (idx,)
    structure: list = []
    tensors: list[TensorImpl] = []
    raw: list = []
    check = False
    for item in idx:
        if item is None:
            structure.append(("n",))
            raw.append(None)
        elif item is Ellipsis:
            structure.append(("e",))
            raw.append(Ellipsis)
        elif isinstance(item, slice):
            sl = (
                "s",
                _as_int(item.start, "slice start"),
                _as_int(item.stop, "slice stop"),
                _as_int(item.step, "slice step"),
            )
            structure.append(sl)
            raw.append(slice(sl[1], sl[2], sl[3]))
        elif isinstance(item, (bool, np.bool_)):
            structure.append(("b", bool(item)))  # NumPy: a new axis of length 1 (True) or 0
            raw.append(bool(item))
        elif isinstance(item, (int, np.integer)):
            structure.append(("i", int(item)))
            raw.append(int(item))
        elif isinstance(item, Tensor):
            if item.dtype == dtypes.bool_:
                check |= _add_mask(item.numpy(), structure, tensors, raw)  # realizes: shape is data
            elif dtypes.is_integer(item.dtype):
                structure.append(_T)
                tensors.append(item._impl)
                symbolic = not all(type(d) is int for d in item.shape)  # dynamic_dims
                raw.append(None if symbolic else np.zeros(item.shape, np.intp))
            else:
                raise IndexError(
                    f"nx.getitem: index tensors must be integer or bool, got {item.dtype}"
                )
        else:
            arr = np.asarray(item)
            if arr.dtype == np.bool_:
                check |= _add_mask(arr, structure, tensors, raw)
            elif arr.dtype.kind in "iu" or (arr.size == 0 and arr.dtype.kind in "fO"):
                arr = arr.astype(np.int32)
                structure.append(_T)
                tensors.append(impl_from_array(_device(arr)))
                raw.append(arr)
                check = True
            else:
                raise IndexError(
                    f"nx.getitem: only integers, slices, None, ..., and integer or boolean "
                    f"arrays are valid indices, got {type(item).__name__} {item!r}"[:200]
                )
    return tuple(structure), tensors, (tuple(raw) if check else None)


def _device(arr):
    return jnp.asarray(arr)


def _add_mask(mask: np.ndarray, structure, tensors, raw) -> bool:
    if mask.ndim == 0:
        structure.append(("b", bool(mask)))
        raw.append(bool(mask))
        return False
    for a in np.nonzero(mask):
        structure.append(_T)
        tensors.append(impl_from_array(_device(a.astype(np.int32))))
    raw.append(mask)  # NumPy checks the mask's shape against the axes it covers
    return True


def _check(x: TensorImpl, raw, op: str) -> None:
    if raw is None:
        return
    try:
        _dummy(x.shape)[raw]
    except IndexError as e:
        raise op_error(IndexError, op, f"{e} (tensor shape {x.shape})") from None


def getitem(x, idx) -> Tensor:
    """``x[idx]`` with NumPy semantics (basic and advanced indexing, boolean masks).

    Out-of-range indices: concrete ones (ints, lists, NumPy arrays) raise ``IndexError`` when the
    op is built, as NumPy; integer index tensors behave as in JAX (``-1`` is the last element,
    other out-of-range reads clamp and pass no gradient back). Use :func:`take` with ``mode=``
    to choose what out-of-range indices give.

    >>> import nablax as nx
    >>> x = nx.arange(12).reshape(3, 4)
    >>> x[1:, [0, 3]].tolist()
    [[4, 7], [8, 11]]
    >>> x[x % 5 == 0].tolist()
    [0, 5, 10]
    """
    xi = x._impl if isinstance(x, Tensor) else to_impl(x, op="getitem")
    structure, tensors, raw = _parse(xi, idx)
    _check(xi, raw, "getitem")
    if all(s == ("s", None, None, None) for s in structure) or structure == (("e",),):
        return Tensor._wrap(xi)
    return Tensor._wrap(bind(gather_p, [xi, *tensors], (structure,))[0])


def _update(x, idx, v, mode: str) -> Tensor:
    xi = x._impl if isinstance(x, Tensor) else to_impl(x, op=f"at[].{mode}")
    structure, tensors, raw = _parse(xi, idx)
    _check(xi, raw, f"at[].{mode}")
    target = _gather_shape(xi.shape, structure, [(t.shape, t.dtype) for t in tensors])
    vi = v._impl if isinstance(v, Tensor) else to_impl(v, xi.dtype, f"at[].{mode}")
    try:
        if broadcast_shapes("at[].set", vi.shape, target) != target:
            raise ShapeError
    except ShapeError:
        raise op_error(
            ShapeError,
            f"at[].{mode}",
            f"value of shape {vi.shape} cannot be broadcast to the indexed shape {target}",
        ) from None
    return Tensor._wrap(bind(scatter_p, [xi, vi, *tensors], (structure, mode))[0])


class _IndexUpdateRef:
    __slots__ = ("_x", "_idx")

    def __init__(self, x, idx) -> None:
        self._x = x
        self._idx = idx

    def set(self, values) -> Tensor:
        """A new tensor equal to ``x`` with ``x[idx]`` replaced by ``values``."""
        return _update(self._x, self._idx, values, "set")

    def add(self, values) -> Tensor:
        """A new tensor with ``values`` added at ``idx`` (duplicate indices accumulate)."""
        return _update(self._x, self._idx, values, "add")

    def get(self) -> Tensor:
        return getitem(self._x, self._idx)


class _IndexUpdateHelper:
    """``x.at[idx]``: functional updates, as ``jax.Array.at``."""

    __slots__ = ("_x",)

    def __init__(self, x) -> None:
        self._x = x

    def __getitem__(self, idx) -> _IndexUpdateRef:
        return _IndexUpdateRef(self._x, idx)


def _setitem(self: Tensor, idx, value) -> None:
    # Rebind this tensor object to the updated value; tensors computed from it earlier keep theirs.
    self._impl = _update(self, idx, value, "set")._impl


_MODES = {"take": ("fill", "clip", "wrap"), "take_along_axis": ("fill", "clip")}


def _take_mode(op: str, mode) -> str:
    m = "fill" if mode is None else mode
    if m not in _MODES[op]:
        raise op_error(
            ValueError, op, f"mode={mode!r} is not supported", f"use one of {_MODES[op]} or None"
        )
    return m


def _index_array(op: str, indices):
    """Integer indices as a Tensor (kept lazy) or, for host data, a NumPy int64 array."""
    if isinstance(indices, Tensor):
        dt = indices.dtype
    else:
        if not isinstance(indices, jax.Array):
            try:
                a = np.asarray(indices)
            except ValueError:  # ragged: to_impl below says so, naming ``op``
                a = None
            if a is not None and (a.dtype.kind in "iu" or (a.size == 0 and a.dtype.kind == "f")):
                return a.astype(np.int64)
        indices = Tensor._wrap(to_impl(indices, op=op))
        dt = indices.dtype
    if not dtypes.is_integer(dt):
        raise op_error(
            TypeError, op, f"indices must be integers, got {dt}", "cast them with .astype(nx.int32)"
        )
    return indices.astype(dtypes.int32) if dt.itemsize < 4 else indices  # room for i + size


def _in_range(idx, n: int, mode: str, wrap_negative: bool):
    """``(indices inside [0, n), valid mask or None)`` for ``mode`` (see :func:`take`)."""
    if isinstance(idx, np.ndarray):  # host indices: computed now, no graph ops
        if mode == "wrap":
            return np.mod(idx, n).astype(np.int32), None
        if wrap_negative or mode == "fill":
            idx = np.where(idx < 0, idx + n, idx)
        if mode == "clip":
            return np.clip(idx, 0, n - 1).astype(np.int32), None
        valid = (idx >= 0) & (idx < n)
        if valid.all():
            return idx.astype(np.int32), None
        return np.where(valid, idx, 0).astype(np.int32), valid
    signed = idx.dtype.kind == "i"
    if mode == "wrap":
        return mod(idx, n), None
    if mode == "clip":
        if signed and wrap_negative:
            idx = where(idx < 0, idx + n, idx)
        return clip(idx, 0, n - 1), None
    # fill: the gather wraps negative indices and clamps the rest itself (JAX indexing); reads
    # that were out of range are then replaced, and no gradient flows through them
    return idx, (logical_and(idx >= -n, idx < n) if signed else idx < n)


def _gather_filled(op: str, t: Tensor, index: tuple, fill) -> Tensor:
    """``t[index]`` where index tensors out of range (after wrapping negative ones once) read
    ``fill`` (``None``: JAX's default fill, see :func:`_filled`): one ``gather`` node."""
    if fill is not None:
        fill = exact_scalar(fill, t.dtype, op)
        if t.dtype == dtypes.bool_:
            fill = bool(fill)
        elif dtypes.is_inexact(t.dtype) and fill != fill:
            fill = None  # NaN: the default fill of inexact dtypes
    structure, tensors, _ = _parse(t._impl, index)
    return Tensor._wrap(bind(gather_p, [t._impl, *tensors], (structure, fill_code(fill)))[0])


def _filled(op: str, out: Tensor, valid, fill_value) -> Tensor:
    """``out`` where ``valid`` (broadcast), else the fill value (JAX's defaults: NaN for inexact
    dtypes, the most negative value for signed ints, the largest for unsigned, True for bool)."""
    if valid is None:
        return out
    dt = out.dtype
    if fill_value is None:
        if dt == dtypes.bool_:
            fill_value = True
        elif dtypes.is_inexact(dt):
            fill_value = float("nan")
        else:
            info = np.iinfo(dt)
            fill_value = int(info.max if dt.kind == "u" else info.min)
    fill = exact_scalar(fill_value, dt, op)
    if dt == dtypes.bool_:
        fill = bool(fill)
    return where(valid, out, fill)  # a Python scalar of out's kind: a constant of out's dtype


def take(x, indices, axis: int | None = None, mode: str | None = None, fill_value=None) -> Tensor:
    """Elements of ``x`` at ``indices`` along ``axis`` (flattened when None), as ``jnp.take``.

    Out-of-range indices follow ``mode``, as in JAX: ``"fill"`` (the default, also ``None``)
    wraps negative indices once (``-1`` is the last) and gives ``fill_value`` where an index is
    still outside ``[0, n)`` (default: NaN for floats, the most negative int for signed ints, the
    largest for unsigned, True for bool; no gradient flows there); ``"clip"`` clamps every index
    into ``[0, n - 1]`` (negative ones to 0); ``"wrap"`` takes indices modulo ``n``.

    >>> import nablax as nx
    >>> x = nx.tensor([10., 20., 30.])
    >>> nx.take(x, [0, -1, 3]).tolist()
    [10.0, 30.0, nan]
    >>> nx.take(x, [0, -1, 3], mode="clip").tolist(), nx.take(x, [4, -1], mode="wrap").tolist()
    ([10.0, 10.0, 30.0], [20.0, 30.0])
    """
    m = _take_mode("take", mode)
    t = x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x, op="take"))
    if axis is None:
        t, ax = _reshape(t, (-1,), "take"), 0
    else:
        ax = norm_axis("take", axis, t.shape)
    n = t.shape[ax]
    idx = _index_array("take", indices)
    if n == 0:
        if math.prod(idx.shape):
            raise op_error(IndexError, "take", f"cannot take from axis {ax} of size 0")
        return zeros(t.shape[:ax] + tuple(idx.shape) + t.shape[ax + 1 :], t.dtype)
    index = (slice(None),) * ax
    if m == "fill" and isinstance(idx, Tensor):  # one gather that fills (as JAX's)
        return _gather_filled("take", t, index + (idx,), fill_value)
    safe, valid = _in_range(idx, n, m, wrap_negative=False)
    out = getitem(t, index + (safe,))
    if valid is not None:
        valid = reshape(valid, (1,) * ax + tuple(np.shape(valid)) + (1,) * (t.ndim - ax - 1))
    return _filled("take", out, valid, fill_value)


def take_along_axis(
    arr, indices, axis: int | None = -1, mode: str | None = None, fill_value=None
) -> Tensor:
    """Pick values along ``axis`` with an index tensor of the same rank (other axes broadcast),
    as ``jnp.take_along_axis``; ``axis=None`` takes from the flattened ``arr`` (1-d indices).

    Negative indices count from the end. Indices still out of range follow ``mode``:
    ``"fill"`` (the default, also ``None``) gives ``fill_value`` there (defaults as in
    :func:`take`; no gradient flows there), ``"clip"`` clamps them into ``[0, n - 1]``.

    >>> import nablax as nx
    >>> x = nx.tensor([[1., 2., 3.], [4., 5., 6.]])
    >>> nx.take_along_axis(x, nx.tensor([[2], [-3]]), axis=1).tolist()
    [[3.0], [4.0]]
    >>> nx.take_along_axis(x, nx.tensor([[1, 0, 3]]), axis=0).tolist()
    [[4.0, 2.0, nan]]
    """
    op = "take_along_axis"
    m = _take_mode(op, mode)
    t = arr if isinstance(arr, Tensor) else Tensor._wrap(to_impl(arr, op=op))
    idx = _index_array(op, indices)
    if axis is None:
        if len(idx.shape) != 1:
            raise op_error(
                ShapeError, op, f"with axis=None, indices must be 1-d, got shape {idx.shape}"
            )
        t, axis = _reshape(t, (-1,), op), 0
    if len(idx.shape) != t.ndim:
        raise op_error(
            ShapeError,
            op,
            f"indices must have the same rank as arr: got {tuple(idx.shape)} for arr {t.shape}",
        )
    ax = norm_axis(op, axis, t.shape)
    shape = broadcast_shapes(
        op,
        tuple(d for i, d in enumerate(t.shape) if i != ax),
        tuple(d for i, d in enumerate(idx.shape) if i != ax),
    )
    out_shape = shape[:ax] + (idx.shape[ax],) + shape[ax:]
    n = t.shape[ax]
    if n == 0:
        return zeros(out_shape, t.dtype)
    filled = m == "fill" and isinstance(idx, Tensor)  # one gather that fills (as JAX's)
    safe, valid = (idx, None) if filled else _in_range(idx, n, m, wrap_negative=True)
    index = []
    for d in range(t.ndim):
        if d == ax:
            index.append(safe)
        else:
            grid = [1] * t.ndim
            grid[d] = t.shape[d]
            index.append(iota(dtypes.int32, tuple(grid), d))
    if filled:
        return _gather_filled(op, t, tuple(index), fill_value)
    return _filled(op, getitem(t, tuple(index)), valid, fill_value)


def one_hot(x, num_classes: int, dtype=None) -> Tensor:
    """One-hot encoding along a new last axis (``jax.nn.one_hot``; out-of-range gives zeros).

    >>> import nablax as nx
    >>> nx.one_hot(nx.tensor([0, 2, 5]), 3).tolist()
    [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    """
    try:
        k = operator.index(num_classes)
    except TypeError:
        raise op_error(
            TypeError, "one_hot", f"num_classes must be an int, got {num_classes!r}"
        ) from None
    if k < 0:
        raise op_error(ValueError, "one_hot", f"num_classes must be >= 0, got {k}")
    t = x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x, op="one_hot"))
    classes = iota(dtypes.int32, (k,), 0)
    return astype(equal(expand_dims(t, -1), classes), dtypes.canonicalize(dtype))


# Derivative, batching and sharding rules: index_rules.py (imported by ops/__init__.py).

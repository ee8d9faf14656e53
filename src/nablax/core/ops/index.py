"""Indexing, NumPy-style: ``x[i]``, ``x.at[i].set(v)`` and ``x[i] = v`` are the builders of
``gather``/``scatter`` (core/prims/index.py); ``take``, ``take_along_axis`` and ``one_hot`` are
written with them.

``take`` / ``take_along_axis`` follow ``jnp.take``'s ``mode=`` (default ``"fill"``) for
out-of-range indices, where ``x[idx]`` follows JAX's indexing (clamped reads, dropped updates).
"""

from __future__ import annotations

import math
import operator

import jax
import numpy as np

from ...errors import ShapeError, op_error
from .. import dtypes
from ..host import exact_scalar
from ..prims._util import broadcast_shapes, norm_axis
from ..prims.index import (  # noqa: F401 - re-exported builders
    _IndexUpdateHelper,
    _setitem,
    gather_filled,
    getitem,
)
from ..tensor import Tensor, to_impl
from .creation import iota, zeros
from .elementwise import astype, clip, equal, logical_and, mod, where
from .shape import expand_dims, reshape

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
        t, ax = reshape(t, (-1,)), 0
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
        return gather_filled("take", t, index + (idx,), fill_value)
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
        t, axis = reshape(t, (-1,)), 0
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
        return gather_filled(op, t, tuple(index), fill_value)
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

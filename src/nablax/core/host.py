"""Host data to device arrays, exactly: the conversion rules of ``nx.tensor`` and of every op
that takes Python numbers or NumPy arrays.

Host memory the user still owns is copied (a later write never changes a tensor); integers that do
not fit the target dtype raise ``OverflowError``, NaN to an integer dtype ``ValueError``, complex
values with an imaginary part to a real dtype and non-numeric data ``TypeError``, each naming the
public function (``op``). Floats follow NumPy/JAX (rounded; too large: ``inf``).
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

from ..errors import op_error
from . import dtypes

PY_SCALAR_TYPES = (bool, int, float, complex)
_ACCEPTED = (
    "pass Python numbers (bool, int, float, complex), nested lists/tuples of them, NumPy arrays "
    "or scalars, objects with __array__ or the buffer protocol, a jax.Array or an nx.Tensor"
)
_ALIGN = 64  # the CPU client adopts host buffers aligned like this without copying them
ADOPT_BYTES = 1 << 17  # from this size on, one aligned host copy beats JAX's own copy path


def not_numeric(x: Any, op: str, detail: str = "") -> Exception:
    what = f"{type(x).__name__} {x!r}"
    what = what if len(what) <= 60 else what[:57] + "..."
    return op_error(TypeError, op, f"cannot make a tensor from {what}{detail}", _ACCEPTED)


def inexact(cls, op: str, value: str, dt, why: str):
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


def host_array(x: Any, target, op: str) -> np.ndarray:
    """``x`` as a NumPy array of the canonical (or requested) dtype that no one else holds."""
    fresh = isinstance(x, (list, tuple, range, np.generic))  # np.asarray builds a new array
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged nested sequences, among others
        raise not_numeric(x, op, f": {e}") from None
    if a.dtype.kind == "O":
        if not isinstance(x, (list, tuple)):
            raise not_numeric(x, op, " (dtype object)" if isinstance(x, np.ndarray) else "")
        a, target = _python_numbers(x, a, target, op), None  # exact, already in its dtype
        fresh = True
    elif not _is_numeric(a.dtype):
        raise not_numeric(x, op, f" (dtype {a.dtype})")
    if target is None:
        # a Python int beyond int64 made NumPy pick uint64; JAX's dtype for Python ints is int32
        big = a.dtype == np.uint64 and isinstance(x, (list, tuple))
        target = dtypes.int32 if big else dtypes.canonicalize(a.dtype)
    if a.dtype != target:
        _check_exact(a, target, op)
        if a.dtype.kind == "c" and target.kind != "c":
            a = a.real
    elif fresh and (a.nbytes < ADOPT_BYTES or not a.ctypes.data % _ALIGN):
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
            raise not_numeric(x, op, f" (it holds {type(v).__name__} {v!r:.40})")
    if target is None:  # the dtype JAX gives such data (weakly typed Python numbers)
        target = (
            dtypes.complex64 if "c" in kinds else dtypes.float32 if "f" in kinds else dtypes.int32
        )
    if target.kind in "iu":
        info = np.iinfo(target)
        for v in a.flat:
            if isinstance(v, (int, np.integer)) and not info.min <= int(v) <= info.max:
                raise inexact(OverflowError, op, str(int(v)), target, "out of range")
    try:
        return np.array(a.tolist(), dtype=target)
    except (OverflowError, ValueError, TypeError) as e:
        raise inexact(type(e), op, "a value", target, str(e)) from None


def _check_exact(a: np.ndarray, target: np.dtype, op: str) -> None:
    """Raise unless every value of ``a`` converts to ``target`` (ints in range, floats finite and
    in range for integer targets, no imaginary parts dropped)."""
    src = a.dtype
    if not a.size or target.kind == "b":
        return
    if src.kind == "c" and target.kind != "c" and np.any(a.imag):
        raise inexact(TypeError, op, "complex data", target, "it has imaginary parts")
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
            raise inexact(
                OverflowError, op, f"value {bad}", target, f"outside [{info.min}, {info.max}]"
            )
        return
    f = np.asarray(a.real if src.kind == "c" else a, dtype=np.float64)
    if np.isnan(f).any():
        raise inexact(ValueError, op, "NaN", target, "integers have no NaN")
    lo, hi = f.min(), f.max()
    if not (info.min - 1 < lo and hi < info.max + 1):  # values truncate toward zero
        bad = lo if not info.min - 1 < lo else hi
        raise inexact(
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
    if t not in PY_SCALAR_TYPES:
        raise not_numeric(v, op)
    if t is complex and dt.kind != "c":
        if v.imag:
            raise inexact(TypeError, op, repr(v), dt, "it has an imaginary part")
        v, t = v.real, float
    if dt.kind not in "iu":
        return v  # bool: truthiness; floats: rounding and overflow to inf, as NumPy and JAX
    info = np.iinfo(dt)
    if t is float:
        if v != v:
            raise inexact(ValueError, op, "NaN", dt, "integers have no NaN")
        if not info.min - 1 < v < info.max + 1:
            raise inexact(OverflowError, op, repr(v), dt, f"outside [{info.min}, {info.max}]")
        return int(v)
    if not info.min <= v <= info.max:
        raise inexact(OverflowError, op, repr(v), dt, f"outside [{info.min}, {info.max}]")
    return v


def _private_copy(a: np.ndarray, target: np.dtype) -> np.ndarray:
    """A C-contiguous copy of ``a`` in ``target``; large ones 64-byte aligned (adopted by JAX)."""
    nbytes = a.size * target.itemsize
    if nbytes < ADOPT_BYTES:
        return np.array(a, dtype=target, order="C", copy=True)
    raw = np.empty(nbytes + _ALIGN, np.uint8)
    start = -raw.ctypes.data % _ALIGN
    out = raw[start : start + nbytes].view(target).reshape(a.shape)
    np.copyto(out, a, casting="unsafe")
    return out

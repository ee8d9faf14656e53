"""Dtypes and type promotion.

nablax follows JAX's promotion lattice (which is NumPy's, minus value-based casting): two tensors
promote with ``jnp.promote_types``; Python scalars are *weakly typed* and adopt the tensor's dtype when
they can (``float16_tensor * 2.5`` stays float16; ``int_tensor * 2.5`` becomes float32). 64-bit
dtypes are canonicalized to 32-bit, as JAX does by default. Results are cached in plain dicts because
promotion runs on every op that is built.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import dtypes as jax_dtypes

from .. import _caches
from ..errors import DTypeError

float32 = np.dtype("float32")
float16 = np.dtype("float16")
bfloat16 = np.dtype(jnp.bfloat16)
int32 = np.dtype("int32")
int8 = np.dtype("int8")
int16 = np.dtype("int16")
uint8 = np.dtype("uint8")
uint32 = np.dtype("uint32")
bool_ = np.dtype("bool")
complex64 = np.dtype("complex64")

default_float = float32
default_int = int32

_CANON = {
    np.dtype("float64"): float32,
    np.dtype("int64"): int32,
    np.dtype("uint64"): uint32,
    np.dtype("complex128"): complex64,
}

_PY_SCALARS = (bool, int, float, complex)


def canonicalize(dtype) -> np.dtype:
    """Turn any dtype-like into the np.dtype nablax uses (64-bit types become 32-bit, byte order
    native: device arrays have no byte order, so ``'>f4'`` data converts to ``float32``)."""
    if dtype is None:
        return default_float
    try:
        d = np.dtype(dtype)
    except TypeError as e:
        raise DTypeError(
            f"nablax: {dtype!r} is not a dtype. Fix: use nx.float32, nx.int32, ..."
        ) from e
    if not d.isnative:  # a big-endian NumPy dtype ('>f4'): the same type in native byte order
        d = d.newbyteorder("=")
    return _CANON.get(d, d)


# (dtype, JAX dtype class) -> bool: jnp.issubdtype costs about a microsecond, and layers ask it
# on every call
_subdtype_cache = _caches.DictCache("dtypes.subdtype", 256)


def _is_sub(d, cls) -> bool:
    key = (d, cls)
    try:
        hit = _subdtype_cache.data.get(key)
    except TypeError:  # an unhashable dtype-like: ask JAX each time
        return bool(jnp.issubdtype(d, cls))
    if hit is None:
        hit = _subdtype_cache.put(key, bool(jnp.issubdtype(d, cls)))
    return hit


def is_floating(d: np.dtype) -> bool:
    return _is_sub(d, jnp.floating)


def is_integer(d: np.dtype) -> bool:
    return _is_sub(d, jnp.integer)


def is_complex(d: np.dtype) -> bool:
    return _is_sub(d, jnp.complexfloating)


def is_inexact(d: np.dtype) -> bool:
    return d.kind in "fcV" or d == bfloat16


# per-op memos (every binary op promotes): plain dicts read without a lock, bounded
_promote_cache = _caches.DictCache("dtypes.promote", 1024)  # (dtype, dtype) -> dtype


def promote(a: np.dtype, b: np.dtype) -> np.dtype:
    """Promotion of two strongly typed dtypes."""
    try:
        return _promote_cache.data[(a, b)]
    except KeyError:
        return _promote_cache.put((a, b), canonicalize(jnp.promote_types(a, b)))


_weak_cache = _caches.DictCache("dtypes.promote_scalar", 1024)  # (dtype, scalar type) -> dtype
_WEAK_EXAMPLE = {bool: True, int: 1, float: 1.0, complex: 1j}


def promote_scalar(d: np.dtype, scalar_type: type) -> np.dtype:
    """Dtype of ``tensor(d) op python_scalar`` under JAX's weak-type rules."""
    try:
        return _weak_cache.data[(d, scalar_type)]
    except KeyError:
        r = canonicalize(jax_dtypes.result_type(d, _WEAK_EXAMPLE[scalar_type]))
        return _weak_cache.put((d, scalar_type), r)


def scalar_dtype(v) -> np.dtype:
    """Dtype a Python scalar gets when it becomes a tensor on its own."""
    t = type(v)
    if t is bool:
        return bool_
    if t is int:
        return default_int
    if t is float:
        return default_float
    if t is complex:
        return complex64
    return canonicalize(np.asarray(v).dtype)


def to_float(d: np.dtype) -> np.dtype:
    """dtype used by float-valued functions (``exp``, ``sqrt``...): ints and bools become float32."""
    return d if is_inexact(d) else default_float

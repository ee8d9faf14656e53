"""The dtype rules of the element-wise primitives: each dtype kind (``arith``, ``float``,
``compare``, ...) maps the promoted input dtype to the dtype the op computes in and the dtype it
returns; a Python int operand takes its value in a dtype as JAX gives it (:func:`weak_int`).

An element-wise primitive's only parameter is the dtype it computes in, so mixed-dtype inputs and
weakly typed Python scalars need no extra nodes (the builders, builders.py, make a Python scalar a
``Literal`` in that dtype). The decisions are cached: they are read by every element-wise op.
"""

from __future__ import annotations

import numpy as np

from .... import _caches
from ....errors import DTypeError, op_error
from ... import dtypes
from ...dtypes import bool_, promote
from .._util import broadcast_shapes

# ---- dtype policies --------------------------------------------------------------------------
# kind -> (computation dtype, output dtype) given the promoted input dtype.


def _kind_arith(op, d):
    if d == bool_ and op in ("subtract", "power", "negative", "floor_divide", "mod", "sign"):
        raise op_error(
            DTypeError, op, "not supported for bool tensors", "cast with .astype(nx.int32)"
        )
    return d, d


def _kind_float(op, d):
    f = dtypes.to_float(d)
    return f, f


def _kind_compare(op, d):
    return d, bool_


def _kind_bitwise(op, d):
    if not (d == bool_ or dtypes.is_integer(d)):
        raise op_error(
            DTypeError, op, f"needs integer or bool tensors, got {d}", "use logical_* for masks"
        )
    return d, d


def _kind_predicate(op, d):
    return d, bool_


def _kind_real(op, d):
    if dtypes.is_complex(d):
        raise op_error(DTypeError, op, f"not defined for complex dtype {d}")
    if d == bool_ and op == "round":
        raise op_error(DTypeError, op, "not defined for bool tensors", "cast with .astype(...)")
    return d, d


KINDS = {
    "arith": _kind_arith,
    "float": _kind_float,
    "compare": _kind_compare,
    "bitwise": _kind_bitwise,
    "predicate": _kind_predicate,
    "real": _kind_real,
}


# (op, promoted dtype) -> (params, output dtype): read by every element-wise op (a plain dict)
_kind_cache = _caches.DictCache("ops.elementwise_dtypes", 4096)


def resolve(op: str, kind: str, d) -> tuple:
    """``((computation dtype,), output dtype)`` of ``op`` of dtype kind ``kind`` on promoted
    input dtype ``d`` (cached; raises the kind's dtype errors)."""
    try:
        return _kind_cache.data[(op, d)]
    except KeyError:
        r = KINDS[kind](op, d)
        return _kind_cache.put((op, d), ((r[0],), r[1]))  # params tuple, output dtype


def elementwise_aval(op: str, kind: str):
    """The shape/dtype rule of an element-wise primitive: NumPy broadcasting, the kind's dtype."""

    def abstract_eval(params, *avals):
        shape = broadcast_shapes(op, *[a[0] for a in avals])
        d = avals[0][1]
        for a in avals[1:]:
            d = promote(d, a[1])
        return ((shape, resolve(op, kind, d)[1]),)

    return abstract_eval


def cast_lower(fn):
    """The lowering of an element-wise primitive: ``fn`` on inputs cast to the computation dtype."""

    def lower(params, *xs):
        dt = params[0]
        return fn(*[x if x.dtype == dt else x.astype(dt) for x in xs])

    return lower


# ---- Python int operands ------------------------------------------------------------------


def _check_int(op: str, v: int, dtype) -> None:
    """A Python int beyond int32 must fit the integer dtype it is materialized in (JAX raises
    ``OverflowError`` for any Python int beyond int32 without x64)."""
    if dtypes.is_integer(dtype) or dtype == bool_:
        info = np.iinfo(dtype) if dtype != bool_ else None
        if info is None or not info.min <= v <= info.max:
            raise op_error(
                OverflowError,
                op,
                f"Python int {v} does not fit dtype {dtype} (Python ints are int32 in nablax, as "
                f"in JAX; only those within int32 wrap into a narrower dtype)",
                f"pass a float ({float(v)!r}) or cast the tensor to a float dtype first",
            )


_INT_WRAP = _caches.DictCache("ops.integer_ranges", 64)  # integer dtype -> (min, max, 2**bits)


def weak_int(op: str, v: int, dtype) -> int:
    """The value a Python int operand of ``op`` takes in ``dtype`` (its weakly typed dtype), as
    JAX gives it: an int within int32 (JAX's range for Python ints) wraps modulo ``2**bits`` into a
    narrower integer dtype (``int8_tensor + 300`` adds 44, as ``jnp`` and ``nx.compile`` with the
    300 as an argument do); one beyond int32 must fit ``dtype`` exactly, else ``OverflowError``
    naming ``op``, the value and the dtype."""
    if dtype.kind not in "iu":
        if not -2147483648 <= v <= 2147483647:
            _check_int(op, v, dtype)
        return v
    r = _INT_WRAP.data.get(dtype)
    if r is None:
        info = np.iinfo(dtype)
        r = _INT_WRAP.put(dtype, (int(info.min), int(info.max), 1 << info.bits))
    lo, hi, mod = r
    if lo <= v <= hi:
        return v
    if not -2147483648 <= v <= 2147483647:
        _check_int(op, v, dtype)  # raises
    return (v - lo) % mod + lo


def is_float_dtype(d) -> bool:
    """Whether ``d`` is a float or complex dtype (the dtypes that have derivatives)."""
    return dtypes.is_inexact(d)

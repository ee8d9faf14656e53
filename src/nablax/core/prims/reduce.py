"""Reduction primitives (reduce_sum/prod/max/min/and/or, argmax, argmin), the scan ``cumsum`` and
sorting (sort, argsort, top_k), each one record with all of its rules, and the builders that bind
them (``sum``, ``max``, ``all``, ``argmax``, ``cumsum``, ``sort``, ``topk``, ...). The statistics
written with them (``mean``, ``var``, ``std``, ``logsumexp``) are in core/ops/reduce.py.

Batching rules move the axis parameters past the batch axes (see _batch.py); sharding rules drop
the reduced dimensions, or replicate the one a scan or sort runs along.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import DTypeError, ShapeError, op_error
from .. import dtypes
from ..build import bind
from ..primitive import primitive
from ..tensor import Tensor
from . import _shard
from ._batch import shift, unary_rule
from ._rules import NONDIFFERENTIABLE, cast_like, is_float_tensor, linear
from ._util import norm_axes, norm_axis
from .creation import iota, zeros_like
from .elementwise import astype, equal, multiply
from .shape import _impl, broadcast_in_dim_p, flip, moveaxis, pad_p, reshape, slice_p, transpose


def _reduced_shape(shape, axes):
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _sum_dtype(d):
    return dtypes.int32 if d == dtypes.bool_ or (dtypes.is_integer(d) and d.itemsize < 4) else d


def _bind1(prim, xs, params) -> Tensor:
    return Tensor._wrap(bind(prim, [x._impl for x in xs], params)[0])


def _expand(y: Tensor, shape, axes) -> Tensor:
    """``y`` (reduced over ``axes``) broadcast back to ``shape``."""
    dims = tuple(a for a in range(len(shape)) if a not in axes)
    return _bind1(broadcast_in_dim_p, [y], (tuple(shape), dims))


# ---- reductions over a tuple of axes (params: (axes,)) -----------------------------------------


def _reduce_prim(name, fn: Callable, out_dtype: Callable = lambda d: d, **derivative):
    """A reduction record: shape/dtype, lowering and batching from ``fn`` (``jnp.sum``, ...),
    sharding that drops the reduced dimensions; the derivative rules are the keywords
    ``derivative`` (``jvp=``/``vjp=`` or ``rules=``)."""

    def aval(params, x):
        return ((_reduced_shape(x[0], params[0]), out_dtype(x[1])),)

    def lower(params, x):
        return fn(x, axis=params[0]).astype(out_dtype(x.dtype))

    def batch(params, b, x):
        return fn(x, axis=shift(params[0], b)).astype(out_dtype(x.dtype))

    return primitive(
        name,
        aval,
        lower,
        batch=unary_rule(batch),
        shard=_shard.drop_dims(lambda params: params[0]),
        **derivative,
    )


def _sum_t(params, ct, x):
    return _expand(cast_like(ct, x), x.shape, params[0])


reduce_sum_p = _reduce_prim("reduce_sum", jnp.sum, _sum_dtype, rules=linear(_sum_t))


def _shift(a: Tensor, k: int, fill) -> Tensor:
    """``a`` moved ``k`` places along its last axis, the first ``k`` entries set to ``fill``."""
    n = a.shape[-1]
    nd = a.ndim
    kept = _bind1(slice_p, [a], ((0,) * nd, a.shape[:-1] + (n - k,), (1,) * nd))
    return _bind1(pad_p, [kept], (((0, 0),) * (nd - 1) + ((k, 0),), fill))


def _exclusive_cumprod(a: Tensor) -> Tensor:
    """Products of the entries before each one along the last axis (log-depth scan, no division,
    so zeros are exact)."""
    n = a.shape[-1]
    a = _shift(a, 1, 1)
    k = 1
    while k < n:
        a = multiply(a, _shift(a, k, 1))
        k *= 2
    return a


def _others_product(x: Tensor, axes) -> Tensor:
    """For each element, the product of the other elements of its reduction group."""
    nd = x.ndim
    keep = [a for a in range(nd) if a not in axes]
    perm = keep + list(axes)
    xt = transpose(x, perm)
    flat = reshape(xt, tuple(x.shape[a] for a in keep) + (-1,))
    last = (flat.ndim - 1,)
    prod_others = multiply(
        _exclusive_cumprod(flat), flip(_exclusive_cumprod(flip(flat, last)), last)
    )
    return transpose(reshape(prod_others, xt.shape), [int(i) for i in np.argsort(perm)])


def _prod_jvp(params, tangents, primals, outs):
    t, x, y = tangents[0], primals[0], outs[0]
    if t is None or not is_float_tensor(y):
        return [None]
    if x.size == 0:
        return [zeros_like(y)]
    g = multiply(astype(t, y.dtype), _others_product(x, params[0]))
    return [_bind1(reduce_sum_p, [g], params)]


def _prod_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    if x.size == 0:
        return [zeros_like(x)]
    return [cast_like(multiply(_expand(ct, x.shape, params[0]), _others_product(x, params[0])), x)]


reduce_prod_p = _reduce_prim("reduce_prod", jnp.prod, _sum_dtype, jvp=_prod_jvp, vjp=_prod_vjp)


def _chooser(params, x, y):
    # JAX's rule for max/min: ties share the cotangent evenly
    loc = astype(equal(x, _expand(y, x.shape, params[0])), y.dtype)
    return loc, _bind1(reduce_sum_p, [loc], params)


def _chooser_jvp(params, tangents, primals, outs):
    t, x, y = tangents[0], primals[0], outs[0]
    if t is None or not is_float_tensor(y):
        return [None]
    loc, count = _chooser(params, x, y)
    return [_bind1(reduce_sum_p, [multiply(astype(t, y.dtype), loc)], params) / count]


def _chooser_vjp(params, cts, primals, outs):
    ct, x, y = cts[0], primals[0], outs[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    loc, count = _chooser(params, x, y)
    return [cast_like(multiply(_expand(ct / count, x.shape, params[0]), loc), x)]


reduce_max_p = _reduce_prim("reduce_max", jnp.max, jvp=_chooser_jvp, vjp=_chooser_vjp)
reduce_min_p = _reduce_prim("reduce_min", jnp.min, jvp=_chooser_jvp, vjp=_chooser_vjp)
# bool in, bool out; identities True and False
reduce_and_p = _reduce_prim("reduce_and", jnp.all, **NONDIFFERENTIABLE)
reduce_or_p = _reduce_prim("reduce_or", jnp.any, **NONDIFFERENTIABLE)

# ---- argmax, argmin (params: (axis,)) ----------------------------------------------------------


def _arg_prim(name, fn):
    def aval(params, x):
        return ((_reduced_shape(x[0], (params[0],)), dtypes.int32),)

    def lower(params, x):
        return fn(x, axis=params[0]).astype(jnp.int32)

    def batch(params, b, x):
        return fn(x, axis=params[0] + b).astype(jnp.int32)

    return primitive(
        name,
        aval,
        lower,
        differentiable=False,
        batch=unary_rule(batch),
        shard=_shard.drop_dims(lambda params: (params[0],)),
        **NONDIFFERENTIABLE,
    )


argmax_p = _arg_prim("argmax", jnp.argmax)
argmin_p = _arg_prim("argmin", jnp.argmin)

# ---- cumsum (params: (axis, reverse)) ----------------------------------------------------------


def _cumsum_lower(params, x):
    return lax.cumsum(x.astype(_sum_dtype(x.dtype)), axis=params[0], reverse=params[1])


def _cumsum_t(params, ct, x):
    return _bind1(cumsum_p, [cast_like(ct, x)], (params[0], not params[1]))


cumsum_p = primitive(
    "cumsum",
    lambda params, x: ((x[0], _sum_dtype(x[1])),),
    _cumsum_lower,
    rules=linear(_cumsum_t),
    batch=unary_rule(lambda params, b, x: _cumsum_lower((params[0] + b, params[1]), x)),
    shard=_shard.replicate_dims(lambda params, avals: (params[0],)),
)

# ---- sort, argsort (params: (axis,)), top_k (params: (k,), along the last axis) ----------------


def _along(idx: Tensor, axis: int) -> tuple:
    """An index tuple that picks ``idx[..., i, ...]`` along ``axis`` (``take_along_axis``)."""
    shape = idx.shape
    out = []
    for d in range(len(shape)):
        if d == axis:
            out.append(idx)
        else:
            grid = [1] * len(shape)
            grid[d] = shape[d]
            out.append(iota(dtypes.int32, tuple(grid), d))
    return tuple(out)


def _sort_jvp(params, tangents, primals, outs):
    t, x = tangents[0], primals[0]
    if t is None or not is_float_tensor(x):
        return [None]
    return [astype(t, x.dtype)[_along(_bind1(argsort_p, [x], params), params[0])]]


def _sort_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    index = _along(_bind1(argsort_p, [x], params), params[0])
    return [zeros_like(x).at[index].add(cast_like(ct, x))]  # a scatter: Tensor.at (bound late)


def _sort_lower(params, x):
    return jnp.sort(x, axis=params[0], stable=True)


def _argsort_lower(params, x):
    return jnp.argsort(x, axis=params[0], stable=True).astype(jnp.int32)


sort_p = primitive(
    "sort",
    lambda params, x: (x,),
    _sort_lower,
    jvp=_sort_jvp,
    vjp=_sort_vjp,
    batch=unary_rule(lambda params, b, x: _sort_lower((params[0] + b,), x)),
    shard=_shard.replicate_dims(lambda params, avals: (params[0],)),
)
argsort_p = primitive(
    "argsort",
    lambda params, x: ((x[0], dtypes.int32),),
    _argsort_lower,
    differentiable=False,
    batch=unary_rule(lambda params, b, x: _argsort_lower((params[0] + b,), x)),
    shard=_shard.replicate_dims(lambda params, avals: (params[0],)),
    **NONDIFFERENTIABLE,
)


def _topk_aval(params, x):
    shape = x[0][:-1] + (params[0],)
    return ((shape, x[1]), (shape, dtypes.int32))


def _topk_lower(params, x):
    v, i = lax.top_k(x, params[0])
    return v, i.astype(jnp.int32)


def _topk_jvp(params, tangents, primals, outs):
    t, x = tangents[0], primals[0]
    if t is None or not is_float_tensor(x):
        return [None, None]
    return [astype(t, x.dtype)[_along(outs[1], x.ndim - 1)], None]


def _topk_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    return [zeros_like(x).at[_along(outs[1], x.ndim - 1)].add(cast_like(ct, x))]


top_k_p = primitive(
    "top_k",
    _topk_aval,
    _topk_lower,
    multiple_results=True,
    jvp=_topk_jvp,
    vjp=_topk_vjp,
    batch=unary_rule(lambda params, b, x: _topk_lower(params, x)),  # the last axis: unchanged
    shard=_shard.replicate_dims(lambda params, avals: (len(avals[0][0]) - 1,)),
)

# ---- builders ----------------------------------------------------------------------------------


def _keep(t: Tensor, shape, axes, keepdims: bool) -> Tensor:
    if not keepdims:
        return t
    return reshape(t, tuple(1 if i in axes else d for i, d in enumerate(shape)))


def _reduce(op: str, prim, x, axis, keepdims: bool, dtype=None) -> Tensor:
    xi = _impl(x, op)
    if dtype is not None:
        xi = astype(Tensor._wrap(xi), dtype)._impl
    axes = norm_axes(op, axis, xi.shape)
    if prim in (reduce_max_p, reduce_min_p) and builtins.any(xi.shape[a] == 0 for a in axes):
        raise op_error(
            ShapeError,
            op,
            f"zero-size reduction over axis {axes} of shape {xi.shape} has no identity",
            "pass a non-empty tensor, or use nx.where with an explicit initial value",
        )
    out = Tensor._wrap(bind(prim, [xi], (axes,))[0])
    return _keep(out, xi.shape, axes, keepdims)


def sum(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (None: all axes). Bools and small ints sum in int32, as in JAX.

    >>> import nablax as nx
    >>> nx.arange(6).reshape(2, 3).sum(axis=1).tolist()
    [3, 12]
    """
    return _reduce("sum", reduce_sum_p, x, axis, keepdims, dtype)


def prod(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
    """Product over ``axis``."""
    return _reduce("prod", reduce_prod_p, x, axis, keepdims, dtype)


def max(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Maximum over ``axis`` (NaN-propagating, as ``numpy.max``)."""
    return _reduce("max", reduce_max_p, x, axis, keepdims)


def min(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Minimum over ``axis``."""
    return _reduce("min", reduce_min_p, x, axis, keepdims)


def all(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where every element along ``axis`` is non-zero."""
    return _reduce("all", reduce_and_p, astype(x, dtypes.bool_), axis, keepdims)


def any(x, axis=None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where some element along ``axis`` is non-zero."""
    return _reduce("any", reduce_or_p, astype(x, dtypes.bool_), axis, keepdims)


def _arg(op, prim, x, axis, keepdims):
    xi = _impl(x, op)
    t = Tensor._wrap(xi)
    if axis is None:
        t = reshape(t, -1)
        ax = 0
    else:
        ax = norm_axis(op, axis, len(xi.shape))
    if t.shape[ax] == 0:
        raise op_error(
            ShapeError, op, f"attempt to get {op} of an empty sequence (shape {xi.shape})"
        )
    out = Tensor._wrap(bind(prim, [t._impl], (ax,))[0])
    if keepdims:
        if axis is None:
            return reshape(out, (1,) * len(xi.shape))
        return _keep(out, xi.shape, (ax,), True)
    return out


def argmax(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the maximum (first occurrence), int32."""
    return _arg("argmax", argmax_p, x, axis, keepdims)


def argmin(x, axis=None, keepdims: bool = False) -> Tensor:
    """Index of the minimum (first occurrence), int32."""
    return _arg("argmin", argmin_p, x, axis, keepdims)


def cumsum(x, axis=None, dtype=None) -> Tensor:
    """Cumulative sum along ``axis`` (None: over the flattened tensor)."""
    t = Tensor._wrap(_impl(x, "cumsum"))
    if dtype is not None:
        t = astype(t, dtype)
    if axis is None:
        t, axis = reshape(t, -1), 0
    ax = norm_axis("cumsum", axis, t.ndim)
    return Tensor._wrap(bind(cumsum_p, [t._impl], (ax, False))[0])


def _sortable(op, x, axis):
    t = Tensor._wrap(_impl(x, op))
    if axis is None:
        t, axis = reshape(t, -1), 0
    if t.ndim == 0:
        raise op_error(ShapeError, op, "cannot sort a 0-d tensor")
    return t, norm_axis(op, axis, t.ndim)


def sort(x, axis: int | None = -1) -> Tensor:
    """Sorted copy along ``axis`` (stable), as ``numpy.sort``."""
    t, ax = _sortable("sort", x, axis)
    return Tensor._wrap(bind(sort_p, [t._impl], (ax,))[0])


def argsort(x, axis: int | None = -1) -> Tensor:
    """Indices that sort ``x`` along ``axis`` (stable), int32."""
    t, ax = _sortable("argsort", x, axis)
    return Tensor._wrap(bind(argsort_p, [t._impl], (ax,))[0])


def topk(x, k: int, axis: int = -1) -> tuple[Tensor, Tensor]:
    """The ``k`` largest values along ``axis`` and their indices, largest first (``lax.top_k``)."""
    t, ax = _sortable("topk", x, axis)
    if not 0 <= k <= t.shape[ax]:
        raise op_error(ShapeError, "topk", f"k={k} is out of range for axis of size {t.shape[ax]}")
    if dtypes.is_complex(t.dtype) or t.dtype == dtypes.bool_:
        raise op_error(DTypeError, "topk", f"unsupported dtype {t.dtype}")
    moved = ax != t.ndim - 1
    if moved:
        t = moveaxis(t, ax, -1)
    v, i = (Tensor._wrap(o) for o in bind(top_k_p, [t._impl], (int(k),)))
    if moved:
        v, i = moveaxis(v, -1, ax), moveaxis(i, -1, ax)
    return v, i

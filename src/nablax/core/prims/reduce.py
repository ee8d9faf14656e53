"""Reductions (sum, max, min, prod, argmax, argmin), scans (cumsum), sorting (sort, argsort, topk)
and the statistics built on them (mean, var, std, logsumexp, all, any)."""

from __future__ import annotations

import builtins
import math
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
from ._rules import cast_like, is_float_tensor, nondifferentiable
from ._rules import linear_install as linear
from ._util import norm_axes, norm_axis
from .creation import full, iota, zeros_like
from .elementwise import (
    astype,
    equal,
    exp,
    log,
    multiply,
    sqrt,
    stop_gradient,
    subtract,
    where,
)
from .shape import _impl, broadcast_in_dim_p, flip, moveaxis, pad_p, reshape, slice_p, transpose


def _reduced_shape(shape, axes):
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def _sum_dtype(d):
    return dtypes.int32 if d == dtypes.bool_ or (dtypes.is_integer(d) and d.itemsize < 4) else d


def _reduce_prim(name, fn, out_dtype=lambda d: d):
    def aval(params, x):
        return ((_reduced_shape(x[0], params[0]), out_dtype(x[1])),)

    def lower(params, x):
        return fn(x, axis=params[0]).astype(out_dtype(x.dtype))

    return primitive(name, aval, lower)


reduce_sum_p = _reduce_prim("reduce_sum", jnp.sum, _sum_dtype)
reduce_prod_p = _reduce_prim("reduce_prod", jnp.prod, _sum_dtype)
reduce_max_p = _reduce_prim("reduce_max", jnp.max)
reduce_min_p = _reduce_prim("reduce_min", jnp.min)
reduce_and_p = _reduce_prim("reduce_and", jnp.all)  # bool in, bool out; identity True
reduce_or_p = _reduce_prim("reduce_or", jnp.any)  # identity False


def _arg_prim(name, fn):
    def aval(params, x):
        return ((_reduced_shape(x[0], (params[0],)), dtypes.int32),)

    def lower(params, x):
        return fn(x, axis=params[0]).astype(jnp.int32)

    return primitive(name, aval, lower, differentiable=False)


argmax_p = _arg_prim("argmax", jnp.argmax)
argmin_p = _arg_prim("argmin", jnp.argmin)

cumsum_p = primitive(
    "cumsum",
    lambda params, x: ((x[0], _sum_dtype(x[1])),),
    lambda params, x: lax.cumsum(x.astype(_sum_dtype(x.dtype)), axis=params[0], reverse=params[1]),
)
sort_p = primitive(
    "sort", lambda params, x: (x,), lambda params, x: jnp.sort(x, axis=params[0], stable=True)
)
argsort_p = primitive(
    "argsort",
    lambda params, x: ((x[0], dtypes.int32),),
    lambda params, x: jnp.argsort(x, axis=params[0], stable=True).astype(jnp.int32),
    differentiable=False,
)


def _topk_aval(params, x):
    shape = x[0][:-1] + (params[0],)
    return ((shape, x[1]), (shape, dtypes.int32))


def _topk_lower(params, x):
    v, i = lax.top_k(x, params[0])
    return v, i.astype(jnp.int32)


top_k_p = primitive("top_k", _topk_aval, _topk_lower, multiple_results=True)

# ---- public ops ------------------------------------------------------------------------------


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


def _count(shape, axes) -> int:
    return math.prod(shape[a] for a in axes)


def mean(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
    """Arithmetic mean over ``axis``; integer inputs give float32."""
    xi = _impl(x, "mean")
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.to_float(xi.dtype)
    t = astype(Tensor._wrap(xi), dt)
    axes = norm_axes("mean", axis, xi.shape)
    return sum(t, axes, keepdims) / _count(xi.shape, axes)


def var(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance with NumPy's default ``ddof=0``."""
    xi = _impl(x, "var")
    t = astype(Tensor._wrap(xi), dtypes.to_float(xi.dtype))
    axes = norm_axes("var", axis, xi.shape)
    centered = subtract(t, mean(t, axes, keepdims=True))
    if dtypes.is_complex(t.dtype):
        sq = (centered * centered.conj()).real  # pragma: no cover - complex support is minimal
    else:
        sq = multiply(centered, centered)
    return sum(sq, axes, keepdims) / (_count(xi.shape, axes) - ddof)


def std(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Standard deviation with NumPy's default ``ddof=0``."""
    return sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x, axis=None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` computed stably (shifted by the max), as ``jax.nn.logsumexp``."""
    xi = _impl(x, "logsumexp")
    t = astype(Tensor._wrap(xi), dtypes.to_float(xi.dtype))
    axes = norm_axes("logsumexp", axis, xi.shape)
    if _count(xi.shape, axes) == 0:  # empty sum: log(0) = -inf, as jax.nn.logsumexp
        return _keep(
            full(_reduced_shape(xi.shape, axes), -np.inf, t.dtype), xi.shape, axes, keepdims
        )
    m = stop_gradient(max(t, axes, keepdims=True))
    m = where(m.isfinite(), m, 0.0)
    out = log(sum(exp(subtract(t, m)), axes, keepdims=True)) + m
    return _keep(reshape(out, _reduced_shape(xi.shape, axes)), xi.shape, axes, keepdims)


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


# ---- derivative rules ------------------------------------------------------------------------


def _bind1(prim, xs, params) -> Tensor:
    return Tensor._wrap(bind(prim, [x._impl for x in xs], params)[0])


def _expand(y: Tensor, shape, axes) -> Tensor:
    """``y`` (reduced over ``axes``) broadcast back to ``shape``."""
    dims = tuple(a for a in range(len(shape)) if a not in axes)
    return _bind1(broadcast_in_dim_p, [y], (tuple(shape), dims))


def _sum_t(params, ct, x):
    return _expand(cast_like(ct, x), x.shape, params[0])


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


def _cumsum_t(params, ct, x):
    return _bind1(cumsum_p, [cast_like(ct, x)], (params[0], not params[1]))


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
    return [zeros_like(x).at[index].add(cast_like(ct, x))]


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


def _install_rules() -> None:
    linear(reduce_sum_p, _sum_t)
    linear(cumsum_p, _cumsum_t)
    for p in (reduce_max_p, reduce_min_p):
        p.jvp, p.vjp = _chooser_jvp, _chooser_vjp
    reduce_prod_p.jvp, reduce_prod_p.vjp = _prod_jvp, _prod_vjp
    sort_p.jvp, sort_p.vjp = _sort_jvp, _sort_vjp
    top_k_p.jvp, top_k_p.vjp = _topk_jvp, _topk_vjp
    nondifferentiable(argmax_p, argmin_p, argsort_p, reduce_and_p, reduce_or_p)


_install_rules()


# ---- batching rules (see _batch.py): the axis parameters move past the batch axes ------------


def _install_batch_rules() -> None:
    fn: Callable
    for p, fn, out in (
        (reduce_sum_p, jnp.sum, _sum_dtype),
        (reduce_prod_p, jnp.prod, _sum_dtype),
        (reduce_max_p, jnp.max, None),
        (reduce_min_p, jnp.min, None),
        (reduce_and_p, jnp.all, None),
        (reduce_or_p, jnp.any, None),
    ):
        p.batch = unary_rule(
            lambda params, b, x, fn=fn, out=out: fn(x, axis=shift(params[0], b)).astype(
                out(x.dtype) if out is not None else x.dtype
            )
        )
    for p, fn in ((argmax_p, jnp.argmax), (argmin_p, jnp.argmin)):
        p.batch = unary_rule(
            lambda params, b, x, fn=fn: fn(x, axis=params[0] + b).astype(jnp.int32)
        )
    cumsum_p.batch = unary_rule(
        lambda params, b, x: lax.cumsum(
            x.astype(_sum_dtype(x.dtype)), axis=params[0] + b, reverse=params[1]
        )
    )
    sort_p.batch = unary_rule(lambda params, b, x: jnp.sort(x, axis=params[0] + b, stable=True))
    argsort_p.batch = unary_rule(
        lambda params, b, x: jnp.argsort(x, axis=params[0] + b, stable=True).astype(jnp.int32)
    )
    top_k_p.batch = unary_rule(lambda params, b, x: _topk_lower(params, x))  # last axis


_install_batch_rules()


def _install_shard_rules() -> None:
    for p in (reduce_sum_p, reduce_prod_p, reduce_max_p, reduce_min_p, reduce_and_p, reduce_or_p):
        p.shard = _shard.drop_dims(lambda params: params[0])
    for p in (argmax_p, argmin_p):
        p.shard = _shard.drop_dims(lambda params: (params[0],))
    for p in (cumsum_p, sort_p, argsort_p):
        p.shard = _shard.replicate_dims(lambda params, avals: (params[0],))
    top_k_p.shard = _shard.replicate_dims(lambda params, avals: (len(avals[0][0]) - 1,))


_install_shard_rules()

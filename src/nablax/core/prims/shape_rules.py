"""JVP/VJP, batching and sharding rules of the shape primitives (see ``_rules.py`` for the rule
signatures). All of these primitives are linear in their tensor input(s)."""

from __future__ import annotations

import numpy as np
from jax import lax

from ..build import bind
from ..tensor import Tensor
from . import _shard
from ._batch import _batch_shape, shift, to_full_batch, unary_rule
from ._rules import cast_like, is_float_tensor
from ._rules import linear_install as linear
from .creation import zeros
from .reduce import reduce_sum_p
from .shape import (
    _pad_lower,
    broadcast_in_dim_p,
    concatenate_p,
    pad_p,
    reshape_p,
    rev_p,
    slice_p,
    split_p,
    transpose_p,
)

# ---- derivative rules ------------------------------------------------------------------------
# All of these primitives are linear in their tensor input(s): the jvp applies the primitive to the
# tangent, the vjp applies its transpose, both built from shape primitives so any order works.


def _bind1(prim, xs, params) -> Tensor:
    return Tensor._wrap(bind(prim, [x._impl for x in xs], params)[0])


def _zeros(shape, dtype) -> Tensor:
    return zeros(shape, dtype)


def _reshape_t(params, ct, x):
    return _bind1(reshape_p, [ct], (x.shape,))


def _transpose_t(params, ct, x):
    return _bind1(transpose_p, [ct], (tuple(int(i) for i in np.argsort(params[0])),))


def _broadcast_in_dim_t(params, ct, x):
    shape, dims = params
    stretched = {d for i, d in enumerate(dims) if x.shape[i] == 1 and shape[d] != 1}
    axes = tuple(a for a in range(len(shape)) if a not in dims or a in stretched)
    if axes:
        ct = _bind1(reduce_sum_p, [ct], (axes,))
    return ct if ct.shape == x.shape else _bind1(reshape_p, [ct], (x.shape,))


def _slice_t(params, ct, x):
    starts, _, strides = params
    out = ct.shape
    if 0 in out:
        return _zeros(x.shape, x.dtype)
    spans = tuple((n - 1) * s + 1 for n, s in zip(out, strides))  # extent covered in x
    strided = {a for a, (n, s) in enumerate(zip(out, strides)) if s != 1 and n > 1}
    if strided:  # dilate: s-1 zeros after each element (a new axis padded, then merged)
        spread, widths = [], []
        for a, n in enumerate(out):
            spread.append(n)
            widths.append((0, 0))
            if a in strided:
                spread.append(1)
                widths.append((0, strides[a] - 1))
        ct = _bind1(reshape_p, [ct], (tuple(spread),))
        ct = _bind1(pad_p, [ct], (tuple(widths), 0))
        dilated = tuple(n * strides[a] if a in strided else n for a, n in enumerate(out))
        ct = _bind1(reshape_p, [ct], (dilated,))
        if dilated != spans:
            ct = _bind1(slice_p, [ct], ((0,) * len(out), spans, (1,) * len(out)))
    widths = tuple((st, d - st - sp) for st, d, sp in zip(starts, x.shape, spans))
    return _bind1(pad_p, [ct], (widths, 0))


def _pad_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(outs[0]):
        return [None]
    return [_bind1(pad_p, [t], (params[0], 0))]


def _pad_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    widths = params[0]
    starts = tuple(lo for lo, _ in widths)
    limits = tuple(lo + d for (lo, _), d in zip(widths, x.shape))
    return [cast_like(_bind1(slice_p, [ct], (starts, limits, (1,) * len(starts))), x)]


def _concatenate_jvp(params, tangents, primals, outs):
    if all(t is None for t in tangents) or not is_float_tensor(outs[0]):
        return [None]
    dt = params[1]
    ts = [t if t is not None else _zeros(x.shape, dt) for t, x in zip(tangents, primals)]
    return [_bind1(concatenate_p, ts, params)]


def _concatenate_vjp(params, cts, primals, outs):
    ct = cts[0]
    if ct is None or not is_float_tensor(outs[0]):
        return [None] * len(primals)
    axis = params[0]
    sizes = tuple(x.shape[axis] for x in primals)
    parts = bind(split_p, [ct._impl], (sizes, axis))
    return [
        cast_like(Tensor._wrap(p), x) if is_float_tensor(x) else None
        for p, x in zip(parts, primals)
    ]


def _split_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(primals[0]):
        return [None] * len(outs)
    return [Tensor._wrap(o) for o in bind(split_p, [t._impl], params)]


def _split_vjp(params, cts, primals, outs):
    x = primals[0]
    if all(c is None for c in cts) or not is_float_tensor(x):
        return [None]
    parts = [
        cast_like(c, x) if c is not None else _zeros(o.shape, x.dtype) for c, o in zip(cts, outs)
    ]
    if len(parts) == 1:
        return parts
    return [_bind1(concatenate_p, parts, (params[1], x.dtype))]


def _install_rules() -> None:
    def transpose_of(rule):
        return lambda params, ct, x: rule(params, cast_like(ct, x), x)

    linear(reshape_p, transpose_of(_reshape_t))
    linear(transpose_p, transpose_of(_transpose_t))
    linear(broadcast_in_dim_p, transpose_of(_broadcast_in_dim_t))
    linear(slice_p, transpose_of(_slice_t))
    linear(rev_p, lambda params, ct, x: _bind1(rev_p, [cast_like(ct, x)], params))
    pad_p.jvp, pad_p.vjp = _pad_jvp, _pad_vjp
    concatenate_p.jvp, concatenate_p.vjp = _concatenate_jvp, _concatenate_vjp
    split_p.jvp, split_p.vjp = _split_jvp, _split_vjp


_install_rules()


# ---- batching rules (see _batch.py) ----------------------------------------------------------


def _concatenate_batch(params, bds, *xs):
    bshape = _batch_shape(xs, bds)
    full = [to_full_batch(x, b, bshape).astype(params[1]) for x, b in zip(xs, bds)]
    return lax.concatenate(full, params[0] + len(bshape))


def _install_batch_rules() -> None:
    def lead(b):
        return tuple(range(b))

    reshape_p.batch = unary_rule(lambda p, b, x: lax.reshape(x, tuple(x.shape[:b]) + p[0]))
    transpose_p.batch = unary_rule(lambda p, b, x: lax.transpose(x, lead(b) + shift(p[0], b)))
    broadcast_in_dim_p.batch = unary_rule(
        lambda p, b, x: lax.broadcast_in_dim(x, tuple(x.shape[:b]) + p[0], lead(b) + shift(p[1], b))
    )
    slice_p.batch = unary_rule(
        lambda p, b, x: lax.slice(x, (0,) * b + p[0], tuple(x.shape[:b]) + p[1], (1,) * b + p[2])
    )
    pad_p.batch = unary_rule(lambda p, b, x: _pad_lower((((0, 0),) * b + p[0], p[1]), x))
    rev_p.batch = unary_rule(lambda p, b, x: lax.rev(x, shift(p[0], b)))
    split_p.batch = unary_rule(lambda p, b, x: tuple(lax.split(x, p[0], p[1] + b)))
    concatenate_p.batch = _concatenate_batch


_install_batch_rules()


def _install_shard_rules() -> None:
    reshape_p.shard = _shard.reshape
    transpose_p.shard = _shard.transpose
    broadcast_in_dim_p.shard = _shard.broadcast_in_dim
    slice_p.shard = _shard.unchanged_dims
    pad_p.shard = _shard.unchanged_dims
    rev_p.shard = _shard.replicate_dims(lambda params, avals: params[0])
    split_p.shard = _shard.replicate_dims(lambda params, avals: (params[1],))
    concatenate_p.shard = _shard.concatenate


_install_shard_rules()

"""Fused primitives for the hot spots of a training step: Adam's update and cross-entropy.

An eager training loop builds its whole step every iteration, and at a few microseconds of Python
per graph node, the node count of a small model's step is most of its cost. Written as separate
ops, Adam takes about a dozen nodes per parameter (two moments, the bias-corrected direction) and
integer-label cross-entropy about twenty (log-softmax, the masked pick of the target, ignore_index,
the mean), plus as many again in its backward pass. Here each is one node:

- :data:`adam_p` (``adam_update``): the new moments and the direction of one parameter, with the
  bias corrections computed from the int32 step count inside (``optim.scale_by_adam``), times a
  constant ``scale`` (``optim.adam`` with a float learning rate folds ``-lr`` in);
- :data:`cross_entropy_p`: softmax cross-entropy of logits with integer targets, with
  ``label_smoothing``, ``ignore_index`` and the reduction (``nn.functional.cross_entropy``); a
  target outside ``[0, C)`` (other than ``ignore_index``) gives a NaN loss and NaN gradient for
  its row, so a reduced loss is NaN.

The lowerings are the same ``jax.numpy`` ops the separate nodes lowered to, which XLA fuses the
same way, so programs and numbers do not change. Derivatives and batching are JAX's derivative and
``jax.vmap`` of the lowering (``derived_from_jax``; the backward of cross-entropy is one
``vjp[cross_entropy]`` node). Sharding: Adam's outputs are laid out like its inputs; a reduced
cross-entropy is a replicated scalar, an unreduced one keeps the batch layout of the logits, and
the derived backward node lays the logits' cotangent out as the logits.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax

from ... import _caches
from .. import dtypes
from ..build import bind
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _shard
from ._rules import derived_from_jax
from .elementwise import expm1, sqrt


def bias_corrections(t, b1: float, b2: float, expm1, sqrt):
    """``(1 - b1**t, sqrt(1 - b2**t))`` for the float step number ``t``, as ``-expm1(t *
    log(b))``: float32 ``1 - 0.999**1`` loses five digits to cancellation (torch computes it in
    float64); this form keeps float32 precision."""
    return -expm1(t * _log(b1)), sqrt(-expm1(t * _log(b2)))


def _log(b: float) -> float:
    return math.log(b) if b > 0 else -math.inf


def adam_formula(g, m, v, t, b1: float, b2: float, eps: float, ops, scale: float = 1.0):
    """torch.optim.Adam's step on one parameter: ``(new m, new v, direction)`` where the direction
    is ``(m / c1) / (sqrt(v) / c2_sqrt + eps)`` with the :func:`bias_corrections` of the float32
    step number ``t`` cast to each new moment's dtype, times ``scale`` unless it is 1 (``adam``
    folds ``-lr`` in: the multiply the separate learning-rate node did). ``ops`` is ``(expm1,
    sqrt, cast)``: JAX's in the lowering, nablax's in the fallback."""
    expm1, sqrt, cast = ops
    c1, c2_sqrt = bias_corrections(t, b1, b2, expm1, sqrt)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * (g * g)
    d = (m / cast(c1, m)) / (sqrt(v) / cast(c2_sqrt, v) + eps)
    return m, v, d if scale == 1.0 else d * scale


def _adam_lower(params, g, m, v, count):
    b1, b2, eps, scale = params
    t = count.astype(jnp.float32)
    return adam_formula(g, m, v, t, b1, b2, eps, (jnp.expm1, jnp.sqrt, _astype), scale)


def _astype(s, x):
    return s.astype(x.dtype)


def _adam_aval(params, g, m, v, count):
    shape = g[0]
    return ((shape, m[1]), (shape, v[1]), (shape, dtypes.promote(m[1], v[1])))


def _adam_shard(params, in_layouts, in_avals, out_avals):
    (lay,) = _shard.elementwise(params, in_layouts, in_avals, out_avals[:1])
    return (lay,) * 3


adam_p = primitive(
    "adam_update",
    _adam_aval,
    _adam_lower,
    multiple_results=True,
    rules=derived_from_jax,
    shard=_adam_shard,
    doc="Adam's new moments and direction for one parameter (optim.scale_by_adam), fused.",
)


# dtype -> is floating (checked for every parameter of every step: a plain dict, bounded)
_FLOAT = _caches.DictCache("ops.adam_float_dtypes", 64)


def _is_float(dt) -> bool:
    hit = _FLOAT.data.get(dt)
    if hit is None:
        hit = _FLOAT.put(dt, dtypes.is_floating(dt))
    return hit


def _cast(s: Tensor, x: Tensor) -> Tensor:
    return s.astype(x.dtype) if _is_float(x.dtype) and x.dtype != s.dtype else s


def adam_update(g, m, v, count: Tensor, b1: float, b2: float, eps: float, scale: float = 1.0):
    """``(new m, new v, scale * direction)`` of one parameter at int32 step ``count`` (1 for the
    first update; see :func:`adam_formula`): one node when ``g``, ``m`` and ``v`` are float tensors of
    one shape with ``m``/``v`` at least as wide as ``g``, else the same formula as separate
    element-wise ops."""
    gi, mi, vi = to_impl(g), to_impl(m), to_impl(v)
    if (
        gi.shape == mi.shape == vi.shape
        and _is_float(gi.dtype)
        and _is_float(mi.dtype)
        and _is_float(vi.dtype)
        and dtypes.promote(mi.dtype, gi.dtype) == mi.dtype
        and dtypes.promote(vi.dtype, gi.dtype) == vi.dtype
    ):
        outs = bind(adam_p, [gi, mi, vi, to_impl(count)], (b1, b2, eps, scale))
        return tuple(Tensor._wrap(o) for o in outs)
    gt, mt, vt = Tensor._wrap(gi), Tensor._wrap(mi), Tensor._wrap(vi)
    t = Tensor._wrap(to_impl(count)).astype(dtypes.float32)
    return adam_formula(gt, mt, vt, t, b1, b2, eps, (expm1, sqrt, _cast), scale)


# ---- softmax cross-entropy with integer targets ---------------------------------------------
# params: (class axis, ignore_index, label_smoothing, reduction "mean" | "sum" | "none")

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1  # an ignore_index beyond these matches no target


def _cross_entropy_lower(params, x, y):
    c_axis, ignore_index, smoothing, reduction = params
    # log_softmax as jax.nn.log_softmax: shift by the (constant) max, subtract the log-sum-exp
    shifted = x - lax.stop_gradient(jnp.max(x, axis=c_axis, keepdims=True))
    logp = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=c_axis, keepdims=True))
    n_cls = x.shape[c_axis]
    # compare as int32: JAX wraps a Python int into a narrow target dtype (uint8 != -100 would
    # compare with 156); a uint32 beyond int32 becomes negative, so out of range as it should
    y = y if y.dtype == jnp.int32 else y.astype(jnp.int32)
    valid = y != ignore_index if _INT32_MIN <= ignore_index <= _INT32_MAX else y == y
    bad = valid & ((y < 0) | (y >= n_cls))  # a counted target outside [0, C)
    safe = jnp.where(valid & ~bad, y, 0)
    # the target's log-probability as a masked sum over the class axis, not a gather: it fuses,
    # and XLA's SPMD partitioner keeps a split batch split
    grid = [1] * x.ndim
    grid[c_axis] = n_cls
    hit = jnp.expand_dims(safe, c_axis) == lax.broadcasted_iota(jnp.int32, tuple(grid), c_axis)
    nll = -jnp.sum(jnp.where(hit, logp, 0.0), axis=c_axis)
    if smoothing:
        nll = nll * (1.0 - smoothing) + (-jnp.mean(logp, axis=c_axis)) * smoothing
    # a target outside [0, C) makes its row's loss NaN (and, as a factor, its logits' gradient
    # NaN too), never a finite number; ignored rows count 0
    nll = jnp.where(valid, nll * jnp.where(bad, jnp.nan, 1.0).astype(nll.dtype), 0.0)
    if reduction == "none":
        return nll
    if reduction == "sum":
        return jnp.sum(nll)
    return jnp.sum(nll) / jnp.sum(valid.astype(nll.dtype))  # mean over the counted targets


def _cross_entropy_aval(params, x, y):
    reduction = params[3]
    return ((y[0] if reduction == "none" else (), x[1]),)


def _cross_entropy_shard(params, in_layouts, in_avals, out_avals):
    c_axis, _, _, reduction = params
    if reduction != "none":
        return ((),)
    lay = in_layouts[0]
    return (tuple(a for d, a in enumerate(lay) if d != c_axis),)


cross_entropy_p = primitive(
    "cross_entropy",
    _cross_entropy_aval,
    _cross_entropy_lower,
    rules=derived_from_jax,
    shard=_cross_entropy_shard,
    doc="Softmax cross-entropy of logits with integer targets (nn.functional.cross_entropy), "
    "reduced, fused.",
)


def cross_entropy(
    x: Tensor, y: Tensor, c_axis: int, ignore_index: int, smoothing: float, reduction: str
):
    """Cross-entropy of float logits ``x`` with int targets ``y`` (``x``'s shape without
    ``c_axis``; shapes and arguments checked by the caller) in one node."""
    params = (c_axis, int(ignore_index), float(smoothing), reduction)
    return Tensor._wrap(bind(cross_entropy_p, [x._impl, y._impl], params)[0])

"""Windowed ops: the ``conv`` primitive (``lax.conv_general_dilated`` in the channels-first
layouts ``N C spatial...`` / ``O I spatial...``) and the ``reduce_window`` primitive (``max`` or
``sum`` over sliding windows: pooling), with their rules and builders.

Both are linear or piecewise linear, and JAX's derivatives of them are the standard ones
(transposed convolutions, select-and-scatter), so their gradient and tangent rules are derived from
JAX (``derived_from_jax``); batching goes through ``jax.vmap`` of the lowering. The sharding rules
keep a split batch axis (and a split output-channel axis of the kernel) split.

The user-facing forms with PyTorch's arguments are in ``nablax.nn.functional`` (``conv2d``,
``max_pool2d``, ``avg_pool2d``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _caches
from ...errors import DTypeError, ShapeError, op_error
from .. import dtypes
from ..build import bind
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _autocast
from ._rules import derived_from_jax
from ._util import is_concrete
from .linalg import lax_precision, matmul_precision

_shape_cache = _caches.Cache("ops.window_shapes", 4096)


def _eval_shape(name: str, params, avals, fn):
    key = (name, params, tuple(avals))
    hit = _shape_cache.get(key)
    if hit is None:
        structs = [jax.ShapeDtypeStruct(s, d) for s, d in avals]
        try:
            out = jax.eval_shape(lambda *xs: fn(params, *xs), *structs)
        except Exception as e:  # noqa: BLE001 - re-raised with the shapes
            shapes = ", ".join(str(s) for s, _ in avals)
            raise op_error(ShapeError, name, f"does not fit shapes {shapes}: {e}") from None
        hit = ((tuple(out.shape), out.dtype),)
        if is_concrete(key):
            _shape_cache.put(key, hit)
    return hit


# ---- conv ------------------------------------------------------------------------------------
# params: (strides, padding ((lo, hi) per spatial dim), lhs_dilation, rhs_dilation, groups,
# precision): precision is nx.config matmul_precision for float32 convolutions (see linalg.py)


def _conv_lower(params, x, w):
    strides, padding, lhs_dil, rhs_dil, groups, prec = params
    return lax.conv_general_dilated(
        x,
        w,
        window_strides=strides,
        padding=padding,
        lhs_dilation=lhs_dil,
        rhs_dilation=rhs_dil,
        feature_group_count=groups,
        precision=lax_precision(prec),
    )


def _conv_aval(params, x, w):
    return _eval_shape("conv", params, (x, w), _conv_lower)


def _conv_shard(params, in_layouts, in_avals, out_avals):
    (shape, _), *_ = out_avals
    out = [()] * len(shape)
    out[0] = in_layouts[0][0]  # batch
    if params[4] == 1:  # output channels follow the kernel's (groups mix them otherwise)
        out[1] = in_layouts[1][0]
    return (tuple(out),)


conv_p = primitive(
    "conv",
    _conv_aval,
    _conv_lower,
    rules=derived_from_jax,
    shard=_conv_shard,
    doc="N-d convolution, channels first (lax.conv_general_dilated with default layouts).",
)


def _ints(op: str, arg: str, v, n: int, minimum: int) -> tuple:
    t = (v,) * n if isinstance(v, int) else tuple(v)
    if len(t) != n or not all(isinstance(i, int) and i >= minimum for i in t):
        raise op_error(
            ValueError,
            op,
            f"{arg}={v!r} must be an int or {n} ints, each >= {minimum}",
            f"pass e.g. {arg}={minimum if minimum else 1}",
        )
    return t


def conv(x, w, strides=1, padding=0, lhs_dilation=1, rhs_dilation=1, groups=1, *, op="conv"):
    """Convolution of ``x`` ``(N, C, *spatial)`` with ``w`` ``(O, C // groups, *window)``.

    ``padding`` is an int, one int per spatial dim, or ``(lo, hi)`` pairs. The result has the
    promoted float dtype of ``x`` and ``w``.
    """
    xi = x._impl if isinstance(x, Tensor) else to_impl(x)
    wi = w._impl if isinstance(w, Tensor) else to_impl(w)
    nd = len(wi.shape) - 2
    if nd < 1 or len(xi.shape) != nd + 2:
        raise op_error(
            ShapeError,
            op,
            f"input {tuple(xi.shape)} and weight {tuple(wi.shape)} do not form a {max(nd, 1)}-d "
            f"convolution: input must be (N, C, *spatial) and weight (out, in/groups, *window) "
            f"with as many spatial dims",
            "add a batch axis with x[None] for a single example",
        )
    dt = dtypes.promote(xi.dtype, wi.dtype)
    if not (jnp.issubdtype(dt, jnp.floating)):
        raise op_error(
            DTypeError, op, f"needs float tensors, got {xi.dtype} and {wi.dtype}", "cast to float32"
        )
    dt = _autocast.compute_dtype("conv", dt)  # nx.autocast: both inputs are cast to it below
    if not isinstance(groups, int) or groups < 1 or xi.shape[1] != wi.shape[1] * groups:
        raise op_error(
            ShapeError,
            op,
            f"input has {xi.shape[1]} channels but weight {tuple(wi.shape)} with groups={groups} "
            f"expects {wi.shape[1] * groups if isinstance(groups, int) else '?'}",
            "the weight's second dim must be in_channels // groups",
        )
    if wi.shape[0] % groups:
        raise op_error(
            ShapeError, op, f"out_channels {wi.shape[0]} is not divisible by groups={groups}"
        )
    if isinstance(padding, int) or all(isinstance(p, int) for p in padding):
        pads = tuple((p, p) for p in _ints(op, "padding", padding, nd, 0))
    else:
        pads = tuple(tuple(p) for p in padding)
        if len(pads) != nd or not all(len(p) == 2 for p in pads):
            raise op_error(ValueError, op, f"padding={padding!r} needs {nd} (lo, hi) pairs")
    params = (
        _ints(op, "stride", strides, nd, 1),
        pads,
        _ints(op, "lhs_dilation", lhs_dilation, nd, 1),
        _ints(op, "dilation", rhs_dilation, nd, 1),
        groups,
        matmul_precision(dt),
    )
    if xi.dtype != dt:
        xi = Tensor._wrap(xi).astype(dt)._impl
    if wi.dtype != dt:
        wi = Tensor._wrap(wi).astype(dt)._impl
    return Tensor._wrap(bind(conv_p, [xi, wi], params)[0])


# ---- reduce_window -----------------------------------------------------------------------------
# params: (kind "max" | "sum", window dims, strides, padding ((lo, hi) per dim)), full rank


def _init_value(kind: str, dt):
    # a NumPy constant: JAX recognizes max/add with their identity as a differentiable monoid
    # reduction only when the initial value is concrete
    if kind == "sum":
        return np.array(0, dt)
    if jnp.issubdtype(dt, jnp.floating):
        return np.array(-np.inf, dt)
    if dt == jnp.bool_:
        return np.array(False)
    return np.array(jnp.iinfo(dt).min, dt)


def _reduce_window_lower(params, x):
    kind, window, strides, padding = params
    fn = lax.max if kind == "max" else lax.add
    return lax.reduce_window(x, _init_value(kind, x.dtype), fn, window, strides, padding)


def _reduce_window_aval(params, x):
    return _eval_shape("reduce_window", params, (x,), _reduce_window_lower)


def _reduce_window_shard(params, in_layouts, in_avals, out_avals):
    _, window, strides, padding = params
    lay = in_layouts[0]
    # a dim that is not windowed keeps its split; a windowed one is gathered
    return (
        tuple(
            lay[d] if (window[d], strides[d], padding[d]) == (1, 1, (0, 0)) else ()
            for d in range(len(window))
        ),
    )


reduce_window_p = primitive(
    "reduce_window",
    _reduce_window_aval,
    _reduce_window_lower,
    rules=derived_from_jax,
    shard=_reduce_window_shard,
    doc="max or sum over sliding windows (lax.reduce_window): pooling.",
)


def reduce_window(x, kind: str, window: tuple, strides: tuple, padding: tuple, *, op: str):
    """``kind`` ("max" or "sum") of ``x`` over windows; all arguments have one entry per dim."""
    xi = x._impl if isinstance(x, Tensor) else to_impl(x)
    if kind not in ("max", "sum"):
        raise op_error(ValueError, op, f"unknown window reduction {kind!r}", "use 'max' or 'sum'")
    params = (
        kind,
        tuple(int(w) for w in window),
        tuple(int(s) for s in strides),
        tuple((int(lo), int(hi)) for lo, hi in padding),
    )
    rank = len(xi.shape)
    if not len(params[1]) == len(params[2]) == len(params[3]) == rank:
        raise op_error(ShapeError, op, f"window, strides and padding need {rank} entries each")
    for d, (w, p) in enumerate(zip(params[1], params[3])):
        if xi.shape[d] + p[0] + p[1] < w:
            raise op_error(
                ShapeError,
                op,
                f"window {w} is larger than dim {d} of input {tuple(xi.shape)} "
                f"(padded to {xi.shape[d] + p[0] + p[1]})",
                "use a smaller kernel_size or more padding",
            )
    return Tensor._wrap(bind(reduce_window_p, [xi], params)[0])

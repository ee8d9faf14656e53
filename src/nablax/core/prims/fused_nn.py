"""Fused primitives for a transformer's training step: layer norm, GELU, linear, clipping.

An eager step pays a few microseconds of Python per graph node. Written as separate ops, a layer
norm with its affine parameters builds about a dozen forward nodes (two means, the centring, the
variance, ``rsqrt``, the scale and the shift) and some thirty backward nodes; the tanh GELU about
ten forward and twenty backward. Here each is one forward node, and its backward pass one derived
``vjp[...]`` node (``derived_from_jax``: ``jax.vjp`` of the lowering, whose own rules are derived
the same way, so higher orders and ``jax.vmap`` batching work):

- :data:`layer_norm_p`: ``(x - mean) * rsqrt(var + eps)`` over the last ``n_axes`` dims (biased
  variance), times an optional weight, plus an optional bias, all of one float dtype
  (``nn.functional.layer_norm``);
- :data:`gelu_p`: GELU, ``0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`` or exact
  ``0.5 * x * (1 + erf(x / sqrt(2)))`` (``nx.gelu``, ``nn.functional.gelu``);
- :data:`linear_p`: ``x @ weight.T + bias`` (``nn.functional.linear`` with a bias; the product is
  the ``einsum`` node's lowering with its params: dtype under ``nx.autocast``, matmul precision);
- :data:`clip_by_global_norm_p`: every float32 leaf of a tree clipped to a global norm in one
  node (``optim.clip_by_global_norm``), instead of about six nodes per leaf.

The lowerings are the ``jax.numpy`` ops the separate nodes lowered to, in the same order, so XLA
fuses them as before and the numbers do not change. Sharding: an output is laid out as its input
(linear: as the einsum's rule says); the derived backward node lays each cotangent out as its
primal.
"""

from __future__ import annotations

import math
import operator

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _caches, _config
from .. import dtypes
from ..build import bind, bind_known
from ..context import CTX
from ..primitive import primitive
from ..tensor import Tensor
from . import _autocast, _shard, linalg
from . import fused as _fused
from ._rules import derived_from_jax

# ---- layer normalization ---------------------------------------------------------------------
# params: (n_axes, eps, has_weight, has_bias); inputs: x, then the weight and bias when present

_LN_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.float64)})


def _layer_norm_lower(params, x, *affine):
    n_axes, eps, has_w, has_b = params
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    mu = jnp.mean(x, axis=axes, keepdims=True)
    xc = x - mu
    var = jnp.mean(jnp.square(xc), axis=axes, keepdims=True)
    y = xc * lax.rsqrt(var + eps)
    if has_w:
        y = y * affine[0]
    if has_b:
        y = y + affine[-1]
    return y


def _layer_norm_aval(params, x, *affine):
    return (x,)


layer_norm_p = primitive(
    "layer_norm",
    _layer_norm_aval,
    _layer_norm_lower,
    rules=derived_from_jax,
    shard=_shard.same_as_input,
    doc="Layer normalization over the last dims with optional weight and bias "
    "(nn.functional.layer_norm), fused.",
)


def layer_norm_fusable(x: Tensor, shape: tuple, weight, bias, eps) -> bool:
    """Whether :func:`layer_norm` applies: ``x`` float32/float64, the weight and bias (when
    given) tensors of ``x``'s dtype and of shape ``shape`` exactly, ``eps`` a concrete number.
    Other cases (half precision, broadcast or mixed-dtype affine parameters, an ``eps`` traced by
    ``nx.compile`` or a tensor) keep the separate ops and their promotions."""
    if x.dtype not in _LN_DTYPES or not shape or not isinstance(eps, (int, float, np.floating)):
        return False
    for a in (weight, bias):
        if a is not None and not (
            isinstance(a, Tensor) and a.dtype == x.dtype and a.shape == shape
        ):
            return False
    return True


# (x's shape and dtype, normalized_shape, the weight's and bias's (shape, dtype) or None, eps) ->
# the fused node's params, for F.layer_norm's calls that passed the checks below (no autocast,
# tensors, a float eps): a layer norm called every step skips them (cheap to recompute)
_LN_CALLS = _caches.DictCache("core.layer_norm_calls", 1024)


def layer_norm_call(x, normalized_shape, weight, bias, eps) -> Tensor | None:
    """``nn.functional.layer_norm``'s one node when the call fuses, else None (the caller takes
    its full path, which also raises its errors). Applies to a ``Tensor`` input, ``Tensor`` or
    ``None`` affine parameters, an int or tuple ``normalized_shape`` and a float ``eps``, outside
    ``nx.autocast`` (which casts the input first); the checks of a fusing call are done once per
    shapes, dtypes and options."""
    if not (type(x) is Tensor and type(eps) is float and CTX.autocast is None):
        return None
    tn = type(normalized_shape)
    if not (tn is int or tn is tuple):
        return None
    xi = x._impl
    ins = [xi]
    key = [xi.shape, xi.dtype, normalized_shape, eps]
    for a in (weight, bias):
        if a is None:
            key.append(None)
        elif type(a) is Tensor:
            ai = a._impl
            ins.append(ai)
            key.append((ai.shape, ai.dtype))
        else:
            return None
    k = tuple(key)
    params = _LN_CALLS.data.get(k)
    if params is None:
        shape = (normalized_shape,) if tn is int else normalized_shape
        if x.shape[x.ndim - len(shape) :] != shape or not layer_norm_fusable(
            x, shape, weight, bias, eps
        ):
            return None
        params = _LN_CALLS.put(k, (len(shape), eps, weight is not None, bias is not None))
    return Tensor._wrap(bind_known(layer_norm_p, ins, params, ((xi.shape, xi.dtype),))[0])


def layer_norm(x: Tensor, n_axes: int, weight, bias, eps: float) -> Tensor:
    """Layer norm of ``x`` over its last ``n_axes`` dims in one node (arguments checked by the
    caller with :func:`layer_norm_fusable`)."""
    ins = [x._impl]
    if weight is not None:
        ins.append(weight._impl)
    if bias is not None:
        ins.append(bias._impl)
    params = (int(n_axes), float(eps), weight is not None, bias is not None)
    return Tensor._wrap(bind(layer_norm_p, ins, params)[0])


# ---- RMS normalization -----------------------------------------------------------------------
# params: (n_axes, eps, has_weight); inputs: x, then the weight when present


def _rms_norm_lower(params, x, *weight):
    n_axes, eps, has_w = params
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    ms = jnp.mean(jnp.square(x), axis=axes, keepdims=True)
    y = x * lax.rsqrt(ms + eps)
    return y * weight[0] if has_w else y


rms_norm_p = primitive(
    "rms_norm",
    _layer_norm_aval,
    _rms_norm_lower,
    rules=derived_from_jax,
    shard=_shard.same_as_input,
    doc="RMS normalization over the last dims with an optional weight (nn.functional.rms_norm), "
    "fused.",
)


def rms_norm(x: Tensor, shape: tuple, weight, eps) -> Tensor | None:
    """RMS norm of ``x`` over its last ``len(shape)`` dims in one node, or None where the
    separate ops apply: ``x`` not float32/float64 (half precision computes in float32 and
    rounds), a weight that is not a tensor of ``x``'s dtype and of shape ``shape``, or an ``eps``
    that is not a concrete number (traced by ``nx.compile``)."""
    if not layer_norm_fusable(x, shape, weight, None, eps):
        return None
    ins = [x._impl] if weight is None else [x._impl, weight._impl]
    params = (len(shape), float(eps), weight is not None)
    return Tensor._wrap(bind(rms_norm_p, ins, params)[0])


# ---- GELU ------------------------------------------------------------------------------------
# params: (approximate,)

_GELU_C = math.sqrt(2 / math.pi)
_SQRT2 = math.sqrt(2)


def gelu_formula(x, approximate: bool, tanh, erf):
    """GELU written with ``tanh``/``erf`` of the caller's library (JAX's in the lowering)."""
    if approximate:
        return 0.5 * x * (1 + tanh(_GELU_C * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1 + erf(x / _SQRT2))


def _gelu_lower(params, x):
    return gelu_formula(x, params[0], jnp.tanh, lax.erf)


def _gelu_aval(params, x):
    return (x,)


gelu_p = primitive(
    "gelu",
    _gelu_aval,
    _gelu_lower,
    rules=derived_from_jax,
    shard=_shard.same_as_input,
    doc="GELU, tanh approximation or exact (nx.gelu, nn.functional.gelu), fused.",
)


def gelu(x: Tensor, approximate: bool) -> Tensor:
    """GELU of the float tensor ``x`` in one node."""
    xi = x._impl  # the output aval is the input's (gelu_p's rule): the fast entry
    return Tensor._wrap(bind_known(gelu_p, [xi], (bool(approximate),), ((xi.shape, xi.dtype),))[0])


# ---- linear with bias ------------------------------------------------------------------------
# params: (the einsum's params for "...i,oi->...o",); inputs: x, weight (out, in), bias (out,)


def _linear_lower(params, x, w, b):
    y = linalg.einsum_p.lower(params[0], x, w)
    return y + b.astype(y.dtype)  # nx.autocast: the bias cast as the product's inputs


def _linear_aval(params, x, w, b):
    return linalg.einsum_p.abstract_eval(params[0], x, w)


def _linear_shard(params, in_layouts, in_avals, out_avals):
    return _shard.einsum(params[0], in_layouts[:2], in_avals[:2], out_avals)


linear_p = primitive(
    "linear",
    _linear_aval,
    _linear_lower,
    rules=derived_from_jax,
    shard=_linear_shard,
    doc="x @ weight.T + bias with a (out, in) weight (nn.functional.linear), fused.",
)


# (shapes and dtypes of x, w and b, the autocast dtype, the matmul_precision option) -> (the
# node's params, its output avals) of fusable calls: everything the checks and the shape rule
# below read, so a layer called every step skips them (a plain dict read on the hot path: the
# values are cheap to recompute)
_LINEAR_CALLS = _caches.DictCache("core.linear_calls", 1024)


def linear(x: Tensor, w: Tensor, b) -> Tensor | None:
    """``x @ w.T + b`` in one node (and one backward node), or None where the separate einsum
    and add are needed: ``b`` not a float tensor of shape ``(out,)``, shapes that do not match,
    non-float products, or a bias whose dtype (after ``nx.autocast``'s cast) is not the
    product's (the add would promote)."""
    if not (type(b) is Tensor and type(x) is Tensor and type(w) is Tensor):
        params = _linear_params(x, w, b)
        if params is None:
            return None
        return Tensor._wrap(bind(linear_p, [x._impl, w._impl, b._impl], params)[0])
    ins = [x._impl, w._impl, b._impl]
    xi, wi, bi = ins
    key = (
        xi.shape, wi.shape, bi.shape, xi.dtype, wi.dtype, bi.dtype, CTX.autocast,
        _config.get("matmul_precision"),
    )  # fmt: skip
    hit = _LINEAR_CALLS.data.get(key)
    if hit is None:
        params = _linear_params(x, w, b)
        if params is None:
            return None
        hit = (params, linear_p.abstract_eval(params, *[(i.shape, i.dtype) for i in ins]))
        _LINEAR_CALLS.put(key, hit)
    return Tensor._wrap(bind_known(linear_p, ins, hit[0], hit[1])[0])


def _linear_params(x: Tensor, w: Tensor, b) -> tuple | None:
    """The fused node's params, or None where it does not apply."""
    if not (isinstance(b, Tensor) and x.ndim >= 1 and w.ndim == 2 and b.shape == w.shape[:1]):
        return None
    if x.shape[-1:] != w.shape[1:]:
        return None
    dt = dtypes.promote(x.dtype, w.dtype)
    if not dtypes.is_floating(dt):
        return None
    dt = _autocast.compute_dtype("linear", dt)
    if _autocast.compute_dtype("linear", b.dtype) != dt:
        return None
    return (_einsum_params("...i,oi->...o", dt),)


def _einsum_params(spec: str, dt) -> tuple:
    """The params linalg's builders give an einsum node computing in ``dt``."""
    return (spec, dt, linalg.matmul_precision(dt))


# ---- clip by global norm over a whole tree ---------------------------------------------------
# params: (max_norm,); inputs: every float32 leaf; outputs: each leaf clipped


def _clip_lower(params, *gs):
    (max_norm,) = params
    total = None
    for g in gs:  # summed leaf by leaf in order, as optim's _global_norm adds them
        s = jnp.sum(g * g)
        total = s if total is None else total + s
    norm = jnp.sqrt(total)
    small = norm < max_norm
    return tuple(jnp.where(small, g, (g / norm) * max_norm) for g in gs)


def _clip_aval(params, *gs):
    return gs


def _clip_shard(params, in_layouts, in_avals, out_avals):
    return tuple(in_layouts)  # each clipped leaf laid out as the leaf


clip_by_global_norm_p = primitive(
    "clip_by_global_norm",
    _clip_aval,
    _clip_lower,
    multiple_results=True,
    rules=derived_from_jax,
    shard=_clip_shard,
    doc="Every leaf scaled by max_norm / global norm when that norm exceeds max_norm "
    "(optim.clip_by_global_norm on float32 leaves), fused.",
)

_F32 = np.dtype(np.float32)
_F32_ONLY = frozenset((_F32,))


def clip_by_global_norm(leaves: list, max_norm: float) -> list | None:
    """The float32 tensors ``leaves`` clipped to global norm ``max_norm`` in one node (the norm,
    ``norm < max_norm`` and each ``where(small, g, (g / norm) * max_norm)`` in float32, as
    ``optim.clip_by_global_norm`` computes them), or None where some leaf is not a float32 tensor
    (those keep the separate ops, with their casts) or there is no leaf."""
    if not leaves:
        return None
    if set(map(type, leaves)) == _TENSOR_ONLY:  # the common case: C-level maps, no loop
        impls = list(map(_IMPL, leaves))
        if set(map(_DTYPE, impls)) != _F32_ONLY:
            return None
        avals = [(i.shape, _F32) for i in impls]  # each clipped leaf: its own aval
        outs = bind_known(clip_by_global_norm_p, impls, (float(max_norm),), avals)
        return list(map(Tensor._wrap, outs))
    if not all(isinstance(g, Tensor) and g.dtype == _F32 for g in leaves):
        return None
    outs = bind(clip_by_global_norm_p, [g._impl for g in leaves], (float(max_norm),))
    return [Tensor._wrap(o) for o in outs]


# ---- AdamW's update with the decay and the learning rate folded in, over a whole tree ---------
# params: (b1, b2, eps, weight_decay, scale, n); inputs: g[n], m[n], v[n], count (int32), p[n];
# outputs: m[n], v[n], update[n]


def _adamw_lower(params, *xs):
    b1, b2, eps, wd, scale, n = params
    gs, ms, vs, count, ps = xs[:n], xs[n : 2 * n], xs[2 * n : 3 * n], xs[3 * n], xs[3 * n + 1 :]
    t = count.astype(jnp.float32)
    ops = (jnp.expm1, jnp.sqrt, _fused._astype)
    new_m, new_v, ups = [], [], []
    for g, m, v, p in zip(gs, ms, vs, ps):
        m, v, d = _fused.adam_formula(g, m, v, t, b1, b2, eps, ops)
        new_m.append(m)
        new_v.append(v)
        ups.append((d + wd * p) * scale)  # add_decayed_weights, then the -lr of scale_by_lr
    return (*new_m, *new_v, *ups)


def _adamw_aval(params, *avals):
    n = params[5]
    per = [
        _fused._adam_aval(params, avals[i], avals[n + i], avals[2 * n + i], avals[3 * n])
        for i in range(n)
    ]
    return tuple(a[0] for a in per) + tuple(a[1] for a in per) + tuple(a[2] for a in per)


def _adamw_shard(params, in_layouts, in_avals, out_avals):
    n = params[5]
    lays = []
    for i in range(n):
        k = (i, n + i, 2 * n + i, 3 * n)
        (lay, _, _) = _fused._adam_shard(
            params, [in_layouts[j] for j in k], [in_avals[j] for j in k], out_avals[i::n]
        )
        lays.append(lay)
    return tuple(lays) * 3


adamw_p = primitive(
    "adamw_update",
    _adamw_aval,
    _adamw_lower,
    multiple_results=True,
    rules=derived_from_jax,
    shard=_adamw_shard,
    doc="AdamW's new moments and updates (direction + weight_decay * p, times -lr) of every "
    "parameter of a tree, fused into one node.",
)


_ADAMW_DTYPES = _caches.Cache("core.adamw_fusable_dtypes", 256)  # (g, m, v, p) dtypes -> fuses


def _adamw_dtypes_rule(gd, md, vd, pd) -> bool:
    return (
        _fused._is_float(gd)
        and _fused._is_float(md)
        and _fused._is_float(vd)
        and dtypes.promote(md, gd) == md
        and dtypes.promote(vd, gd) == vd
        and pd == dtypes.promote(md, vd)
    )


def _adamw_dtypes_ok(key: tuple) -> bool:
    return _ADAMW_DTYPES.get_or_make(key, lambda: _adamw_dtypes_rule(*key))


def _adamw_fusable(g, m, v, p) -> bool:
    if not (type(g) is Tensor and type(m) is Tensor and type(v) is Tensor and type(p) is Tensor):
        return False
    gi, mi, vi, pi = g._impl, m._impl, v._impl, p._impl
    if not gi.shape == mi.shape == vi.shape == pi.shape:
        return False
    return _adamw_dtypes_ok((gi.dtype, mi.dtype, vi.dtype, pi.dtype))


def adamw_tree_avals(gs, ms, vs, ps) -> list | None:
    """The output avals of one ``adamw`` node over the whole tree (``_adamw_aval``'s, from what
    the check saw) when every parameter fuses (:func:`_adamw_fusable`), else None. One pass with
    no call per leaf: the dtype rule is looked up once per distinct dtype combination. (A loop
    with slot reads beats ``map`` with ``operator.attrgetter`` here on CPython 3.11: measured.)"""
    m_avals, v_avals, u_avals = [], [], []
    last = None
    T = Tensor
    for g, m, v, p in zip(gs, ms, vs, ps):
        if not (type(g) is T and type(m) is T and type(v) is T and type(p) is T):
            return None
        gi, mi, vi, pi = g._impl, m._impl, v._impl, p._impl
        shape = gi.shape
        if not shape == mi.shape == vi.shape == pi.shape:
            return None
        key = (gi.dtype, mi.dtype, vi.dtype, pi.dtype)
        if key != last:
            if not _adamw_dtypes_ok(key):
                return None
            last = key
        m_avals.append((shape, key[1]))
        v_avals.append((shape, key[2]))
        u_avals.append((shape, key[3]))  # the rule holds: promote(m, v) is p's dtype
    return m_avals + v_avals + u_avals


_TENSOR_ONLY = frozenset((Tensor,))
_IMPL = operator.attrgetter("_impl")
_SHAPE = operator.attrgetter("shape")
_DTYPE = operator.attrgetter("dtype")


def adamw_update_tree(
    gs, ms, vs, count: Tensor, ps, b1, b2, eps, weight_decay, scale
) -> tuple[list, list, list]:
    """``(new m's, new v's, updates)``, one list each with an entry per parameter, the update
    being ``(direction + weight_decay * p) * scale``: one node for the whole tree when every
    parameter fuses (:func:`fused.adam_update` would be one node and ``p`` is a tensor of the
    direction's shape and dtype), else per parameter as :func:`adamw_update`."""
    avals = adamw_tree_avals(gs, ms, vs, ps) if gs else None
    if avals is not None:
        return adamw_tree_node(gs, ms, vs, count, ps, b1, b2, eps, weight_decay, scale, avals)
    new_ms, new_vs, ups = [], [], []
    for g, m, v, p in zip(gs, ms, vs, ps):
        m, v, u = adamw_update(g, m, v, count, p, b1, b2, eps, weight_decay, scale)
        new_ms.append(m)
        new_vs.append(v)
        ups.append(u)
    return new_ms, new_vs, ups


def adamw_tree_node(
    gs, ms, vs, count: Tensor, ps, b1, b2, eps, weight_decay, scale, avals
) -> tuple[list, list, list]:
    """:func:`adamw_update_tree`'s one node, with the ``avals`` :func:`adamw_tree_avals` gave."""
    n = len(gs)
    ins = [t._impl for t in (*gs, *ms, *vs, count, *ps)]
    outs = bind_known(adamw_p, ins, (b1, b2, eps, weight_decay, scale, n), avals)
    w = Tensor._wrap
    return list(map(w, outs[:n])), list(map(w, outs[n : 2 * n])), list(map(w, outs[2 * n :]))


def adamw_update(g, m, v, count: Tensor, p, b1, b2, eps, weight_decay: float, scale: float):
    """``(new m, new v, (direction + weight_decay * p) * scale)`` of one parameter: one node when
    :func:`fused.adam_update` would be one and ``p`` is a tensor of the direction's shape and
    dtype, else the separate ops (Adam's node, then the decay's multiply and add and the
    scale's multiply, as ``optim.adamw``'s three stages compute them)."""
    if _adamw_fusable(g, m, v, p):
        outs = bind(
            adamw_p,
            [g._impl, m._impl, v._impl, count._impl, p._impl],
            (b1, b2, eps, weight_decay, scale, 1),
        )
        return tuple(Tensor._wrap(o) for o in outs)
    m, v, d = _fused.adam_update(g, m, v, count, b1, b2, eps)
    return m, v, (d + weight_decay * p) * scale


# ---- apply_updates over a whole tree ---------------------------------------------------------
# params: (n,); inputs: p[n], u[n] (each pair of one shape and dtype); outputs: p + u per leaf


def _apply_lower(params, *xs):
    (n,) = params
    return tuple(p + u for p, u in zip(xs[:n], xs[n:]))


def _apply_aval(params, *avals):
    return avals[: params[0]]


def _apply_shard(params, in_layouts, in_avals, out_avals):
    return tuple(in_layouts[: params[0]])  # each new parameter laid out as the parameter


apply_updates_p = primitive(
    "apply_updates",
    _apply_aval,
    _apply_lower,
    multiple_results=True,
    rules=derived_from_jax,
    shard=_apply_shard,
    doc="params + updates leaf by leaf (optim.apply_updates on leaves of one shape and dtype), "
    "one node for the whole tree.",
)


def apply_updates(ps: list, us: list) -> list | None:
    """``[p + u]`` in one node when every pair is two float tensors of one shape and dtype (no
    cast, no broadcast: exactly ``p + u``), else None (``optim.apply_updates`` then adds leaf by
    leaf, with its casts)."""
    if not ps:
        return None
    if len(ps) == len(us) and set(map(type, ps)) == set(map(type, us)) == _TENSOR_ONLY:
        # the common case: C-level maps and list comparisons, no loop over the leaves
        p_impls, u_impls = list(map(_IMPL, ps)), list(map(_IMPL, us))
        p_dts = list(map(_DTYPE, p_impls))
        if (
            list(map(_SHAPE, p_impls)) != list(map(_SHAPE, u_impls))
            or p_dts != list(map(_DTYPE, u_impls))
            or not all(map(_fused._is_float, set(p_dts)))
        ):
            return None
        avals = [(i.shape, i.dtype) for i in p_impls]  # each new parameter: its parameter's
        outs = bind_known(apply_updates_p, p_impls + u_impls, (len(ps),), avals)
        return list(map(Tensor._wrap, outs))
    for p, u in zip(ps, us):
        if not (
            type(p) is Tensor
            and type(u) is Tensor
            and p.shape == u.shape
            and p.dtype == u.dtype
            and _fused._is_float(p.dtype)
        ):
            return None
    outs = bind(apply_updates_p, [t._impl for t in (*ps, *us)], (len(ps),))
    return [Tensor._wrap(o) for o in outs]

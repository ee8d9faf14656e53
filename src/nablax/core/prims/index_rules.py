"""JVP/VJP, batching and sharding rules of ``gather`` and ``scatter`` (see ``_rules.py`` for the
rule signatures)."""

from __future__ import annotations

import numpy as np

from .. import dtypes
from ..build import bind
from ..tensor import Tensor
from . import _shard
from ._batch import vmap_rule
from ._rules import cast_like, is_float_tensor, unbroadcast
from .creation import iota, zeros
from .elementwise import equal, logical_and, where
from .index import _T, _gather_shape, fill_code, gather_p, scatter_p
from .shape import pad, reshape

# ---- derivative rules ------------------------------------------------------------------------
# gather and scatter are linear in the gathered tensor / the updated tensor and the updates; their
# rules are gathers and scatters with the same index structure and the same index tensors.


def _gather(x: Tensor, structure, idx, params=None) -> Tensor:
    params = (structure,) if params is None else params
    return Tensor._wrap(bind(gather_p, [x._impl, *(i._impl for i in idx)], params)[0])


def _scatter(x: Tensor, v: Tensor, structure, idx, mode: str) -> Tensor:
    impls = [x._impl, v._impl, *(i._impl for i in idx)]
    return Tensor._wrap(bind(scatter_p, impls, (structure, mode))[0])


def _zeros(shape, dtype) -> Tensor:
    return zeros(shape, dtype)


def _gather_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(outs[0]):
        return [None]
    # a filling gather's tangent is 0 where it filled (the fill value is a constant)
    tp = params if len(params) == 1 else (params[0], fill_code(0))
    return [_gather(cast_like(t, outs[0]), params[0], primals[1:], tp)]


def _gather_vjp(params, cts, primals, outs):
    ct, x, idx = cts[0], primals[0], primals[1:]
    res = [None] * len(primals)
    if ct is not None and is_float_tensor(x):
        res[0] = _scatter(_zeros(x.shape, x.dtype), cast_like(ct, x), params[0], idx, "add")
    return res


def _scatter_jvp(params, tangents, primals, outs):
    x, v, idx = primals[0], primals[1], primals[2:]
    tx, tv = tangents[0], tangents[1] if is_float_tensor(v) else None
    if not is_float_tensor(outs[0]) or (tx is None and tv is None):
        return [None]
    structure, mode = params
    if tx is None:
        tx = _zeros(x.shape, x.dtype)
    if tv is None:
        return [tx if mode == "add" else _scatter(tx, _zeros((), x.dtype), structure, idx, mode)]
    return [_scatter(cast_like(tx, x), cast_like(tv, x), structure, idx, mode)]


def _scatter_vjp(params, cts, primals, outs):
    ct, x, v, idx = cts[0], primals[0], primals[1], primals[2:]
    res = [None] * len(primals)
    if ct is None or not is_float_tensor(outs[0]):
        return res
    structure, mode = params
    ct = cast_like(ct, x)
    if mode == "add":
        res[0] = ct
    else:  # positions that were overwritten do not depend on x
        res[0] = _scatter(ct, _zeros((), ct.dtype), structure, idx, "set")
    if is_float_tensor(v):
        if not idx:  # basic indexing: positions are distinct and in range
            g = _gather(ct, structure, idx)
        elif mode == "add":
            g = _gather_or_zero(ct, structure, idx)
        else:
            g = _gather_winners(ct, x.shape, structure, idx)
        res[1] = cast_like(unbroadcast(g, v.shape), v)
    return res


def _tensor_axes(structure, ndim: int) -> list[int]:
    """The axis of ``x`` that each index tensor of ``structure`` indexes."""
    used = sum(1 for s in structure if s == _T or s[0] in ("i", "s"))
    axes, a = [], 0
    for s in structure:
        if s == _T:
            axes.append(a)
            a += 1
        elif s[0] in ("i", "s"):
            a += 1
        elif s[0] == "e":
            a += ndim - used
    return axes


def _gather_or_zero(ct: Tensor, structure, idx) -> Tensor:
    """``ct[index]`` with zeros where an index is out of range (the updates a scatter dropped):
    each indexed axis gets one zero slot at its end, and out-of-range indices point there."""
    axes = _tensor_axes(structure, ct.ndim)
    widths = [(0, 0)] * ct.ndim
    new_idx = []
    for t, a in zip(idx, axes):
        n = ct.shape[a]
        widths[a] = (0, 1)
        if t.dtype.kind == "u":
            new_idx.append(where(t < n, t, n))
        else:
            ok = logical_and(t >= -n, t < n)
            new_idx.append(where(ok, where(t < 0, t + n, t), n))
    return _gather(pad(ct, widths), structure, new_idx)


def _gather_winners(ct: Tensor, shape, structure, idx) -> Tensor:
    """``ct[index]`` where each update wrote the value that stayed, else zero (as JAX: with
    duplicate indices one update wins; out-of-range updates are dropped). Each update element gets
    an id; the ids are scattered like the updates and read back."""
    target = _gather_shape(shape, structure, [(i.shape, i.dtype) for i in idx])
    count = int(np.prod(target, dtype=np.int64))
    ids = reshape(iota(dtypes.int32, (count,), 0) + 1, target)
    written = _scatter(_zeros(shape, dtypes.int32), ids, structure, idx, "set")
    won = equal(_gather(written, structure, idx), ids)
    return where(won, _gather(ct, structure, idx), 0.0)


def _install_rules() -> None:
    gather_p.jvp, gather_p.vjp = _gather_jvp, _gather_vjp
    scatter_p.jvp, scatter_p.vjp = _scatter_jvp, _scatter_vjp


_install_rules()


def _install_batch_rules() -> None:
    for p in (
        gather_p,
        scatter_p,
    ):
        p.batch = vmap_rule(p)


_install_batch_rules()


def _gather_shard(params, in_layouts, in_avals, out_avals):
    """Basic indexing (ints, slices, ``None``, ``...``): a fully sliced dimension keeps its axes,
    a partly sliced one is replicated, an integer index removes it. Array indices: replicated."""
    structure = params[0]
    lay, (in_shape, _) = in_layouts[0], in_avals[0]
    if any(s == _T or s[0] not in "isne" for s in structure):
        return _shard.replicated(params, in_layouts, in_avals, out_avals)
    n_ell = len(in_shape) - sum(1 for s in structure if s[0] in "is")
    out, d = [], 0
    for s in structure:
        if s[0] == "n":
            out.append(())
        elif s[0] == "e":
            out.extend(lay[d : d + n_ell])
            d += n_ell
        elif s[0] == "i":
            d += 1
        else:
            out.append(lay[d] if s[1:] == (None, None, None) else ())
            d += 1
    out.extend(lay[d:])
    return (tuple(out),)


def _install_shard_rules() -> None:
    gather_p.shard = _gather_shard
    scatter_p.shard = _shard.same_as_input  # the output is the operand, updated: its layout


_install_shard_rules()

"""Batching rules: how a primitive runs on vmap-batched inputs (prefix batch semantics).

A batched tensor's physical value is ``batch_shape + shape``: the leading axes belong to the
enclosing ``nx.vmap`` calls, outermost first (see core/transforms/vmap.py). A node whose inputs
are batched records their batch-axis counts (``Node.bdims[0]``); at realization its primitive's
``batch`` rule lowers it on the physical values::

    batch(params, bds, *values) -> value (or a tuple for multiple-result primitives)

``params`` are the node's logical parameters (axes as the user wrote them), ``bds[k]`` the number
of batch axes of input ``k``. The result has the batch axes of all inputs, aligned at the front
and broadcast (an input with fewer batch axes lacks the innermost levels; an axis of size 1
stretches). This module holds the shared rule builders: element-wise alignment, axis shifting for
one-input primitives, and :func:`vmap_rule`, which batches a lowering with ``jax.vmap`` (used where
a hand-written rule would only re-derive what ``jax.vmap`` already does: gathers, scatters, random
bits, derived and user-defined primitives).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax


def _batch_shape(vals, bds) -> tuple:
    """The broadcast batch shape of the inputs (aligned at the front)."""
    out: list = []
    for v, b in zip(vals, bds):
        for k in range(b):
            d = v.shape[k]
            if k == len(out):
                out.append(d)
            elif out[k] == 1:
                out[k] = d
    return tuple(out)


def pad_batch(v, b: int, nb: int):
    """``v`` with ``b`` batch axes given ``nb`` (size-1 axes for the missing inner levels)."""
    if b == nb:
        return v
    return lax.expand_dims(v, tuple(range(b, nb)))


def to_full_batch(v, b: int, bshape: tuple):
    """``v`` with its batch axes padded and broadcast to ``bshape``."""
    v = pad_batch(v, b, len(bshape))
    target = bshape + tuple(v.shape[len(bshape) :])
    return v if tuple(v.shape) == target else jnp.broadcast_to(v, target)


def elementwise_rule(prim):
    """Batch rule of an element-wise primitive: align batch prefixes and logical ranks with size-1
    axes, then the lowering's NumPy broadcasting does the rest."""

    def rule(params, bds, *vals):
        nb = max(bds)
        rank = max((jnp.ndim(v) - b for v, b in zip(vals, bds)), default=0)
        aligned = []
        for v, b in zip(vals, bds):
            nd = jnp.ndim(v)
            if nd == 0:
                aligned.append(v)  # scalars broadcast as they are
                continue
            shape = tuple(v.shape)
            new = shape[:b] + (1,) * (nb - b) + (1,) * (rank - (nd - b)) + shape[b:]
            aligned.append(v if new == shape else jnp.reshape(v, new))
        return prim.lower(params, *aligned)

    return rule


def unary_rule(lower_shifted):
    """Batch rule of a one-input primitive: ``lower_shifted(params, b, x)`` lowers it on a value
    with ``b`` leading batch axes (typically by shifting its axis parameters by ``b``)."""

    def rule(params, bds, x):
        return lower_shifted(params, bds[0], x)

    return rule


def shift(axes, b: int):
    """Logical axes as physical ones (after ``b`` batch axes)."""
    if isinstance(axes, int):
        return axes + b
    return tuple(a + b for a in axes)


def vmap_rule(prim):
    """Batch rule from ``jax.vmap`` of the lowering: batch axes are broadcast to one shape,
    flattened into one mapped axis, and unflattened after."""

    def rule(params, bds, *vals):
        bshape = _batch_shape(vals, bds)
        size = math.prod(bshape)
        args, axes = [], []
        for v, b in zip(vals, bds):
            if b == 0:
                args.append(v)
                axes.append(None)
                continue
            v = to_full_batch(v, b, bshape)
            args.append(jnp.reshape(v, (size,) + tuple(v.shape[len(bshape) :])))
            axes.append(0)
        out = jax.vmap(lambda *xs: prim.lower(params, *xs), in_axes=axes)(*args)
        if prim.multiple_results:
            return tuple(jnp.reshape(o, bshape + tuple(o.shape[1:])) for o in out)
        return jnp.reshape(out, bshape + tuple(out.shape[1:]))

    return rule


def batched_by_vmap(prim) -> dict:
    """``primitive(..., rules=batched_by_vmap)``: batch the record's lowering with ``jax.vmap``."""
    return {"batch": vmap_rule(prim)}


def batched_elementwise(prim) -> dict:
    """``primitive(..., rules=batched_elementwise)``: the element-wise batch rule."""
    return {"batch": elementwise_rule(prim)}

"""``nx.vmap``: vectorizing map with prefix batch semantics.

There is no separate interpreter. ``vmap(f)(x)`` moves the mapped axis of ``x`` in front of its
logical axes, where it becomes a *batch axis*: the tensor's ``batch_shape`` grows by one and its
logical ``shape`` (what ``f`` sees, ``x.shape``) loses that axis. ``f`` then runs as ordinary
lazy-eager code. Every op on a batched tensor records which of its inputs carry how many batch
axes (``Node.bdims``); the primitive's batching rule (ops/_batch.py) lowers it on the physical
values at realization. On exit the batch axis moves back to ``out_axes``.

Batch axes are ordered outermost vmap first. A tensor from an enclosing scope has fewer batch axes
than one created inside: it lacks the innermost levels, so batch shapes are aligned at the front
and broadcast (a size-1 axis stands for "the same for every example of that level"). A tensor that
enters a vmap while lacking some enclosing levels is padded with size-1 axes first, so its new axis
lands on the right level.

Autodiff needs no special case: rules are ordinary ops, so inside ``vmap`` they batch like
everything else (``vmap(grad(f))`` gives per-example gradients), and the view primitives below
have JVP/VJP rules (``grad(vmap(f))``).

>>> import nablax as nx
>>> x = nx.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
>>> nx.vmap(lambda row: row.sum() * 2)(x).tolist()
[6.0, 14.0, 22.0]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import tree as _tree
from ...errors import op_error
from ..build import bind_known
from ..context import CTX
from ..ops.reduce import sum as _sum
from ..ops.shape import broadcast_to, expand_dims, moveaxis
from ..primitive import primitive
from ..tensor import Tensor

# ---- autodiff of the view primitives ----------------------------------------------------------
#
# Batch levels are positional, so the rules below keep one invariant. In the backward pass of a
# transform opened under ``d`` vmaps (``CTX.vjp_depth``), the cotangent of a node output with
# ``nb`` batch levels has levels ``0 .. max(nb, d) - 1`` that mean what the forward's levels mean
# (levels below ``d`` enclose the transform: the cotangent may vary along them where the primal
# was the same for every example), then the cotangent-only levels of vmaps opened around the
# ``vjp`` function after it returned (``jacrev`` pulls a whole basis back at once this way). A
# level entering or leaving the forward is inserted or removed at its own position, so the
# cotangent-only levels always stay innermost and never meet a level of a vmap inside ``f``.
# Tangents (forward mode) have no tangent-only levels: the ``jvp`` call encloses its vmaps.


def _insert_level(t: Tensor, level: int) -> Tensor:
    """``t`` with its logical axis 0 as batch level ``level``; its levels from ``level`` on move
    one inwards (``incr_batch_dims`` when ``t`` has exactly ``level`` levels)."""
    k = t._impl.batch_dims - level
    if k <= 0:
        return incr_batch_dims(pad_levels(t, level))
    for _ in range(k):  # logical: the k inner levels, then t's own axes
        t = decr_batch_dims(t)
    t = moveaxis(t, k, 0)
    for _ in range(k + 1):
        t = incr_batch_dims(t)
    return t


def _extract_level(t: Tensor, level: int) -> Tensor:
    """``t``'s batch level ``level`` as logical axis 0; its later levels move one outwards (the
    inverse of :func:`_insert_level`)."""
    t = pad_levels(t, level + 1)
    k = t._impl.batch_dims - level - 1
    if k == 0:
        return decr_batch_dims(t)
    for _ in range(k + 1):
        t = decr_batch_dims(t)
    t = moveaxis(t, 0, k)
    for _ in range(k):
        t = incr_batch_dims(t)
    return t


def _fit_axis0(t: Tensor, size: int) -> Tensor:
    """A size-1 (same for every example) axis 0 broadcast to the primal's ``size``."""
    return t if t.shape[0] == size else broadcast_to(t, (size,) + t.shape[1:])


def _incr_jvp(params, tangents, primals, outs):
    t, x = tangents[0], primals[0]._impl
    if t is None:
        return [None]
    level = x.batch_dims
    if t._impl.batch_dims > level and x.shape[0] == 1:
        # the forward padded a level enclosing the jvp that the primal lacked (vmap entry); the
        # tangent already varies along it: only the padding axis goes
        return [t.reshape(t.shape[1:])]
    return [incr_batch_dims(pad_levels(t, level))]


def _incr_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]._impl
    if ct is None:
        return [None]
    level, size = x.batch_dims, x.shape[0]
    ct = pad_levels(ct, level + 1)
    c = ct._impl
    if (
        level < CTX.vjp_depth
        and size == 1
        and (c.batch_dims > level + 1 or c.batch_shape[level] > 1)
    ):
        # padding of a level enclosing the transform: the cotangent keeps it (it may differ per
        # example there), the input's size-1 axis gets a size-1 cotangent axis
        return [ct.reshape((1,) + ct.shape)]
    return [_fit_axis0(_extract_level(ct, level), size)]


def _decr_jvp(params, tangents, primals, outs):
    t, x = tangents[0], primals[0]._impl
    if t is None:
        return [None]
    return [_fit_axis0(decr_batch_dims(pad_levels(t, x.batch_dims)), x.batch_shape[-1])]


def _decr_vjp(params, cts, primals, outs):
    ct = cts[0]
    return [None if ct is None else _insert_level(ct, outs[0]._impl.batch_dims)]


# ---- the batch-axis view primitives ----------------------------------------------------------
# Batching: both are the identity on physical values, batched or not (no data movement).
# Sharding: the batch axes are not part of the logical layout (core/prims/_shard.py): the
# dimension that becomes one loses its axes, one that comes back is replicated; the others keep
# theirs.

incr_batch_dims_p = primitive(
    "incr_batch_dims",
    lambda params, x: ((x[0][1:], x[1]),),
    lambda params, x: x,
    jvp=_incr_jvp,
    vjp=_incr_vjp,
    batch=lambda params, bds, x: x,
    shard=lambda params, lays, ins, outs: (lays[0][1:],),
    doc="Logical axis 0 becomes the innermost batch axis (no data movement).",
)
decr_batch_dims_p = primitive(
    "decr_batch_dims",
    lambda params, x: (((params[0],) + x[0], x[1]),),  # params: (size of that batch axis,)
    lambda params, x: x,
    jvp=_decr_jvp,
    vjp=_decr_vjp,
    batch=lambda params, bds, x: x,
    shard=lambda params, lays, ins, outs: (((),) + lays[0],),
    doc="The innermost batch axis becomes logical axis 0 (no data movement).",
)


def _view(prim, params, t: Tensor, shape: tuple, bshape: tuple) -> Tensor:
    impl = t._impl
    bd = ((len(impl.batch_shape),), bshape)
    (out,) = bind_known(prim, (impl,), params, ((shape, impl.dtype),), bdims=bd)
    return Tensor._wrap(out)


def incr_batch_dims(t: Tensor) -> Tensor:
    """``t`` with its logical axis 0 turned into a new innermost batch axis."""
    i = t._impl
    if not i.shape:
        raise op_error(ValueError, "incr_batch_dims", "a 0-d tensor has no axis to batch")
    return _view(incr_batch_dims_p, (), t, i.shape[1:], i.batch_shape + i.shape[:1])


def decr_batch_dims(t: Tensor) -> Tensor:
    """``t`` with its innermost batch axis turned into logical axis 0."""
    i = t._impl
    if not i.batch_shape:
        raise op_error(ValueError, "decr_batch_dims", "the tensor has no batch axis")
    b = i.batch_shape
    return _view(decr_batch_dims_p, (b[-1],), t, b[-1:] + i.shape, b[:-1])


def move_axis_to_batch_dims(t: Tensor, axis: int) -> Tensor:
    """Logical ``axis`` of ``t`` as a new innermost batch axis."""
    return incr_batch_dims(moveaxis(t, axis, 0) if axis else t)


def pad_levels(t: Tensor, n: int) -> Tensor:
    """``t`` with size-1 batch axes added for the inner levels it lacks, up to ``n`` batch axes."""
    while t._impl.batch_dims < n:
        t = incr_batch_dims(t.reshape((1,) + t.shape))
    return t


def sum_to_batch(ct: Tensor, bshape: tuple, fwd_bshape: tuple, depth: int) -> Tensor:
    """The cotangent ``ct`` of an input with batch shape ``bshape`` to a node whose forward
    output has batch shape ``fwd_bshape``, summed over the levels where the forward op broadcast
    that input across examples, from ``depth`` on (the vmaps opened inside the transform whose
    backward pass this is; levels below ``depth`` enclose the transform, so each example there has
    its own gradient: ``vmap(grad(f))`` is per-example, ``grad(vmap(f))`` a sum).

    Levels the output has and the input lacks are summed away, size 1 or not (a size-1 level left
    on a gradient could never be read); levels where the input has size 1 are summed to size 1.
    A cotangent's levels past the forward output's are cotangent-only (``vmap`` of a ``vjp``
    function, as in ``jacrev``): they stay, right after the input's own levels."""
    cb = ct._impl.batch_shape
    nb, nx, top = len(cb), len(bshape), min(len(cb), len(fwd_bshape))
    drop = list(range(max(nx, depth), top))
    ones = [
        k
        for k in range(depth, min(nx, top))
        if bshape[k] == 1 and cb[k] != 1 and fwd_bshape[k] != 1
    ]
    if not drop and not ones:
        return ct
    m = min(drop + ones)
    for _ in range(nb - m):  # levels m.. become logical axes 0.. (outermost first)
        ct = decr_batch_dims(ct)
    if ones:
        ct = _sum(ct, tuple(k - m for k in ones), keepdims=True)
    if drop:
        ct = _sum(ct, tuple(k - m for k in drop))
    for _ in range(nb - m - len(drop)):  # the kept levels go back, outermost first
        ct = incr_batch_dims(ct)
    return ct


def vmap_depth() -> int:
    """How many vmaps enclose the current code (0 outside any)."""
    return CTX.vmap_depth


# ---- vmap ------------------------------------------------------------------------------------


def _fname(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def _axes_for(spec, tree, path: str, what: str, f) -> list:
    """Broadcast the prefix ``spec`` (int/None or a tuple/list/dict matching ``tree``'s top
    levels) over ``tree``: ``[(path, leaf, axis), ...]``."""
    if spec is None or isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        ax = None if spec is None else int(spec)
        return [(p, leaf, ax) for p, leaf in _tree.leaves_with_path(tree, prefix=path)]
    if isinstance(spec, (tuple, list)) and isinstance(tree, (tuple, list)):
        if len(spec) != len(tree):
            raise ValueError(
                f"nx.vmap: {what} {spec!r} has {len(spec)} entries but {path} of {_fname(f)} has "
                f"{len(tree)}. Fix: give one entry per element (or one int for all)"
            )
        out = []
        for k, (s, sub) in enumerate(zip(spec, tree)):
            out += _axes_for(s, sub, f"{path}[{k}]", what, f)
        return out
    if isinstance(spec, dict) and isinstance(tree, dict):
        if set(spec) != set(tree):
            raise ValueError(
                f"nx.vmap: {what} has keys {sorted(map(str, spec))} but {path} of {_fname(f)} has "
                f"keys {sorted(map(str, tree))}"
            )
        out = []
        for k in sorted(tree):  # the order jax.tree_util flattens dicts in
            out += _axes_for(spec[k], tree[k], f"{path}[{k!r}]", what, f)
        return out
    raise TypeError(
        f"nx.vmap: {what} must be an int, None, or a tuple/list/dict prefix of the "
        f"{'arguments' if what == 'in_axes' else 'outputs'}; got {spec!r} for {path} of "
        f"{_fname(f)} (a {type(tree).__name__})"
    )


def _as_mapped_tensor(leaf, path: str, f) -> Tensor:
    if isinstance(leaf, Tensor):
        return leaf
    if isinstance(leaf, (bool, int, float, complex)) or not hasattr(leaf, "__array__"):
        raise TypeError(
            f"nx.vmap: argument {path} of {_fname(f)} is a {type(leaf).__name__}, which has no "
            f"axis to map over. Fix: pass a tensor, or give it in_axes=None"
        )
    return Tensor(leaf)


def _entry(args, in_axes, axis_size, f):
    """Map the arguments' axes into a new batch level: (new args, size)."""
    spec = tuple(in_axes) if isinstance(in_axes, list) else in_axes
    if isinstance(spec, tuple):
        if len(spec) != len(args):
            raise ValueError(
                f"nx.vmap: in_axes has {len(spec)} entries but {_fname(f)} was called with "
                f"{len(args)} positional argument(s). Fix: one entry per argument"
            )
    entries = _axes_for(spec, tuple(args), "args", "in_axes", f)
    sizes: dict[str, int] = {}
    mapped = []
    for path, leaf, ax in entries:
        if ax is None:
            mapped.append(leaf)
            continue
        t = _as_mapped_tensor(leaf, path, f)
        nd = t.ndim
        if not -nd <= ax < nd:
            raise ValueError(
                f"nx.vmap: in_axes={ax} for {path} of {_fname(f)}, but it has shape {t.shape} "
                f"(rank {nd}). Fix: pick an axis in [{-nd}, {nd}) or use None"
            )
        ax %= nd
        sizes[path] = t.shape[ax]
        mapped.append((t, ax))
    distinct = set(sizes.values())
    if axis_size is not None:
        distinct.add(int(axis_size))
    if len(distinct) > 1:
        listed = ", ".join(f"{p} has size {s}" for p, s in sizes.items())
        extra = f" and axis_size={axis_size}" if axis_size is not None else ""
        raise ValueError(
            f"nx.vmap: mapped axes of {_fname(f)} must all have the same size, but {listed}"
            f"{extra}. Fix: make the mapped axes agree, or use in_axes=None for arguments that "
            f"are the same for every example"
        )
    if not distinct:
        raise ValueError(
            f"nx.vmap: {_fname(f)} has no mapped argument (every in_axes is None), so the batch "
            f"size is unknown. Fix: pass axis_size=..."
        )
    size = distinct.pop()
    level = CTX.vmap_depth
    leaves = []
    for path_leaf, m in zip(entries, mapped):
        if type(m) is tuple:
            t, ax = m
            if t._impl.batch_dims > level:
                raise ValueError(
                    f"nx.vmap: argument {path_leaf[0]} of {_fname(f)} is batched by a vmap that "
                    f"has already returned (it leaked out of its function)"
                )
            leaves.append(move_axis_to_batch_dims(pad_levels(t, level), ax))
        else:
            leaves.append(m)
    treedef = _tree.flatten(tuple(args))[1]
    return _tree.unflatten(treedef, leaves), size


def _exit_leaf(t, path: str, ax, size: int, level: int, f):
    if not isinstance(t, Tensor):
        raise TypeError(
            f"nx.vmap: {_fname(f)} returned a {type(t).__name__} at {path}; vmapped functions "
            f"must return tensors (pytrees of tensors). Fix: return nx.tensor(...) of it, or "
            f"compute it outside the vmapped function"
        )
    bd = t._impl.batch_dims
    if ax is None:
        if bd > level:
            raise ValueError(
                f"nx.vmap: out_axes is None for {path} of {_fname(f)}, but that output differs "
                f"per example (it is batched). Fix: give it an out_axes, or return a value that "
                f"does not depend on the mapped arguments"
            )
        return t
    nd = t.ndim + 1
    if not -nd <= ax < nd:
        raise ValueError(
            f"nx.vmap: out_axes={ax} for {path} of {_fname(f)}, whose per-example shape is "
            f"{t.shape} (the result has rank {nd})"
        )
    ax %= nd
    if bd <= level:  # the same for every example: broadcast along the new axis
        return broadcast_to(expand_dims(t, ax), t.shape[:ax] + (size,) + t.shape[ax:])
    t = decr_batch_dims(t)
    if t.shape[0] != size:  # a size-1 (broadcast) batch axis
        t = broadcast_to(t, (size,) + t.shape[1:])
    if ax:
        t = moveaxis(t, 0, ax)
    return t


def vmap(f: Callable, in_axes: Any = 0, out_axes: Any = 0, axis_size: int | None = None):
    """Vectorize ``f`` over an axis of its arguments, as ``jax.vmap``.

    ``in_axes``: an int (negative allowed), ``None`` (the argument is the same for every example),
    or a tuple/list/dict prefix of the arguments giving one of those per argument or leaf.
    ``out_axes`` likewise for the outputs. ``axis_size`` is needed only when no argument is mapped.
    Keyword arguments are mapped over axis 0.

    >>> import nablax as nx
    >>> w = nx.tensor([1.0, 10.0])
    >>> xs = nx.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> nx.vmap(lambda x, w: (x * w).sum(), in_axes=(0, None))(xs, w).tolist()
    [21.0, 43.0]
    >>> nx.vmap(nx.vmap(lambda a, b: a * b, in_axes=(0, None)), in_axes=(None, 0))(
    ...     nx.tensor([1.0, 2.0]), nx.tensor([10.0, 20.0, 30.0])).shape
    (3, 2)
    """

    @functools.wraps(f)
    def run(*args, **kwargs):
        if kwargs:
            keys = list(kwargs)
            n = len(args)

            def g(*a):
                return f(*a[:n], **dict(zip(keys, a[n:])))

            spec = in_axes if not isinstance(in_axes, (tuple, list)) else tuple(in_axes)
            full = (spec if isinstance(spec, tuple) else (spec,) * n) + (0,) * len(keys)
            return vmap(g, full, out_axes, axis_size)(*args, *kwargs.values())
        new_args, size = _entry(args, in_axes, axis_size, f)
        ctx = CTX
        level = ctx.vmap_depth
        ctx.vmap_depth = level + 1
        try:
            out = f(*new_args)
        finally:
            ctx.vmap_depth = level
        entries = _axes_for(out_axes, out, "output", "out_axes", f)
        leaves = [_exit_leaf(t, p, ax, size, level, f) for p, t, ax in entries]
        return _tree.unflatten(_tree.flatten(out)[1], leaves)

    return run

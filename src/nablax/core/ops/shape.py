"""Shape primitives (reshape, transpose, broadcast_in_dim, concatenate, slice, pad, rev, split)
and the composites built on them (squeeze, expand_dims, stack, tile, repeat, moveaxis, ...)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from jax import lax

from ...errors import ShapeError, op_error
from ..primitive import primitive
from ..tensor import Tensor, TensorImpl, bind, to_impl
from ._rules import cast_like, is_float_tensor
from ._util import as_dim, norm_axes, norm_axis, norm_shape


def _impl(x, op: str) -> TensorImpl:
    if type(x) is Tensor:
        return x._impl
    try:
        return to_impl(x)
    except Exception as e:  # noqa: BLE001
        raise op_error(TypeError, op, f"cannot use {type(x).__name__} as a tensor ({e})") from e


def _wrap1(prim, inputs, params) -> Tensor:
    return Tensor._wrap(bind(prim, inputs, params)[0])


# ---- primitives ------------------------------------------------------------------------------

reshape_p = primitive(
    "reshape",
    lambda params, x: ((params[0], x[1]),),
    lambda params, x: lax.reshape(x, params[0]),
)
transpose_p = primitive(
    "transpose",
    lambda params, x: ((tuple(x[0][p] for p in params[0]), x[1]),),
    lambda params, x: lax.transpose(x, params[0]),
)
broadcast_in_dim_p = primitive(
    "broadcast_in_dim",
    lambda params, x: ((params[0], x[1]),),
    lambda params, x: lax.broadcast_in_dim(x, params[0], params[1]),
)


def _concat_aval(params, *avals):
    axis = params[0]
    shape = list(avals[0][0])
    shape[axis] = sum(a[0][axis] for a in avals)
    return ((tuple(shape), params[1]),)


concatenate_p = primitive(
    "concatenate",
    _concat_aval,
    lambda params, *xs: lax.concatenate([x.astype(params[1]) for x in xs], params[0]),
)


def _slice_aval(params, x):
    starts, limits, strides = params
    shape = tuple(max(0, -(-(lim - s) // st)) for s, lim, st in zip(starts, limits, strides))
    return ((shape, x[1]),)


slice_p = primitive(
    "slice",
    _slice_aval,
    lambda params, x: lax.slice(x, params[0], params[1], params[2]),
)


def _pad_aval(params, x):
    widths = params[0]
    return ((tuple(d + lo + hi for d, (lo, hi) in zip(x[0], widths)), x[1]),)


def _pad_lower(params, x):
    widths, value = params
    return lax.pad(x, np.array(value, dtype=x.dtype), [(lo, hi, 0) for lo, hi in widths])


pad_p = primitive("pad", _pad_aval, _pad_lower)
rev_p = primitive("rev", lambda params, x: (x,), lambda params, x: lax.rev(x, params[0]))


def _split_aval(params, x):
    sizes, axis = params
    outs = []
    for s in sizes:
        shape = list(x[0])
        shape[axis] = s
        outs.append((tuple(shape), x[1]))
    return tuple(outs)


def _split_lower(params, x):
    sizes, axis = params
    return tuple(lax.split(x, sizes, axis))


split_p = primitive("split", _split_aval, _split_lower, multiple_results=True)

# ---- public ops ------------------------------------------------------------------------------


def reshape(x, *shape) -> Tensor:
    """Reshape to ``shape`` (one ``-1`` is inferred), as ``numpy.reshape``.

    >>> import nablax as nx
    >>> nx.arange(6).reshape(2, -1).shape
    (2, 3)
    """
    xi = _impl(x, "reshape")
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = tuple(shape[0])
    shape = tuple(as_dim(d) for d in shape)
    size = math.prod(xi.shape)
    if shape.count(-1) > 1:
        raise op_error(ShapeError, "reshape", f"only one -1 allowed in shape {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise op_error(ShapeError, "reshape", f"cannot reshape {xi.shape} into {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size or any(d < 0 for d in shape):
        raise op_error(
            ShapeError,
            "reshape",
            f"cannot reshape a tensor of shape {xi.shape} ({size} elements) into {shape}",
            "the product of the new shape must equal the number of elements",
        )
    if shape == xi.shape:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(reshape_p, [xi], (shape,))


def transpose(x, axes: Sequence[int] | None = None) -> Tensor:
    """Permute axes (reverse them when ``axes`` is None), as ``numpy.transpose``."""
    xi = _impl(x, "transpose")
    nd = len(xi.shape)
    if axes is None:
        perm = tuple(range(nd))[::-1]
    else:
        perm = tuple(norm_axis("transpose", a, nd) for a in axes)
        if sorted(perm) != list(range(nd)):
            raise op_error(
                ShapeError, "transpose", f"axes {tuple(axes)} is not a permutation of {nd} axes"
            )
    if perm == tuple(range(nd)):
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(transpose_p, [xi], (perm,))


def permute(x, *dims) -> Tensor:
    """PyTorch-style ``permute(x, *dims)``."""
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    return transpose(x, dims)


def swapaxes(x, axis1: int, axis2: int) -> Tensor:
    xi = _impl(x, "swapaxes")
    nd = len(xi.shape)
    a, b = norm_axis("swapaxes", axis1, nd, "axis1"), norm_axis("swapaxes", axis2, nd, "axis2")
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def moveaxis(x, source, destination) -> Tensor:
    xi = _impl(x, "moveaxis")
    nd = len(xi.shape)
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise op_error(ShapeError, "moveaxis", "source and destination need the same length")
    src = [norm_axis("moveaxis", a, nd, "source") for a in src]
    dst = [norm_axis("moveaxis", a, nd, "destination") for a in dst]
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def broadcast_to(x, shape) -> Tensor:
    """Broadcast to ``shape`` with NumPy rules."""
    xi = _impl(x, "broadcast_to")
    shape = norm_shape("broadcast_to", shape)
    nd, xs = len(shape), xi.shape
    if len(xs) > nd or any(d != 1 and d != s for d, s in zip(xs, shape[nd - len(xs) :])):
        raise op_error(ShapeError, "broadcast_to", f"cannot broadcast shape {xs} to {shape}")
    if xs == shape:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    dims = tuple(range(nd - len(xs), nd))  # size-1 operand axes broadcast in lax
    return _wrap1(broadcast_in_dim_p, [xi], (shape, dims))


def squeeze(x, axis=None) -> Tensor:
    """Remove axes of size 1 (all of them when ``axis`` is None)."""
    xi = _impl(x, "squeeze")
    if axis is None:
        axes = tuple(i for i, d in enumerate(xi.shape) if d == 1)
    else:
        axes = norm_axes("squeeze", axis, xi.shape)
        for a in axes:
            if xi.shape[a] != 1:
                raise op_error(
                    ShapeError,
                    "squeeze",
                    f"axis {a} has size {xi.shape[a]}, not 1 (shape {xi.shape})",
                )
    return reshape(Tensor._wrap(xi), tuple(d for i, d in enumerate(xi.shape) if i not in axes))


def expand_dims(x, axis) -> Tensor:
    """Insert axes of size 1 at ``axis`` (int or tuple), as ``numpy.expand_dims``."""
    xi = _impl(x, "expand_dims")
    axes = [axis] if isinstance(axis, int) else list(axis)
    nd = len(xi.shape) + len(axes)
    axes = sorted(norm_axis("expand_dims", a, nd) for a in axes)
    if len(set(axes)) != len(axes):
        raise op_error(ShapeError, "expand_dims", f"repeated axis in axis={axis}")
    shape = list(xi.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(Tensor._wrap(xi), tuple(shape))


def unsqueeze(x, dim: int) -> Tensor:
    """PyTorch name for :func:`expand_dims` with one axis."""
    return expand_dims(x, dim)


def _result_dtype(impls):
    from ..dtypes import promote

    d = impls[0].dtype
    for i in impls[1:]:
        d = promote(d, i.dtype)
    return d


def concatenate(tensors, axis: int | None = 0) -> Tensor:
    """Join tensors along an existing axis (``axis=None`` flattens first)."""
    impls = [_impl(t, "concatenate") for t in tensors]
    if not impls:
        raise op_error(ValueError, "concatenate", "needs at least one tensor")
    if axis is None:
        impls = [reshape(Tensor._wrap(i), -1)._impl for i in impls]
        axis = 0
    nd = len(impls[0].shape)
    if nd == 0:
        raise op_error(ShapeError, "concatenate", "zero-dimensional tensors cannot be concatenated")
    ax = norm_axis("concatenate", axis, nd)
    for k, i in enumerate(impls):
        if len(i.shape) != nd or any(
            a != b for j, (a, b) in enumerate(zip(i.shape, impls[0].shape)) if j != ax
        ):
            raise op_error(
                ShapeError,
                "concatenate",
                f"tensors[{k}] has shape {i.shape}, incompatible with tensors[0] {impls[0].shape} "
                f"(all dimensions except axis {ax} must match)",
            )
    dt = _result_dtype(impls)
    if len(impls) == 1:
        from .elementwise import astype

        return astype(Tensor._wrap(impls[0]), dt)
    return _wrap1(concatenate_p, impls, (ax, dt))


def stack(tensors, axis: int = 0) -> Tensor:
    """Join tensors along a new axis."""
    impls = [_impl(t, "stack") for t in tensors]
    if not impls:
        raise op_error(ValueError, "stack", "needs at least one tensor")
    shapes = {i.shape for i in impls}
    if len(shapes) != 1:
        raise op_error(
            ShapeError, "stack", f"all tensors need the same shape, got {sorted(shapes)}"
        )
    ax = norm_axis("stack", axis, len(impls[0].shape) + 1)
    return concatenate([expand_dims(Tensor._wrap(i), ax) for i in impls], ax)


def _slice(x: Tensor, starts, limits, strides) -> Tensor:
    xi = x._impl
    if all(s == 0 for s in starts) and tuple(limits) == xi.shape and all(s == 1 for s in strides):
        return x
    return _wrap1(slice_p, [xi], (tuple(starts), tuple(limits), tuple(strides)))


def split(x, indices_or_sections, axis: int = 0) -> list[Tensor]:
    """Split into equal sections (int) or at the given indices, as ``numpy.split``.

    All parts come from one multi-output node.

    >>> import nablax as nx
    >>> [p.tolist() for p in nx.split(nx.arange(6), [2, 3])]
    [[0, 1], [2], [3, 4, 5]]
    """
    xi = _impl(x, "split")
    ax = norm_axis("split", axis, len(xi.shape))
    n = xi.shape[ax]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if k <= 0 or n % k:
            raise op_error(
                ShapeError,
                "split",
                f"cannot split axis {ax} of size {n} into {k} equal sections",
                "pass a list of split indices, or use nx.chunk for unequal sections",
            )
        sizes = (n // k,) * k
    else:
        idx = [min(max(int(i) if int(i) >= 0 else n + int(i), 0), n) for i in indices_or_sections]
        bounds = [0, *idx, n]
        sizes = tuple(max(b - a, 0) for a, b in zip(bounds[:-1], bounds[1:]))
        if sum(sizes) != n:  # decreasing indices: fall back to independent slices (NumPy semantics)
            t = Tensor._wrap(xi)
            outs = []
            for a, b in zip(bounds[:-1], bounds[1:]):
                lim = list(xi.shape)
                st = [0] * len(xi.shape)
                st[ax], lim[ax] = a, max(a, b)
                outs.append(_slice(t, st, lim, [1] * len(xi.shape)))
            return outs
    return [Tensor._wrap(i) for i in bind(split_p, [xi], (sizes, ax))]


def chunk(x, chunks: int, axis: int = 0) -> list[Tensor]:
    """Split into ``chunks`` nearly equal parts (PyTorch ``chunk``: the last may be smaller)."""
    xi = _impl(x, "chunk")
    ax = norm_axis("chunk", axis, len(xi.shape))
    n = xi.shape[ax]
    if chunks <= 0:
        raise op_error(ValueError, "chunk", f"chunks must be positive, got {chunks}")
    size = -(-n // chunks) if n else 0
    idx = list(range(size, n, size)) if size else []
    return split(Tensor._wrap(xi), idx, ax)


def pad(x, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """Pad with a constant, as ``numpy.pad`` (``pad_width``: int, (before, after), or per axis)."""
    xi = _impl(x, "pad")
    if mode != "constant":
        raise NotImplementedError(f"nx.pad: mode={mode!r} is not implemented; only 'constant'")
    nd = len(xi.shape)
    pw = np.asarray(pad_width, dtype=np.int64)
    try:
        pw = np.broadcast_to(pw, (nd, 2))
    except ValueError:
        raise op_error(
            ShapeError, "pad", f"pad_width {pad_width!r} does not fit a tensor of rank {nd}"
        ) from None
    if (pw < 0).any():
        raise op_error(ValueError, "pad", f"negative pad widths {pad_width!r}")
    widths = tuple((int(a), int(b)) for a, b in pw)
    return _wrap1(pad_p, [xi], (widths, constant_values))


def flip(x, axis=None) -> Tensor:
    """Reverse the order of elements along ``axis`` (all axes when None)."""
    xi = _impl(x, "flip")
    axes = norm_axes("flip", axis, xi.shape)
    if not axes:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(rev_p, [xi], (axes,))


def tile(x, reps) -> Tensor:
    """Repeat the whole tensor ``reps`` times per axis, as ``numpy.tile``."""
    xi = _impl(x, "tile")
    reps = (reps,) if isinstance(reps, int) else tuple(int(r) for r in reps)
    nd = max(len(xi.shape), len(reps))
    shape = (1,) * (nd - len(xi.shape)) + xi.shape
    reps = (1,) * (nd - len(reps)) + reps
    t = reshape(Tensor._wrap(xi), shape)
    inter = []
    for r, d in zip(reps, shape):
        inter += [r, d]
    t = broadcast_to(reshape(t, tuple(v for pair in zip((1,) * nd, shape) for v in pair)), inter)
    return reshape(t, tuple(r * d for r, d in zip(reps, shape)))


def repeat(x, repeats, axis: int | None = None) -> Tensor:
    """Repeat each element, as ``numpy.repeat`` (``axis=None`` flattens first)."""
    t = Tensor._wrap(_impl(x, "repeat"))
    if axis is None:
        t, axis = reshape(t, -1), 0
    ax = norm_axis("repeat", axis, t.ndim)
    n = t.shape[ax]
    if isinstance(repeats, int):
        if repeats < 0:
            raise op_error(ValueError, "repeat", f"repeats must be >= 0, got {repeats}")
        e = expand_dims(t, ax + 1)
        shape = list(e.shape)
        shape[ax + 1] = repeats
        out_shape = list(t.shape)
        out_shape[ax] = n * repeats
        return reshape(broadcast_to(e, shape), out_shape)
    reps = np.asarray(repeats.numpy() if isinstance(repeats, Tensor) else repeats).astype(np.int64)
    reps = np.broadcast_to(reps, (n,))
    from .index import take

    return take(t, np.repeat(np.arange(n), reps).astype(np.int32), axis=ax)


def ravel(x) -> Tensor:
    return reshape(x, -1)


def _install_methods() -> None:
    T = Tensor
    T.reshape = reshape
    T.transpose = lambda self, *axes: transpose(
        self, axes[0] if len(axes) == 1 and not isinstance(axes[0], int) else (axes or None)
    )
    T.T = property(lambda self: transpose(self))
    T.permute = permute
    T.swapaxes = swapaxes
    T.squeeze = squeeze
    T.unsqueeze = unsqueeze
    T.flatten = ravel
    T.ravel = ravel
    T.broadcast_to = broadcast_to
    T.flip = flip
    T.repeat = repeat


_install_methods()


# ---- derivative rules ------------------------------------------------------------------------
# All of these primitives are linear in their tensor input(s): the jvp applies the primitive to the
# tangent, the vjp applies its transpose, both built from shape primitives so any order works.


def _bind1(prim, xs, params) -> Tensor:
    return Tensor._wrap(bind(prim, [x._impl for x in xs], params)[0])


def _zeros(shape, dtype) -> Tensor:
    from .creation import zeros

    return zeros(shape, dtype)


def _reshape_t(params, ct, x):
    return _bind1(reshape_p, [ct], (x.shape,))


def _transpose_t(params, ct, x):
    return _bind1(transpose_p, [ct], (tuple(int(i) for i in np.argsort(params[0])),))


def _broadcast_in_dim_t(params, ct, x):
    from .reduce import reduce_sum_p

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
    from ._rules import linear

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
    from ._batch import _batch_shape, to_full_batch

    bshape = _batch_shape(xs, bds)
    full = [to_full_batch(x, b, bshape).astype(params[1]) for x, b in zip(xs, bds)]
    return lax.concatenate(full, params[0] + len(bshape))


def _install_batch_rules() -> None:
    from ._batch import shift, unary_rule

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
    from . import _shard

    reshape_p.shard = _shard.reshape
    transpose_p.shard = _shard.transpose
    broadcast_in_dim_p.shard = _shard.broadcast_in_dim
    slice_p.shard = _shard.unchanged_dims
    pad_p.shard = _shard.unchanged_dims
    rev_p.shard = _shard.replicate_dims(lambda params, avals: params[0])
    split_p.shard = _shard.replicate_dims(lambda params, avals: (params[1],))
    concatenate_p.shard = _shard.concatenate


_install_shard_rules()

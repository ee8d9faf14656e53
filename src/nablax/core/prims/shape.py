"""Shape primitives (reshape, transpose, broadcast_in_dim, concatenate, slice, pad, rev, split)
and the composites built on them (squeeze, expand_dims, stack, tile, repeat, moveaxis, ...)."""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np
from jax import lax

from ...errors import ShapeError, op_error
from ..build import TensorImpl, bind
from ..dtypes import promote
from ..host import exact_scalar
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from ._util import as_dim, norm_axes, norm_axis, norm_shape
from .elementwise import astype


def _impl(x, op: str) -> TensorImpl:
    return x._impl if type(x) is Tensor else to_impl(x, op=op)


def _ints(op: str, what: str, values) -> tuple:
    """A sequence (or one) of Python ints, else a ``TypeError`` naming ``op`` and ``what``."""
    seq = values if isinstance(values, (tuple, list, np.ndarray)) else (values,)
    try:
        return tuple(operator.index(v) for v in seq)
    except TypeError:
        raise op_error(TypeError, op, f"{what} must be ints, got {values!r}") from None


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
    return _reshape(x, shape, "reshape")


def _reshape(x, shape: tuple, op: str) -> Tensor:
    xi = _impl(x, op)
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = tuple(shape[0])
    try:
        shape = tuple(as_dim(d) for d in shape)
    except (TypeError, ValueError):
        raise op_error(TypeError, op, f"shape must be ints, got {shape!r}") from None
    size = math.prod(xi.shape)
    if shape.count(-1) > 1:
        raise op_error(ShapeError, op, f"only one -1 allowed in shape {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise op_error(ShapeError, op, f"cannot reshape {xi.shape} into {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size or any(d < 0 for d in shape):
        raise op_error(
            ShapeError,
            op,
            f"cannot reshape a tensor of shape {xi.shape} ({size} elements) into {shape}",
            "the product of the new shape must equal the number of elements",
        )
    if shape == xi.shape:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(reshape_p, [xi], (shape,))


def transpose(x, axes: Sequence[int] | None = None) -> Tensor:
    """Permute axes (reverse them when ``axes`` is None), as ``numpy.transpose``."""
    return _transpose(x, axes, "transpose")


def _transpose(x, axes, op: str) -> Tensor:
    xi = _impl(x, op)
    nd = len(xi.shape)
    if axes is None:
        perm = tuple(range(nd))[::-1]
    else:
        perm = tuple(norm_axis(op, a, xi.shape) for a in _ints(op, "axes", axes))
        if sorted(perm) != list(range(nd)):
            raise op_error(ShapeError, op, f"axes {tuple(axes)} is not a permutation of {nd} axes")
    if perm == tuple(range(nd)):
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(transpose_p, [xi], (perm,))


def permute(x, *dims) -> Tensor:
    """PyTorch-style ``permute(x, *dims)``."""
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    return _transpose(x, dims, "permute")


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
    src = list(_ints("moveaxis", "source", source))
    dst = list(_ints("moveaxis", "destination", destination))
    if len(src) != len(dst):
        raise op_error(ShapeError, "moveaxis", "source and destination need the same length")
    src = [norm_axis("moveaxis", a, nd, "source") for a in src]
    dst = [norm_axis("moveaxis", a, nd, "destination") for a in dst]
    for name, axes in (("source", src), ("destination", dst)):
        if len(set(axes)) != len(axes):
            raise op_error(ShapeError, "moveaxis", f"repeated axis in {name}={axes}")
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def broadcast_to(x, shape) -> Tensor:
    """Broadcast to ``shape`` with NumPy rules."""
    return _broadcast_to(x, shape, "broadcast_to")


def _broadcast_to(x, shape, op: str) -> Tensor:
    xi = _impl(x, op)
    shape = norm_shape(op, shape)
    nd, xs = len(shape), xi.shape
    if len(xs) > nd or any(d != 1 and d != s for d, s in zip(xs, shape[nd - len(xs) :])):
        raise op_error(ShapeError, op, f"cannot broadcast shape {xs} to {shape}")
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
    return _expand_dims(x, axis, "expand_dims")


def _expand_dims(x, axis, op: str) -> Tensor:
    xi = _impl(x, op)
    given = _ints(op, "axis", axis)
    nd = len(xi.shape) + len(given)
    axes = sorted(norm_axis(op, a, nd) for a in given)
    if len(set(axes)) != len(axes):
        raise op_error(ShapeError, op, f"repeated axis in axis={axis}")
    shape = list(xi.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(Tensor._wrap(xi), tuple(shape))


def unsqueeze(x, dim: int) -> Tensor:
    """PyTorch name for :func:`expand_dims` with one axis."""
    return _expand_dims(x, dim, "unsqueeze")


def _result_dtype(impls):
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
    return _split(x, indices_or_sections, axis, "split")


def _split(x, indices_or_sections, axis: int, op: str) -> list[Tensor]:
    xi = _impl(x, op)
    ax = norm_axis(op, axis, xi.shape)
    n = xi.shape[ax]
    sections = indices_or_sections
    if isinstance(sections, Tensor):
        sections = sections.numpy()
    if np.ndim(sections) == 0:
        (k,) = _ints(op, "indices_or_sections", sections)
        if k <= 0 or n % k:
            raise op_error(
                ShapeError,
                op,
                f"cannot split axis {ax} of size {n} into {k} equal sections",
                "pass a list of split indices, or use nx.chunk for unequal sections",
            )
        sizes = (n // k,) * k
    else:
        idx = [min(max(i if i >= 0 else n + i, 0), n) for i in _ints(op, "indices", sections)]
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
    """Split into ``min(chunks, n)`` parts along ``axis`` (``n`` its size) whose sizes differ by at
    most one, the larger ones first, as ``numpy.array_split`` (and Nabla's ``chunk``); unlike
    ``array_split`` no part is ever empty (as ``torch.chunk``).

    >>> import nablax as nx
    >>> [c.shape for c in nx.chunk(nx.zeros((10, 2)), 3)]
    [(4, 2), (3, 2), (3, 2)]
    >>> len(nx.chunk(nx.zeros(2), 5))
    2
    """
    xi = _impl(x, "chunk")
    ax = norm_axis("chunk", axis, xi.shape)
    n = xi.shape[ax]
    (chunks,) = _ints("chunk", "chunks", chunks)
    if chunks <= 0:
        raise op_error(ValueError, "chunk", f"chunks must be positive, got {chunks}")
    return _split(Tensor._wrap(xi), chunk_bounds(n, chunks), ax, "chunk")


def chunk_bounds(n: int, chunks: int) -> list[int]:
    """Split points of :func:`chunk`: ``min(chunks, n)`` parts, sizes differing by at most one."""
    k = min(chunks, n)
    if k <= 1:
        return []
    base, extra = divmod(n, k)
    bounds, at = [], 0
    for i in range(k - 1):
        at += base + (i < extra)
        bounds.append(at)
    return bounds


def pad(x, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """Pad with a constant, as ``numpy.pad`` (``pad_width``: int, (before, after), or per axis)."""
    xi = _impl(x, "pad")
    if mode != "constant":
        raise NotImplementedError(f"nx.pad: mode={mode!r} is not implemented; only 'constant'")
    nd = len(xi.shape)
    try:
        pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (nd, 2))
    except (TypeError, ValueError):
        raise op_error(
            ShapeError, "pad", f"pad_width {pad_width!r} does not fit a tensor of rank {nd}"
        ) from None
    if (pw < 0).any():
        raise op_error(ValueError, "pad", f"negative pad widths {pad_width!r}")
    widths = tuple((int(a), int(b)) for a, b in pw)
    value = exact_scalar(constant_values, xi.dtype, "pad")  # checked now, not at realization
    return _wrap1(pad_p, [xi], (widths, value))


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
    reps = _ints("tile", "reps", reps)
    if any(r < 0 for r in reps):
        raise op_error(ValueError, "tile", f"reps must be >= 0, got {reps}")
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
    ax = norm_axis("repeat", axis, t.shape)
    n = t.shape[ax]
    reps = repeats.numpy() if isinstance(repeats, Tensor) else repeats
    reps = np.array(_ints("repeat", "repeats", reps), dtype=np.int64).reshape(np.shape(reps))
    if (reps < 0).any():
        raise op_error(ValueError, "repeat", f"repeats must be >= 0, got {repeats!r}")
    if reps.ndim == 0:
        e = expand_dims(t, ax + 1)
        shape = list(e.shape)
        shape[ax + 1] = int(reps)
        out_shape = list(t.shape)
        out_shape[ax] = n * int(reps)
        return reshape(broadcast_to(e, shape), out_shape)
    if reps.shape not in ((1,), (n,)):
        raise op_error(
            ShapeError, "repeat", f"repeats has shape {reps.shape}; axis {ax} has size {n}"
        )
    idx = np.repeat(np.arange(n), np.broadcast_to(reps, (n,))).astype(np.int32)
    return t[(slice(None),) * ax + (idx,)]  # a gather: Tensor.__getitem__ (core/ops/index.py)


def ravel(x) -> Tensor:
    """The tensor flattened to one axis, as ``numpy.ravel``."""
    return _reshape(x, (-1,), "ravel")


def unbind(x, axis: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``x`` along ``axis``, with that axis removed (PyTorch ``unbind``).

    All slices come from one multi-output node (``split``), so they are built and differentiated
    together.

    >>> import nablax as nx
    >>> a, b = nx.unbind(nx.arange(6).reshape(2, 3))
    >>> a.tolist(), b.tolist()
    ([0, 1, 2], [3, 4, 5])
    >>> [t.tolist() for t in nx.arange(6).reshape(2, 3).unbind(1)]
    [[0, 3], [1, 4], [2, 5]]
    """
    xi = _impl(x, "unbind")
    ax = norm_axis("unbind", axis, xi.shape)
    n = xi.shape[ax]
    if type(n) is not int:
        raise op_error(
            ShapeError,
            "unbind",
            f"axis {ax} has a dynamic size ({n}): the number of results must be known",
            "mark another dimension dynamic, or index the tensor instead",
        )
    shape = xi.shape[:ax] + xi.shape[ax + 1 :]
    if n == 0:
        return ()
    parts = bind(split_p, [xi], ((1,) * n, ax)) if n > 1 else [xi]
    return tuple(_wrap1(reshape_p, [p], (shape,)) for p in parts)


# Derivative, batching and sharding rules: shape_rules.py (imported by ops/__init__.py).

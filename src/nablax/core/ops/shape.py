"""Shape functions (NumPy's and PyTorch's names): the builders of the shape primitives
(core/prims/shape.py) and the composites written with them (``squeeze``, ``stack``, ``tile``,
``repeat``, ``chunk``, ...), which bind no primitive of their own."""

from __future__ import annotations

import numpy as np

from ...errors import ShapeError, op_error
from ..prims._util import norm_axes, norm_axis
from ..prims.shape import (  # noqa: F401 - the builders, re-exported
    _expand_dims,
    _impl,
    _ints,
    _reshape,
    _split,
    _transpose,
    broadcast_to,
    concatenate,
    expand_dims,
    flip,
    moveaxis,
    pad,
    reshape,
    split,
    transpose,
    unbind,
)
from ..tensor import Tensor


def permute(x, *dims) -> Tensor:
    """PyTorch-style ``permute(x, *dims)``: :func:`transpose` with the axes as arguments.

    >>> import nablax as nx
    >>> nx.zeros((2, 3, 4)).permute(2, 0, 1).shape
    (4, 2, 3)
    """
    if len(dims) == 1 and not isinstance(dims[0], int):
        dims = tuple(dims[0])
    return _transpose(x, dims, "permute")


def swapaxes(x, axis1: int, axis2: int) -> Tensor:
    """Exchange two axes, as ``numpy.swapaxes``.

    >>> import nablax as nx
    >>> nx.swapaxes(nx.zeros((2, 3, 4)), 0, 2).shape
    (4, 3, 2)
    """
    xi = _impl(x, "swapaxes")
    nd = len(xi.shape)
    a, b = norm_axis("swapaxes", axis1, nd, "axis1"), norm_axis("swapaxes", axis2, nd, "axis2")
    perm = list(range(nd))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def squeeze(x, axis=None) -> Tensor:
    """Remove axes of size 1 (all of them when ``axis`` is None).

    >>> import nablax as nx
    >>> nx.squeeze(nx.zeros((1, 3, 1)), 0).shape
    (3, 1)
    """
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


def unsqueeze(x, dim: int) -> Tensor:
    """PyTorch name for :func:`expand_dims` with one axis.

    >>> import nablax as nx
    >>> nx.zeros((2, 3)).unsqueeze(-1).shape
    (2, 3, 1)
    """
    return _expand_dims(x, dim, "unsqueeze")


def ravel(x) -> Tensor:
    """The tensor flattened to one axis, as ``numpy.ravel``.

    >>> import nablax as nx
    >>> nx.arange(4).reshape(2, 2).ravel().tolist()
    [0, 1, 2, 3]
    """
    return _reshape(x, (-1,), "ravel")


def stack(tensors, axis: int = 0) -> Tensor:
    """Join tensors along a new axis.

    >>> import nablax as nx
    >>> nx.stack([nx.arange(2), nx.arange(2)], axis=1).tolist()
    [[0, 0], [1, 1]]
    """
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


def tile(x, reps) -> Tensor:
    """Repeat the whole tensor ``reps`` times per axis, as ``numpy.tile``.

    >>> import nablax as nx
    >>> nx.tile(nx.arange(2), (2, 2)).tolist()
    [[0, 1, 0, 1], [0, 1, 0, 1]]
    """
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
    """Repeat each element, as ``numpy.repeat`` (``axis=None`` flattens first).

    >>> import nablax as nx
    >>> nx.repeat(nx.arange(3), [1, 0, 2]).tolist()
    [0, 2, 2]
    """
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
    return t[(slice(None),) * ax + (idx,)]  # a gather: Tensor.__getitem__ (core/prims/index.py)

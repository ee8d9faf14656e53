"""Small helpers shared by the op families: argument normalization and shape arithmetic."""

from __future__ import annotations

import operator
from typing import Any

from jax.export import is_symbolic_dim

from ... import _caches
from ...errors import ShapeError, op_error

# (op, shapes) -> broadcast shape: read by every binary op on unequal shapes (a plain dict, bounded)
_bcast_cache = _caches.DictCache("ops.broadcast_shapes", 4096)


def broadcast_shapes(op: str, *shapes: tuple) -> tuple:
    """NumPy broadcasting of ``shapes``; raises a ``ShapeError`` naming ``op`` and the shapes."""
    key = (op, shapes)
    try:
        return _bcast_cache.data[key]
    except KeyError:
        pass
    ndim = max(len(s) for s in shapes)
    out = []
    for axis in range(-ndim, 0):
        size = 1
        for s in shapes:
            if len(s) >= -axis:
                d = s[axis]
                if d != 1:
                    if size != 1 and size != d:
                        raise op_error(
                            ShapeError,
                            op,
                            f"shapes {' and '.join(str(tuple(s)) for s in shapes)} cannot be "
                            f"broadcast together (axis {axis}: {size} vs {d})",
                            "make the sizes equal or 1 on that axis (reshape / expand_dims)",
                        )
                    size = d
        out.append(size)
    return _bcast_cache.put(key, tuple(out))


def _rank(ndim_or_shape: Any) -> int:
    return len(ndim_or_shape) if isinstance(ndim_or_shape, tuple) else ndim_or_shape


def _what(ndim_or_shape: Any) -> str:
    if isinstance(ndim_or_shape, tuple):
        return f"a tensor of shape {ndim_or_shape}"
    return f"a tensor with {ndim_or_shape} dimension(s)"


def norm_axis(op: str, axis: Any, ndim_or_shape: Any, name: str = "axis") -> int:
    """Normalize one (possibly negative) axis, or raise naming the op, the axis and the shape.

    ``ndim_or_shape`` is the rank, or better the shape (then the message shows it).
    """
    ndim = _rank(ndim_or_shape)
    try:
        a = operator.index(axis)
    except TypeError:
        raise op_error(TypeError, op, f"{name} must be an int, got {type(axis).__name__}") from None
    if not -ndim <= a < ndim:
        raise op_error(
            ShapeError,
            op,
            f"{name}={axis} is out of range for {_what(ndim_or_shape)} ({ndim} dimension(s))",
            f"use an {name} in [{-ndim}, {ndim - 1}]" if ndim else "0-d tensors have no axes",
        )
    return a % ndim if ndim else 0


def norm_axes(op: str, axis: Any, ndim_or_shape: Any) -> tuple:
    """``None`` -> all axes; int or sequence -> sorted tuple of distinct non-negative axes."""
    ndim = _rank(ndim_or_shape)
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        axes = tuple(norm_axis(op, a, ndim_or_shape) for a in axis)
        if len(set(axes)) != len(axes):
            raise op_error(ShapeError, op, f"repeated axis in axis={axis}")
        return tuple(sorted(axes))
    return (norm_axis(op, axis, ndim_or_shape),)


def norm_shape(op: str, shape: Any) -> tuple:
    """A shape argument (int or sequence of ints, tensors of ints allowed) as a tuple of ints."""
    if isinstance(shape, (int,)) or hasattr(shape, "__index__") and not hasattr(shape, "__len__"):
        shape = (shape,)
    try:
        out = tuple(d if _symbolic(d) else operator.index(d) for d in shape)
    except TypeError:
        raise op_error(TypeError, op, f"shape must be a sequence of ints, got {shape!r}") from None
    for d in out:
        if d < 0:
            raise op_error(ShapeError, op, f"negative dimension in shape {out}")
    return out


def _symbolic(d) -> bool:
    return is_symbolic_dim(d)  # jax.export symbolic size (nx.compile dynamic_dims), or a Size


def as_dim(d):
    """A dimension size as an ``int``; symbolic sizes (``nx.compile`` with ``dynamic_dims``) are
    kept as they are."""
    if type(d) is int:
        return d
    # operator.index, not int(): a float size is an error (as NumPy), never truncated
    return d if is_symbolic_dim(d) else operator.index(d)


def is_concrete(key) -> bool:
    """Whether a (nested) shape-cache key holds no symbolic size: those belong to one
    ``nx.compile`` trace's scope and must not be cached across traces."""
    for part in key:
        if isinstance(part, tuple):
            if not is_concrete(part):
                return False
        elif _symbolic(part):
            return False
    return True

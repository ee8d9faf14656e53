"""Shape functions (NumPy's names): builders of the shape primitives (core/prims/shape.py) and composites."""

from ..prims.shape import (  # noqa: F401, A004 - NumPy names
    broadcast_to,
    chunk,
    chunk_bounds,
    concatenate,
    expand_dims,
    flip,
    moveaxis,
    pad,
    permute,
    ravel,
    repeat,
    reshape,
    split,
    squeeze,
    stack,
    swapaxes,
    tile,
    transpose,
    unbind,
    unsqueeze,
)

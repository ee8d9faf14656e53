"""Python ints of an index as runtime values (core/prims/index.py; DESIGN.md convention 16).

An integer index ``x[i]`` and the start of a slice with both bounds given (``x[i:i + 4]``) on an
axis of known size are bounds-checked and normalized when the op is built (:func:`dynamic`), then
travel as 0-d int32 ``Literal`` inputs of the ``gather``/``scatter`` node: ``("I",)`` and
``("S", length, step)`` in the index structure. The slice's length stays in the structure (a
shape). The realization cache keys programs on structure, never on scalar values, so a loop over
positions compiles at most twice (core/realize.py). Lowering cuts a ``lax.dynamic_slice`` window
at those positions (:func:`windows`) and indexes the window with static items.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from ...errors import op_error
from ..graph import POSITION, scalar_literal

T = ("t",)  # placeholder for an index tensor in the structure
INT32 = np.dtype(np.int32)


def axes_of(structure, ndim: int) -> list:
    """The axis of the operand each item of ``structure`` consumes (``None`` for ``None``,
    ``...`` and bool items, which consume none)."""
    used = sum(1 for s in structure if s == T or s[0] in "isIS")
    axes: list = []
    a = 0
    for s in structure:
        if s == T or s[0] in "isIS":
            axes.append(a)
            a += 1
        elif s[0] == "e":
            axes.append(None)
            a += ndim - used
        else:
            axes.append(None)
    return axes


def windows(structure, x, idx):
    """``(starts, sizes, static structure, static idx)`` when ``structure`` has dynamic ints or
    starts, else ``None``: the operand window ``lax.dynamic_slice(x, starts, sizes)`` holds every
    element the index reaches, and the static structure indexes that window."""
    if not any(s != T and s[0] in "IS" for s in structure):
        return None
    zero = np.int32(0)
    starts = [zero] * x.ndim
    sizes = list(x.shape)
    new_s, new_idx = [], []
    it = iter(idx)
    for s, ax in zip(structure, axes_of(structure, x.ndim)):
        if s == T:
            new_s.append(s)
            new_idx.append(next(it))
        elif s[0] == "I":
            starts[ax], sizes[ax] = next(it), 1
            new_s.append(("i", 0))
        elif s[0] == "S":
            _, length, step = s
            starts[ax], sizes[ax] = next(it), (length - 1) * abs(step) + 1
            new_s.append(("s", None, None, None if step == 1 else step))
        else:
            new_s.append(s)
    starts = [jnp.asarray(v, jnp.int32) for v in starts]
    return starts, sizes, tuple(new_s), new_idx


def dynamic(shape, structure: list, tensors: list):
    """Turn the Python ints of ``structure`` into runtime values: an integer index becomes
    ``("I",)`` and a slice with both bounds given whose length is neither 0 nor the whole axis
    becomes ``("S", length, step)``, each with a 0-d int32 input (its normalized position, or the
    lowest index of the slice) in structure order among the index tensors. Bounds are checked
    here, as NumPy would. Axes of symbolic size (``dynamic_dims``) keep their static items."""
    if not any(s != T and s[0] in "is" for s in structure):
        return structure, tensors
    if not all(type(d) is int for d in shape):
        return structure, tensors
    new_s: list = []
    new_t: list = []
    it = iter(tensors)
    for s, ax in zip(structure, axes_of(structure, len(shape))):
        if s == T:
            new_s.append(s)
            new_t.append(next(it))
            continue
        kind = s[0]
        if kind == "i" and ax is not None and ax < len(shape):
            n, v = shape[ax], s[1]
            if not -n <= v < n:
                raise op_error(
                    IndexError,
                    "getitem",
                    f"index {v} is out of bounds for axis {ax} with size {n} (tensor shape {shape})",
                )
            new_s.append(("I",))
            new_t.append(position(v + n if v < 0 else v))
            continue
        if kind == "s" and ax is not None and ax < len(shape) and None not in s[1:3]:
            step = 1 if s[3] is None else s[3]
            if step != 0:
                n = shape[ax]
                start, stop, step = slice(s[1], s[2], step).indices(n)
                length = len(range(start, stop, step))
                if 0 < length and not (step == 1 and length == n):
                    lo = start if step > 0 else start + (length - 1) * step
                    new_s.append(("S", length, step))
                    new_t.append(position(lo))
                    continue
        new_s.append(s)
    return new_s, new_t


def position(v: int):
    """The ``Literal`` of an index position: a 0-d int32 runtime value (``weak=POSITION``)."""
    lit = scalar_literal(v, INT32)
    lit.weak = POSITION
    return lit

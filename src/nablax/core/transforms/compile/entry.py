"""One stored signature of ``nx.compile``: :class:`Entry` (the program, the arrays it captured,
how to rebuild the output pytree) and :func:`fast_signature`, the key under which a call whose
arguments are all realized tensors and Python numbers finds its entry without the general path
(flattening, static arguments, dynamic sizes) of ``Compiled.__call__`` (compiled.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .... import tree as _tree
from ...build import TensorImpl
from ...tensor import Tensor
from ..sizes import evaluate

PY_NUMBERS = (int, float, bool, complex)


class Entry:
    """One traced signature: its program, captured arrays and how to rebuild the outputs."""

    __slots__ = (
        "fn",
        "captured",
        "out_def",
        "out_slots",
        "out_consts",
        "out_avals",
        "eager",
        "fast_key",
        "single",
        "sizes",
        "out_sizes",
    )

    fn: Callable[..., Any]  # the program: ``fn(*arrays, *captured)``
    captured: list[Any]  # realized arrays the traced graph read
    out_def: Any  # treedef of the output pytree
    out_slots: list[int]  # leaves that are tensors
    out_consts: list[Any]  # the other leaves (None at tensor slots)
    out_avals: list[tuple[Any, Any]]  # (shape, dtype) per tensor leaf
    eager: bool  # a graph break: this signature runs eagerly
    fast_key: tuple[Any, ...] | None
    single: bool  # the output is one tensor
    sizes: set[tuple[Any, ...]] | None
    out_sizes: list[tuple[int, Any]] | tuple[()]

    def __init__(self) -> None:
        self.eager = False
        self.fast_key = None
        self.sizes = None  # dynamic_dims: the concrete input shapes seen (one executable each)
        self.out_sizes = ()  # dynamic_dims: (slot, symbolic size) of sizes returned as values

    def wrap(self, outs, env=None):
        """The function's output pytree from the program's results (``env``: this call's size of
        each dynamic dimension, for sizes returned as Python values)."""
        if self.sizes is not None:  # symbolic output shapes: take them from the values
            avals = [(tuple(v.shape), np.dtype(v.dtype)) for v in outs]
        else:
            avals = self.out_avals
        if self.single:
            ((shape, dtype),) = avals
            t = object.__new__(Tensor)
            t._impl = TensorImpl(None, outs[0], shape, dtype)
            return t
        vals = list(self.out_consts)
        for slot, d in self.out_sizes:
            vals[slot] = evaluate(d, env)
        for slot, v, (shape, dtype) in zip(self.out_slots, outs, avals):
            t = object.__new__(Tensor)
            t._impl = TensorImpl(None, v, shape, dtype)
            vals[slot] = t
        return self.out_def.unflatten(vals)


_CONTAINERS = (list, tuple, dict)


def fast_signature(args) -> tuple[Any, list] | None:
    """``(key, arrays)`` of a call whose arguments are all realized, untransformed tensors or
    Python numbers (passed to the program as they are, weakly typed: see _build), directly or
    as the leaves of lists, tuples and dicts (the key then starts with their structure); ``None``
    for any other call, which takes the general path."""
    key: list = []
    vals = []
    for a in args:
        ta = type(a)
        if ta is not Tensor:
            if ta not in PY_NUMBERS or (ta is int and not -(2**31) <= a < 2**31):
                break
            key.append(ta)
            key.append(None)
            vals.append(a)
            continue
        i = a._impl
        v = i.value
        if v is None or i.src is not None or i.batch_shape:
            return None
        key.append(i.shape)
        key.append(i.dtype)
        vals.append(v)
    else:
        return tuple(key), vals
    if not any(type(a) in _CONTAINERS for a in args):
        return None
    leaves, treedef = _tree.flatten(args)  # the leaves hold no list, tuple or dict: no recursion
    flat = fast_signature(leaves)
    return None if flat is None else ((treedef, flat[0]), flat[1])

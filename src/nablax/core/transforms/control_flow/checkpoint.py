"""``nx.checkpoint`` (alias ``nx.remat``): recompute a function's intermediates in the backward
pass instead of storing them, as ``jax.checkpoint``.

A call of the wrapped function is ONE graph node whose body is the function's sub-graph (staged
like a control-flow body, stage.py); it lowers to ``jax.checkpoint`` of that
body, so the backward pass keeps only the node's inputs and recomputes the rest, behind XLA
optimization barriers that stop the recomputation from being merged with the forward pass.
Values and gradients are the function's own.

>>> import nablax as nx
>>> layer = nx.checkpoint(lambda x, w: nx.tanh(x @ w) @ w.T)
>>> g = nx.grad(lambda w: layer(nx.ones((2, 3)), w).sum())(nx.ones((3, 3)) * 0.1)
>>> g.shape
(3, 3)
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from .... import tree as _tree
from ...tensor import Tensor
from .primitives import checkpoint_p
from .stage import add_node, fname, stage


def checkpoint(f: Callable, *, prevent_cse: bool = True) -> Callable:
    """``f`` whose intermediates are recomputed in the backward pass instead of stored (less
    memory, one more forward computation), as ``jax.checkpoint``. Tensor and array arguments
    (pytree leaves) are the function's inputs; other leaves are static and seen as they are.

    >>> import nablax as nx
    >>> f = nx.checkpoint(lambda x: nx.sin(nx.sin(x)))
    >>> round(nx.grad(f)(nx.tensor(1.0)).item(), 6)
    0.360039
    """
    if not callable(f):
        raise TypeError(f"nx.checkpoint: expected a function, got {type(f).__name__}")

    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        leaves, treedef = _tree.flatten((args, kwargs))
        pos = [k for k, v in enumerate(leaves) if isinstance(v, (Tensor, jax.Array, np.ndarray))]
        ops = [v if isinstance(v, Tensor) else Tensor(v) for v in (leaves[k] for k in pos)]

        def make(phs):
            new = list(leaves)
            for k, ph in zip(pos, phs):
                new[k] = ph
            a, kw = _tree.unflatten(treedef, new)
            return a, kw

        s = stage(lambda a, kw: f(*a, **kw), ops, make, "checkpoint")
        refs, bshapes = s.inputs()
        outs = add_node(checkpoint_p, (s.body, bool(prevent_cse)), refs, bshapes, s.out_avals)
        return _tree.unflatten(s.out_def, outs)

    wrapped.__doc__ = f"nx.checkpoint({fname(f)}): " + (f.__doc__ or "")
    return wrapped


remat = checkpoint

"""``nx.cond`` and ``nx.switch``: one ``cond`` node whose branches are staged once per call."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from .... import tree as _tree
from ...tensor import Tensor
from .checks import fmt_aval, out_paths, scalar_index, tensor_leaves
from .primitives import cond_p, control_node
from .stage import Staged, fname, stage

# ---- cond / switch ---------------------------------------------------------------------------


def _branches(index: Tensor, fns: Sequence[Callable], labels, operands, what: str):
    ops, in_def = tensor_leaves(tuple(operands), what, "operands")
    staged: list[Staged] = [
        stage(fn, ops, lambda phs: _tree.unflatten(in_def, phs), what) for fn in fns
    ]
    first = staged[0]
    for lab, fn, s in zip(labels[1:], fns[1:], staged[1:]):
        if s.out_def != first.out_def:
            raise TypeError(
                f"nx.{what}: the branches return different structures: {labels[0]} "
                f"({fname(fns[0])}) returns {first.out_def}, {lab} ({fname(fn)}) returns "
                f"{s.out_def}. Fix: return the same pytree from every branch"
            )
        for path, a, b in zip(out_paths(first.out_def, "output"), first.out_avals, s.out_avals):
            if (tuple(a[0]), np.dtype(a[1])) != (tuple(b[0]), np.dtype(b[1])):
                raise TypeError(
                    f"nx.{what}: the branches return different types for {path}: {labels[0]} "
                    f"({fname(fns[0])}) returns {fmt_aval(a)}, {lab} ({fname(fn)}) returns {fmt_aval(b)}. "
                    f"Fix: make every branch return the same shapes and dtypes"
                )
    refs, bshapes, counts = [index._impl.ref], [index._impl.batch_shape], []
    in_avals = [(index.shape, index.dtype)]
    for s in staged:
        r, rb = s.inputs()
        refs += r
        bshapes += rb
        counts.append(len(r))
        in_avals += s.in_avals()
    base = (tuple(s.body for s in staged), tuple(counts))
    outs = control_node(cond_p, base, refs, bshapes, in_avals, first.out_avals)
    return _tree.unflatten(first.out_def, outs)


def cond(pred, true_fun: Callable, false_fun: Callable, *operands):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, as ``jax.lax.cond``.

    Both branches are traced (once per call) and must return the same structure, shapes and
    dtypes. Under ``nx.vmap`` with a per-example ``pred``, both run and the results are selected.

    >>> import nablax as nx
    >>> f = lambda x: nx.cond(x.sum() > 0, lambda v: v * 2, lambda v: -v, x)
    >>> f(nx.tensor([1.0, 2.0])).tolist(), nx.grad(lambda x: f(x).sum())(nx.ones(2)).tolist()
    ([2.0, 4.0], [2.0, 2.0])
    """
    p = scalar_index(pred, "cond", "pred", want_bool=True)
    return _branches(p, (false_fun, true_fun), ("false_fun", "true_fun"), operands, "cond")


def switch(index, branches: Sequence[Callable], *operands):
    """``branches[index](*operands)``, as ``jax.lax.switch`` (``index`` is clamped to the
    valid range).

    >>> import nablax as nx
    >>> fs = [lambda x: x + 1, lambda x: x * 10, lambda x: -x]
    >>> [nx.switch(i, fs, nx.tensor(2.0)).item() for i in (0, 1, 2, 7)]
    [3.0, 20.0, -2.0, -2.0]
    """
    branches = list(branches)
    if not branches or not all(callable(b) for b in branches):
        raise TypeError(
            "nx.switch: branches must be a non-empty sequence of functions, got "
            f"{[type(b).__name__ for b in branches]}"
        )
    idx = scalar_index(index, "switch", "index", want_bool=False)
    if len(branches) == 1:
        idx = idx * 0
    labels = tuple(f"branches[{k}]" for k in range(len(branches)))
    return _branches(idx, branches, labels, operands, "switch")

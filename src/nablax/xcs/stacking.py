"""How ``xcs.vmap`` / ``xcs.pmap`` put per-item results back together, as ``jax.vmap`` would
(``stack_results``)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..errors import XCSError
from .runtime import is_tensor_value, is_tracer

# ---- putting per-item results back together ------------------------------------------------


def _array(x: Any) -> bool:
    """An array result (NumPy scalars count: they are 0-d arrays; Python numbers do not)."""
    return isinstance(x, np.generic) or (
        is_tensor_value(x) and not isinstance(x, jax.ShapeDtypeStruct)
    )


def _stackable(column: list) -> bool:
    return all(_array(x) for x in column) and len({tuple(x.shape) for x in column}) == 1


def _stack(column: list, axis: int) -> Any:
    from ..core.tensor import Tensor

    if any(isinstance(x, Tensor) for x in column):
        import nablax as nx

        return nx.stack([nx.asarray(x) for x in column], axis=axis)
    if any(isinstance(x, jax.Array) for x in column):
        return jax.numpy.stack(column, axis=axis)
    return np.stack(column, axis=axis)


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if is_tensor_value(a) or is_tensor_value(b):
        if not (is_tensor_value(a) and is_tensor_value(b)) or is_tracer(a) or is_tracer(b):
            return False
        return tuple(a.shape) == tuple(b.shape) and bool(np.array_equal(np.asarray(a), b))
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - incomparable values are different values
        return False


def _unbatched(column: list, what: str, api: str) -> Any:
    """``out_axes=None``: every item must give the same value; it is returned once."""
    for i, v in enumerate(column[1:], 1):
        if not _same(column[0], v):
            raise XCSError(
                f"xcs.{api}: out_axes=None{what} says every item gives the same value, but item "
                f"{i} gave {_short(v)} and item 0 gave {_short(column[0])}. Fix: out_axes=0 to "
                f"collect one value per item"
            )
    return column[0]


def _short(v: Any) -> str:
    if is_tensor_value(v):
        return f"an array of shape {tuple(v.shape)}"
    return f"{v!r:.60}"


def _axes_per_leaf(out_axes: Any, tree: Any, path: str, api: str) -> list:
    """``out_axes`` (an int, None, or a tuple/list/dict prefix of the result) for every leaf."""
    if out_axes is None or isinstance(out_axes, int):
        return [out_axes] * len(jax.tree_util.tree_leaves(tree, is_leaf=is_tensor_value))
    same_seq = isinstance(out_axes, (tuple, list)) and isinstance(tree, (tuple, list))
    if same_seq and len(out_axes) == len(tree):
        return [
            a for i, (ax, t) in enumerate(zip(out_axes, tree))
            for a in _axes_per_leaf(ax, t, f"{path}[{i}]", api)
        ]  # fmt: skip
    if isinstance(out_axes, dict) and isinstance(tree, dict) and out_axes.keys() == tree.keys():
        return [
            a for k in tree for a in _axes_per_leaf(out_axes[k], tree[k], f"{path}[{k!r}]", api)
        ]
    raise XCSError(
        f"xcs.{api}: out_axes{path} = {out_axes!r} does not match the structure of the result "
        f"{_short(tree)}. Fix: an int (or None) for the whole result, or a tuple/dict with one "
        f"entry per output"
    )


def _numbers(x: Any) -> bool:
    return isinstance(x, (bool, int, float, complex)) or _array(x)


def _by_position(first: Any, columns: list) -> bool:
    """Array-free results that still come back leaf by leaf (as the seed's fallback does):
    tuples (a function's several outputs), and dicts whose values are all numbers."""
    if not columns:
        return False
    if isinstance(first, tuple):
        return True
    return isinstance(first, dict) and all(_numbers(x) for c in columns for x in c)


def stack_results(results: list, out_axes: Any, api: str) -> Any:
    """Per-item results as ``jax.vmap`` would return them.

    Results of the same structure come back leaf by leaf when they hold arrays: array leaves are
    stacked along ``out_axes`` (NumPy arrays with ``np.stack``, jax arrays with ``jnp.stack``,
    nablax Tensors with ``nx.stack``) through tuples, lists, dicts and registered pytrees, and
    other leaves in the same position become a list. Without arrays, as the seed does, tuples
    also come back position by position (a tuple of lists) and dicts of numbers key by key (a
    dict of lists); anything else (strings, lists, dicts holding strings, objects, results of
    different structures) stays a list in input order. ``out_axes=None``: every item must give
    the same result, returned once (else :class:`XCSError`).

    >>> import numpy as np
    >>> stack_results([(np.ones(2), "a"), (np.zeros(2), "b")], 0, "vmap")
    (array([[1., 1.],
           [0., 0.]]), ['a', 'b'])
    >>> stack_results([{"n": 1, "ok": True}, {"n": 2, "ok": False}], 0, "vmap")
    {'n': [1, 2], 'ok': [True, False]}
    >>> stack_results([("a", 1), ("b", 2)], 0, "vmap")
    (['a', 'b'], [1, 2])
    >>> stack_results([{"q": "a"}, {"q": "b"}], 0, "vmap")
    [{'q': 'a'}, {'q': 'b'}]
    >>> stack_results(["x", "y"], 0, "vmap"), stack_results(["same", "same"], None, "vmap")
    (['x', 'y'], 'same')
    """
    if not results:
        return []
    if out_axes is None:
        return _unbatched(results, "", api)
    flat = [jax.tree_util.tree_flatten(r, is_leaf=is_tensor_value) for r in results]
    treedef = flat[0][1]
    if any(td != treedef for _, td in flat[1:]):
        return list(results)  # items of different structure: nothing to stack leaf by leaf
    columns = [list(c) for c in zip(*(leaves for leaves, _ in flat))]
    if not any(_stackable(c) for c in columns) and not _by_position(results[0], columns):
        return list(results)
    axes = _axes_per_leaf(out_axes, results[0], "", api)
    out = []
    for j, (column, axis) in enumerate(zip(columns, axes)):
        if axis is None:
            out.append(_unbatched(column, f" (output leaf {j})", api))
        elif _stackable(column):
            out.append(_stack(column, axis))
        else:
            out.append(column)
    return jax.tree_util.tree_unflatten(treedef, out)

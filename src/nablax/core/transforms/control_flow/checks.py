"""The checks of the control-flow functions, with errors that name the function, the argument,
the shapes/dtypes and the fix: operands and carries as tensors, carries that keep their structure,
shapes and dtypes, scalar predicates and indices."""

from __future__ import annotations

import numpy as np

from .... import tree as _tree
from ...tensor import Tensor
from .stage import as_tensor, fname

# ---- checks with clear errors --------------------------------------------------------------------


def out_paths(out_def, prefix: str) -> list[str]:
    n = out_def.num_leaves
    return [p for p, _ in _tree.leaves_with_path(_tree.unflatten(out_def, list(range(n))), prefix)]


def fmt_aval(aval) -> str:
    shape, dtype = aval
    return f"{np.dtype(dtype).name}{list(shape)}"


def check_carry(what: str, f, got_def, got_avals, want_def, want_avals, prefix: str) -> None:
    if got_def != want_def:
        raise TypeError(
            f"nx.{what}: {fname(f)} must return a carry with the structure of the initial "
            f"value; it returned {got_def}, the initial value is {want_def}. Fix: return the "
            f"same pytree (same containers and keys) every iteration"
        )
    for path, g, w in zip(out_paths(want_def, prefix), got_avals, want_avals):
        if (tuple(g[0]), np.dtype(g[1])) != (tuple(w[0]), np.dtype(w[1])):
            raise TypeError(
                f"nx.{what}: {fname(f)} changes the carry {path} from {fmt_aval(w)} (its initial "
                f"value) to {fmt_aval(g)}. The shape and dtype of a carry must not change between "
                f"iterations. Fix: keep it {fmt_aval(w)} (e.g. .astype(...) or an initial value of "
                f"the right dtype/shape)"
            )


def tensor_leaves(tree, what: str, prefix: str) -> tuple[list[Tensor], object]:
    flat, treedef = _tree.flatten(tree)
    paths = [p for p, _ in _tree.leaves_with_path(tree, prefix)]
    return [as_tensor(v, what, p) for p, v in zip(paths, flat)], treedef


def scalar_index(x, what: str, arg: str, want_bool: bool) -> Tensor:
    t = as_tensor(x, what, arg)
    if t.shape != ():
        raise TypeError(
            f"nx.{what}: {arg} must be a scalar, got shape {list(t.shape)}. Fix: reduce it "
            f"(.any(), .all(), [i]) or use nx.where for element-wise choices"
        )
    kind = t.dtype.kind
    if want_bool:
        if kind == "b":
            return t
        if kind in "iuf":
            return t != 0
    elif kind in "iu":
        return t.astype(np.int32) if t.dtype != np.int32 else t
    need = "a boolean (or number)" if want_bool else "an integer"
    raise TypeError(f"nx.{what}: {arg} must be {need} scalar, got {t.dtype}")

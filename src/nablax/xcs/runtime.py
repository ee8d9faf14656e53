"""What counts as a tensor value at run time: ``is_tensor_value`` and ``has_tensor_values``.

The transforms route by the function's classification *and* by the actual arguments: a tensor
function called with strings is not vmapped by ``jax.vmap``.

>>> import numpy as np
>>> from nablax import xcs
>>> xcs.is_tensor_value(np.ones(3)), xcs.is_tensor_value("text"), xcs.is_tensor_value(3.0)
(True, False, False)
>>> xcs.has_tensor_values((["a", np.zeros(2)],), {})
True
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

_CONTAINERS = (list, tuple, dict)


def is_tensor_value(v: Any) -> bool:
    """True for nablax Tensors, jax Arrays and tracers, ``jax.ShapeDtypeStruct`` and NumPy arrays
    (not for Python or NumPy scalars)."""
    if isinstance(v, (np.ndarray, jax.Array, jax.ShapeDtypeStruct)):
        return True
    from ..core.tensor import Tensor

    return isinstance(v, Tensor)


def has_tensor_values(args: Any, kwargs: Any = None, _depth: int = 0) -> bool:
    """True when any value inside ``args`` / ``kwargs`` (lists, tuples, dicts and registered
    pytrees, recursively) is a tensor value."""
    for tree in (args, kwargs):
        if tree is None:
            continue
        if is_tensor_value(tree):
            return True
        if isinstance(tree, (str, bytes)):
            continue
        leaves = jax.tree_util.tree_leaves(tree, is_leaf=is_tensor_value)
        if any(is_tensor_value(x) for x in leaves):
            return True
    return False


def tensor_kind(args: Any, kwargs: Any = None) -> str | None:
    """``"nablax"`` when any argument is a nablax Tensor, ``"jax"`` for jax Arrays / tracers,
    ``"numpy"`` for NumPy arrays only, None without tensor values."""
    from ..core.tensor import Tensor

    leaves = jax.tree_util.tree_leaves((args, kwargs), is_leaf=is_tensor_value)
    kinds = set()
    for x in leaves:
        if isinstance(x, Tensor):
            return "nablax"
        if isinstance(x, (jax.Array, jax.ShapeDtypeStruct)):
            kinds.add("jax")
        elif isinstance(x, np.ndarray):
            kinds.add("numpy")
    return "jax" if "jax" in kinds else ("numpy" if kinds else None)

"""What ``xcs`` sees in values at run time: tensor values inside arguments, traced values, and how
per-item results are put back together.

The transforms route by the function's classification *and* by the actual arguments: a tensor
function called with strings is not vmapped by ``jax.vmap``. Tensor values are found inside lists,
tuples, dicts, sets, dataclasses, registered pytrees and plain objects' attributes (a depth bound
and a cycle guard keep the walk finite).

>>> import numpy as np
>>> from nablax import xcs
>>> xcs.is_tensor_value(np.ones(3)), xcs.is_tensor_value("text"), xcs.is_tensor_value(3.0)
(True, False, False)
>>> xcs.has_tensor_values((["a", np.zeros(2)],), {})
True
"""

from __future__ import annotations

import collections
import dataclasses
import types
from collections.abc import Callable, Iterable
from typing import Any

import jax
import numpy as np

MAX_DEPTH = 32  # deeper than this, a payload is not searched (and not an array container)

_ATOMS = (str, bytes, bytearray, int, float, complex, type(None), range, np.generic)
_SEQUENCES = (list, tuple, set, frozenset, collections.deque)
_OPAQUE = (
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
)
_flatten_one_level = getattr(jax.tree_util, "flatten_one_level", None)


def is_tensor_value(v: Any) -> bool:
    """True for nablax Tensors, jax Arrays and tracers, ``jax.ShapeDtypeStruct`` and NumPy arrays
    (not for Python or NumPy scalars).

    >>> import jax.numpy as jnp
    >>> from nablax import xcs
    >>> xcs.is_tensor_value(jnp.zeros(2)), xcs.is_tensor_value([1, 2]), xcs.is_tensor_value(None)
    (True, False, False)
    """
    if isinstance(v, (np.ndarray, jax.Array, jax.ShapeDtypeStruct)):
        return True
    from ..core.tensor import Tensor

    return isinstance(v, Tensor)


def is_tracer(v: Any) -> bool:
    """True for a value a JAX transform (``jax.jit``, ``jax.grad``, ``jax.vmap`` ...) is tracing."""
    return isinstance(v, jax.core.Tracer)


def _children(v: Any) -> Iterable[Any] | None:
    """The values ``v`` holds, or None for a leaf (never runs user code but pytree flatteners)."""
    if isinstance(v, dict):
        return list(v.values())
    if isinstance(v, _SEQUENCES):
        return list(v)
    if isinstance(v, _OPAQUE):
        return None
    if dataclasses.is_dataclass(v):
        return [getattr(v, f.name, None) for f in dataclasses.fields(v)]
    if _flatten_one_level is not None:
        try:
            return list(_flatten_one_level(v)[0])  # a registered pytree
        except Exception:  # noqa: BLE001 - not registered (or its flattener refused it)
            pass
    try:
        return list(vars(v).values())  # a plain object's payload
    except TypeError:
        return None


def tensor_leaves(tree: Any, stop: Callable[[Any], bool] | None = None) -> list:
    """The tensor values inside ``tree`` (see the module docstring); stops early when
    ``stop(value)`` is true for one."""
    found: list = []
    stack = [(tree, 0)]
    seen: set[int] = set()
    while stack:
        v, depth = stack.pop()
        if is_tensor_value(v):
            found.append(v)
            if stop is not None and stop(v):
                break
            continue
        if isinstance(v, _ATOMS) or depth >= MAX_DEPTH or id(v) in seen:
            continue
        seen.add(id(v))
        kids = _children(v)
        if kids:
            stack.extend((k, depth + 1) for k in reversed(kids))
    return found


def has_tensor_values(args: Any, kwargs: Any = None) -> bool:
    """True when any value inside ``args`` / ``kwargs`` is a tensor value: inside lists, tuples,
    dicts, sets, dataclasses, registered pytrees and plain objects' attributes (cycles are
    visited once; payloads nested deeper than 32 levels are not searched).

    >>> from dataclasses import dataclass
    >>> import jax.numpy as jnp
    >>> from nablax import xcs
    >>> @dataclass
    ... class Batch:
    ...     rows: list
    >>> xcs.has_tensor_values((Batch([{"x": jnp.ones(2)}]),)), xcs.has_tensor_values(("a", 1))
    (True, False)
    """
    return bool(tensor_leaves((args, kwargs), stop=lambda v: True))


def tensor_kind(args: Any, kwargs: Any = None) -> str | None:
    """``"nablax"`` when any argument holds a nablax Tensor, ``"jax"`` for jax Arrays / tracers,
    ``"numpy"`` for NumPy arrays only, None without tensor values."""
    from ..core.tensor import Tensor

    leaves = tensor_leaves((args, kwargs), stop=lambda v: isinstance(v, Tensor))
    kinds = set()
    for x in leaves:
        if isinstance(x, Tensor):
            return "nablax"
        kinds.add("numpy" if isinstance(x, np.ndarray) else "jax")
    return "jax" if "jax" in kinds else ("numpy" if kinds else None)


def nablax_tracing() -> bool:
    """True inside a nablax transform (``nx.grad``/``vjp``/``jvp``/``vmap``) in this thread."""
    from ..core.context import CTX

    return bool(CTX.traces) or CTX.vmap_depth > 0


def thread_bound(args: Any, kwargs: Any = None) -> bool:
    """True when the arguments hold values that only this thread may use: JAX tracers, or nablax
    Tensors while a nablax transform of this thread is recording them."""
    from ..core.tensor import Tensor

    recording = nablax_tracing()

    def bound(v: Any) -> bool:
        return is_tracer(v) or (recording and isinstance(v, Tensor))

    return any(bound(v) for v in tensor_leaves((args, kwargs), stop=bound))

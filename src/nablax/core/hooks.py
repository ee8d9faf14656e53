"""Every late binding of nablax, in one place: a module below another one that needs, at run
time, a function or module of a layer above it. Binding it here, when the upper module is
imported, keeps the import graph acyclic (``tests/test_import_graph.py`` counts ``TYPE_CHECKING``
imports too): the lower module names the slot and holds a default, never the upper module.

The late bindings, who sets them, and why:

1. ``tensor._elementwise``, ``_index``, ``_linalg``, ``_masks``, ``_nn``, ``_reduce``,
   ``_shape``, ``_sharding`` and ``_autodiff``: the modules ``Tensor``'s methods delegate to
   (``x.exp()`` calls ``core/ops/elementwise.py``'s ``exp``). Set by
   :func:`bind_tensor_methods`, called once by ``nablax/core/ops/__init__.py``. Why: ``Tensor``
   declares its whole API in core/tensor.py (a type checker sees every method), while the op
   families, sharding and autodiff are built on ``Tensor`` and import it.
2. ``tensor._sharding_of``: what ``Tensor.sharding`` reports for a tensor without an explicit
   spec (the layout propagated through the ops' sharding rules). Set by
   :func:`set_sharding_of`, called by core/sharding.py at its import. Why: propagation walks the
   graph with the primitives' sharding rules, a layer above ``Tensor``.
3. ``realize._tracing_check``: the check that raises a clear ``GraphBreakError`` when a traced
   placeholder would be realized under ``nx.compile``/``nx.shard_map``. Set by
   :func:`set_tracing_check`, called by core/transforms/staging.py at its import. Why: the
   realizer is below the transforms that stage programs.

Each binding happens once, at import of ``nablax`` (``nablax/__init__.py`` imports every upper
module); nothing rebinds them later.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

from . import realize as _realize
from . import tensor as _tensor

# the names bind_tensor_methods accepts (the module slots of core/tensor.py)
TENSOR_METHOD_MODULES = (
    "elementwise",
    "index",
    "linalg",
    "masks",
    "nn",
    "reduce",
    "shape",
    "sharding",
    "autodiff",
)


def bind_tensor_methods(**modules: ModuleType) -> None:
    """Give ``Tensor``'s methods the modules they delegate to (late binding 1): ``elementwise``,
    ``index``, ``linalg``, ``masks``, ``nn``, ``reduce``, ``shape`` (core/ops), ``sharding``
    (core/sharding.py) and ``autodiff`` (core/transforms/vjp.py)."""
    for name, module in modules.items():
        if name not in TENSOR_METHOD_MODULES:
            raise ValueError(
                f"nablax.core.hooks.bind_tensor_methods: Tensor methods do not delegate to a "
                f"module named {name!r}; the names are {', '.join(TENSOR_METHOD_MODULES)}"
            )
        setattr(_tensor, f"_{name}", module)


def set_sharding_of(fn: Callable[[Any], Any]) -> None:
    """``Tensor.sharding`` of a tensor without an explicit spec (late binding 2)."""
    _tensor._sharding_of = fn


def set_tracing_check(fn: Callable[..., None]) -> None:
    """The realizer's check for traced placeholders under a staging trace (late binding 3)."""
    _realize._tracing_check = fn

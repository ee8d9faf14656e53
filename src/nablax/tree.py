"""Pytree helpers with key paths, built on ``jax.tree_util``.

nablax ``Tensor`` objects are leaves. Containers are tuples, lists, dicts, ``None``, namedtuples and
dataclasses registered with :func:`register_dataclass` (usable as a class decorator), and any
class registered with :func:`register_pytree_node`. Key paths are
rendered the way error messages show them: ``args[1]['w']``.

>>> import nablax as nx
>>> @nx.tree.register_dataclass
... class Params:
...     w: nx.Tensor
...     b: nx.Tensor
>>> p = Params(nx.ones(2), nx.zeros(1))
>>> [path for path, _ in nx.tree.leaves_with_path(p)]
['.w', '.b']
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

__all__ = [
    "flatten",
    "unflatten",
    "leaves",
    "leaves_with_path",
    "map",
    "structure",
    "register_dataclass",
    "register_pytree_node",
    "keystr",
]


# ``Tensor`` is not a registered pytree node, so JAX's C++ flattening already treats it as a leaf
# (no ``is_leaf`` callback: one Python call per node saved on every transform call).


def flatten(tree: Any) -> tuple[list, Any]:
    """Leaves (tensors and other non-container values) and the structure to rebuild the tree."""
    return jax.tree_util.tree_flatten(tree)


def unflatten(treedef: Any, leaves: list) -> Any:
    return jax.tree_util.tree_unflatten(treedef, leaves)


def leaves(tree: Any) -> list:
    return jax.tree_util.tree_leaves(tree)


def structure(tree: Any) -> Any:
    return jax.tree_util.tree_structure(tree)


def map(fn: Callable, tree: Any, *rest: Any) -> Any:  # noqa: A001 - mirrors jax.tree.map
    """Apply ``fn`` to corresponding leaves of one or more trees of the same structure."""
    return jax.tree_util.tree_map(fn, tree, *rest)


def keystr(path: tuple) -> str:
    """``(SequenceKey(1), DictKey('w'))`` -> ``"[1]['w']"``."""
    return jax.tree_util.keystr(path)


def leaves_with_path(tree: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``[(path_string, leaf), ...]`` with paths like ``[1]['w']`` (``prefix`` prepended)."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(prefix + keystr(p), leaf) for p, leaf in flat]


def register_dataclass(cls: type) -> type:
    """Register a dataclass as a pytree node (every field is a child); usable as a decorator.

    Plain classes are turned into dataclasses first.
    """
    if not dataclasses.is_dataclass(cls):
        cls = dataclasses.dataclass(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    jax.tree_util.register_dataclass(cls, data_fields=names, meta_fields=[])
    return cls


def register_pytree_node(
    nodetype: type,
    flatten_func: Callable[[Any], tuple[Any, Any]],
    unflatten_func: Callable[[Any, Any], Any],
    flatten_with_keys_func: Callable[[Any], tuple[Any, Any]] | None = None,
) -> None:
    """Make ``nodetype`` a pytree container, with the signature of
    ``jax.tree_util.register_pytree_node`` (the registration is JAX's own, so nablax transforms and
    JAX see the same tree).

    ``flatten_func(obj) -> (children, aux_data)``: the children are flattened further; the
    ``aux_data`` is static (hashable, compared when trees are matched).
    ``unflatten_func(aux_data, children) -> obj`` rebuilds it. ``flatten_with_keys_func(obj) ->
    (((key, child), ...), aux_data)`` optionally names the children in key paths.

    >>> import nablax as nx
    >>> class Pair:
    ...     def __init__(self, a, b):
    ...         self.a, self.b = a, b
    >>> nx.tree.register_pytree_node(
    ...     Pair, lambda p: ((p.a, p.b), None), lambda aux, ch: Pair(*ch)
    ... )
    >>> g = nx.grad(lambda p: (p.a * p.b).sum())(Pair(nx.ones(2), nx.full((2,), 3.0)))
    >>> g.a.tolist(), g.b.tolist()
    ([3.0, 3.0], [1.0, 1.0])
    """
    jax.tree_util.register_pytree_node(
        nodetype, flatten_func, unflatten_func, flatten_with_keys_func
    )

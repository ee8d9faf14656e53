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

import builtins
import dataclasses
import operator
import weakref
from collections.abc import Callable
from typing import Any

import jax

from . import _caches

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
    if type(tree) in _MODULES:
        e = _FLATTENED.get(id(tree))
        if e is not None and e[0]() is tree and _unchanged(e[3]):
            return list(e[1]), e[2]
        leaves, treedef = jax.tree_util.tree_flatten(tree)
        _remember(tree, leaves, treedef)
        return leaves, treedef
    return jax.tree_util.tree_flatten(tree)


def unflatten(treedef: Any, leaves: list) -> Any:
    e = _BUILDERS.get(id(treedef))
    if e is not None and e[0] is treedef:
        if e[1] is not None and len(leaves) == e[2]:
            tree = e[1](leaves)
            _remember(tree, leaves, treedef, e[3])
            return tree
        return jax.tree_util.tree_unflatten(treedef, leaves)
    tree = jax.tree_util.tree_unflatten(treedef, leaves)
    if type(tree) in _MODULES:
        program = _remember(tree, leaves, treedef)
        build = _make_builder(tree) if program is not None else None
        _BUILDERS.put(id(treedef), (treedef, build, len(leaves), program))
    return tree


# ---- flatten memo of module trees ------------------------------------------------------------
# Every transform and optimizer call flattens the model, its gradients or the optimizer's moment
# trees: an eager training step walks a 6-layer GPT's 47 modules about 8 times, one Python
# callback per module each time. A tree whose root is an nn.Module and which holds only modules,
# lists, tuples, None and Tensor leaves is walked once (or not at all when ``unflatten`` built
# it): later ``flatten`` calls on the same object reuse its leaves and structure. Sound by
# construction, from what the tree holds, not from guesses about what code did to it:
# - modules refuse assignment (FrozenModuleError) and tuples are immutable, so the children of
#   both never change; a leaf is kept by identity, so a Tensor changed in place is still the
#   same leaf, and Tensor is no pytree node, so a leaf cannot turn into a container;
# - each list in the tree is snapshotted (the identity of every element) when the entry is made
#   and compared at every reuse, outer lists first: a list changed in place (append, item
#   assignment, sort) fails the comparison and the tree is walked again;
# - an entry lives as long as its root (a weak reference); a module under construction, a
#   dict, a namedtuple, another registered class or another leaf type anywhere in the tree
#   leaves that tree unmemoized (walked every time, as before).
# module class -> its child field names and its static field names
_MODULES: dict[type, tuple[tuple[str, ...], tuple[str, ...]]] = {}
_FLATTENED: dict[int, tuple] = {}  # id(root) -> (weakref to root, leaves, treedef, list snapshots)
_FLATTENED_MAX = 4096  # entries; past it the memo starts over (live roots are few in practice)
# treedef -> the paths to its lists, or None: not memoized
_PROGRAMS = _caches.Cache("tree.flatten_programs", 256)
_tensor_type: Any = None
_map = builtins.map  # this module's map is the tree map


def _register_module(
    cls: type, children: tuple[str, ...], static: tuple[str, ...], tensor_type: type
) -> None:
    """Called by ``nn.Module`` for each module class: its children are the ``children`` fields
    of ``__dict__``, which its instances never reassign, and its unflatten sets them, then the
    ``static`` fields, on an instance made by ``object.__new__``; ``tensor_type`` is ``Tensor``
    (this base module does not import the core)."""
    global _tensor_type
    _tensor_type = tensor_type
    _MODULES[cls] = (children, static)


def _unchanged(snapshots: tuple) -> bool:
    for lst, items in snapshots:
        if len(lst) != len(items) or not all(_map(operator.is_, lst, items)):
            return False
    return True


def _lists(node: Any, path: tuple, out: list) -> bool:
    """Append the paths (field names and indices from the root) of the lists under ``node``,
    outer lists first; False if the tree holds anything the memo does not take."""
    t = type(node)
    if t is _tensor_type or node is None:
        return True
    fields = _MODULES.get(t)
    if fields is not None:
        names = fields[0]
        d = node.__dict__
        if "_nx_initializing" in d:
            return False
        return all(_lists(d[n], (*path, n), out) for n in names)
    if t is list or t is tuple:
        if t is list:
            out.append(path)
        return all(_lists(c, (*path, i), out) for i, c in enumerate(node))
    return False


def _remember(tree: Any, leaves: list, treedef: Any, program: Any = False) -> Any:
    """Memoize ``tree``'s flatten; returns the paths to its lists (``program``, looked up by
    ``treedef`` unless given), or None when the tree is not memoizable."""
    if leaves and set(_map(type, leaves)) != {_tensor_type}:
        return None
    if program is False:
        try:
            program = _PROGRAMS.get(treedef, False)
        except TypeError:  # static fields that do not hash
            return None
        if program is False:
            paths: list = []
            program = tuple(paths) if _lists(tree, (), paths) else None
            _PROGRAMS.put(treedef, program)
    if program is None or "_nx_initializing" in tree.__dict__:
        return program
    snapshots = []
    for path in program:
        node = tree
        for step in path:
            node = node.__dict__[step] if type(step) is str else node[step]
        snapshots.append((node, tuple(node)))
    key = id(tree)

    def drop(ref: Any, key: int = key) -> None:
        e = _FLATTENED.get(key)
        if e is not None and e[0] is ref:
            _FLATTENED.pop(key, None)

    if len(_FLATTENED) >= _FLATTENED_MAX:
        _FLATTENED.clear()
    _FLATTENED[key] = (weakref.ref(tree, drop), tuple(leaves), treedef, tuple(snapshots))
    return program


# ---- unflatten programs of module trees ------------------------------------------------------
# Every transform and optimizer call also unflattens trees of modules (the traced model, the
# gradients, each optimizer state and update tree, the new model): JAX calls one Python unflatten
# per module, about 0.9 us each with its C++ walk (a 6-layer GPT has 47 modules; an eager step
# unflattens 7 such trees). A tree of modules, lists, tuples, None and Tensor leaves is rebuilt
# instead by one function generated for its structure: the same objects JAX's walk makes (each
# module by ``object.__new__``, its children then its static fields set in ``__dict__`` as its
# registered unflatten does, the static values the treedef's own), in straight-line code. Keyed
# by the treedef object (a memoized flatten hands the same one back, so a training loop reuses
# it), held by the entry so its id is not reused; a tree of any other shape keeps JAX's walk.
# id(treedef) -> (treedef, builder or None, leaf count, list paths for _remember)
_BUILDERS = _caches.Cache("tree.unflatten_programs", 256)


def _make_builder(example: Any) -> Callable[[list], Any] | None:
    """``build(leaves)`` rebuilding trees shaped like ``example`` (made by JAX's unflatten, every
    leaf a Tensor), or None when it holds anything else."""
    lines: list[str] = []
    scope: dict[str, Any] = {"new": object.__new__}
    count = [0, 0]  # leaves, modules

    def emit(node: Any) -> str | None:
        t = type(node)
        if t is _tensor_type:
            count[0] += 1
            return f"L[{count[0] - 1}]"
        if node is None:
            return "None"
        if t is list or t is tuple:
            items = [emit(c) for c in node]
            if None in items:
                return None
            body = ", ".join(items)
            return f"[{body}]" if t is list else f"({body}{',' if items else ''})"
        fields = _MODULES.get(t)
        if fields is None:
            return None
        children, static = fields
        d = node.__dict__
        exprs = [emit(d[n]) for n in children]
        if None in exprs:
            return None
        k = count[1]
        count[1] += 1
        scope[f"C{k}"] = t
        lines.append(f"    m{k} = new(C{k})")
        lines.append(f"    d = m{k}.__dict__")
        lines.extend(f"    d[{n!r}] = {e}" for n, e in zip(children, exprs))
        for j, n in enumerate(static):
            scope[f"S{k}_{j}"] = d[n]
            lines.append(f"    d[{n!r}] = S{k}_{j}")
        return f"m{k}"

    root = emit(example)
    if root is None:
        return None
    code = "def build(L):\n" + "\n".join(lines) + f"\n    return {root}\n"
    exec(code, scope)  # noqa: S102 - class names and field names (quoted with repr) only
    return scope["build"]


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

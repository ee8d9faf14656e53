"""The functions and classes of a file or module, and the table ``nablax classify PATH_OR_MODULE``
prints (``xcs.classify_target`` in :mod:`.analysis` classifies each of them).

Importing the target runs its top-level code (as any import does); nothing else of it is executed.

>>> names = dict(definitions("nablax.xcs.markers"))
>>> names["marker_of"].__name__
'marker_of'
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

from ... import _caches
from . import source
from .records import Classification

# files imported by path: {absolute path: (modification time, module)}; the modules stay in
# sys.modules too (under a private name), so an evicted or cleared entry is imported again
_loaded = _caches.Cache("xcs.target_modules", 64)


def definitions(path_or_module: str | os.PathLike | types.ModuleType) -> list[tuple[str, Any]]:
    """``(name, object)`` for each function, class and method defined in a ``.py`` file or an
    importable module, in source order (methods as ``Class.method``)."""
    return _definitions(_load(path_or_module))


def format_table(rows: list[tuple[str, Classification]]) -> str:
    """A plain-text table of ``classify_target`` rows: name, kind, reasons (one per line).

    >>> from nablax.xcs import Classification
    >>> print(format_table([("score", Classification("tensor", ("uses jnp.dot (JAX)",), True))]))
    name   kind    reasons
    -----  ------  ------------------
    score  tensor  uses jnp.dot (JAX)
    <BLANKLINE>
    1 callable: 1 tensor
    """
    header = ("name", "kind", "reasons")
    lines = [(n, c.kind, list(c.reasons) or [""]) for n, c in rows]
    w_name = max([len(header[0])] + [len(n) for n, _, _ in lines])
    w_kind = max([len(header[1])] + [len(k) for _, k, _ in lines])
    w_why = max([len(header[2])] + [len(r) for _, _, rs in lines for r in rs])
    out = [f"{header[0]:<{w_name}}  {header[1]:<{w_kind}}  {header[2]}".rstrip()]
    out.append(f"{'-' * w_name}  {'-' * w_kind}  {'-' * w_why}")
    for name, kind, reasons in lines:
        out.append(f"{name:<{w_name}}  {kind:<{w_kind}}  {reasons[0]}".rstrip())
        out += [f"{'':<{w_name}}  {'':<{w_kind}}  {r}" for r in reasons[1:]]
    counts: dict[str, int] = {}
    for _, c in rows:
        counts[c.kind] = counts.get(c.kind, 0) + 1
    noun = "callable" if len(rows) == 1 else "callables"
    tally = ", ".join(f"{v} {k}" for k, v in counts.items())
    out += ["", f"{len(rows)} {noun}" + (f": {tally}" if tally else "")]
    return "\n".join(out)


def _load(target: Any) -> types.ModuleType:
    if isinstance(target, types.ModuleType):
        return target
    if not isinstance(target, (str, os.PathLike)):
        raise TypeError(
            f"xcs.classify_target: argument `path_or_module` must be a path, a module name or a "
            f"module, got {type(target).__name__}. Fix: pass 'pkg/file.py' or 'pkg.module'"
        )
    text = os.fspath(target)
    if text.endswith(".py") or os.sep in text or os.path.exists(text):
        return _load_file(text)
    try:
        return importlib.import_module(text)
    except ModuleNotFoundError as exc:
        raise ValueError(
            f"xcs.classify_target: argument `path_or_module` {text!r} is neither a .py file nor "
            f"an importable module ({exc}). Fix: pass the path of an existing .py file, or a "
            "module name importable from sys.path (run from the project root or install it)"
        ) from exc


def _load_file(path: str) -> types.ModuleType:
    """Import a ``.py`` file under a private module name (cached by path and modification time)."""
    full = os.path.abspath(path)
    if os.path.isdir(full):
        raise ValueError(
            f"xcs.classify_target: argument `path_or_module` {path!r} is a directory; only "
            "Python source files (.py) or importable module names are accepted. Fix: pass one "
            ".py file of it, or the package's module name (e.g. 'pkg.module')"
        )
    if not os.path.isfile(full):
        raise ValueError(
            f"xcs.classify_target: argument `path_or_module` {path!r}: no such file. "
            "Fix: pass the path of an existing .py file (relative to the current directory)"
        )
    if os.path.splitext(full)[1] not in importlib.machinery.SOURCE_SUFFIXES:
        raise ValueError(
            f"xcs.classify_target: argument `path_or_module` {path!r} is not a Python source "
            f"file; only Python source files ({', '.join(importlib.machinery.SOURCE_SUFFIXES)}) "
            "or importable module names are accepted. Fix: pass a .py file or a module name"
        )
    packaged = _as_package_module(full)
    if packaged is not None:  # a file of an importable package: relative imports must work
        return packaged
    mtime = os.path.getmtime(full)
    hit = _loaded.get(full)
    if hit is not None and hit[0] == mtime:
        return hit[1]
    stem = os.path.splitext(os.path.basename(full))[0]
    name = f"_xcs_target_{stem}_{hashlib.sha1(full.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:  # pragma: no cover - every source suffix has one
        raise ValueError(
            f"xcs.classify_target: argument `path_or_module` {path!r}: Python cannot import it. "
            "Fix: pass a .py file or a module name"
        )
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling look the module up while it runs
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    _loaded.put(full, (mtime, module))
    return module


def _as_package_module(full: str) -> types.ModuleType | None:
    """The module of ``full`` imported by its dotted name, when the file sits in a package
    (``__init__.py`` folders) whose root is on ``sys.path``; else None."""
    folder, parts = os.path.dirname(full), [os.path.splitext(os.path.basename(full))[0]]
    while os.path.isfile(os.path.join(folder, "__init__.py")):
        parts.insert(0, os.path.basename(folder))
        folder = os.path.dirname(folder)
    if len(parts) == 1:
        return None
    roots = {os.path.realpath(p or os.getcwd()) for p in sys.path if isinstance(p, str)}
    if os.path.realpath(folder) not in roots:
        return None
    try:
        module = importlib.import_module(".".join(p for p in parts if p != "__init__"))
    except ImportError:
        return None
    file = getattr(module, "__file__", None)
    same = file is not None and os.path.realpath(file) == os.path.realpath(full)
    return module if same else None


def _definitions(module: types.ModuleType) -> list[tuple[str, Any]]:
    """Functions, classes, methods and module-level lambdas/partials defined in ``module``."""
    info = None
    filename = getattr(module, "__file__", None)
    if filename:
        info = source.file_info(filename, vars(module))
    if info is None:  # no source: whatever the module defines itself, in dict order
        return [(n, v) for n, v in vars(module).items() if _defined_here(v, module)]
    out = []
    for node in _top_level(info.tree):
        obj = vars(module).get(node.name if hasattr(node, "name") else node.targets[0].id)
        if obj is None or not callable(obj):
            continue
        if isinstance(node, ast.Assign) and not _defined_here(obj, module):
            continue
        out.append((node.targets[0].id if isinstance(node, ast.Assign) else node.name, obj))
        if isinstance(node, ast.ClassDef) and isinstance(obj, type):
            out += _methods(node, obj)
    return out


def _top_level(tree: ast.Module) -> list[ast.AST]:
    """Definitions at module level, also inside top-level ``if`` / ``try`` blocks."""
    out, stack = [], list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.append(node)
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            if isinstance(node.targets[0], ast.Name) and isinstance(
                node.value, (ast.Lambda, ast.Call)
            ):
                out.append(node)
        elif isinstance(node, (ast.If, ast.Try)):
            blocks = [node.body, node.orelse, getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            stack = [n for b in blocks for n in b] + stack
    return out


def _methods(node: ast.ClassDef, cls: type) -> list[tuple[str, Any]]:
    out = []
    for item in node.body:
        if not isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if item.name.startswith("__") and item.name != "__call__":
            continue
        attr = vars(cls).get(item.name)
        fn = getattr(attr, "__func__", attr)  # staticmethod / classmethod
        if isinstance(fn, types.FunctionType):
            out.append((f"{cls.__name__}.{item.name}", fn))
    return out


def _defined_here(obj: Any, module: types.ModuleType) -> bool:
    if isinstance(obj, functools.partial):
        obj = obj.func
    return getattr(obj, "__module__", None) == module.__name__ and callable(obj)

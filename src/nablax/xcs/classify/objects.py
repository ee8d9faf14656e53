"""Read objects statically: their public dotted name, whether they are library or user code,
their attributes without running code (no property, ``__getattr__`` or user function is called).

Internal to :mod:`nablax.xcs.classify`.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import sysconfig
import types
from typing import Any

from ... import _caches
from . import rules
from .records import MISSING, Rule

_LIB_DIRS = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
)


def describe(obj: Any) -> str | None:
    """Dotted public name of a module, class, function or (for other objects) their class."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    if isinstance(obj, types.MethodType):
        return describe(obj.__func__)
    if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
        mod = getattr(obj, "__module__", None)
        if mod is None and isinstance(obj, types.FunctionType):
            return None  # made by exec without a module name
        if mod is None and isinstance(getattr(obj, "__self__", None), types.ModuleType):
            mod = obj.__self__.__name__
        if mod is None:  # a builtin bound method: "abc".upper
            owner = getattr(obj, "__self__", None)
            return f"{describe(type(owner))}.{obj.__name__}" if owner is not None else None
        return rules.canonical(f"{mod}.{getattr(obj, '__qualname__', obj.__name__)}")
    objclass = getattr(type(obj), "__objclass__", None) and getattr(obj, "__objclass__", None)
    if isinstance(objclass, type):  # str.upper, list.append, numpy.ndarray.sum
        return f"{describe(objclass)}.{obj.__name__}"
    return describe(type(obj))


def is_library(obj: Any) -> bool:
    """Standard library or installed package (not followed into), judged by the code's file."""
    code = getattr(obj, "__code__", None)
    if code is None:
        return True
    fname = code.co_filename
    return fname.startswith(_LIB_DIRS) or fname.startswith("<frozen")


def rule_for(obj: Any, path: str | None) -> Rule | None:
    """The library rule for an object; a user module that shares a stdlib name gets none."""
    if path is None:
        return None
    # the result of a library function call (`np.loadtxt(...)`) belongs to its package
    rule = rules.lookup(path.split(".")[0] if "()" in path else path)
    if rule is not None and isinstance(obj, types.FunctionType) and not is_library(obj):
        if not _defined_in_its_module(obj) and not _names_a_library(obj, rule):
            return None  # a doctest, exec or REPL function that borrowed a module's name
        if rule is rules.NEUTRAL and path.split(".")[0] in rules.STDLIB:
            return None  # a user module that shares a standard-library name
    return rule


_module_files = _caches.Cache("xcs.module_files", 1024)


def _module_file(module: str) -> str | None:
    def find():
        file = getattr(sys.modules.get(module), "__file__", None)
        return os.path.realpath(file) if file else None

    return _module_files.get_or_make(module, find)


def code_rule(func: types.FunctionType) -> tuple[str, Rule | None]:
    """The module a function's code was written in (its globals, not a ``wraps``-copied
    ``__module__``) and that module's rule, for wrappers made by libraries (``nx.grad(f)``)."""
    where = func.__globals__.get("__name__")
    if not isinstance(where, str) or _module_file(where) != os.path.realpath(
        func.__code__.co_filename
    ):
        return str(where), None
    rule = rules.lookup(where)
    if rule is rules.NEUTRAL and where.split(".")[0] in rules.STDLIB and not is_library(func):
        return where, None
    return where, rule


def _names_a_library(func: types.FunctionType, rule: Rule) -> bool:
    """A function whose ``__module__`` names a tensor or I/O library (``numpy.linalg``): the name
    decides (markers, then ``__module__``, then the source). Only nablax's own doctests, whose
    functions get the module's name from their globals, do not count."""
    if rule.kind not in ("tensor", "orchestration"):
        return False
    mod = func.__module__
    return not (mod.split(".")[0] == "nablax" and func.__globals__.get("__name__") == mod)


def _defined_in_its_module(func: types.FunctionType) -> bool:
    file = _module_file(func.__module__) if isinstance(func.__module__, str) else None
    return file is not None and file == os.path.realpath(func.__code__.co_filename)


def user_callable(obj: Any) -> bool:
    """A function or callable object written by the user (worth following), not a class."""
    if obj is MISSING or isinstance(obj, type) or rule_for(obj, describe(obj)) is not None:
        return False
    if isinstance(obj, (types.FunctionType, types.MethodType)):
        return not is_library(getattr(obj, "__func__", obj))
    if isinstance(obj, functools.partial):
        return True
    return callable(obj) and is_user_class(type(obj))


def is_user_class(obj: Any) -> bool:
    """A class defined outside the standard library and installed packages."""
    if not isinstance(obj, type) or obj.__module__ == "builtins":
        return False
    if rule_for(obj, describe(obj)) is not None:
        return False
    fname = getattr(sys.modules.get(obj.__module__), "__file__", None)
    return not (fname and fname.startswith(_LIB_DIRS))


def is_user_instance(obj: Any) -> bool:
    if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.MethodType)):
        return False
    return is_user_class(type(obj))


def static_attr(obj: Any, name: str) -> Any:
    """``obj.name`` without running code: module dict, instance dict, class attributes."""
    if isinstance(obj, types.ModuleType):
        return obj.__dict__.get(name, MISSING)
    try:
        value = inspect.getattr_static(obj, name)
    except (AttributeError, TypeError):
        return MISSING
    if isinstance(value, (staticmethod, classmethod)):
        return value.__func__
    if isinstance(value, (property, functools.cached_property, types.MemberDescriptorType)):
        return MISSING
    if isinstance(value, types.FunctionType) and not isinstance(obj, type):
        if value is not _instance_dict(obj).get(name):  # a method from the class: bind it
            return types.MethodType(value, obj)
    return value


def _instance_dict(obj: Any) -> dict:
    try:
        return object.__getattribute__(obj, "__dict__")  # never a user __getattr__
    except (AttributeError, TypeError):
        return {}


def has_source_file(fn: Any) -> bool:
    """A Python function written in a file (not generated by exec, as dataclass methods are)."""
    return isinstance(fn, types.FunctionType) and not fn.__code__.co_filename.startswith("<")


def has_static_attr(obj: Any, name: str) -> bool:
    try:
        inspect.getattr_static(obj, name)
        return True
    except AttributeError:
        return False


def owner_class(func: types.FunctionType, self_obj: Any) -> type | None:
    """The class a method belongs to (from the bound instance, or the qualname in its module)."""
    if self_obj is not MISSING:
        return self_obj if isinstance(self_obj, type) else type(self_obj)
    parts = func.__qualname__.split(".")
    if len(parts) < 2 or "<locals>" in parts:
        return None
    owner: Any = func.__globals__.get(parts[0], MISSING)
    for p in parts[1:-1]:
        owner = static_attr(owner, p) if owner is not MISSING else MISSING
    if not isinstance(owner, type) or isinstance(owner.__dict__.get(parts[-1]), staticmethod):
        return None
    return owner


def annotation_names(func: Any) -> list[str]:
    """Dotted names in ``__annotations__`` (objects or strings), read without evaluating."""
    out = []
    for ann in getattr(func, "__annotations__", {}).values():
        name = ann if isinstance(ann, str) else describe(ann)
        if name:
            out.append(name)
    return out

"""What an ``xcs.jit`` call receives: its arguments as they were when the program made it.

A call started later than plain Python would start it must not see what the program did to its
arguments in between (``create(messages=m); m.append(...)``; ``write(path, lines);
lines.clear()``). So when a call is submitted, :func:`snapshot` copies the data it is given:

- values that cannot change are passed as they are: ``str``, numbers, ``bytes``, ``None``,
  ranges, enums, dates, paths, functions, classes, modules, JAX arrays, nablax Tensors;
- handles whose state lives outside the program (clients and sessions of I/O and LLM
  libraries, files, sockets, locks, queues) are passed as they are too: the call needs *that*
  object;
- plain containers (``list``, ``dict``, ``set``, ``tuple``, ``bytearray``, ``deque``,
  ``OrderedDict``, ``defaultdict``, ``Counter``, named tuples), NumPy arrays and dataclass
  instances are copied, recursively, keeping shared references and cycles as they are;
- anything else cannot be copied safely: :class:`Uncopyable` is raised, and the engine makes the
  program wait for that call to end before it goes on (so nothing can change the argument first).

Results are protected the same way (:func:`snapshot` of a mutable result as the call returned it,
given to each later call that takes it), and a function whose own source changes an argument
(``history.append(...)``, ``d[k] = v``, ``x.attr = v``, ``buf += ...``), or a method that
changes its object (``self.history.append(...)``), runs while the program waits, with the real
objects: its change is the program's to see (:func:`mutates_arguments`). A bound method's object
is otherwise shared, not copied, and so is state a call reads from globals: only arguments are
snapshotted.
"""

from __future__ import annotations

import ast
import collections
import dataclasses
import datetime
import decimal
import enum
import fractions
import inspect
import io
import pathlib
import queue
import re
import socket
import textwrap
import threading
import types
import uuid
from typing import Any

from .. import _caches
from .futures import Lazy, Pending, resolve

MAX_DEPTH = 64

_IMMUTABLE = (
    str, bytes, int, float, complex, bool, type(None), range, type(Ellipsis), type(NotImplemented),
    decimal.Decimal, fractions.Fraction, datetime.date, datetime.time, datetime.timedelta,
    datetime.timezone, uuid.UUID, pathlib.PurePath, enum.Enum, re.Pattern, type, types.ModuleType,
    types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.BuiltinMethodType,
    types.CodeType, slice, memoryview,
)  # fmt: skip
_HANDLES = (
    io.IOBase, socket.socket, queue.Queue, queue.SimpleQueue, threading.Event,
    threading.Condition, threading.Semaphore, threading.Thread, type(threading.Lock()),
    type(threading.RLock()),
)  # fmt: skip
_CONTAINERS = (list, dict, set, bytearray, collections.deque, collections.OrderedDict)


class Uncopyable(Exception):
    """An argument that can be neither passed as it is nor copied safely."""

    def __init__(self, value: Any, path: str) -> None:
        self.path = path
        super().__init__(f"{path} is a {type(value).__module__}.{type(value).__qualname__}")


def snapshot(x: Any, path: str = "argument") -> Any:
    """``x`` with its mutable data copied (see the module docstring); :class:`Uncopyable` when a
    part of it can be neither shared nor copied. Lazy values are kept: a finished ``Pending`` is
    replaced by a snapshot of its value as it is now (the program may have changed it), a running
    one is resolved later from its result as the call returned it."""
    return _copy(x, {}, path, 0)


def _copy(x: Any, memo: dict, path: str, depth: int) -> Any:
    t = type(x)
    if t in (str, int, float, bool, type(None), bytes):
        return x
    if isinstance(x, Lazy):
        if isinstance(x, Pending) and x.done() and x.future.exception() is None:
            return _copy(x.future.result(), memo, path, depth)
        return x
    found = memo.get(id(x))
    if found is not None:
        return found[1]
    if depth > MAX_DEPTH:
        raise Uncopyable(x, path)
    if t in _CONTAINERS:
        return _copy_container(x, memo, path, depth)
    if isinstance(x, _IMMUTABLE) or _shared_type(t):
        return x
    if t is tuple or t is frozenset or (isinstance(x, tuple) and hasattr(x, "_fields")):
        vals = [_copy(v, memo, f"{path}[{i}]", depth + 1) for i, v in enumerate(x)]
        if all(a is b for a, b in zip(vals, x)):
            return x
        return t(*vals) if t is not tuple and t is not frozenset else t(vals)
    if t in _CONTAINERS or t in (collections.defaultdict, collections.Counter):
        return _copy_container(x, memo, path, depth)
    np_copy = _numpy_copy(x)
    if np_copy is not None:
        memo[id(x)] = (x, np_copy)
        return np_copy
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return _copy_dataclass(x, memo, path, depth)
    raise Uncopyable(x, path)


def _copy_container(x: Any, memo: dict, path: str, depth: int) -> Any:
    t = type(x)
    if t is bytearray:
        out: Any = bytearray(x)
        memo[id(x)] = (x, out)
        return out
    if t is collections.defaultdict:
        out = collections.defaultdict(x.default_factory)
    elif t is collections.deque:
        out = collections.deque(maxlen=x.maxlen)
    else:
        out = t()
    memo[id(x)] = (x, out)  # keep x alive: ids stay unique while the walk runs
    if isinstance(x, dict):
        for k, v in x.items():
            out[k] = _copy(v, memo, f"{path}[{k!r}]", depth + 1)
    elif t is set:
        for v in x:
            out.add(_copy(v, memo, f"{path}{{...}}", depth + 1))
    else:
        for i, v in enumerate(x):
            out.append(_copy(v, memo, f"{path}[{i}]", depth + 1))
    return out


def _copy_dataclass(x: Any, memo: dict, path: str, depth: int) -> Any:
    fields = dataclasses.fields(x)
    vals = {f.name: _copy(getattr(x, f.name), memo, f"{path}.{f.name}", depth + 1) for f in fields}
    params = getattr(type(x), "__dataclass_params__", None)
    if getattr(params, "frozen", False) and all(vals[f.name] is getattr(x, f.name) for f in fields):
        return x
    try:
        out = object.__new__(type(x))
        if hasattr(x, "__dict__"):
            out.__dict__.update(x.__dict__)
        for name, v in vals.items():
            object.__setattr__(out, name, v)
    except Exception:  # noqa: BLE001 - slots without fields, a custom __new__: not copyable here
        raise Uncopyable(x, path) from None
    memo[id(x)] = (x, out)
    return out


def _numpy_copy(x: Any) -> Any:
    np = _module("numpy")
    if np is not None and isinstance(x, np.ndarray):
        return x.copy() if x.dtype != object else None
    if np is not None and isinstance(x, np.generic):
        return x
    return None


_shared_types = _caches.Cache("xcs.shared_types", 1024)


def _shared_type(cls: type) -> bool:
    """Instances are shared, not copied: immutable arrays (JAX, nablax) and handles whose state
    lives outside the program (files, sockets, locks, clients of I/O and LLM libraries)."""
    return _shared_types.get_or_make(cls, lambda: _is_shared(cls))


def _is_shared(cls: type) -> bool:
    jax = _module("jax")
    if jax is not None and issubclass(cls, jax.Array):
        return True
    from ..core.tensor import Tensor
    from .classify import objects as _objects

    if issubclass(cls, (Tensor, *_HANDLES)):
        return True
    rule = _objects.rule_for(cls, _objects.describe(cls))
    return rule is not None and rule.kind == "orchestration"


def _module(name: str) -> Any:
    import sys

    return sys.modules.get(name)


# ---- what calls receive, and what they return -------------------------------------------------


def keep_result(node: Any, result: Any) -> None:
    """Keep ``result`` as the call returned it for the calls that take it (the program may change
    the object it reads); a result that cannot be copied is shared, and read with care."""
    if type(result) in (str, int, float, bool, bytes, type(None)):
        return
    try:
        copy = snapshot(result, "result")
    except Uncopyable:
        node._shared = True
        return
    if copy is not result:
        node._pristine = (copy,)


def given(x: Any, depth: int = 0) -> Any:
    """What a call receives: ``x`` with each pending value replaced by its result as the call
    that made it returned it (a fresh copy for each call), never a future. Read without
    ``Lazy.value`` (the program's read, which may wait for this very call)."""
    if isinstance(x, Pending):
        kept = x.node._pristine
        if kept is not None:
            try:
                return snapshot(kept[0], "result")
            except Uncopyable:  # pragma: no cover - it was copied once
                return kept[0]
        return x._eval()
    if isinstance(x, Lazy):
        return x._eval()
    if depth > 64:
        return x
    t = type(x)
    if t is list or t is tuple or t is set or t is frozenset:
        vals = [given(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else t(vals)
    if t is dict:
        vals = {k: given(v, depth + 1) for k, v in x.items()}
        return x if all(vals[k] is v for k, v in x.items()) else vals
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        vals = [given(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else t(*vals)
    return x


def resolve_in_place(x: Any, depth: int = 0) -> Any:
    """``x`` with the pending values inside its lists and dicts replaced by their values in place
    (the objects stay the program's own: a function that changes them changes the program's)."""
    if isinstance(x, Lazy):
        return resolve(x)
    if depth > 64:
        return x
    if type(x) is list:
        for i, v in enumerate(x):
            r = resolve_in_place(v, depth + 1)
            if r is not v:
                x[i] = r
    elif type(x) is dict:
        for k, v in list(x.items()):
            r = resolve_in_place(v, depth + 1)
            if r is not v:
                x[k] = r
    elif type(x) is tuple:
        vals = [resolve_in_place(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else tuple(vals)
    return x


# ---- functions that change their arguments ------------------------------------------------------

_MUTATORS = frozenset(
    """append extend insert remove pop popitem clear update setdefault sort reverse add discard
    difference_update intersection_update symmetric_difference_update appendleft extendleft
    rotate write writelines fill resize put put_nowait""".split()
)
_mutates_cache = _caches.Cache("xcs.mutates_arguments", 1024)


def mutates_arguments(fn: Any) -> str | None:
    """Why ``fn``'s own source changes one of its arguments in place (``"history.append"``), or
    None when it does not, or its source cannot be read (library code is trusted not to)."""
    target = getattr(fn, "__func__", fn)
    code = getattr(target, "__code__", None)
    if not isinstance(target, types.FunctionType) or code is None:
        return None
    return _mutates_cache.get_or_make(code, lambda: _scan(target))


def _scan(fn: types.FunctionType) -> str | None:
    from .classify.objects import is_library

    if is_library(fn):
        return None
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        tree = ast.parse(src)
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    params = {p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]}
    params |= {p.arg for p in (a.vararg, a.kwarg) if p is not None}
    # every parameter counts, a bound method's receiver (self, cls) included: its state is the
    # program's too
    rebound: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, (ast.Assign, ast.AnnAssign)):
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                if isinstance(t, ast.Name):
                    rebound.add(t.id)  # `x = list(x)`: a local copy (kept simple: any rebinding)
    live = params - rebound
    for n in ast.walk(node):
        why = _mutation(n, live)
        if why is not None:
            return why
    return None


def _root(e: ast.AST) -> str | None:
    while isinstance(e, (ast.Attribute, ast.Subscript)):
        e = e.value
    return e.id if isinstance(e, ast.Name) else None


def _mutation(n: ast.AST, params: set[str]) -> str | None:
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
        if n.func.attr in _MUTATORS and _root(n.func.value) in params:
            return f"{ast.unparse(n.func)}(...)"
    if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = n.targets if isinstance(n, (ast.Assign, ast.Delete)) else [n.target]
        for t in targets:
            if isinstance(t, (ast.Attribute, ast.Subscript)) and _root(t) in params:
                return f"{ast.unparse(t)} = ..."
            if isinstance(n, ast.AugAssign) and isinstance(t, ast.Name) and t.id in params:
                return f"{t.id} (augmented assignment)"
    return None

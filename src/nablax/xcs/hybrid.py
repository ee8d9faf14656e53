"""Real values for orchestration calls inside ``jax.grad`` of a hybrid function (``xcs.grad``):
``HostCalls`` is the runtime a hybrid's rewritten source calls (see ``transforms.grad``)."""

from __future__ import annotations

import contextlib
import inspect
import re
import sys
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax

from .. import _caches
from ..errors import XCSError
from ._context import XCS
from .runtime import is_tensor_value, is_tracer, tensor_leaves

# ---- real values for orchestration calls inside jax.grad of a hybrid -------------------------

_READS = (str, repr, ascii, format, print, float, int, bool, complex)  # builtins reading a value
_TRACER_METHODS = ("item", "tolist")
_TRACER_TEXT = re.compile(r"\w*Tracer\(|Traced<")
_LIBRARIES = frozenset(
    {"nablax", "jax", "jaxlib", "numpy", "scipy", "torch", "flax", "optax", "equinox", "pytest"}
)


class _TracedText(str):
    """An f-string built (by :class:`HostCalls`) from a tracer whose value is unknown."""

    what = "a traced value"


def concrete(x: Any) -> Any:
    """The value behind a JAX tracer when it is known while tracing (eager ``jax.grad``), else
    None. The result is a constant: nothing computed from it has a gradient."""
    get = getattr(x, "to_concrete_value", None)
    try:
        return get() if get is not None else None
    except Exception:  # noqa: BLE001 - any tracer that cannot tell its value
        return None


def _describe(x: Any) -> str:
    aval = getattr(x, "aval", None)
    return f"a traced {aval.str_short() if aval is not None else type(x).__name__} value"


def host_values(tree: Any, callee: str, path: str = "args", strict: bool = True) -> Any:
    """``tree`` with every JAX tracer replaced by its concrete value (see :func:`concrete`).

    ``strict`` (an orchestration call): a tracer without a known value, or a string that holds a
    tracer's text (a traced value formatted where ``xcs.grad`` could not see it), raises
    :class:`XCSError`; otherwise such values are passed as they are."""
    owner = XCS.grad_owner

    def one(key: Any, x: Any) -> Any:
        where = f"{path}{jax.tree_util.keystr(key)}"
        if is_tracer(x):
            value = concrete(x)
            if value is not None or not strict:
                return x if value is None else value
            raise XCSError(
                f"xcs.grad: {owner} calls orchestration code {callee} with {where}, "
                f"{_describe(x)} whose value an enclosing JAX transform (jax.jit, jax.vmap, ...) "
                f"does not know while tracing; orchestration calls receive real values. Fix: "
                f"apply xcs.grad outside that transform (xcs.vmap runs hybrid items one by one), "
                f"or compute this input before it and pass it in"
            )
        if strict and isinstance(x, _TracedText):
            raise XCSError(
                f"xcs.grad: {owner} passes {callee} {where}, a string formatted from {x.what}, "
                f"which an enclosing JAX transform (jax.jit, jax.vmap, ...) does not know while "
                f"tracing; orchestration calls receive real values. Fix: apply xcs.grad "
                f"outside that transform, or build the string before it and pass it in"
            )
        if strict and isinstance(x, str) and (m := _TRACER_TEXT.search(x)):
            raise XCSError(
                f"xcs.grad: {owner} passes {callee} {where}, a string holding a JAX tracer's "
                f"text ({x[max(0, m.start() - 10) : m.start() + 40]!r}): a traced value was "
                f"formatted in code xcs.grad does not rewrite (a library, or a function without "
                f"source). Fix: pass the array itself to {callee}, or format it in {owner}"
            )
        return x

    return jax.tree_util.tree_map_with_path(one, tree, is_leaf=is_tracer)


def _user_function(fn: Any) -> bool:
    """A Python function of the user's own code (not a library's or the standard library's)."""
    if not isinstance(fn, types.FunctionType):
        return False
    root = (getattr(fn, "__module__", None) or "").split(".")[0]
    if root in _LIBRARIES or root in sys.stdlib_module_names:
        return False
    file = fn.__code__.co_filename
    return "site-packages" not in file and "dist-packages" not in file


def _callee(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__


class HostCalls:
    """What a hybrid function rewritten for ``xcs.grad`` calls through (as ``__xcs__``) while
    ``jax.grad`` traces it.

    - orchestration calls get real values: each traced argument is replaced by its concrete
      value (:func:`host_values`), so the call sees what plain Python would pass it, runs once,
      and its result is a constant (zero gradient);
    - the builtins that read a value (``str``, ``repr``, ``format``, ``print``, ``float``,
      ``int``, ``bool``), ``.item()``/``.tolist()`` and f-strings see the concrete value too;
    - the user's own hybrid or plain-Python helpers are rewritten the same way;
    - everything else (tensor code) receives the traced values and is differentiated."""

    def __init__(self, rewrite: Callable[[Any, Any], Any], classify: Callable[[Any], Any]):
        self._rewrite, self._classify = rewrite, classify

    def _kind(self, fn: Any) -> str:
        if is_tensor_value(getattr(fn, "__self__", None)):
            return "tensor"  # a method of an array: tensor code
        try:
            return self._classify(fn).kind
        except Exception:  # noqa: BLE001 - an odd callable: leave it alone
            return "tensor"

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if any(fn is r for r in _READS):
            return fn(*host_values(args, _callee(fn), strict=False), **kw)
        owner = getattr(fn, "__self__", None)
        if is_tracer(owner) and getattr(fn, "__name__", "") in _TRACER_METHODS:
            value = concrete(owner)
            if value is not None:
                return getattr(value, fn.__name__)(*args, **kw)
        kind = self._kind(fn)
        if kind == "orchestration":
            name = _callee(fn)
            return fn(*host_values(args, name), **host_values(kw, name, "kwargs"))
        if kind in ("hybrid", "pure"):
            return self.body(fn)(*args, **kw)
        return fn(*args, **kw)

    call_now = call

    def settle(self) -> None:
        return None

    def fstring(self, *parts: Any) -> str:
        out, unknown = [], None
        for p in parts:
            if isinstance(p, str):
                out.append(p)
                continue
            value, conversion, spec = p
            value = host_values(value, "an f-string", strict=False)
            leaves = tensor_leaves(value, stop=is_tracer)
            unknown = next((_describe(v) for v in leaves if is_tracer(v)), unknown)
            if conversion in (115, 114, 97):  # !s !r !a
                value = {115: str, 114: repr, 97: ascii}[conversion](value)
            out.append(format(value, spec))
        text = "".join(out)
        if unknown is None:
            return text
        marked = _TracedText(text)
        marked.what = unknown
        return marked

    @staticmethod
    def is_(a: Any, b: Any) -> bool:
        return a is b

    @staticmethod
    def is_not(a: Any, b: Any) -> bool:
        return a is not b

    def body(self, fn: Any) -> Any:
        """``fn`` rewritten to call through this runtime; ``fn`` itself when it is not the
        user's own Python code or its source cannot be trusted (then nothing is intercepted)."""
        call = None if isinstance(fn, (types.FunctionType, types.MethodType)) else type(fn)
        if call is not None:  # a callable object: rewrite its class's __call__, bound to it
            call = inspect.getattr_static(call, "__call__", None)
            if not _user_function(call):
                return fn
            new = self._rewritten(call)
            return fn if new is None else types.MethodType(new, fn)
        func = fn.__func__ if isinstance(fn, types.MethodType) else fn
        new = self._rewritten(func) if _user_function(func) else None
        if new is None:
            return fn
        return types.MethodType(new, fn.__self__) if isinstance(fn, types.MethodType) else new

    def _rewritten(self, func: types.FunctionType) -> Any:
        key = (id(self), id(func))
        hit = _BODIES.get(key)
        if hit is not None and hit[0]() is func:  # the same function, still alive
            return hit[1]
        try:
            new = self._rewrite(func, self)
        except Exception:  # noqa: BLE001 - no trustworthy source: it runs as it is
            new = None
        _BODIES.put(key, (weakref.ref(func), new))  # the function itself is not kept alive
        return new


# functions rewritten for xcs.grad: {(id(runtime), id(function)): (weakref to it, new or None)}
_BODIES = _caches.Cache("xcs.grad_bodies", 1024)


def grad_owner(name: str) -> contextlib.AbstractContextManager[None]:
    """Name the function ``xcs.grad`` is differentiating, for :func:`host_values` messages
    (``XCS.grad_owner``, per thread and task)."""
    return XCS.owning_grad(name)

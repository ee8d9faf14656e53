"""Lazy values of ``xcs.jit``: ``Pending`` (the result of an orchestration call still running),
``LazyStr`` (a string built from pending parts with ``+`` or an f-string) and ``Deferred`` (a pure
call on pending values: ``a + b`` of two pending results, ``" ".join(parts)``).

A ``Pending`` behaves like its value: any use that needs the value (an attribute, an operator,
``bool``, ``len``, iteration, ``str``, ...) waits for it. Only what merely *carries* the value
stays lazy: storing it (in lists, dicts, variables), building strings from it
(``"refine: " + a``, ``f"refine: {a}"``) and adding two pending values. An orchestration call that
receives lazy values (anywhere in its arguments) is scheduled when they are ready and gets the
real values.

Lazy values made during an invocation are registered with its engine: one that was never needed
is still computed when the invocation ends, and its error (``"a" + 1``) is raised in program
order, exactly as plain Python would have raised it at the ``+``.
"""

from __future__ import annotations

import concurrent.futures as cf
import operator
from typing import Any

from . import scheduler
from ._context import XCS


def _register(lazy: Lazy) -> None:
    """Register a lazy value with the engine of the ``xcs.jit`` invocation running here
    (``XCS.engine``), so that its error is raised in program order."""
    eng = XCS.engine
    if eng is not None:
        eng.note_lazy(lazy)


_WAIT_DUNDERS = (
    "__bool__", "__len__", "__iter__", "__contains__", "__getitem__", "__setitem__",
    "__delitem__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__hash__",
    "__int__", "__float__", "__complex__", "__index__", "__neg__", "__pos__", "__abs__",
    "__invert__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__matmul__", "__rmatmul__", "__and__", "__rand__", "__or__", "__ror__",
    "__xor__", "__rxor__", "__lshift__", "__rlshift__", "__rshift__", "__rrshift__",
    "__call__", "__enter__", "__exit__", "__reversed__", "__round__", "__array__",
)  # fmt: skip


class Lazy:
    """Base of the lazy values: ``value()`` waits for and returns the real value (raising its
    error, which then counts as seen by the program); ``error()`` waits and returns the error
    without marking it seen (the engine's program-order checks use it)."""

    __slots__ = ()

    def value(self) -> Any:
        try:
            return self._eval()
        except BaseException:
            self._mark_observed()
            raise

    def error(self) -> BaseException | None:
        try:
            self._eval()
        except BaseException as e:  # noqa: BLE001 - reported, not raised
            return e
        return None

    def _eval(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def _mark_observed(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def done(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def __add__(self, other: Any) -> Any:
        if isinstance(other, (str, LazyStr)) or (isinstance(other, Pending) and _is_text(self)):
            return LazyStr((self, other))
        if isinstance(other, Lazy) and not (self.done() and other.done()):
            return Deferred(operator.add, (self, other), {})  # a + b of two pending values
        return self.value() + resolve(other)

    def __radd__(self, other: Any) -> Any:
        if isinstance(other, str):
            return LazyStr((other, self))
        return resolve(other) + self.value()

    def __str__(self) -> str:
        return str(self.value())

    def __repr__(self) -> str:
        return repr(self.value())

    def __format__(self, spec: str) -> str:
        return format(self.value(), spec)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return getattr(self.value(), name)


def _waiting(name: str):
    def method(self, *args):
        return getattr(self.value(), name)(*[resolve(a) for a in args])

    method.__name__ = name
    return method


for _name in _WAIT_DUNDERS:
    setattr(Lazy, _name, _waiting(_name))


def _is_text(x: Any) -> bool:
    return isinstance(x, LazyStr)


class Pending(Lazy):
    """The result of an orchestration call submitted by ``xcs.jit`` (see the module docstring)."""

    __slots__ = ("future", "node", "engine")

    def __init__(self, future: cf.Future, node: Any, engine: Any = None) -> None:
        object.__setattr__(self, "future", future)
        object.__setattr__(self, "node", node)
        object.__setattr__(self, "engine", engine)

    def _eval(self) -> Any:
        return scheduler.result(self.future)

    def value(self) -> Any:
        if self.engine is not None and not self.future.done():
            self.engine.wait_for(self)  # raises an earlier call's failure as soon as it happens
        out = super().value()
        if getattr(self.node, "_shared", False):
            # a result that could not be copied: the calls that take it get it before the
            # program, which may change it, has it
            for f in list(self.node._consumers):
                scheduler.wait(f)
        return out

    def _mark_observed(self) -> None:
        self.node.observed = True  # the program saw this failure (it may catch it)
        if self.engine is not None and getattr(self.node, "_seen_at", 0) is None:
            self.node._seen_at = len(self.engine.nodes)

    def done(self) -> bool:
        return self.future.done()


class _Memo(Lazy):
    """A lazy value computed once from other values (its error is kept too). The program's read
    (``value``) waits for its pending inputs in program order, so an earlier call's failure is
    raised as soon as it happens."""

    def value(self) -> Any:
        if self._state == 0:
            for p in sorted(pending_in(self._inputs(), []), key=lambda p: p.node.id):
                if p.engine is not None and not p.future.done():
                    p.engine.wait_for(p)
        return super().value()

    def _inputs(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    __slots__ = ("_state", "_result", "observed")

    def __init__(self) -> None:
        object.__setattr__(self, "_state", 0)  # 0: not computed, 1: value, 2: error
        object.__setattr__(self, "_result", None)
        object.__setattr__(self, "observed", False)
        _register(self)

    def _eval(self) -> Any:
        if self._state == 0:
            try:
                v = self._compute()
            except BaseException as e:  # noqa: BLE001 - kept, raised to every reader
                object.__setattr__(self, "_result", e)
                object.__setattr__(self, "_state", 2)
            else:
                object.__setattr__(self, "_result", v)
                object.__setattr__(self, "_state", 1)
        if self._state == 2:
            raise self._result
        return self._result

    def _mark_observed(self) -> None:
        object.__setattr__(self, "observed", True)

    def _compute(self) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError


def _eval_part(p: Any) -> Any:
    return p._eval() if isinstance(p, Lazy) else p


class LazyStr(_Memo):
    """A string made of literal parts and pending values, joined when it is needed."""

    __slots__ = ("parts",)

    def __init__(self, parts: tuple) -> None:
        flat: list = []
        for p in parts:
            if isinstance(p, LazyStr):
                flat.extend(p.parts)
            else:
                flat.append(p)
        object.__setattr__(self, "parts", tuple(flat))
        super().__init__()

    def _compute(self) -> str:
        out = []
        for p in self.parts:
            v = _eval_part(p)
            if not isinstance(v, str):
                raise TypeError(
                    f'can only concatenate str (not "{type(v).__name__}") to str (a value an '
                    f"orchestration call returned, joined lazily by xcs.jit)"
                )
            out.append(v)
        return "".join(out)

    def done(self) -> bool:
        return all(p.done() for p in self.parts if isinstance(p, Lazy))

    def _inputs(self) -> Any:
        return self

    def pending(self) -> list:
        return [p for p in self.parts if isinstance(p, Pending)]


class Formatted(_Memo):
    """``format(pending, spec)`` (with ``!r`` / ``!s`` / ``!a`` conversion), done when needed: an
    f-string part."""

    __slots__ = ("inner", "conversion", "spec")

    def __init__(self, inner: Lazy, conversion: int, spec: str) -> None:
        object.__setattr__(self, "inner", inner)
        object.__setattr__(self, "conversion", conversion)
        object.__setattr__(self, "spec", spec)
        super().__init__()

    def _compute(self) -> str:
        return _convert(self.inner._eval(), self.conversion, self.spec)

    def done(self) -> bool:
        return self.inner.done()

    def _inputs(self) -> Any:
        return self


class Deferred(_Memo):
    """A pure call (``str.join``, ``str.format``, ``a + b``) on pending values, made when its
    value is needed (at the latest when the invocation ends, so its error is never lost); an
    orchestration call that receives it waits for the same inputs."""

    __slots__ = ("fn", "args", "kwargs")

    def __init__(self, fn: Any, args: tuple, kwargs: dict) -> None:
        object.__setattr__(self, "fn", fn)
        object.__setattr__(self, "args", args)
        object.__setattr__(self, "kwargs", kwargs)
        super().__init__()

    def _compute(self) -> Any:
        return self.fn(*_eval_tree(self.args), **_eval_tree(self.kwargs))

    def done(self) -> bool:
        return self._state != 0 or all(p.done() for p in pending_in((self.args, self.kwargs), []))

    def _inputs(self) -> Any:
        return self


def _eval_tree(x: Any) -> Any:
    """``resolve`` without marking failures as seen; a call's result as the call returned it (the
    program may have changed the object since: ``c = a + b; a.append(x)``)."""
    if isinstance(x, Pending):
        value = x._eval()
        return x.engine.returned(x, value) if x.engine is not None else value
    if isinstance(x, Lazy):
        return x._eval()
    if type(x) in (list, tuple):
        return type(x)(_eval_tree(v) for v in x)
    if type(x) is dict:
        return {k: _eval_tree(v) for k, v in x.items()}
    return x


def _convert(v: Any, conversion: int, spec: str) -> str:
    if conversion == ord("r"):
        v = repr(v)
    elif conversion == ord("s"):
        v = str(v)
    elif conversion == ord("a"):
        v = ascii(v)
    return format(v, spec)


def fstring(*parts: Any) -> Any:
    """What an f-string becomes inside ``xcs.jit``: a plain ``str`` when no part is pending, else a
    ``LazyStr``. Each part is a ``str`` or a ``(value, conversion, spec)`` triple."""
    out: list = []
    lazy = False
    for p in parts:
        if isinstance(p, str):
            out.append(p)
            continue
        v, conv, spec = p
        if isinstance(v, Lazy) and not v.done():
            out.append(Formatted(v, conv, resolve(spec)))
            lazy = True
            continue
        out.append(_convert(resolve(v), conv, resolve(spec)))
    return LazyStr(tuple(out)) if lazy else "".join(out)


def resolve(x: Any, depth: int = 0) -> Any:
    """``x`` with every lazy value inside it (lists, tuples, dicts, sets; recursively) replaced by
    its real value, waiting as needed. Containers without lazy values are returned as they are."""
    if isinstance(x, Lazy):
        return resolve(x.value(), depth + 1) if depth < 64 else x.value()
    if depth > 64:  # deeper (or cyclic) data: as it is, as pending_in walks it
        return x
    t = type(x)
    if t is list or t is tuple:
        vals = [resolve(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else t(vals)
    if t is dict:
        vals = {k: resolve(v, depth + 1) for k, v in x.items()}
        return x if all(vals[k] is v for k, v in x.items()) else vals
    if t is set or t is frozenset:
        return t(resolve(v, depth + 1) for v in x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        vals = [resolve(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else t(*vals)
    return x


def pending_in(x: Any, out: list, depth: int = 0) -> list:
    """Collect the ``Pending`` values inside ``x`` (as ``resolve`` walks it) into ``out``."""
    if isinstance(x, Pending):
        out.append(x)
    elif isinstance(x, LazyStr):
        for p in x.parts:
            pending_in(p, out, depth + 1)
    elif isinstance(x, Formatted):
        pending_in(x.inner, out, depth + 1)
    elif isinstance(x, Deferred):
        pending_in((x.args, x.kwargs), out, depth + 1)
    elif depth < 64:
        t = type(x)
        if t is list or t is tuple or t is set or t is frozenset:
            for v in x:
                pending_in(v, out, depth + 1)
        elif t is dict:
            for v in x.values():
                pending_in(v, out, depth + 1)
        elif isinstance(x, tuple):
            for v in x:
                pending_in(v, out, depth + 1)
    return out

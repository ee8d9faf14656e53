"""Resolve the names a function uses to the objects they denote.

Internal to :mod:`nablax.xcs.classify`. Objects are read statically (module dicts, closure cells,
``inspect.getattr_static``): no property, ``__getattr__`` or user function is ever run.

A :class:`Resolver` follows a name chain (``self.client.chat.completions.create(...)``) from its
root (a local import, ``self``, a local, a closure cell, a global, a builtin) attribute by
attribute, and says what it reaches (a :class:`Value`): a live object and/or a dotted name, the
last library rule on the way, and how the chain reached that library. A parameter annotated with
a library class (``conn: sqlite3.Connection``, ``x: jax.Array``) is known as an instance of it;
handles returned by library factories (``sqlite3.connect(...)``, ``boto3.client(...)``) keep their
library. Turning what is reached into evidence is :mod:`.function`'s work.
"""

from __future__ import annotations

import builtins
import sys
import types
from dataclasses import dataclass
from typing import Any

from . import rules, source
from .objects import (
    describe,
    has_source_file,
    has_static_attr,
    is_library,
    is_user_class,
    is_user_instance,
    owner_class,
    rule_for,
    static_attr,
    user_callable,
)
from .records import MISSING, Context, Rule
from .source import CALL, EXPR, ITEM, Facts, Ref

# library functions that return a connection / client / file handle, whose methods are I/O too
_HANDLES = frozenset("connect cursor client resource open create_engine create_connection".split())


@dataclass
class Value:
    """What a name chain denotes so far: a live object and/or a dotted name for the rules."""

    obj: Any = MISSING
    path: str | None = None
    cls: type | None = None  # known only as "an instance of cls" (constructed, or `self`)
    followed: bool = False  # a helper was followed on the way (its own analysis decides)
    hit: tuple[Rule, str, int] | None = None  # last library rule on the chain, its index
    root: str | None = None  # "client: openai.OpenAI": the object the chain reaches a library by
    made: bool = False  # an instance made by calling a library class (`client = OpenAI()`)
    ann: str | None = None  # a parameter known by its annotation (`x: jax.Array`)


class Unbound:
    """A method reached through its class with no instance (``self.helper`` in a class)."""

    def __init__(self, func: types.FunctionType, cls: type):
        self.func, self.cls = func, cls


class Resolver:
    """Name resolution inside one Python function, with ``self`` bound if known."""

    def __init__(self, func: types.FunctionType, ctx: Context, self_obj: Any = MISSING, cls=None):
        self.func = func
        self.ctx = ctx
        self.code = func.__code__
        self.globals = func.__globals__
        self.self_obj = self_obj
        self.cls = cls or owner_class(func, self_obj)
        self.facts: Facts = source.facts_for(self.code, self.globals) or Facts(has_source=False)
        self.file = source.file_info(self.code.co_filename, self.globals)
        self._resolving: set[str] = set()

    # -- names ---------------------------------------------------------------------------------

    def _self_name(self) -> str | None:
        if self.cls is None or not self.facts.params:
            return None
        return self.facts.params[0]

    def root(self, name: str) -> Value:
        """Resolve a bare name: local import, self, local variable, closure, global, builtin."""
        f = self.facts
        if name in f.imports:
            return from_path(f.imports[name])
        if name == self._self_name():
            if self.self_obj is not MISSING:
                return Value(self.self_obj, describe(self.self_obj))
            return Value(path=describe(self.cls), cls=self.cls)
        if name in f.assigns and name not in self._resolving:
            self._resolving.add(name)
            try:
                for chain in f.assigns[name]:
                    val = self.walk(chain)
                    if val.obj is not MISSING or val.path or val.cls:
                        return val
            finally:
                self._resolving.discard(name)
        if name in f.param_annotations and name not in self._resolving:
            return self._annotated(name)
        if name in f.locals or name in f.params:
            return Value()
        return self._outer(name)

    def _annotated(self, name: str) -> Value:
        """A parameter annotated with a library class (``conn: sqlite3.Connection``)."""
        chain = self.facts.param_annotations[name]
        self._resolving.add(name)
        try:
            val = self.walk(chain)
        finally:
            self._resolving.discard(name)
        if val.path is None and chain[0] in sys.modules:  # "jax.Array" as a string
            val = from_path(".".join(chain))
        rule = rule_for(val.obj, val.path)
        if rule is None or rule.kind not in ("tensor", "orchestration"):
            return Value()
        return Value(path=val.path, made=True, ann=".".join(chain))

    def _outer(self, name: str) -> Value:
        """A closure variable, a module global (or its guarded import), or a builtin."""
        if name in self.code.co_freevars and self.func.__closure__:
            cell = self.func.__closure__[self.code.co_freevars.index(name)]
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (assigned later)
                return Value()
            return Value(value, describe(value)) if value is not None else Value()
        value = self.globals.get(name, MISSING)
        imports = self.file.imports if self.file is not None else {}
        if name in imports and (value is MISSING or value is None):
            return from_path(imports[name])  # a guarded import that failed here
        if value is None and self.file is not None and name in self.file.assigns:
            for chain in self.file.assigns[name]:  # client = OpenAI() if openai else None
                val = self.walk(chain) if chain[0] in imports else Value()
                if val.path:
                    return val
        if value is None:  # a placeholder (client = None): unknown, so method names can speak
            return Value()
        if value is not MISSING:
            path = rules.canonical(imports[name]) if name in imports else describe(value)
            return Value(value, path)
        builtin = builtins.__dict__.get(name, MISSING)
        return Value(builtin, f"builtins.{name}") if builtin is not MISSING else Value()

    # -- chains --------------------------------------------------------------------------------

    def walk(self, names: tuple[str, ...], ref: Ref | None = None) -> Value:
        """Follow ``names`` from its root; helpers called on the way are followed if ``ref``."""
        if ref is not None and ref.imported:  # `import a.b` / `from a import b`: the module itself
            val = from_path(".".join(names))
            return Value(val.obj, val.path, hit=self._hit(val, len(names) - 1))
        val = self.root(names[0]) if names[0] != EXPR else Value()
        hit, followed = self._hit(val, 0), False
        receiver = self._receiver(names, 0, val) if hit else None
        for i, n in enumerate(names[1:], start=1):
            if n == CALL:
                val = self._call(val, names[:i], ref)
            elif n == ITEM:
                val = Value(path=val.path)
            else:
                val = self._attr(val, n)
            followed = followed or val.followed
            result = CALL in names[1:i] and "()" in (val.path or "")  # a function's result
            if n not in (CALL, ITEM) and not (hit and result):
                hit = self._hit(val, i) or hit  # np.tanh(x).sum(): the reason names np.tanh
                if hit is not None and receiver is None:
                    receiver = self._receiver(names, i, val)
        return Value(val.obj, val.path, val.cls, followed, hit, receiver or None, val.made, val.ann)

    @staticmethod
    def _receiver(names: tuple[str, ...], i: int, val: Value) -> str:
        """``client = openai.OpenAI(...)``, ``self.db: sqlite3.Connection``: the object through
        which a chain first reaches a library, when the written name does not say it."""
        text, path = Ref(names[: i + 1], 0).text, val.path or ""
        if val.ann is not None:
            return f"{text} is annotated as {val.ann}"
        if path.endswith("()") or val.made:
            return f"{text} = {path.removesuffix('()')}(...)"
        if val.obj is MISSING or isinstance(val.obj, (types.ModuleType, type)):
            return ""
        return "" if path.rsplit(".", 1)[-1] == names[i] else f"{text}: {path}"

    @staticmethod
    def _hit(val: Value, index: int) -> tuple[Rule, str, int] | None:
        rule = rule_for(val.obj, val.path) if val.path else None
        return (rule, val.path, index) if rule is not None else None

    def _attr(self, val: Value, name: str) -> Value:
        path = f"{val.path}.{name}" if val.path else None
        obj = val.obj
        if obj is not MISSING and (
            isinstance(obj, (types.ModuleType, type)) or is_user_instance(obj)
        ):
            attr = static_attr(obj, name)
            if attr is None and is_user_instance(obj):  # not set yet: what the class assigns
                return self._class_attr(type(obj), name, None)
            if attr is not MISSING:
                written = path if rule_for(attr, path) is not None else None
                return Value(attr, written or describe(attr) or path)
        if val.cls is not None:
            return self._class_attr(val.cls, name, path)
        if obj is not MISSING and not isinstance(obj, (types.ModuleType, type)):
            if not has_static_attr(obj, name):  # a placeholder object: the name says nothing
                return Value()
        return Value(path=path)

    def _class_attr(self, cls: type, name: str, path: str | None) -> Value:
        attr = static_attr(cls, name)
        if isinstance(attr, types.FunctionType):
            return Value(attr, path, cls=cls)  # a method of an instance known only by class
        if attr is not MISSING and attr is not None:
            return Value(attr, describe(attr))
        return self.self_attrs(cls).get(name) or Value(path=path)

    def self_attrs(self, cls: type) -> dict[str, Value]:
        """``self.x = <expr>`` in the class's methods, each resolved in its method's scope."""
        cache = self.ctx.self_attrs
        if cls in cache:
            return cache[cls]
        out = cache[cls] = {}  # placeholder first: resolving may come back to this class
        for klass in [k for k in cls.__mro__ if is_user_class(k)]:
            for attr in list(vars(klass).values()):
                fn = getattr(attr, "__func__", attr)
                if not has_source_file(fn) or is_library(fn):
                    continue
                other = Resolver(fn, self.ctx, cls=cls)
                for name, chains in other.facts.self_attrs.items():
                    for chain in chains:
                        val = other.walk(chain)
                        if name not in out and (val.path or val.obj is not MISSING or val.cls):
                            out[name] = val
        return out

    def _call(self, val: Value, callee: tuple[str, ...], ref: Ref | None) -> Value:
        """The value of ``callee(...)``: an instance of a class, a helper's result, or data."""
        obj = val.obj
        if isinstance(obj, type):
            user = is_user_class(obj)
            init = obj.__dict__.get("__init__")
            if user and ref is not None and has_source_file(init):
                self._follow(Unbound(init, obj), Ref(callee, ref.line))
            if user:
                return Value(path=val.path, cls=obj)
            return Value(path=val.path, made=True)  # an instance of a library class
        target = self._callee(val)
        if target is not None:
            if ref is not None:
                self._follow(target, Ref(callee, ref.line))
            return Value(followed=True)
        if obj is MISSING and val.path and val.path.rsplit(".", 1)[-1][:1].isupper():
            return Value(path=val.path, made=True)  # OpenAI(): a class we cannot import
        top = rules.lookup(val.path.split(".")[0]) if val.path else None
        if top is not None and top.kind == "tensor":  # np.loadtxt(...) is an array: so is .mean()
            return Value(path=f"{val.path}()")
        if top is not None and top.kind == "orchestration" and callee[-1] in _HANDLES:
            return Value(path=f"{val.path}()", made=True)  # conn = sqlite3.connect(...): a handle
        return Value()  # the result of another library function: data, counted at the call

    def _callee(self, val: Value) -> Any:
        """The user code a call runs, if any: a helper, a method, a callable object."""
        obj = val.obj
        if obj is MISSING and val.cls is not None:
            call = static_attr(val.cls, "__call__")  # model = Model(); model(x)
            return Unbound(call, val.cls) if isinstance(call, types.FunctionType) else None
        if isinstance(obj, types.FunctionType) and val.cls is not None:
            return Unbound(obj, val.cls) if not is_library(obj) else None
        return obj if user_callable(obj) else None

    def _follow(self, target: Any, ref: Ref) -> None:
        """A helper that a chain walked with a ``ref`` calls: :class:`~.function.FunctionAnalyzer`
        follows it (its analysis becomes evidence); plain resolution ignores it."""

    # -- what names are bound to ------------------------------------------------------------------

    def _string(self, name: str) -> str | None:
        """The value of a name bound to a string literal (a local, a global, a closure cell)."""
        if name in self.facts.strings:
            return self.facts.strings[name]
        value = self._outer(name).obj if name not in self.facts.locals else None
        return value if isinstance(value, str) else None

    def _undefined(self, name: str) -> bool:
        """A name bound nowhere the analysis can see: no parameter, local, import (here or at
        module level), closure value, global or builtin of that name, or a global still ``None``
        (``create_completion = None``, set later)."""
        f = self.facts
        if name in f.locals or name in f.imports or name == self._self_name():
            return False
        if self.file is not None and name in self.file.imports:
            return False
        val = self._outer(name)
        return val.obj is MISSING and val.path is None and val.cls is None

    def _dynamic(self, name: str) -> bool:
        """A call of a parameter or loop variable (``fn(x)``, ``for step in steps: step(x)``)."""
        f = self.facts
        if name == self._self_name() or name in f.local_defs:
            return False
        return name in f.params or (name in f.locals and name not in f.imports)


def from_path(path: str) -> Value:
    """A dotted import path to the already-imported object, if any (never imports anything)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        mod = sys.modules.get(".".join(parts[:n]))
        if mod is not None:
            obj: Any = mod
            for p in parts[n:]:
                obj = static_attr(obj, p) if obj is not MISSING else MISSING
            return Value(obj, rules.canonical(path))
    return Value(path=rules.canonical(path))

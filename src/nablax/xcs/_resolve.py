"""Resolve the names a function uses to the objects they denote, and turn them into evidence.

Internal to :mod:`nablax.xcs.analysis`. Objects are read statically (module dicts, closure cells,
``inspect.getattr_static``): no property, ``__getattr__`` or user function is ever run.
"""

from __future__ import annotations

import builtins
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _rules, _source
from ._objects import (
    MISSING,
    annotation_names,
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
from ._source import CALL, EXPR, ITEM, Facts, Ref

MAX_DEPTH = 6  # helper functions followed at most this deep
MAX_VISITS = 256  # functions analyzed for one top-level classification


@dataclass(frozen=True)
class Evidence:
    """One fact behind a classification: ``kind`` is "tensor" or "orchestration"."""

    kind: str
    op: str
    reason: str
    traceable: bool = False
    ops: tuple[str, ...] = ()  # the operations behind it (a helper's own ops)
    leaf: str = ""  # for a helper: the reason found at the end of the chain of helpers
    via: tuple[str, ...] = ()  # the helpers in between


@dataclass
class Analysis:
    """Everything found about one callable; :mod:`analysis` turns it into a Classification."""

    evidence: list[Evidence] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)  # why the answer would be a guess
    side_effects: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    marked: str | None = None
    complete: bool = True  # False when a cycle or the depth limit cut the walk below the top

    def kinds(self) -> set[str]:
        return {e.kind for e in self.evidence}

    def merge(self, other: Analysis) -> None:
        self.evidence += [e for e in other.evidence if e not in self.evidence]
        self.uncertain += [u for u in other.uncertain if u not in self.uncertain]
        self.side_effects += other.side_effects
        self.notes += other.notes
        self.complete = self.complete and other.complete


@dataclass
class Context:
    """State of one top-level classification: the call stack (cycle guard) and a visit budget."""

    follow: Callable[[Any, Context], Analysis]  # analyze a helper (cache-aware)
    stack: list[int] = field(default_factory=list)
    visits: int = 0
    self_attrs: dict[type, dict] = field(default_factory=dict)

    @property
    def depth(self) -> int:
        return len(self.stack)


@dataclass
class _Val:
    """What a name chain denotes so far: a live object and/or a dotted name for the rules."""

    obj: Any = MISSING
    path: str | None = None
    cls: type | None = None  # known only as "an instance of cls" (constructed, or `self`)
    followed: bool = False  # a helper was followed on the way (its own analysis decides)
    hit: tuple[_rules.Rule, str, int] | None = None  # last library rule on the chain, its index
    root: str | None = None  # "client: openai.OpenAI": the object the chain reaches a library by
    made: bool = False  # an instance made by calling a library class (`client = OpenAI()`)


def evidence_from_rule(rule: _rules.Rule, op: str, reason: str) -> list[Evidence]:
    if rule.kind == "neutral":
        return []
    return [Evidence(rule.kind, op, reason, rule.traceable, (op,))]


def rank(e: Evidence) -> tuple[bool, bool]:
    """Order of reasons: calls first; imports and dtype constants (np.float32) say least."""
    leaf = e.leaf or e.reason
    return leaf.startswith("imports "), "constant" in leaf


def summarize(name: str, line: int | None, sub: Analysis) -> list[Evidence]:
    """A helper's analysis as evidence of the caller: one item per kind the helper has."""
    at = f" at line {line}" if line else ""
    out = []
    for kind in ("tensor", "orchestration"):
        found = sorted((e for e in sub.evidence if e.kind == kind), key=rank)
        if not found:
            continue
        ops = tuple(dict.fromkeys(o for e in found for o in e.ops))
        traceable = all(e.traceable for e in found) and not sub.side_effects
        first = found[0]
        leaf, via = first.leaf or first.reason, (first.op, *first.via) if first.leaf else ()
        why = leaf + (f", via {' -> '.join(via)}" if via else "")
        more = f"; +{len(found) - 1} more" if len(found) > 1 else ""
        reason = f"calls {name}{at}, which is {kind} code ({why}{more})"
        out.append(Evidence(kind, name, reason, traceable, ops, leaf, via))
    return out


class Unbound:
    """A method reached through its class with no instance (``self.helper`` in a class)."""

    def __init__(self, func: types.FunctionType, cls: type):
        self.func, self.cls = func, cls


class FunctionAnalyzer:
    """Source (or bytecode) analysis of one Python function, with ``self`` bound if known."""

    def __init__(self, func: types.FunctionType, ctx: Context, self_obj: Any = MISSING, cls=None):
        self.func = func
        self.ctx = ctx
        self.code = func.__code__
        self.globals = func.__globals__
        self.self_obj = self_obj
        self.cls = cls or owner_class(func, self_obj)
        self.facts: Facts = _source.facts_for(self.code, self.globals) or Facts(has_source=False)
        self.file = _source.file_info(self.code.co_filename, self.globals)
        self.result = Analysis()
        self._resolving: set[str] = set()
        self._followed: dict[Any, Any] = {}

    # -- names ---------------------------------------------------------------------------------

    def _self_name(self) -> str | None:
        if self.cls is None or not self.facts.params:
            return None
        return self.facts.params[0]

    def root(self, name: str) -> _Val:
        """Resolve a bare name: local import, self, local variable, closure, global, builtin."""
        f = self.facts
        if name in f.imports:
            return from_path(f.imports[name])
        if name == self._self_name():
            if self.self_obj is not MISSING:
                return _Val(self.self_obj, describe(self.self_obj))
            return _Val(path=describe(self.cls), cls=self.cls)
        if name in f.assigns and name not in self._resolving:
            self._resolving.add(name)
            try:
                for chain in f.assigns[name]:
                    val = self.walk(chain)
                    if val.obj is not MISSING or val.path or val.cls:
                        return val
            finally:
                self._resolving.discard(name)
        if name in f.locals or name in f.params:
            return _Val()
        return self._outer(name)

    def _outer(self, name: str) -> _Val:
        """A closure variable, a module global (or its guarded import), or a builtin."""
        if name in self.code.co_freevars and self.func.__closure__:
            cell = self.func.__closure__[self.code.co_freevars.index(name)]
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell (assigned later)
                return _Val()
            return _Val(value, describe(value)) if value is not None else _Val()
        value = self.globals.get(name, MISSING)
        imports = self.file.imports if self.file is not None else {}
        if name in imports and (value is MISSING or value is None):
            return from_path(imports[name])  # a guarded import that failed here
        if value is None and self.file is not None and name in self.file.assigns:
            for chain in self.file.assigns[name]:  # client = OpenAI() if openai else None
                val = self.walk(chain) if chain[0] in imports else _Val()
                if val.path:
                    return val
        if value is None:  # a placeholder (client = None): unknown, so method names can speak
            return _Val()
        if value is not MISSING:
            path = _rules.canonical(imports[name]) if name in imports else describe(value)
            return _Val(value, path)
        builtin = builtins.__dict__.get(name, MISSING)
        return _Val(builtin, f"builtins.{name}") if builtin is not MISSING else _Val()

    # -- chains --------------------------------------------------------------------------------

    def walk(self, names: tuple[str, ...], ref: Ref | None = None) -> _Val:
        """Follow ``names`` from its root; helpers called on the way are followed if ``ref``."""
        if ref is not None and ref.imported:  # `import a.b` / `from a import b`: the module itself
            val = from_path(".".join(names))
            return _Val(val.obj, val.path, hit=self._hit(val, len(names) - 1))
        val = self.root(names[0]) if names[0] != EXPR else _Val()
        hit, followed = self._hit(val, 0), False
        receiver = self._receiver(names, 0, val) if hit else None
        for i, n in enumerate(names[1:], start=1):
            if n == CALL:
                val = self._call(val, names[:i], ref)
            elif n == ITEM:
                val = _Val(path=val.path)
            else:
                val = self._attr(val, n)
            followed = followed or val.followed
            result = CALL in names[1:i] and "()" in (val.path or "")  # a function's result
            if n not in (CALL, ITEM) and not (hit and result):
                hit = self._hit(val, i) or hit  # np.tanh(x).sum(): the reason names np.tanh
                if hit is not None and receiver is None:
                    receiver = self._receiver(names, i, val)
        return _Val(val.obj, val.path, val.cls, followed, hit, receiver or None, val.made)

    @staticmethod
    def _receiver(names: tuple[str, ...], i: int, val: _Val) -> str:
        """``client = openai.OpenAI(...)``, ``self.db: sqlite3.Connection``: the object through
        which a chain first reaches a library, when the written name does not say it."""
        text, path = Ref(names[: i + 1], 0).text, val.path or ""
        if path.endswith("()") or val.made:
            return f"{text} = {path.removesuffix('()')}(...)"
        if val.obj is MISSING or isinstance(val.obj, (types.ModuleType, type)):
            return ""
        return "" if path.rsplit(".", 1)[-1] == names[i] else f"{text}: {path}"

    @staticmethod
    def _hit(val: _Val, index: int) -> tuple[_rules.Rule, str, int] | None:
        rule = rule_for(val.obj, val.path) if val.path else None
        return (rule, val.path, index) if rule is not None else None

    def _attr(self, val: _Val, name: str) -> _Val:
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
                return _Val(attr, written or describe(attr) or path)
        if val.cls is not None:
            return self._class_attr(val.cls, name, path)
        if obj is not MISSING and not isinstance(obj, (types.ModuleType, type)):
            if not has_static_attr(obj, name):  # a placeholder object: the name says nothing
                return _Val()
        return _Val(path=path)

    def _class_attr(self, cls: type, name: str, path: str | None) -> _Val:
        attr = static_attr(cls, name)
        if isinstance(attr, types.FunctionType):
            return _Val(attr, path, cls=cls)  # a method of an instance known only by class
        if attr is not MISSING and attr is not None:
            return _Val(attr, describe(attr))
        return self.self_attrs(cls).get(name) or _Val(path=path)

    def self_attrs(self, cls: type) -> dict[str, _Val]:
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
                other = FunctionAnalyzer(fn, self.ctx, cls=cls)
                for name, chains in other.facts.self_attrs.items():
                    for chain in chains:
                        val = other.walk(chain)
                        if name not in out and (val.path or val.obj is not MISSING or val.cls):
                            out[name] = val
        return out

    def _call(self, val: _Val, callee: tuple[str, ...], ref: Ref | None) -> _Val:
        """The value of ``callee(...)``: an instance of a class, a helper's result, or data."""
        obj = val.obj
        if isinstance(obj, type):
            user = is_user_class(obj)
            init = obj.__dict__.get("__init__")
            if user and ref is not None and has_source_file(init):
                self._follow(Unbound(init, obj), Ref(callee, ref.line))
            if user:
                return _Val(path=val.path, cls=obj)
            return _Val(path=val.path, made=True)  # an instance of a library class
        target = self._callee(val)
        if target is not None:
            if ref is not None:
                self._follow(target, Ref(callee, ref.line))
            return _Val(followed=True)
        if obj is MISSING and val.path and val.path.rsplit(".", 1)[-1][:1].isupper():
            return _Val(path=val.path, made=True)  # OpenAI(): a class we cannot import
        top = _rules.lookup(val.path.split(".")[0]) if val.path else None
        if top is not None and top.kind == "tensor":  # np.loadtxt(...) is an array: so is .mean()
            return _Val(path=f"{val.path}()")
        return _Val()  # the result of another library function: data, counted at the call

    def _callee(self, val: _Val) -> Any:
        """The user code a call runs, if any: a helper, a method, a callable object."""
        obj = val.obj
        if obj is MISSING and val.cls is not None:
            call = static_attr(val.cls, "__call__")  # model = Model(); model(x)
            return Unbound(call, val.cls) if isinstance(call, types.FunctionType) else None
        if isinstance(obj, types.FunctionType) and val.cls is not None:
            return Unbound(obj, val.cls) if not is_library(obj) else None
        return obj if user_callable(obj) else None

    # -- evidence ------------------------------------------------------------------------------

    def _follow(self, target: Any, ref: Ref) -> None:
        if isinstance(target, types.MethodType):
            key: Any = (id(target.__func__), id(target.__self__))
        else:
            key = id(target.func if isinstance(target, Unbound) else target)
        if key in self._followed:  # each helper once per function: one reason, one walk
            return
        self._followed[key] = target  # held, so that no id is reused while analyzing
        sub = self.ctx.follow(target, self.ctx)
        for e in summarize(ref.text, ref.line, sub):
            if e not in self.result.evidence:
                self.result.evidence.append(e)
        self.result.uncertain += [u for u in sub.uncertain if u not in self.result.uncertain]
        self.result.side_effects += sub.side_effects
        self.result.complete = self.result.complete and sub.complete

    def ref_evidence(self, ref: Ref) -> None:
        """Evidence of one name chain: a library rule, a helper to follow, or a method-name hint."""
        val = self.walk(ref.names, ref)
        if not ref.called and val.obj is not MISSING and user_callable(val.obj):
            self._follow(val.obj, ref)  # passed along, as in pool.map(fetch, urls)
        elif val.hit is not None and val.hit[2] == 0 and ref.names[0] in self.facts.assigns:
            return  # a local variable passed around (`return x[0]`): counted where it was made
        elif val.hit is not None:
            self._rule_evidence(ref, val)
        elif val.obj is MISSING and val.cls is None and not val.followed:
            if not self._hints(ref) and ref.awaited:
                why = f"awaits {ref.text} at line {ref.line} (an async call: probably I/O)"
                self.result.evidence.append(
                    Evidence("orchestration", ref.text, why, ops=(ref.text,))
                )

    def _rule_evidence(self, ref: Ref, val: _Val) -> None:
        rule, path, index = val.hit
        names = ref.names[: index + 1]
        text = Ref(names, ref.line).text
        called = index + 1 < len(ref.names) and ref.names[index + 1] == CALL
        if rule.kind == "neutral":
            if called:
                self.result.notes.append(text)
            return
        verb = "imports" if ref.imported else "calls" if called else "uses"
        detail = f"; {val.root}" if val.root and len(names) > 1 else ""
        reason = f"{verb} {text} ({rule.what}{detail}) at line {ref.line}"
        self.result.evidence += evidence_from_rule(rule, text, reason)
        for name in ref.names[index + 1 :] if rule.kind == "tensor" else ():
            host = _rules.METHOD_HINTS.get(name)
            if host is not None and host.kind == "tensor" and not host.traceable:
                why = f"calls .{name}() on its result at line {ref.line} ({host.what})"
                self.result.evidence += evidence_from_rule(host, f"{text}(...).{name}", why)

    def _hints(self, ref: Ref) -> bool:
        """Method-name hints for chains on unknown objects (parameters, call results)."""
        verb = "calls" if ref.called else "uses"
        attrs = tuple(n for n in ref.names[1:] if n not in (CALL, ITEM))
        suffix = _rules.llm_suffix(attrs)
        if suffix is not None:
            reason = f"{verb} {ref.text} (LLM API call .{suffix}) at line {ref.line}"
            self.result.evidence.append(
                Evidence("orchestration", ref.text, reason, ops=(ref.text,))
            )
            return True
        for name in attrs:
            rule = _rules.METHOD_HINTS.get(name)
            if rule is not None:
                reason = f"{verb} {ref.text} ({rule.what}, from the method name) at line {ref.line}"
                self.result.evidence += evidence_from_rule(rule, ref.text, reason)
                return True
        name = ref.names[0]
        if ref.names[1:] == (CALL,) and not ref.nested and self._dynamic(name):
            what = "its argument" if name in self.facts.params else "the callable"
            why = f"calls {what} `{name}` at line {ref.line}, whose kind is known only at run time"
            self.result.uncertain.append(why)
        return False

    def _dynamic(self, name: str) -> bool:
        """A call of a parameter or loop variable (``fn(x)``, ``for step in steps: step(x)``)."""
        f = self.facts
        if name == self._self_name() or name in f.local_defs:
            return False
        return name in f.params or (name in f.locals and name not in f.imports)

    def run(self) -> Analysis:
        for ref in self.facts.refs:
            self.ref_evidence(ref)
        self._side_effects()
        if not self.result.evidence:
            self._annotations()
        if not self.result.evidence and not self.facts.has_source:
            self.result.uncertain.append(
                f"no source code for {self.code.co_qualname} (defined in a REPL, by exec or in a "
                "compiled module) and no marker, module or annotation evidence"
            )
        return self.result

    def _side_effects(self) -> None:
        f = self.facts
        self.result.side_effects += f.side_effects
        for name in _source.mutated_roots(f):
            if name in f.locals or name in f.params or name in f.imports:
                continue
            obj = self._outer(name).obj
            if isinstance(obj, (list, dict, set, bytearray)) or is_user_instance(obj):
                self.result.side_effects.append(f"mutates {name}, which lives outside the function")

    def _annotations(self) -> None:
        refs = self.facts.annotations
        if not self.facts.has_source:
            refs = [Ref(tuple(a.split(".")), 0) for a in annotation_names(self.func)]
        for ref in refs:
            val = self.walk(ref.names)
            if val.path is None and ref.names[0] in sys.modules:  # "jax.Array" as a string
                val = from_path(".".join(ref.names))
            rule = rule_for(val.obj, val.path)
            if rule is None or rule.kind == "neutral":
                continue
            if rule.kind == "orchestration" and not (val.path or "").endswith(_rules.CLIENT_WORDS):
                continue  # a Response or Message annotation is data, not an I/O handle
            reason = f"a parameter or the return value is annotated as {ref.text} ({rule.what})"
            self.result.evidence += evidence_from_rule(rule, ref.text, reason)


def from_path(path: str) -> _Val:
    """A dotted import path to the already-imported object, if any (never imports anything)."""
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        mod = sys.modules.get(".".join(parts[:n]))
        if mod is not None:
            obj: Any = mod
            for p in parts[n:]:
                obj = static_attr(obj, p) if obj is not MISSING else MISSING
            return _Val(obj, _rules.canonical(path))
    return _Val(path=_rules.canonical(path))

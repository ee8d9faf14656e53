"""Resolve the names a function uses to the objects they denote, and turn them into evidence.

Internal to :mod:`nablax.xcs.analysis`. Objects are read statically (module dicts, closure cells,
``inspect.getattr_static``): no property, ``__getattr__`` or user function is ever run.

A parameter annotated with a library class (``conn: sqlite3.Connection``, ``x: jax.Array``) is
known as an instance of it; handles returned by library factories (``sqlite3.connect(...)``,
``boto3.client(...)``) keep their library. What stays unresolved is judged by method names
(``.fetchall()``, ``.sum()``), SQL literals (``c.execute("INSERT ...")``) and, last, the keyword
fallback (:mod:`._keywords`). Every orchestration operation gets an effect status
(:mod:`._effects`).
"""

from __future__ import annotations

import builtins
import sys
import types
from dataclasses import dataclass
from typing import Any

from . import _effects, _keywords, _rules, _source
from ._evidence import Analysis, Context, Evidence, evidence_from_rule, rank, summarize
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

__all__ = ["Analysis", "Context", "Evidence", "FunctionAnalyzer", "Unbound", "rank"]

# library functions that return a connection / client / file handle, whose methods are I/O too
_HANDLES = frozenset("connect cursor client resource open create_engine create_connection".split())
MAX_DEPTH = 6  # helper functions followed at most this deep
MAX_VISITS = 256  # functions analyzed for one top-level classification


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
    ann: str | None = None  # a parameter known by its annotation (`x: jax.Array`)


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
        if name in f.param_annotations and name not in self._resolving:
            return self._annotated(name)
        if name in f.locals or name in f.params:
            return _Val()
        return self._outer(name)

    def _annotated(self, name: str) -> _Val:
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
            return _Val()
        return _Val(path=val.path, made=True, ann=".".join(chain))

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
        return _Val(val.obj, val.path, val.cls, followed, hit, receiver or None, val.made, val.ann)

    @staticmethod
    def _receiver(names: tuple[str, ...], i: int, val: _Val) -> str:
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
        if top is not None and top.kind == "orchestration" and callee[-1] in _HANDLES:
            return _Val(path=f"{val.path}()", made=True)  # conn = sqlite3.connect(...): a handle
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
        self._item_call(ref)
        if not ref.called and val.obj is not MISSING and user_callable(val.obj):
            self._follow(val.obj, ref)  # passed along, as in pool.map(fetch, urls)
        elif val.hit is not None and val.hit[2] == 0 and ref.names[0] in self.facts.assigns:
            return  # a local variable passed around (`return x[0]`): counted where it was made
        elif val.hit is not None and val.ann is not None and len(ref.names) == 1:
            return  # an annotated parameter passed along (print(x)): the annotation says little
        elif val.hit is not None:
            self._rule_evidence(ref, val)
        elif val.obj is MISSING and val.cls is None and not val.followed:
            if not self._hints(ref) and ref.awaited:
                why = f"awaits {ref.text} at line {ref.line} (an async call: probably I/O)"
                k = ref.names.index(CALL) - 1 if CALL in ref.names[1:] else len(ref.names) - 1
                fx = self._fx(ref, k, _rules.Rule("orchestration", "an async call"))
                self.result.evidence += evidence_from_rule(_keywords.CLIENT, ref.text, why, fx)

    def _string(self, name: str) -> str | None:
        """The value of a name bound to a string literal (a local, a global, a closure cell)."""
        if name in self.facts.strings:
            return self.facts.strings[name]
        value = self._outer(name).obj if name not in self.facts.locals else None
        return value if isinstance(value, str) else None

    def _fx(self, ref: Ref, index: int, rule: _rules.Rule) -> tuple[str, str]:
        text = Ref(ref.names[: index + 1], ref.line).text
        return _effects.of_call(
            ref.names, index, rule, ref.args_at(index), self._string, f"{text} at line {ref.line}"
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
        if rule.kind == "unknown":  # exec / eval
            if called:
                self.result.uncertain.append(f"calls {text} at line {ref.line} ({rule.what})")
            return
        verb = "imports" if ref.imported else "calls" if called else "uses"
        detail = f"; {val.root}" if val.root and len(names) > 1 else ""
        reason = f"{verb} {text} ({rule.what}{detail}) at line {ref.line}"
        fx = self._fx(ref, index, rule) if rule.kind == "orchestration" else ("", "")
        if ref.imported or (not called and names[-1].isupper()):
            fx = ("", "")  # importing a module, reading a constant (socket.AF_INET): no call
        self.result.evidence += evidence_from_rule(rule, text, reason, fx)
        for name in ref.names[index + 1 :] if rule.kind == "tensor" else ():
            host = _rules.METHOD_HINTS.get(name)
            if host is not None and host.kind == "tensor" and not host.traceable:
                why = f"calls .{name}() on its result at line {ref.line} ({host.what})"
                self.result.evidence += evidence_from_rule(host, f"{text}(...).{name}", why)

    def _hints(self, ref: Ref) -> bool:
        """Chains on unknown objects (parameters, call results, placeholders): LLM SDK endings,
        method names (``.fetchall()``, ``.sum()``) and, failing those, the keyword fallback."""
        found = self._io_hint(ref)
        names = ref.names
        for i in range(found + 1 if found >= 0 else 1, len(names)):
            if _rules.METHOD_HINTS.get(names[i]) is _rules.ARRAY_METHOD:
                verb = "calls" if i + 1 < len(names) and names[i + 1] == CALL else "uses"
                text = Ref(names[: i + 1], ref.line).text
                why = (
                    f"{verb} {text} at line {ref.line} (.{names[i]} is an array method or "
                    "attribute, which no builtin type has: the value is an array)"
                )
                self.result.evidence += evidence_from_rule(
                    _rules.ARRAY_METHOD, text, why, weak=True
                )
                return True
        if found >= 0:
            return True
        name = names[0]
        word = _keywords.array_word(name) if len(names) > 1 and names[1] == CALL else None
        if word is not None and self._undefined(name):  # matmul(a, b), matmul undefined
            text = Ref(names[:1], ref.line).text
            why = (
                f"keyword fallback: calls {text} at line {ref.line} (an undefined name; the word "
                f"`{word}` suggests {_keywords.ARRAY_OP.what})"
            )
            self.result.evidence += evidence_from_rule(_keywords.ARRAY_OP, text, why, weak=True)
            return True
        if ref.nested:
            return False
        if len(names) > 1 and names[1] == CALL and self._dynamic(name):  # fn(x), fn(x).attr
            what = "its argument" if name in self.facts.params else "the callable"
            why = f"calls {what} `{name}` at line {ref.line}, whose kind is known only at run time"
            self.result.uncertain.append(why)
        return False

    def _item_call(self, ref: Ref) -> None:
        """``handlers[kind](event)``, ``self.tools[name](**args)``: a callable picked from a
        container at run time (its kind, and its effects, are unknown)."""
        names = ref.names
        if ref.nested or ITEM not in names or CALL not in names:
            return
        if names.index(ITEM) + 1 != names.index(CALL):
            return
        if names[0] in self.facts.params or names[0] == self._self_name():
            text = Ref(names[: names.index(ITEM)], ref.line).text
            why = f"calls a callable taken from {text} at line {ref.line}, known only at run time"
            self.result.uncertain.append(why)

    def _io_hint(self, ref: Ref) -> int:
        """Orchestration evidence for an unresolved chain; the index of the name it is about
        (-1: none)."""
        names = ref.names
        for i, n in enumerate(names):  # client.chat.completions.create(...).choices[0]...
            if n == CALL:
                suffix = _rules.llm_suffix(tuple(x for x in names[1:i] if x not in (CALL, ITEM)))
                if suffix is not None:
                    text = Ref(names[:i], ref.line).text
                    why = f"calls {text} (LLM API call .{suffix}) at line {ref.line}"
                    fx = self._fx(ref, i - 1, _rules.LLM)
                    self.result.evidence += evidence_from_rule(_rules.LLM, text, why, fx)
                    return i - 1
        found = -1
        for i, n in enumerate(names[1:], start=1):
            rule = _rules.METHOD_HINTS.get(n)
            if rule is not None and rule.kind == "orchestration":
                text = Ref(names[: i + 1], ref.line).text
                why = f"calls {text} ({rule.what}, from the method name) at line {ref.line}"
                fx = self._fx(ref, i, rule)
                self.result.evidence += evidence_from_rule(rule, text, why, fx, weak=True)
                found = i
                break
            if n in ("execute", "executemany") and self._sql_call(ref, i):
                found = i
                break
        direct = names[1:] == (CALL,) and self._dynamic(names[0])
        undefined = len(names) > 1 and names[1] == CALL and self._undefined(names[0])
        hit = _keywords.fallback(names, self._self_name(), direct, undefined)
        if hit is None or hit[1] == found:  # the method name already said it
            return found
        rule, i, word, ambiguous = hit  # the first call: session.delete(...).raise_for_status()
        text = Ref(names[: i + 1], ref.line).text
        why = (
            f"keyword fallback: calls {text} at line {ref.line} (unresolved; {word} suggests "
            f"{rule.what})"
        )
        evidence = evidence_from_rule(rule, text, why, self._fx(ref, i, rule), weak=True)
        if ambiguous:  # `model.generate(...)`: an LLM unless the function does tensor work
            self._maybe += evidence
        else:
            self.result.evidence += evidence
        return max(found, i)

    def _sql_call(self, ref: Ref, i: int) -> bool:
        """``c.execute("INSERT ...")`` on any receiver: the SQL literal says it is a database."""
        args = ref.args_at(i)
        first = args.get(0) if args is not None else None
        sql = first[1] if first and first[0] == "s" else self._string(first[1]) if first else None
        if sql is None or _effects.sql_status(sql) is None:
            return False
        text = Ref(ref.names[: i + 1], ref.line).text
        why = f"calls {text} with an SQL statement (database) at line {ref.line}"
        fx = self._fx(ref, i, _rules.DB)
        self.result.evidence += evidence_from_rule(_rules.DB, text, why, fx)
        return True

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

    def run(self) -> Analysis:
        self._maybe: list[Evidence] = []
        for ref in self.facts.refs:
            self.ref_evidence(ref)
        if self.facts.matmul:
            line = self.facts.matmul[0]
            why = f"uses the @ operator at line {line} (a matrix product: its operands are arrays)"
            self.result.evidence += evidence_from_rule(_rules.ARRAY_METHOD, "@", why, weak=True)
        if self._maybe and "tensor" not in self.result.kinds():
            self.result.evidence += self._maybe
        self._side_effects()
        if not self.result.evidence:
            self._annotations()
        if "orchestration" in self.result.kinds():
            word = _effects.own_name_writes(self.code.co_name)
            if word is not None:
                why = f"its name {self.code.co_name} says it has effects (`{word}`)"
                self.result.fx_extra.append((_effects.WRITE, why))
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
            fx = (_effects.UNKNOWN, f"takes a {ref.text} (what it does with it is not known)")
            self.result.evidence += evidence_from_rule(rule, ref.text, reason, fx)


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

"""Analyze any callable by what it is: a marked callable (the marker decides), a wrapper
(``functools.wraps``), a ``functools.partial``, a bound method, a library or builtin callable
(judged by its module, :mod:`.rules`), a Python function (its source, :mod:`.function`), a class
(its ``__call__`` or its methods) or a callable object.

Internal to :mod:`nablax.xcs.classify`. Helpers reached from the function being classified are
analyzed through ``ctx.follow`` (the classifier's cache-aware entry, :mod:`.analysis`), at most
:data:`MAX_DEPTH` levels deep and :data:`MAX_VISITS` functions per top-level classification.
"""

from __future__ import annotations

import functools
import itertools
import types
from typing import Any

from ..markers import effects_of, marker_of
from . import effects, objects, rules, verbs
from .evidence import evidence_from_rule
from .function import FunctionAnalyzer
from .records import MISSING, UNKNOWN, WRITE, Analysis, Context, Evidence, Rule
from .resolve import Unbound

MAX_DEPTH = 6  # helper functions followed at most this deep
MAX_VISITS = 256  # functions analyzed for one top-level classification


def analyze(obj: Any, ctx: Context, *, markers: bool = True) -> Analysis:
    """Evidence about ``obj`` in priority order: marker, wrapped function, module, source."""
    if markers and (kind := marker_of(obj)) is not None:
        return _marked(obj, kind, ctx)
    if isinstance(obj, Unbound):
        return _function(obj.func, ctx, cls=obj.cls)
    wrapped = objects.static_attr(obj, "__wrapped__")
    if callable(wrapped) and wrapped is not obj and not isinstance(obj, type):
        return _wrapper(obj, wrapped, ctx)
    if isinstance(obj, functools.partial):
        return _partial(obj, ctx)
    if isinstance(obj, types.MethodType):
        if isinstance(obj.__func__, types.FunctionType) and not _library_rule(obj):
            return _function(obj.__func__, ctx, self_obj=obj.__self__)
    rule = _library_rule(obj)
    if rule is not None:
        return _library(obj, rule)
    if isinstance(obj, types.FunctionType):
        return _function(obj, ctx)
    if isinstance(obj, type):
        return _class(obj, ctx)
    if objects.is_user_instance(obj):
        return _instance(obj, ctx)
    name = objects.describe(obj) or type(obj).__name__
    return Analysis(uncertain=[f"{name} has no readable source and comes from an unknown module"])


def _library_rule(obj: Any) -> Rule | None:
    return objects.rule_for(obj, objects.describe(obj))


def _marked(obj: Any, kind: str, ctx: Context) -> Analysis:
    """A marked callable: the marker decides the kind (and ``effects=``, if declared); the source
    still tells traceability and, undeclared, the effects."""
    under = analyze(obj, ctx, markers=False)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    traceable = not under.uncertain and all(e.traceable for e in under.evidence)
    out = Analysis(marked=kind, side_effects=under.side_effects, complete=under.complete)
    out.declared_fx = effects_of(obj)
    out.fx_extra = effects.items(under)
    short = name.rsplit(".", 1)[-1]
    word = verbs.own_name_writes(short) if kind in ("orchestration", "hybrid") else None
    if word is not None and not any(s == WRITE for s, _ in out.fx_extra):
        out.fx_extra.append((WRITE, f"its name {short} says it has effects (`{word}`)"))
    for k in ("tensor", "orchestration") if kind == "hybrid" else (kind,):
        if k != "pure":
            why = f"marked with @mark_{kind}"
            out.evidence.append(Evidence(k, name, why, traceable, (name,)))
    return out


def _function(
    func: types.FunctionType, ctx: Context, self_obj: Any = MISSING, cls=None
) -> Analysis:
    key = id(func.__code__)
    if key in ctx.stack:  # recursion: the function is already being analyzed further up
        return Analysis(complete=False)
    if ctx.depth >= MAX_DEPTH or ctx.visits >= MAX_VISITS:
        limit = (
            f"helpers nest deeper than {MAX_DEPTH} levels"
            if ctx.depth >= MAX_DEPTH
            else f"more than {MAX_VISITS} helpers"
        )
        why = f"helper {func.__qualname__} not analyzed: {limit}"
        return Analysis(uncertain=[why], complete=False)
    ctx.stack.append(key)
    ctx.visits += 1
    try:
        return FunctionAnalyzer(func, ctx, self_obj, cls).run()
    finally:
        ctx.stack.pop()


def _wrapper(obj: Any, wrapped: Any, ctx: Context) -> Analysis:
    """A decorated function: what it wraps, plus the wrapper's own code or library kind."""
    out = analyze(wrapped, ctx)
    if isinstance(obj, types.FunctionType):  # wraps() copied __module__: ask where the code is
        where, rule = objects.code_rule(obj)
        name = f"a function of {where}"
        if rule is None and not objects.is_library(obj):
            out.merge(_function(obj, ctx))
            return out
    else:
        name, rule = objects.describe(obj) or type(obj).__name__, _library_rule(obj)
    if rule is not None and rule.kind != "neutral":
        reason = f"wrapped by {name} ({rule.what})"
        fx = (UNKNOWN, f"is wrapped by {name} ({rule.what})")
        out.evidence += evidence_from_rule(rule, name, reason, fx)
    return out


def _partial(p: functools.partial, ctx: Context) -> Analysis:
    """``functools.partial``: its function, plus clients, arrays or callbacks bound as arguments."""
    out = analyze(p.func, ctx)
    for i, value in enumerate(itertools.chain(p.args, p.keywords.values())):
        if objects.user_callable(value):
            out.merge(ctx.follow(value, ctx))
            continue
        rule = objects.rule_for(value, objects.describe(value))
        if rule is not None and rule.kind != "neutral" and not isinstance(value, type):
            what = f"bound argument {i} is a {objects.describe(value)} ({rule.what})"
            out.evidence += evidence_from_rule(rule, objects.describe(value), what)
    return out


def _library(obj: Any, rule: Rule) -> Analysis:
    """A callable from a known library or the standard library, judged by its module."""
    name = _display_name(obj)
    if rule.kind == "neutral":
        if name.startswith("builtins."):
            return Analysis(notes=[f"{name.removeprefix('builtins.')} is a pure Python builtin"])
        where = "standard-library" if name.split(".")[0] in rules.STDLIB else "library"
        return Analysis(notes=[f"{name} is {where} code without I/O"])
    name = name.removeprefix("builtins.")
    if rule.kind == "unknown":  # exec, eval
        return Analysis(uncertain=[f"{name} {rule.what}"])
    if rule.kind == "tensor":
        reason = f"{name} is a {rule.what} operation (by its module)"
    else:
        reason = f"{name} does {rule.what} (by its module)"
    fx = effects.of_object(name, rule) if rule.kind == "orchestration" else ("", "")
    return Analysis(evidence=evidence_from_rule(rule, name, reason, fx))


def _display_name(obj: Any) -> str:
    """``numpy.add``, ``os.remove``: the module and name users know, else the dotted type."""
    mod, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if isinstance(mod, str) and isinstance(name, str) and not isinstance(obj, types.MethodType):
        return rules.canonical(f"{mod}.{getattr(obj, '__qualname__', name)}")
    return objects.describe(obj) or repr(obj)


def _class(cls: type, ctx: Context) -> Analysis:
    """A class: its ``__call__`` if it defines one, else all its methods together."""
    out = Analysis()
    for base in cls.__mro__[1:]:
        rule = objects.rule_for(base, objects.describe(base))
        if rule is not None and rule.kind != "neutral":
            reason = f"subclasses {objects.describe(base)} ({rule.what})"
            fx = effects.of_object(objects.describe(base) or "", rule)
            out.evidence += evidence_from_rule(rule, objects.describe(base), reason, fx)
            return out
    call = objects.static_attr(cls, "__call__")
    if isinstance(call, types.FunctionType) and not objects.is_library(call):
        out.merge(_function(call, ctx, cls=cls))
        return out
    for klass in [k for k in cls.__mro__ if objects.is_user_class(k)]:
        for attr in list(vars(klass).values()):
            fn = getattr(attr, "__func__", attr)
            if objects.has_source_file(fn) and not objects.is_library(fn):
                out.merge(_function(fn, ctx, cls=cls))
    return out


def _instance(obj: Any, ctx: Context) -> Analysis:
    """A callable object: its class's library base, or its ``__call__`` with ``self`` bound."""
    cls = type(obj)
    call = objects.static_attr(cls, "__call__")
    if isinstance(call, types.FunctionType) and not objects.is_library(call):
        return _function(call, ctx, self_obj=obj)
    return _class(cls, ctx)

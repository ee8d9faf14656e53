"""Classify functions as tensor, orchestration, hybrid or pure, and say why.

``xcs`` routes each function by its kind: tensor code to XLA (nablax or JAX), orchestration code
(LLM, HTTP, files, subprocesses, databases) to a concurrent executor, hybrids to both, pure Python
anywhere. The evidence is read in priority order:

1. markers (``@mark_tensor`` ...), seen through wrappers, partials and bound methods;
2. the object's module, for library callables and builtins (``numpy.add`` is tensor, ``len`` pure,
   ``open``/``print``/``input`` are I/O);
3. the source (``ast``): imports and aliases (module level and inside the function), globals,
   closure cells and ``self`` attributes resolved to the objects they name, helpers followed
   recursively (depth limit, cycle guard); whole names only, strings and comments ignored;
4. parameter and return annotations (``jax.Array``, ``np.ndarray``, ``nx.Tensor``, a client);
5. weak evidence, always named as such in the reasons: array methods and attributes no builtin
   type has (``(x ** 2).sum()``, ``x.T``, ``.reshape``) and the ``@`` operator mean arrays; and
   the *keyword fallback* for calls on objects whose type cannot be resolved (a parameter, a
   ``None`` placeholder): ``llm.invoke(...)``, ``chain.batch(...)``, ``self.agent.run(...)``,
   ``db.commit()`` are orchestration because of the names written there. A receiver named
   ``model`` counts only when the function does no tensor work (``model(x)`` in PyTorch).

No evidence and no source gives ``"hybrid"``, the safe route. Nothing is executed: names are read
from module dicts, closure cells and ``inspect.getattr_static``.

**Effects.** ``Classification.effects`` says whether calling the function may change something
outside the program (see :mod:`nablax.xcs._effects`): declared by ``@mark_orchestration(effects=
...)`` / ``@mark_hybrid(effects=...)``, else inferred for orchestration and hybrid code: writes,
sends, posts, deletes, subprocesses, console output and anything unknown mean True; LLM calls,
HTTP GETs, file reads and sleeps are read-only. Tensor and pure code: False. One reason starting
with ``"effects"`` or ``"read-only"`` says why.

**Caching.** :func:`classify` is called on every call inside ``xcs.jit``, so results are cached
by the callable's identity (a bound method by its function and instance), checked against its
current code object and the identities of its closure cells' contents: a closure whose captured
value is rebound (``nonlocal``) is classified again, never answered from a stale entry. Module
globals, instance attributes and helpers are read when a function is first classified; after
rebinding those, call :func:`clear_cache`.

>>> import numpy as np
>>> def score(x):
...     return np.tanh(x).sum()
>>> c = classify(score)
>>> c.kind, c.jax_traceable
('tensor', False)
>>> c.reasons[0]
'calls np.tanh (NumPy) at line 2'
>>> def post(url, doc):
...     import requests
...     return requests.post(url, json=doc).status_code
>>> classify(post).effects, classify(post).reasons[-1]
(True, 'effects: calls requests.post at line 3 (writes: `post`)')
"""

from __future__ import annotations

import functools
import itertools
import types
import weakref
from dataclasses import dataclass
from typing import Any

from .. import _caches
from . import _effects, _objects, _resolve, _rules, _source
from ._resolve import MISSING, Analysis, Context, Evidence, FunctionAnalyzer, Unbound
from ._target import definitions, format_table
from .markers import EPOCH, effects_of, marker_of

__all__ = [
    "Classification",
    "OperationSummary",
    "analyze_operations",
    "classify",
    "classify_target",
    "clear_cache",
    "format_table",
]

_MAX_REASONS = 6
_MAX_ENTRIES = 4096


@dataclass(frozen=True)
class Classification:
    """How ``xcs`` will run a function: ``kind`` is ``"tensor"``, ``"orchestration"``,
    ``"hybrid"`` or ``"pure"``; ``reasons`` are short sentences saying why; ``jax_traceable`` is
    True when its tensor work is JAX/nablax only (no NumPy host ops, I/O or side effects), so
    ``jax.vmap``/``jax.grad`` can trace it; ``effects`` is True when calling it may change
    something outside the program (a write, send, post, delete, subprocess, console output, or
    unknown), False for read-only calls (LLM completions, GETs, file reads, sleeps) and for tensor
    and pure code.

    >>> Classification("pure", ("plain Python",), False).effects
    False
    """

    kind: str
    reasons: tuple[str, ...]
    jax_traceable: bool
    effects: bool = False


@dataclass(frozen=True)
class OperationSummary:
    """The operations :func:`analyze_operations` found, by kind (names as written in the source).

    A marked function reports ``{"marked"}`` for its marked kind(s). Otherwise only operations
    actually found are listed, never a placeholder (as the seed does): a pure function, and one
    whose kind cannot be known (no source and no other evidence, or it only calls a callable it
    is given, as in ``model(x)``), give empty sets where nothing was found, although
    :func:`classify` routes the latter as ``"hybrid"`` (the safe route). Whenever
    :func:`classify` rests on evidence, the summary implies the same kind.

    >>> s = OperationSummary(frozenset({"jnp.dot"}), frozenset())
    >>> s.only_tensor_ops, s.only_orchestration_ops, s.is_hybrid, s.has_tensor_ops
    (True, False, False, True)
    >>> OperationSummary().has_orchestration_ops
    False
    """

    tensor_ops: frozenset[str] = frozenset()
    orchestration_ops: frozenset[str] = frozenset()

    @property
    def has_tensor_ops(self) -> bool:
        return bool(self.tensor_ops)

    @property
    def has_orchestration_ops(self) -> bool:
        return bool(self.orchestration_ops)

    @property
    def only_tensor_ops(self) -> bool:
        return bool(self.tensor_ops) and not self.orchestration_ops

    @property
    def only_orchestration_ops(self) -> bool:
        return bool(self.orchestration_ops) and not self.tensor_ops

    @property
    def is_hybrid(self) -> bool:
        return bool(self.tensor_ops) and bool(self.orchestration_ops)


# ---- public API -----------------------------------------------------------------------------


def classify(func: Any) -> Classification:
    """Classify ``func`` (function, method, lambda, partial, class, callable object, builtin).

    >>> classify(len).kind, classify(open).kind
    ('pure', 'orchestration')
    >>> def ask(prompt):
    ...     import requests  # resolved from the source even when not installed
    ...     return requests.post("https://example.test/v1", json={"q": prompt}).json()
    >>> classify(ask).kind
    'orchestration'
    """
    key = _key(func)
    entry = _CACHE.get(key)
    if entry is not None and entry.valid(func):
        return entry.classification
    return _classify_slow(func, key)[0]


def analyze_operations(func: Any) -> OperationSummary:
    """The tensor and orchestration operations ``func`` uses (the legacy API of ``classify``).

    >>> import jax.numpy as jnp
    >>> def loss(w, x):
    ...     return jnp.mean(jnp.dot(x, w) ** 2)
    >>> sorted(analyze_operations(loss).tensor_ops)
    ['jnp.dot', 'jnp.mean']

    Only operations found are listed: calling a callable it is given tells nothing, although
    :func:`classify` routes such a function the safe way.

    >>> def apply(model, x):
    ...     return model(x)
    >>> analyze_operations(apply).has_orchestration_ops, classify(apply).kind
    (False, 'hybrid')
    """
    key = _key(func)
    entry = _CACHE.get(key)
    if entry is not None and entry.valid(func):
        return entry.summary
    return _classify_slow(func, key)[1]


def classify_target(path_or_module: Any) -> list[tuple[str, Classification]]:
    """``(name, Classification)`` for each function, class and method defined in a ``.py`` file
    or an importable module, in source order (methods as ``Class.method``); ``nablax classify``
    prints them with :func:`format_table`.

    >>> rows = classify_target("json")
    >>> dict(rows)["dumps"].kind
    'pure'
    >>> dict(classify_target("nablax.xcs.markers"))["marker_of"].kind
    'pure'
    """
    return [(name, classify(obj)) for name, obj in definitions(path_or_module)]


def clear_cache() -> None:
    """Forget every classification and parsed source file (after editing code or globals).

    >>> clear_cache()
    """
    _CACHE.clear()
    _source.clear()


# ---- the cache ------------------------------------------------------------------------------


def _key(func: Any) -> Any:
    kind = type(func)
    if kind is types.MethodType:  # a new bound-method object on every attribute access
        return (id(func.__func__), id(func.__self__))
    if kind is types.BuiltinMethodType and not isinstance(func.__self__, types.ModuleType):
        return (type(func.__self__), func.__name__)  # "abc".upper: depends on type and name
    return id(func)


def _fingerprint(func: Any) -> Any:
    """The code object and closure-cell contents a cached answer depends on."""
    kind = type(func)
    if kind is types.MethodType:
        func = func.__func__
        kind = type(func)
    if kind is not types.FunctionType:
        return None
    cells = func.__closure__
    if not cells:  # attributes set later (a marker by hand, __wrapped__) change the dict size
        return (func.__code__, len(func.__dict__))
    try:
        return (func.__code__, len(func.__dict__), tuple([id(c.cell_contents) for c in cells]))
    except ValueError:  # an empty cell: not cacheable yet
        return object()


class _Entry:
    __slots__ = ("refs", "fingerprint", "epoch", "classification", "summary", "analysis")

    def __init__(self, refs: tuple, fingerprint: Any, analysis: Analysis):
        self.refs, self.fingerprint, self.analysis = refs, fingerprint, analysis
        self.epoch = EPOCH[0]
        self.classification, self.summary = _decide(analysis), _summary(analysis)

    def valid(self, func: Any) -> bool:
        if self.epoch != EPOCH[0]:  # something was marked since: markers outrank analysis
            return False
        if type(func) is types.MethodType:
            alive = self.refs[0]() is func.__func__ and self.refs[1]() is func.__self__
        elif type(self.refs[0]) is tuple:  # keyed by (type, name): nothing to check
            return True
        else:
            alive = self.refs[0]() is func
        return alive and _fingerprint(func) == self.fingerprint


def _ref(obj: Any) -> Any:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj  # not weak-referenceable: keep it (the cache is bounded)


def _store(func: Any, key: Any, analysis: Analysis) -> _Entry:
    if type(key) is tuple and isinstance(key[0], type):
        refs: tuple = ((),)
    elif type(func) is types.MethodType:
        refs = (_ref(func.__func__), _ref(func.__self__))
    else:
        refs = (_ref(func),)
    entry = _Entry(refs, _fingerprint(func), analysis)
    _CACHE.put(key, entry)  # a bounded LRU (thread-safe)
    return entry


_CACHE = _caches.Cache("xcs.classifier", _MAX_ENTRIES, register=False)
_caches.register("xcs.classifier", _CACHE.info, clear_cache)


def _classify_slow(func: Any, key: Any) -> tuple[Classification, OperationSummary]:
    if not callable(func):
        raise TypeError(
            f"xcs.classify: argument `func` must be callable, got {type(func).__name__} "
            f"{func!r:.60}. Fix: pass the function itself (classify(fn)), not its result"
        )
    try:
        analysis = _analyze(func, Context(follow=_follow))
    except Exception as exc:  # never let an odd object break the runtime: take the safe route
        analysis = Analysis(uncertain=[f"could not be analyzed ({type(exc).__name__}: {exc})"])
    entry = _store(func, key, analysis)
    return entry.classification, entry.summary


def _follow(target: Any, ctx: Context) -> Analysis:
    """Analyze a helper reached from a function being classified (cache-aware)."""
    if not isinstance(target, types.FunctionType):
        return _analyze(target, ctx)
    entry = _CACHE.get(id(target))
    if entry is not None and entry.valid(target):
        return entry.analysis
    analysis = _analyze(target, ctx)
    if analysis.complete:  # a walk cut by a cycle depends on its caller: not reusable
        _store(target, id(target), analysis)
    return analysis


# ---- dispatch on the kind of callable -------------------------------------------------------


def _analyze(obj: Any, ctx: Context, *, markers: bool = True) -> Analysis:
    """Evidence about ``obj`` in priority order: marker, wrapped function, module, source."""
    if markers and (kind := marker_of(obj)) is not None:
        return _marked(obj, kind, ctx)
    if isinstance(obj, Unbound):
        return _function(obj.func, ctx, cls=obj.cls)
    wrapped = _objects.static_attr(obj, "__wrapped__")
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
    if _objects.is_user_instance(obj):
        return _instance(obj, ctx)
    name = _objects.describe(obj) or type(obj).__name__
    return Analysis(uncertain=[f"{name} has no readable source and comes from an unknown module"])


def _library_rule(obj: Any) -> _rules.Rule | None:
    return _objects.rule_for(obj, _objects.describe(obj))


def _marked(obj: Any, kind: str, ctx: Context) -> Analysis:
    """A marked callable: the marker decides the kind (and ``effects=``, if declared); the source
    still tells traceability and, undeclared, the effects."""
    under = _analyze(obj, ctx, markers=False)
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    traceable = not under.uncertain and all(e.traceable for e in under.evidence)
    out = Analysis(marked=kind, side_effects=under.side_effects, complete=under.complete)
    out.declared_fx = effects_of(obj)
    out.fx_extra = _effects.items(under)
    short = name.rsplit(".", 1)[-1]
    word = _effects.own_name_writes(short) if kind in ("orchestration", "hybrid") else None
    if word is not None and not any(s == _effects.WRITE for s, _ in out.fx_extra):
        out.fx_extra.append((_effects.WRITE, f"its name {short} says it has effects (`{word}`)"))
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
    if ctx.depth >= _resolve.MAX_DEPTH or ctx.visits >= _resolve.MAX_VISITS:
        limit = (
            f"helpers nest deeper than {_resolve.MAX_DEPTH} levels"
            if ctx.depth >= _resolve.MAX_DEPTH
            else f"more than {_resolve.MAX_VISITS} helpers"
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
    out = _analyze(wrapped, ctx)
    if isinstance(obj, types.FunctionType):  # wraps() copied __module__: ask where the code is
        where, rule = _objects.code_rule(obj)
        name = f"a function of {where}"
        if rule is None and not _objects.is_library(obj):
            out.merge(_function(obj, ctx))
            return out
    else:
        name, rule = _objects.describe(obj) or type(obj).__name__, _library_rule(obj)
    if rule is not None and rule.kind != "neutral":
        reason = f"wrapped by {name} ({rule.what})"
        fx = (_effects.UNKNOWN, f"is wrapped by {name} ({rule.what})")
        out.evidence += _resolve.evidence_from_rule(rule, name, reason, fx)
    return out


def _partial(p: functools.partial, ctx: Context) -> Analysis:
    """``functools.partial``: its function, plus clients, arrays or callbacks bound as arguments."""
    out = _analyze(p.func, ctx)
    for i, value in enumerate(itertools.chain(p.args, p.keywords.values())):
        if _objects.user_callable(value):
            out.merge(_follow(value, ctx))
            continue
        rule = _objects.rule_for(value, _objects.describe(value))
        if rule is not None and rule.kind != "neutral" and not isinstance(value, type):
            what = f"bound argument {i} is a {_objects.describe(value)} ({rule.what})"
            out.evidence += _resolve.evidence_from_rule(rule, _objects.describe(value), what)
    return out


def _library(obj: Any, rule: _rules.Rule) -> Analysis:
    """A callable from a known library or the standard library, judged by its module."""
    name = _display_name(obj)
    if rule.kind == "neutral":
        if name.startswith("builtins."):
            return Analysis(notes=[f"{name.removeprefix('builtins.')} is a pure Python builtin"])
        where = "standard-library" if name.split(".")[0] in _rules.STDLIB else "library"
        return Analysis(notes=[f"{name} is {where} code without I/O"])
    name = name.removeprefix("builtins.")
    if rule.kind == "unknown":  # exec, eval
        return Analysis(uncertain=[f"{name} {rule.what}"])
    if rule.kind == "tensor":
        reason = f"{name} is a {rule.what} operation (by its module)"
    else:
        reason = f"{name} does {rule.what} (by its module)"
    fx = _effects.of_object(name, rule) if rule.kind == "orchestration" else ("", "")
    return Analysis(evidence=_resolve.evidence_from_rule(rule, name, reason, fx))


def _display_name(obj: Any) -> str:
    """``numpy.add``, ``os.remove``: the module and name users know, else the dotted type."""
    mod, name = getattr(obj, "__module__", None), getattr(obj, "__name__", None)
    if isinstance(mod, str) and isinstance(name, str) and not isinstance(obj, types.MethodType):
        return _rules.canonical(f"{mod}.{getattr(obj, '__qualname__', name)}")
    return _objects.describe(obj) or repr(obj)


def _class(cls: type, ctx: Context) -> Analysis:
    """A class: its ``__call__`` if it defines one, else all its methods together."""
    out = Analysis()
    for base in cls.__mro__[1:]:
        rule = _objects.rule_for(base, _objects.describe(base))
        if rule is not None and rule.kind != "neutral":
            reason = f"subclasses {_objects.describe(base)} ({rule.what})"
            fx = _effects.of_object(_objects.describe(base) or "", rule)
            out.evidence += _resolve.evidence_from_rule(rule, _objects.describe(base), reason, fx)
            return out
    call = _objects.static_attr(cls, "__call__")
    if isinstance(call, types.FunctionType) and not _objects.is_library(call):
        out.merge(_function(call, ctx, cls=cls))
        return out
    for klass in [k for k in cls.__mro__ if _objects.is_user_class(k)]:
        for attr in list(vars(klass).values()):
            fn = getattr(attr, "__func__", attr)
            if _objects.has_source_file(fn) and not _objects.is_library(fn):
                out.merge(_function(fn, ctx, cls=cls))
    return out


def _instance(obj: Any, ctx: Context) -> Analysis:
    """A callable object: its class's library base, or its ``__call__`` with ``self`` bound."""
    cls = type(obj)
    call = _objects.static_attr(cls, "__call__")
    if isinstance(call, types.FunctionType) and not _objects.is_library(call):
        return _function(call, ctx, self_obj=obj)
    return _class(cls, ctx)


# ---- from evidence to a Classification ------------------------------------------------------


def _kind(a: Analysis) -> str:
    if a.marked is not None:
        return a.marked
    kinds = a.kinds()
    if len(kinds) == 2:
        return "hybrid"
    if kinds:
        return kinds.pop()
    return "hybrid" if a.uncertain else "pure"


def _decide(a: Analysis) -> Classification:
    kind = _kind(a)
    tensor = [e for e in a.evidence if e.kind == "tensor"]
    traceable = (
        kind == "tensor"
        and all(e.traceable for e in tensor)
        and not a.side_effects
        and not a.uncertain
    )
    effects, why = _effects.decide(a, kind, a.marked)
    reasons = _reasons(a, kind) + ((why,) if why else ())
    return Classification(kind, reasons, traceable, effects)


def _reasons(a: Analysis, kind: str) -> tuple[str, ...]:
    if a.marked is not None:
        first = [e.reason for e in a.evidence[:1]] or [f"marked with @mark_{a.marked}"]
        return tuple(first)
    if kind == "pure":
        uses = sorted({n for n in a.notes if " " not in n})[:4]
        told = [n for n in a.notes if " " in n]
        extra = f" (uses only plain Python: {', '.join(uses)})" if uses else ""
        return tuple(told or [f"no tensor or I/O operations found in its source{extra}"])
    if not a.evidence:  # hybrid by default
        return (*a.uncertain[:_MAX_REASONS], "routed as hybrid, the safe choice")
    ordered = sorted(a.evidence, key=_resolve.rank)
    by_kind = {k: [e.reason for e in ordered if e.kind == k] for k in ("orchestration", "tensor")}
    firsts = [r[0] for r in by_kind.values() if r]  # one of each kind first (hybrids)
    rest = [e.reason for e in ordered if e.reason not in firsts]
    reasons = list(dict.fromkeys(firsts + rest))
    if len(reasons) > _MAX_REASONS:
        reasons = reasons[: _MAX_REASONS - 1] + [f"... and {len(reasons) - _MAX_REASONS + 1} more"]
    if kind == "tensor" and a.side_effects and not any("side effect" in r for r in reasons):
        reasons.append(f"not JAX-traceable: side effect ({a.side_effects[0]})")
    return tuple(reasons)


def _summary(a: Analysis) -> OperationSummary:
    """The operations found, by kind: ``{"marked"}`` for a marker, else the evidence's names
    (nothing for what is only uncertain: the seed's summaries hold no placeholder)."""
    if a.marked is not None:
        kind = a.marked
        marked = {"tensor": kind in ("tensor", "hybrid"), "orchestration": kind in _ORCH}
        return OperationSummary(
            *(frozenset({"marked"}) if marked[k] else frozenset() for k in _OPS)
        )
    ops = [frozenset(o for e in a.evidence if e.kind == k for o in e.ops or (e.op,)) for k in _OPS]
    return OperationSummary(*ops)


_OPS = ("tensor", "orchestration")
_ORCH = ("orchestration", "hybrid")

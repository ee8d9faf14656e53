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
outside the program (see :mod:`.effects`): declared by ``@mark_orchestration(effects=
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

import types
import weakref
from typing import Any

from ... import _caches
from ..markers import EPOCH
from . import source, verdict
from .callables import analyze
from .records import Analysis, Classification, Context, OperationSummary
from .target import definitions, format_table

__all__ = [
    "Classification",
    "OperationSummary",
    "analyze_operations",
    "classify",
    "classify_target",
    "clear_cache",
    "format_table",
]

_MAX_ENTRIES = 4096


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
    source.clear()


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
        self.classification, self.summary = verdict.decide(analysis), verdict.summary(analysis)

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
        analysis = analyze(func, Context(follow=_follow))
    except Exception as exc:  # never let an odd object break the runtime: take the safe route
        analysis = Analysis(uncertain=[f"could not be analyzed ({type(exc).__name__}: {exc})"])
    entry = _store(func, key, analysis)
    return entry.classification, entry.summary


def _follow(target: Any, ctx: Context) -> Analysis:
    """Analyze a helper reached from a function being classified (cache-aware)."""
    if not isinstance(target, types.FunctionType):
        return analyze(target, ctx)
    entry = _CACHE.get(id(target))
    if entry is not None and entry.valid(target):
        return entry.analysis
    analysis = analyze(target, ctx)
    if analysis.complete:  # a walk cut by a cycle depends on its caller: not reusable
        _store(target, id(target), analysis)
    return analysis

"""Markers: tell ``nablax.xcs`` what kind of function something is, overriding the classifier.

A marker is an attribute recorded on the callable (``__xcs_kind__``, ``__xcs_effects__``,
``__xcs_pytree_safe__``). When the object cannot take attributes (a bound method, a builtin, a
class with ``__slots__``) the decorator returns a ``functools.wraps`` wrapper that carries the
marker instead. The seed's attributes, set by hand or by Ember's decorators, are honoured too:
``_xcs_is_tensor`` / ``_xcs_is_orchestration`` / ``_xcs_is_hybrid`` (True on both tensor and
orchestration, or ``_xcs_is_hybrid``, means hybrid; all present ones False means pure) and
``_xcs_is_pytree_safe``.

>>> from nablax.xcs.markers import mark_orchestration, marker_of
>>> @mark_orchestration
... def ask(prompt):
...     return prompt.upper()
>>> marker_of(ask)
'orchestration'
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

KINDS = ("tensor", "orchestration", "hybrid", "pure")
KIND_ATTR = "__xcs_kind__"
EFFECTS_ATTR = "__xcs_effects__"
PYTREE_ATTR = "__xcs_pytree_safe__"
SEED_ATTRS = ("_xcs_is_hybrid", "_xcs_is_tensor", "_xcs_is_orchestration")
_MAX_CHAIN = 64  # wrapper chains longer than this are treated as cyclic
EPOCH = [0]  # bumped by every marker: cached classifications made before it are re-checked

__all__ = [
    "mark_tensor",
    "mark_orchestration",
    "mark_hybrid",
    "mark_pytree_safe",
    "marker_of",
    "effects_of",
    "pytree_safe",
]


def _describe(obj: Any) -> str:
    return f"{type(obj).__name__} {obj!r}"[:80]


def _record(obj: Any, attrs: dict[str, Any], api: str) -> Any:
    """Set ``attrs`` on ``obj``; objects that refuse attributes get a wrapper carrying them."""
    if not callable(obj):
        raise TypeError(
            f"xcs.{api}: the decorated object must be callable, got {_describe(obj)}. "
            f"Fix: apply @{api} to a function, method, class or callable object"
        )
    EPOCH[0] += 1
    try:
        for attr, value in attrs.items():
            setattr(obj, attr, value)
        return obj
    except (AttributeError, TypeError):
        pass

    @functools.wraps(obj)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return obj(*args, **kwargs)

    for attr, value in attrs.items():
        setattr(wrapper, attr, value)
    return wrapper


def _kind_marker(kind: str, with_effects: bool) -> Callable[..., Any]:
    api = f"mark_{kind}"

    def mark(f: F | None = None, **options: Any) -> F | Callable[[F], F]:
        attrs: dict[str, Any] = {KIND_ATTR: kind}
        if options:
            effects = options.pop("effects", None)
            if options or not with_effects:
                bad = next(iter(options or {"effects": effects}))
                raise TypeError(
                    f"xcs.{api}: unexpected keyword argument `{bad}`. Fix: "
                    + (
                        "the only option is effects=True|False"
                        if with_effects
                        else "effects=... is declared with @mark_orchestration or @mark_hybrid"
                    )
                )
            if not isinstance(effects, bool):
                raise TypeError(
                    f"xcs.{api}: argument `effects` must be True or False, got "
                    f"{_describe(effects)}. Fix: @{api}(effects=True) for calls that write, "
                    f"send or delete; @{api}(effects=False) for read-only calls"
                )
            attrs[EFFECTS_ATTR] = effects
        if f is None:  # used as @mark_x() or @mark_x(effects=...)
            return lambda g: _record(g, attrs, api)
        return _record(f, attrs, api)

    mark.__name__ = mark.__qualname__ = api
    return mark


mark_tensor = _kind_marker("tensor", False)
mark_tensor.__doc__ = """Mark ``f`` as tensor code: ``xcs`` routes it to the tensor engine (XLA).

>>> @mark_tensor
... def step(x):
...     return x * 2
>>> marker_of(step)
'tensor'
"""

mark_orchestration = _kind_marker("orchestration", True)
mark_orchestration.__doc__ = """Mark ``f`` as orchestration code (I/O, LLM or HTTP calls): ``xcs``
runs it on its concurrent executor, never under a tensor tracer.

``@mark_orchestration(effects=True)`` declares that its calls change something outside the
program (writes, sends, deletes): ``xcs.jit`` then starts them only after every earlier call
succeeded. ``effects=False`` declares them read-only (they may start early). Undeclared, the
classifier infers it (``classify(f).effects``, with the reason).

>>> import functools
>>> @mark_orchestration
... def fetch(url, timeout=1.0):
...     return url
>>> marker_of(functools.partial(fetch, timeout=5.0))
'orchestration'
>>> @mark_orchestration(effects=True)
... def send(message):
...     return message
>>> effects_of(send), effects_of(fetch)
(True, None)
"""

mark_hybrid = _kind_marker("hybrid", True)
mark_hybrid.__doc__ = """Mark ``f`` as hybrid: it mixes orchestration calls with tensor code.
``@mark_hybrid(effects=True|False)`` declares its effects, as for :func:`mark_orchestration`.

>>> class Scorer:
...     def __call__(self, text):
...         return len(text)
>>> marker_of(mark_hybrid(Scorer)())
'hybrid'
>>> effects_of(mark_hybrid(effects=False)(Scorer))
False
"""


def mark_pytree_safe(flag: bool | Callable[..., Any] = True) -> Callable[[F], F] | Any:
    """Record whether ``f`` accepts and returns pytrees of tensors safely (``flag``).

    Use as ``@mark_pytree_safe`` or ``@mark_pytree_safe(False)``; read it with :func:`pytree_safe`.

    >>> @mark_pytree_safe(False)
    ... def summarize(batch):
    ...     return str(batch)
    >>> pytree_safe(summarize)
    False
    """
    if callable(flag) and not isinstance(flag, bool):  # bare @mark_pytree_safe
        return _record(flag, {PYTREE_ATTR: True}, "mark_pytree_safe")
    if not isinstance(flag, bool):
        raise TypeError(
            f"xcs.mark_pytree_safe: argument `flag` must be a bool, got {_describe(flag)}. "
            "Fix: use @mark_pytree_safe or @mark_pytree_safe(False)"
        )
    return lambda f: _record(f, {PYTREE_ATTR: flag}, "mark_pytree_safe")


def _static(obj: Any, name: str) -> Any:
    """``obj.name`` without running user ``__getattr__`` or properties (markers are plain data)."""
    if isinstance(obj, types.FunctionType):
        return obj.__dict__.get(name)
    try:
        return inspect.getattr_static(obj, name, None)
    except Exception:  # exotic metaclasses; a marker lookup must never raise
        return None


def _next_links(obj: Any) -> list[Any]:
    """The callables behind ``obj``: wrapped function, partial target, method function, class."""
    links = []
    if isinstance(obj, types.MethodType):
        links.append(obj.__func__)
    elif isinstance(obj, functools.partial):
        links.append(obj.func)
    wrapped = _static(obj, "__wrapped__")
    if callable(wrapped) and not isinstance(wrapped, (property, types.MemberDescriptorType)):
        links.append(wrapped)
    plain = (type, types.FunctionType, types.MethodType, types.BuiltinFunctionType)
    if not isinstance(obj, plain):
        links.append(type(obj))  # a callable instance: its class may carry the marker
    if isinstance(obj, type):
        call = obj.__dict__.get("__call__")
        if call is not None:
            links.append(call)
    return links


def _find(obj: Any, attr: str, seed: Callable[[Any], Any] | None = None) -> Any:
    """First marker value found walking ``obj`` and what it wraps (breadth first, cycle-safe);
    ``seed(cur)`` reads the seed's attributes where ``attr`` is not set."""
    seen: set[int] = set()
    queue = [obj]
    while queue and len(seen) < _MAX_CHAIN:
        cur = queue.pop(0)
        if id(cur) in seen:
            continue
        seen.add(id(cur))
        value = _static(cur, attr)
        if value is not None and not isinstance(value, (property, types.MemberDescriptorType)):
            return value
        value = seed(cur) if seed is not None else None
        if value is not None:
            return value
        queue.extend(_next_links(cur))
    return None


def _seed_kind(obj: Any) -> str | None:
    """The kind the seed's ``_xcs_is_*`` attributes give, or None if none is set."""
    flags = {}
    for attr in SEED_ATTRS:
        value = _static(obj, attr)
        if isinstance(value, bool):
            flags[attr.removeprefix("_xcs_is_")] = value
    if not flags:
        return None
    if flags.get("hybrid") or (flags.get("tensor") and flags.get("orchestration")):
        return "hybrid"
    if flags.get("tensor"):
        return "tensor"
    return "orchestration" if flags.get("orchestration") else "pure"


def _seed_pytree(obj: Any) -> bool | None:
    value = _static(obj, "_xcs_is_pytree_safe")
    return value if isinstance(value, bool) else None


def marker_of(f: Any) -> str | None:
    """The kind ``f`` was marked with, or ``None``; seen through ``functools.wraps`` chains,
    ``functools.partial``, bound methods and callable objects (their class and ``__call__``).

    >>> import functools
    >>> @functools.lru_cache
    ... @mark_tensor
    ... def norm(x):
    ...     return x
    >>> marker_of(norm), marker_of(len)
    ('tensor', None)
    """
    kind = _find(f, KIND_ATTR, _seed_kind)
    return kind if kind in KINDS else None


def effects_of(f: Any) -> bool | None:
    """The ``effects=`` declared with :func:`mark_orchestration` / :func:`mark_hybrid` (through
    wrappers, partials and bound methods), or ``None`` if undeclared.

    >>> effects_of(mark_orchestration(effects=False)(lambda url: url)), effects_of(len)
    (False, None)
    """
    value = _find(f, EFFECTS_ATTR)
    return value if isinstance(value, bool) else None


def pytree_safe(f: Any) -> bool | None:
    """What :func:`mark_pytree_safe` recorded for ``f`` (through wrappers), or ``None`` if unset.

    >>> pytree_safe(len) is None
    True
    """
    value = _find(f, PYTREE_ATTR, _seed_pytree)
    return value if isinstance(value, bool) else None

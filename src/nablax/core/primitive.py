"""The ``Primitive`` record and the registry of all primitives.

A primitive is one declarative record holding every rule nablax knows about it, all given when it
is created: the shape/dtype rule (``abstract_eval``), the lowering to ``jax.lax``/``jax.numpy``
(``lower``), and the JVP, VJP (transpose), batching and sharding rules that the transforms use.
Records are frozen: no module attaches a rule later, so the call that creates a primitive is the
one place to read all of it. Interpreters look rules up in the record, never by name; a missing
rule raises :class:`MissingRuleError` naming the transform and the primitive. The array
primitives live in ``nablax.core.prims``; composite ops (softmax, var, ...) are plain Python
functions over them (``nablax.core.ops``) and need no record.

Rule signatures (``params`` is the node's hashable tuple of static parameters):

- ``abstract_eval(params, *avals) -> tuple[Aval, ...]`` where an ``Aval`` is ``(shape, dtype)``;
- ``lower(params, *jax_values) -> jax value`` (a tuple when ``multiple_results``);
- ``jvp(params, tangents, primals, outs)`` and ``vjp(params, cts, primals, outs)``:
  core/prims/_rules.py;
- ``batch(params, bds, *values)``: core/prims/_batch.py;
- ``shard(params, layouts, in_avals, out_avals)``: core/prims/_shard.py.

Rules shared by a family (the element-wise derivative from a table of partials, ``jax.vmap`` of
the lowering, rules derived from JAX) need the record they belong to: ``rules=`` takes a function
of the new record that returns them (``{"jvp": ..., "batch": ...}``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from .._caches import Cache
from ..errors import NablaxError

Aval = tuple  # (shape: tuple[int, ...], dtype: np.dtype)
RuleFactory = Callable[["Primitive"], dict[str, Callable]]  # the new record -> {kind: rule}


class MissingRuleError(NablaxError, NotImplementedError):
    """A transform met a primitive that has no rule for it."""


class Primitive:
    """One primitive operation and all of its rules."""

    __slots__ = (
        "name",
        "abstract_eval",
        "lower",
        "multiple_results",
        "jvp",
        "vjp",
        "batch",
        "shard",
        "differentiable",
        "doc",
        "module",
    )

    name: str
    abstract_eval: Callable[..., tuple]
    lower: Callable[..., Any]
    multiple_results: bool
    differentiable: bool
    doc: str
    module: str  # the module that created the record (where its rules are written)
    jvp: Callable | None
    vjp: Callable | None
    batch: Callable | None
    shard: Callable | None

    def __init__(
        self,
        name: str,
        abstract_eval: Callable[..., tuple],
        lower: Callable[..., Any],
        *,
        jvp: Callable | None = None,
        vjp: Callable | None = None,
        batch: Callable | None = None,
        shard: Callable | None = None,
        rules: RuleFactory | tuple[RuleFactory, ...] | None = None,
        multiple_results: bool = False,
        differentiable: bool = True,
        doc: str = "",
    ) -> None:
        init = object.__setattr__
        init(self, "name", name)
        init(self, "abstract_eval", abstract_eval)
        init(self, "lower", lower)
        init(self, "multiple_results", multiple_results)
        init(self, "differentiable", differentiable)
        init(self, "doc", doc)
        frame = sys._getframe(1)
        while frame.f_globals.get("__name__") == __name__:  # called through primitive()
            frame = frame.f_back  # type: ignore[assignment]
        init(self, "module", frame.f_globals.get("__name__", "?"))
        given = {"jvp": jvp, "vjp": vjp, "batch": batch, "shard": shard}
        for kind, r in given.items():
            init(self, kind, r)
        factories = rules if isinstance(rules, tuple) else (rules,) if rules else ()
        for factory in factories:  # a family's shared rules, made for this record
            for kind, r in factory(self).items():
                if kind not in given:
                    raise TypeError(f"nablax: unknown rule kind {kind!r} for primitive {name!r}")
                if given[kind] is None:  # a rule given by name wins over the family's
                    init(self, kind, r)

    def __setattr__(self, attr: str, value: Any) -> None:
        raise AttributeError(
            f"nablax: primitive {self.name!r} is a frozen record; give its {attr} rule to "
            f"primitive(...) where it is created"
        )

    def rule(self, kind: str) -> Callable:
        """The rule of ``kind`` (``"jvp"``, ``"vjp"``, ``"batch"``, ``"shard"``) or a clear error."""
        r = getattr(self, kind)
        if r is None:
            raise MissingRuleError(
                f"nablax: primitive {self.name!r} has no {kind} rule, so the {kind} transform cannot "
                f"run through it. Give it to the primitive's record (nablax/core/prims/)."
            )
        return r

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


REGISTRY: dict[str, Primitive] = {}  # name -> record, filled at import by primitive(...)

# Primitives made from others on demand (``vjp[exp]`` derived from JAX's derivative of a lowering,
# a kernel's second-order ``kernel_vjp[...]``): one record per key, in a bounded registered store
# that ``nx.clear_caches()`` empties. A record dropped from it is made again when next needed;
# nodes hold their record, and structure keys compare records by identity, so a re-made one can
# only cost a compile, never reuse a program of another.
DERIVED = Cache("core.derived_primitives", 4096)


def derived(key: tuple, make: Callable[[], Primitive]) -> Primitive:
    """The derived primitive of ``key`` (made by ``make()`` the first time)."""
    return DERIVED.get_or_make(key, make)


def all_primitives() -> list[Primitive]:
    """Every primitive record: the registry's, then the derived ones made so far (what the
    registry-generated tests check)."""
    return list(REGISTRY.values()) + list(DERIVED.values())


def zero_jvp(params, tangents, primals, outs):
    """The JVP of a primitive with a zero derivative (integer, index and random-bit outputs)."""
    return [None] * len(outs)


def zero_vjp(params, cts, primals, outs):
    """The VJP of a primitive with a zero derivative."""
    return [None] * len(primals)


def primitive(
    name: str,
    abstract_eval: Callable[..., tuple],
    lower: Callable[..., Any],
    **kw: Any,
) -> Primitive:
    """Create a primitive and add it to the registry (names are unique)."""
    if name in REGISTRY:
        raise ValueError(f"nablax: primitive {name!r} is already registered")
    p = Primitive(name, abstract_eval, lower, **kw)
    REGISTRY[name] = p
    return p

"""The ``Primitive`` record and the registry of all primitives.

A primitive is one record holding every rule nablax knows about it: the shape/dtype rule
(``abstract_eval``), the lowering to ``jax.lax``/``jax.numpy`` (``lower``), and slots for the JVP, VJP
(transpose), batching and sharding rules that the transforms use. Interpreters look rules up in the
record, never by name; a missing rule raises :class:`MissingRuleError` naming the transform and the
primitive. Composite ops (softmax, var, ...) are plain Python functions over primitives and need no
record.

Rule signatures (``params`` is the node's hashable tuple of static parameters):

- ``abstract_eval(params, *avals) -> tuple[Aval, ...]`` where an ``Aval`` is ``(shape, dtype)``;
- ``lower(params, *jax_values) -> jax value`` (a tuple when ``multiple_results``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import NablaxError

Aval = tuple  # (shape: tuple[int, ...], dtype: np.dtype)


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
    )

    def __init__(
        self,
        name: str,
        abstract_eval: Callable[..., tuple],
        lower: Callable[..., Any],
        *,
        multiple_results: bool = False,
        differentiable: bool = True,
        doc: str = "",
    ) -> None:
        self.name = name
        self.abstract_eval = abstract_eval
        self.lower = lower
        self.multiple_results = multiple_results
        self.differentiable = differentiable
        self.doc = doc
        self.jvp: Callable | None = None
        self.vjp: Callable | None = None
        self.batch: Callable | None = None
        self.shard: Callable | None = None

    def rule(self, kind: str) -> Callable:
        """The rule of ``kind`` (``"jvp"``, ``"vjp"``, ``"batch"``, ``"shard"``) or a clear error."""
        r = getattr(self, kind)
        if r is None:
            raise MissingRuleError(
                f"nablax: primitive {self.name!r} has no {kind} rule, so the {kind} transform cannot "
                f"run through it. Define it next to the primitive in nablax/core/ops/."
            )
        return r

    def __repr__(self) -> str:
        return f"Primitive({self.name})"


REGISTRY: dict[str, Primitive] = {}


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

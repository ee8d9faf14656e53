"""The records the classifier passes around, at the bottom of :mod:`nablax.xcs.classify`
(nothing here imports the rest of the package, so every module above may use them):

- :class:`Rule`: what a library name means (``rules.py`` holds the table);
- the effect statuses :data:`WRITE`, :data:`READ`, :data:`UNKNOWN` of one I/O operation;
- :class:`Evidence` (one fact found), :class:`Analysis` (everything found about one callable)
  and :class:`Context` (the state of one top-level classification);
- :class:`Classification` and :class:`OperationSummary`, the answers ``xcs.classify`` and
  ``xcs.analyze_operations`` give (re-exported by :mod:`nablax.xcs`);
- :data:`MISSING`, the "no such object" marker of the static reads.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()

# the effect status of one orchestration operation (see effects.py)
WRITE, READ, UNKNOWN = "write", "read", "unknown"


@dataclass(frozen=True)
class Rule:
    """``kind``: "tensor", "orchestration" or "neutral"; ``what``: words for the reasons;
    ``traceable``: tensor work JAX can trace (JAX, nablax), not host NumPy/PyTorch."""

    kind: str
    what: str
    traceable: bool = False


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
    fx: str = ""  # orchestration: "write", "read" or "unknown" (see effects.py)
    fx_why: str = ""
    weak: bool = False  # from a method name or a keyword, not from a resolved object


@dataclass
class Analysis:
    """Everything found about one callable; :mod:`.verdict` turns it into a Classification."""

    evidence: list[Evidence] = field(default_factory=list)
    uncertain: list[str] = field(default_factory=list)  # why the answer would be a guess
    side_effects: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    marked: str | None = None
    complete: bool = True  # False when a cycle or the depth limit cut the walk below the top
    declared_fx: bool | None = None  # effects=... given to a marker
    fx_extra: list[tuple[str, str]] = field(default_factory=list)  # (status, why) not in evidence

    def kinds(self) -> set[str]:
        return {e.kind for e in self.evidence}

    def merge(self, other: Analysis) -> None:
        self.evidence += [e for e in other.evidence if e not in self.evidence]
        self.uncertain += [u for u in other.uncertain if u not in self.uncertain]
        self.side_effects += other.side_effects
        self.notes += other.notes
        self.fx_extra += [f for f in other.fx_extra if f not in self.fx_extra]
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

"""The evidence a classification rests on: one ``Evidence`` per fact found (a library call, a
helper, a method name, a keyword), gathered into an ``Analysis`` per callable.

Internal to :mod:`nablax.xcs.analysis` (:mod:`._resolve` produces them, :mod:`._effects` reads
their effect status).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import _effects, _rules


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
    fx: str = ""  # orchestration: "write", "read" or "unknown" (see _effects)
    fx_why: str = ""
    weak: bool = False  # from a method name or a keyword, not from a resolved object


@dataclass
class Analysis:
    """Everything found about one callable; :mod:`analysis` turns it into a Classification."""

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


def evidence_from_rule(
    rule: _rules.Rule, op: str, reason: str, fx: tuple[str, str] = ("", ""), weak: bool = False
) -> list[Evidence]:
    if rule.kind not in ("tensor", "orchestration"):
        return []
    fx = fx if rule.kind == "orchestration" else ("", "")
    return [
        Evidence(rule.kind, op, reason, rule.traceable, (op,), fx=fx[0], fx_why=fx[1], weak=weak)
    ]


def rank(e: Evidence) -> tuple[bool, bool, bool]:
    """Order of reasons: calls first; keyword and method-name guesses, imports and dtype
    constants (np.float32) say least."""
    leaf = e.leaf or e.reason
    return e.weak, leaf.startswith("imports "), "constant" in leaf


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
        fx = _effects.summary(sub, name, at) if kind == "orchestration" else ("", "")
        weak = all(e.weak for e in found)
        out.append(Evidence(kind, name, reason, traceable, ops, leaf, via, *fx, weak=weak))
    return out

"""From evidence to an answer: the kind (markers first; both kinds make a hybrid; nothing found
but something unknown makes the safe ``"hybrid"``), JAX-traceability, the effects (:mod:`.effects`)
and the reasons (one of each kind first, the strongest evidence before guesses), as a
:class:`~.records.Classification`; and the operations found, as an
:class:`~.records.OperationSummary`.

Internal to :mod:`nablax.xcs.classify`.
"""

from __future__ import annotations

from . import effects
from .evidence import rank
from .records import Analysis, Classification, OperationSummary

_MAX_REASONS = 6


def _kind(a: Analysis) -> str:
    if a.marked is not None:
        return a.marked
    kinds = a.kinds()
    if len(kinds) == 2:
        return "hybrid"
    if kinds:
        return kinds.pop()
    return "hybrid" if a.uncertain else "pure"


def decide(a: Analysis) -> Classification:
    kind = _kind(a)
    tensor = [e for e in a.evidence if e.kind == "tensor"]
    traceable = (
        kind == "tensor"
        and all(e.traceable for e in tensor)
        and not a.side_effects
        and not a.uncertain
    )
    has_effects, why = effects.decide(a, kind, a.marked)
    reasons = _reasons(a, kind) + ((why,) if why else ())
    return Classification(kind, reasons, traceable, has_effects)


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
    ordered = sorted(a.evidence, key=rank)
    by_kind = {k: [e.reason for e in ordered if e.kind == k] for k in ("orchestration", "tensor")}
    firsts = [r[0] for r in by_kind.values() if r]  # one of each kind first (hybrids)
    rest = [e.reason for e in ordered if e.reason not in firsts]
    reasons = list(dict.fromkeys(firsts + rest))
    if len(reasons) > _MAX_REASONS:
        reasons = reasons[: _MAX_REASONS - 1] + [f"... and {len(reasons) - _MAX_REASONS + 1} more"]
    if kind == "tensor" and a.side_effects and not any("side effect" in r for r in reasons):
        reasons.append(f"not JAX-traceable: side effect ({a.side_effects[0]})")
    return tuple(reasons)


def summary(a: Analysis) -> OperationSummary:
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

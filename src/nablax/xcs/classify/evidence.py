"""Making and weighing evidence: one :class:`~.records.Evidence` per fact found (a library call,
a helper, a method name, a keyword) from the rule that matched (:func:`evidence_from_rule`), the
order in which reasons are told (:func:`rank`), and a helper's whole analysis as evidence of its
caller (:func:`summarize`).

Internal to :mod:`nablax.xcs.classify` (:mod:`.function` and :mod:`.callables` produce evidence,
:mod:`.effects` reads its effect status).
"""

from __future__ import annotations

from . import effects
from .records import Analysis, Evidence, Rule


def evidence_from_rule(
    rule: Rule, op: str, reason: str, fx: tuple[str, str] = ("", ""), weak: bool = False
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
        fx = effects.summary(sub, name, at) if kind == "orchestration" else ("", "")
        weak = all(e.weak for e in found)
        out.append(Evidence(kind, name, reason, traceable, ops, leaf, via, *fx, weak=weak))
    return out

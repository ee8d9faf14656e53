"""Evidence from one Python function: each name chain its source uses, resolved
(:mod:`.resolve`), becomes evidence of a kind: a library rule, a helper followed (its own analysis
summarized), an LLM SDK ending, a method name (``.fetchall()``, ``.sum()``), an SQL literal
(``c.execute("INSERT ...")``) and, last, the keyword fallback (:mod:`.keywords`). Every
orchestration operation gets an effect status (:mod:`.effects`).

Internal to :mod:`nablax.xcs.classify` (:mod:`.callables` runs a :class:`FunctionAnalyzer` for
each function it meets).
"""

from __future__ import annotations

import sys
import types
from typing import Any

from . import effects, keywords, rules, source, verbs
from .evidence import evidence_from_rule, summarize
from .objects import annotation_names, is_user_instance, rule_for, user_callable
from .records import MISSING, UNKNOWN, WRITE, Analysis, Context, Evidence, Rule
from .resolve import Resolver, Unbound, Value, from_path
from .source import CALL, ITEM, Ref


class FunctionAnalyzer(Resolver):
    """Source (or bytecode) analysis of one Python function, with ``self`` bound if known."""

    def __init__(self, func: types.FunctionType, ctx: Context, self_obj: Any = MISSING, cls=None):
        super().__init__(func, ctx, self_obj, cls)
        self.result = Analysis()
        self._followed: dict[Any, Any] = {}

    def _follow(self, target: Any, ref: Ref) -> None:
        if isinstance(target, types.MethodType):
            key: Any = (id(target.__func__), id(target.__self__))
        else:
            key = id(target.func if isinstance(target, Unbound) else target)
        if key in self._followed:  # each helper once per function: one reason, one walk
            return
        self._followed[key] = target  # held, so that no id is reused while analyzing
        sub = self.ctx.follow(target, self.ctx)
        for e in summarize(ref.text, ref.line, sub):
            if e not in self.result.evidence:
                self.result.evidence.append(e)
        self.result.uncertain += [u for u in sub.uncertain if u not in self.result.uncertain]
        self.result.side_effects += sub.side_effects
        self.result.complete = self.result.complete and sub.complete

    def ref_evidence(self, ref: Ref) -> None:
        """Evidence of one name chain: a library rule, a helper to follow, or a method-name hint."""
        val = self.walk(ref.names, ref)
        self._item_call(ref)
        if not ref.called and val.obj is not MISSING and user_callable(val.obj):
            self._follow(val.obj, ref)  # passed along, as in pool.map(fetch, urls)
        elif val.hit is not None and val.hit[2] == 0 and ref.names[0] in self.facts.assigns:
            return  # a local variable passed around (`return x[0]`): counted where it was made
        elif val.hit is not None and val.ann is not None and len(ref.names) == 1:
            return  # an annotated parameter passed along (print(x)): the annotation says little
        elif val.hit is not None:
            self._rule_evidence(ref, val)
        elif val.obj is MISSING and val.cls is None and not val.followed:
            if not self._hints(ref) and ref.awaited:
                why = f"awaits {ref.text} at line {ref.line} (an async call: probably I/O)"
                k = ref.names.index(CALL) - 1 if CALL in ref.names[1:] else len(ref.names) - 1
                fx = self._fx(ref, k, Rule("orchestration", "an async call"))
                self.result.evidence += evidence_from_rule(keywords.CLIENT, ref.text, why, fx)

    def _fx(self, ref: Ref, index: int, rule: Rule) -> tuple[str, str]:
        text = Ref(ref.names[: index + 1], ref.line).text
        return effects.of_call(
            ref.names, index, rule, ref.args_at(index), self._string, f"{text} at line {ref.line}"
        )

    def _rule_evidence(self, ref: Ref, val: Value) -> None:
        rule, path, index = val.hit
        names = ref.names[: index + 1]
        text = Ref(names, ref.line).text
        called = index + 1 < len(ref.names) and ref.names[index + 1] == CALL
        if rule.kind == "neutral":
            if called:
                self.result.notes.append(text)
            return
        if rule.kind == "unknown":  # exec / eval
            if called:
                self.result.uncertain.append(f"calls {text} at line {ref.line} ({rule.what})")
            return
        verb = "imports" if ref.imported else "calls" if called else "uses"
        detail = f"; {val.root}" if val.root and len(names) > 1 else ""
        reason = f"{verb} {text} ({rule.what}{detail}) at line {ref.line}"
        fx = self._fx(ref, index, rule) if rule.kind == "orchestration" else ("", "")
        if ref.imported or (not called and names[-1].isupper()):
            fx = ("", "")  # importing a module, reading a constant (socket.AF_INET): no call
        self.result.evidence += evidence_from_rule(rule, text, reason, fx)
        for name in ref.names[index + 1 :] if rule.kind == "tensor" else ():
            host = rules.METHOD_HINTS.get(name)
            if host is not None and host.kind == "tensor" and not host.traceable:
                why = f"calls .{name}() on its result at line {ref.line} ({host.what})"
                self.result.evidence += evidence_from_rule(host, f"{text}(...).{name}", why)

    def _hints(self, ref: Ref) -> bool:
        """Chains on unknown objects (parameters, call results, placeholders): LLM SDK endings,
        method names (``.fetchall()``, ``.sum()``) and, failing those, the keyword fallback."""
        found = self._io_hint(ref)
        names = ref.names
        for i in range(found + 1 if found >= 0 else 1, len(names)):
            if rules.METHOD_HINTS.get(names[i]) is rules.ARRAY_METHOD:
                verb = "calls" if i + 1 < len(names) and names[i + 1] == CALL else "uses"
                text = Ref(names[: i + 1], ref.line).text
                why = (
                    f"{verb} {text} at line {ref.line} (.{names[i]} is an array method or "
                    "attribute, which no builtin type has: the value is an array)"
                )
                self.result.evidence += evidence_from_rule(rules.ARRAY_METHOD, text, why, weak=True)
                return True
        if found >= 0:
            return True
        name = names[0]
        word = keywords.array_word(name) if len(names) > 1 and names[1] == CALL else None
        if word is not None and self._undefined(name):  # matmul(a, b), matmul undefined
            text = Ref(names[:1], ref.line).text
            why = (
                f"keyword fallback: calls {text} at line {ref.line} (an undefined name; the word "
                f"`{word}` suggests {keywords.ARRAY_OP.what})"
            )
            self.result.evidence += evidence_from_rule(keywords.ARRAY_OP, text, why, weak=True)
            return True
        if ref.nested:
            return False
        if len(names) > 1 and names[1] == CALL and self._dynamic(name):  # fn(x), fn(x).attr
            what = "its argument" if name in self.facts.params else "the callable"
            why = f"calls {what} `{name}` at line {ref.line}, whose kind is known only at run time"
            self.result.uncertain.append(why)
        return False

    def _item_call(self, ref: Ref) -> None:
        """``handlers[kind](event)``, ``self.tools[name](**args)``: a callable picked from a
        container at run time (its kind, and its effects, are unknown)."""
        names = ref.names
        if ref.nested or ITEM not in names or CALL not in names:
            return
        if names.index(ITEM) + 1 != names.index(CALL):
            return
        if names[0] in self.facts.params or names[0] == self._self_name():
            text = Ref(names[: names.index(ITEM)], ref.line).text
            why = f"calls a callable taken from {text} at line {ref.line}, known only at run time"
            self.result.uncertain.append(why)

    def _io_hint(self, ref: Ref) -> int:
        """Orchestration evidence for an unresolved chain; the index of the name it is about
        (-1: none)."""
        names = ref.names
        for i, n in enumerate(names):  # client.chat.completions.create(...).choices[0]...
            if n == CALL:
                suffix = rules.llm_suffix(tuple(x for x in names[1:i] if x not in (CALL, ITEM)))
                if suffix is not None:
                    text = Ref(names[:i], ref.line).text
                    why = f"calls {text} (LLM API call .{suffix}) at line {ref.line}"
                    fx = self._fx(ref, i - 1, rules.LLM)
                    self.result.evidence += evidence_from_rule(rules.LLM, text, why, fx)
                    return i - 1
        found = -1
        for i, n in enumerate(names[1:], start=1):
            rule = rules.METHOD_HINTS.get(n)
            if rule is not None and rule.kind == "orchestration":
                text = Ref(names[: i + 1], ref.line).text
                why = f"calls {text} ({rule.what}, from the method name) at line {ref.line}"
                fx = self._fx(ref, i, rule)
                self.result.evidence += evidence_from_rule(rule, text, why, fx, weak=True)
                found = i
                break
            if n in ("execute", "executemany") and self._sql_call(ref, i):
                found = i
                break
        direct = names[1:] == (CALL,) and self._dynamic(names[0])
        undefined = len(names) > 1 and names[1] == CALL and self._undefined(names[0])
        hit = keywords.fallback(names, self._self_name(), direct, undefined)
        if hit is None or hit[1] == found:  # the method name already said it
            return found
        rule, i, word, ambiguous = hit  # the first call: session.delete(...).raise_for_status()
        text = Ref(names[: i + 1], ref.line).text
        why = (
            f"keyword fallback: calls {text} at line {ref.line} (unresolved; {word} suggests "
            f"{rule.what})"
        )
        evidence = evidence_from_rule(rule, text, why, self._fx(ref, i, rule), weak=True)
        if ambiguous:  # `model.generate(...)`: an LLM unless the function does tensor work
            self._maybe += evidence
        else:
            self.result.evidence += evidence
        return max(found, i)

    def _sql_call(self, ref: Ref, i: int) -> bool:
        """``c.execute("INSERT ...")`` on any receiver: the SQL literal says it is a database."""
        args = ref.args_at(i)
        first = args.get(0) if args is not None else None
        sql = first[1] if first and first[0] == "s" else self._string(first[1]) if first else None
        if sql is None or verbs.sql_status(sql) is None:
            return False
        text = Ref(ref.names[: i + 1], ref.line).text
        why = f"calls {text} with an SQL statement (database) at line {ref.line}"
        fx = self._fx(ref, i, rules.DB)
        self.result.evidence += evidence_from_rule(rules.DB, text, why, fx)
        return True

    def run(self) -> Analysis:
        self._maybe: list[Evidence] = []
        for ref in self.facts.refs:
            self.ref_evidence(ref)
        if self.facts.matmul:
            line = self.facts.matmul[0]
            why = f"uses the @ operator at line {line} (a matrix product: its operands are arrays)"
            self.result.evidence += evidence_from_rule(rules.ARRAY_METHOD, "@", why, weak=True)
        if self._maybe and "tensor" not in self.result.kinds():
            self.result.evidence += self._maybe
        self._side_effects()
        if not self.result.evidence:
            self._annotations()
        if "orchestration" in self.result.kinds():
            word = verbs.own_name_writes(self.code.co_name)
            if word is not None:
                why = f"its name {self.code.co_name} says it has effects (`{word}`)"
                self.result.fx_extra.append((WRITE, why))
        if not self.result.evidence and not self.facts.has_source:
            self.result.uncertain.append(
                f"no source code for {self.code.co_qualname} (defined in a REPL, by exec or in a "
                "compiled module) and no marker, module or annotation evidence"
            )
        return self.result

    def _side_effects(self) -> None:
        f = self.facts
        self.result.side_effects += f.side_effects
        for name in source.mutated_roots(f):
            if name in f.locals or name in f.params or name in f.imports:
                continue
            obj = self._outer(name).obj
            if isinstance(obj, (list, dict, set, bytearray)) or is_user_instance(obj):
                self.result.side_effects.append(f"mutates {name}, which lives outside the function")

    def _annotations(self) -> None:
        refs = self.facts.annotations
        if not self.facts.has_source:
            refs = [Ref(tuple(a.split(".")), 0) for a in annotation_names(self.func)]
        for ref in refs:
            val = self.walk(ref.names)
            if val.path is None and ref.names[0] in sys.modules:  # "jax.Array" as a string
                val = from_path(".".join(ref.names))
            rule = rule_for(val.obj, val.path)
            if rule is None or rule.kind == "neutral":
                continue
            if rule.kind == "orchestration" and not (val.path or "").endswith(rules.CLIENT_WORDS):
                continue  # a Response or Message annotation is data, not an I/O handle
            reason = f"a parameter or the return value is annotated as {ref.text} ({rule.what})"
            fx = (UNKNOWN, f"takes a {ref.text} (what it does with it is not known)")
            self.result.evidence += evidence_from_rule(rule, ref.text, reason, fx)

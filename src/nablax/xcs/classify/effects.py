"""Effects: whether a call can change something outside the program (a write, a send, a post,
a delete, a subprocess, console output) or only reads (an LLM completion, an HTTP GET, a file
read, a sleep). ``xcs.jit`` may start read-only calls early; calls with effects wait their turn.

Internal to :mod:`nablax.xcs.classify`. Each orchestration operation found in a function gets a
status, ``"write"``, ``"read"`` or ``"unknown"``, from (in this order) its library (subprocesses
and the console always write, waits and LLM completions read), its arguments where they decide
(an SQL literal, a file mode, an HTTP method, a request body) and the verbs in its name
(:mod:`.verbs`: ``put_object`` writes, ``list_objects`` reads; ``get_or_create`` writes). A
function's ``effects`` is True when one of its operations (or a helper's) writes, or when one is
unknown (the safe route: it then runs in program order); False when every one reads.

In-memory bookkeeping (``list.append``, ``dict.update``, attributes on ``self``) never counts, and
neither does ``logging`` (diagnostics, not results: the engine may reorder log lines).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from . import rules
from .records import READ, UNKNOWN, WRITE, Analysis, Rule
from .verbs import AMBIGUOUS, BOOKKEEPING, creates_completion, sql_status, verb_status

if TYPE_CHECKING:
    from .source import Args

# attributes of clients and handles that hold plain dicts and lists: s.headers.update(...)
_IN_MEMORY = frozenset(
    "headers cookies params config options settings metadata history state env extra".split()
)
# functions that make a client or handle (boto3.client("s3"), engine.begin()): no effect yet
_FACTORIES = frozenset("client resource session cursor engine pipeline begin".split())
_MODE = re.compile(r"^[rwxabt+]{1,3}(:\w*)?$")
_HTTP_VERB = re.compile(r"^(GET|HEAD|OPTIONS|POST|PUT|PATCH|DELETE)$", re.I)
_ARG_DEPENDENT = {  # library callables judged as objects: their effects depend on the arguments
    "open": "open may write (its mode is known only at the call)",
    "urlopen": "urlopen may send a request body (known only at the call)",
    "request": "the HTTP method is known only at the call",
    "execute": "the SQL statement is known only at the call",
}


def _literal(arg: tuple[str, str] | None, strings) -> str | None:
    if arg is None:
        return None
    if arg[0] == "s":
        return arg[1]
    if arg[0] == "n":
        return strings(arg[1])
    return None


def of_call(
    names: tuple[str, ...], index: int, rule: Rule, args: Args | None, strings, text: str
) -> tuple[str, str]:
    """Status of the I/O operation ``names[index]`` (called with ``args``), and a phrase saying why
    (``"calls requests.post"``). ``strings(name)`` gives a name's string value, if known."""
    name = names[index]
    at = f"calls {text}"
    if rule.what == "subprocess":
        return WRITE, f"{at} (runs a subprocess)"
    if rule.what == "console I/O":
        return WRITE, f"{at} (console I/O)"
    if rule is rules.WAIT:
        return READ, f"{at} (a wait)"
    attrs = tuple(n for n in names[: index + 1] if n not in ("()", "[]"))
    suffix = rules.llm_suffix(attrs)
    if suffix is not None and not suffix.startswith(("files", "batches", "fine_tuning")):
        return READ, f"{at} (an LLM {'embedding' if 'embed' in suffix else 'completion'})"
    if name in BOOKKEEPING | AMBIGUOUS and index > 0 and names[index - 1] in _IN_MEMORY:
        return READ, f"{at} (changes {names[index - 1]} in memory)"
    if rule.what == "an LLM agent":  # agent.run(task): its tools may write
        status, word = verb_status(name)
        if status == WRITE:
            return WRITE, f"{at} (writes: `{word}`)"
        return UNKNOWN, f"{at} (an agent: the tools it runs may have effects)"
    if args is not None:
        decided = _by_arguments(name, args, strings, at)
        if decided is not None:
            return decided
    if rule.what in ("LLM API", "an LLM call") and creates_completion(name):
        return READ, f"{at} (an LLM completion: `create` asks the model, it stores nothing)"
    status, word = verb_status(name)
    if status is not None:
        return status, f"{at} ({'writes' if status == WRITE else 'reads'}: `{word}`)"
    if name in _FACTORIES or (name[:1].isupper() and rule.what != "file I/O"):
        return READ, f"{at} (makes a client or handle)"
    if rule.what in ("LLM API", "an LLM call"):
        return READ, f"{at} (an LLM call)"
    return UNKNOWN, f"{at} ({rule.what}: what it changes is not known)"


def _by_arguments(name: str, args: Args, strings, at: str) -> tuple[str, str] | None:
    """Arguments that decide: SQL text, a file mode, an HTTP method, a request body."""
    lname = name.lower()
    if lname in ("execute", "executemany", "exec_driver_sql", "executescript", "query", "sql"):
        sql = _literal(args.get(0), strings)
        status = sql_status(sql) if sql is not None else None
        if status is not None:
            what = sql.strip().split("\n")[0][:40]
            return status, f"{at} with SQL '{what}'"
        if lname in ("executemany", "executescript"):
            return WRITE, f"{at} (runs SQL statements in bulk)"
        if lname == "execute":
            return UNKNOWN, f"{at} (the SQL statement is not a literal)"
    if lname in ("open", "file", "zipfile", "tarfile", "fdopen"):
        # open(file, mode), ZipFile(file, mode), h5py.File(name, mode), Path(...).open(mode)
        given = [args.get(99, "mode"), *args.pos[:2]]
        for mode in given:
            if mode is not None and mode[0] == "s" and _MODE.match(mode[1]):
                if any(c in mode[1] for c in "wax+"):
                    return WRITE, f"{at} with mode '{mode[1]}' (writes a file)"
                return READ, f"{at} with mode '{mode[1]}' (reads a file)"
        if given[0] is not None or (len(args.pos) > 1 and args.pos[1][0] != "s"):
            return UNKNOWN, f"{at} (its mode is not a literal)"
        return READ, f"{at} (reads a file)"
    if lname in ("request", "stream") and args.pos:
        method = _literal(args.get(0, "method"), strings)
        if method is not None and _HTTP_VERB.match(method):
            status = READ if method.upper() in ("GET", "HEAD", "OPTIONS") else WRITE
            return status, f"{at} with method {method.upper()}"
    if lname in ("urlopen", "request"):
        method = _literal(args.get(99, "method"), strings)
        if method is not None and _HTTP_VERB.match(method):
            status = READ if method.upper() in ("GET", "HEAD", "OPTIONS") else WRITE
            return status, f"{at} with method {method.upper()}"
        data = args.get(1, "data")
        if data is not None and data != ("c", "None"):
            return WRITE, f"{at} with a request body (data=...)"
        return READ, f"{at} (an HTTP GET)"
    return None


def of_object(name: str, rule: Rule) -> tuple[str, str]:
    """Status of a library callable judged by itself (no call site): ``print`` writes, ``len``
    does not apply, ``open`` may write."""
    short = name.rsplit(".", 1)[-1]
    if short in _ARG_DEPENDENT or short.lower() in _ARG_DEPENDENT:
        return WRITE, f"{name}: {_ARG_DEPENDENT.get(short) or _ARG_DEPENDENT[short.lower()]}"
    # the whole dotted path, so that an SDK method (openai's ...chat.completions.Completions.create)
    # is judged as the same call written in source (client.chat.completions.create) is
    names = (*(p.lower() for p in name.split(".")[:-1]), short)
    status, why = of_call(names, len(names) - 1, rule, None, lambda n: None, name)
    return status, why


def items(a: Analysis) -> list[tuple[str, str]]:
    """Every (status, phrase) found in an analysis: its operations, helpers and unknowns."""
    out = [(e.fx, e.fx_why) for e in a.evidence if e.kind == "orchestration" and e.fx]
    out += a.fx_extra
    out += [(UNKNOWN, u) for u in a.uncertain]
    return out


def decide(a: Analysis, kind: str, marker: str | None) -> tuple[bool, str | None]:
    """``(effects, sentence for the reasons)``."""
    if a.declared_fx is not None:
        api = f"@mark_{marker or 'orchestration'}(effects={a.declared_fx})"
        return a.declared_fx, f"{'effects' if a.declared_fx else 'read-only'}: declared by {api}"
    if kind in ("tensor", "pure"):
        return False, None
    found = items(a)
    for status, lead in ((WRITE, "effects: "), (UNKNOWN, "effects: unknown, ")):
        hits = [why for s, why in found if s == status]
        if hits:
            tail = " (treated as having effects)" if status == UNKNOWN else ""
            return True, f"{lead}{hits[0]}{tail}"
    reads = [why for s, why in found if s == READ]
    if reads:
        more = f" (+{len(reads) - 1} more read-only)" if len(reads) > 1 else ""
        return False, f"read-only: {reads[0]}{more}"
    return False, "read-only: no call with external effects found"


def summary(a: Analysis, name: str, at: str) -> tuple[str, str]:
    """A helper's overall status, phrased for its caller."""
    found = items(a)
    if a.declared_fx is not None:
        return (
            WRITE if a.declared_fx else READ
        ), f"calls {name}{at} (declared effects={a.declared_fx})"
    for status in (WRITE, UNKNOWN, READ):
        hits = [why for s, why in found if s == status]
        if hits:
            return status, f"calls {name}{at}, which {hits[0]}"
    return READ, f"calls {name}{at} (no external effects)"

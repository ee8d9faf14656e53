"""The scheduler behind ``xcs.jit``: one ``Engine`` per invocation.

**The rule.** A program under ``xcs.jit`` behaves exactly like the same program run as plain
sequential Python: same results, same exception (the first in program order), same side effects.
Only timing differs. A call may start early only when starting it cannot change what the program
observably does:

- a **read-only** orchestration call (an LLM completion, an HTTP GET, a file read, a sleep:
  ``classify(fn).effects`` is False) starts as soon as its inputs are ready, speculatively: if an
  earlier call then fails, its result is simply never used;
- a call **with effects** (writes, sends, posts, deletes, subprocesses, ``print``, or anything
  that cannot be classified) starts only after every earlier call in program order has succeeded,
  and every later call waits for it (a read after a write sees the write). If an earlier call
  failed it never runs. Inline calls with effects (``print``, ``open``, hybrids) wait the same way.

**Routing.** Every call the jitted function makes comes here (see ``rewrite.py``):

- **orchestration** (``classify(fn).kind == "orchestration"``): a graph node answered at once with
  a ``Pending``. A node is handed to the executor when its inputs (and, by the rule above, the
  calls it must follow) are done, through completion callbacks: no thread blocks waiting to
  start a node. A node whose input failed fails with the same error without running.
- **storing** builtins (``list.append``, ``dict.update``, ``len``, ``list``, ...): called with the
  pending values as they are, since they only hold references;
- anything else (tensor code, pure functions, builtins, hybrids, methods of real values): called
  in the jitted function's thread after waiting for the pending values in its arguments.

**Errors in program order.** Nodes and lazy values are numbered in program order. When the
function returns or raises, the engine waits for every node and raises the first failure the
program has not seen (one it read, and maybe caught, does not count), or else the function's own
exception: an inline error after a failed call raises the call's error, as plain Python would.
``try`` and ``with`` statements first settle every earlier call (``settle``), and calls inside
their bodies deliver their results before the next statement (``call_now``), so handlers and
context managers see exactly the exceptions plain Python would give them.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import inspect
import threading
import time
import types
from typing import Any

from . import scheduler
from ._snapshot import Uncopyable, mutates_arguments, snapshot
from .futures import Deferred, Lazy, LazyStr, Pending, current_engine, fstring, pending_in, resolve

_current = current_engine

# The sequential rule (calls with effects wait for every earlier call). Only bench/bench_xcs.py
# turns it off, to measure what the rule costs on read-only pipelines; never off otherwise.
SEQUENTIAL_RULE = True

_STORING_METHODS = {
    (list, "append"), (list, "extend"), (list, "insert"), (list, "copy"),
    (dict, "update"), (dict, "setdefault"), (dict, "copy"), (dict, "get"), (dict, "pop"),
    (dict, "items"), (dict, "values"), (dict, "keys"),
}  # fmt: skip
# builtins that only hold references (a pending value used *as* the argument still waits through
# its dunder methods: len(p) calls p.__len__)
_STORING_BUILTINS = {len, list, tuple, dict, zip, enumerate, range, reversed, iter}
# methods of these types are plain computations on values (no effects, never orchestration)
_VALUE_TYPES = (str, bytes, bytearray, list, tuple, dict, set, frozenset, int, float, complex)


@dataclasses.dataclass
class PlanNode:
    """One orchestration call of an invocation: times are seconds from the invocation's start.

    ``deps`` are the calls whose results it takes (data flow); ``after`` the calls it had to wait
    for by the sequential rule; ``effects`` whether it has external effects and ``schedule`` how it
    was started and why (``"early: read-only (...)"``, ``"waited: has effects (...)"``, ...)."""

    id: int
    name: str
    deps: tuple[int, ...]
    submitted: float
    start: float | None = None
    end: float | None = None
    error: str | None = None
    effects: bool = False
    after: tuple[int, ...] = ()
    schedule: str = ""
    observed: bool = dataclasses.field(default=False, repr=False)  # its failure reached the code
    # its result as it returned it, for the calls that take it (None: not kept; see _snapshot.py)
    pristine: Any = dataclasses.field(default=None, init=False, repr=False, compare=False)
    # its result could not be copied: a read by the program first waits for these calls
    consumers: list = dataclasses.field(default_factory=list, init=False, repr=False, compare=False)
    shared: bool = dataclasses.field(default=False, init=False, repr=False, compare=False)

    @property
    def duration(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0

    @property
    def early(self) -> bool:
        """True when it could start before the calls that precede it had finished."""
        return not self.effects and not self.after


@dataclasses.dataclass(frozen=True)
class Plan:
    """The executed call graph of one ``xcs.jit`` invocation (``f.last_plan()``): ``edges`` are
    the data-flow edges ``(from, to)``; each node's ``after`` / ``schedule`` say what else it
    waited for; ``wall_s`` is the invocation's own wall time."""

    nodes: tuple[PlanNode, ...]
    edges: tuple[tuple[int, int], ...]
    wall_s: float

    def __str__(self) -> str:
        lines = [f"xcs plan: {len(self.nodes)} call(s) in {self.wall_s * 1e3:.1f} ms"]
        for n in self.nodes:
            deps = f" after {list(n.deps)}" if n.deps else ""
            span = (
                f"{(n.start or 0) * 1e3:8.1f} -> {(n.end or 0) * 1e3:8.1f} ms"
                if n.start is not None
                else "      (not run)      "
            )
            err = f"  ERROR {n.error}" if n.error else ""
            lines.append(f"  #{n.id:<3} {span}  {n.name}{deps}  [{n.schedule}]{err}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Stats:
    """``f.stats()``: calls of the last invocation, their summed time, the wall time, the overlap
    (summed call time / wall time of the calls) and the time saved against running them one
    after another.

    Also a read-only mapping with the seed's keys (its ``f.stats()`` is a dict): ``"optimized"``
    (the calls overlapped enough to pay: overlap > 1.2, the seed's threshold on its speedup
    estimate), ``"status"`` (``"compiled"`` if so, else ``"fallback"``), ``"reason"``
    (``"no_parallelism"``, present only when not optimized) and the five fields by name.

    >>> s = Stats(calls=0, busy_s=0.0, wall_s=0.0, overlap=0.0, saved_s=0.0)
    >>> s["status"], s["optimized"], "reason" in s, s.get("hits", 0), s.calls
    ('fallback', False, True, 0, 0)
    """

    calls: int
    busy_s: float
    wall_s: float
    overlap: float
    saved_s: float

    def keys(self) -> tuple[str, ...]:
        names = tuple(f.name for f in dataclasses.fields(self))
        return ("status", "optimized", *names) + (() if self.overlap > 1.2 else ("reason",))

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(
                f"xcs.jit(f).stats()[{key!r}]: no such key. Fix: one of {', '.join(self.keys())}"
            )
        seed = {"optimized": self.overlap > 1.2, "reason": "no_parallelism"}
        seed["status"] = "compiled" if seed["optimized"] else "fallback"
        return seed[key] if key in seed else getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.keys() else default

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]


class Engine:
    """Schedules one invocation's orchestration calls (see the module docstring)."""

    def __init__(self, executor: cf.Executor, classify) -> None:
        self.executor = executor
        self.classify = classify
        self.t0 = time.perf_counter()
        self.t_end: float | None = None
        self.nodes: list[PlanNode] = []
        self.futures: list[cf.Future] = []
        self.lazies: list[tuple[int, Lazy]] = []  # (number of nodes before it, the value)
        self.last_effect: int | None = None  # the latest node with effects
        self.fatal: BaseException | None = None  # the executor failed to take work
        self.lock = threading.Lock()
        self.any_pending = False  # fast path: no lazy value exists yet, nothing to resolve

    # -- the runtime the rewritten function calls (as __xcs__.<name>) -----------------------------
    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self.fatal is not None:
            raise self.fatal
        route, c = self.route(fn)
        if route == "submit":
            if mutates_arguments(fn) is None:
                return self.submit(fn, args, kw, c)
            # it changes an argument in place: it runs now, on the program's own objects
            args, kw = _resolve_in_place(args), _resolve_in_place(kw)
        elif route == "store" or not self.any_pending:
            return fn(*args, **kw)
        if route == "defer":
            if fn.__name__ == "join" and len(args) == 1 and not isinstance(args[0], (list, tuple)):
                args = (list(args[0]),)  # read a generator now, in order, as plain Python would
            if pending_in((args, kw), []):
                try:  # joined later: from the parts as they are now
                    return Deferred(fn, snapshot(args), snapshot(kw))
                except Uncopyable:
                    pass
            return fn(*resolve(args), **resolve(kw))
        if c is not None and c.kind in ("orchestration", "hybrid"):
            if _effects(c):
                self.settle()  # every earlier call must have succeeded
            elif self.last_effect is not None:
                self._wait_node(self.last_effect)  # a read after a write sees the write
        return fn(*resolve(args), **resolve(kw))

    def call_now(self, fn: Any, *args: Any, **kw: Any) -> Any:
        """A call inside a ``try`` or ``with`` body: it and every call it started deliver their
        results (or exceptions) before the next statement."""
        n0 = len(self.nodes)
        out = self.call(fn, *args, **kw)
        self.settle(first=n0)
        if isinstance(out, Lazy):
            out.value()
        return out

    def route(self, fn: Any) -> tuple[str, Any]:
        """``(route, classification or None)``; routes: submit, store, defer, inline."""
        if isinstance(fn, Lazy):
            return "inline", None
        if fn in _STORING_BUILTINS if _hashable(fn) else False:
            return "store", None
        owner = getattr(fn, "__self__", None)
        if isinstance(fn, types.BuiltinMethodType) and owner is not None:
            if (type(owner), fn.__name__) in _STORING_METHODS:
                return "store", None
            if type(owner) is str and fn.__name__ in ("join", "format"):
                return "defer", None  # building a prompt from pending parts stays lazy
            if isinstance(owner, _VALUE_TYPES):
                return "inline", None
        if isinstance(fn, type):
            return "inline", None
        if getattr(fn, "__xcs_jit__", False):
            return "store", None  # a nested xcs.jit function runs in this engine, lazily
        try:
            c = self.classify(fn)
        except Exception:  # noqa: BLE001 - unclassifiable: in order, after every earlier call
            return "inline", _UNCLASSIFIED
        if isinstance(fn, (types.BuiltinFunctionType, types.BuiltinMethodType)):
            return "inline", c  # builtins (print, open, ...) run in order, here
        target = getattr(fn, "__func__", fn)
        if inspect.iscoroutinefunction(target) or inspect.isgeneratorfunction(target):
            return "inline", c
        return ("submit" if c.kind == "orchestration" else "inline"), c

    fstring = staticmethod(fstring)

    @staticmethod
    def is_(a: Any, b: Any) -> bool:
        return resolve(a) is resolve(b)

    @staticmethod
    def is_not(a: Any, b: Any) -> bool:
        return resolve(a) is not resolve(b)

    def note_lazy(self, lazy: Lazy) -> None:
        self.lazies.append((len(self.nodes), lazy))

    # -- nodes ------------------------------------------------------------------------------------
    def submit(self, fn: Any, args: tuple, kw: dict, c: Any = None) -> Pending:
        try:  # the call sees its arguments as they are now, whenever it starts
            args, kw = snapshot(args, "args"), snapshot(kw, "kwargs")
            held = None
        except Uncopyable as e:  # shared as they are: the program waits for the call to end
            held = str(e)
        deps = pending_in((args, kw), []) if self.any_pending else []
        effects = _effects(c)
        why = _why(c)
        fut: cf.Future = cf.Future()
        with self.lock:
            i = len(self.nodes)
            if effects:
                after = tuple(range(i))
                schedule = f"waited: has effects ({why}); started after every earlier call"
            elif self.last_effect is not None:
                after = (self.last_effect,)
                schedule = f"waited for #{self.last_effect} (effects); read-only ({why})"
            else:
                after = ()
                schedule = f"early: read-only ({why})"
            if held is not None:
                schedule += f"; the program waited for it ({held}, which cannot be copied)"
            node = PlanNode(
                i, _name(fn), tuple(sorted({d.node.id for d in deps})),
                time.perf_counter() - self.t0, effects=effects, after=after, schedule=schedule,
            )  # fmt: skip
            for d in deps:
                d.node.consumers.append(fut)
            self.nodes.append(node)
            self.futures.append(fut)
            self.any_pending = True
            if effects:
                self.last_effect = i
        waits = [d.future for d in deps] + [self.futures[j] for j in after]
        waiting = [w for w in waits if not w.done()]
        if not waiting:
            self._start(fn, args, kw, node, fut, deps, direct=True)
        else:
            counter = [len(waiting)]
            lock = threading.Lock()

            def ready(_f: cf.Future) -> None:
                with lock:
                    counter[0] -= 1
                    last = counter[0] == 0
                if last:
                    self._start(fn, args, kw, node, fut, deps, direct=False)

            for w in waiting:
                w.add_done_callback(ready)
        if held is not None:
            scheduler.wait(fut)  # nothing may change its arguments before it has run
        return Pending(fut, node)

    def _start(self, fn, args, kw, node: PlanNode, fut: cf.Future, deps: list, direct: bool):
        for d in deps:
            err = d.future.exception()
            if err is not None:  # an input failed: this call never runs, as in plain Python
                node.error = f"input #{d.node.id} failed: {type(err).__name__}"
                fut.set_exception(err)
                return
        for j in node.after:
            err = self.futures[j].exception()
            if err is not None and not self.nodes[j].observed:
                # an earlier call failed, and the program has not handled it: plain Python never
                # gets here (one it caught, or is handling in a finally block, does not count)
                node.error = f"not run: earlier call #{j} failed ({type(err).__name__})"
                fut.set_exception(err)
                return
        if node.effects:
            for _, lazy in self._lazies_before(node.id):
                err = lazy.error()
                if err is not None and not lazy.observed:
                    node.error = f"not run: an earlier expression failed ({type(err).__name__})"
                    fut.set_exception(err)
                    return
        if not fut.set_running_or_notify_cancel():
            return
        try:
            if scheduler.in_process(self.executor):
                scheduler.submit(self.executor, self._run, fn, args, kw, node, fut)
            else:  # another process (Dask, a process pool): the user's function, real values
                node.start = time.perf_counter() - self.t0
                remote = scheduler.submit(self.executor, fn, *_given(args), **_given(kw))
                remote.add_done_callback(lambda r: self._finish_remote(r, node, fut))
        except BaseException as e:  # noqa: BLE001 - the executor refused the work
            node.error = f"the executor did not take the call: {type(e).__name__}: {e}"[:200]
            fut.set_exception(e)
            self.fatal = e
            if direct:
                raise

    def _run(self, fn, args, kw, node: PlanNode, fut: cf.Future) -> None:
        node.start = time.perf_counter() - self.t0
        try:
            result = fn(*_given(args), **_given(kw))
        except BaseException as e:  # noqa: BLE001 - delivered to whoever reads the value
            node.end = time.perf_counter() - self.t0
            node.error = f"{type(e).__name__}: {e}"[:200]
            fut.set_exception(e)
            return
        node.end = time.perf_counter() - self.t0
        _keep(node, result)
        fut.set_result(result)

    def _finish_remote(self, remote: cf.Future, node: PlanNode, fut: cf.Future) -> None:
        node.end = time.perf_counter() - self.t0
        err = remote.exception() if not remote.cancelled() else cf.CancelledError()
        if err is not None:
            node.error = f"{type(err).__name__}: {err}"[:200]
            fut.set_exception(err)
        else:
            _keep(node, remote.result())
            fut.set_result(remote.result())

    # -- program order ----------------------------------------------------------------------------
    def _lazies_before(self, n: int) -> list[tuple[int, Lazy]]:
        return [(pos, lz) for pos, lz in self.lazies if pos <= n]

    def _wait_node(self, i: int) -> None:
        scheduler.wait(self.futures[i])
        if self.futures[i].exception() is not None:
            self.settle(upto=i + 1)

    def _events(self, first: int, upto: int):
        """Nodes ``first..upto-1`` and the lazy values made among them, in program order:
        ``(error or None, event)`` pairs, waiting for each."""
        lazies = [(pos, lz) for pos, lz in self.lazies if first <= pos <= upto]
        k = 0
        for i in range(first, upto):
            while k < len(lazies) and lazies[k][0] <= i:
                yield lazies[k][1].error(), lazies[k][1]
                k += 1
            f = self.futures[i]
            scheduler.wait(f)
            yield (f.exception() if not f.cancelled() else None), self.nodes[i]
        for _, lz in lazies[k:]:
            yield lz.error(), lz

    def settle(self, first: int = 0, upto: int | None = None) -> None:
        """Wait for the calls ``first..upto`` (default: all so far) and the lazy values made among
        them; raise the first failure the program has not seen, as it would have been raised."""
        upto = len(self.nodes) if upto is None else upto
        for err, event in self._events(first, upto):
            if err is not None and not event.observed:
                _mark(event)
                raise err

    def finish(self, exc: BaseException | None) -> BaseException | None:
        """At the end of an invocation (``exc``: what the function raised, or None): wait for
        everything; return the exception to raise, the first in program order."""
        try:
            i = 0
            while i < len(self.futures):  # every call ends before the invocation returns
                scheduler.wait(self.futures[i])
                i += 1
            for err, event in self._events(0, len(self.nodes)):
                if err is None:
                    continue
                if err is exc:
                    break
                if not event.observed:
                    _mark(event)
                    return err
            return exc
        finally:
            self.t_end = time.perf_counter()
            for n in self.nodes:  # the plan outlives the invocation: drop the results' copies
                n.pristine = None
                n.consumers.clear()

    # -- reports ----------------------------------------------------------------------------------
    def plan(self) -> Plan:
        end = self.t_end if self.t_end is not None else time.perf_counter()
        edges = tuple((d, n.id) for n in self.nodes for d in n.deps)
        return Plan(tuple(self.nodes), edges, end - self.t0)

    def stats(self) -> Stats:
        ran = [n for n in self.nodes if n.start is not None and n.end is not None]
        busy = sum(n.duration for n in ran)
        if not ran:
            return Stats(len(self.nodes), 0.0, 0.0, 0.0, 0.0)
        span = max(n.end for n in ran) - min(n.start for n in ran)
        return Stats(
            len(self.nodes), busy, span, busy / span if span > 0 else 1.0, max(busy - span, 0.0)
        )


class _Unclassified:
    kind = "orchestration"
    effects = True
    reasons = ("could not be classified: run in order, as a call with effects",)


_UNCLASSIFIED = _Unclassified()


def _effects(c: Any) -> bool:
    if not SEQUENTIAL_RULE:
        return False
    return True if c is None else bool(getattr(c, "effects", False))


def _keep(node: PlanNode, result: Any) -> None:
    """Keep ``result`` as the call returned it for the calls that take it (the program may change
    the object it reads); a result that cannot be copied is shared, and read with care."""
    if type(result) in (str, int, float, bool, bytes, type(None)):
        return
    try:
        copy = snapshot(result, "result")
    except Uncopyable:
        node.shared = True
        return
    if copy is not result:
        node.pristine = (copy,)


def _given(x: Any, depth: int = 0) -> Any:
    """What a call receives: ``x`` with each pending value replaced by its result as the call
    that made it returned it (a fresh copy for each call), never a future."""
    if isinstance(x, Pending):
        kept = x.node.pristine
        if kept is not None:
            try:
                return snapshot(kept[0], "result")
            except Uncopyable:  # pragma: no cover - it was copied once
                return kept[0]
        return resolve(x)
    if isinstance(x, Lazy):
        return resolve(x)
    if depth > 64:
        return resolve(x)
    t = type(x)
    if t is list or t is tuple:
        vals = [_given(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else t(vals)
    if t is dict:
        vals = {k: _given(v, depth + 1) for k, v in x.items()}
        return x if all(vals[k] is v for k, v in x.items()) else vals
    return resolve(x)


def _resolve_in_place(x: Any, depth: int = 0) -> Any:
    """``x`` with the pending values inside its lists and dicts replaced by their values in place
    (the objects stay the program's own: a function that changes them changes the program's)."""
    if isinstance(x, Lazy):
        return resolve(x)
    if depth > 64:
        return x
    if type(x) is list:
        for i, v in enumerate(x):
            r = _resolve_in_place(v, depth + 1)
            if r is not v:
                x[i] = r
    elif type(x) is dict:
        for k, v in list(x.items()):
            r = _resolve_in_place(v, depth + 1)
            if r is not v:
                x[k] = r
    elif type(x) is tuple:
        vals = [_resolve_in_place(v, depth + 1) for v in x]
        return x if all(a is b for a, b in zip(vals, x)) else tuple(vals)
    return x


def _mark(event: Any) -> None:
    if isinstance(event, PlanNode):
        event.observed = True
    else:
        event._mark_observed()


def _why(c: Any) -> str:
    if c is None:
        return "unclassified"
    for r in getattr(c, "reasons", ()):
        for prefix in ("effects: ", "read-only: "):
            if r.startswith(prefix):
                return r[len(prefix) :]
        if r.startswith(("effects", "read-only")):
            return r
    return "no effects found" if not _effects(c) else "effects assumed"


def _hashable(fn: Any) -> bool:
    try:
        hash(fn)
    except TypeError:
        return False
    return True


def _name(fn: Any) -> str:
    target = getattr(fn, "__func__", fn)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return name or type(fn).__name__


class Runtime:
    """What a rewritten function sees as ``__xcs__``: forwards to the engine of the invocation
    running in this thread, or calls plainly when there is none (a nested function that escaped
    its invocation)."""

    __slots__ = ()

    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        engine = _current.get()
        if engine is None:
            return fn(*args, **kw)
        return engine.call(fn, *args, **kw)

    def call_now(self, fn: Any, *args: Any, **kw: Any) -> Any:
        engine = _current.get()
        if engine is None:
            return fn(*args, **kw)
        return engine.call_now(fn, *args, **kw)

    def settle(self) -> None:
        """Before a ``try`` or ``with`` statement: earlier failures are raised outside it."""
        engine = _current.get()
        if engine is not None and engine.any_pending:
            engine.settle()

    fstring = staticmethod(fstring)
    is_ = staticmethod(Engine.is_)
    is_not = staticmethod(Engine.is_not)


RUNTIME = Runtime()


def current() -> Engine | None:
    """The engine of the ``xcs.jit`` invocation running in this thread / task, if any."""
    return _current.get()


__all__ = ["Engine", "Plan", "PlanNode", "Stats", "current", "LazyStr"]

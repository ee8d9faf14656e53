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

**Arguments as they were.** A node gets a snapshot of its arguments (``_snapshot.py``): what the
program does to them afterwards never reaches the call.

**Errors in program order, as soon as they happen.** Nodes and lazy values are numbered in
program order. A node that fails is raised at the program's next call, or while it waits for a
later value, after waiting only for the nodes before it (plain Python would have stopped there).
At most ``nx.config.xcs_speculation_window`` nodes are unfinished at once (the program waits for
the oldest before it makes another call). When the function returns, the engine waits for every
node and raises the first failure the program has not seen (one it read, and maybe caught, does
not count), or else the function's own exception: an inline error after a failed call raises the
call's error, as plain Python would. When it raises, nodes not yet started are cancelled.
``try`` and ``with`` statements first settle every earlier call (``settle``), and calls inside
their bodies deliver their results before the next statement (``call_now``), so handlers and
context managers see exactly the exceptions plain Python would give them.
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import inspect
import threading
import time
import types
from typing import Any

from .. import _config
from . import scheduler
from ._context import XCS
from ._plan import Plan, PlanNode, Stats
from ._snapshot import Uncopyable, given, keep_result, mutates_arguments, resolve_in_place, snapshot
from .futures import Deferred, Lazy, LazyStr, Pending, fstring, pending_in, resolve

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
        self.window = int(_config.get("xcs_speculation_window"))
        self.open_from = 0  # every node before this one has finished
        self.failures: set[int] = set()  # nodes that failed (the program may not know yet)
        self.listeners: list = []  # called once when a node fails (a program waiting for a value)
        self.abandoned = False  # the invocation raised: calls not yet running never run

    # -- the runtime the rewritten function calls (as __xcs__.<name>) -----------------------------
    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        if self.fatal is not None:
            raise self.fatal
        if self.failures:
            self.raise_failure()  # plain Python would have stopped at that call
        route, c = self.route(fn)
        if route == "submit":
            return self.submit(fn, args, kw, c)
        if route == "store" or not self.any_pending:
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
        self._within_window()
        held = mutates_arguments(fn)
        if held is not None:  # it changes an argument: it gets the program's own objects
            args, kw = resolve_in_place(args), resolve_in_place(kw)
            held = f"it changes an argument ({held})"
        else:
            try:  # the call sees its arguments as they are now, whenever it starts
                args, kw = snapshot(args, "args"), snapshot(kw, "kwargs")
            except Uncopyable as e:  # shared as they are: the program waits for the call to end
                held = f"{e}, which cannot be copied"
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
                schedule += f"; the program waited for it: {held}"
            node = PlanNode(
                i, _name(fn), tuple(sorted({d.node.id for d in deps})),
                time.perf_counter() - self.t0, effects=effects, after=after, schedule=schedule,
            )  # fmt: skip
            for d in deps:
                d.node._consumers.append(fut)
            self.nodes.append(node)
            self.futures.append(fut)
            fut.add_done_callback(functools.partial(self._node_done, i))
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
        out = Pending(fut, node, self)
        if held is not None:
            self.wait_for(out)  # nothing may change its arguments before it has run
        return out

    def _start(self, fn, args, kw, node: PlanNode, fut: cf.Future, deps: list, direct: bool):
        if self.abandoned or any(d.future.cancelled() for d in deps):
            fut.cancel()  # the invocation is over (it raised): not needed
            return
        for d in deps:
            err = d.future.exception()
            if err is not None:  # an input failed: this call never runs, as in plain Python
                node.error = f"input #{d.node.id} failed: {type(err).__name__}"
                fut.set_exception(err)
                return
        for j in node.after:
            if self.futures[j].cancelled():
                fut.cancel()
                return
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
                remote = scheduler.submit(self.executor, fn, *given(args), **given(kw))
                remote.add_done_callback(lambda r: self._finish_remote(r, node, fut))
        except BaseException as e:  # noqa: BLE001 - the executor refused the work
            node.error = f"the executor did not take the call: {type(e).__name__}: {e}"[:200]
            fut.set_exception(e)
            self.fatal = e
            if direct:
                raise

    def _run(self, fn, args, kw, node: PlanNode, fut: cf.Future) -> None:
        if self.abandoned:  # the invocation raised before this call could start
            node.error = "cancelled: the invocation raised before it started"
            fut.set_exception(cf.CancelledError(node.error))
            return
        node.start = time.perf_counter() - self.t0
        try:
            # results of other calls as those calls returned them, never a future
            result = fn(*given(args), **given(kw))
        except BaseException as e:  # noqa: BLE001 - delivered to whoever reads the value
            node.end = time.perf_counter() - self.t0
            node.error = f"{type(e).__name__}: {e}"[:200]
            fut.set_exception(e)
            return
        node.end = time.perf_counter() - self.t0
        keep_result(node, result)
        fut.set_result(result)

    def _finish_remote(self, remote: cf.Future, node: PlanNode, fut: cf.Future) -> None:
        node.end = time.perf_counter() - self.t0
        err = remote.exception() if not remote.cancelled() else cf.CancelledError()
        if err is not None:
            node.error = f"{type(err).__name__}: {err}"[:200]
            fut.set_exception(err)
        else:
            keep_result(node, remote.result())
            fut.set_result(remote.result())

    # -- program order ----------------------------------------------------------------------------
    def _node_done(self, i: int, f: cf.Future) -> None:
        if f.cancelled() or f.exception() is None:
            return
        with self.lock:
            self.failures.add(i)
            listeners, self.listeners = self.listeners, []
        for wake in listeners:
            wake()

    def raise_failure(self, before: int | None = None) -> None:
        """Raise the first failure in program order (waiting only for the calls before it) if a
        call before node ``before`` (default: any) failed and the program has not seen it."""
        with self.lock:
            open_ = sorted(j for j in self.failures if not self.nodes[j].observed)
            self.failures.intersection_update(open_)  # the program saw (and caught) the others
        if open_ and (before is None or open_[0] < before):
            self.settle(upto=open_[0] + 1)

    def wait_for(self, pending: Pending) -> None:
        """The program needs ``pending``'s value: wait for it, unless an earlier call fails
        first (plain Python would have stopped there: raise its error now)."""
        fut = pending.future
        while not fut.done():
            self.raise_failure(before=pending.node.id)
            woke: cf.Future = cf.Future()
            wake = functools.partial(_wake, woke)
            with self.lock:
                self.listeners.append(wake)
            fut.add_done_callback(wake)
            self.raise_failure(before=pending.node.id)  # one that failed meanwhile
            # run no call here unless nobody else does (a busy pool): this thread stays free to
            # raise a failure the moment it happens, and then only calls up to this one
            scheduler.wait(woke, only=functools.partial(self._needed_by, pending.node.id))

    @staticmethod
    def returned(pending: Pending, value: Any) -> Any:
        """``pending``'s result as its call returned it (a copy), else ``value`` as it is now."""
        return given(pending) if pending.node._pristine is not None else value

    def _needed_by(self, k: int, work: Any) -> bool:
        run = work.fn
        return getattr(run, "__self__", None) is self and work.args[3].id <= k

    def _within_window(self) -> None:
        """Before a new call: at most ``window`` earlier calls may still be unfinished (plain
        Python would not have started this one before they ended); wait for the oldest."""
        while len(self.futures) - self.open_from >= self.window:
            i = self.open_from
            if not self.futures[i].done():
                self.wait_for(Pending(self.futures[i], self.nodes[i], self))
            self.raise_failure()
            self.open_from += 1

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
        """At the end of an invocation (``exc``: what the function raised, or None): return the
        exception to raise, the first in program order. Every call ends before a normal return;
        after a failure only the calls before it are waited for, and the rest are cancelled."""
        out: BaseException | None = exc
        try:
            out = self._first_failure(exc)
            return out
        finally:
            self.t_end = time.perf_counter()
            if out is not None:  # the invocation raises: calls not started yet are not needed
                self.abandoned = True
                for f in self.futures:
                    f.cancel()  # only those not running yet
            for n in self.nodes:  # the plan outlives the invocation: drop the results' copies
                n._pristine = None
                n._consumers.clear()

    def _first_failure(self, exc: BaseException | None) -> BaseException | None:
        for err, event in self._events(0, len(self.nodes)):
            if err is None:
                continue
            if err is exc:  # the program's own exception came from here
                if getattr(event, "_seen_at", None) is not None:
                    # calls made after the program saw it (an except or finally block) are plain
                    # Python's too: they end before the invocation does
                    for f in self.futures[event._seen_at :]:
                        scheduler.wait(f)
                break
            if not event.observed:
                _mark(event)
                return err
        return exc

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


def _wake(woke: cf.Future, _f: Any = None) -> None:
    if not woke.done():
        try:
            woke.set_result(None)
        except cf.InvalidStateError:  # woken twice at once
            pass


def _mark(event: Any) -> None:
    if isinstance(event, PlanNode):
        event.observed = True
        eng = XCS.engine
        if event._seen_at is None and eng is not None:
            event._seen_at = len(eng.nodes)
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
        engine = XCS.engine
        if engine is None:
            return fn(*args, **kw)
        return engine.call(fn, *args, **kw)

    def call_now(self, fn: Any, *args: Any, **kw: Any) -> Any:
        engine = XCS.engine
        if engine is None:
            return fn(*args, **kw)
        return engine.call_now(fn, *args, **kw)

    def settle(self) -> None:
        """Before a ``try`` or ``with`` statement: earlier failures are raised outside it."""
        engine = XCS.engine
        if engine is not None and engine.any_pending:
            engine.settle()

    fstring = staticmethod(fstring)
    is_ = staticmethod(Engine.is_)
    is_not = staticmethod(Engine.is_not)


RUNTIME = Runtime()


def current() -> Engine | None:
    """The engine of the ``xcs.jit`` invocation running in this thread / task, if any."""
    return XCS.engine


__all__ = ["Engine", "Plan", "PlanNode", "Stats", "current", "LazyStr"]

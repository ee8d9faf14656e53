"""The scheduler behind ``xcs.jit``: one ``Engine`` per invocation.

Every call the jitted function makes comes here (see ``rewrite.py``) and is routed by what the
callee is:

- **orchestration** (``classify(fn).kind == "orchestration"``): submitted at once as a graph node
  and answered with a ``Pending``. A node whose arguments hold pending values is handed to the
  executor only when they are all done (by completion callbacks: no worker ever blocks waiting for
  another node, so a full pool cannot deadlock), then runs with the real values. A node whose
  input failed fails with the same error without running.
- **storing** builtins (``list.append``, ``dict.update``, ``len``, ``list``, ...): called with the
  pending values as they are, since they only hold references;
- anything else (tensor code, pure functions, builtins, hybrids, methods of real values): called
  in the jitted function's thread after waiting for the pending values in its arguments.

``drain`` waits for every node, so an invocation never returns while a call it made still runs.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextvars
import dataclasses
import inspect
import threading
import time
import types
from typing import Any

from .futures import Deferred, Lazy, LazyStr, Pending, fstring, pending_in, resolve

_current: contextvars.ContextVar[Engine | None] = contextvars.ContextVar(
    "nablax_xcs_engine", default=None
)

_STORING_METHODS = {
    (list, "append"), (list, "extend"), (list, "insert"), (list, "copy"),
    (dict, "update"), (dict, "setdefault"), (dict, "copy"), (dict, "get"), (dict, "pop"),
    (dict, "items"), (dict, "values"), (dict, "keys"),
}  # fmt: skip
# builtins that only hold references (a pending value used *as* the argument still waits through
# its dunder methods: len(p) calls p.__len__)
_STORING_BUILTINS = {len, list, tuple, dict, zip, enumerate, range, reversed, iter}


@dataclasses.dataclass
class PlanNode:
    """One orchestration call of an invocation: times are seconds from the invocation's start."""

    id: int
    name: str
    deps: tuple[int, ...]
    submitted: float
    start: float | None = None
    end: float | None = None
    error: str | None = None
    observed: bool = dataclasses.field(default=False, repr=False)  # its failure reached the code

    @property
    def duration(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """The executed call graph of one ``xcs.jit`` invocation (``f.last_plan()``)."""

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
            lines.append(f"  #{n.id:<3} {span}  {n.name}{deps}{err}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Stats:
    """``f.stats()``: calls of the last invocation, their summed time, the wall time, the overlap
    (summed call time / wall time of the calls) and the time saved against running them one
    after another."""

    calls: int
    busy_s: float
    wall_s: float
    overlap: float
    saved_s: float


class Engine:
    """Schedules one invocation's orchestration calls (see the module docstring)."""

    def __init__(self, executor: cf.Executor, classify) -> None:
        self.executor = executor
        self.classify = classify
        self.t0 = time.perf_counter()
        self.nodes: list[PlanNode] = []
        self.futures: list[cf.Future] = []
        self.lock = threading.Lock()
        self.any_pending = False  # fast path: no lazy value exists yet, nothing to resolve

    # -- the runtime the rewritten function calls (as __xcs__.<name>) -----------------------------
    def call(self, fn: Any, *args: Any, **kw: Any) -> Any:
        route = self.route(fn)
        if route == "submit":
            return self.submit(fn, args, kw)
        if route == "store" or not self.any_pending:
            return fn(*args, **kw)
        if route == "defer":
            if fn.__name__ == "join" and len(args) == 1 and not isinstance(args[0], (list, tuple)):
                args = (list(args[0]),)  # read a generator now, in order, as plain Python would
            if pending_in((args, kw), []):
                return Deferred(fn, args, kw)
            return fn(*args, **kw)
        return fn(*resolve(args), **resolve(kw))

    def route(self, fn: Any) -> str:
        if isinstance(fn, Lazy):
            return "inline"
        if fn in _STORING_BUILTINS if _hashable(fn) else False:
            return "store"
        owner = getattr(fn, "__self__", None)
        if isinstance(fn, types.BuiltinMethodType) and owner is not None:
            if (type(owner), fn.__name__) in _STORING_METHODS:
                return "store"
            if type(owner) is str and fn.__name__ in ("join", "format"):
                return "defer"  # building a prompt from pending parts stays lazy
            return "inline"
        if isinstance(fn, (types.BuiltinFunctionType, type)):
            return "inline"
        if getattr(fn, "__xcs_jit__", False):
            return "store"  # a nested xcs.jit function runs in this engine, lazily
        target = getattr(fn, "__func__", fn)
        if inspect.iscoroutinefunction(target) or inspect.isgeneratorfunction(target):
            return "inline"
        try:
            kind = self.classify(fn).kind
        except Exception:  # noqa: BLE001 - unclassifiable: run in order, the safe route
            return "inline"
        return "submit" if kind == "orchestration" else "inline"

    fstring = staticmethod(fstring)

    @staticmethod
    def is_(a: Any, b: Any) -> bool:
        return resolve(a) is resolve(b)

    @staticmethod
    def is_not(a: Any, b: Any) -> bool:
        return resolve(a) is not resolve(b)

    # -- nodes ------------------------------------------------------------------------------------
    def submit(self, fn: Any, args: tuple, kw: dict) -> Pending:
        deps = pending_in((args, kw), []) if self.any_pending else []
        fut: cf.Future = cf.Future()
        with self.lock:
            node = PlanNode(
                len(self.nodes),
                _name(fn),
                tuple(sorted({d.node.id for d in deps})),
                time.perf_counter() - self.t0,
            )
            self.nodes.append(node)
            self.futures.append(fut)
            self.any_pending = True
        waiting = [d.future for d in deps if not d.future.done()]
        if not waiting:
            self._start(fn, args, kw, node, fut, deps)
        else:
            counter = [len(waiting)]
            lock = threading.Lock()

            def ready(_f: cf.Future) -> None:
                with lock:
                    counter[0] -= 1
                    last = counter[0] == 0
                if last:
                    self._start(fn, args, kw, node, fut, deps)

            for w in waiting:
                w.add_done_callback(ready)
        return Pending(fut, node)

    def _start(self, fn, args, kw, node: PlanNode, fut: cf.Future, deps: list) -> None:
        for d in deps:
            err = d.future.exception()
            if err is not None:  # an input failed: this call never runs, as in plain Python
                node.error = f"input #{d.node.id} failed: {type(err).__name__}"
                fut.set_exception(err)
                return
        if not fut.set_running_or_notify_cancel():
            return

        def run() -> None:
            node.start = time.perf_counter() - self.t0
            try:
                result = fn(*resolve(args), **resolve(kw))
            except BaseException as e:  # noqa: BLE001 - delivered to whoever reads the value
                node.end = time.perf_counter() - self.t0
                node.error = f"{type(e).__name__}: {e}"[:200]
                fut.set_exception(e)
                return
            node.end = time.perf_counter() - self.t0
            fut.set_result(result)

        try:
            self.executor.submit(run)
        except RuntimeError as e:  # executor shut down
            fut.set_exception(e)

    def drain(self, raise_errors: bool = True) -> None:
        """Wait for every node; raise the first failure (in call order) the program has not
        seen (a failure it read, and maybe caught, is not raised again)."""
        i = 0
        while i < len(self.futures):  # nodes may be added while waiting (not by us, but safe)
            f = self.futures[i]
            try:
                f.result()
            except BaseException:
                if raise_errors and not self.nodes[i].observed:
                    for g in self.futures[i + 1 :]:
                        g.cancel()
                    self._wait_all()
                    raise
            i += 1

    def _wait_all(self) -> None:
        for f in list(self.futures):
            try:
                f.result()
            except BaseException:  # noqa: BLE001, S110 - only waiting for them to stop
                pass

    # -- reports ----------------------------------------------------------------------------------
    def plan(self) -> Plan:
        wall = time.perf_counter() - self.t0
        edges = tuple((d, n.id) for n in self.nodes for d in n.deps)
        return Plan(tuple(self.nodes), edges, wall)

    def stats(self) -> Stats:
        ran = [n for n in self.nodes if n.start is not None and n.end is not None]
        busy = sum(n.duration for n in ran)
        if not ran:
            return Stats(len(self.nodes), 0.0, 0.0, 0.0, 0.0)
        span = max(n.end for n in ran) - min(n.start for n in ran)
        return Stats(
            len(self.nodes), busy, span, busy / span if span > 0 else 1.0, max(busy - span, 0.0)
        )


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
        """A call inside ``try``: its result (or exception) arrives before the next statement."""
        out = self.call(fn, *args, **kw)
        if isinstance(out, Pending):
            out.value()
        return out

    fstring = staticmethod(fstring)
    is_ = staticmethod(Engine.is_)
    is_not = staticmethod(Engine.is_not)


RUNTIME = Runtime()


def current() -> Engine | None:
    """The engine of the ``xcs.jit`` invocation running in this thread / task, if any."""
    return _current.get()


__all__ = ["Engine", "Plan", "PlanNode", "Stats", "current", "LazyStr"]

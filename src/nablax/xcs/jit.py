"""``xcs.jit``: run a function with its orchestration calls concurrent by data flow (the
scheduler is ``engine.py``; the call interception is ``rewrite.py``)."""

from __future__ import annotations

import concurrent.futures as cf
import functools
import warnings
from collections.abc import Callable
from typing import Any

from ..errors import XCSError
from . import engine as _engine
from ._context import XCS
from .classify.analysis import classify
from .futures import resolve
from .rewrite import SourceUnavailable, rewrite
from .scheduler import executor_for

# ---- jit -----------------------------------------------------------------------------------------


class JitFunction:
    """A function run by ``xcs.jit`` (see :func:`jit`)."""

    __xcs_jit__ = True

    def __init__(self, fn: Callable, executor: cf.Executor | None, max_workers: int | None):
        functools.update_wrapper(self, fn)
        self._fn = fn
        try:
            self._body = rewrite(fn, _engine.RUNTIME)
        except SourceUnavailable as e:  # run it as written: plain sequential Python
            warnings.warn(
                f"xcs.jit: {e}; {getattr(fn, '__qualname__', fn)} runs unmodified, its calls one "
                f"after another (correct, without concurrency)",
                RuntimeWarning,
                stacklevel=3,
            )
            self._body = fn
        self._executor, self._max_workers = executor, max_workers
        self._last: _engine.Engine | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _engine.current() is not None:  # called inside another invocation: join its engine
            return self._body(*args, **kwargs)
        eng = _engine.Engine(executor_for(self._executor, self._max_workers), classify)
        token = XCS.set_engine(eng)
        try:
            try:
                out = resolve(self._body(*args, **kwargs))
            except BaseException as e:
                first = eng.finish(e)
                if first is e:
                    raise
                raise first from None  # an earlier call failed: plain Python stops there
            first = eng.finish(None)
            if first is not None:
                raise first
            return out
        finally:
            XCS.reset_engine(token)
            self._last = eng

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def last_plan(self) -> _engine.Plan:
        """The call graph of the last invocation: nodes (name, deps, start/end) and edges."""
        if self._last is None:
            raise XCSError(f"xcs.jit: {self.__qualname__} has not been called yet")
        return self._last.plan()

    def stats(self) -> _engine.Stats:
        """Calls, summed call time, wall time, overlap and time saved of the last invocation."""
        if self._last is None:
            raise XCSError(f"xcs.jit: {self.__qualname__} has not been called yet")
        return self._last.stats()


def jit(
    fn: Callable | None = None,
    executor: cf.Executor | None = None,
    max_workers: int | None = None,
):
    """Run ``fn`` with its orchestration calls concurrent by data flow.

    Each call ``fn`` makes to an orchestration function (an LLM, HTTP, file or database call, as
    :func:`classify` decides) is submitted at once and returns a pending value; a call that
    receives pending values (in its arguments, lists, dicts, or strings built with ``+`` or
    f-strings) starts when they are ready, and anything else that needs a value (an ``if``, a
    method, tensor code) waits for it. Orchestration functions get and return real values.

    The program behaves exactly like plain sequential Python (results, the first exception in
    program order, which side effects happen): read-only calls (``classify(f).effects`` False)
    may start early; calls with effects start only after every earlier call succeeded, and later
    calls wait for them; ``try``/``with`` bodies see their calls' exceptions. A call gets its
    arguments as they were when the program made it (copied; see ``_snapshot.py``). A failure
    is raised as soon as plain Python would have raised it (at the program's next call or wait),
    at most ``nx.config.xcs_speculation_window`` calls run ahead of the oldest unfinished one, and
    calls not started when the invocation raises are cancelled. ``executor``: any
    ``concurrent.futures.Executor`` (thread pools, process pools, Dask's
    ``client.get_executor()``); default a shared pool of ``max_workers`` (64) threads. Nesting
    never deadlocks. ``f.last_plan()`` (each call: inputs, timing, why it ran early or waited)
    and ``f.stats()`` describe the last invocation (see ``engine.py``).

    >>> import time
    >>> from nablax import xcs
    >>> @xcs.mark_orchestration
    ... def ask(q):
    ...     time.sleep(0.05)
    ...     return q.upper()
    >>> @xcs.jit
    ... def two(a, b):
    ...     x, y = ask(a), ask(b)          # independent: overlap
    ...     return ask(x + " & " + y)      # waits for both
    >>> two("p", "q")
    'P & Q'
    >>> two.stats().calls, two.last_plan().edges
    (3, ((0, 2), (1, 2)))
    """
    if fn is None:
        return lambda f: jit(f, executor=executor, max_workers=max_workers)
    return JitFunction(fn, executor, max_workers)

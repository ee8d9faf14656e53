"""Where ``xcs`` work runs, and how it waits without deadlocking.

Used by ``xcs.vmap``/``xcs.pmap`` (``transforms.py``) and ``xcs.jit`` (``jit.py``, ``engine.py``).

**Waiting never holds a worker.** Work for an in-process executor (a
``concurrent.futures.ThreadPoolExecutor``, the shared pools included) is put on one process-wide
queue, and the executor is asked to run it. Whoever gets to a piece of work first runs it: the
executor's worker, or a thread that is *waiting* (:func:`wait`) — a waiting thread runs queued
work itself (newest first, which is usually the work it waits for) until its own future is done.
So ``xcs.vmap(xcs.jit(f))`` over 500 items on a pool of one worker finishes: each item's
``jit`` runs the LLM calls it waits for instead of blocking the only worker. A waiting thread
helps at most ``HELP_DEPTH`` levels deep (each level is a Python frame stack), runs the work in an
empty ``contextvars`` context (as a pool worker would), and never helps while it is inside a nablax
transform (the work would see its trace state). When it can't help and queued work stays untaken,
a short-lived overflow thread runs it.

Work for any other executor (a ``ProcessPoolExecutor``, Dask's ``client.get_executor()``) is
submitted as it is: the user's function and its real arguments, which such executors pickle.
Its futures are waited for plainly (the waiting thread is not one of its workers). An error
raised by ``submit`` propagates to the caller at once.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import contextvars
import threading
from typing import Any

from ..core.context import CTX
from ._context import XCS

DEFAULT_WORKERS = 64  # I/O-bound calls: concurrency is about latency hiding, not CPU count
HELP_DEPTH = 8  # nested helping frames per thread before a waiting thread just blocks

_pools: dict[int, cf.ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def executor_for(executor: cf.Executor | None, max_workers: int | None) -> cf.Executor:
    """The given executor, else a shared thread pool (one per ``max_workers`` value)."""
    if executor is not None:
        if not isinstance(executor, cf.Executor):
            raise TypeError(
                f"xcs: executor must be a concurrent.futures.Executor, got "
                f"{type(executor).__name__}"
            )
        return executor
    n = DEFAULT_WORKERS if max_workers is None else int(max_workers)
    if n < 1:
        raise ValueError(f"xcs: max_workers must be at least 1, got {max_workers}")
    with _pool_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = cf.ThreadPoolExecutor(n, thread_name_prefix=f"xcs-{n}")
    return pool


def in_process(executor: cf.Executor) -> bool:
    """True when the executor runs work on threads of this process (so waiting threads may run
    its queued work themselves)."""
    return isinstance(executor, cf.ThreadPoolExecutor)


# ---- the queue of in-process work ---------------------------------------------------------------


class _Work:
    __slots__ = ("fn", "args", "kwargs", "future", "claimed")

    def __init__(self, fn, args, kwargs) -> None:
        self.fn, self.args, self.kwargs = fn, args, kwargs
        self.future: cf.Future = cf.Future()
        self.claimed = False

    def run(self) -> None:
        if not self.future.set_running_or_notify_cancel():
            return
        try:
            result = self.fn(*self.args, **self.kwargs)
        except BaseException as e:  # noqa: BLE001 - delivered through the future
            self.future.set_exception(e)
        else:
            self.future.set_result(result)
        finally:
            self.fn = self.args = self.kwargs = None  # drop references early


_queue: collections.OrderedDict[int, _Work] = collections.OrderedDict()
_cond = threading.Condition(threading.Lock())


def _claim(work: _Work | None = None) -> _Work | None:
    """Take ``work`` (or the newest queued work) off the queue, or None if someone has it."""
    with _cond:
        if work is None:
            if not _queue:
                return None
            _, work = _queue.popitem(last=True)
        elif _queue.pop(id(work), None) is None:
            return None
        work.claimed = True
        return work


def _run_own(work: _Work) -> None:
    """What the executor runs: this work, unless a waiting thread already took it."""
    if _claim(work) is not None:
        _run_helping(work)


def _run_helping(work: _Work) -> None:
    """Run ``work`` in this thread as a pool worker would: in an empty ``contextvars`` context (no
    ``xcs.jit`` invocation, no caller's context variables)."""
    depth = XCS.help_depth
    XCS.help_depth = depth + 1
    try:
        contextvars.Context().run(work.run)
    finally:
        XCS.help_depth = depth


def _can_help() -> bool:
    """A waiting thread runs queued work only when that cannot see its own state: not too deep,
    and not inside a nablax transform (whose per-thread trace state the work would see)."""
    if XCS.help_depth >= HELP_DEPTH:
        return False
    return not (CTX.traces or CTX.vmap_depth or CTX.tracing_depth or CTX.custom_fwd)


def submit(executor: cf.Executor, fn: Any, *args: Any, **kwargs: Any) -> cf.Future:
    """Run ``fn(*args, **kwargs)`` on ``executor``; a future for its result. In-process executors
    get queued work that waiting threads may run themselves (see the module docstring)."""
    if not in_process(executor):
        return executor.submit(fn, *args, **kwargs)
    work = _Work(fn, args, kwargs)
    with _cond:
        _queue[id(work)] = work
        _cond.notify_all()
    try:
        executor.submit(_run_own, work)
    except BaseException:
        with _cond:
            _queue.pop(id(work), None)
        raise
    return work.future


def _notify(_f: cf.Future) -> None:
    with _cond:
        _cond.notify_all()


def _overflow_run() -> None:
    while (work := _claim()) is not None:
        _run_helping(work)


def wait(future: cf.Future, only: Any = None) -> None:
    """Wait until ``future`` is done, running queued in-process work meanwhile. With ``only`` (a
    predicate on queued work), run only such work, and only when nobody else took it for a while
    (so that the thread stays free to react: ``xcs.jit``'s program thread)."""
    if future.done():
        return
    future.add_done_callback(_notify)
    stalled = False
    while not future.done():
        if _can_help() and (only is None or stalled):
            work = _claim() if only is None else _claim_matching(only)
            if work is not None:
                _run_helping(work)
                continue
        with _cond:
            if future.done():
                break
            if stalled and _queue:  # this thread can't help, and nobody took the work for a while
                threading.Thread(target=_overflow_run, name="xcs-overflow", daemon=True).start()
            stalled = bool(_queue)
            _cond.wait(timeout=0.05 if _queue else 1.0)


def _claim_matching(only: Any) -> _Work | None:
    """Take the oldest queued work that ``only(work)`` accepts, or None."""
    with _cond:
        for key, work in _queue.items():
            if only(work):
                del _queue[key]
                work.claimed = True
                return work
    return None


def result(future: cf.Future) -> Any:
    """``future.result()``, helping while waiting (:func:`wait`)."""
    wait(future)
    return future.result()


# ---- a batch of items (xcs.vmap / xcs.pmap) -----------------------------------------------------


def run_items(fn, items, kwargs, executor, return_exceptions: bool, name: str, limit=None) -> list:
    """Run ``fn(*item, **kwargs)`` for every item concurrently; results in input order.

    At most ``limit`` items (default: all) are submitted and not yet finished at any time, so at
    most ``limit`` run at once, whoever runs them (a pool worker or a waiting thread that helps).
    Waiting for the items helps run them (and anything they wait for), so nested maps and jits
    never deadlock, whatever the pool size."""
    n = len(items)
    limit = n if limit is None else max(1, int(limit))
    futures: list[Any] = [None] * n
    results: list = [None] * n
    lock = threading.Lock()
    state: list[Any] = [0, cf.Future()]  # items submitted and not finished; a slot-free signal

    def finished(_f: cf.Future) -> None:
        with lock:
            state[0] -= 1
            signal = state[1]
        if not signal.done():
            try:
                signal.set_result(None)
            except cf.InvalidStateError:  # another item set it first
                pass

    submitted = 0
    try:
        for i in range(n):
            while futures[i] is None or not futures[i].done():
                with lock:
                    state[1] = cf.Future()  # set by any item that finishes from now on
                    running = state[0]
                while submitted < n and running < limit:  # fill the free slots, in order
                    with lock:
                        state[0] += 1
                    f = submit(executor, fn, *items[submitted], **kwargs)
                    futures[submitted] = f
                    submitted += 1
                    running += 1
                    f.add_done_callback(finished)
                if futures[i].done():
                    break
                wait(state[1] if submitted < n else futures[i])
            f = futures[i]
            try:
                results[i] = f.result()
            except Exception as e:  # noqa: BLE001 - reported below, with the index
                results[i] = _failed(e, i, name, return_exceptions, futures)
    except BaseException:
        for f in futures:
            if f is not None:
                f.cancel()
        raise
    return results


def _failed(e: Exception, i: int, name: str, return_exceptions: bool, futures) -> Exception:
    if return_exceptions:
        return e
    for f in futures:
        if f is not None:
            f.cancel()
    e.add_note(f"xcs.{name}: raised by item {i} (the items not yet started were cancelled)")
    e.xcs_index = i  # type: ignore[attr-defined]
    raise e

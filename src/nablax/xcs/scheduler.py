"""Where ``xcs`` work runs: the shared thread pools and running a batch of items concurrently.

Used by ``xcs.vmap``/``xcs.pmap`` (``transforms.py``) and ``xcs.jit`` (``jit.py``, ``engine.py``).
"""

from __future__ import annotations

import concurrent.futures as cf
import threading

DEFAULT_WORKERS = 64  # I/O-bound calls: concurrency is about latency hiding, not CPU count

_pool: cf.ThreadPoolExecutor | None = None
_pools: dict[int, cf.ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def executor_for(executor: cf.Executor | None, max_workers: int | None) -> cf.Executor:
    """The given executor, else a shared thread pool (one per ``max_workers`` value)."""
    global _pool
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


def run_items(fn, items, kwargs, executor, return_exceptions: bool, name: str) -> list:
    """Run ``fn(*item, **kwargs)`` for every item concurrently; results in input order.

    The calling thread helps: it runs, in order, every item the pool has not started yet (a
    future it can still cancel), so a nested map whose pool is busy with its parents still
    progresses, and never deadlocks."""
    futures = [executor.submit(fn, *it, **kwargs) for it in items]
    results: list = [None] * len(items)
    try:
        for i, f in enumerate(futures):
            if f.cancel():
                try:
                    results[i] = fn(*items[i], **kwargs)
                except Exception as e:  # noqa: BLE001 - reported below, with the index
                    results[i] = _failed(e, i, name, return_exceptions, futures)
                continue
            try:
                results[i] = f.result()
            except Exception as e:  # noqa: BLE001
                results[i] = _failed(e, i, name, return_exceptions, futures)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return results


def _failed(e: Exception, i: int, name: str, return_exceptions: bool, futures) -> Exception:
    if return_exceptions:
        return e
    for f in futures:
        f.cancel()
    e.add_note(f"xcs.{name}: raised by item {i} (the items not yet started were cancelled)")
    e.xcs_index = i  # type: ignore[attr-defined]
    raise e

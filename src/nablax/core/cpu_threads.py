"""XLA's CPU compute threads yield to the Python thread that drives nablax (Linux).

XLA's CPU client runs the parallel parts of a program (the blocks of a matmul) on an Eigen thread
pool, one thread per core, named ``tf_XLAEigen``. In eager code the Python thread builds the next
step's graph while the previous step's program runs, so on a machine with few cores a pool thread
that wakes up often lands on the core where Python is running, and the kernel's scheduler lets the
woken thread preempt it: Python stalls while a core may sit idle. On a 2-core machine this made an
eager training step (``bench/bench_digits.py``) 15 to 30% slower, varying from run to run with
where the threads happened to land.

When the option ``batch_xla_threads`` is on (the default), nablax puts those pool threads under
Linux's ``SCHED_BATCH`` policy when it compiles a program: the same share of CPU time as before
(the same nice value), but a thread that wakes up no longer preempts the running one; it waits for
a free core or the end of the running thread's time slice. Nothing else changes: other threads of
the process (the user's, PyTorch's, JAX's own dispatch threads) are never touched, and turning the
option off puts back the normal policy on the threads nablax changed. Where the policy cannot be
set (another OS, a sandbox that forbids it), nothing happens.

XLA's threads are told apart by more than their name, which any thread can set for itself: they
are the native threads named ``tf_XLAEigen`` that Python's ``threading`` module does not know (a
thread started from Python, whatever it calls itself, is never touched). The option is
process-wide (the pool is the whole process's): set it with ``nx.config.update`` or
``NABLAX_BATCH_XLA_THREADS``; ``nx.config.override``, which is scoped to one thread or task,
refuses it.
"""

from __future__ import annotations

import os
import threading

import jax

from .. import _config

POOL_NAME = "tf_XLAEigen"  # the thread name of XLA's CPU intra-op pool (see /proc/<pid>/task)
_TASKS = "/proc/self/task"

_lock = threading.Lock()
_changed: set[int] = set()  # thread ids nablax moved to SCHED_BATCH (and not moved back)
_supported = hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH")


def _python_threads() -> set[int]:
    """Native ids of every thread Python's ``threading`` knows: the user's (and the main thread).
    XLA's pool threads are native threads that never run Python, so they are not among them."""
    ids = {t.native_id for t in threading.enumerate()}
    ids.add(threading.get_native_id())
    return {i for i in ids if i is not None}


def pool_threads() -> list[int]:
    """Native ids of XLA's CPU pool threads in this process (empty where /proc is missing): the
    native threads named ``tf_XLAEigen`` that are not Python threads. A name alone could be any
    thread's (a user thread may set its own OS name), so a Python thread never counts."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return []
    python = _python_threads()
    out = []
    for tid in tids:
        if int(tid) in python:
            continue
        try:
            with open(f"{_TASKS}/{tid}/comm") as f:
                name = f.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name == POOL_NAME:
            out.append(int(tid))
    return out


def apply() -> int:
    """Bring XLA's pool threads in line with the option ``batch_xla_threads``; the number of
    threads whose policy changed. Called when nablax compiles a program (the pool exists once the
    CPU client does; a client made later gets its threads handled at the next compile)."""
    if not _supported:
        return 0
    want_batch = _config.get("batch_xla_threads")
    if not want_batch and not _changed:
        return 0
    if want_batch:
        jax.devices()  # the pool starts with the backends (made on first use: it is about to be)
    changed = 0
    with _lock:
        for tid in pool_threads():  # by name each time: a thread id can be reused
            if not want_batch and tid not in _changed:
                continue
            try:
                policy = os.sched_getscheduler(tid)
                if want_batch and policy == os.SCHED_OTHER:
                    os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
                    _changed.add(tid)
                    changed += 1
                elif not want_batch and policy == os.SCHED_BATCH:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    changed += 1
            except OSError:  # ended, or not permitted here: leave it as it is
                pass
        if not want_batch:
            _changed.clear()
    return changed

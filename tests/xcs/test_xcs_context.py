"""``xcs/_context.py``: the per-thread state of xcs in one object, ``XCS``. The running
``xcs.jit`` engine and ``xcs.grad``'s owner belong to the thread (and task) that set them, work a
pool worker runs sees neither, and the scheduler's help depth is counted per OS thread."""

from __future__ import annotations

import concurrent.futures as cf
import threading

from nablax import xcs
from nablax.xcs import engine, scheduler
from nablax.xcs._context import XCS

SEEN: list = []


@xcs.mark_orchestration(effects=False)
def _probe(tag):
    SEEN.append((tag, XCS.engine, threading.current_thread().name))
    return tag


def _program():
    a = _probe("a")
    SEEN.append(("body", XCS.engine, threading.current_thread().name))
    return a


def test_the_engine_is_the_invocations_and_only_in_its_thread():
    SEEN.clear()
    assert XCS.engine is None and engine.current() is None
    jitted = xcs.jit(_program, max_workers=1)
    assert jitted() == "a"
    assert XCS.engine is None  # reset after the invocation
    by_tag = {tag: (eng, thread) for tag, eng, thread in SEEN}
    body_engine, body_thread = by_tag["body"]
    assert body_engine is not None and body_thread == threading.current_thread().name
    call_engine, call_thread = by_tag["a"]
    if call_thread != body_thread:  # run by a pool worker: it sees no invocation
        assert call_engine is None
    assert jitted.last_plan().nodes  # the engine that was set recorded the call


def test_set_and_reset_nest():
    outer, inner = object(), object()
    t1 = XCS.set_engine(outer)
    try:
        t2 = XCS.set_engine(inner)
        assert XCS.engine is inner
        XCS.reset_engine(t2)
        assert XCS.engine is outer
    finally:
        XCS.reset_engine(t1)
    assert XCS.engine is None


def test_grad_owner_and_help_depth_are_per_thread():
    seen = {}
    with XCS.owning_grad("loss"):
        XCS.help_depth = 3
        try:
            with cf.ThreadPoolExecutor(1) as pool:
                seen = pool.submit(lambda: (XCS.grad_owner, XCS.help_depth)).result()
            assert (XCS.grad_owner, XCS.help_depth) == ("loss", 3)
        finally:
            XCS.help_depth = 0
    assert seen == ("?", 0)
    assert XCS.grad_owner == "?"


def test_a_thread_that_helps_while_waiting_counts_its_depth():
    depths = []
    pool = scheduler.executor_for(None, 1)
    blocker = threading.Event()
    busy = scheduler.submit(pool, blocker.wait, 5)  # the only worker is busy
    try:
        inner = scheduler.submit(pool, lambda: depths.append(XCS.help_depth) or XCS.engine)
        token = XCS.set_engine(object())  # this thread's invocation ...
        try:
            got = scheduler.result(inner)  # ... is not seen by the work it runs while waiting
        finally:
            XCS.reset_engine(token)
        assert got is None and depths == [1] and XCS.help_depth == 0
    finally:
        blocker.set()
        scheduler.result(busy)

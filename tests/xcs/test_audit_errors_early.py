"""Audit (issue 35, finding 9): under ``xcs.jit`` an error surfaces as soon as plain Python would
have raised it (not after every call started early has finished), speculation is bounded by
``nx.config.xcs_speculation_window``, and calls that are not needed are cancelled. The oracle is
plain sequential Python: the same exception, and no more calls than the window allows."""

from __future__ import annotations

import threading
import time

import pytest

import nablax as nx
from nablax import xcs

_lock = threading.Lock()
CALLS: list = []
RELEASE = threading.Event()  # the "never returns" call waits for this (released after each test)


@pytest.fixture(autouse=True)
def _reset():
    CALLS.clear()
    RELEASE.clear()
    yield
    RELEASE.set()


@xcs.mark_orchestration(effects=False)
def slow(x, delay=2.0):
    with _lock:
        CALLS.append(("slow", x))
    time.sleep(delay)
    return x


@xcs.mark_orchestration(effects=False)
def hang(x):
    RELEASE.wait(30)  # a call that does not return while the test runs
    return x


@xcs.mark_orchestration(effects=False)
def fails(x, delay=0.02):
    time.sleep(delay)
    raise ValueError(f"failed on {x}")


@xcs.mark_orchestration(effects=False)
def paid(i):
    with _lock:
        CALLS.append(("paid", i))
    time.sleep(0.005)
    if i == 2:
        raise ValueError("item 2 failed")
    return i


def _raises_fast(f, *args, limit=1.0):
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="failed"):
        f(*args)
    wall = time.perf_counter() - t0
    assert wall < limit, f"the error surfaced after {wall:.2f} s"


def p_read_later(x):
    a = fails(x)
    b = slow(x)  # started early; plain Python never starts it
    return a + b


def p_never_returns(x):
    a = fails(x)
    b = hang(x)
    return str(b) + a


def p_result_unused(x):
    fails(x)
    return slow(x)


def p_lazy_string(x):
    a = fails(x)
    b = slow(x)
    return f"{b}: {a}"


@pytest.mark.parametrize("program", [p_read_later, p_never_returns, p_result_unused, p_lazy_string])
def test_error_surfaces_without_waiting_for_later_calls(program):
    with pytest.raises(ValueError, match="failed on q"):
        program("q")  # the oracle
    _raises_fast(xcs.jit(program), "q")


def p_loop(items):
    out = []
    for i in items:
        out.append(paid(i))
    return out


def test_speculation_past_a_failure_is_bounded_by_the_window():
    with pytest.raises(ValueError, match="item 2"):
        p_loop(range(200))
    assert len(CALLS) == 3  # plain Python: items 0, 1, 2
    for window in (1, 4, 16):
        CALLS.clear()
        with nx.config.override(xcs_speculation_window=window):
            with pytest.raises(ValueError, match="item 2 failed"):
                xcs.jit(p_loop)(range(200))
        time.sleep(0.05)  # anything still running ends
        assert len(CALLS) <= 3 + window, (window, len(CALLS))
    CALLS.clear()
    with pytest.raises(ValueError, match="item 2 failed"):
        xcs.jit(p_loop)(range(200))
    time.sleep(0.05)
    assert len(CALLS) <= 3 + nx.config.xcs_speculation_window < 200


def test_window_of_one_runs_calls_one_at_a_time():
    @xcs.jit
    def two():
        return slow("a", 0.05), slow("b", 0.05)

    with nx.config.override(xcs_speculation_window=1):
        assert two() == ("a", "b")
    a, b = two.last_plan().nodes
    assert b.start >= a.end
    assert two() == ("a", "b")  # the default window overlaps them
    a, b = two.last_plan().nodes
    assert b.start < a.end


def test_calls_not_started_are_cancelled_after_a_failure():
    @xcs.jit
    def program():
        a = fails("x", 0.01)
        later = [slow(i, 0.3) for i in range(40)]  # more than the pool runs at once
        return a, later

    with nx.config.override(xcs_speculation_window=64):
        _raises_fast(xcs.jit(program.__wrapped__, max_workers=2), limit=1.0)
    time.sleep(0.7)
    assert len(CALLS) <= 4  # the two workers' calls (twice at most); the rest never ran


def p_caught_then_finally():
    try:
        fails("x")
    except ValueError:
        pass
    out = slow("after", 0.01)
    try:
        fails("y")
    finally:
        slow("cleanup", 0.01)
    return out


def test_handled_failures_and_finally_calls_stay_as_in_plain_python():
    with pytest.raises(ValueError, match="failed on y"):
        p_caught_then_finally()
    plain = sorted(CALLS)
    CALLS.clear()
    with pytest.raises(ValueError, match="failed on y"):
        xcs.jit(p_caught_then_finally)()
    assert sorted(CALLS) == plain == [("slow", "after"), ("slow", "cleanup")]


def test_earlier_failure_still_wins_over_a_later_one():
    @xcs.jit
    def program():
        a = fails("first", 0.2)
        b = fails("second", 0.01)  # fails sooner, but comes later in program order
        return a, b

    with pytest.raises(ValueError, match="failed on first"):
        program()


def test_window_option_is_validated():
    with pytest.raises(nx.errors.ConfigError):
        with nx.config.override(xcs_speculation_window=0):
            pass

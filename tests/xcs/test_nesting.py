"""No deadlock, whatever nests in what (scheduler.py): waiting threads run queued work themselves.

Every nesting of xcs.vmap and xcs.jit on executors of 1, 2 and the default number of workers,
with 1, 3, 64 and 500 items, must finish within a deadline and give plain Python's results.
"""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import pytest

from nablax import xcs
from nablax.xcs import scheduler


@xcs.mark_orchestration
def ask(q):
    time.sleep(0.0005)
    return q.upper()


@xcs.mark_orchestration
def ask_item(q):
    return ask(q)


@xcs.jit
def two_calls(q):
    a, b = ask(q), ask(q + "b")
    return a + b


def _jit_of_vmap(executor):
    @xcs.jit(executor=executor)
    def f(qs):
        return xcs.vmap(ask_item, executor=executor)(qs)

    return f


def _jit_of_jit(executor):
    inner = xcs.jit(two_calls.__wrapped__, executor=executor)

    @xcs.jit(executor=executor)
    def outer(q):
        return inner(q) + ask("!")

    return outer


NESTINGS = {
    "vmap(jit)": lambda ex: (xcs.vmap(two_calls, executor=ex), lambda q: two_calls.__wrapped__(q)),
    "vmap(vmap(jit))": lambda ex: (
        lambda qs: xcs.vmap(xcs.vmap(two_calls, executor=ex), executor=ex)([[q, q] for q in qs]),
        None,
    ),
    "jit(vmap)": lambda ex: (_jit_of_vmap(ex), None),
    "vmap(jit(jit))": lambda ex: (xcs.vmap(_jit_of_jit(ex), executor=ex), None),
}


def _expected(nesting: str, qs: list[str]):
    pair = [q.upper() + q.upper() + "B" for q in qs]
    if nesting == "vmap(jit)":
        return pair
    if nesting == "vmap(vmap(jit))":
        return [[p, p] for p in pair]
    if nesting == "jit(vmap)":
        return [q.upper() for q in qs]
    return [p + "!" for p in pair]


def _run_with_deadline(fn, arg, seconds: float):
    out: dict = {}

    def target():
        try:
            out["value"] = fn(arg)
        except BaseException as e:  # noqa: BLE001 - re-raised in the test thread
            out["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"deadlock: no result after {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture(scope="module")
def pools():
    made = {"1": cf.ThreadPoolExecutor(1), "2": cf.ThreadPoolExecutor(2), "default": None}
    yield made
    for ex in made.values():
        if ex is not None:
            ex.shutdown(wait=False)


@pytest.mark.parametrize("n", [1, 3, 64, 500])
@pytest.mark.parametrize("workers", ["1", "2", "default"])
@pytest.mark.parametrize("nesting", list(NESTINGS))
def test_every_nesting_finishes(pools, nesting, workers, n):
    fn, _ = NESTINGS[nesting](pools[workers])
    qs = [f"q{i}" for i in range(n)]
    assert _run_with_deadline(fn, qs, 60.0) == _expected(nesting, qs)


def test_jit_calling_vmap_on_the_same_one_worker_pool():
    ex = cf.ThreadPoolExecutor(1)

    @xcs.mark_orchestration
    def fan_out(qs):  # an orchestration call that itself maps on the same executor
        return xcs.vmap(ask, executor=ex)(qs)

    @xcs.jit(executor=ex)
    def f(groups):
        return [fan_out(g) for g in groups]

    groups = [[f"g{i}x{j}" for j in range(5)] for i in range(6)]
    assert _run_with_deadline(f, groups, 30.0) == [[q.upper() for q in g] for g in groups]
    ex.shutdown()


def test_helping_is_bounded_in_depth():
    """A waiting thread helps only HELP_DEPTH levels deep; deeper waits still finish (an overflow
    thread takes the work nobody else can)."""
    ex = cf.ThreadPoolExecutor(1)

    def nest(k: int) -> int:
        if k == 0:
            return 0
        return scheduler.result(scheduler.submit(ex, nest, k - 1)) + 1

    assert _run_with_deadline(nest, 3 * scheduler.HELP_DEPTH, 30.0) == 3 * scheduler.HELP_DEPTH
    ex.shutdown()


def test_an_executor_that_refuses_work_fails_at_once():
    ex = cf.ThreadPoolExecutor(1)
    ex.shutdown()

    @xcs.jit(executor=ex)
    def f(q):
        return ask(q)

    t = time.perf_counter()
    with pytest.raises(RuntimeError, match="shutdown"):
        f("x")
    assert time.perf_counter() - t < 1.0
    with pytest.raises(RuntimeError, match="shutdown"):
        xcs.vmap(ask, executor=ex)(["a", "b"])


def test_work_run_by_a_waiting_thread_sees_no_invocation():
    """The waiting thread (here the caller, since the only worker is busy) runs an orchestration
    call as a pool worker would: outside the caller's xcs.jit invocation."""
    ex = cf.ThreadPoolExecutor(1)
    seen = []
    gate = threading.Event()
    ex.submit(gate.wait, 5.0)  # keep the only worker busy

    @xcs.mark_orchestration
    def probe(q):
        from nablax.xcs import engine

        seen.append(engine.current())
        return ask(q) + "?"  # called plainly: a value, not a pending one

    @xcs.jit(executor=ex)
    def f(q):
        return probe(q)

    try:
        assert _run_with_deadline(f, "a", 10.0) == "A?"
        assert seen == [None]
    finally:
        gate.set()
        ex.shutdown()

"""xcs.jit behaves exactly like plain sequential Python: results, the first exception in program
order, and which side effects happen (engine.py, futures.py, rewrite.py).

Every program here is run twice, plainly and under ``xcs.jit``, and the two runs are compared:
the oracle is the same Python function run without xcs.
"""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

from nablax import xcs

LOG: list[str] = []  # the external world: what effects happened, in order
_lock = threading.Lock()


@xcs.mark_orchestration(effects=False)
def llm(q, fail=False, delay=0.02):
    time.sleep(delay)
    if fail:
        raise ValueError(f"llm failed on {q}")
    return str(q).upper()


@xcs.mark_orchestration(effects=True)
def deliver(body, delay=0.0):
    time.sleep(delay)
    with _lock:
        LOG.append(f"deliver:{body}")
    return "ok"


@xcs.mark_orchestration
def send_email(body):  # effects inferred from the name
    with _lock:
        LOG.append(f"email:{body}")
    return "sent"


def _outcome(fn, *args):
    """(result or exception type and message, effects that happened)."""
    LOG.clear()
    try:
        out = ("ok", fn(*args))
    except Exception as e:  # noqa: BLE001 - compared below
        out = ("raised", type(e).__name__, str(e))
    return out, list(LOG)


def same_as_plain(fn, *args):
    plain = _outcome(fn, *args)
    jitted = _outcome(xcs.jit(fn), *args)
    assert jitted == plain, f"xcs.jit: {jitted}\nplain:   {plain}"
    return plain


# ---- effects wait for every earlier call ---------------------------------------------------------


def p_fail_then_email():
    llm("validate", fail=True)
    send_email("hello")


def p_fail_then_deliver_in_loop():
    for i in range(3):
        llm(f"check {i}", fail=(i == 1))
        deliver(f"msg {i}")


def p_print_after_failure():
    llm("x", fail=True)
    print("unreachable")  # an effect (stdout): never printed


def test_an_effect_never_happens_after_an_earlier_failure(capsys):
    assert same_as_plain(p_fail_then_email)[1] == []
    assert same_as_plain(p_fail_then_deliver_in_loop)[1] == ["deliver:msg 0"]
    same_as_plain(p_print_after_failure)
    assert "unreachable" not in capsys.readouterr().out


def p_reads_around_writes():
    a = llm("a", delay=0.05)
    deliver("first", delay=0.02)
    b = llm("b")
    deliver("second " + b)
    return a + b


def test_read_only_calls_start_early_and_effects_wait_in_order():
    assert same_as_plain(p_reads_around_writes) == (
        ("ok", "AB"),
        ["deliver:first", "deliver:second B"],
    )
    f = xcs.jit(p_reads_around_writes)
    f()
    nodes = f.last_plan().nodes
    assert [n.effects for n in nodes] == [False, True, False, True]
    assert nodes[0].early and nodes[0].schedule.startswith("early: read-only")
    assert nodes[1].after == (0,) and nodes[1].schedule.startswith("waited: has effects")
    assert nodes[2].after == (1,) and "waited for #1" in nodes[2].schedule
    assert nodes[1].start >= nodes[0].end  # the write waited for the earlier read
    assert nodes[2].start >= nodes[1].end  # the later read waited for the write
    assert "waited: has effects" in str(f.last_plan())


def test_speculative_reads_overlap():
    @xcs.jit
    def fan(qs):
        return [llm(q, delay=0.1) for q in qs]

    t = time.perf_counter()
    assert fan(list("abcd")) == list("ABCD")
    assert time.perf_counter() - t < 0.3  # sequential: 0.4 s
    assert all(n.early for n in fan.last_plan().nodes)


# ---- the first error in program order wins ------------------------------------------------------


def p_two_failures():
    a = llm("slow", fail=True, delay=0.15)
    b = llm("fast", fail=True, delay=0.0)
    return a + b


def p_failure_then_inline_error():
    llm("first", fail=True, delay=0.05)
    return 1 / 0


def p_failure_then_read_of_later_failure():
    llm("first", fail=True, delay=0.1)
    b = llm("second", fail=True, delay=0.0)
    return len(b)


def test_first_error_in_program_order():
    assert same_as_plain(p_two_failures)[0] == ("raised", "ValueError", "llm failed on slow")
    assert same_as_plain(p_failure_then_inline_error)[0][2] == "llm failed on first"
    assert same_as_plain(p_failure_then_read_of_later_failure)[0][2] == "llm failed on first"


def p_lazy_concat_type_error():
    a = llm("a")
    _ = a + 1  # TypeError in plain Python, even though the value is never used
    deliver("never")


def test_a_lazy_expression_error_is_raised_in_order():
    out, effects = same_as_plain(p_lazy_concat_type_error)
    assert out[:2] == ("raised", "TypeError") and effects == []


# ---- try / with see exactly their body's exceptions ----------------------------------------------


def p_suppress():
    with contextlib.suppress(ValueError):
        llm("x", fail=True)
    return "after"


def p_try_around_helper():
    def helper(q):
        r = llm(q, fail=True)
        return r + "?"

    try:
        return helper("h")
    except ValueError as e:
        return f"caught {e}"


def _module_helper(q):
    return llm(q, fail=True) + "?"


def p_try_around_module_helper():
    try:
        out = _module_helper("m")
    except ValueError:
        out = "fallback"
    return out


def p_earlier_failure_not_caught_by_later_try():
    a = llm("before", fail=True, delay=0.05)
    try:
        b = llm("inside")
    except ValueError:
        return "wrongly caught"
    return a + b


def p_finally_effect_runs():
    try:
        llm("x", fail=True)
    finally:
        deliver("cleanup")


class _Ctx:
    def __enter__(self):
        LOG.append("enter")
        return self

    def __exit__(self, et, ev, tb):
        LOG.append(f"exit:{et.__name__ if et else None}")
        return False


def p_context_manager_sees_error():
    with _Ctx():
        llm("x", fail=True)


@pytest.mark.parametrize(
    "program",
    [
        p_suppress,
        p_try_around_helper,
        p_try_around_module_helper,
        p_earlier_failure_not_caught_by_later_try,
        p_finally_effect_runs,
        p_context_manager_sees_error,
    ],
)
def test_try_and_with_blocks(program):
    same_as_plain(program)


def test_try_and_with_outcomes_are_the_plain_ones():
    assert same_as_plain(p_suppress)[0] == ("ok", "after")
    assert same_as_plain(p_try_around_helper)[0] == ("ok", "caught llm failed on h")
    assert same_as_plain(p_earlier_failure_not_caught_by_later_try)[0][2] == "llm failed on before"
    assert same_as_plain(p_finally_effect_runs)[1] == ["deliver:cleanup"]
    assert same_as_plain(p_context_manager_sees_error)[1] == ["enter", "exit:ValueError"]


# ---- lambdas, lazy concatenation, wall time ------------------------------------------------------


def test_lambdas_are_rewritten():
    f = xcs.jit(lambda q: llm(q) + "!")
    assert f("x") == "X!"
    assert [n.name for n in f.last_plan().nodes] == ["llm"]
    g, h = xcs.jit(lambda q: llm(q)), xcs.jit(lambda q: llm(q) + llm(q + "2"))  # one line, two
    assert g("a") == "A" and h("b") == "BB2" and len(h.last_plan().nodes) == 2
    try:
        k = xcs.jit(lambda q: llm(q) + "?")  # a lambda on a `try:` body line
    finally:
        pass
    assert k("t") == "T?"


def test_pending_plus_pending_stays_lazy():
    @xcs.jit
    def two(q):
        a, b = llm(q, delay=0.1), llm(q + "2", delay=0.1)
        ab = a + b  # does not wait
        c = llm("independent", delay=0.1)  # so this one starts at once
        return llm(ab, delay=0.0), c

    t = time.perf_counter()
    assert two("x") == ("XX2", "INDEPENDENT")
    assert time.perf_counter() - t < 0.28  # one after another: 0.3 s
    plan = two.last_plan()
    assert set(plan.edges) == {(0, 3), (1, 3)}
    assert plan.nodes[2].start < plan.nodes[0].end


def test_wall_time_is_the_runs_own():
    @xcs.jit
    def quick():
        return llm("q", delay=0.05)

    quick()
    time.sleep(0.3)
    wall = quick.last_plan().wall_s
    assert 0.05 <= wall < 0.3  # the 0.3 s sleep between the calls is not counted


# ---- bookkeeping is not an effect ----------------------------------------------------------------


def p_bookkeeping():
    log = []
    for q in ("a", "b"):
        log.append(q)
        r = llm(q)
        log.append(r)
    return log


def test_in_memory_bookkeeping_keeps_results():
    assert same_as_plain(p_bookkeeping)[0] == ("ok", ["a", "A", "b", "B"])
    f = xcs.jit(p_bookkeeping)
    f()
    assert all(n.early for n in f.last_plan().nodes)


@xcs.mark_hybrid(effects=True)
def store_embedding(text):  # runs inline (a hybrid), in the jitted function's thread
    LOG.append(f"store:{text}")
    return len(text)


@xcs.mark_hybrid(effects=False)
def read_back(text):
    return LOG.count(f"store:{text}")


def p_inline_hybrid_effects():
    a = llm("a", delay=0.05)
    llm("b", fail=True, delay=0.02)
    return store_embedding(a)


def p_inline_read_after_write():
    store_embedding("k")
    return read_back("k")


def test_inline_calls_with_effects_wait_for_earlier_calls():
    out, effects = same_as_plain(p_inline_hybrid_effects)
    assert out[:2] == ("raised", "ValueError") and effects == []
    assert same_as_plain(p_inline_read_after_write) == (("ok", 1), ["store:k"])


def p_tagged(tag):
    a = llm(tag, delay=0.01)
    deliver(f"{tag}-1", delay=0.01)
    b = llm(a)
    deliver(f"{tag}-2 {b}")
    return b


def test_concurrent_invocations_keep_their_own_order():
    import concurrent.futures as cf

    LOG.clear()
    f = xcs.jit(p_tagged)
    tags = [f"t{i}" for i in range(8)]
    with cf.ThreadPoolExecutor(4) as ex:
        outs = list(ex.map(f, tags))
    assert outs == [t.upper() for t in tags]
    for t in tags:  # each invocation's effects happened once, in its own program order
        first = LOG.index(f"deliver:{t}-1")
        assert LOG.index(f"deliver:{t}-2 {t.upper()}") > first
    assert len(LOG) == 16

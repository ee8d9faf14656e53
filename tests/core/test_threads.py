"""One interpreter context per thread (core/context.py), and the global random stream in threads.

Each test makes two threads meet at the exact moment that used to leak state: one thread is
inside a transform (staging under ``nx.compile``, inside ``nx.vmap``, inside ``nx.grad``) while the
other runs eager code. Barriers make the interleaving deterministic.
"""

from __future__ import annotations

import threading

import jax
import numpy as np
import pytest

import nablax as nx


def _run_threads(*targets, timeout=60.0):
    errors: list = []

    def wrap(fn):
        def run():
            try:
                fn()
            except BaseException as e:  # noqa: BLE001 - reported in the main thread
                errors.append(e)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
        assert not t.is_alive(), "a thread hung"
    if errors:
        raise errors[0]


def test_eager_random_in_one_thread_while_another_traces_compile():
    inside, done = threading.Event(), threading.Event()
    out: dict = {}

    @nx.compile
    def traced(x):
        inside.set()
        assert done.wait(30)  # stay inside the trace while the other thread works
        return x * 2

    def tracer():
        out["compiled"] = traced(nx.ones(3)).tolist()

    def eager():
        assert inside.wait(30)
        try:
            nx.random.seed(1)
            v = nx.random.normal(shape=(4,))
            out["eager"] = (v * 1.0).sum().item()  # a realization in this thread
        finally:
            done.set()

    _run_threads(tracer, eager)
    assert out["compiled"] == [2.0, 2.0, 2.0]
    nx.random.seed(1)
    assert out["eager"] == pytest.approx(nx.random.normal(shape=(4,)).sum().item())


def test_pending_work_of_a_tracing_thread_never_joins_another_threads_program():
    # While thread A stages a function, it holds pending tensors built on placeholders; thread B's
    # realization must not pull them into its program (they have no value).
    inside, done = threading.Event(), threading.Event()
    out: dict = {}

    @nx.compile
    def traced(x):
        y = x + 1  # pending, built on a placeholder
        inside.set()
        assert done.wait(30)
        return y

    def tracer():
        out["a"] = traced(nx.ones(2)).tolist()

    def other():
        assert inside.wait(30)
        try:
            w = nx.ones(2) * 3
            out["b"] = w.tolist()
        finally:
            done.set()

    _run_threads(tracer, other)
    assert out == {"a": [2.0, 2.0], "b": [3.0, 3.0]}
    # staged, not fallen back to eager: another thread's realization is no graph break here
    assert traced.cache_info().executables == 1


def test_vmap_level_of_one_thread_is_invisible_to_another():
    inside, done = threading.Event(), threading.Event()
    out: dict = {}

    def per_example(r):
        inside.set()
        assert done.wait(30)
        return r.sum()

    def mapper():
        out["v"] = nx.vmap(per_example)(nx.tensor([[1.0, 2.0], [3.0, 4.0]])).tolist()

    def plain():
        assert inside.wait(30)
        try:
            x = nx.tensor([1.0, 2.0, 3.0])
            out["bool"] = bool(x.sum() > 5)  # would raise "batched" if the level leaked
            out["g"] = nx.grad(lambda t: (t * t).sum())(x).tolist()
        finally:
            done.set()

    _run_threads(mapper, plain)
    assert out == {"v": [3.0, 7.0], "bool": True, "g": [2.0, 4.0, 6.0]}


def test_grad_trace_of_one_thread_does_not_nest_another_threads_grad():
    inside, done = threading.Event(), threading.Event()
    out: dict = {}

    def slow_loss(x):
        inside.set()
        assert done.wait(30)
        return (x**3).sum()

    def a():
        out["a"] = nx.grad(slow_loss)(nx.tensor([1.0, 2.0])).tolist()

    def b():
        assert inside.wait(30)
        try:
            out["b"] = nx.grad(lambda x: (x**2).sum())(nx.tensor([3.0])).tolist()
        finally:
            done.set()

    _run_threads(a, b)
    assert out == {"a": [3.0, 12.0], "b": [6.0]}


def _draw_in_threads(n_threads: int, s: int) -> list:
    nx.random.seed(s)
    results: list = [None] * n_threads
    order = [threading.Event() for _ in range(n_threads + 1)]
    order[0].set()

    def worker(i):
        def run():
            assert order[i].wait(30)  # first draws in a fixed order: reproducible streams
            results[i] = nx.random.normal(shape=(3,)).tolist()
            order[i + 1].set()

        return run

    _run_threads(*[worker(i) for i in range(n_threads)])
    return results


def test_worker_threads_follow_the_seed_and_never_repeat_each_other():
    a = _draw_in_threads(3, 7)
    b = _draw_in_threads(3, 7)
    c = _draw_in_threads(3, 8)
    assert a == b  # same seed, same order of first draws: the same numbers
    flat_a = [tuple(r) for r in a]
    assert len(set(flat_a)) == 3  # threads never share a stream
    for ra, rc in zip(a, c):
        assert ra != rc  # another seed changes every thread's numbers
    # the rule, as documented in nx.random.seed: worker n draws from fold_in(key(seed), n)
    base = jax.random.key(7, impl="threefry2x32")
    for n, row in enumerate(a, start=1):
        k = jax.random.fold_in(base, n)
        _, sub = jax.random.split(k)
        np.testing.assert_allclose(row, np.asarray(jax.random.normal(sub, (3,))), rtol=1e-6)


def test_seeding_thread_keeps_the_single_threaded_stream():
    nx.random.seed(11)
    got = nx.random.normal(shape=(2,)).tolist()
    _, sub = jax.random.split(jax.random.key(11, impl="threefry2x32"))
    np.testing.assert_allclose(got, np.asarray(jax.random.normal(sub, (2,))), rtol=1e-6)


# ---- every field of the context is per thread (core/context.py) --------------------------------


def _fresh_context_seen_from_a_new_thread() -> dict:
    """The transform fields of ``CTX`` as a thread started now sees them."""
    from nablax.core.context import CTX

    seen: dict = {}

    def look():
        seen.update(
            traces=list(CTX.traces),
            vmap_depth=CTX.vmap_depth,
            tracing_depth=CTX.tracing_depth,
            cf_depth=CTX.cf_depth,
            scalar_args=len(CTX.scalar_args),
            custom_fwd=list(CTX.custom_fwd),
            autocast=CTX.autocast,
            random_key=CTX.random_key,
        )

    _run_threads(look)
    return seen


FRESH = {
    "traces": [],
    "vmap_depth": 0,
    "tracing_depth": 0,
    "cf_depth": 0,
    "scalar_args": 0,
    "custom_fwd": [],
    "autocast": None,
    "random_key": None,
}


def test_a_thread_started_inside_every_transform_sees_none_of_it():
    from nablax.core.context import CTX

    seen: dict = {}

    @nx.compile
    def staged(x, n):  # nx.compile with a traced Python number, around grad, vmap and cond
        assert CTX.tracing_depth == 1 and len(CTX.scalar_args) == 1

        def loss(t):
            def body(r):
                def branch(v):
                    assert CTX.cf_depth == 1 and CTX.traces and CTX.vmap_depth == 0
                    seen["inside"] = _fresh_context_seen_from_a_new_thread()
                    return v * 2

                return nx.cond(r.sum() > 0, branch, lambda v: v * 3, r)

            return nx.vmap(body)(t).sum() * n

        with nx.autocast(nx.bfloat16):
            return nx.grad(loss)(x)

    nx.random.normal(shape=(1,))  # this thread's stream exists: a new thread has none yet
    out = staged(nx.tensor([[1.0, 2.0], [-3.0, -4.0]]), 5)
    np.testing.assert_allclose(out.numpy(), [[10.0, 10.0], [15.0, 15.0]])
    assert seen["inside"] == FRESH
    assert CTX.cf_depth == 0 and CTX.tracing_depth == 0 and not CTX.traces


def test_two_threads_tracing_compile_keep_their_own_python_number_arguments():
    # both threads are inside their nx.compile trace at once; each sees only its own traced
    # Python numbers (CTX.scalar_args), and both results are right
    from nablax.core.context import CTX

    both_inside = threading.Barrier(2, timeout=30)
    out: dict = {}

    def make(tag):
        @nx.compile
        def f(x, scale, shift):
            out[tag + "_labels"] = sorted(a.label for a in CTX.scalar_args.values())
            out[tag + "_fns"] = {a.fn for a in CTX.scalar_args.values()}
            both_inside.wait()  # the other thread is tracing too
            both_inside.wait()  # ... and has looked at its own arguments
            return x * scale + shift

        f.__qualname__ = f"f_{tag}"
        return f

    fa, fb = make("a"), make("b")

    def a():
        out["a"] = fa(nx.tensor([1.0, 2.0]), 3, 0.5).tolist()

    def b():
        out["b"] = fb(nx.tensor([1.0, 2.0, 3.0]), 2.0, -1).tolist()

    _run_threads(a, b)
    assert out["a"] == [3.5, 6.5] and out["b"] == [1.0, 3.0, 5.0]
    assert out["a_labels"] == out["b_labels"] and len(out["a_labels"]) == 2
    assert out["a_fns"] == {"f_a"} and out["b_fns"] == {"f_b"}


def test_a_thread_staging_a_control_flow_body_leaves_another_threads_gradients_alone():
    # thread A waits inside an nx.while_loop body (CTX.cf_depth 1 there); thread B differentiates
    # through its own nx.cond meanwhile: its node keeps its residuals as at top level
    from nablax.core.context import CTX

    inside, done = threading.Event(), threading.Event()
    out: dict = {}

    def body(c):
        i, v = c
        inside.set()
        assert done.wait(30)
        return i + 1, v * 2

    def a():
        _, v = nx.while_loop(lambda c: c[0] < 3, body, (nx.tensor(0), nx.tensor(1.5)))
        out["a"] = v.item()

    def b():
        assert inside.wait(30)
        try:
            out["b_depth"] = CTX.cf_depth

            def f(x):
                return nx.cond(x.sum() > 0, lambda t: (t**3).sum(), lambda t: t.sum(), x)

            out["b"] = nx.grad(f)(nx.tensor([1.0, 2.0])).tolist()
        finally:
            done.set()

    _run_threads(a, b)
    assert out == {"a": 12.0, "b_depth": 0, "b": [3.0, 12.0]}


def test_interleaved_draws_of_two_threads_follow_their_own_streams():
    # draws alternate between the threads (A, B, A, B, ...): each thread's numbers are exactly
    # its own stream's (fold_in(key(seed), n), split once per draw), never the other's
    nx.random.seed(5)
    turns = [threading.Event() for _ in range(7)]
    turns[0].set()
    got: dict = {"a": [], "b": []}

    def drawer(tag, first):
        def run():
            for k in range(first, 6, 2):
                assert turns[k].wait(30)
                got[tag].append(nx.random.uniform(shape=(2,)).tolist())
                turns[k + 1].set()

        return run

    _run_threads(drawer("a", 0), drawer("b", 1))
    base = jax.random.key(5, impl="threefry2x32")
    for n, tag in enumerate(("a", "b"), start=1):
        k = jax.random.fold_in(base, n)
        for row in got[tag]:
            k, sub = jax.random.split(k)
            np.testing.assert_allclose(row, np.asarray(jax.random.uniform(sub, (2,))), rtol=1e-6)


def test_the_process_wide_state_named_in_the_context_docstring_exists():
    """core/context.py names each piece of process-wide state (``module.name``, relative to
    nablax.core): every name resolves, so the list follows the code when it moves."""
    import importlib
    import re

    from nablax.core import context

    section = context.__doc__.split("Process-wide state", 1)[1]
    names = re.findall(r"``([A-Za-z_][\w]*(?:\.[\w]+)+)``", section)
    names = [n for n in names if not n.startswith(("nx.", "nablax."))]
    assert {"realize._S", "transforms.trace.LEAVES", "prims.random._SEED"} <= set(names)
    for dotted in names:
        parts = dotted.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            try:
                obj = importlib.import_module("nablax.core." + ".".join(parts[:cut]))
            except ModuleNotFoundError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
            break
        else:
            raise AssertionError(f"core/context.py names {dotted!r}, which does not exist")

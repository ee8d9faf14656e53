"""xcs.jit / vmap / pmap / grad (nablax/xcs/transforms.py, engine.py, futures.py, rewrite.py)."""

from __future__ import annotations

import concurrent.futures as cf
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import xcs

LAT = 0.05


class Recorder:
    """An orchestration 'LLM' that records its calls and how many ran at once."""

    def __init__(self, latency: float = LAT) -> None:
        self.latency = latency
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0

    def __call__(self, prompt):
        assert isinstance(prompt, str), f"got a {type(prompt).__name__}, not a real value"
        with self.lock:
            self.calls.append(prompt)
            self.active += 1
            self.max_active = max(self.max_active, self.active)
        try:
            time.sleep(self.latency)
            return f"<{prompt}>"
        finally:
            with self.lock:
                self.active -= 1


llm = Recorder()


@xcs.mark_orchestration
def ask(prompt):
    return llm(prompt)


@xcs.mark_orchestration
def ask_many(prompts, meta):
    assert all(isinstance(p, str) for p in prompts) and isinstance(meta["k"], str)
    return len(prompts)


@xcs.mark_orchestration
def boom(prompt):
    raise RuntimeError(f"service down for {prompt}")


@pytest.fixture(autouse=True)
def _reset():
    llm.calls.clear()
    llm.max_active = 0
    yield


# ---- jit -----------------------------------------------------------------------------------------


@xcs.jit
def chain(q):
    a = ask(q)
    b = ask("refine: " + a)
    return b


def test_jit_chain_runs_in_order_once_each_and_matches_python():
    assert chain("q1") == "<refine: <q1>>"
    assert llm.calls == ["q1", "refine: <q1>"]
    assert chain("q2") == "<refine: <q2>>"  # a second invocation with new inputs: nothing stale
    assert llm.calls == ["q1", "refine: <q1>", "q2", "refine: <q2>"]
    plan = chain.last_plan()
    assert [n.name for n in plan.nodes] == ["ask", "ask"] and plan.edges == ((0, 1),)
    assert plan.nodes[1].start >= plan.nodes[0].end


@xcs.jit
def fan_out(qs):
    answers = [ask(q) for q in qs]
    return ask(" + ".join(answers))


def test_jit_fan_out_overlaps():
    qs = [f"q{i}" for i in range(10)]
    t0 = time.perf_counter()
    out = fan_out(qs)
    wall = time.perf_counter() - t0
    assert out == "<" + " + ".join(f"<{q}>" for q in qs) + ">"
    assert len(llm.calls) == 11 and llm.max_active >= 5
    assert wall < 8 * LAT, wall  # sequential would be 11 * LAT
    s = fan_out.stats()
    assert s.calls == 11 and s.overlap > 1.5 and s.saved_s > 2 * LAT
    assert len(fan_out.last_plan().edges) == 10


@xcs.jit
def lazy_strings_and_containers(q):
    a = ask(q)
    b = ask(q + "2")
    n = ask_many([a, f"{b!r:>12}"], {"k": a + "/" + b})
    items = []
    items.append(a)
    control = "long" if len(a) > 3 else "short"  # control flow waits for the value
    return n, items, control, a is None, f"{a}|{b}"


def test_jit_values_reach_calls_as_real_values_anywhere_in_arguments():
    out = lazy_strings_and_containers("x")
    assert out == (2, ["<x>"], "short", False, "<x>|<x2>")
    plan = lazy_strings_and_containers.last_plan()
    assert plan.nodes[2].deps == (0, 1)


@xcs.jit
def fails_used(q):
    a = boom(q)
    return ask("after " + a)  # depends on the failure: never runs


@xcs.jit
def fails_unused(q):
    boom(q)
    return ask(q)


def test_jit_errors_surface_and_dependents_never_run():
    with pytest.raises(RuntimeError, match="service down for z"):
        fails_used("z")
    assert llm.calls == []
    with pytest.raises(RuntimeError, match="service down for w"):
        fails_unused("w")
    assert llm.calls == ["w"]  # independent of the failure: it ran, as in plain Python


@xcs.jit
def hybrid_pipeline(texts):
    replies = [ask(t) for t in texts]
    lengths = nx.tensor([float(len(r)) for r in replies])
    return float((lengths * 2.0).sum().item())


def test_jit_tensor_parts_use_real_values_and_nested_jit_joins():
    assert hybrid_pipeline(["a", "bb"]) == 2.0 * (3 + 4)

    @xcs.jit
    def outer(q):
        return chain(q) + ask(q)  # chain is itself jitted: it joins this invocation

    assert outer("n") == "<refine: <n>><n>"
    assert {n.name for n in outer.last_plan().nodes} == {"ask"}
    assert len(outer.last_plan().nodes) == 3


def test_jit_without_source_runs_unmodified_with_one_warning():
    src = "def g(x):\n    return ask(x) + '!'\n"
    ns: dict = {"ask": ask}
    exec(src, ns)
    with pytest.warns(RuntimeWarning, match="source of g is not available.*runs unmodified"):
        g = xcs.jit(ns["g"])
    assert g("a") == "<a>!" == ns["g"]("a")
    with pytest.raises(xcs.XCSError, match="not been called"):
        xcs.jit(chain.__wrapped__).last_plan()


# ---- vmap ----------------------------------------------------------------------------------------


def test_vmap_orchestration_order_axes_and_strings():
    out = xcs.vmap(ask)([f"p{i}" for i in range(20)])
    assert out == [f"<p{i}>" for i in range(20)] and llm.max_active > 5

    @xcs.mark_orchestration
    def combine(prefix, item, suffix):
        return prefix + item + suffix

    assert xcs.vmap(combine, in_axes=(None, 0, 0))(">", ["a", "b"], "!") == [">a!", ">b!"]
    assert xcs.vmap(combine, in_axes=(0, 0, None))(["1", "2"], ("a", "b"), "?") == ["1a?", "2b?"]
    assert xcs.vmap(ask)([]) == []
    with pytest.raises(ValueError, match="different lengths"):
        xcs.vmap(combine)(["a"], ["b", "c"], "x")


def test_vmap_errors_name_the_item_and_return_exceptions():
    @xcs.mark_orchestration
    def flaky(i):
        if i == 3:
            raise ValueError("bad item")
        time.sleep(0.01)
        return i

    with pytest.raises(ValueError, match="bad item") as e:
        xcs.vmap(flaky, max_workers=2)(list(range(40)))
    assert e.value.xcs_index == 3 and "item 3" in str(e.value.__notes__)
    out = xcs.vmap(flaky, return_exceptions=True)(list(range(6)))
    assert isinstance(out[3], ValueError) and out[:3] == [0, 1, 2] and out[4:] == [4, 5]


def test_nested_vmap_never_deadlocks_and_custom_executors_work():
    @xcs.mark_orchestration
    def leaf(i, j):
        return i * 64 + j

    @xcs.mark_orchestration
    def row(i):
        return sum(xcs.vmap(leaf, in_axes=(None, 0), max_workers=4)(i, list(range(64))))

    t0 = time.perf_counter()
    out = xcs.vmap(row, max_workers=4)(list(range(64)))
    assert out == [sum(i * 64 + j for j in range(64)) for i in range(64)]
    assert time.perf_counter() - t0 < 60
    with cf.ThreadPoolExecutor(2) as pool:
        assert xcs.vmap(row, executor=pool)(list(range(8))) == out[:8]
    with pytest.raises(TypeError, match="Executor"):
        xcs.vmap(ask, executor="threads")(["a"])


def test_vmap_routes_tensor_code(monkeypatch):
    used = []
    real_vmap = jax.vmap
    monkeypatch.setattr(jax, "vmap", lambda *a, **k: used.append(1) or real_vmap(*a, **k))

    def jax_fn(x, w):
        return jnp.tanh(x @ w)

    x, w = jnp.ones((5, 3)), jnp.ones((3, 2))
    out = xcs.vmap(jax_fn, in_axes=(0, None))(x, w)
    np.testing.assert_allclose(out, jnp.tanh(x @ w), rtol=1e-6)
    assert used == [1]  # vectorized by jax.vmap, not a call per item

    @xcs.mark_tensor
    def nx_fn(r):
        return (r * r).sum()

    got = xcs.vmap(nx_fn)(nx.tensor(np.arange(6.0, dtype=np.float32).reshape(3, 2)))
    assert isinstance(got, nx.Tensor) and got.tolist() == [1.0, 13.0, 41.0]

    @xcs.mark_tensor
    def np_fn(r):
        return np.cumsum(r)

    out = xcs.vmap(np_fn)(np.arange(6.0).reshape(2, 3))
    assert isinstance(out, np.ndarray) and out.tolist() == [[0, 1, 3], [3, 7, 12]]
    pm = xcs.pmap(jax_fn, in_axes=(0, None))(jnp.ones((jax.local_device_count(), 3)), w)
    assert pm.shape == (jax.local_device_count(), 2)


# ---- grad ----------------------------------------------------------------------------------------


def test_grad_routes_and_refuses_orchestration_before_running():
    g_ask = xcs.grad(ask)  # classified when called (names it uses may be defined later)
    with pytest.raises(xcs.XCSError, match="orchestration"):
        g_ask("q")
    assert llm.calls == []

    @xcs.mark_tensor
    def f(x):
        return jnp.sum(jnp.sin(x) ** 2)

    x = jnp.array([0.3, 1.2])
    np.testing.assert_allclose(xcs.grad(f)(x), jax.grad(f)(x), rtol=1e-6)

    @xcs.mark_hybrid
    def scored(x):
        weight = float(len(ask("weight")))  # a value from orchestration: a constant
        return (x * x * weight).sum()

    g = xcs.grad(scored)(nx.tensor([1.0, 2.0]))
    assert g.tolist() == [2.0 * 8, 4.0 * 8] and llm.calls == ["weight"]
    gj = xcs.grad(scored)(jnp.array([1.0, 2.0]))
    assert isinstance(gj, jax.Array) and gj.tolist() == [16.0, 32.0]


@xcs.jit
def guarded(q):
    try:
        a = boom(q)
    except RuntimeError:
        a = "fallback"
    return ask(a)


def test_jit_calls_inside_try_raise_inside_the_try():
    assert guarded("t") == "<fallback>"
    assert llm.calls == ["fallback"]

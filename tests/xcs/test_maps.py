"""xcs.vmap / xcs.pmap: how per-item results come back, axes, axis_size / axis_name, traced
arguments, and what has_tensor_values finds (nablax/xcs/transforms.py, runtime.py)."""

from __future__ import annotations

import collections
import dataclasses
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import xcs


@xcs.mark_orchestration
def embed(text):
    """A stand-in embedding service: one small vector per text."""
    return np.array([float(len(text)), float(text.count("a"))], dtype=np.float32)


TEXTS = ["a", "banana", "kiwi"]
LOOP = np.stack([embed(t) for t in TEXTS])


# ---- stacking ------------------------------------------------------------------------------------


def test_array_results_are_stacked_by_their_library():
    got = xcs.vmap(embed)(TEXTS)
    assert isinstance(got, np.ndarray) and got.shape == (3, 2)
    np.testing.assert_array_equal(got, LOOP)

    as_jax = xcs.vmap(xcs.mark_orchestration(lambda t: jnp.asarray(embed(t))))(TEXTS)
    assert isinstance(as_jax, jax.Array)
    np.testing.assert_array_equal(np.asarray(as_jax), LOOP)

    as_nx = xcs.vmap(xcs.mark_orchestration(lambda t: nx.tensor(embed(t))))(TEXTS)
    assert isinstance(as_nx, nx.Tensor) and as_nx.shape == (3, 2)
    np.testing.assert_array_equal(as_nx.numpy(), LOOP)

    scalars = xcs.vmap(lambda r: r.sum())(LOOP)  # NumPy scalars are 0-d arrays
    np.testing.assert_array_equal(scalars, LOOP.sum(axis=1))

    @xcs.mark_orchestration
    def picky(text):
        if text == "kiwi":
            raise ValueError("no kiwis")
        return embed(text)

    out = xcs.vmap(picky, return_exceptions=True)(TEXTS)  # exceptions are never stacked
    assert isinstance(out, list) and isinstance(out[2], ValueError)
    np.testing.assert_array_equal(out[1], LOOP[1])
    assert xcs.vmap(embed)([]) == []


def test_pytree_results_are_stacked_leaf_by_leaf():
    @xcs.mark_orchestration
    def analyse(text):
        return {"vec": embed(text), "label": text.upper(), "n": len(text)}, embed(text) * 2

    out, doubled = xcs.vmap(analyse)(TEXTS)
    np.testing.assert_array_equal(out["vec"], LOOP)
    assert out["label"] == ["A", "BANANA", "KIWI"] and out["n"] == [1, 6, 4]
    np.testing.assert_array_equal(doubled, 2 * LOOP)

    # no array, a dict holding a string (a record): a list of the items' results, in input order
    records = xcs.vmap(xcs.mark_orchestration(lambda t: {"t": t, "n": len(t)}))(TEXTS)
    assert records == [{"t": t, "n": len(t)} for t in TEXTS]
    # arrays of different shapes cannot be stacked: a list too
    ragged = xcs.vmap(xcs.mark_orchestration(lambda t: np.zeros(len(t))))(TEXTS)
    assert [r.shape for r in ragged] == [(1,), (6,), (4,)]


def test_array_free_tuples_and_number_dicts_come_back_by_position():
    """Without arrays, as the seed's fallback does: a tuple of outputs becomes a tuple of lists
    and a dict of numbers a dict of lists (before, both stayed a list of per-item results)."""
    loop = [(len(t), t.upper(), t.count("a")) for t in TEXTS]

    @xcs.mark_orchestration
    def facts(text):
        return len(text), text.upper(), text.count("a")

    for mapped in (xcs.vmap(facts), xcs.pmap(facts)):
        assert mapped(TEXTS) == tuple(list(column) for column in zip(*loop))

    @xcs.mark_orchestration
    def counts(text):
        return {"n": len(text), "share": text.count("a") / len(text), "long": len(text) > 4}

    got = xcs.vmap(counts)(TEXTS)
    assert isinstance(got, dict) and list(got) == ["long", "n", "share"]  # sorted, as jax's
    assert got == {k: [counts(t)[k] for t in TEXTS] for k in ("n", "share", "long")}

    Pair = collections.namedtuple("Pair", "word size")
    pairs = xcs.vmap(xcs.mark_orchestration(lambda t: Pair(t, len(t))))(TEXTS)
    assert isinstance(pairs, Pair) and pairs == Pair(TEXTS, [1, 6, 4])

    nested = xcs.vmap(xcs.mark_orchestration(lambda t: {"size": (len(t), -len(t))}))(TEXTS)
    assert nested == {"size": ([1, 6, 4], [-1, -6, -4])}
    # arrays keep jax.vmap's stacking inside such results; numbers beside them become lists
    mixed = xcs.vmap(xcs.mark_orchestration(lambda t: {"vec": embed(t), "n": len(t)}))(TEXTS)
    np.testing.assert_array_equal(mixed["vec"], LOOP)
    assert mixed["n"] == [1, 6, 4]
    # a string in any item's dict: records stay a list; so do lists and differing structures
    some = xcs.vmap(xcs.mark_orchestration(lambda t: {"v": t if t == "kiwi" else len(t)}))(TEXTS)
    assert some == [{"v": 1}, {"v": 6}, {"v": "kiwi"}]
    assert xcs.vmap(xcs.mark_orchestration(lambda t: [t, len(t)]))(TEXTS) == [
        [t, len(t)] for t in TEXTS
    ]
    odd = xcs.vmap(xcs.mark_orchestration(lambda t: (t,) * len(t)))(["a", "bb"])
    assert odd == [("a",), ("bb", "bb")]
    with pytest.raises(xcs.XCSError, match="does not match the structure"):
        xcs.vmap(facts, out_axes=(0, 0))(TEXTS)  # out_axes is checked against the tuple


def test_out_axes_as_jax_vmap():
    x = np.arange(12.0).reshape(3, 4)
    ref = jax.vmap(lambda r: (r * 2, r.sum()), out_axes=(1, 0))(jnp.asarray(x))

    @xcs.mark_orchestration
    def per_row(r):
        return r * 2, r.sum()

    cols, sums = xcs.vmap(per_row, out_axes=(1, 0))(x)
    np.testing.assert_array_equal(cols, np.asarray(ref[0]))
    np.testing.assert_array_equal(sums, np.asarray(ref[1]))
    last = xcs.vmap(embed, out_axes=-1)(TEXTS)
    np.testing.assert_array_equal(last, LOOP.T)
    with pytest.raises(xcs.XCSError, match="does not match the structure"):
        xcs.vmap(per_row, out_axes=(0, 0, 0))(x)


def test_out_axes_none_means_one_shared_result():
    version = xcs.vmap(xcs.mark_orchestration(lambda t: "v2"), out_axes=None)(TEXTS)
    assert version == "v2"
    same = xcs.vmap(xcs.mark_orchestration(lambda t: np.ones(2)), out_axes=None)(TEXTS)
    np.testing.assert_array_equal(same, np.ones(2))
    with pytest.raises(xcs.XCSError, match="item 1 gave 'BANANA'"):
        xcs.vmap(xcs.mark_orchestration(str.upper), out_axes=None)(TEXTS)


# ---- axes, axis_size, axis_name ------------------------------------------------------------------


def test_short_in_axes_tuple_is_padded_with_none():
    @xcs.mark_orchestration
    def tag(text, sep, suffix):
        return text + sep + suffix

    assert xcs.vmap(tag, in_axes=(0,))(["a", "b"], "-", "z") == ["a-z", "b-z"]
    assert xcs.vmap(tag, in_axes=[0, None])(["a", "b"], ":", "!") == ["a:!", "b:!"]
    with pytest.raises(ValueError, match="at most one entry per"):
        xcs.vmap(tag, in_axes=(0, 0, 0, 0))(["a"], ["b"], ["c"])


def test_axis_size_calls_n_times_and_guards_the_batch():
    calls = []

    @xcs.mark_orchestration
    def sample(prompt):
        calls.append(prompt)
        return f"{prompt}#{len(calls)}"

    out = xcs.vmap(sample, in_axes=None, axis_size=3)("q")
    assert sorted(calls) == ["q"] * 3 and len(set(out)) == 3
    with pytest.raises(xcs.XCSError, match="axis_size=1, but the mapped arguments have 2"):
        xcs.vmap(sample, axis_size=1)(["a", "b"])
    with pytest.raises(ValueError):  # also a ValueError, as jax.vmap raises for sizes
        xcs.vmap(sample, axis_size=1)(["a", "b"])
    zeros = xcs.vmap(lambda: jnp.zeros(2), axis_size=4)()
    assert zeros.shape == (4, 2)


def test_axis_name_reaches_collectives(monkeypatch):
    def centered(x):
        return x - jax.lax.pmean(x, "batch")

    x = jnp.arange(6.0)
    want = jax.vmap(centered, axis_name="batch")(x)
    np.testing.assert_allclose(xcs.vmap(centered, axis_name="batch")(x), want)
    np.testing.assert_allclose(xcs.pmap(centered, axis_name="batch")(x), want)  # 6 != devices

    used = []
    real_pmap = jax.pmap
    monkeypatch.setattr(jax, "pmap", lambda *a, **k: used.append(k) or real_pmap(*a, **k))
    n = jax.local_device_count()
    total = xcs.pmap(lambda v: jax.lax.psum(v, "d"), axis_name="d")(jnp.arange(float(n)))
    assert used and used[0]["axis_name"] == "d"
    np.testing.assert_allclose(total, [n * (n - 1) / 2] * n)

    with pytest.raises(xcs.XCSError, match="nx.vmap has no collectives"):
        xcs.vmap(xcs.mark_tensor(lambda t: t * 2), axis_name="i")(nx.tensor([1.0, 2.0]))


# ---- traced arguments ----------------------------------------------------------------------------


def test_traced_arguments_stay_on_the_tracing_thread():
    def double(x):  # plain Python: per item on concrete values, vectorized when traced
        return x * 2.0

    struct = jax.eval_shape(xcs.vmap(double), jax.ShapeDtypeStruct((5, 3), jnp.float32))
    assert struct.shape == (5, 3) and struct.dtype == jnp.float32

    threads = set()

    @xcs.mark_hybrid
    def scaled(x):
        threads.add(threading.get_ident())
        return jnp.sin(x) * 3.0

    x = jnp.linspace(0.0, 1.0, 4)
    np.testing.assert_allclose(jax.jit(xcs.vmap(scaled))(x), jnp.sin(x) * 3.0, rtol=1e-6)
    g = jax.grad(lambda v: xcs.vmap(scaled)(v).sum())(x)
    np.testing.assert_allclose(g, 3.0 * jnp.cos(x), rtol=1e-6)
    assert threads == {threading.get_ident()}

    t = nx.tensor([0.5, 1.5])
    gn = nx.grad(lambda v: xcs.vmap(scaled_nx)(v).sum())(t)
    np.testing.assert_allclose(gn.numpy(), 3.0 * np.cos([0.5, 1.5]), rtol=1e-6)


@xcs.mark_hybrid
def scaled_nx(v):
    return nx.sin(v) * 3.0


# ---- has_tensor_values ---------------------------------------------------------------------------


@dataclasses.dataclass
class Prompted:
    prompt: str
    extras: list


class Registered:
    def __init__(self, children):
        self.children = children


jax.tree_util.register_pytree_node(
    Registered, lambda r: (r.children, None), lambda _, ch: Registered(list(ch))
)


class Plain:
    pass


def test_has_tensor_values_looks_inside_objects():
    assert xcs.has_tensor_values((Prompted("p", [{"w": jnp.ones(2)}]),))
    assert not xcs.has_tensor_values((Prompted("p", ["no", "arrays"]),))
    assert xcs.has_tensor_values((), {"r": Registered([1, np.zeros(1)])})
    obj = Plain()
    obj.me, obj.cache = obj, {"emb": nx.tensor([1.0])}  # a cycle, and a payload
    assert xcs.has_tensor_values((obj,))
    obj.cache = {}
    assert not xcs.has_tensor_values((obj,))  # the cycle ends the walk
    deep: list = [np.ones(1)]
    for _ in range(40):
        deep = [deep]
    assert not xcs.has_tensor_values((deep,))  # past the depth bound: not searched
    assert not xcs.has_tensor_values(("text", 3.0, None, b"raw"))


def test_objects_holding_tensors_route_like_tensors():
    @xcs.mark_tensor
    def score(batch):
        return jnp.tanh(batch.extras[0])

    rows = Prompted("p", [jnp.arange(6.0).reshape(3, 2)])
    got = xcs.vmap(score, in_axes=None, axis_size=2)(rows)
    np.testing.assert_allclose(got, np.stack([np.tanh(np.arange(6.0).reshape(3, 2))] * 2))

"""Realization: structure-keyed executable cache, live intermediates, deep loops, memory."""

from __future__ import annotations

import gc
import weakref

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import _config


@pytest.fixture(autouse=True)
def _fresh_cache():
    nx.clear_caches()
    yield


def _step(w, x, lr):
    y = nx.tanh(x @ w)
    loss = (y * y).mean()
    return w - lr * (x.T @ y) / 8, loss


def test_second_iteration_of_eager_loop_compiles_nothing():
    w = nx.ones((4, 3)) * 0.1
    x = nx.arange(32.0).reshape(8, 4) / 32
    nx.realize(w, x)
    w, loss = _step(w, x, 0.5)
    loss.item()  # reading only the loss also runs the weight update (connected live tensor)
    assert w.is_realized
    after_first = nx.cache_info().compiles
    assert after_first >= 1
    for _ in range(5):
        w, loss = _step(w, x, 0.5)
        loss.item()
    info = nx.cache_info()
    assert info.compiles == after_first
    assert info.hits >= 5


def test_lazy_initialization_then_steady_state():
    w = nx.ones((4, 3)) * 0.1  # pending: the first step's program also builds w and x
    x = nx.arange(32.0).reshape(8, 4) / 32
    ref_w = np.full((4, 3), 0.1, np.float32)
    ref_x = np.arange(32.0, dtype=np.float32).reshape(8, 4) / 32
    compiles = []
    for _ in range(4):
        w, loss = _step(w, x, 0.5)
        y = np.tanh(ref_x @ ref_w)
        ref_loss = (y * y).mean()
        ref_w = ref_w - 0.5 * (ref_x.T @ y) / 8
        np.testing.assert_allclose(loss.item(), ref_loss, rtol=1e-5)
        compiles.append(nx.cache_info().compiles)
    np.testing.assert_allclose(w.numpy(), ref_w, rtol=1e-5, atol=1e-6)
    assert compiles[2] == compiles[1] == compiles[3]


def test_unrelated_pending_tensors_are_left_alone():
    big = nx.ones((64, 64)) * 3  # lazy and not connected to what is read below
    small = nx.tensor([1.0, 2.0])
    assert (small + 1).sum().item() == 5.0
    assert not big.is_realized


def test_changing_scalars_compile_at_most_twice_and_stay_correct():
    x = nx.ones(3)
    ref = np.ones(3, np.float32)
    for i in range(6):
        lr = 0.1 * (i + 1)
        x = x * lr + 1.0
        ref = ref * np.float32(lr) + np.float32(1.0)
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-6)
    assert nx.cache_info().compiles <= 3  # first graph (with the lazy ones), baked, parameterized


def test_values_are_not_part_of_the_structure_key():
    a = nx.tensor(np.arange(4.0, dtype=np.float32))
    b = nx.tensor(np.arange(4.0, dtype=np.float32) * 7)
    (a * 2 + 1).numpy()
    c0 = nx.cache_info().compiles
    np.testing.assert_allclose((b * 2 + 1).numpy(), np.arange(4.0) * 14 + 1)
    assert nx.cache_info().compiles == c0


def test_different_shapes_compile_separately():
    (nx.ones(3) + 1).numpy()
    (nx.ones(4) + 1).numpy()
    assert nx.cache_info().compiles == 2


def test_held_intermediates_come_from_the_same_program():
    x = nx.tensor([1.0, 2.0])
    y = x * 2
    z = y + 1
    r0 = nx.cache_info().realizations
    z.numpy()
    assert nx.cache_info().realizations == r0 + 1
    assert y.is_realized  # produced by the same program, not recomputed later
    np.testing.assert_allclose(y.numpy(), [2.0, 4.0])
    assert nx.cache_info().realizations == r0 + 1


def test_realize_runs_several_tensors_as_one_program():
    x = nx.tensor([1.0, 2.0])
    a, b, c = x + 1, x * 3, (x - 1).sum()
    r0 = nx.cache_info().realizations
    nx.realize(a, [b, {"c": c}])
    assert nx.cache_info().realizations == r0 + 1
    assert a.is_realized and b.is_realized and c.is_realized
    assert c.item() == 1.0


def test_multi_output_siblings_share_a_node():
    parts = nx.split(nx.arange(6.0), 3)
    nodes = {p._impl.src[0] for p in parts}
    assert len(nodes) == 1
    parts[1].numpy()
    assert all(p.is_realized for p in parts)  # alive siblings come from the same run
    assert [p.tolist() for p in parts] == [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]


def test_dropped_sibling_is_not_needed():
    a, b = nx.split(nx.arange(4.0), 2)
    del a
    assert b.tolist() == [2.0, 3.0]


def test_pending_consumer_of_unmaterialized_temp_still_works():
    x = nx.tensor([1.0, 2.0])
    t = x * 10  # temp: dropped before realization
    b, c = t + 1, t + 2
    del t
    assert b.tolist() == [11.0, 21.0]
    assert c.tolist() == [12.0, 22.0]  # recomputes the temp: its node kept its inputs


def test_deep_loop_realizes_automatically_with_bounded_graph():
    with _config.override(max_graph_depth=256):
        x = nx.zeros(())
        r0 = nx.cache_info().realizations
        for _ in range(5000):
            x = x + 1
            assert x._impl.depth <= 256 + 64
        assert nx.cache_info().realizations > r0  # realized on its own along the way
        assert x.item() == 5000.0
        assert nx.cache_info().compiles <= 4  # the same chunk structure is reused


def test_automatic_cut_computes_only_the_tensor_being_built():
    """A depth cut is not a read: other live tensors of the graph stay pending (made outputs of
    the cut's program, XLA duplicated the chain above each into its own fusion), and a held one
    is computed correctly, from its own graph, when it is read."""
    a = np.linspace(0.0, 1.0, 6, dtype=np.float32)
    with _config.override(max_graph_depth=128):
        x = nx.tensor(a)
        ref = a.copy()
        held, held_ref = None, None
        r0 = nx.cache_info().realizations
        for i in range(150):  # depth 300: one cut, at depth 192
            x = x * np.float32(1.01) + np.float32(0.5)
            ref = ref * np.float32(1.01) + np.float32(0.5)
            if i == 50:
                held, held_ref = x, ref.copy()
        assert nx.cache_info().realizations == r0 + 1  # the cut, while x was built
        assert held is not None and not held.is_realized  # not an output of the cut's program
        np.testing.assert_allclose(x.numpy(), ref, rtol=1e-5)
        np.testing.assert_allclose(held.numpy(), held_ref, rtol=1e-5)
        # gradients through a cut graph match JAX's
        g = nx.grad(lambda v: _chain(v, 150).sum())(nx.tensor(a))
        gj = jax.grad(lambda v: _chain(v, 150).sum())(jnp.asarray(a))
        np.testing.assert_allclose(g.numpy(), np.asarray(gj), rtol=1e-5)


def _chain(v, n):
    for _ in range(n):
        v = v * 1.01 + 0.5
    return v


def test_deep_graph_has_no_recursion_limit():
    with _config.override(max_graph_depth=10**9):
        x = nx.zeros(())
        for _ in range(3000):  # deeper than Python's default recursion limit
            x = x + 1
        assert x.item() == 3000.0


def test_realized_intermediates_are_freed():
    x = nx.tensor(np.ones(8, np.float32))
    t = x * 2
    node_ref = weakref.ref(t._impl.src[0])
    impl_ref = weakref.ref(t._impl)
    y = t + 1
    del t
    y.numpy()
    gc.collect()
    assert impl_ref() is None  # the user dropped it; nothing in the graph keeps it
    assert node_ref() is None  # the realized consumer dropped its inputs


def test_eager_code_keeps_no_reference_to_intermediates():
    x = nx.tensor(np.ones(8, np.float32))
    refs = []
    y = x
    for _ in range(10):
        y = y * 1.5
        refs.append(weakref.ref(y._impl))
    y.numpy()
    del y
    gc.collect()
    assert all(r() is None for r in refs)


def test_realized_value_shares_buffer_with_jax():
    a = jnp.arange(4.0)
    t = nx.asarray(a)
    assert t.to_jax() is a


def test_lru_eviction():
    with _config.override(max_executables=2):
        for n in range(1, 5):
            (nx.ones(n) + 1).numpy()
        info = nx.cache_info()
        assert info.executables == 2
        assert info.evictions == 2


def test_setitem_rebinds_only_this_tensor():
    x = nx.zeros(4)
    before = x[1:3]
    y = x + 1
    x[1] = 5.0
    assert x.tolist() == [0.0, 5.0, 0.0, 0.0]
    assert before.tolist() == [0.0, 0.0]
    assert y.tolist() == [1.0, 1.0, 1.0, 1.0]


def test_repr_and_conversions_realize():
    x = nx.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert "dtype=float32" in repr(x + 0)
    assert float(x[0, 0] + 1) == 2.0
    assert int(nx.tensor(3) * 2) == 6
    assert bool(x.sum() > 0)
    assert [r.tolist() for r in x + 1] == [[2.0, 3.0], [4.0, 5.0]]
    np.testing.assert_allclose(np.asarray(x * 2), [[2, 4], [6, 8]])


# ---- the connected rest as a second, asynchronous program ------------------------------------


def _loss_and_rest(x):
    """A requested value ``h`` and a long live chain that reads it (the "rest")."""
    v, i = nx.topk(x, 2)  # multi-output node: both outputs cross into the rest
    h = (v * 2 + 1).sum()
    rest = x * 3 + i.astype(nx.float32).sum()
    for _ in range(20):
        rest = rest + h
    return h, rest


def test_connected_rest_runs_as_a_second_program_with_the_same_values():
    x = nx.tensor(np.arange(12, dtype=np.float32).reshape(3, 4) % 5)
    with _config.override(async_rest_min_nodes=8):
        before = nx.cache_info().realizations
        h, rest = _loss_and_rest(x)
        h_split = h.item()
        assert nx.cache_info().realizations == before + 2  # the value, then the rest
        assert rest.is_realized  # dispatched with the value's realization, not left pending
        rest_split = rest.numpy()
    with _config.override(async_rest_min_nodes=0):
        before = nx.cache_info().realizations
        h, rest = _loss_and_rest(x)
        assert h.item() == h_split
        assert nx.cache_info().realizations == before + 1  # one program
        np.testing.assert_array_equal(rest.numpy(), rest_split)
    xs = np.asarray(x)
    top = -np.sort(-xs, axis=-1)[:, :2]
    idx = np.argsort(-xs, axis=-1, kind="stable")[:, :2]
    h_ref = (top * 2 + 1).sum()
    assert h_split == h_ref
    np.testing.assert_allclose(rest_split, xs * 3 + idx.sum() + 20 * h_ref, rtol=1e-6)


def test_small_connected_rest_stays_in_the_same_program():
    with _config.override(async_rest_min_nodes=16):
        x = nx.ones(3)
        a = x * 2
        b = a + 1  # a two-node rest: not worth a second program
        before = nx.cache_info().realizations
        assert a.sum().item() == 6.0
        assert nx.cache_info().realizations == before + 1
        assert b.is_realized and b.tolist() == [3.0, 3.0, 3.0]


def test_split_realization_frees_the_boundary_graph():
    with _config.override(async_rest_min_nodes=4):
        x = nx.tensor(np.ones((2, 3), np.float32))
        mid = x * 2
        probe = weakref.ref(mid._impl.src[0])
        h = mid.sum()
        rest = mid
        for _ in range(6):
            rest = rest * h
        del mid
        h.item()
        assert rest.is_realized
        gc.collect()
        assert probe() is None  # the boundary node was dropped with the graph once both ran


def _wide_loss_and_rest(x, kind: str):
    """A loss and a rest that reads three (256, 256) float32 activations of the loss's graph
    (768 KiB at the boundary). ``kind``: "live" keeps the activations' tensors; "traced" builds
    them under ``nx.value_and_grad`` (a training step: the rest is the backward pass and an
    update; the tensors are dropped, the trace recorded their sizes); "dropped" drops untraced
    activations (their sizes are unknown and count as 0)."""
    if kind == "traced":

        def f(w):
            a = nx.tanh(x * w)
            b = a * 2
            c = nx.exp(b * 0.01)
            return (a * b * c).sum()

        w = nx.tensor(np.float32(0.5))
        h, g = nx.value_and_grad(f)(w)
        return h, w - 0.1 * g, None
    a = nx.tanh(x)
    b = a * 2
    c = nx.exp(b * 0.01)
    h = (a * b * c).sum()
    rest = x
    for _ in range(20):
        rest = rest * 0.5 + a * b * c * 1e-3
    return h, rest, ((a, b, c) if kind == "live" else None)


@pytest.mark.parametrize("kind", ["live", "traced", "dropped"])
def test_cpu_rest_with_a_large_boundary_runs_in_the_same_program(kind):
    """On the CPU backend, a rest whose inputs from the value's program exceed
    async_rest_cpu_boundary_mb runs in one program with the value; under the limit it runs as a
    second program (as it does when the sizes are unknown). Other backends always split. The
    values are the same either way."""
    xs = (np.arange(256 * 256, dtype=np.float32).reshape(256, 256) % 7) / 7
    x = nx.tensor(xs)
    got = {}
    for mb in (0, 1):  # 768 KiB: over a 0 MiB limit, under a 1 MiB one
        with _config.override(async_rest_min_nodes=8, async_rest_cpu_boundary_mb=mb):
            h, rest, keep = _wide_loss_and_rest(x, kind)
            before = nx.cache_info().realizations
            value = h.item()
            programs = nx.cache_info().realizations - before
            assert rest.is_realized  # computed with the value either way
            got[mb] = (value, rest.numpy())
            del keep
        split = jax.default_backend() != "cpu" or mb == 1 or kind == "dropped"
        assert programs == (2 if split else 1), (mb, programs)
    assert got[0][0] == got[1][0]
    np.testing.assert_array_equal(got[0][1], got[1][1])
    if kind == "traced":  # d/dw sum(a * 2a * exp(0.02 a)), a = tanh(x w), at w = 0.5
        a = np.tanh(xs.astype(np.float64) * 0.5)
        e = np.exp(0.02 * a)
        h_ref = (2 * a * a * e).sum()
        da = 4 * a * e + 2 * a * a * e * 0.02
        g_ref = (da * (1 - a * a) * xs).sum()
        np.testing.assert_allclose(got[0][0], h_ref, rtol=1e-5)
        np.testing.assert_allclose(got[0][1], 0.5 - 0.1 * g_ref, rtol=1e-5)
        return
    a = np.tanh(xs)
    b = a * 2
    c = np.exp(b * np.float32(0.01))
    np.testing.assert_allclose(got[0][0], (a * b * c).sum(), rtol=1e-5)
    rest = xs
    for _ in range(20):
        rest = rest * 0.5 + a * b * c * np.float32(1e-3)
    np.testing.assert_allclose(got[0][1], rest, rtol=1e-5, atol=1e-6)


def test_async_rest_cpu_boundary_mb_is_an_option_with_a_checked_value():
    assert nx.config.async_rest_cpu_boundary_mb == 4
    with pytest.raises((ValueError, TypeError), match="async_rest_cpu_boundary_mb"):
        with _config.override(async_rest_cpu_boundary_mb=-1):
            pass


def test_block_until_ready_realizes_and_returns_the_tensor():
    x = nx.ones((2, 2)) * 3
    assert x.block_until_ready() is x and x.is_realized
    assert x.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_a_parameter_read_by_its_marker_and_its_update_is_one_argument():
    # the step reads w through value_and_grad's marker (a node computed when it was made) and as
    # the update's own input: one argument of the program (graph.describe), with the same values
    from nablax.core import graph, realize

    w = nx.tensor(np.arange(3, dtype=np.float32))
    loss, g = nx.value_and_grad(lambda w: (w * w).sum())(w)
    new = w - 0.1 * g
    seen = graph.collect([loss._impl.src[0], new._impl.src[0]], {})
    _, key, (leaves, _), _, _ = realize._structure(seen)
    assert len(leaves) == 1 and leaves[0] is w._impl.value
    assert [d for d in key.with_parts(seen)[1] if type(d) is int] == [0]  # leaf 0 again
    assert loss.item() == 5.0
    np.testing.assert_allclose(new.numpy(), np.arange(3) * 0.8, rtol=1e-6)
    # the same structure over two different arrays: its own program, its own values
    v = nx.tensor(np.full(3, 2.0, np.float32))
    loss2, g2 = nx.value_and_grad(lambda w: (w * w).sum())(v)
    other = w - 0.1 * g2
    assert loss2.item() == 12.0
    np.testing.assert_allclose(other.numpy(), np.arange(3) - 0.4, rtol=1e-6)

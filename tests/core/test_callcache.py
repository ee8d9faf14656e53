"""The whole-call cache of eager transform calls (core/transforms/callcache.py).

Every test compares cached calls with the same calls made with the cache off (a ``_config``
override, under which every call runs the function), and checks which calls were replayed.
"""

from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.core.transforms import callcache

SCALE = 2.0
LOG: list = []


@pytest.fixture(autouse=True)
def _fresh():
    callcache.clear()
    yield
    callcache.clear()


def _data(seed, shape=(8, 5)):
    rng = np.random.default_rng(seed)
    return nx.tensor(rng.standard_normal(shape).astype(np.float32))


def _uncached(fn, *args):
    with _config.override(call_cache=False):
        return fn(*args)


def _close(a, b):
    for x, y in zip(nx.tree.leaves(a), nx.tree.leaves(b)):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-6)


def mlp_loss(params, x, y):
    h = x
    for w, b in params[:-1]:
        h = nx.relu(h @ w + b)
    w, b = params[-1]
    logp = nx.log_softmax(h @ w + b, axis=-1)
    return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))


def _mlp_params(seed):
    sizes = (5, 7, 3)
    return [
        (_data(seed + i, (a, b)), _data(seed + 10 + i, (b,)))
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:]))
    ]


def test_value_and_grad_replays_and_matches():
    vg = nx.value_and_grad(mlp_loss)
    y = nx.tensor(np.array([0, 1, 2, 1, 0, 2, 1, 1], np.int32))
    for step in range(5):
        params, x = _mlp_params(step), _data(100 + step)
        got = vg(params, x, y)
        _close(got, _uncached(vg, params, x, y))
    hits, recordings, declined = callcache.info()
    assert (hits, recordings, declined) == (3, 1, 0)


def test_vmap_grad_replays_and_matches_loop():
    def loss(w, x, y):
        return (x @ w - y) ** 2

    f = nx.vmap(nx.grad(loss), in_axes=(None, 0, 0))
    for step in range(4):
        w, xs, ys = _data(step, (5,)), _data(10 + step), _data(20 + step, (8,))
        got = np.asarray(f(w, xs, ys))
        loop = [np.asarray(nx.grad(loss)(w, xs[i], ys[i])) for i in range(8)]
        np.testing.assert_allclose(got, np.stack(loop), rtol=1e-5, atol=1e-6)
    assert callcache.info()[:2] == (2, 1)


def test_replayed_results_stay_lazy_and_fuse():
    f = nx.grad(lambda x: (x * x).sum())
    x = _data(0, (4,))
    for _ in range(3):
        g = f(x)
    assert callcache.info()[0] == 1
    assert not g.is_realized
    np.testing.assert_allclose(np.asarray(g * 3), 6 * np.asarray(x), rtol=1e-6)


def test_has_aux_and_argnums():
    def loss(w, b, x):
        out = x @ w + b
        return (out**2).mean(), out.sum()

    f = nx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    for step in range(4):
        w, b, x = _data(step, (5, 2)), _data(step + 1, (2,)), _data(step + 2)
        _close(f(w, b, x), _uncached(f, w, b, x))
    assert callcache.info()[0] == 2


def scaled(x):
    return (x * SCALE).sum()


def test_global_scalar_change_is_seen():
    global SCALE
    f = nx.grad(scaled)
    x = _data(0, (3,))
    try:
        for _ in range(3):
            np.testing.assert_allclose(np.asarray(f(x)), [2.0] * 3)
        SCALE = 5.0
        np.testing.assert_allclose(np.asarray(f(x)), [5.0] * 3)
        np.testing.assert_allclose(np.asarray(f(x)), [5.0] * 3)
    finally:
        SCALE = 2.0
    assert callcache.info()[0] >= 2


def test_closure_change_is_seen():
    def make():
        k = 1.0

        def loss(x):
            return (x * k).sum()

        def set_k(v):
            nonlocal k
            k = v

        return loss, set_k

    loss, set_k = make()
    f = nx.grad(loss)
    x = _data(0, (2,))
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), [1.0, 1.0])
    set_k(4.0)
    np.testing.assert_allclose(np.asarray(f(x)), [4.0, 4.0])


def helper_a(x):
    return x * 2.0


def helper_b(x):
    return x * 3.0


HELPER = helper_a


def uses_helper(x):
    return HELPER(x).sum()


def test_rebound_helper_function_is_seen():
    global HELPER
    f = nx.grad(uses_helper)
    x = _data(0, (2,))
    try:
        for _ in range(3):
            np.testing.assert_allclose(np.asarray(f(x)), [2.0, 2.0])
        HELPER = helper_b
        np.testing.assert_allclose(np.asarray(f(x)), [3.0, 3.0])
    finally:
        HELPER = helper_a


def logs(x):
    LOG.append(1)
    return (x * x).sum()


def prints(x):
    print("called")
    return (x * x).sum()


def test_side_effects_run_every_call(capsys):
    LOG.clear()
    x = _data(0, (2,))
    f, g = nx.grad(logs), nx.grad(prints)
    for _ in range(4):
        f(x)
        g(x)
    assert len(LOG) == 4
    assert capsys.readouterr().out.count("called") == 4
    assert callcache.info()[0] == 0
    assert callcache.info()[2] == 2


def test_data_dependent_python_is_not_replayed():
    def loss(x):
        if x.sum() > 0:
            return (x * 2.0).sum()
        return (x * -3.0).sum()

    f = nx.grad(loss)
    pos = nx.tensor([1.0, 2.0])
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(pos)), [2.0, 2.0])
    np.testing.assert_allclose(np.asarray(f(-pos)), [-3.0, -3.0])
    assert callcache.info()[0] == 0
    assert "value" in callcache.last_decline_reason()


def test_global_random_key_is_not_replayed():
    def loss(x):
        return (x * nx.random.normal(shape=(2,))).sum()

    f = nx.grad(loss)
    x = nx.tensor([1.0, 1.0])
    draws = {tuple(np.asarray(f(x)).round(6)) for _ in range(4)}
    assert len(draws) == 4
    assert callcache.info()[0] == 0


def test_object_attributes_are_not_replayed():
    class Model:
        def __init__(self):
            self.scale = 1.0

        def loss(self, x):
            return (x * self.scale).sum()

    m = Model()

    def loss(x):
        return m.loss(x)

    f = nx.grad(loss)
    x = nx.tensor([1.0, 1.0])
    for _ in range(3):
        f(x)
    m.scale = 7.0
    np.testing.assert_allclose(np.asarray(f(x)), [7.0, 7.0])
    assert callcache.info()[0] == 0


def test_signature_covers_shapes_dtypes_aliasing_and_scalars():
    def loss(a, b, c):
        return (a * b * c).sum()

    f = nx.grad(loss, argnums=(0, 1))
    a, b = nx.tensor([1.0, 2.0]), nx.tensor([3.0, 4.0])
    cases = [(a, b, 2.0), (a, a, 2.0), (a, b, 3.0), (nx.tensor([1.0, 2.0, 3.0]),) * 2 + (2.0,)]
    for _ in range(3):
        for args in cases:
            _close(f(*args), _uncached(f, *args))
    assert callcache.info()[0] == 4


def test_cache_holds_no_arrays():
    f = nx.vmap(nx.grad(lambda w, x: (x @ w) ** 2), in_axes=(None, 0))
    w, x = _data(0, (5,)), _data(1)
    for _ in range(3):
        g = f(w, x).block_until_ready()
    arrays = [weakref.ref(t._impl.value) for t in (w, x, g)]
    del w, x, g
    gc.collect()
    assert all(r() is None for r in arrays)


def test_cache_off_and_clear():
    f = nx.grad(lambda x: (x * x).sum())
    x = nx.tensor([1.0])
    with _config.override(call_cache=False):
        for _ in range(3):
            f(x)
    assert callcache.info() == (0, 0, 0)
    for _ in range(3):
        f(x)
    assert callcache.info()[0] == 1
    nx.clear_caches()
    assert callcache.info() == (0, 0, 0)
    for _ in range(3):
        np.testing.assert_allclose(np.asarray(f(x)), [2.0])


def test_replayed_realization_compiles_once_and_matches():
    def loss(w, x, y):
        return (x @ w - y) ** 2

    nx.clear_caches()
    f = nx.vmap(nx.grad(loss), in_axes=(None, 0, 0))
    for step in range(6):
        w, xs, ys = _data(step, (5,)), _data(10 + step), _data(20 + step, (8,))
        got = f(w, xs, ys).numpy()
        want = _uncached(f, w, xs, ys).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    assert callcache.info()[0] == 4
    assert nx.cache_info().compiles == 1


def test_requires_grad_arguments_run_the_function():
    """A replay builds untraced nodes, so an argument with ``requires_grad_()`` must make the call
    run (``backward()`` then differentiates through it, here a second derivative)."""

    def loss(w, x):
        return ((x @ w) ** 2).sum()

    g = nx.grad(loss)
    x = _data(1, (4, 3))
    for _ in range(3):
        g(_data(2, (3,)), x).numpy()
    assert callcache.info()[:2] == (1, 1)
    w = _data(2, (3,))
    w.requires_grad_()
    g(w, x).sum().backward()
    # d/dw sum(2 x^T x w) = 2 x^T x 1
    xn = np.asarray(x)
    np.testing.assert_allclose(w.grad.numpy(), 2 * xn.T @ xn @ np.ones(3), rtol=1e-5)
    assert callcache.info()[0] == 1  # not replayed


def _lin_loss(w, x, y):
    return (x @ w - y) ** 2


def test_call_realized_alone_each_time_is_dispatched_at_once():
    """Once a replay's results were realized exactly on their own, later calls with computed
    arguments run the program at once (nothing could have fused with it): same values, no new
    compile, results already computed when the call returns."""
    nx.clear_caches()
    f = nx.vmap(nx.grad(_lin_loss), in_axes=(None, 0, 0))
    outs = []
    for step in range(6):
        w, xs, ys = _data(step, (5,)), _data(10 + step), _data(20 + step, (8,))
        g = f(w, xs, ys)
        outs.append(g.is_realized)
        np.testing.assert_allclose(g.numpy(), _uncached(f, w, xs, ys).numpy(), rtol=1e-6, atol=1e-6)
    # call 1 runs, call 2 records, call 3 replays lazily and is realized alone, 4.. dispatch
    assert outs == [False, False, False, True, True, True]
    assert nx.cache_info().compiles == 1


def test_dispatch_needs_computed_arguments_and_a_live_program():
    f = nx.vmap(nx.grad(_lin_loss), in_axes=(None, 0, 0))
    w, xs, ys = _data(0, (5,)), _data(1), _data(2, (8,))
    for _ in range(4):
        f(w, xs, ys).numpy()
    pending_w = w * 1.0  # a pending argument: the replay stays lazy (it may fuse with w's graph)
    g = f(pending_w, xs, ys)
    assert not g.is_realized
    np.testing.assert_allclose(g.numpy(), _uncached(f, w, xs, ys).numpy(), rtol=1e-6)
    nx.clear_caches()  # the executable is gone: the call replays and compiles again
    callcache_hits = callcache.info()[0]
    g = f(w, xs, ys)
    assert not g.is_realized
    np.testing.assert_allclose(g.numpy(), _uncached(f, w, xs, ys).numpy(), rtol=1e-6)
    assert callcache.info()[0] == callcache_hits  # cleared too: recorded anew


def test_dispatch_turned_off_keeps_results_pending():
    f = nx.vmap(nx.grad(_lin_loss), in_axes=(None, 0, 0))
    w, xs, ys = _data(0, (5,)), _data(1), _data(2, (8,))
    with _config.override(call_cache_dispatch=False):  # the call cache itself stays on
        for _ in range(5):
            g = f(w, xs, ys)
            assert not g.is_realized
            g.numpy()
    assert callcache.info()[0] == 3


def test_other_overrides_turn_the_cache_off():
    f = nx.grad(lambda x: (x * x).sum())
    x = _data(0, (4,))
    with _config.override(max_graph_depth=10_000):
        for _ in range(4):
            f(x)
    assert callcache.info() == (0, 0, 0)


def test_dispatched_outputs_keep_their_order_and_aliasing():
    """Several outputs (value, a tuple of gradients, aux with a repeated tensor and a Python
    value), realized together each call: the dispatched results land in the right leaves."""

    def loss(w, b, x):
        out = x @ w + b
        s = out.sum()
        return (out**2).mean(), (s, s, out.max(), 3)

    f = nx.value_and_grad(loss, argnums=(0, 1), has_aux=True)
    w, b = _data(1, (5, 2)), _data(2, (2,))
    dispatched = []
    for step in range(6):
        x = _data(10 + step)
        got = f(w, b, x)
        dispatched.append(got[0][0].is_realized)
        nx.realize(got)
        (value, (s1, s2, mx, three)), grads = got
        assert s1 is s2 and three == 3
        _close(got, _uncached(f, w, b, x))
    assert dispatched == [False, False, False, True, True, True]


def test_dispatch_from_several_threads_matches():
    """Threads calling the same cached function at once (each records, replays and dispatches on
    its own): every result equals the uncached one."""
    import concurrent.futures

    f = nx.vmap(nx.grad(_lin_loss), in_axes=(None, 0, 0))
    inputs = [(_data(i, (5,)), _data(50 + i), _data(100 + i, (8,))) for i in range(4)]
    want = [_uncached(f, *a).numpy() for a in inputs]

    def work(i):
        out = []
        for _ in range(8):
            out.append(f(*inputs[i]).numpy())
        return out

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(work, range(4)))
    for i, outs in enumerate(results):
        for got in outs:
            np.testing.assert_allclose(got, want[i], rtol=1e-6, atol=1e-6)
    assert callcache.info()[0] > 0  # some calls were replayed

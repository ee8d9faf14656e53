"""``nx.compile`` traces Python numbers as weakly typed 0-d values, as ``jax.jit`` does (issue 17):
a step counter does not retrace, promotion matches ``jax.jit``, static arguments still specialize,
a Python decision on a traced number raises a ConcretizationError naming the fix, and retraces
caused by changing static values warn once."""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.errors import ConcretizationError


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_step_counter_loop_traces_once_and_matches_jax_jit():
    traces = []

    def body(np_, w, step):
        decay = 0.5 ** (step / 10)  # a traced float computed from the traced int
        return w * decay + step % 3, step + 1

    @nx.compile
    def f(w, step):
        traces.append(step)  # runs only while tracing
        return body(nx, w, step)

    jf = jax.jit(lambda w, step: body(jnp, w, step))
    w0 = _x((4,))
    w, wj = nx.tensor(w0), jnp.asarray(w0)
    for step in range(50):
        (w, nxt), (wj, nxtj) = f(w, step), jf(wj, step)
        assert nxt.item() == int(nxtj) == step + 1 and nxt.dtype == nxtj.dtype == np.int32
    np.testing.assert_allclose(w.numpy(), np.asarray(wj), rtol=1e-5)
    assert len(traces) == 1 and type(traces[0]).__name__ == "TracedScalar"
    info = f.cache_info()
    assert (info.traces, info.executables, info.hits, info.evictions) == (1, 1, 49, 0)


def _mixed(np_, x, cfg, *, flag):
    lr, step, (a, b) = cfg["lr"], cfg["step"], cfg["pair"]
    y = x * lr - step * a + b
    y = np_.where(flag, y, -y)
    return {"y": y, "count": step * 2 + 1, "ratio": a / (step + 1), "on": flag & (step > 2)}


@pytest.mark.parametrize("calls", [[1, 2, 3, 7]])
def test_int_float_bool_in_pytrees_and_keywords_match_jax_jit(calls):
    f = nx.compile(lambda x, cfg, *, flag: _mixed(nx, x, cfg, flag=flag))
    jf = jax.jit(lambda x, cfg, *, flag: _mixed(jnp, x, cfg, flag=flag))
    x0 = _x((3, 2))
    for k in calls:
        cfg = {"lr": 0.1 * k, "step": k, "pair": (k - 5, 2.5 * k)}
        got = f(nx.tensor(x0), cfg, flag=k % 2 == 0)
        want = jf(jnp.asarray(x0), cfg, flag=k % 2 == 0)
        for name in want:
            assert got[name].dtype == want[name].dtype, name
            np.testing.assert_allclose(got[name].numpy(), np.asarray(want[name]), rtol=1e-6)
    assert f.cache_info().traces == 1 and f.cache_info().hits == len(calls) - 1


def _promotions(np_, x, s):
    t = s * 2 + 1  # stays weak: x's dtype wins below
    return (x + s, s * x, x - t, t / x, x > s, np_.maximum(x, s), np_.minimum(s, x), -s + x)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint8", "int32", "bool"])
@pytest.mark.parametrize("values", [(3, 5), (2.5, 0.5), (True, False)])
def test_weak_type_promotion_matches_jax_jit(dtype, values):
    f = nx.compile(lambda x, s: _promotions(nx, x, s))
    jf = jax.jit(lambda x, s: _promotions(jnp, x, s))
    x0 = np.array([1, 2, 0], dtype=jnp.dtype(dtype))
    for s in values:
        try:
            want = jf(jnp.asarray(x0), s)
        except TypeError:  # JAX refuses e.g. -bool; nablax must refuse the same call too
            with pytest.raises(TypeError):
                f(nx.tensor(x0), s)
            return
        got = f(nx.tensor(x0), s)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype, (dtype, s, [o.dtype for o in got], [o.dtype for o in want])
            np.testing.assert_allclose(
                g.numpy().astype(np.float32), np.asarray(w).astype(np.float32), rtol=1e-2
            )
    assert f.cache_info().traces == 1  # both values: one trace


def test_numpy_scalars_are_traced_as_strongly_typed_arrays():
    fn = lambda np_, x, s: (x * s, s + 1)  # noqa: E731
    f = nx.compile(lambda x, s: fn(nx, x, s))
    jf = jax.jit(lambda x, s: fn(jnp, x, s))
    xb = np.ones(2, jnp.bfloat16)
    for s in (np.float32(2.5), np.float32(-1.0)):
        got, want = f(nx.tensor(xb), s), jf(jnp.asarray(xb), s)
        assert [g.dtype for g in got] == [w.dtype for w in want] == [np.float32] * 2
        assert got[0].tolist() == np.asarray(want[0]).tolist()
    for s in (np.int64(3), np.int64(4)):  # canonicalized to int32, as JAX does
        got, want = f(nx.tensor(xb), s), jf(jnp.asarray(xb), s)
        assert [g.dtype for g in got] == [w.dtype for w in want] == [jnp.bfloat16, np.int32]
    assert f.cache_info().traces == 2  # one per dtype, never per value


def test_static_argnums_and_argnames_still_specialize_either_way_they_are_passed():
    traces = []

    def g(x, n, lr):
        traces.append(n)
        return nx.zeros(n) + x[:n] * lr if n > 1 else x * lr

    by_num = nx.compile(g, static_argnums=1)
    by_name = nx.compile(g, static_argnames="n")
    x = nx.tensor([1.0, 2.0, 3.0])
    for f in (by_num, by_name):
        traces.clear()
        for n, lr in ((2, 0.5), (2, 0.25), (3, 0.5)):
            want = (np.zeros(n) + np.array([1.0, 2.0, 3.0])[:n] * lr).tolist()
            assert f(x, n, lr).tolist() == want  # positional
            assert f(nx.tensor([1.0, 2.0, 3.0]), n=n, lr=lr).tolist() == want  # keywords
        # once per static value and calling convention (as jax.jit: keywords are another
        # signature); neither lr's values nor the tensor objects are part of the key
        assert traces == [2, 2, 3, 3]
        assert f.cache_info().traces == 4 and f.cache_info().hits == 2


def test_retrace_warning_fires_once_naming_the_changing_arguments():
    f = nx.compile(lambda x, n, tag: x * n, static_argnums=1)
    x = nx.ones(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(20):
            assert f(x, n, "same").tolist() == [float(n)] * 2
    assert f.cache_info().traces == 20
    ours = [w for w in caught if "compile_retrace_warning" in str(w.message)]
    assert len(ours) == 1 and ours[0].category is RuntimeWarning
    msg = str(ours[0].message)
    assert "static argument 1 ('n')" in msg and "static_argnums" in msg and "'tag'" not in msg
    assert ours[0].filename == __file__  # points at the caller's line
    # a changing string leaf (keyed by value) counts too; the limit is a nablax option
    h = nx.compile(lambda x, tag: x * len(tag))
    with _config.override(compile_retrace_warning=3), warnings.catch_warnings(record=True) as c2:
        warnings.simplefilter("always")
        for k in range(1, 8):
            h(x, "a" * k)
    assert [str(w.message).count("'tag' (args[1])") for w in c2] == [1]
    with _config.override(compile_retrace_warning=0), warnings.catch_warnings(record=True) as c3:
        warnings.simplefilter("always")
        g = nx.compile(lambda x, n: x * n, static_argnums=1)
        for n in range(12):
            g(x, n)
    assert not c3


def _decide(x, step):
    if step > 10:  # a Python if on a traced number
        return x
    return -x


@pytest.mark.parametrize("fullgraph", [False, True])
def test_python_if_on_a_traced_number_names_static_argnums(fullgraph):
    f = nx.compile(_decide, fullgraph=fullgraph)
    with pytest.raises(ConcretizationError) as e:
        f(nx.ones(2), 3)
    msg = str(e.value)
    assert "nx.compile(_decide)" in msg and "'step' (args[1])" in msg
    assert "static_argnums=(1,)" in msg and "static_argnames=('step',)" in msg
    assert "if step > 10" in msg  # the user's line
    assert nx.compile(_decide, static_argnums=1)(nx.ones(2), 3).tolist() == [-1.0, -1.0]
    assert (nx.ones(2) * 3).sum().item() == 6.0  # nothing traced is left pending


@pytest.mark.parametrize(
    "use",
    [
        lambda x, n: x * int(n),
        lambda x, n: x.reshape(n, -1),
        lambda x, n: nx.zeros((n,)),
        lambda x, n: [x for _ in range(n)],
        lambda x, n: x * nx.exp(n * 1.0).item(),
        lambda x, n: x * float(f"{n:d}"),
    ],
)
def test_every_python_value_of_a_traced_number_is_a_concretization_error(use):
    f = nx.compile(use)
    with pytest.raises(ConcretizationError, match=r"argument 'n' \(args\[1\]\).*static_argnums"):
        f(nx.ones(4), 2)


def test_python_int_outside_int32_raises_overflow_error_like_jax():
    f = nx.compile(lambda x, k: x * k)
    with pytest.raises(OverflowError):
        jax.jit(lambda x, k: x * k)(jnp.ones(2), 2**31)
    for k in (2**31, -(2**31) - 1):
        with pytest.raises(OverflowError, match=r"nx.compile: .*'k' \(args\[1\]\).*int32"):
            f(nx.ones(2), k)
    assert f(nx.ones(2), 2**31 - 1).dtype == np.float32  # the edge fits
    g = nx.compile(lambda x, k: x * k, static_argnums=1)
    assert g(nx.ones(1), 2**31).tolist() == [2.0**31]  # a static int stays a Python int


def test_transforms_inside_and_around_compile_with_a_traced_learning_rate():
    def loss(w, x):
        return (nx.tanh(x @ w) ** 2).mean()

    @nx.compile
    def sgd(w, x, lr, step):
        g = nx.grad(loss)(w, x)
        scaled = nx.vmap(lambda row: row * lr)(g)  # the traced scalar inside vmap
        return w - scaled / (step + 1), step + 1

    def loss_j(w, x):
        return (jnp.tanh(x @ w) ** 2).mean()

    @jax.jit
    def sgd_j(w, x, lr, step):
        g = jax.grad(loss_j)(w, x)
        return w - jax.vmap(lambda row: row * lr)(g) / (step + 1), step + 1

    w0, x0 = _x((3, 2)), _x((5, 3), 1)
    w, wj, x, xj = nx.tensor(w0), jnp.asarray(w0), nx.tensor(x0), jnp.asarray(x0)
    for step in range(6):
        (w, s), (wj, sj) = sgd(w, x, 0.1 + step / 100, step), sgd_j(wj, xj, 0.1 + step / 100, step)
        assert s.item() == int(sj)
    np.testing.assert_allclose(w.numpy(), np.asarray(wj), rtol=1e-5, atol=1e-6)
    assert sgd.cache_info().traces == 1
    # compile(grad(f)) with a Python number argument, and grad of compile
    gf = nx.compile(nx.grad(lambda w, c: loss(w * c, x)))
    for c in (0.5, 2.0):
        want = jax.grad(lambda w, c: loss_j(w * c, xj))(jnp.asarray(w0), c)
        np.testing.assert_allclose(gf(nx.tensor(w0), c).numpy(), want, rtol=1e-5, atol=1e-6)
    assert gf.cache_info().traces == 1
    cl = nx.compile(lambda w, c: loss(w * c, x))
    got = nx.grad(cl)(nx.tensor(w0), 3.0)
    want = jax.grad(lambda w: loss_j(w * 3.0, xj))(jnp.asarray(w0))
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_dynamic_dims_and_traced_numbers_share_one_trace():
    f = nx.compile(lambda x, s: x.sum() * s + x.shape[0], dynamic_dims={0: {0: "n"}})
    for n, s in ((2, 1.5), (5, -1.0), (3, 0.25)):
        assert f(nx.ones(n), s).item() == pytest.approx(n * s + n)
    assert f.cache_info().traces == 1 and f.cache_info().executables == 3

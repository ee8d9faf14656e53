"""The executor: dispatch, custom VJP, nablax Tensors, stamps, recording, shard_map, compile and
call keys (kernels/executor.py, _call.py, _graph.py, invocation.py, kernel.py)."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _kernels import Affine, Unroll, affine_reference

import nablax as nx
from nablax import _config
from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Invocation,
    Kernel,
    PersistentCache,
)

AFFINE = Affine("affine")
RNG = np.random.default_rng(0)
X = jnp.asarray(RNG.standard_normal((5, 4)), jnp.float32)
W = jnp.asarray(RNG.standard_normal((4, 3)), jnp.float32)
B = jnp.asarray(RNG.standard_normal((3,)), jnp.float32)
IDX = jnp.arange(5, dtype=jnp.int32)


@pytest.fixture
def ex(tmp_path):
    store = PersistentCache(tmp_path / "k.sqlite")
    yield Executor(
        ConfigSelectorChain(ConfigCache(), AutotunePolicy(allow_autotune=False), None, store)
    )
    store.close()


# ---- dispatch ----------------------------------------------------------------------------------


def test_hooks_are_chosen_most_specific_first():
    class K(Kernel):
        def run(self, x, *, cfg):
            return x

        def run_gpu(self, x, *, cfg):
            return x

        def run_shard_map(self, x, *, cfg):
            return x

        def vjp_shard_map_cpu(self, *a, cfg):
            return ()

    k = K("dispatch")
    assert k.hook_name("run", "cpu") == "run"
    assert k.hook_name("run", "gpu") == "run_gpu"
    assert k.hook_name("run", "gpu", shard_map=True) == "run_shard_map"
    assert k.hook_name("vjp", "cpu", shard_map=True) == "vjp_shard_map_cpu"
    assert k.hook_name("vjp", "gpu", shard_map=True) == "vjp"
    assert k.hook_name("heuristic_cfg", "tpu") == "heuristic_cfg"
    with pytest.raises(ValueError, match="op_id"):
        K("bad@id")


# ---- custom VJP on jax arrays ------------------------------------------------------------------


def test_custom_vjp_matches_jax_grad_with_none_and_keyword_arrays(ex):
    def f(x, w, b):
        return jnp.sum(jnp.sin(ex(AFFINE, x, w, IDX, scale=1.5, bias=b)))

    def ref(x, w, b):
        return jnp.sum(jnp.sin(affine_reference(x, w, IDX, scale=1.5, bias=b)))

    got = jax.grad(f, argnums=(0, 1, 2))(X, W, B)
    want = jax.grad(ref, argnums=(0, 1, 2))(X, W, B)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    jitted = jax.jit(jax.grad(f, argnums=(0, 1, 2)))(X, W, B)
    for g, r in zip(jitted, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)
    # the int array (None gradient) and vmap over the kernel
    out = jax.vmap(lambda x: ex(AFFINE, x, W, IDX[:1]))(X[:, None, :])
    np.testing.assert_allclose(out[:, 0], X @ W, rtol=1e-5, atol=1e-5)


def test_wrong_vjp_results_are_named(ex):
    class Wrong(Affine):
        def vjp(self, res, y, dy, x, w, idx, *, cfg, scale=1.0, bias=None):
            return (dy, None, None)  # dy has the output's shape, not x's

    k = Wrong("wrong_vjp")
    with pytest.raises(ValueError, match=r"wrong_vjp@v1.*shape \(5, 3\) for args\[0\].*\(5, 4\)"):
        jax.grad(lambda x: ex(k, x, W, IDX).sum())(X)

    class Short(Affine):
        def vjp(self, res, y, dy, *args, cfg, **kw):
            return (dy,)

    with pytest.raises(TypeError, match="returned 1 gradient.*expected a tuple of 3"):
        jax.grad(lambda x: ex(Short("short_vjp"), x, W, IDX).sum())(X)


def test_default_vjp_differentiates_run(ex):
    class Plain(Kernel):
        def run(self, x, w, *, cfg):
            return jnp.tanh(x @ w)

        def heuristic_cfg(self, inv):
            return Unroll()

    k = Plain("plain_vjp")
    got = jax.grad(lambda x, w: ex(k, x, w).sum(), argnums=(0, 1))(X, W)
    want = jax.grad(lambda x, w: jnp.tanh(x @ w).sum(), argnums=(0, 1))(X, W)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


# ---- nablax Tensors ----------------------------------------------------------------------------


def test_tensor_inputs_make_one_node_and_grad_flows_through_vjp(ex):
    from nablax.core.graph import toposort

    x, w, b = nx.asarray(X), nx.asarray(W), nx.asarray(B)
    y = ex(AFFINE, x, w, nx.asarray(IDX), scale=1.5, bias=b)
    assert isinstance(y, nx.Tensor) and not y.is_realized
    names = [n.prim.name for n in toposort([y._impl.src[0]])]
    assert names.count("kernel_call") == 1
    np.testing.assert_allclose(y.numpy(), affine_reference(X, W, IDX, 1.5, B), rtol=1e-5, atol=1e-5)

    def loss(x, w, b):
        return nx.sin(ex(AFFINE, x, w, nx.asarray(IDX), scale=1.5, bias=b)).sum()

    got = nx.grad(loss, argnums=(0, 1, 2))(x, w, b)
    want = jax.grad(
        lambda x, w, b: jnp.sum(jnp.sin(affine_reference(x, w, IDX, 1.5, b))), argnums=(0, 1, 2)
    )(X, W, B)
    for g, r in zip(got, want):
        np.testing.assert_allclose(g.numpy(), r, rtol=1e-5, atol=1e-5)
    # backward() too, and vmap over rows
    w2 = nx.asarray(W).requires_grad_()
    ex(AFFINE, x, w2, nx.asarray(IDX)).sum().backward()
    np.testing.assert_allclose(w2.grad.numpy(), X.T @ np.ones((5, 3)), rtol=1e-5, atol=1e-5)
    rows = nx.vmap(lambda r: ex(AFFINE, r[None], w, nx.asarray(IDX[:1]))[0])(x)
    np.testing.assert_allclose(rows.numpy(), X @ W, rtol=1e-5, atol=1e-5)


def _call_spec(y):
    """The CallSpec of the kernel node that made ``y``."""
    return y._impl.src[0].params[0]


def _memory_key(spec):
    """The memory config cache's key of a spec's call."""
    from nablax.kernels import device_fingerprint

    return (device_fingerprint(), AFFINE.versioned_id, spec.call_key)


def test_call_known_equals_the_full_call_and_skips_it_when_repeated(ex):
    from nablax.kernels import overlay_cache

    x, w, idx = nx.asarray(X), nx.asarray(W), nx.asarray(IDX)
    key = ("affine", x.shape, w.shape, 1.5)
    want = affine_reference(X, W, IDX, 1.5)
    full = ex(AFFINE, x, w, idx, scale=1.5)
    first = ex.call_known(AFFINE, key, x, w, idx, scale=1.5)  # full path, then memoized
    assert ex._known.info().size == 1
    hits = ex._known.hits
    second = ex.call_known(AFFINE, key, nx.asarray(X), w, idx, scale=1.5)
    assert ex._known.hits == hits + 1
    spec = _call_spec(second)  # read before the values are: realizing drops the node
    assert _call_spec(first) is _call_spec(full) is spec
    for y in (full, first, second):
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5)
    # a config stored in the memory cache (generation bump) sends the next call down the full
    # path, which sees it: the node runs the new config
    ex.chooser.cache.put(*_memory_key(spec), Unroll(2))
    third = ex.call_known(AFFINE, key, x, w, idx, scale=1.5)
    assert _call_spec(third).cfg == Unroll(2) and _call_spec(third) is not spec
    assert spec.cfg == Unroll(1)
    np.testing.assert_allclose(third.numpy(), want, rtol=1e-5, atol=1e-5)
    # an overlay is honoured (never memoized), and the memo is used again after it
    overlay = {_memory_key(spec): Unroll(3)}
    with overlay_cache(overlay):
        assert _call_spec(ex.call_known(AFFINE, key, x, w, idx, scale=1.5)).cfg == Unroll(3)
    assert _call_spec(ex.call_known(AFFINE, key, x, w, idx, scale=1.5)).cfg == Unroll(2)


def test_call_known_under_grad_and_with_keyword_arrays(ex):
    x, w, idx, b = nx.asarray(X), nx.asarray(W), nx.asarray(IDX), nx.asarray(B)

    def loss(x, w):
        return nx.sin(ex.call_known(AFFINE, ("affine", 1.5), x, w, idx, scale=1.5)).sum()

    want = jax.grad(lambda x, w: jnp.sum(jnp.sin(affine_reference(x, w, IDX, 1.5))), (0, 1))(X, W)
    for _ in range(3):  # the full path, then the memo (a differentiated call has its own entry)
        got = nx.grad(loss, argnums=(0, 1))(x, w)
        for g, r in zip(got, want):
            np.testing.assert_allclose(g.numpy(), r, rtol=1e-5, atol=1e-5)
    assert ex._known.hits >= 2
    # a keyword array is not one of the positional tensors: such a call is never memoized
    n = ex._known.info().size
    for _ in range(2):
        y = ex.call_known(AFFINE, ("affine-bias",), x, w, idx, scale=1.5, bias=b)
        np.testing.assert_allclose(
            y.numpy(), affine_reference(X, W, IDX, 1.5, B), rtol=1e-5, atol=1e-5
        )
    assert ex._known.info().size == n
    # a key that does not fix the shapes or keywords: the stored call is checked, never reused
    # for other shapes or options
    loose = ("affine-loose",)
    x2 = nx.asarray(np.ones((2, 4), np.float32))
    for xi, sc in ((x, 1.5), (x2, 1.5), (x, 2.0), (x2, 2.0)):
        ii = idx if xi is x else nx.asarray(IDX[:2])
        y = ex.call_known(AFFINE, loose, xi, w, ii, scale=sc)
        ref = affine_reference(np.asarray(xi.numpy()), W, np.asarray(ii.numpy()), sc)
        np.testing.assert_allclose(y.numpy(), ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(TypeError, match="call_known"):
        ex.call_known(AFFINE, ("affine-arrays",), X, W, IDX)


# ---- stamps, recording, shard_map, compile ------------------------------------------------------


def test_stamp_names_the_kernel_in_lowered_hlo(ex):
    text = jax.jit(lambda x: ex(AFFINE, x, W, IDX)).lower(X).as_text()
    assert "nablax_kernel_affine_v1_" in text
    with _config.override(ops_stamp="json"):
        ex2 = Executor(ex.chooser)
        lowered = jax.jit(lambda x: ex2(AFFINE, x, W, IDX, scale=2.0)).lower(X)
        text = lowered.as_text(debug_info=True)
    assert '"op": "affine@v1"' in text.replace("\\22", '"')
    with _config.override(ops_stamp="none"):
        ex3 = Executor(ex.chooser)
        text = jax.jit(lambda x: ex3(AFFINE, x, W, IDX, scale=3.0)).lower(X).as_text()
    assert "nablax_kernel_affine" not in text


def test_recording_keeps_abstract_shapes_only(ex):
    with _config.override(ops_record=True):
        jax.jit(lambda x: ex(AFFINE, x, W, IDX))(X)  # called with tracers
        ex(AFFINE, X, W, IDX)
    rows = ex.chooser.persistent.recorded(AFFINE.versioned_id)
    assert len(rows) == 1
    op, key, sig, count = rows[0]
    data = json.loads(sig)
    assert data["leaves"] == ["float32[5,4]", "float32[4,3]", "int32[5]"]
    assert "Tracer" not in sig and op == "affine@v1"


def test_shard_map_method(ex):
    from jax.sharding import Mesh
    from jax.sharding import PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("x",))
    out = ex(
        AFFINE,
        X,
        W,
        IDX,
        method="shard_map",
        mesh=mesh,
        in_specs=(P("x"), P(), P("x")),
        out_specs=P("x"),
    )
    np.testing.assert_allclose(out, X @ W, rtol=1e-5, atol=1e-5)
    inv_a = Invocation(
        AFFINE.versioned_id,
        (X, W, IDX),
        {},
        method="shard_map",
        mesh=mesh,
        in_specs=(P("x"), P(), P("x")),
        out_specs=P("x"),
    )
    inv_b = Invocation(AFFINE.versioned_id, (X, W, IDX), {})
    assert inv_a.call_key != inv_b.call_key
    with pytest.raises(ValueError, match="needs mesh"):
        ex(AFFINE, X, W, IDX, method="shard_map")


def test_compile_fixes_the_config(ex):
    f = ex.compile(AFFINE, X, W, IDX, scale=2.0)
    assert f.cfg == Unroll()
    np.testing.assert_allclose(f(X, W, IDX, scale=2.0), 2.0 * (X @ W), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="compiled for"):
        f(X, W, IDX, scale=3.0)


# ---- call keys -----------------------------------------------------------------------------------

_KEY_SCRIPT = textwrap.dedent(
    """
    import functools, sys
    import jax.numpy as jnp
    from nablax.kernels import Invocation

    def make(c):
        def f(x):
            return x * c
        return f

    def g(x, k=3):
        return x + k

    inv = Invocation("op@v1", (jnp.ones((2, 3)), make(2.5), functools.partial(g, k=4)),
                     {"causal": True, "dtype": jnp.bfloat16})
    print(inv.call_key)
    """
)


def _key_here(c=2.5, k=4):
    ns: dict = {"__name__": "__main__"}
    exec(
        _KEY_SCRIPT.replace("print(inv.call_key)", "")
        .replace("make(2.5)", f"make({c})")
        .replace("k=4)", f"k={k})"),
        ns,
    )
    return ns["inv"].call_key


def test_call_key_is_stable_across_processes_and_depends_on_closures(tmp_path):
    src = Path(__file__).resolve().parents[2] / "src"
    keys = set()
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _KEY_SCRIPT],
            capture_output=True,
            text=True,
            check=True,
            env={
                **os.environ,  # inherit (a GPU run's settings, the suite's cache dir)
                "PYTHONPATH": os.pathsep.join(
                    filter(None, [str(src), os.environ.get("PYTHONPATH")])
                ),
                "JAX_PLATFORMS": "cpu",
                "PYTHONHASHSEED": "random",
            },
        )
        keys.add(out.stdout.strip())
    assert len(keys) == 1
    assert keys == {_key_here()}
    assert _key_here(c=3.5) != _key_here() and _key_here(k=5) != _key_here()


def test_call_key_rejects_unkeyable_statics():
    class Opaque:
        pass

    with pytest.raises(TypeError, match=r"args\[1\].*Opaque.*__nablax_key__"):
        _ = Invocation("op@v1", (jnp.ones(2), Opaque()), {}).call_key
    a = Invocation("op@v1", (jnp.ones(2), functools.partial(max, 3)), {})
    b = Invocation("op@v1", (jnp.ones(2), functools.partial(max, 4)), {})
    assert a.call_key != b.call_key
    assert "0x" not in a.signature


def test_second_order_and_jvp_through_a_kernel(ex):
    """grad(grad) differentiates the kernel's vjp with JAX; jvp goes through JAX's jvp of run."""
    x = nx.asarray(X)

    def f_nx(w):
        return (ex(AFFINE, x, w, nx.asarray(IDX), scale=1.5) ** 3).sum()

    def f_jax(w):
        return jnp.sum(affine_reference(X, w, IDX, scale=1.5) ** 3)

    v = jnp.ones_like(W)
    hvp_nx = nx.grad(lambda w: (nx.grad(f_nx)(w) * nx.asarray(v)).sum())(nx.asarray(W))
    hvp_jax = jax.grad(lambda w: jnp.sum(jax.grad(f_jax)(w) * v))(W)
    np.testing.assert_allclose(hvp_nx.numpy(), hvp_jax, rtol=1e-4, atol=1e-4)
    _, t_nx = nx.jvp(f_nx, (nx.asarray(W),), (nx.asarray(v),))
    _, t_jax = jax.jvp(f_jax, (W,), (v,))
    np.testing.assert_allclose(t_nx.numpy(), t_jax, rtol=1e-4, atol=1e-4)

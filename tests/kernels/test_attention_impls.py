"""Implementations as candidates (API §6, issue 38): ``AttentionCfg(impl=...)`` and
``MatmulCfg(impl=...)`` run nablax's Pallas kernels (interpret mode on a CPU), XLA's fusion or
cuDNN; the Pallas flash-attention backward matches ``jax.grad`` of a plain reference; configs
stored before ``impl`` existed load as the old behaviour; and a JAX whose Pallas Triton backend is
deprecated gets no Pallas GPU candidates and no DeprecationWarning."""

from __future__ import annotations

import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.kernels import library
from nablax.kernels._configs import cfg_from_json, cfg_to_json
from nablax.kernels.library import AttentionCfg, MatmulCfg, _impls, attention_reference
from nablax.kernels.library import attention_blocked as blocked_mod
from nablax.kernels.library.attention_pallas import pallas_backward, pallas_forward

attn_mod = importlib.import_module("nablax.kernels.library.attention")
mm_mod = importlib.import_module("nablax.kernels.library.matmul")

ON_GPU = jax.default_backend() not in ("cpu", "tpu")


def _tol(dtype) -> dict:
    """Tolerances from the dtype: float32 dots may run as TF32 on a GPU (10-bit mantissa)."""
    dt = jnp.dtype(dtype)
    eps = float(jnp.finfo(dt).eps)
    if dt == jnp.float32:
        eps = 2.0**-10 if ON_GPU else eps
        return dict(rtol=100 * eps, atol=100 * eps)
    return dict(rtol=4 * eps, atol=4 * eps)


def _rand(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _qkv(b, sq, skv, h, d, dv, seed=0, dtype=jnp.float32):
    return (
        _rand((b, sq, h, d), seed, dtype),
        _rand((b, skv, h, d), seed + 1, dtype),
        _rand((b, skv, h, dv), seed + 2, dtype),
    )


def _close(got, want, dtype):
    """Within the dtype's tolerance, absolute errors measured against the largest value."""
    want = np.asarray(want, np.float32)
    tol = _tol(dtype)
    atol = tol["atol"] * max(1.0, float(np.abs(want).max(initial=0.0)))
    np.testing.assert_allclose(np.asarray(got, np.float32), want, rtol=tol["rtol"], atol=atol)


def _ref_grads(q, k, v, dy, causal, scale):
    """``jax.grad`` of the plain reference, in float32 (the inputs as given, upcast)."""
    f32 = [x.astype(jnp.float32) for x in (q, k, v)]
    ref = lambda q, k, v: attention_reference(q, k, v, causal=causal, scale=scale)  # noqa: E731
    return jax.vjp(ref, *f32)[1](dy.astype(jnp.float32))


@pytest.mark.parametrize(
    "sq,skv,d,dv,causal,dtype",
    [
        (20, 35, 8, 8, True, jnp.float32),  # padded sequences, 2 q tiles x 3 kv tiles
        (20, 35, 8, 4, False, jnp.float32),  # another v head dim
        (40, 17, 16, 16, True, jnp.float32),  # more queries than keys (start-aligned causal)
        (33, 33, 16, 16, True, jnp.bfloat16),
    ],
)
def test_pallas_backward_matches_jax_grad_of_the_reference(sq, skv, d, dv, causal, dtype):
    q, k, v = _qkv(2, sq, skv, 3, d, dv, seed=sq, dtype=dtype)
    dy = _rand((2, sq, 3, dv), 99, dtype)
    opts = dict(scale=0.4, causal=causal, blocks=(16, 16), interpret=True)
    out, lse = pallas_forward(q, k, v, **opts)
    got = pallas_backward(q, k, v, out, lse, dy, **opts)
    want = _ref_grads(q, k, v, dy, causal, 0.4)
    for g, w, x in zip(got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        _close(g, w, dtype)


@pytest.mark.parametrize("copy_bytes", [0, 1 << 30])  # dQ from the transposed tile / its copy
@pytest.mark.parametrize(
    "sq,skv,d,dv,causal",
    [
        (20, 35, 8, 8, True),  # padded sequences, 2 q tiles x 3 kv tiles
        (20, 35, 8, 4, False),  # another v head dim
        (40, 17, 16, 16, True),  # more queries than keys (start-aligned causal)
    ],
)
def test_blocked_backward_matches_jax_grad_of_the_reference(
    monkeypatch, sq, skv, d, dv, causal, copy_bytes
):
    """The blocked backward computes transposed tiles; both ways of forming dQ from them."""
    monkeypatch.setattr(blocked_mod, "_DQ_COPY_BYTES", copy_bytes)
    q, k, v = _qkv(2, sq, skv, 3, d, dv, seed=sq + 1)
    dy = _rand((2, sq, 3, dv), 98)
    cfg = AttentionCfg(16, 16)
    out, lse = blocked_mod.blocked_forward(q, k, v, scale=0.4, causal=causal, cfg=cfg)
    bwd = jax.jit(
        lambda *a: blocked_mod.blocked_backward(*a, scale=0.4, causal=causal, cfg=cfg)
    )  # traced here, under the patched threshold
    got = bwd(q, k, v, out, lse, dy)
    want = _ref_grads(q, k, v, dy, causal, 0.4)
    for g, w, x in zip(got, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype
        _close(g, w, jnp.float32)
    jaxpr = str(jax.make_jaxpr(bwd)(q, k, v, out, lse, dy))
    assert ("optimization_barrier" in jaxpr) == (copy_bytes > 0)


@pytest.mark.parametrize("masked", [False, True])  # the plain path / the general (mask, bias) path
@pytest.mark.parametrize("causal", [False, True])
def test_second_order_through_the_kernel_call_matches_the_reference(causal, masked):
    """grad of grad through attention on Tensors: the backward node's derivative sends
    cotangents to the residuals (the logsumexp) too, and they must reach q, k and v (they were
    once dropped: the result was silently wrong by more than its own size)."""
    q, k, v = _qkv(1, 6, 6, 2, 4, 4, seed=5)
    dirs = [_rand(x.shape, 40 + i) for i, x in enumerate((q, k, v))]
    bias = _rand((6, 6), 50) if masked else None
    mask = (np.random.default_rng(51).random((6, 6)) > 0.3) | np.eye(6, dtype=bool)

    def ref_attn(q, k, v):
        if not masked:
            return attention_reference(q, k, v, causal=causal, scale=0.5)
        s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.5 + bias
        allowed = mask & (np.tril(np.ones((6, 6), bool)) if causal else True)
        p = jax.nn.softmax(jnp.where(allowed, s, -jnp.inf), -1)
        return jnp.einsum("bhqk,bkhd->bqhd", p, v)

    def our_attn(q, k, v):
        kw = dict(mask=nx.asarray(mask), bias=nx.asarray(bias)) if masked else {}
        return library.attention(q, k, v, causal=causal, scale=0.5, **kw)

    def second(attn, mod, tensors):
        def loss(q, k, v):
            return mod.sum(attn(q, k, v) ** 2)

        def outer(q, k, v):
            g = (jax.grad if mod is jnp else nx.grad)(loss, argnums=(0, 1, 2))(q, k, v)
            return sum(mod.sum(gi * tensors(d)) for gi, d in zip(g, dirs))

        return outer

    got = nx.grad(second(our_attn, nx, nx.asarray), argnums=(0, 1, 2))(
        *(nx.asarray(x) for x in (q, k, v))
    )
    want = jax.grad(second(ref_attn, jnp, jnp.asarray), argnums=(0, 1, 2))(q, k, v)
    for g, w in zip(got, want):
        _close(g.numpy(), w, jnp.float32)


def test_second_order_through_the_pallas_kernel_is_a_clear_error():
    """JAX cannot differentiate pallas_call under a second derivative (an assertion inside JAX):
    nablax says which call and what to use instead."""
    q, k, v = (nx.asarray(x) for x in _qkv(1, 16, 16, 2, 8, 8, seed=6))
    cfg = AttentionCfg(16, 16, impl="pallas")

    def grad_norm(q):
        g = nx.grad(lambda y: (library.attention(y, k, v, causal=True, cfg=cfg) ** 2).sum())(q)
        return (g**2).sum()

    with pytest.raises(NotImplementedError, match=r"(?s)kernel_vjp.*impl='pallas'.*impl='xla'"):
        nx.grad(grad_norm)(q).numpy()


def test_pallas_backward_is_pallas_calls_not_an_xla_loop():
    """The Pallas impl's VJP is two pallas_calls (dK/dV and dQ), not a scan of XLA ops."""
    q, k, v = _qkv(1, 32, 32, 1, 16, 16)
    cfg = AttentionCfg(16, 16, impl="pallas")
    res = attn_mod.ATTENTION.fwd_with_residuals(q, k, v, cfg=cfg, causal=True)[1]
    jaxpr = jax.make_jaxpr(
        lambda dy: attn_mod.ATTENTION.vjp(res, res[0], dy, q, k, v, cfg=cfg, causal=True)
    )(q)
    prims = [e.primitive.name for e in jaxpr.jaxpr.eqns]
    assert prims.count("pallas_call") == 2 and "scan" not in prims, prims


@pytest.mark.parametrize("impl", [None, "xla", "pallas"])
@pytest.mark.parametrize("causal", [False, True])
def test_every_impl_through_the_executor_value_and_grad(impl, causal):
    q, k, v = _qkv(1, 24, 19, 2, 8, 8, seed=3)
    cfg = AttentionCfg(16, 16, impl=impl)

    def loss(q, k, v):
        out = library.attention(q, k, v, causal=causal, cfg=cfg)
        return (out * jnp.arange(out.size).reshape(out.shape) / out.size).sum()

    def ref_loss(q, k, v):
        out = attention_reference(q, k, v, causal=causal)
        return (out * jnp.arange(out.size).reshape(out.shape) / out.size).sum()

    val, grads = jax.value_and_grad(loss, argnums=(0, 1, 2))(q, k, v)
    want_val, want = jax.value_and_grad(ref_loss, argnums=(0, 1, 2))(q, k, v)
    _close(val, want_val, jnp.float32)
    for g, w in zip(grads, want):
        _close(g, w, jnp.float32)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_impls_with_grouped_heads_and_torch_layout(impl):
    """Grouped-query heads and the "bhsd" layout run the config's implementation (forward and
    backward) around the layout conversion."""
    q = _rand((1, 4, 12, 8), 1)  # (batch, heads, seq, head_dim)
    kv = _rand((1, 2, 12, 8), 2)
    cfg = AttentionCfg(16, 16, impl=impl)

    def f(q, kv):
        return library.attention(q, kv, kv, causal=True, layout="bhsd", cfg=cfg).sum()

    def ref(q, kv):
        full = jnp.repeat(kv, 2, axis=1).transpose(0, 2, 1, 3)
        out = attention_reference(q.transpose(0, 2, 1, 3), full, full, causal=True)
        return out.sum()

    for g, w in zip(jax.grad(f, (0, 1))(q, kv), jax.grad(ref, (0, 1))(q, kv)):
        _close(g, w, jnp.float32)


def test_pallas_impl_on_nablax_tensors_with_nx_grad():
    q, k, v = _qkv(1, 10, 10, 1, 8, 8, seed=4)
    cfg = AttentionCfg(16, 16, impl="pallas")
    g = nx.grad(lambda q: library.attention(q, nx.tensor(k), nx.tensor(v), cfg=cfg).sum())(
        nx.tensor(q)
    )
    want = jax.grad(lambda q: attention_reference(q, k, v).sum())(q)
    _close(g.numpy(), want, jnp.float32)


@pytest.mark.skipif(ON_GPU, reason="off a GPU only: cuDNN is not there")
def test_cudnn_impl_off_a_gpu_says_why_and_is_no_candidate():
    q, k, v = _qkv(1, 8, 8, 1, 8, 8, dtype=jnp.bfloat16)
    with pytest.raises(NotImplementedError, match="impl='cudnn'.*NVIDIA GPU.*Fix"):
        library.attention(q, k, v, cfg=AttentionCfg(impl="cudnn"))
    inv = nx.kernels.Invocation(library.ATTENTION.versioned_id, (q, k, v), {})
    for plat in ("cpu", "gpu"):
        assert all(c.impl != "cudnn" for c in library.ATTENTION.hook("candidate_cfgs", plat)(inv))


def test_bad_impl_names_the_field_and_the_choices():
    with pytest.raises(ValueError, match=r"AttentionCfg.impl.*'pallas', 'xla', 'cudnn'"):
        AttentionCfg(impl="triton")
    with pytest.raises(ValueError, match=r"MatmulCfg.impl must be None, 'xla' or 'pallas'"):
        MatmulCfg(impl="cudnn")


def test_configs_stored_before_impl_load_as_the_old_behaviour():
    old = '{"fields":{"block_kv":128,"block_q":64},"type":"' + attn_mod.__name__ + ':AttentionCfg"}'
    cfg = cfg_from_json(old, [AttentionCfg])
    assert cfg == AttentionCfg(64, 128) and cfg.impl is None
    assert repr(cfg) == "AttentionCfg(block_q=64, block_kv=128)"  # reprs read as before
    assert attn_mod.resolve_impl(cfg, "cpu") == "blocked"
    old_mm = '{"fields":{"block_k":64,"block_m":null,"block_n":null},"type":"MOD:MatmulCfg"}'
    mm = cfg_from_json(old_mm.replace("MOD", mm_mod.__name__), [MatmulCfg])
    assert mm == MatmulCfg(block_k=64) and mm_mod.resolve_impl(mm, "cpu") == "blocked"
    for new in (AttentionCfg(32, 16, impl="pallas"), MatmulCfg(16, 16, 16, impl="xla")):
        assert cfg_from_json(cfg_to_json(new), [type(new)]) == new


def test_persistent_cache_round_trips_impl(tmp_path):
    store = nx.kernels.PersistentCache(tmp_path / "k.sqlite")
    store.put("dev", "attention@v1", "key", AttentionCfg(64, 64, impl="xla"))
    assert store.get("dev", "attention@v1", "key") == AttentionCfg(64, 64, impl="xla")


def test_matmul_impls_values_and_grads():
    a, b = _rand((3, 20, 40), 0), _rand((40, 24), 1)
    want = jnp.matmul(a, b)
    want_g = jax.grad(lambda a, b: (jnp.matmul(a, b) ** 2).sum(), (0, 1))(a, b)
    for cfg in (MatmulCfg(impl="xla"), MatmulCfg(16, 16, 16, impl="pallas"), MatmulCfg(16, 32)):
        _close(library.matmul(a, b, cfg=cfg), want, jnp.float32)
        g = jax.grad(lambda a, b, c=cfg: (library.matmul(a, b, cfg=c) ** 2).sum(), (0, 1))(a, b)
        for x, w in zip(g, want_g):
            _close(x, w, jnp.float32)


def test_deprecated_triton_backend_means_no_pallas_gpu_candidates(monkeypatch):
    """On a JAX whose Pallas Triton backend is deprecated (0.11+) nablax offers no Pallas GPU
    candidates, its GPU heuristics pick XLA, and an explicit impl="pallas" compiled for a GPU
    raises NotImplementedError naming the reason and the fix (never a DeprecationWarning)."""
    monkeypatch.setattr(_impls, "triton_deprecated", lambda: True)
    q = jax.ShapeDtypeStruct((1, 256, 2, 64), jnp.float32)
    inv = nx.kernels.Invocation(library.ATTENTION.versioned_id, (q, q, q), {"causal": True})
    cands = library.ATTENTION.candidate_cfgs_gpu(inv)
    assert cands and all(c.impl in ("xla", "cudnn") for c in cands)
    assert library.ATTENTION.heuristic_cfg_gpu(inv).impl in ("xla", "cudnn")
    assert attn_mod.resolve_impl(AttentionCfg(), "gpu") == "xla"
    a = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    mm_inv = nx.kernels.Invocation(library.MATMUL.versioned_id, (a, a), {})
    assert library.MATMUL.candidate_cfgs_gpu(mm_inv) == [MatmulCfg(impl="xla")]
    assert mm_mod.resolve_impl(MatmulCfg(64, 64, 64), "gpu") == "xla"
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        with pytest.raises(NotImplementedError, match="Triton backend.*deprecat.*Fix: use"):
            _impls.pallas_params("api", interpret=False, num_warps=4)


def test_triton_deprecation_is_detected_from_the_installed_jax():
    major_minor = tuple(int(x) for x in jax.__version__.split(".")[:2])
    assert _impls.triton_deprecated() == (major_minor >= (0, 11))


def test_no_deprecation_warning_on_a_plain_run():
    q, k, v = _qkv(1, 16, 16, 1, 8, 8, seed=6)
    a = _rand((16, 16), 7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        for cfg in (None, AttentionCfg(16, 16, impl="pallas"), AttentionCfg(impl="xla")):
            jax.grad(lambda q, c=cfg: library.attention(q, k, v, causal=True, cfg=c).sum())(q)
        for cfg in (None, MatmulCfg(16, 16, 16, impl="pallas")):
            jax.grad(lambda a, c=cfg: library.matmul(a, a, cfg=c).sum())(a)


def test_pallas_kernels_lower_for_cuda_or_say_why_not():
    """Lowered for CUDA from any machine (no GPU needed): on a JAX whose Triton backend is
    supported, the flash-attention forward, its two backward kernels and the matmul become Triton
    kernel calls with no warning (lowered, not compiled or run: that needs a GPU); on JAX 0.11+
    the Pallas GPU implementation raises NotImplementedError before any deprecated lowering."""
    q = jax.ShapeDtypeStruct((2, 256, 4, 64), jnp.bfloat16)
    a = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    opts = dict(scale=0.125, causal=True, blocks=(64, 64), interpret=False)

    def attn(q, k, v, do):
        out, lse = pallas_forward(q, k, v, **opts)
        return pallas_backward(q, k, v, out, lse, do, **opts)

    def mm(a, b):
        return mm_mod.pallas_matmul_2d(a, b, MatmulCfg(64, 64, 32), interpret=False)

    for fn, args, calls in ((attn, (q, q, q, q), 3), (mm, (a, a), 1)):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            if _impls.triton_deprecated():
                with pytest.raises(NotImplementedError, match="Triton backend"):
                    jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",))
                continue
            text = jax.jit(fn).trace(*args).lower(lowering_platforms=("cuda",)).as_text()
        assert text.count("__gpu$xla.gpu.triton") == calls, text[:2000]

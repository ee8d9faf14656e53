"""The bundled kernels (``nablax.kernels.library``): values and gradients of every implementation
against plain references, ``jnp.matmul`` and ``jax.nn.dot_product_attention``, over candidate
configs, ragged shapes (sizes that are not multiples of the blocks), causal masks and
``seq_q != seq_kv``; residual sizes; the Pallas bodies in interpret mode; error messages."""

from __future__ import annotations

import functools
import importlib
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nablax.errors import DTypeError, ShapeError
from nablax.kernels.library import (
    ATTENTION,
    MATMUL,
    AttentionCfg,
    MatmulCfg,
    attention_reference,
    matmul_reference,
)

# The package's public functions shadow their submodules' names, so fetch the modules explicitly.
mm_mod = importlib.import_module("nablax.kernels.library.matmul")
attn_mod = importlib.import_module("nablax.kernels.library.attention")

TOL = dict(rtol=1e-5, atol=1e-5)


def _rand(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _inv(*args, **kwargs):
    # Stand-in for an Invocation: the hooks only read .args and .kwargs.
    return SimpleNamespace(args=args, kwargs=kwargs)


def _close(got, want, **tol):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **(tol or TOL))


# -- matmul -----------------------------------------------------------------------------------------
# Small, ragged blocks so padding, the K loop, the tile grid and every None combination all run.
MM_CFGS = [
    MatmulCfg(),
    MatmulCfg(block_k=16),
    MatmulCfg(block_m=16),
    MatmulCfg(block_n=8),
    MatmulCfg(16, 8, 16),
    MatmulCfg(7, 9, 10),
]
MM_SHAPES = [((37, 45), (45, 29)), ((2, 19, 33), (33, 23))]


@functools.partial(jax.jit, static_argnames="cfg")
def _mm_fwd_bwd(a, b, dy, cfg):
    y, res = MATMUL.fwd_with_residuals(a, b, cfg=cfg)
    return y, MATMUL.vjp(res, y, dy, a, b, cfg=cfg)


@pytest.mark.parametrize("sa,sb", MM_SHAPES)
@pytest.mark.parametrize("cfg", MM_CFGS, ids=str)
def test_matmul_forward_and_vjp_match_jax(sa, sb, cfg):
    a, b = _rand(sa, 0), _rand(sb, 1)
    dy = _rand((*sa[:-1], sb[1]), 2)
    y, (da, db) = _mm_fwd_bwd(a, b, dy, cfg)
    _close(y, jnp.matmul(a, b), rtol=1e-5, atol=1e-4)
    _close(y, matmul_reference(a, b), rtol=1e-5, atol=1e-4)
    _, pullback = jax.vjp(matmul_reference, a, b)
    want_da, want_db = pullback(dy)
    assert da.shape == a.shape and db.shape == b.shape
    _close(da, want_da, rtol=1e-5, atol=1e-4)
    _close(db, want_db, rtol=1e-5, atol=1e-4)


def test_matmul_every_candidate_on_a_medium_shape():
    a, b = _rand((300, 600), 0), _rand((600, 130), 1)
    inv = _inv(a, b)
    cands = MATMUL.candidate_cfgs(inv)
    assert 4 <= len(cands) <= 8 and len(set(cands)) == len(cands)
    assert MatmulCfg() in cands and MATMUL.heuristic_cfg(inv) in cands
    want = jnp.matmul(a, b)
    for cfg in cands:
        _close(
            jax.jit(MATMUL.run, static_argnames="cfg")(a, b, cfg=cfg), want, rtol=1e-4, atol=2e-4
        )


def test_matmul_candidates_and_heuristics_per_platform():
    for sa, sb in [((8, 8), (8, 8)), ((3, 1000, 70), (70, 2000)), ((4096, 4096), (4096, 4096))]:
        inv = _inv(jax.ShapeDtypeStruct(sa, jnp.float32), jax.ShapeDtypeStruct(sb, jnp.float32))
        for plat in ("cpu", "gpu"):
            cands = MATMUL.hook("candidate_cfgs", plat)(inv)
            assert 1 <= len(cands) <= 8 and len(set(cands)) == len(cands)
            # tuning can always fall back to XLA's dot
            assert any(c.unblocked and c.impl in (None, "xla") for c in cands)
            assert MATMUL.hook("heuristic_cfg", plat)(inv) in cands
        assert MATMUL.candidate_cfgs_gpu(inv)[0] == MatmulCfg(impl="xla")
        for c in MATMUL.candidate_cfgs_gpu(inv)[1:]:
            assert all(x >= 16 and x & (x - 1) == 0 for x in (c.block_m, c.block_n, c.block_k))
            assert c.impl == "pallas"
    assert MATMUL.hook_name("run", "gpu") == "run_gpu"
    assert MATMUL.hook_name("vjp", "cpu") == "vjp"


def test_matmul_bfloat16_accumulates_in_float32():
    a, b = _rand((20, 300), 0, jnp.bfloat16), _rand((300, 12), 1, jnp.bfloat16)
    y = MATMUL.run(a, b, cfg=MatmulCfg(block_k=64))
    assert y.dtype == jnp.bfloat16
    want = np.asarray(a, np.float32) @ np.asarray(b, np.float32)
    _close(y.astype(jnp.float32), want, rtol=2e-2, atol=0.3)


def test_matmul_pallas_body_in_interpret_mode(monkeypatch):
    a, b = _rand((20, 40), 0), _rand((40, 24), 1)
    # 16-tiles: a 2 x 2 grid with padding on M and N, and a 3-step K loop with padding on K.
    got = mm_mod.pallas_matmul_2d(a, b, MatmulCfg(16, 16, 16), interpret=True)
    _close(got, a @ b, rtol=1e-5, atol=1e-4)
    monkeypatch.setattr(mm_mod, "INTERPRET", True)
    a3, dy = a.reshape(2, 10, 40), _rand((2, 10, 24), 2)
    cfg = MatmulCfg(16, 32, 32)
    _close(MATMUL.run_gpu(a3, b, cfg=cfg), a3 @ b, rtol=1e-5, atol=1e-4)
    da, db = MATMUL.vjp_gpu(None, None, dy, a3, b, cfg=cfg)
    want_da, want_db = jax.vjp(matmul_reference, a3, b)[1](dy)
    _close(da, want_da, rtol=1e-5, atol=1e-4)
    _close(db, want_db, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "a,b,err,words",
    [
        ((3, 4), (2, 4, 5), ShapeError, ["b must be 2-D", "float32[2,4,5]", "Fix"]),
        ((4,), (4, 5), ShapeError, ["at least 2 dims", "float32[4]", "Fix"]),
        ((3, 4), (5, 6), ShapeError, ["K=4", "K=5", "float32[3,4]", "Fix"]),
    ],
)
def test_matmul_shape_errors_are_clear(a, b, err, words):
    with pytest.raises(err) as e:
        MATMUL.run(jnp.zeros(a), jnp.zeros(b), cfg=MatmulCfg())
    msg = str(e.value)
    assert msg.startswith("nablax.kernels.library.matmul:")
    assert all(w in msg for w in words), msg


def test_matmul_dtype_and_config_errors():
    with pytest.raises(DTypeError, match=r"float32\[2,2\].*float16\[2,2\].*Fix"):
        MATMUL.run(jnp.zeros((2, 2)), jnp.zeros((2, 2), jnp.float16))
    with pytest.raises(DTypeError, match="int32"):
        MATMUL.heuristic_cfg(_inv(jnp.zeros((2, 2), int), jnp.zeros((2, 2), int)))
    with pytest.raises(TypeError, match="argument a must be an array"):
        MATMUL.prepare([[1.0]], jnp.zeros((1, 1)))
    with pytest.raises(TypeError, match="exactly two arrays"):
        MATMUL.prepare(jnp.zeros((1, 1)), jnp.zeros((1, 1)), transpose=True)
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="MatmulCfg.block_k must be a positive int"):
            MatmulCfg(block_k=bad)


# -- attention --------------------------------------------------------------------------------------
# (batch, seq_q, seq_kv, heads, head_dim, v_head_dim): equal, longer kv, shorter kv, other dv.
ATTN_SHAPES = [(2, 13, 13, 2, 8, 8), (1, 13, 21, 2, 8, 8), (1, 21, 9, 1, 4, 6)]
# Tiles smaller than the sequences (ragged both ways); whole-sequence tiles are among the
# candidates of the medium-shape test.
ATTN_CFGS = [AttentionCfg(4, 8), AttentionCfg(8, 5)]


def _qkv(b, sq, skv, h, d, dv, seed=0, dtype=jnp.float32):
    return (
        _rand((b, sq, h, d), seed, dtype),
        _rand((b, skv, h, d), seed + 1, dtype),
        _rand((b, skv, h, dv), seed + 2, dtype),
    )


@functools.partial(jax.jit, static_argnames=("cfg", "causal", "scale"))
def _attn_fwd_bwd(q, k, v, dy, cfg, causal, scale=None):
    out, res = ATTENTION.fwd_with_residuals(q, k, v, cfg=cfg, causal=causal, scale=scale)
    return out, res, ATTENTION.vjp(res, out, dy, q, k, v, cfg=cfg, causal=causal, scale=scale)


def _check_attention(q, k, v, cfg, causal, scale=None, seed=3):
    dy = _rand((*q.shape[:3], v.shape[3]), seed)
    out, (o_res, lse), grads = _attn_fwd_bwd(q, k, v, dy, cfg, causal, scale)
    ref = lambda q, k, v: attention_reference(q, k, v, causal=causal, scale=scale)
    _close(out, ref(q, k, v))
    _close(o_res, out)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * (scale or q.shape[-1] ** -0.5)
    if causal:
        s = jnp.where(jnp.tril(jnp.ones(s.shape[-2:], bool)), s, -jnp.inf)
    _close(lse, jax.nn.logsumexp(s, axis=-1))
    want = jax.vjp(ref, q, k, v)[1](dy)
    for name, g, w, x in zip("qkv", grads, want, (q, k, v)):
        assert g.shape == x.shape and g.dtype == x.dtype, name
        _close(g, w, rtol=1e-5, atol=2e-5)
    return out


@pytest.mark.parametrize("shape", ATTN_SHAPES, ids=str)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", ATTN_CFGS, ids=str)
def test_attention_forward_and_vjp_match_references(shape, causal, cfg):
    q, k, v = _qkv(*shape)
    out = _check_attention(q, k, v, cfg, causal)
    if shape[4] == shape[5]:
        _close(out, jax.nn.dot_product_attention(q, k, v, is_causal=causal))


def test_attention_every_candidate_on_a_medium_shape():
    q, k, v = _qkv(1, 70, 130, 1, 8, 8, seed=5)
    inv = _inv(q, k, v, causal=True)
    cands = ATTENTION.candidate_cfgs(inv)
    assert 4 <= len(cands) <= 8 and len(set(cands)) == len(cands)
    assert ATTENTION.heuristic_cfg(inv) in cands
    assert ATTENTION.heuristic_cfg(_inv(q, k, v)) in cands
    for cfg in cands:
        _check_attention(q, k, v, cfg, causal=True, scale=0.3)


def test_attention_bfloat16_and_default_cfg():
    q, k, v = _qkv(1, 40, 40, 2, 16, 16, dtype=jnp.bfloat16)
    out = jax.jit(lambda q, k, v: ATTENTION.run(q, k, v, causal=True))(q, k, v)  # cfg=None
    assert out.dtype == jnp.bfloat16
    want = attention_reference(*(x.astype(jnp.float32) for x in (q, k, v)), causal=True)
    _close(out.astype(jnp.float32), want, rtol=2e-2, atol=2e-2)


def _all_avals(jaxpr):
    """Every intermediate value's aval in a jaxpr, including loop, cond and map bodies."""
    for eqn in jaxpr.eqns:
        yield from (v.aval for v in eqn.outvars)
        for p in eqn.params.values():
            for sub in p if isinstance(p, (tuple, list)) else (p,):
                sub = getattr(sub, "jaxpr", sub)
                if hasattr(sub, "eqns"):
                    yield from _all_avals(sub)


@pytest.mark.parametrize("causal", [False, True])
def test_attention_never_builds_the_score_matrix(causal):
    b, sq, skv, h, d = 1, 96, 80, 2, 4
    q, k, v = _qkv(b, sq, skv, h, d, d)
    cfg = AttentionCfg(32, 16)
    out, res = jax.eval_shape(
        lambda q, k, v: ATTENTION.fwd_with_residuals(q, k, v, cfg=cfg, causal=causal), q, k, v
    )
    o_res, lse = res
    assert o_res.shape == out.shape == (b, sq, h, d)
    assert lse.shape == (b, h, sq) and lse.dtype == jnp.float32
    assert all(x.size not in (sq * skv, b * h * sq * skv) for x in jax.tree.leaves(res))
    fwd = lambda q, k, v, o, lse, dy: ATTENTION.fwd_with_residuals(q, k, v, cfg=cfg, causal=causal)
    bwd = lambda q, k, v, o, lse, dy: ATTENTION.vjp(
        (o, lse), o, dy, q, k, v, cfg=cfg, causal=causal
    )
    for fn in (fwd, bwd):
        jaxpr = jax.make_jaxpr(fn)(q, k, v, o_res, lse, out).jaxpr
        sizes = [a.size for a in _all_avals(jaxpr) if a.shape]
        assert max(sizes) < sq * skv, max(sizes)  # score tiles are at most 32 x 16 per head


def test_attention_vjp_without_residuals_recomputes():
    q, k, v = _qkv(1, 9, 7, 1, 4, 4)
    dy = _rand((1, 9, 1, 4), 9)
    cfg = AttentionCfg(4, 4)
    vjp = jax.jit(lambda dy, q, k, v: ATTENTION.vjp(None, None, dy, q, k, v, cfg=cfg, causal=True))
    got = vjp(dy, q, k, v)
    want = jax.vjp(lambda *a: attention_reference(*a, causal=True), q, k, v)[1](dy)
    for g, w in zip(got, want):
        _close(g, w)


def test_attention_pallas_forward_in_interpret_mode(monkeypatch):
    # 16-tiles over 20 queries and 35 keys: 2 q tiles, 3 kv tiles, padded seq and head_dim (8→16).
    q, k, v = _qkv(1, 20, 35, 2, 8, 8, seed=7)
    cfg = AttentionCfg(16, 16)
    for causal in (False, True):
        out, lse = attn_mod.pallas_forward(
            q, k, v, scale=0.35, causal=causal, cfg=cfg, interpret=True
        )
        want_out, want_lse = attn_mod.blocked_forward(q, k, v, scale=0.35, causal=causal, cfg=cfg)
        _close(out, want_out)
        _close(lse, want_lse)
        _close(out, jax.nn.dot_product_attention(q, k, v, is_causal=causal, scale=0.35))
    monkeypatch.setattr(attn_mod, "INTERPRET", True)
    q, k, v = _qkv(1, 8, 8, 1, 4, 4, seed=8)
    out, (o_res, lse) = ATTENTION.fwd_with_residuals_gpu(q, k, v, cfg=cfg, causal=True)
    _close(out, attention_reference(q, k, v, causal=True))
    _close(ATTENTION.run_gpu(q, k, v, cfg=cfg, causal=True), out)
    assert lse.shape == (1, 1, 8)
    # the GPU backward of the default (Pallas) implementation is the Pallas flash backward
    assert ATTENTION.hook_name("vjp", "gpu") == "vjp_gpu"
    dy = _rand((1, 8, 1, 4), 9)
    got = ATTENTION.vjp_gpu((o_res, lse), out, dy, q, k, v, cfg=cfg, causal=True)
    want = jax.vjp(lambda *a: attention_reference(*a, causal=True), q, k, v)[1](dy)
    for g, w in zip(got, want):
        _close(g, w)


def test_attention_candidates_and_heuristics_per_platform():
    for sq, skv in [(1, 1), (13, 21), (1000, 4096)]:
        q = jax.ShapeDtypeStruct((2, sq, 4, 64), jnp.float32)
        kv = jax.ShapeDtypeStruct((2, skv, 4, 64), jnp.float32)
        for causal in (False, True):
            inv = _inv(q, kv, kv, causal=causal)
            for plat in ("cpu", "gpu"):
                cands = ATTENTION.hook("candidate_cfgs", plat)(inv)
                assert 1 <= len(cands) <= 9 and len(set(cands)) == len(cands)
                assert ATTENTION.hook("heuristic_cfg", plat)(inv) in cands
                # XLA's whole-matrix implementation is a candidate on both platforms (up to a
                # score-matrix size: 2 x 4 x 1000 x 4096 is within the CPU's)
                assert any(c.impl == "xla" for c in cands)
            for c in ATTENTION.candidate_cfgs(inv):
                assert c.block_q <= sq and c.block_kv <= skv
                assert c.impl in (None, "xla")  # no interpret-mode Pallas unless switched on
            for c in ATTENTION.candidate_cfgs_gpu(inv):
                assert all(x >= 16 and x & (x - 1) == 0 for x in (c.block_q, c.block_kv))
                assert c.impl in ("pallas", "xla", "cudnn")
    big = jax.ShapeDtypeStruct((8, 4096, 4, 64), jnp.float32)
    for c in ATTENTION.candidate_cfgs(_inv(big, big, big)):  # 2^29 scores: too many for a CPU
        assert c.impl is None


@pytest.mark.parametrize(
    "shapes,words",
    [
        ([(2, 4, 8), (2, 4, 8), (2, 4, 8)], ["must be 4-D", "float32[2,4,8]", "Fix"]),
        ([(1, 4, 2, 8), (1, 4, 3, 8), (1, 4, 3, 8)], ["disagree", "k=float32[1,4,3,8]", "Fix"]),
        ([(1, 4, 2, 8), (1, 4, 2, 4), (1, 4, 2, 8)], ["head_dim", "float32[1,4,2,4]"]),
        ([(1, 4, 2, 8), (1, 5, 2, 8), (1, 6, 2, 8)], ["k and v equal (batch, seq, heads)"]),
        ([(2, 4, 2, 8), (1, 4, 2, 8), (1, 4, 2, 8)], ["q=float32[2,4,2,8]"]),
        ([(1, 0, 2, 8), (1, 4, 2, 8), (1, 4, 2, 8)], ["at least 1"]),
    ],
)
def test_attention_shape_errors_are_clear(shapes, words):
    args = [jnp.zeros(s) for s in shapes]
    with pytest.raises(ShapeError) as e:
        ATTENTION.run(*args, cfg=AttentionCfg())
    msg = str(e.value)
    assert msg.startswith("nablax.kernels.library.attention:")
    assert all(w in msg for w in words), msg


def test_attention_dtype_option_and_config_errors():
    x = jnp.zeros((1, 4, 1, 8))
    with pytest.raises(DTypeError, match=r"float16\[1,4,1,8\].*Fix"):
        ATTENTION.run(x, x.astype(jnp.float16), x)
    with pytest.raises(DTypeError, match="int32"):
        ATTENTION.candidate_cfgs(_inv(*(jnp.zeros((1, 4, 1, 8), int),) * 3))
    with pytest.raises(TypeError, match="unknown keywords \\['window'\\]"):
        ATTENTION.prepare(x, x, x, window=None)
    _, kw = ATTENTION.prepare(x, x, x, scale=np.float32(0.5), causal=np.bool_(True))
    assert type(kw["scale"]) is float and kw["causal"] is True
    with pytest.raises(TypeError, match="scale must be a Python number"):
        jax.jit(lambda s: ATTENTION.run(x, x, x, scale=s))(0.5)
    with pytest.raises(ValueError, match="AttentionCfg.block_kv must be a positive int"):
        AttentionCfg(block_q=8, block_kv=0)


# -- public wrappers --------------------------------------------------------------------------------
def test_wrappers_check_shapes_before_choosing_a_config():
    from nablax.kernels.library import attention, matmul

    with pytest.raises(ShapeError, match="library.matmul: contraction dims differ"):
        matmul(jnp.zeros((2, 3)), jnp.zeros((4, 5)))
    with pytest.raises(ShapeError, match="library.attention: q, k, v must be 4-D"):
        attention(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros((2, 3)))


def test_public_wrappers_through_the_executor():
    pytest.importorskip("nablax.kernels.executor", reason="nablax.kernels.executor not written yet")
    from nablax.kernels.library import attention, matmul

    a, b = _rand((2, 5, 7), 0), _rand((7, 3), 1)
    y = matmul(a, b, cfg=MatmulCfg(block_k=4))
    assert isinstance(y, jax.Array) and y.shape == (2, 5, 3)
    _close(y, a @ b, rtol=1e-5, atol=1e-4)
    q, k, v = _qkv(1, 6, 9, 2, 4, 4)
    out = attention(q, k, v, causal=True, scale=0.4, cfg=AttentionCfg(4, 4))
    _close(out, attention_reference(q, k, v, causal=True, scale=0.4))

"""The attention kernel's extra options (``nablax.kernels.library.attention_ext``): boolean masks,
additive bias (and its gradient), dropout, grouped-query heads and PyTorch's ``"bhsd"`` layout,
against ``jax.nn.dot_product_attention``, ``torch.nn.functional.scaled_dot_product_attention`` and
plain JAX references, over ragged tile configs; one graph node on nablax Tensors."""

from __future__ import annotations

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.errors import DTypeError, ShapeError
from nablax.kernels.library import ATTENTION, AttentionCfg, attention

ext = importlib.import_module("nablax.kernels.library.attention_ext")
torch = pytest.importorskip("torch")

TOL = dict(rtol=2e-5, atol=2e-5)
CFGS = [AttentionCfg(3, 4), AttentionCfg(8, 2), AttentionCfg(128, 128)]


@pytest.fixture(autouse=True)
def _no_autotune():
    """Heuristic configs: these tests check values, not timings."""
    from nablax.kernels import default_executor, policy_override

    with policy_override(default_executor().chooser, allow_autotune=False):
        yield


def _rand(shape, seed, dtype=jnp.float32):
    return jnp.asarray(np.random.default_rng(seed).standard_normal(shape), dtype)


def _close(got, want, **tol):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **(tol or TOL))


def _tril(sq, skv):
    return jnp.tril(jnp.ones((sq, skv), bool))


def _reference(q, k, v, *, mask=None, bias=None, causal=False, scale=None, keep=None):
    """softmax(q k^T * scale + bias) masked, dropout ``keep`` (B,H,Sq,Skv), all in bshd; full
    score matrix; masked rows give 0 (PyTorch's result)."""
    h = q.shape[2]
    k, v = jnp.repeat(k, h // k.shape[2], 2), jnp.repeat(v, h // v.shape[2], 2)
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * scale
    if bias is not None:
        s = s + bias
    allowed = jnp.ones(s.shape, bool)
    if mask is not None:
        allowed = allowed & mask
    if causal:
        allowed = allowed & _tril(*s.shape[-2:])
    s = jnp.where(allowed, s, -jnp.inf)
    m = jnp.max(s, -1, keepdims=True)
    e = jnp.where(allowed, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    den = e.sum(-1, keepdims=True)
    p = e / jnp.where(den == 0, 1.0, den)
    if keep is not None:
        p = p * keep
    return jnp.einsum("bhqk,bkhd->bqhd", p, v)


def _grads(f, *args):
    return jax.grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=tuple(range(len(args))))(*args)


# -- masks, bias, grouped heads against jax.nn.dot_product_attention ------------------------------
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize(
    "cfg,bias_shape",
    [(CFGS[0], (7, 9)), (CFGS[1], (2, 1, 7, 9)), (CFGS[2], (1, 4, 1, 9)), (CFGS[0], (2, 4, 7, 1))],
    ids=str,
)
def test_mask_bias_gqa_match_jax(cfg, causal, bias_shape):
    q, k, v = _rand((2, 7, 4, 8), 0), _rand((2, 9, 2, 8), 1), _rand((2, 9, 2, 8), 2)
    bias = _rand(bias_shape, 3)
    # every row keeps key 0, so no row is fully masked (JAX and PyTorch differ there)
    mask = jnp.asarray(np.random.default_rng(4).random((7, 9)) > 0.4).at[:, 0].set(True)

    def ours(q, k, v, b):
        return attention(q, k, v, mask=mask, bias=b, causal=causal, cfg=cfg)

    def theirs(q, k, v, b):
        m = mask & _tril(7, 9) if causal else mask
        k, v = jnp.repeat(k, 2, 2), jnp.repeat(v, 2, 2)
        return jax.nn.dot_product_attention(q, k, v, bias=jnp.broadcast_to(b, (2, 4, 7, 9)), mask=m)

    _close(ours(q, k, v, bias), theirs(q, k, v, bias))
    for g, r in zip(_grads(ours, q, k, v, bias), _grads(theirs, q, k, v, bias)):
        assert g.shape == r.shape
        _close(g, r, rtol=1e-4, atol=1e-4)


def test_grouped_heads_alone_and_differing_value_dim():
    q, k, v = _rand((1, 6, 6, 8), 0), _rand((1, 5, 3, 8), 1), _rand((1, 5, 3, 4), 2)
    got = attention(q, k, v, causal=True, cfg=AttentionCfg(4, 2))
    _close(got, _reference(q, k, v, causal=True))
    want = _grads(lambda q, k, v: _reference(q, k, v, causal=True), q, k, v)
    got_g = _grads(lambda q, k, v: attention(q, k, v, causal=True, cfg=AttentionCfg(4, 2)), q, k, v)
    for g, r in zip(got_g, want):
        _close(g, r, rtol=1e-4, atol=1e-4)


# -- PyTorch's layout against torch's scaled_dot_product_attention -------------------------------
TORCH_CASES = [
    # q, k, v, mask shape or None, mask kind, enable_gqa
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 3), (5, 7), "bool", False),
    ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), (2, 1, 5, 7), "float", True),
    ((5, 8), (7, 8), (7, 6), None, None, False),
    ((3, 5, 8), (3, 7, 8), (3, 7, 8), (7,), "float", False),
    ((2, 3, 2, 5, 8), (2, 7, 8), (2, 7, 8), (3, 1, 5, 7), "bool", False),
    ((2, 1, 5, 8), (1, 2, 7, 8), (1, 2, 7, 8), None, None, False),
]


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: f"{c[0]}x{c[1]}-{c[4]}")
def test_bhsd_layout_matches_torch(case, causal):
    qs, ks, vs, ms, kind, gqa = case
    q, k, v = _rand(qs, 0), _rand(ks, 1), _rand(vs, 2)
    mask = bias = tmask = None
    if kind == "bool":
        raw = np.random.default_rng(3).random(ms) > 0.3
        raw[..., 0] = True
        mask, tmask = jnp.asarray(raw), torch.tensor(raw)
    elif kind == "float":
        raw = np.random.default_rng(3).standard_normal(ms).astype(np.float32)
        bias, tmask = jnp.asarray(raw), torch.tensor(raw, requires_grad=True)
    tq, tk, tv = (torch.tensor(np.asarray(x), requires_grad=True) for x in (q, k, v))
    tri = torch.ones(qs[-2], ks[-2], dtype=torch.bool).tril()
    if causal and kind == "bool":  # torch refuses attn_mask with is_causal when differentiating:
        tmask, tcausal = tmask & tri, False  # the kernel combines them (torch's no-grad result)
    elif causal and kind == "float":
        tcausal = False
    else:
        tcausal = causal
    tm = tmask
    if causal and kind == "float":
        tm = tmask.masked_fill(~tri, float("-inf"))
    want = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=tm, is_causal=tcausal, enable_gqa=gqa
    )
    torch.sin(want).sum().backward()

    def ours(q, k, v, b):
        return attention(
            q, k, v, mask=mask, bias=b, causal=causal, layout="bhsd", cfg=AttentionCfg(2, 4)
        )

    got = ours(q, k, v, bias)
    assert got.shape == tuple(want.shape)
    _close(got, want.detach().numpy())
    grads = _grads(ours, q, k, v, bias) if bias is not None else _grads(ours, q, k, v, None)[:3]
    for g, t in zip(grads, (tq, tk, tv, tmask)):
        _close(g, t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_fully_masked_rows_give_zero_like_torch():
    q, k, v = _rand((1, 2, 4, 8), 0), _rand((1, 2, 6, 8), 1), _rand((1, 2, 6, 8), 2)
    raw = np.random.default_rng(3).random((4, 6)) > 0.5
    raw[1] = False
    bias = np.where(raw, 0.0, -np.inf).astype(np.float32)
    want = torch.nn.functional.scaled_dot_product_attention(
        *(torch.tensor(np.asarray(x)) for x in (q, k, v)), attn_mask=torch.tensor(raw)
    ).numpy()
    for kw in (dict(mask=jnp.asarray(raw)), dict(bias=jnp.asarray(bias))):

        def f(q, kw=kw):
            return attention(q, k, v, layout="bhsd", cfg=AttentionCfg(2, 4), **kw)

        _close(f(q), want)
        assert np.all(np.asarray(f(q))[:, :, 1] == 0)
        g = jax.grad(lambda q, f=f: f(q).sum())(q)
        assert np.isfinite(np.asarray(g)).all() and np.all(np.asarray(g)[:, :, 1] == 0)


# -- dropout -------------------------------------------------------------------------------------
def test_dropout_matches_reference_and_is_tile_independent():
    q, k, v = _rand((2, 9, 2, 8), 0), _rand((2, 11, 2, 8), 1), _rand((2, 11, 2, 8), 2)
    key = jax.random.key_data(jax.random.key(7))
    keep = ext.dropout_keep(key, 0.3, (2, 2, 9, 11))
    mask = jnp.asarray(np.random.default_rng(3).random((9, 11)) > 0.2)

    def ref(q, k, v):
        return _reference(q, k, v, mask=mask, causal=True, keep=keep)

    want = ref(q, k, v)
    want_g = _grads(ref, q, k, v)
    for cfg in CFGS:

        def ours(q, k, v, cfg=cfg):
            return attention(
                q, k, v, mask=mask, causal=True, dropout_rate=0.3, dropout_key=key, cfg=cfg
            )

        _close(ours(q, k, v), want)
        for g, r in zip(_grads(ours, q, k, v), want_g):
            _close(g, r, rtol=1e-4, atol=1e-4)
    # a typed key works too; another key drops other entries
    typed = attention(q, k, v, mask=mask, causal=True, dropout_rate=0.3,
                      dropout_key=jax.random.key(7))  # fmt: skip
    _close(typed, want)
    other = attention(q, k, v, mask=mask, causal=True, dropout_rate=0.3,
                      dropout_key=jax.random.key(8))  # fmt: skip
    assert not np.allclose(np.asarray(other), np.asarray(want))


def test_dropout_rate_is_respected_and_no_key_means_no_dropout():
    key = jax.random.key_data(jax.random.key(0))
    z = np.asarray(ext.dropout_keep(key, 0.4, (2, 3, 64, 96)))
    assert abs((z == 0).mean() - 0.4) < 0.02
    np.testing.assert_allclose(z[z != 0], 1 / 0.6, rtol=1e-6)
    q = _rand((1, 5, 2, 4), 0)
    plain = attention(q, q, q)
    _close(attention(q, q, q, dropout_rate=0.5), plain)  # no key: no dropout (as nn.Dropout)
    _close(attention(q, q, q, dropout_rate=0.0, dropout_key=key), plain)
    assert np.all(np.asarray(attention(q, q, q, dropout_rate=1.0, dropout_key=key)) == 0)


# -- nablax Tensors: one node, gradients through the kernel's vjp --------------------------------
def test_tensor_call_with_mask_bias_dropout_is_one_node():
    from nablax.core.graph import toposort

    q, k, v = _rand((2, 4, 5, 8), 0), _rand((2, 2, 7, 8), 1), _rand((2, 2, 7, 8), 2)
    bias, mask = _rand((5, 7), 3), jnp.asarray(np.random.default_rng(4).random((5, 7)) > 0.3)
    key = nx.random.key(3)
    tq, tk, tv, tb, tm = (nx.asarray(x) for x in (q, k, v, bias, mask))
    kw = dict(causal=True, layout="bhsd", dropout_rate=0.25, cfg=AttentionCfg(2, 4))
    y = attention(tq, tk, tv, mask=tm, bias=tb, dropout_key=key, **kw)
    assert isinstance(y, nx.Tensor) and not y.is_realized
    names = [n.prim.name for n in toposort([y._impl.src[0]])]
    assert names.count("kernel_call") == 1, names
    jkey = jnp.asarray(key.numpy())
    want = attention(q, k, v, mask=mask, bias=bias, dropout_key=jkey, **kw)
    _close(y.numpy(), want)

    def loss(q, k, v, b):
        return nx.sin(attention(q, k, v, mask=tm, bias=b, dropout_key=key, **kw)).sum()

    got = nx.grad(loss, argnums=(0, 1, 2, 3))(tq, tk, tv, tb)
    ref = jax.grad(
        lambda q, k, v, b: jnp.sin(
            attention(q, k, v, mask=mask, bias=b, dropout_key=jkey, **kw)
        ).sum(),
        argnums=(0, 1, 2, 3),
    )(q, k, v, bias)
    for g, r in zip(got, ref):
        _close(g.numpy(), r, rtol=1e-4, atol=1e-4)


# -- plain calls unchanged, errors ---------------------------------------------------------------
def test_default_options_are_dropped_so_plain_call_keys_stay():
    x = jnp.zeros((1, 4, 1, 8))
    _, kw = ATTENTION.prepare(
        x, x, x, causal=True, mask=None, bias=None, dropout_rate=0.5, layout="bshd"
    )
    assert kw == {"causal": True}


@pytest.mark.parametrize(
    "kw,err,words",
    [
        (dict(mask=jnp.ones((4, 4), jnp.int32)), DTypeError, ["mask must be boolean", "bias="]),
        (dict(bias=jnp.ones((4, 4), jnp.int32)), DTypeError, ["bias must be floating"]),
        (dict(mask=jnp.ones((3, 4), bool)), ShapeError, ["mask must broadcast", "Fix"]),
        (dict(bias=jnp.ones((2, 1, 4, 4))), ShapeError, ["bias must broadcast"]),
        (dict(layout="nhwc"), ValueError, ["layout must be one of"]),
        (dict(dropout_rate=1.5, dropout_key=jnp.zeros(2, jnp.uint32)), ValueError, ["[0, 1]"]),
        (dict(dropout_rate=0.5, dropout_key=jnp.zeros(2)), DTypeError, ["dropout_key"]),
    ],
)
def test_option_errors_are_clear(kw, err, words):
    x = jnp.zeros((1, 4, 2, 8))
    with pytest.raises(err) as e:
        attention(x, x, x, **kw)
    assert str(e.value).startswith("nablax.kernels.library.attention:")
    assert all(w in str(e.value) for w in words), str(e.value)


def test_dtype_errors_still_raise_after_a_good_call_was_remembered():
    """check_options remembers the dtype combinations that passed (attention runs every layer,
    every step): a bad combination must still raise every time, also when the shapes and the
    q/k/v dtypes are the ones of a call that passed."""
    x = jnp.zeros((1, 4, 2, 8))
    good = jnp.ones((4, 4), bool)
    for _ in range(2):
        assert attention(x, x, x, mask=good).shape == x.shape
        with pytest.raises(DTypeError, match="mask must be boolean"):
            attention(x, x, x, mask=good.astype(jnp.int32))
        with pytest.raises(DTypeError, match="share one floating dtype"):
            attention(x, x.astype(jnp.bfloat16), x, mask=good)
        with pytest.raises(DTypeError, match="share one floating dtype"):
            attention(x.astype(jnp.int32), x.astype(jnp.int32), x.astype(jnp.int32), mask=good)
        with pytest.raises(DTypeError, match="bias must be floating"):
            attention(x, x, x, bias=good)


def test_shape_errors_still_raise_after_a_good_call_was_remembered():
    """check_options remembers calls without dropout that passed, by layout, shapes and dtypes:
    a mask, bias or layout that fails must raise every time, before and after a good call with
    the same q/k/v; a call with dropout is checked in full every time."""
    from nablax.kernels.library import attention_ext as ext_mod

    x = jnp.zeros((1, 4, 2, 8))
    good = jnp.ones((4, 4), bool)
    key = jnp.array([1, 2], jnp.uint32)
    for _ in range(2):
        assert attention(x, x, x, mask=good).shape == x.shape
        with pytest.raises(ShapeError):
            attention(x, x, x, mask=jnp.ones((4, 3), bool))
        with pytest.raises(ShapeError):
            attention(x, x, x, bias=jnp.zeros((5, 4)))
        with pytest.raises(ValueError, match="layout must be one of"):
            attention(x, x, x, mask=good, layout="bsdh")
        with pytest.raises(ValueError, match="not in \\[0, 1\\]"):
            attention(x, x, x, dropout_rate=1.5, dropout_key=key)
        # the memo's answer is the full check's
        ext = {"mask": good, "layout": "bhsd"}
        q4 = jnp.zeros((1, 2, 4, 8))
        assert (
            ext_mod.check_options(q4, q4, q4, ext)[1:]
            == ext_mod._check_options(q4, q4, q4, ext)[1:]
        )
        assert ext_mod.check_options(q4, q4, q4, ext)[0] == ext


def test_grouped_heads_must_divide():
    q, kv = jnp.zeros((1, 4, 4, 8)), jnp.zeros((1, 4, 3, 8))
    with pytest.raises(ShapeError, match="disagree"):
        attention(q, kv, kv)
    with pytest.raises(ShapeError, match="does not divide the 4 query heads"):
        attention(q, kv, kv, layout="bshd", mask=jnp.ones((4, 4), bool))

"""``nn.functional.scaled_dot_product_attention`` and ``nn.MultiheadAttention`` against PyTorch's
(values and gradients, weights copied over), ``jax.nn.dot_product_attention``, under ``nx.grad``,
``nx.vmap``, ``nx.compile`` and ``nx.autocast``; the SDPA call is one graph node."""

from __future__ import annotations

import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn
from nablax.errors import DTypeError, ShapeError

torch = pytest.importorskip("torch")
ext = importlib.import_module("nablax.kernels.library.attention_ext")
TF = torch.nn.functional
TOL = dict(rtol=2e-5, atol=2e-5)
GTOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(autouse=True)
def _no_autotune():
    """Heuristic kernel configs: these tests check values, not timings."""
    from nablax.kernels import default_executor, policy_override

    with policy_override(default_executor().chooser, allow_autotune=False):
        yield


def _np(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(got, want, **tol):
    got = got.numpy() if isinstance(got, nx.Tensor) else np.asarray(got)
    want = want.detach().numpy() if isinstance(want, torch.Tensor) else np.asarray(want)
    np.testing.assert_allclose(got, want, **(tol or TOL))


# -- scaled_dot_product_attention against torch ---------------------------------------------------
SDPA_CASES = {
    "plain": ((2, 3, 5, 8), (2, 3, 5, 8), (2, 3, 5, 8), None, {}),
    "bool-mask": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), ("bool", (5, 7)), {}),
    "float-mask": ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 8), ("float", (2, 1, 5, 7)), {}),
    "causal-L<S": ((2, 2, 4, 8), (2, 2, 7, 8), (2, 2, 7, 8), None, dict(is_causal=True)),
    "causal-L>S": ((1, 2, 7, 8), (1, 2, 4, 8), (1, 2, 4, 8), None, dict(is_causal=True)),
    "gqa": (
        (2, 6, 5, 8),
        (2, 2, 5, 8),
        (2, 2, 5, 8),
        ("bool", (5, 5)),
        dict(enable_gqa=True, is_causal=False),
    ),  # fmt: skip
    "scale": ((2, 2, 5, 8), (2, 2, 6, 8), (2, 2, 6, 8), None, dict(scale=0.3)),
    "2d": ((5, 8), (6, 8), (6, 3), ("float", (5, 6)), {}),
    "3d": ((4, 5, 8), (4, 6, 8), (4, 6, 8), ("bool", (6,)), {}),
    "broadcast": ((2, 3, 2, 5, 8), (2, 6, 8), (2, 6, 8), None, dict(is_causal=True)),
}


def _torch_sdpa(q, k, v, mask, kw):
    tq, tk, tv = (torch.tensor(x, requires_grad=True) for x in (q, k, v))
    tm = None
    if mask is not None:
        tm = torch.tensor(mask, requires_grad=mask.dtype != np.bool_)
    out = TF.scaled_dot_product_attention(tq, tk, tv, attn_mask=tm, **kw)
    torch.sin(out).sum().backward()
    grads = [t.grad for t in (tq, tk, tv)] + (
        [tm.grad] if tm is not None and tm.requires_grad else []
    )
    return out, grads


def _mask(spec, seed=9):
    if spec is None:
        return None
    kind, shape = spec
    if kind == "bool":
        m = np.random.default_rng(seed).random(shape) > 0.3
        m[..., 0] = True
        return m
    return _np(shape, seed)


@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_sdpa_matches_torch_values_and_grads(name):
    qs, ks, vs, mspec, kw = SDPA_CASES[name]
    q, k, v, m = _np(qs, 0), _np(ks, 1), _np(vs, 2), _mask(mspec)
    want, want_g = _torch_sdpa(q, k, v, m, kw)
    tm = None if m is None else nx.asarray(m)
    got = F.scaled_dot_product_attention(nx.asarray(q), nx.asarray(k), nx.asarray(v), tm, **kw)
    assert got.shape == tuple(want.shape)
    _close(got, want)

    def loss(q, k, v, m):
        return nx.sin(F.scaled_dot_product_attention(q, k, v, m, **kw)).sum()

    diff_mask = m is not None and m.dtype != np.bool_
    argnums = (0, 1, 2, 3) if diff_mask else (0, 1, 2)
    grads = nx.grad(loss, argnums=argnums)(nx.asarray(q), nx.asarray(k), nx.asarray(v), tm)
    for g, w in zip(grads, want_g):
        _close(g, w, **GTOL)


def test_sdpa_matches_jax_dot_product_attention():
    # jax: (B, T, N, H) layout; nablax/torch: (B, N, T, H)
    q, k, v = _np((2, 6, 4, 8), 0), _np((2, 9, 2, 8), 1), _np((2, 9, 2, 8), 2)
    bias = _np((2, 4, 6, 9), 3)

    def theirs(q, k, v, b):
        return jax.nn.dot_product_attention(q, k, v, bias=b, is_causal=True, scale=0.2)

    def ours(q, k, v, b):
        qt, kt, vt = (x.swapaxes(1, 2) for x in (q, k, v))
        y = F.scaled_dot_product_attention(
            qt, kt, vt, b, is_causal=True, scale=0.2, enable_gqa=True
        )
        return y.swapaxes(1, 2)

    args = [jnp.asarray(x) for x in (q, k, v, bias)]
    _close(ours(*(nx.asarray(x) for x in args)), theirs(*args))
    want = jax.grad(lambda *a: jnp.sum(jnp.sin(theirs(*a))), argnums=(0, 1, 2, 3))(*args)
    got = nx.grad(lambda *a: nx.sin(ours(*a)).sum(), argnums=(0, 1, 2, 3))(
        *(nx.asarray(x) for x in args)
    )
    for g, w in zip(got, want):
        _close(g, w, **GTOL)


def test_sdpa_repeated_plain_calls_take_the_known_call_path_and_stay_exact():
    """A transformer calls sdpa with the same shapes in every block and step: from the second
    call on, the executor's call_known memo builds the node; values and gradients equal JAX's
    every time, with and without differentiation, for each option set."""
    from nablax.kernels import default_executor

    q, k, v = (jnp.asarray(_np((2, 3, 5, 8), i)) for i in range(3))
    known = default_executor()._known
    hits = known.hits
    for kw in ({"is_causal": True}, {"scale": 0.3}, {}):

        def theirs(q, k, v, kw=kw):
            qt, kt, vt = (x.swapaxes(1, 2) for x in (q, k, v))
            y = jax.nn.dot_product_attention(
                qt, kt, vt, is_causal=kw.get("is_causal", False), scale=kw.get("scale")
            )
            return y.swapaxes(1, 2)

        def ours(q, k, v, kw=kw):
            return F.scaled_dot_product_attention(q, k, v, **kw)

        want = theirs(q, k, v)
        want_g = jax.grad(lambda *a: jnp.sum(jnp.sin(theirs(*a))), argnums=(0, 1, 2))(q, k, v)
        for _ in range(3):
            _close(ours(*(nx.asarray(x) for x in (q, k, v))), want)
            got = nx.grad(lambda *a: nx.sin(ours(*a)).sum(), argnums=(0, 1, 2))(
                *(nx.asarray(x) for x in (q, k, v))
            )
            for g, w in zip(got, want_g):
                _close(g, w, **GTOL)
    assert known.hits >= hits + 6


# -- one node, vmap, compile ----------------------------------------------------------------------
def test_sdpa_is_one_graph_node():
    from nablax.core.graph import toposort

    q, k, v = (
        nx.asarray(_np(s, i)) for i, s in enumerate([(2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8)])
    )
    mask = nx.asarray(_mask(("bool", (5, 7))))
    bias = nx.asarray(_np((5, 7), 4))
    for m in (None, mask, bias):
        y = F.scaled_dot_product_attention(
            q, k, v, m, is_causal=True, enable_gqa=True, dropout_p=0.1, dropout_key=nx.random.key(0)
        )
        nodes = toposort([y._impl.src[0]])
        assert [n.prim.name for n in nodes] == ["kernel_call"], [n.prim.name for n in nodes]


def test_sdpa_under_vmap_and_compile():
    q, k, v = _np((3, 2, 5, 8), 0), _np((3, 2, 6, 8), 1), _np((3, 2, 6, 8), 2)
    masks = np.random.default_rng(3).random((3, 5, 6)) > 0.3
    masks[..., 0] = True
    tq, tk, tv, tm = (nx.asarray(x) for x in (q, k, v, masks))
    batched = F.scaled_dot_product_attention(tq, tk, tv, tm[:, None])
    mapped = nx.vmap(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m))(tq, tk, tv, tm)
    _close(mapped, batched.numpy())
    want, want_g = _torch_sdpa(q, k, v, masks[:, None], {})
    _close(mapped, want)

    def loss(q, k, v):
        y = nx.vmap(lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, m))(q, k, v, tm)
        return nx.sin(y).sum()

    step = nx.compile(nx.grad(loss, argnums=(0, 1, 2)))
    for _ in range(2):  # trace, then replay
        for g, w in zip(step(tq, tk, tv), want_g):
            _close(g, w, **GTOL)
    fwd = nx.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    want_c, _ = _torch_sdpa(q, k, v, None, dict(is_causal=True))
    _close(fwd(tq, tk, tv), want_c)


# -- dropout, autocast, errors -------------------------------------------------------------------
def test_sdpa_dropout_needs_a_key_and_matches_the_kernel_reference():
    q, k, v = (nx.asarray(_np((1, 2, 6, 8), i)) for i in range(3))
    plain = F.scaled_dot_product_attention(q, k, v)
    _close(F.scaled_dot_product_attention(q, k, v, dropout_p=0.5), plain.numpy())  # no key
    key = nx.random.key(5)
    got = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5, dropout_key=key)
    keep = np.asarray(ext.dropout_keep(jnp.asarray(key.numpy()), 0.5, (1, 2, 6, 6)))
    s = np.einsum("bhqd,bhkd->bhqk", q.numpy(), k.numpy()) / math.sqrt(8)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = p / p.sum(-1, keepdims=True)
    _close(got, np.einsum("bhqk,bhkd->bhqd", p * keep, v.numpy()), rtol=1e-5, atol=1e-5)
    assert not np.allclose(got.numpy(), plain.numpy())


def test_sdpa_under_autocast_computes_in_the_autocast_dtype():
    q, k, v = (nx.asarray(_np((2, 2, 5, 8), i)) for i in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    with nx.autocast(nx.bfloat16):
        got = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert got.dtype == nx.bfloat16 and want.dtype == nx.float32
    _close(got.astype(nx.float32), want.numpy(), rtol=3e-2, atol=3e-2)  # bfloat16 resolution
    g = nx.grad(lambda q: nx.autocast(nx.bfloat16)(
        lambda: F.scaled_dot_product_attention(q, k, v).astype(nx.float32).sum())())(q)  # fmt: skip
    assert g.dtype == nx.float32


@pytest.mark.parametrize(
    "shapes,kw,err,words",
    [
        ([(1, 4, 5, 8), (1, 3, 5, 8), (1, 3, 5, 8)], dict(enable_gqa=True), ShapeError, ["divide"]),
        ([(1, 4, 5, 8), (1, 2, 5, 8), (1, 2, 5, 8)], {}, ShapeError, ["enable_gqa=True"]),
        ([(1, 2, 5, 8)] * 3, dict(attn_mask=np.ones((5, 5), np.int32)), DTypeError, ["attn_mask"]),
        ([(1, 2, 5, 8)] * 3, dict(dropout_p=1.5), ValueError, ["dropout_p"]),
        ([(8,)] * 3, {}, ShapeError, ["at least 2 dims"]),
    ],
)
def test_sdpa_errors_are_clear(shapes, kw, err, words):
    args = [nx.asarray(_np(s, i)) for i, s in enumerate(shapes)]
    with pytest.raises(err) as e:
        F.scaled_dot_product_attention(*args, **kw)
    msg = str(e.value)
    assert "scaled_dot_product_attention" in msg and all(w in msg for w in words), msg


def test_sdpa_checks_hold_after_a_plain_call_was_remembered():
    """A plain call's shapes and dtypes are remembered as checked (the training step's fast path):
    every argument the memo does not cover is still checked, and the results do not change."""
    from nablax.nn import _sdpa

    q, k, v = (nx.asarray(_np((2, 2, 5, 8), i)) for i in range(3))
    _sdpa._PLAIN_OK.clear()
    first = F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy()
    assert _sdpa._PLAIN_OK.data.get(((2, 2, 5, 8),) * 3 + (q.dtype,) * 3)
    again = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, dropout_p=0)
    ref = jax.nn.dot_product_attention(*(jnp.swapaxes(t.numpy(), 1, 2) for t in (q, k, v)),
                                       is_causal=True, scale=0.3)  # fmt: skip
    _close(again, np.swapaxes(np.asarray(ref), 1, 2), **TOL)
    _close(F.scaled_dot_product_attention(q, k, v, is_causal=True), first, rtol=0, atol=0)
    for kw, err, words in [
        (dict(dropout_p=1.5), ValueError, ["dropout_p=1.5"]),
        (dict(dropout_p=float("nan")), ValueError, ["dropout_p"]),
        (dict(dropout_p="a"), TypeError, ["dropout_p must be a number, got 'a'"]),
        (dict(dropout_p=None), TypeError, ["dropout_p must be a number"]),
        (dict(scale=nx.asarray(0.5)), TypeError, ["scale must be a Python number"]),
        (dict(attn_mask=np.ones((5, 5), np.int32)), DTypeError, ["attn_mask"]),
    ]:
        with pytest.raises(err) as e:
            F.scaled_dot_product_attention(q, k, v, **kw)
        assert all(w in str(e.value) for w in words), str(e.value)
    with pytest.raises(ShapeError, match="at least 2 dims"):  # another shape: checked in full
        F.scaled_dot_product_attention(*(nx.asarray(_np((8,), i)) for i in range(3)))
    with nx.autocast(nx.bfloat16):  # autocast is read every call
        assert F.scaled_dot_product_attention(q, k, v).dtype == nx.bfloat16


# -- MultiheadAttention ---------------------------------------------------------------------------
def _pair(e=8, h=2, bias=True, batch_first=False, seed=0):
    """A torch module with random biases and the nablax module holding its exact weights."""
    torch.manual_seed(seed)
    tm = torch.nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first)
    if bias:
        with torch.no_grad():
            tm.in_proj_bias.copy_(torch.tensor(_np((3 * e,), seed + 1)))
            tm.out_proj.bias.copy_(torch.tensor(_np((e,), seed + 2)))
    m = nn.MultiheadAttention(e, h, bias=bias, batch_first=batch_first, key=nx.random.key(seed))
    w = {k: nx.asarray(p.detach().numpy()) for k, p in tm.named_parameters()}
    m = m.replace(
        in_proj_weight=w["in_proj_weight"],
        in_proj_bias=w.get("in_proj_bias"),
        out_proj=m.out_proj.replace(weight=w["out_proj.weight"], bias=w.get("out_proj.bias")),
    )
    return tm, m


def test_mha_fields_and_torch_initialisation():
    e = 64
    m = nn.MultiheadAttention(e, 4, key=nx.random.key(0))
    assert m.in_proj_weight.shape == (3 * e, e) and m.in_proj_bias.shape == (3 * e,)
    assert isinstance(m.out_proj, nn.Linear) and m.out_proj.weight.shape == (e, e)
    w = m.in_proj_weight.numpy()
    bound = math.sqrt(6 / (4 * e))  # xavier_uniform_ of (3E, E)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.95 * bound
    np.testing.assert_allclose(w.std(), bound / math.sqrt(3), rtol=0.05)
    assert not m.in_proj_bias.numpy().any() and not m.out_proj.bias.numpy().any()
    ow = m.out_proj.weight.numpy()
    assert np.abs(ow).max() <= 1 / math.sqrt(e) and np.abs(ow).max() > 0.95 / math.sqrt(e)
    tm = torch.nn.MultiheadAttention(e, 4)  # the same distributions in torch
    assert tm.in_proj_weight.abs().max().item() <= bound and not tm.out_proj.bias.any()
    nb = nn.MultiheadAttention(e, 4, bias=False, key=nx.random.key(0), dtype=nx.bfloat16)
    assert nb.in_proj_bias is None and nb.out_proj.bias is None
    assert nb.in_proj_weight.dtype == nx.bfloat16
    with pytest.raises(ValueError, match="not divisible"):
        nn.MultiheadAttention(10, 3)


MHA_CASES = {
    "self-weights": dict(self_attn=True),
    "cross-kpm-bool": dict(kpm="bool", attn="bool"),
    "cross-float-masks": dict(kpm="float", attn="float", need_weights=False),
    "mixed-masks-per-head": dict(kpm="bool", attn="float3d", average_attn_weights=False),
    "causal-hint": dict(self_attn=True, attn="causal", is_causal=True, need_weights=False),
    "batch-first": dict(batch_first=True, kpm="bool", need_weights=False),
    "unbatched": dict(unbatched=True, attn="bool"),
    "no-bias": dict(bias=False, attn="bool", need_weights=False),
}


@pytest.mark.parametrize("name", list(MHA_CASES))
def test_mha_matches_torch_values_and_grads(name):
    c = dict(MHA_CASES[name])
    e, h, lq, s, n = 8, 2, 5, 7, 3
    if c.get("self_attn"):
        s = lq
    tm, m = _pair(e, h, bias=c.get("bias", True), batch_first=c.get("batch_first", False))
    unb = c.get("unbatched", False)
    shape = lambda length: (
        (length, e) if unb else ((n, length, e) if c.get("batch_first") else (length, n, e))
    )  # noqa: E731
    x = _np(shape(lq), 10)
    y = x if c.get("self_attn") else _np(shape(s), 11)
    kw, tkw = {}, {}
    rng = np.random.default_rng(12)
    if c.get("kpm"):
        kpm = rng.random((s,) if unb else (n, s)) > 0.7
        kpm[..., 0] = False
        kpm = kpm if c["kpm"] == "bool" else np.where(kpm, -2.0, 0.5).astype(np.float32)
        kw["key_padding_mask"], tkw["key_padding_mask"] = nx.asarray(kpm), torch.tensor(kpm)
    if c.get("attn"):
        a = c["attn"]
        if a == "bool":
            am = rng.random((lq, s)) > 0.7
            am[:, 0] = False
        elif a == "causal":
            am = np.triu(np.ones((lq, s), bool), 1)
        elif a == "float":
            am = _np((lq, s), 13)
        else:
            am = _np((n * h, lq, s), 13)
        kw["attn_mask"], tkw["attn_mask"] = nx.asarray(am), torch.tensor(am)
    for k_ in ("need_weights", "average_attn_weights", "is_causal"):
        if k_ in c:
            kw[k_] = tkw[k_] = c[k_]
    tx = torch.tensor(x, requires_grad=True)
    ty = tx if c.get("self_attn") else torch.tensor(y, requires_grad=True)
    tout, tw = tm(tx, ty, ty, **tkw)
    (torch.sin(tout).sum() + (0 if tw is None else torch.cos(tw).sum())).backward()
    nxx = nx.asarray(x)
    nxy = nxx if c.get("self_attn") else nx.asarray(y)
    out, w = m(nxx, nxy, nxy, **kw)
    _close(out, tout)
    assert (w is None) == (tw is None)
    if w is not None:
        assert w.shape == tuple(tw.shape)
        _close(w, tw)

    def loss(m, x, y):
        y = x if c.get("self_attn") else y
        out, w = m(x, y, y, **kw)
        return nx.sin(out).sum() + (0 if w is None else nx.cos(w).sum())

    gm, gx = nx.grad(loss, argnums=(0, 1))(m, nxx, nxy)
    _close(gx, tx.grad, **GTOL)
    _close(gm.in_proj_weight, tm.in_proj_weight.grad, **GTOL)
    _close(gm.out_proj.weight, tm.out_proj.weight.grad, **GTOL)
    if c.get("bias", True):
        _close(gm.in_proj_bias, tm.in_proj_bias.grad, **GTOL)
        _close(gm.out_proj.bias, tm.out_proj.bias.grad, **GTOL)


def test_mha_fully_padded_row_without_weights_gives_torch_result():
    tm, m = _pair()
    x = _np((4, 2, 8), 0)
    kpm = np.zeros((2, 4), bool)
    kpm[1] = True  # batch element 1 sees no key
    tout, _ = tm(*(torch.tensor(x),) * 3, key_padding_mask=torch.tensor(kpm), need_weights=False)
    out, _ = m(*(nx.asarray(x),) * 3, key_padding_mask=nx.asarray(kpm), need_weights=False)
    _close(out, tout)


def test_mha_under_compile_and_dropout_key():
    tm, m = _pair()
    x = nx.asarray(_np((5, 3, 8), 0))
    want, _ = tm(*(torch.tensor(x.numpy()),) * 3, need_weights=False)
    f = nx.compile(lambda m, x: m(x, x, x, need_weights=False)[0])
    for _ in range(2):
        _close(f(m, x), want)
    md = m.replace(dropout=0.5)
    plain = md(x, x, x, need_weights=False)[0]
    _close(plain, want)  # no key: no dropout
    for nw in (False, True):
        dropped = md(x, x, x, need_weights=nw, dropout_key=nx.random.key(1))[0]
        assert np.isfinite(dropped.numpy()).all() and not np.allclose(
            dropped.numpy(), want.detach().numpy()
        )


def test_mha_errors_are_clear():
    _, m = _pair()
    x = nx.asarray(_np((5, 3, 8), 0))
    with pytest.raises(ValueError, match="is_causal=True needs attn_mask"):
        m(x, x, x, is_causal=True)
    with pytest.raises(ShapeError, match="attn_mask must be"):
        m(x, x, x, attn_mask=nx.ones((4, 5), dtype=nx.bool_))
    with pytest.raises(ShapeError, match="key_padding_mask must be"):
        m(x, x, x, key_padding_mask=nx.ones((5, 3), dtype=nx.bool_))
    with pytest.raises(ShapeError, match="E = 8"):
        m(x, nx.ones((5, 3, 4)), nx.ones((5, 3, 4)))


def test_mha_under_autocast_and_compiled_dropout_with_a_key_argument():
    tm, m = _pair()
    x = nx.asarray(_np((5, 3, 8), 0))
    want = m(x, x, x, need_weights=False)[0]
    with nx.autocast(nx.bfloat16):
        got = m(x, x, x, need_weights=False)[0]
    assert got.dtype == nx.bfloat16
    _close(got.astype(nx.float32), want.numpy(), rtol=5e-2, atol=5e-2)  # bfloat16 resolution
    md = m.replace(dropout=0.3)
    f = nx.compile(lambda m, x, k: m(x, x, x, need_weights=False, dropout_key=k)[0])
    k1, k2 = nx.random.key(1), nx.random.key(2)
    eager = md(x, x, x, need_weights=False, dropout_key=k1)[0]
    _close(f(md, x, k1), eager.numpy())
    _close(f(md, x, k1), eager.numpy())  # replay
    assert not np.allclose(f(md, x, k2).numpy(), eager.numpy())  # the key is an argument

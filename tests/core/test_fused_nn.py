"""The fused layer primitives of core/prims/fused_nn.py (issue 37): ``layer_norm``, ``gelu`` and
``linear`` (with bias) are one forward node and one ``vjp[...]`` backward node each, with values
and gradients equal to PyTorch's and JAX's, under ``nx.vmap`` and ``nx.compile``, and the cases
they do not cover (half precision layer norm, promoting biases) keep the separate ops."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

try:
    import torch
except ImportError:  # no PyTorch (the Python 3.12 run installs none): only its comparisons skip
    torch = None

import nablax as nx
import nablax.nn.functional as F
from nablax import nn
from nablax.core.graph import toposort
from nablax.errors import ShapeError

TF = torch.nn.functional if torch is not None else None
needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")
RTOL, ATOL = 2e-5, 2e-5  # float32, a few roundings of a length-8 reduction


def _rng(seed=0):
    return np.random.default_rng(seed)


def _prims(*outs) -> list:
    roots = [t._impl.src[0] for t in outs if not t.is_realized]
    return [n.prim.name for n in toposort(roots)]


def _close(a, b, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=rtol, atol=atol)


# ---- the functions under test, with their PyTorch and JAX references ----------------------------

_RNG = _rng(1)
_X = _RNG.standard_normal((2, 3, 8)).astype(np.float32)
_W8 = _RNG.standard_normal(8).astype(np.float32)
_B8 = _RNG.standard_normal(8).astype(np.float32)
_WL = _RNG.standard_normal((5, 8)).astype(np.float32)
_BL = _RNG.standard_normal(5).astype(np.float32)


def _jax_ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = jnp.square(x - mu).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + eps) * w + b


CASES = {
    # name: (nablax fn, torch fn, jax fn, args, fused primitive)
    "layer_norm": (
        lambda x, w, b: F.layer_norm(x, (8,), w, b),
        lambda x, w, b: TF.layer_norm(x, (8,), w, b),
        _jax_ln,
        (_X, _W8, _B8),
        "layer_norm",
    ),
    "gelu_tanh": (
        lambda x: F.gelu(x, approximate="tanh"),
        lambda x: TF.gelu(x, approximate="tanh"),
        lambda x: jax.nn.gelu(x, approximate=True),
        (_X,),
        "gelu",
    ),
    "gelu_exact": (
        lambda x: nx.gelu(x, approximate=False),
        lambda x: TF.gelu(x),
        lambda x: jax.nn.gelu(x, approximate=False),
        (_X,),
        "gelu",
    ),
    "linear": (
        F.linear,
        lambda *a: TF.linear(*a),  # looked up when called: TF is None without PyTorch
        lambda x, w, b: jnp.einsum("...i,oi->...o", x, w, precision="highest") + b,
        (_X, _WL, _BL),
        "linear",
    ),
}


@needs_torch
@pytest.mark.parametrize("name", sorted(CASES))
def test_values_and_gradients_match_torch_and_jax_in_one_node_each(name):
    fn, tfn, jfn, args, prim = CASES[name]
    c = _rng(2).standard_normal(np.shape(tfn(*map(torch.tensor, args)))).astype(np.float32)
    xs = [nx.tensor(a) for a in args]
    out = fn(*xs)
    assert _prims(out) == [prim]
    ts = [torch.tensor(a, requires_grad=True) for a in args]
    ref = tfn(*ts)
    (ref * torch.tensor(c)).sum().backward()
    _close(out.numpy(), ref.detach().numpy())

    loss = lambda *a: (fn(*a) * nx.tensor(c)).sum()  # noqa: E731
    argnums = tuple(range(len(args)))
    value, grads = nx.value_and_grad(loss, argnums=argnums)(*xs)
    # the backward pass is one derived node, however many inputs get a cotangent
    assert _prims(*grads).count(f"vjp[{prim}]") == 1
    assert len([p for p in _prims(*grads) if p.startswith("vjp[")]) == 1
    jgrads = jax.grad(lambda *a: (jfn(*a) * c).sum(), argnums=argnums)(*args)
    for g, t, j in zip(grads, ts, jgrads):
        _close(g.numpy(), t.grad.numpy())
        _close(g.numpy(), j)
    _close(value.item(), float((ref * torch.tensor(c)).sum().detach()), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("name", sorted(CASES))
def test_under_vmap_and_compile(name):
    fn, _, jfn, args, prim = CASES[name]
    xs = [nx.tensor(a) for a in args]
    # vmap over the leading axis of x only (weights shared), values and gradients
    in_axes = (0,) + (None,) * (len(args) - 1)
    _close(nx.vmap(fn, in_axes=in_axes)(*xs).numpy(), jax.vmap(jfn, in_axes=in_axes)(*args))
    g = nx.vmap(nx.grad(lambda *a: fn(*a).sum()), in_axes=in_axes)(*xs)
    jg = jax.vmap(jax.grad(lambda *a: jfn(*a).sum()), in_axes=in_axes)(*args)
    _close(g.numpy(), jg)
    # a batched weight too (every input batched)
    stacked = [np.stack([a, a * 0.5 + 0.1]) for a in args]
    _close(nx.vmap(fn)(*[nx.tensor(s) for s in stacked]).numpy(), jax.vmap(jfn)(*stacked))
    # compiled: forward and gradient with respect to every input
    argnums = tuple(range(len(args)))
    step = nx.compile(lambda *a: nx.value_and_grad(lambda *b: fn(*b).sum(), argnums=argnums)(*a))
    value, grads = step(*xs)
    jv, jgs = jax.value_and_grad(lambda *b: jfn(*b).sum(), argnums=argnums)(*args)
    _close(value.item(), jv, atol=1e-4)
    for a, b in zip(grads, jgs):
        _close(a.numpy(), b)


@pytest.mark.parametrize("name", ["layer_norm", "gelu_tanh", "gelu_exact"])
def test_second_derivatives_match_jax(name):
    """The derived vjp node is differentiable again (jax.vjp of the lowering, derived again)."""
    fn, _, jfn, args, _ = CASES[name]
    x = args[0][0, 0]
    rest = [a for a in args[1:]]
    f = lambda x, *r: (fn(x, *r) ** 2).sum()  # noqa: E731
    jf = lambda x, *r: (jfn(x, *r) ** 2).sum()  # noqa: E731
    h = nx.grad(lambda x: nx.grad(f)(x, *[nx.tensor(r) for r in rest]).sum())(nx.tensor(x))
    jh = jax.grad(lambda x: jax.grad(jf)(x, *rest).sum())(x)
    _close(h.numpy(), jh, rtol=1e-4, atol=1e-4)


@needs_torch
def test_layers_use_the_fused_nodes_and_match_torch():
    torch.manual_seed(0)
    tln, tlin = torch.nn.LayerNorm(8), torch.nn.Linear(8, 5)
    with torch.no_grad():
        tln.weight.copy_(torch.tensor(_W8))
        tln.bias.copy_(torch.tensor(_B8))
    ln, lin = nn.LayerNorm(8), nn.Linear(8, 5, key=nx.random.key(0))
    ln = ln.replace(weight=nx.tensor(_W8), bias=nx.tensor(_B8))
    lin = lin.replace(
        weight=nx.tensor(tlin.weight.detach().numpy()), bias=nx.tensor(tlin.bias.detach().numpy())
    )
    x = nx.tensor(_X)
    y = lin(ln(x))
    assert _prims(y) == ["layer_norm", "linear"]
    _close(y.numpy(), tlin(tln(torch.tensor(_X))).detach().numpy())


@needs_torch
def test_gelu_of_integers_and_layer_norm_fallbacks_keep_the_separate_ops():
    """Integer GELU input is made float first (one fused node); a half-precision layer norm, or
    one whose weight has another dtype or a broadcast shape, keeps the separate ops (and their
    promotions), with the values of before."""
    g = nx.gelu(nx.tensor([-1, 0, 2]))
    assert g.dtype == nx.float32 and "gelu" in _prims(g)
    _close(g.numpy(), np.asarray(jax.nn.gelu(jnp.array([-1.0, 0.0, 2.0]))), atol=1e-6)
    xb = nx.tensor(_X).astype(nx.bfloat16)
    yb = F.layer_norm(xb, (8,))
    assert "layer_norm" not in _prims(yb) and yb.dtype == nx.bfloat16
    ref = TF.layer_norm(torch.tensor(_X).to(torch.bfloat16), (8,)).float().numpy()
    _close(yb.astype(nx.float32).numpy(), ref, rtol=3e-2, atol=3e-2)
    y = F.layer_norm(nx.tensor(_X), (8,), nx.tensor(_W8[:1]))  # a broadcast weight
    assert "layer_norm" not in _prims(y)
    _close(y.numpy(), TF.layer_norm(torch.tensor(_X), (8,)).numpy() * _W8[0])


def test_linear_fallbacks_and_autocast():
    """A bias of another dtype promotes through the separate add; under nx.autocast the fused
    node computes in the low dtype with its bias cast, as the separate einsum and add did, and
    float32 parameters get float32 gradients."""
    x, w = nx.tensor(_X), nx.tensor(_WL)
    b16 = nx.tensor(_BL).astype(nx.bfloat16)
    y = F.linear(x.astype(nx.bfloat16), w.astype(nx.bfloat16), nx.tensor(_BL))
    assert "linear" not in _prims(y) and y.dtype == nx.float32
    y = F.linear(x, w, b16)
    assert "linear" not in _prims(y) and y.dtype == nx.float32
    b = nx.tensor(_BL)
    with nx.autocast(nx.bfloat16):
        y = F.linear(x, w, b)
        assert _prims(y) == ["linear"] and y.dtype == nx.bfloat16
        grads = nx.grad(lambda x, w, b: F.linear(x, w, b).astype(nx.float32).sum(), (0, 1, 2))(
            x, w, b
        )
    assert [g.dtype for g in grads] == [nx.float32] * 3
    with nx.autocast(nx.bfloat16):  # the separate ops F.linear built before issue 37
        sep = nx.einsum("...i,oi->...o", x, w) + b.astype(nx.bfloat16)
    assert "linear" not in _prims(sep)
    # bfloat16 products: XLA may keep excess precision inside a fusion, so within 2 bfloat16 ulps
    eps = float(jnp.finfo(jnp.bfloat16).eps)
    _close(y.astype(nx.float32).numpy(), sep.astype(nx.float32).numpy(), 2 * eps, 2 * eps)
    _close(grads[2].numpy(), np.full(5, 6.0, np.float32))


def test_linear_calls_remembered_by_shape_follow_autocast_precision_and_vmap():
    """The fused node's params and shapes are remembered per call signature: a later call under
    nx.autocast or another matmul_precision builds the node those settings give, and batched
    inputs get vmap's layout (checked against a Python loop)."""
    from nablax.core.prims import fused_nn

    x, w, b = nx.tensor(_X), nx.tensor(_WL), nx.tensor(_BL)
    fused_nn._LINEAR_CALLS.clear()

    def params(y):
        assert _prims(y) == ["linear"]
        return y._impl.src[0].params

    first = F.linear(x, w, b)
    p0 = params(first)
    again = F.linear(x, w, b)  # from the memo
    assert params(again) == p0 and again.shape == (2, 3, 5) and again.dtype == nx.float32
    _close(again.numpy(), _X @ _WL.T + _BL)
    with nx.autocast(nx.bfloat16):
        y = F.linear(x, w, b)
    assert y.dtype == nx.bfloat16 and params(y) != p0
    with nx.config.override(matmul_precision="bfloat16"):
        assert params(F.linear(x, w, b))[0][2] == "bfloat16"
    assert params(F.linear(x, w, b)) == p0
    xs = np.stack([_X, 2 * _X])
    got = nx.vmap(lambda x: F.linear(x, w, b))(nx.tensor(xs))
    _close(got.numpy(), np.stack([F.linear(nx.tensor(a), w, b).numpy() for a in xs]))
    with pytest.raises(ShapeError):  # another shape is checked by the shape rule again
        F.linear(x, nx.tensor(_WL[:, :7]), b)


def _np_ln(x, n_axes, w=None, b=None, eps=1e-5):
    """Layer norm in float64 NumPy (the reference of the memo test below)."""
    x = x.astype(np.float64)
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    xc = x - x.mean(axes, keepdims=True)
    y = xc / np.sqrt((xc * xc).mean(axes, keepdims=True) + eps)
    return y * (1 if w is None else w) + (0 if b is None else b)


def test_layer_norm_calls_remembered_by_shape_follow_dtypes_options_and_vmap():
    """F.layer_norm's checks of a fusing call are remembered per shapes, dtypes and options: a
    later call with another eps, dtype, affine shape or normalized_shape gets its own checks
    (and errors), values match NumPy's, and batched inputs match a Python loop."""
    from nablax.core.prims import fused_nn

    x, w, b = nx.tensor(_X), nx.tensor(_W8), nx.tensor(_B8)
    fused_nn._LN_CALLS.clear()
    for _ in range(2):  # the first call checks, the second reads the memo
        y = F.layer_norm(x, (8,), w, b)
        assert _prims(y) == ["layer_norm"] and len(fused_nn._LN_CALLS) == 1
        _close(y.numpy(), _np_ln(_X, 1, _W8, _B8))
    y = F.layer_norm(x, 8, w, None, eps=0.5)  # an int shape, no bias, another eps
    assert y._impl.src[0].params == (1, 0.5, True, False)
    _close(y.numpy(), _np_ln(_X, 1, _W8, eps=0.5))
    y = F.layer_norm(x, (3, 8))  # two normalized dims, no affine parameters
    _close(y.numpy(), _np_ln(_X, 2))
    xb = x.astype(nx.bfloat16)  # another dtype: the separate ops, as before
    assert "layer_norm" not in _prims(F.layer_norm(xb, (8,)))
    y = F.layer_norm(x, (8,), nx.tensor(_W8[:1]), b)  # a broadcast weight after the memo
    assert "layer_norm" not in _prims(y)
    _close(y.numpy(), _np_ln(_X, 1, _W8[:1], _B8))
    with pytest.raises(ShapeError):
        F.layer_norm(x, (5,), w, b)
    with nx.autocast(nx.bfloat16):  # the input is cast first: the full path
        assert F.layer_norm(x, (8,), w, b).dtype == nx.float32
    xs = np.stack([_X, 3 * _X + 1])
    got = nx.vmap(lambda x: F.layer_norm(x, (8,), w, b))(nx.tensor(xs))
    _close(got.numpy(), np.stack([F.layer_norm(nx.tensor(a), (8,), w, b).numpy() for a in xs]))
    g = nx.grad(lambda x, w: F.layer_norm(x, (8,), w, b).sum() ** 2, argnums=(0, 1))(x, w)
    jg = jax.grad(lambda x, w: jnp.sum(_jax_ln(x, w, jnp.asarray(_B8))) ** 2, argnums=(0, 1))(
        jnp.asarray(_X), jnp.asarray(_W8)
    )
    for a, r in zip(g, jg):
        _close(a.numpy(), np.asarray(r), rtol=1e-3, atol=1e-3)


def test_gpt_block_nodes():
    """A pre-norm MLP half-block (LayerNorm, Linear, GELU, Linear, residual) builds 5 forward
    nodes and, with its gradient, one backward node per fused op."""
    ln, fc = nn.LayerNorm(8), nn.Linear(8, 16, key=nx.random.key(1))
    out = nn.Linear(16, 8, key=nx.random.key(2))
    ln, fc, out = nx.block_until_ready((ln, fc, out))  # the initial values computed
    x = nx.tensor(_X)

    def block(x):
        return x + out(F.gelu(fc(ln(x)), approximate="tanh"))

    assert sorted(_prims(block(x))) == sorted(["layer_norm", "linear", "gelu", "linear", "add"])
    g = nx.grad(lambda x: block(x).sum())(x)
    backward = [p for p in _prims(g) if p.startswith("vjp[")]
    assert sorted(backward) == sorted(
        ["vjp[layer_norm]", "vjp[linear]", "vjp[gelu]"] + ["vjp[linear]"]
    )


# ---- clip_by_global_norm over a whole tree ------------------------------------------------------


def _clip_separate(leaves, max_norm):
    """optim.clip_by_global_norm's separate float32 ops, written with nablax ops."""
    total = None
    for g in leaves:
        s = (g * g).sum()
        total = s if total is None else total + s
    norm = nx.sqrt(total)
    return [nx.where(norm < max_norm, g, (g / norm) * max_norm) for g in leaves]


@needs_torch
@pytest.mark.parametrize("scale", [0.05, 20.0])  # under and over the norm
def test_clip_by_global_norm_is_one_node_equal_to_the_separate_ops_and_torch(scale):
    from nablax import optim

    rng = _rng(3)
    g = {
        "w": (rng.standard_normal((4, 3)) * scale).astype(np.float32),
        "b": [(rng.standard_normal(3) * scale).astype(np.float32), None],
        "s": np.float32(scale),
    }
    tree = nx.tree.map(nx.tensor, g)
    opt = optim.clip_by_global_norm(1.0)
    out, state = opt.update(tree, opt.init(tree))
    leaves = nx.tree.leaves(out)
    assert _prims(*leaves) == ["clip_by_global_norm"] and out["b"][1] is None
    assert all(a.dtype == nx.float32 for a in leaves)
    sep = _clip_separate(nx.tree.leaves(tree), 1.0)
    for a, b in zip(leaves, sep):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    ts = [torch.tensor(np.asarray(a)).requires_grad_() for a in nx.tree.leaves(g)]
    for t in ts:
        t.grad = t.detach().clone()
    torch.nn.utils.clip_grad_norm_(ts, 1.0)
    for a, t in zip(leaves, ts):
        _close(a.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_clip_by_global_norm_mixed_dtypes_keep_the_separate_ops():
    from nablax import optim

    tree = {"a": nx.tensor([3.0, 0.0]), "b": nx.tensor([4.0]).astype(nx.bfloat16)}
    opt = optim.clip_by_global_norm(1.0)
    out, _ = opt.update(tree, opt.init(tree))
    assert "clip_by_global_norm" not in _prims(out["a"], out["b"])
    assert out["b"].dtype == nx.bfloat16
    np.testing.assert_allclose(out["a"].numpy(), [0.6, 0.0], rtol=1e-6)
    empty, _ = opt.update({}, opt.init({}))
    assert empty == {}


def test_clip_by_global_norm_gradients_vmap_and_compile_match_jax():
    from nablax.core.prims import fused_nn

    rng = _rng(4)
    a, b = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(4).astype(np.float32)

    def jclip(a, b, m=1.0):
        norm = jnp.sqrt(jnp.sum(a * a) + jnp.sum(b * b))
        return [jnp.where(norm < m, x, (x / norm) * m) for x in (a, b)]

    def f(a, b):
        x, y = fused_nn.clip_by_global_norm([a, b], 1.0)
        return (x * x * 3.0).sum() + y.sum()

    jf = lambda a, b: (jclip(a, b)[0] ** 2 * 3.0).sum() + jclip(a, b)[1].sum()  # noqa: E731
    grads = nx.grad(f, argnums=(0, 1))(nx.tensor(a), nx.tensor(b))
    for g, j in zip(grads, jax.grad(jf, argnums=(0, 1))(a, b)):
        _close(g.numpy(), j)
    va, vb = np.stack([a, a * 0.1]), np.stack([b, b * 0.1])  # over and under the norm
    outs = nx.vmap(lambda a, b: fused_nn.clip_by_global_norm([a, b], 1.0))(
        nx.tensor(va), nx.tensor(vb)
    )
    for o, j in zip(outs, jax.vmap(jclip)(va, vb)):
        _close(o.numpy(), j)
    step = nx.compile(lambda a, b: fused_nn.clip_by_global_norm([a, b], 1.0))
    for o, j in zip(step(nx.tensor(a), nx.tensor(b)), jclip(a, b)):
        _close(o.numpy(), j)


# ---- AdamW with the decay and the learning rate folded in --------------------------------------


@needs_torch
def test_adamw_is_one_node_for_the_tree_bit_identical_to_its_chain_and_torch():
    from nablax import optim

    rng = _rng(5)
    shapes = {"w": (4, 3), "b": (3,), "s": ()}
    init = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    params = {k: nx.tensor(v) for k, v in init.items()}
    fused = optim.adamw(3e-3, weight_decay=0.1)
    plain = optim.chain(optim.scale_by_adam(), optim.add_decayed_weights(0.1), optim.scale(-3e-3))
    s1, s2 = fused.init(params), plain.init(params)
    assert nx.tree.structure(s1) == nx.tree.structure(s2)  # checkpoints do not change
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in init.items()}
    topt = torch.optim.AdamW(list(tp.values()), lr=3e-3, weight_decay=0.1)
    p1 = p2 = nx.block_until_ready(params)
    s1, s2 = nx.block_until_ready((s1, s2))
    for step in range(3):
        g = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
        u1, s1 = fused.update(nx.tree.map(nx.tensor, g), s1, p1)
        u2, s2 = plain.update(nx.tree.map(nx.tensor, g), s2, p2)
        # one node for the whole tree, and the step count's saturating increment
        assert sorted(_prims(*nx.tree.leaves(u1))) == ["adamw_update", "add", "minimum"]
        p1, p2 = optim.apply_updates(p1, u1), optim.apply_updates(p2, u2)
        for k in p1:
            np.testing.assert_array_equal(p1[k].numpy(), p2[k].numpy(), err_msg=f"{k} {step}")
        for k, t in tp.items():
            t.grad = torch.tensor(g[k])
        topt.step()
        s1, s2 = nx.block_until_ready((s1, s2))
    for a, b in zip(nx.tree.leaves(s1), nx.tree.leaves(s2)):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    for k, t in tp.items():
        _close(p1[k].numpy(), t.detach().numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="adamw.*params"):
        fused.update(nx.tree.map(nx.tensor, g), s1)


def test_adamw_mixed_dtypes_and_schedules_keep_the_separate_ops():
    from nablax import optim

    params = {"w": nx.ones((2, 2)).astype(nx.bfloat16)}  # bfloat16 moments and parameter
    g = {"w": nx.full((2, 2), 0.5)}  # float32 gradient: Adam's own node does not fuse either
    for opt in (optim.adamw(1e-2), optim.adamw(lambda count: 1e-2)):
        plain = optim.chain(
            optim.scale_by_adam(), optim.add_decayed_weights(0.01), optim.scale(-1e-2)
        )
        u1, _ = opt.update(g, opt.init(params), params)
        u2, _ = plain.update(g, plain.init(params), params)
        assert "adamw_update" not in _prims(u1["w"]) and u1["w"].dtype == u2["w"].dtype
        np.testing.assert_array_equal(
            u1["w"].astype(nx.float32).numpy(), u2["w"].astype(nx.float32).numpy()
        )


@needs_torch
def test_layer_norm_with_eps_traced_by_compile_keeps_the_separate_ops():
    """An ``eps`` that nx.compile traces (a Python float argument) has no concrete value for the
    node's params: the separate ops take it as a runtime value, one program for every eps."""
    step = nx.compile(lambda x, eps: F.layer_norm(x, (8,), eps=eps))
    for eps in (0.5, 1e-5):
        ref = TF.layer_norm(torch.tensor(_X), (8,), eps=eps).numpy()
        _close(step(nx.tensor(_X), eps).numpy(), ref)
    assert step.cache_info().traces == 1


# ---- optim.apply_updates over a whole tree -----------------------------------------------------


def test_apply_updates_is_one_node_equal_to_adding_leaf_by_leaf():
    from nablax import optim

    rng = _rng(7)
    shapes = {"w": (4, 3), "b": (3,), "s": ()}
    ps = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    us = {k: rng.standard_normal(s).astype(np.float32) for k, s in shapes.items()}
    out = optim.apply_updates(nx.tree.map(nx.tensor, ps), nx.tree.map(nx.tensor, us))
    assert _prims(*nx.tree.leaves(out)) == ["apply_updates"]
    for k in shapes:
        np.testing.assert_array_equal(out[k].numpy(), ps[k] + us[k])


def test_apply_updates_casts_and_missing_leaves_keep_the_separate_adds():
    from nablax import optim

    p = {"w": nx.ones(2, dtype=nx.bfloat16), "v": nx.ones(3)}
    out = optim.apply_updates(p, {"w": nx.full((2,), 0.5), "v": nx.full((3,), 0.25)})
    assert "apply_updates" not in _prims(out["w"], out["v"])
    assert out["w"].dtype == nx.bfloat16 and out["w"].tolist() == [1.5, 1.5]
    assert out["v"].tolist() == [1.25] * 3
    q = optim.apply_updates({"a": nx.ones(2), "b": None}, {"a": nx.ones(2), "b": None})
    assert q["b"] is None and q["a"].tolist() == [2.0, 2.0]

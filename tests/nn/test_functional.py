"""``nablax.nn.functional`` against ``torch.nn.functional``: values and gradients.

Each case runs the same function on the same float32 inputs in both libraries, then compares the
result and the gradient of ``sum(result * r)`` (a fixed random cotangent) with respect to every
float input: ``nx.grad`` against ``torch.autograd``.
"""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax.errors import DTypeError, ShapeError

torch = pytest.importorskip("torch")
TF = torch.nn.functional

RTOL, ATOL = 1e-5, 1e-5


def _rng(name):
    return np.random.default_rng(sum(map(ord, name)))


def _check(name, nx_fn, torch_fn, arrays, *, rtol=RTOL, atol=ATOL, diff=None):
    """Compare values, then gradients w.r.t. the float arrays (or the indices in ``diff``)."""
    rng = _rng(name)
    diff = [i for i, a in enumerate(arrays) if a.dtype.kind == "f"] if diff is None else diff
    tx = [torch.tensor(a, requires_grad=i in diff) for i, a in enumerate(arrays)]
    want = torch_fn(*tx)
    got = nx_fn(*[nx.tensor(a) for a in arrays])
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=rtol, atol=atol)
    if not diff:
        return
    r = rng.standard_normal(tuple(want.shape)).astype(np.float32)
    (want * torch.tensor(r)).sum().backward()

    def loss(*fs):
        full = [nx.tensor(a) for a in arrays]
        for i, f in zip(diff, fs):
            full[i] = f
        return (nx_fn(*full) * nx.tensor(r)).sum()

    grads = nx.grad(loss, argnums=tuple(range(len(diff))))(*[nx.tensor(arrays[i]) for i in diff])
    for i, g in zip(diff, grads):
        np.testing.assert_allclose(
            g.numpy(), tx[i].grad.numpy(), rtol=rtol, atol=atol, err_msg=f"{name}: grad of {i}"
        )


def _x(name, *shape, scale=1.0):
    return (_rng(name).standard_normal(shape) * scale).astype(np.float32)


# ---- activations -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, ours, theirs",
    [
        ("relu", F.relu, TF.relu),
        ("gelu", F.gelu, TF.gelu),
        ("gelu_tanh", lambda x: F.gelu(x, "tanh"), lambda x: TF.gelu(x, approximate="tanh")),
        ("silu", F.silu, TF.silu),
        ("softmax0", lambda x: F.softmax(x, 0), lambda x: TF.softmax(x, 0)),
        ("softmax", lambda x: F.softmax(x, dim=-1), lambda x: TF.softmax(x, dim=-1)),
        ("log_softmax", lambda x: F.log_softmax(x, 1), lambda x: TF.log_softmax(x, 1)),
    ],
)
def test_activations(name, ours, theirs):
    x = _x(name, 4, 5, scale=3.0)
    x[0, 0] = 0.5  # away from relu's kink at 0 (both libraries give 0 there)
    _check(name, ours, theirs, [x])


# ---- losses ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"label_smoothing": 0.1},
        {"ignore_index": 2},
        {"ignore_index": 2, "label_smoothing": 0.2},
        {"ignore_index": 2, "reduction": "sum"},
    ],
    ids=str,
)
def test_cross_entropy_integer_targets(kw):
    logits = _x("ce", 6, 4, scale=2.0)
    labels = np.array([0, 2, 3, 1, 2, 0], np.int32)
    _check(
        f"ce{kw}",
        lambda a, y: F.cross_entropy(a, y, **kw),
        lambda a, y: TF.cross_entropy(a, y.long(), **kw),
        [logits, labels],
    )


def test_cross_entropy_spatial_and_unbatched():
    logits = _x("ce4", 2, 3, 4, 5)
    labels = _rng("ce4l").integers(0, 3, (2, 4, 5)).astype(np.int32)
    _check(
        "ce_spatial",
        lambda a, y: F.cross_entropy(a, y, label_smoothing=0.05),
        lambda a, y: TF.cross_entropy(a, y.long(), label_smoothing=0.05),
        [logits, labels],
    )
    _check(
        "ce_unbatched",
        F.cross_entropy,
        lambda a, y: TF.cross_entropy(a, y.long()),
        [_x("ce1", 5), np.array(3, np.int32)],
    )


def test_cross_entropy_probability_targets():
    probs = np.abs(_x("cep", 3, 4)) + 0.1
    probs = (probs / probs.sum(1, keepdims=True)).astype(np.float32)
    _check(
        "ce_probs",
        lambda a, p: F.cross_entropy(a, p, label_smoothing=0.1),
        lambda a, p: TF.cross_entropy(a, p, label_smoothing=0.1),
        [_x("cel", 3, 4), probs],
        diff=[0],
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"reduction": "sum"},
        {"reduction": "none"},
        {"label_smoothing": 0.2},
        {"ignore_index": 2, "label_smoothing": 0.1},
        {"ignore_index": 2, "reduction": "none"},
    ],
    ids=str,
)
def test_cross_entropy_class_weights(kw):
    """``weight=``: values and gradients (logits and weights) against torch; ``'mean'`` divides
    by the counted targets' weights."""
    weight = _rng("cew").uniform(0.5, 2.0, 4).astype(np.float32)
    labels = np.array([0, 2, 3, 1, 2, 0], np.int32)
    _check(
        f"ce_weight{kw}",
        lambda a, y, w: F.cross_entropy(a, y, w, **kw),
        lambda a, y, w: TF.cross_entropy(a, y.long(), w, **kw),
        [_x("cewl", 6, 4, scale=2.0), labels, weight],
        diff=[0],  # torch does not differentiate the weight of integer targets
    )
    spatial = _rng("cews").integers(0, 4, (2, 3, 5)).astype(np.int32)
    _check(
        f"ce_weight_spatial{kw}",
        lambda a, y, w: F.cross_entropy(a, y, w, **kw),
        lambda a, y, w: TF.cross_entropy(a, y.long(), w, **kw),
        [_x("cewsl", 2, 4, 3, 5), spatial, weight],
        diff=[0],
    )
    if "ignore_index" in kw:  # not a parameter of probability targets
        return
    probs = np.abs(_x("cewp", 3, 4)) + 0.1
    _check(
        f"ce_weight_probs{kw}",
        lambda a, p, w: F.cross_entropy(a, p, w, **kw),
        lambda a, p, w: TF.cross_entropy(a, p, w, **kw),
        [_x("cewpl", 3, 4), (probs / probs.sum(1, keepdims=True)).astype(np.float32), weight],
        diff=[0, 2],
    )


def test_cross_entropy_weight_gradient_matches_jax():
    """torch has no gradient for the class weights of integer targets; JAX's of the same formula."""
    import jax
    import jax.numpy as jnp

    x, w = _x("cegx", 6, 4), _rng("cegw").uniform(0.5, 2.0, 4).astype(np.float32)
    y = np.array([0, 2, 3, 1, 2, -100], np.int32)

    def ref(w):
        logp = jax.nn.log_softmax(x, axis=1)
        ok = y != -100
        c = np.where(ok, y, 0)
        w_y = jnp.where(ok, w[c], 0.0)
        picked = logp[np.arange(6), c]
        smooth = -(logp * w).sum(1)
        loss = jnp.where(ok, 0.9 * -(w_y * picked) + 0.1 / 4 * smooth, 0.0)
        return loss.sum() / w_y.sum()

    got = nx.grad(lambda w: F.cross_entropy(nx.tensor(x), nx.tensor(y), w, label_smoothing=0.1))(
        nx.tensor(w)
    )
    np.testing.assert_allclose(got.numpy(), np.asarray(jax.grad(ref)(w)), rtol=1e-5, atol=1e-6)


def test_cross_entropy_errors():
    with pytest.raises(ValueError, match=r"cross_entropy.*targets \(3,\).*expected \(2,\)"):
        F.cross_entropy(nx.ones((2, 4)), nx.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"label_smoothing=1.5"):
        F.cross_entropy(nx.ones((2, 4)), nx.tensor([0, 1]), label_smoothing=1.5)
    with pytest.raises(ValueError, match=r"reduction='avg'"):
        F.cross_entropy(nx.ones((2, 4)), nx.tensor([0, 1]), reduction="avg")
    with pytest.raises(TypeError, match=r"cross_entropy: needs a float tensor, got int32"):
        F.cross_entropy(nx.tensor([[1, 2]]), nx.tensor([0]))
    with pytest.raises(ValueError, match=r"cross_entropy: weight has shape \(3,\).*4 classes"):
        F.cross_entropy(nx.ones((2, 4)), nx.tensor([0, 1]), nx.ones(3))
    with pytest.raises(TypeError, match=r"cross_entropy: weight is int32"):
        F.cross_entropy(nx.ones((2, 4)), nx.tensor([0, 1]), nx.tensor([1, 1, 1, 1]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction):
    _check(
        f"mse{reduction}",
        lambda a, b: F.mse_loss(a, b, reduction),
        lambda a, b: TF.mse_loss(a, b, reduction=reduction),
        [_x("mse_a", 3, 4), _x("mse_b", 3, 4)],
    )
    with pytest.raises(ValueError, match=r"mse_loss: input \(3,\) and target \(2,\) differ"):
        F.mse_loss(nx.ones(3), nx.ones(2))


# ---- layers as functions -----------------------------------------------------------------------


def test_linear_embedding_layer_norm():
    _check("linear", F.linear, TF.linear, [_x("li", 5, 3), _x("lw", 4, 3), _x("lb", 4)])
    _check("linear_nobias", F.linear, TF.linear, [_x("li2", 2, 5, 3), _x("lw2", 4, 3)])
    ids = np.array([[0, 3], [2, 2]], np.int32)
    _check("embedding", F.embedding, lambda i, w: TF.embedding(i.long(), w), [ids, _x("ew", 5, 3)])
    _check(
        "layer_norm",
        lambda x, w, b: F.layer_norm(x, (4, 5), w, b, eps=1e-3),
        lambda x, w, b: TF.layer_norm(x, (4, 5), w, b, eps=1e-3),
        [_x("lnx", 3, 4, 5, scale=2.0), _x("lnw", 4, 5), _x("lnb", 4, 5)],
    )
    _check(
        "layer_norm_plain",
        lambda x: F.layer_norm(x, 5),
        lambda x: TF.layer_norm(x, (5,)),
        [_x("lnx2", 3, 5)],
    )


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"stride": 2},
        {"padding": 1},
        {"padding": (2, 0), "stride": (1, 2)},
        {"padding": "same"},
        {"padding": "valid"},
        {"dilation": 2, "padding": 2},
        {"groups": 2},
    ],
    ids=str,
)
def test_conv2d(kw):
    x = _x("cx", 2, 4, 9, 8)
    w = _x("cw", 6, 4 // kw.get("groups", 1), 3, 3)
    b = _x("cb", 6)
    _check(
        f"conv{kw}",
        lambda x, w, b: F.conv2d(x, w, b, **kw),
        lambda x, w, b: TF.conv2d(x, w, b, **kw),
        [x, w, b],
        rtol=1e-4,
        atol=1e-4,
    )


def test_conv2d_unbatched_and_errors():
    _check("conv_unbatched", F.conv2d, TF.conv2d, [_x("cu", 2, 5, 5), _x("cuw", 3, 2, 2, 2)])
    with pytest.raises(ValueError, match=r"conv2d: input has 3 channels but weight"):
        F.conv2d(nx.ones((1, 3, 5, 5)), nx.ones((2, 2, 3, 3)))
    with pytest.raises(ValueError, match=r"conv2d: input must be \(N, C, H, W\)"):
        F.conv2d(nx.ones((5, 5)), nx.ones((2, 1, 3, 3)))
    with pytest.raises(ValueError, match=r"padding='same' needs stride=1"):
        F.conv2d(nx.ones((1, 1, 5, 5)), nx.ones((1, 1, 3, 3)), stride=2, padding="same")


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": (2, 3), "stride": (1, 2)},
        {"kernel_size": 3, "stride": 2, "ceil_mode": True},
        {"kernel_size": 2, "stride": 2, "padding": 1, "ceil_mode": True},
        {"kernel_size": 2, "dilation": 2},
        {"kernel_size": (2, 3), "stride": 1, "dilation": (3, 1)},
        {"kernel_size": 3, "stride": 2, "padding": 1, "dilation": 2, "ceil_mode": True},
    ],
    ids=str,
)
def test_max_pool2d(kw):
    x = _x("mp", 2, 3, 7, 8)  # distinct values: no ties between a window's elements
    _check(f"max_pool{kw}", lambda x: F.max_pool2d(x, **kw), lambda x: TF.max_pool2d(x, **kw), [x])


@pytest.mark.parametrize(
    "kw",
    [
        {"kernel_size": 2},
        {"kernel_size": 3, "stride": 2, "padding": 1},
        {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False},
        {"kernel_size": (2, 3), "divisor_override": 5},
        {"kernel_size": 2, "ceil_mode": True},
        {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True},
        {
            "kernel_size": 3,
            "stride": 2,
            "padding": 1,
            "ceil_mode": True,
            "count_include_pad": False,
        },
        {"kernel_size": (2, 3), "stride": (3, 2), "ceil_mode": True, "divisor_override": 4},
    ],
    ids=str,
)
def test_avg_pool2d(kw):
    x = _x("ap", 2, 3, 7, 8)
    _check(f"avg_pool{kw}", lambda x: F.avg_pool2d(x, **kw), lambda x: TF.avg_pool2d(x, **kw), [x])


def test_pool_errors():
    with pytest.raises(ValueError, match=r"max_pool2d: padding \(2, 2\) must be at most half"):
        F.max_pool2d(nx.ones((1, 1, 8, 8)), 2, padding=2)
    with pytest.raises(ShapeError, match=r"max_pool2d: kernel_size \(3, 3\) is larger"):
        F.max_pool2d(nx.ones((1, 1, 4, 4)), 3, dilation=2)  # spans 5 elements


def test_dilated_max_pool2d_ties_nan_and_ints_follow_torch():
    # JAX differentiates no dilated max reduce_window: nablax picks from strided slices, and the
    # gradient of a tied window goes to its first element in row-major order, as torch's
    z = np.zeros((1, 2, 7, 7), np.float32)
    z[0, 1, 2, 2] = np.nan
    kw = {"kernel_size": 3, "stride": 2, "dilation": 2, "padding": 1}
    tz = torch.tensor(z, requires_grad=True)
    want = TF.max_pool2d(tz, **kw)
    got = F.max_pool2d(nx.tensor(z), **kw)
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())  # NaN where torch has it
    want.sum().backward()
    g = nx.grad(lambda t: F.max_pool2d(t, **kw).sum())(nx.tensor(z))
    np.testing.assert_array_equal(g.numpy(), tz.grad.numpy())
    xi = np.arange(2 * 3 * 6 * 6, dtype=np.int32).reshape(2, 3, 6, 6) % 7
    got_i = F.max_pool2d(nx.tensor(xi), 2, dilation=2, ceil_mode=True)
    want_i = TF.max_pool2d(torch.tensor(xi, dtype=torch.float32), 2, dilation=2, ceil_mode=True)
    assert got_i.dtype == nx.int32
    np.testing.assert_array_equal(got_i.numpy(), want_i.numpy().astype(np.int32))


@pytest.mark.parametrize("cls", ["MaxPool2d", "AvgPool2d"])
def test_pool_layers_take_torchs_arguments(cls):
    kw = {"kernel_size": 3, "stride": 2, "padding": 1, "ceil_mode": True}
    kw.update({"dilation": 2} if cls == "MaxPool2d" else {"count_include_pad": False})
    x = _x("pl", 2, 3, 8, 7)
    got = getattr(nx.nn, cls)(**kw)(nx.tensor(x)).numpy()
    want = getattr(torch.nn, cls)(**kw)(torch.tensor(x)).numpy()
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)


def test_one_hot_and_dropout():
    got = F.one_hot(nx.tensor([0, 3, 1]))
    want = TF.one_hot(torch.tensor([0, 3, 1]))
    assert got.dtype == nx.int32 and got.tolist() == want.tolist()
    assert F.one_hot(nx.tensor([1]), 4).tolist() == TF.one_hot(torch.tensor([1]), 4).tolist()
    x = nx.ones((200, 50))
    assert F.dropout(x, 0.3).tolist() == x.tolist()  # no key: identity
    assert F.dropout(x, 0.3, training=False, key=nx.random.key(0)).tolist() == x.tolist()
    y = F.dropout(x, 0.3, key=nx.random.key(0)).numpy()
    assert set(np.unique(y).tolist()) == {0.0, np.float32(1 / 0.7)}
    assert abs((y == 0).mean() - 0.3) < 0.02  # 10,000 draws: 5 standard deviations
    g = nx.grad(lambda x: F.dropout(x, 0.3, key=nx.random.key(0)).sum())(x).numpy()
    np.testing.assert_allclose(g, y)  # the gradient is the same mask and scale


def test_linear_and_cross_entropy_graphs_partition_well():
    """A training step's graph has no gather (cross_entropy picks the target by a mask) and no
    transpose (linear is one einsum): under a batch split over devices, a gather of (row, class)
    pairs makes XLA gather the batch onto every device, and a transposed weight gradient costs a
    strided copy every step (bench/bench_distributed.py measured both: 2x the step)."""
    from nablax.core.graph import toposort

    x, y = nx.tensor(_rng("g").standard_normal((8, 5)).astype(np.float32)), nx.tensor([1, 0] * 4)
    w, b = nx.ones((3, 5)), nx.zeros(3)
    loss, grads = nx.value_and_grad(lambda w, b: F.cross_entropy(F.linear(x, w, b), y), (0, 1))(
        w, b
    )
    roots = [t._impl.src.node for t in (loss, *grads) if t._impl.src is not None]
    prims = {node.prim.name for node in toposort(roots)}
    assert roots and prims & {"einsum", "linear"}, prims  # linear with bias: one fused node
    assert not prims & {"gather", "scatter", "transpose"}, prims
    tw = torch.ones(3, 5, requires_grad=True)
    TF.cross_entropy(
        TF.linear(torch.tensor(x.numpy()), tw), torch.tensor(y.numpy()).long()
    ).backward()
    np.testing.assert_allclose(grads[0].numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_cross_entropy_is_one_node_and_refuses_bool_targets():
    """Integer targets: the loss is one graph node (core/prims/fused.py), its gradient one more;
    bool targets are neither classes nor probabilities."""
    from nablax.core.graph import toposort

    x = nx.tensor(_rng("ce1").standard_normal((6, 4)).astype(np.float32))
    y = nx.tensor([0, 3, 1, -100, 2, 2])
    loss = F.cross_entropy(x, y)
    assert [n.prim.name for n in toposort([loss._impl.src.node])] == ["cross_entropy"]
    ref = TF.cross_entropy(torch.tensor(x.numpy()), torch.tensor(y.numpy()).long())
    np.testing.assert_allclose(loss.item(), ref.item(), rtol=1e-6)
    with pytest.raises(DTypeError, match="cross_entropy.*bool"):
        F.cross_entropy(x, nx.tensor([True, False] * 3))

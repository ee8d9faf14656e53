"""``nablax.nn`` layers against ``torch.nn``: the same weights (PyTorch's layouts, copied as they
are) give the same outputs and the same parameter gradients; initialisation follows PyTorch's
distributions; modules are pytrees that every transform, ``nx.save`` and printing understand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn

torch = pytest.importorskip("torch")


def _x(seed, *shape):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _to_torch(ours, theirs):
    """Copy every parameter of our module into the torch module (same names, same layouts)."""
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            obj = ours
            for part in name.split("."):
                obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
            assert tuple(p.shape) == obj.shape, name
            p.copy_(torch.tensor(obj.numpy()))


def _compare(ours, theirs, x: np.ndarray, *, tol=1e-5, call=None):
    """Forward values and every parameter's gradient of ``sum(out * r)``."""
    _to_torch(ours, theirs)
    call = call or (lambda m, t: m(t))
    want = theirs(torch.tensor(x))
    got = call(ours, nx.tensor(x))
    np.testing.assert_allclose(got.numpy(), want.detach().numpy(), rtol=tol, atol=tol)
    r = _x(99, *want.shape)
    (want * torch.tensor(r)).sum().backward()
    g = nx.grad(lambda m: (call(m, nx.tensor(x)) * nx.tensor(r)).sum())(ours)
    assert type(g) is type(ours)
    for name, p in theirs.named_parameters():
        obj = g
        for part in name.split("."):
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        np.testing.assert_allclose(
            obj.numpy(), p.grad.numpy(), rtol=tol, atol=tol, err_msg=f"grad of {name}"
        )


def test_linear():
    _compare(nn.Linear(5, 3, key=nx.random.key(0)), torch.nn.Linear(5, 3), _x(1, 4, 5))
    _compare(
        nn.Linear(5, 3, bias=False, key=nx.random.key(0)),
        torch.nn.Linear(5, 3, bias=False),
        _x(1, 2, 4, 5),
    )


@pytest.mark.parametrize(
    "kw", [{}, {"stride": 2, "padding": 1}, {"padding": "same"}, {"groups": 2, "dilation": 2}]
)
def test_conv2d(kw):
    ours = nn.Conv2d(4, 6, 3, key=nx.random.key(0), **kw)
    _compare(ours, torch.nn.Conv2d(4, 6, 3, **kw), _x(2, 2, 4, 9, 9), tol=1e-4)


def test_layer_norm_embedding():
    _compare(nn.LayerNorm((3, 4), eps=1e-4), torch.nn.LayerNorm((3, 4), eps=1e-4), _x(3, 2, 3, 4))
    ours = nn.Embedding(7, 3, key=nx.random.key(0))
    theirs = torch.nn.Embedding(7, 3)
    ids = np.array([[1, 6], [0, 1]])
    _to_torch(ours, theirs)
    np.testing.assert_allclose(
        ours(nx.tensor(ids.astype(np.int32))).numpy(),
        theirs(torch.tensor(ids)).detach().numpy(),
    )
    g = nx.grad(lambda m: m(nx.tensor(ids.astype(np.int32))).sum())(ours)
    theirs(torch.tensor(ids)).sum().backward()
    np.testing.assert_allclose(g.weight.numpy(), theirs.weight.grad.numpy())


def _cnn(key):
    k1, k2 = nx.random.split(key)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, key=k1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(64, 10, key=k2),
    )


def test_sequential_cnn_and_mlp():
    theirs = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 10),
    )
    _compare(_cnn(nx.random.key(1)), theirs, _x(4, 3, 1, 8, 8), tol=1e-4)
    mlp = nn.MLP([6, 8, 8, 2], activation=nx.tanh, key=nx.random.key(2))
    theirs = torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 8), torch.nn.Tanh(),
        torch.nn.Linear(8, 2),
    )  # fmt: skip
    # torch's Sequential numbers the activations too: map its names onto our layers
    ours_as_torch = nn.Sequential(mlp.layers[0], nn.Tanh(), mlp.layers[1], nn.Tanh(), mlp.layers[2])
    _to_torch(ours_as_torch, theirs)
    x = _x(5, 3, 6)
    np.testing.assert_allclose(
        mlp(nx.tensor(x)).numpy(), theirs(torch.tensor(x)).detach().numpy(), rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize(
    "make, bound_of",
    [
        (lambda k: nn.Linear(300, 200, key=k), lambda m: 1 / np.sqrt(300)),
        (lambda k: nn.Conv2d(8, 64, 5, key=k), lambda m: 1 / np.sqrt(8 * 25)),
        (lambda k: nn.Conv2d(8, 64, 3, groups=4, key=k), lambda m: 1 / np.sqrt(2 * 9)),
    ],
)
def test_init_follows_pytorch(make, bound_of):
    m = make(nx.random.key(0))
    bound = bound_of(m)
    w, b = m.weight.numpy(), m.bias.numpy()
    # PyTorch: kaiming_uniform_(a=sqrt(5)) for the weight and U(-1/sqrt(fan_in), ..) for the
    # bias, i.e. both uniform on [-bound, bound]; check the support, the mean and the std
    for t in (w, b):
        assert np.abs(t).max() <= bound
        assert np.abs(t).max() > 0.9 * bound
    assert abs(w.mean()) < 0.05 * bound
    assert abs(w.std() - bound / np.sqrt(3)) < 0.03 * bound
    theirs = (
        torch.nn.Linear(300, 200) if isinstance(m, nn.Linear) else None
    )  # one direct comparison of the bound with torch's own initialiser
    if theirs is not None:
        assert abs(theirs.weight.detach().abs().max().item() - bound) < 0.01 * bound
    e = nn.Embedding(500, 64, key=nx.random.key(1)).weight.numpy()
    assert abs(e.mean()) < 0.02 and abs(e.std() - 1.0) < 0.02  # N(0, 1), as torch.nn.Embedding
    ln = nn.LayerNorm(5)
    assert ln.weight.tolist() == [1.0] * 5 and ln.bias.tolist() == [0.0] * 5


def test_keys_make_weights_reproducible_and_none_uses_the_global_stream():
    a = nn.Linear(3, 2, key=nx.random.key(7))
    b = nn.Linear(3, 2, key=nx.random.key(7))
    assert a.weight.tolist() == b.weight.tolist()
    nx.random.seed(5)
    c = nn.Linear(3, 2)
    nx.random.seed(5)
    d = nn.Linear(3, 2)
    assert c.weight.tolist() == d.weight.tolist()
    assert c.weight.tolist() != nn.Linear(3, 2).weight.tolist()


def test_dropout_in_sequential_takes_the_key():
    model = nn.Sequential(nn.Linear(4, 64, key=nx.random.key(0)), nn.Dropout(0.5))
    x = nx.ones((2, 4))
    plain = model(x).numpy()
    np.testing.assert_array_equal(plain, model[0](x).numpy())  # no key: identity
    dropped = model(x, key=nx.random.key(1)).numpy()
    zeros = dropped == 0
    assert 0.3 < zeros.mean() < 0.7
    np.testing.assert_allclose(dropped[~zeros], 2 * plain[~zeros], rtol=1e-6)


def test_module_is_frozen_and_replace_copies():
    lin = nn.Linear(2, 2, key=nx.random.key(0))
    with pytest.raises(AttributeError, match=r"Linear.weight: modules are immutable.*replace"):
        lin.weight = nx.zeros((2, 2))
    new = lin.replace(bias=None)
    assert new.bias is None and lin.bias is not None and new.weight is lin.weight
    with pytest.raises(TypeError, match=r"no field named 'bais'"):
        lin.replace(bais=None)
    assert dataclasses.is_dataclass(lin)


def test_user_module_with_static_fields_and_unset_field():
    class Block(nn.Module):
        lin: nn.Linear
        scale: float = nn.field(static=True)

        def __init__(self, d, scale, *, key):
            self.lin = nn.Linear(d, d, key=key)
            self.scale = scale

        def __call__(self, x):
            return self.lin(x) * self.scale

    blk = Block(3, 2.0, key=nx.random.key(0))
    leaves = nx.tree.leaves_with_path(blk)
    assert [p for p, _ in leaves] == [".lin.weight", ".lin.bias"]
    g = nx.grad(lambda m: m(nx.ones((1, 3))).sum())(blk)
    assert type(g) is Block and g.scale == 2.0
    np.testing.assert_allclose(g.lin.bias.numpy(), [2.0, 2.0, 2.0])

    class Broken(nn.Module):
        a: nx.Tensor
        b: nx.Tensor

        def __init__(self):
            self.a = nx.ones(1)

    with pytest.raises(TypeError, match=r"Broken.__init__ did not set the field\(s\) b"):
        Broken()


def test_printing_shows_the_layer_tree_with_shapes():
    text = repr(_cnn(nx.random.key(0)))
    assert text.splitlines()[0] == "Sequential("
    assert "weight=f32[4,1,3,3]" in text and "padding=(1, 1)" in text
    assert "MaxPool2d(kernel_size=2)" in text and "Flatten()" in text
    assert "Linear(weight=f32[10,64], bias=f32[10], in_features=64, out_features=10)" in text
    assert repr(nn.MLP([2, 3], key=nx.random.key(0))).endswith("activation=relu,\n)")


def test_transforms_take_modules():
    model = _cnn(nx.random.key(3))
    xs = nx.tensor(_x(6, 4, 1, 8, 8))
    ys = nx.tensor(np.array([1, 2, 3, 4], np.int32))

    def loss(m, x, y):
        return F.cross_entropy(m(x), y)

    # nx.compile traces a whole training step once, with the module as argument and result
    @nx.compile
    def step(m, x, y):
        lval, g = nx.value_and_grad(loss)(m, x, y)
        return nx.tree.map(lambda p, d: p - 0.1 * d, m, g), lval

    eager = model
    compiled = model
    for _ in range(3):
        lval, g = nx.value_and_grad(loss)(eager, xs, ys)
        eager = nx.tree.map(lambda p, d: p - 0.1 * d, eager, g)
        compiled, lc = step(compiled, xs, ys)
        np.testing.assert_allclose(lc.item(), lval.item(), rtol=1e-5)
    assert step.cache_info().traces == 1
    assert type(compiled) is nn.Sequential
    # vmap over examples with the model unbatched equals the batched call
    per_example = nx.vmap(lambda x: model(x[None])[0])(xs)
    np.testing.assert_allclose(per_example.numpy(), model(xs).numpy(), rtol=1e-5, atol=1e-6)


def test_save_and_load_a_module(tmp_path):
    model = _cnn(nx.random.key(4))
    path = tmp_path / "cnn.safetensors"
    nx.save(path, model)
    back = nx.load(path, like=model)
    assert type(back) is nn.Sequential and type(back.layers[0]) is nn.Conv2d
    for (p1, a), (p2, b) in zip(nx.tree.leaves_with_path(model), nx.tree.leaves_with_path(back)):
        assert p1 == p2
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    x = nx.tensor(_x(7, 2, 1, 8, 8))
    np.testing.assert_array_equal(back(x).numpy(), model(x).numpy())
    with pytest.raises(ValueError, match=r"layers"):
        nx.load(path, like=nn.MLP([64, 10], key=nx.random.key(0)))


def test_static_fields_are_structure_not_data(tmp_path):
    # an MLP's activation is a function: it stays in the code, the file holds the weights only
    mlp = nn.MLP([3, 4, 2], activation=nx.tanh, key=nx.random.key(0))
    nx.save(tmp_path / "mlp.safetensors", mlp)
    raw = nx.load(tmp_path / "mlp.safetensors")
    assert set(raw) == {"layers"} and set(raw["layers"][0]) == {"weight", "bias"}
    back = nx.load(tmp_path / "mlp.safetensors", like=mlp)
    assert back.activation is nx.tanh and back.layers[1].in_features == 4
    x = nx.ones((1, 3))
    np.testing.assert_array_equal(back(x).numpy(), mlp(x).numpy())


def test_vmap_builds_and_runs_an_ensemble():
    # building modules inside nx.vmap (one per key) stacks their weights, as equinox's filter_vmap
    keys = nx.random.split(nx.random.key(0), 4)
    ens = nx.vmap(lambda k: nn.MLP([3, 5, 2], key=k))(keys)
    assert ens.layers[0].weight.shape == (4, 5, 3)
    x = nx.tensor(_x(8, 6, 3))
    out = nx.vmap(lambda m: m(x))(ens).numpy()
    for i in range(4):
        single = nn.MLP([3, 5, 2], key=keys[i])
        np.testing.assert_allclose(out[i], single(x).numpy(), rtol=1e-6, atol=1e-6)

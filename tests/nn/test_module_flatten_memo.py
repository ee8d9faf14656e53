"""The flatten memo of module trees (nablax/tree.py): reusing a module tree's leaves is
invisible. Each test compares ``nx.tree.flatten`` with JAX's own walk of the same tree after the
tree changed in every way a user can change it."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

import nablax as nx
from nablax import nn, optim
from nablax import tree as _tree


class Net(nn.Module):
    layers: list
    head: nn.Linear
    extra: tuple

    def __init__(self, key):
        ks = nx.random.split(key, 4)
        self.layers = [nn.Linear(3, 3, key=ks[0]), nn.Linear(3, 3, key=ks[1])]
        self.head = nn.Linear(3, 2, key=ks[2])
        self.extra = (nx.ones(2), [nx.zeros(1)])


def _same_as_jax(tree):
    leaves, treedef = _tree.flatten(tree)
    ref_leaves, ref_def = jax.tree_util.tree_flatten(tree)
    assert treedef == ref_def
    assert len(leaves) == len(ref_leaves)
    assert all(a is b for a, b in zip(leaves, ref_leaves))
    return leaves


def test_second_flatten_is_served_from_the_memo_and_equal():
    net = Net(nx.random.key(0))
    first = _same_as_jax(net)
    assert id(net) in _tree._FLATTENED
    second = _same_as_jax(net)
    assert second == first and second is not first  # a fresh list each time
    second.append("x")  # the caller's list is its own
    assert len(_tree.flatten(net)[0]) == len(first)


def test_lists_changed_in_place_are_seen():
    net = Net(nx.random.key(0))
    n = len(_same_as_jax(net))
    net.layers.append(nn.Linear(3, 3, key=nx.random.key(5)))
    assert len(_same_as_jax(net)) == n + 2
    net.layers[0] = nn.Linear(3, 3, key=nx.random.key(6), bias=False)
    assert len(_same_as_jax(net)) == n + 1
    net.extra[1].append(nx.ones(3))  # a list inside a tuple
    assert len(_same_as_jax(net)) == n + 2
    net.layers.reverse()
    _same_as_jax(net)
    net.layers.clear()
    assert len(_same_as_jax(net)) == n + 2 - 5  # three layers gone, one without a bias


def test_trees_built_by_unflatten_are_remembered_with_their_lists():
    net = Net(nx.random.key(0))
    leaves, treedef = _tree.flatten(net)
    rebuilt = _tree.unflatten(treedef, [x * 2 for x in leaves])
    assert id(rebuilt) in _tree._FLATTENED
    got = _same_as_jax(rebuilt)
    np.testing.assert_allclose(got[0].numpy(), 2 * leaves[0].numpy())
    rebuilt.layers.pop()
    assert len(_same_as_jax(rebuilt)) == len(leaves) - 2


def test_trees_the_memo_does_not_take_are_walked_each_time():
    class WithDict(nn.Module):
        d: dict

        def __init__(self):
            self.d = {"a": nx.ones(1)}

    m = WithDict()
    _same_as_jax(m)
    assert id(m) not in _tree._FLATTENED
    m.d["b"] = nx.ones(2)
    assert len(_same_as_jax(m)) == 2

    class WithArray(nn.Module):
        w: object

        def __init__(self):
            self.w = np.ones(2)  # not a Tensor leaf: a later registration could change it

    a = WithArray()
    _same_as_jax(a)
    assert id(a) not in _tree._FLATTENED


def test_module_flattened_during_its_own_init_is_not_remembered():
    seen = []

    class Early(nn.Module):
        a: nx.Tensor
        b: nx.Tensor

        def __init__(self):
            self.a = nx.ones(1)
            self.b = nx.ones(2)
            seen.append(len(nx.tree.leaves(self)))

    e = Early()
    assert len(_same_as_jax(e)) == 2 and seen == [2]


def test_entries_die_with_their_root():
    net = Net(nx.random.key(0))
    _tree.flatten(net)
    key = id(net)
    assert key in _tree._FLATTENED
    del net
    gc.collect()
    assert key not in _tree._FLATTENED


def test_training_after_list_surgery_matches_a_fresh_model():
    """A model trained, changed in place between steps (a layer swapped in its list), then
    trained again gives the gradients of a model built that way from the start."""
    net = Net(nx.random.key(0))
    opt = optim.adam(1e-2)
    state = opt.init(net)
    x = nx.random.normal(nx.random.key(1), (4, 3))

    def loss(m, x):
        for layer in m.layers:
            x = nx.tanh(layer(x))
        return (m.head(x) ** 2).sum() + sum(t.sum() for t in nx.tree.leaves(m.extra))

    g = nx.grad(loss)(net, x)
    updates, state = opt.update(g, state, net)
    net = optim.apply_updates(net, updates)
    swapped = nn.Linear(3, 3, key=nx.random.key(9))
    net.layers[1] = swapped
    g2 = nx.grad(loss)(net, x)
    fresh = nx.tree.unflatten(nx.tree.structure(net), list(jax.tree_util.tree_leaves(net)))
    g_ref = nx.grad(loss)(fresh, x)
    # the two gradients are separate programs, which XLA may fuse differently: a few ulps apart
    # (values are O(1)); a stale structure would give the old layer's gradients, O(0.1) off
    for a, b in zip(jax.tree_util.tree_leaves(g2), jax.tree_util.tree_leaves(g_ref)):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)
    assert g2.layers[1].weight.shape == swapped.weight.shape
    # the optimizer's checks see the swapped layer too: state from the old tree still fits
    updates, state = opt.update(g2, state, net)
    optim.apply_updates(net, updates)


# ---- unflatten programs ---------------------------------------------------------------------


class Tagged(nn.Module):
    """Static fields of several kinds beside children, a None child and nested containers."""

    body: Net
    skip: nn.Linear | None
    pair: tuple
    name: str = nn.field(static=True)
    sizes: tuple = nn.field(static=True)

    def __init__(self, key, name="t"):
        self.body = Net(key)
        self.skip = None
        self.pair = (nn.Linear(2, 2, key=nx.random.key(9), bias=False), [], ())
        self.name = name
        self.sizes = (3, 2)


def _same_objects(a, b, path="root"):
    """``a`` and ``b`` have the same containers and module types, the same ``__dict__`` keys in
    the same order, and the very same leaves and static values."""
    assert type(a) is type(b), path
    if isinstance(a, nn.Module):
        assert list(vars(a)) == list(vars(b)), path
        for k in vars(a):
            _same_objects(vars(a)[k], vars(b)[k], f"{path}.{k}")
    elif type(a) in (list, tuple):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _same_objects(x, y, f"{path}[{i}]")
    else:
        assert a is b, path


def test_unflatten_programs_rebuild_what_jax_rebuilds():
    for tree in (Net(nx.random.key(0)), Tagged(nx.random.key(1)), Tagged(nx.random.key(2), "u")):
        leaves, treedef = _tree.flatten(tree)
        new_leaves = [nx.ones(x.shape) * 2.0 for x in leaves]
        hits = _tree._BUILDERS.hits
        for _ in range(3):  # JAX's walk (and the program made from it), then the program
            got = _tree.unflatten(treedef, new_leaves)
            _same_objects(got, jax.tree_util.tree_unflatten(treedef, new_leaves))
            assert _tree.flatten(got)[0] == new_leaves  # remembered, with the new leaves
        assert _tree._BUILDERS.hits >= hits + 2
        net = got.body if isinstance(got, Tagged) else got
        net.layers.append(nn.Linear(3, 3, key=nx.random.key(3)))
        _same_as_jax(got)  # a list of a built tree changed in place is seen
        # leaves that are not tensors, and a wrong leaf count: JAX's walk, JAX's error
        floats = [float(i) for i in range(len(leaves))]
        _same_objects(
            _tree.unflatten(treedef, floats), jax.tree_util.tree_unflatten(treedef, floats)
        )
        for bad in (new_leaves[:-1], [*new_leaves, nx.ones(1)]):
            try:
                jax.tree_util.tree_unflatten(treedef, bad)
            except ValueError as e:
                want = str(e)
            with pytest.raises(ValueError) as got_err:
                _tree.unflatten(treedef, bad)
            assert str(got_err.value) == want


def test_training_with_unflatten_programs_matches_jax_trees(monkeypatch):
    """An optimizer loop (every state and update tree rebuilt by a program) gives exactly the
    values of the same loop over trees JAX's walk rebuilt."""
    x = nx.asarray(np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3))

    def loss(m, x):
        body = m.body
        y = body.head(body.layers[1](body.layers[0](x)))
        return (y**2).sum() + body.extra[0].sum() * m.pair[0](nx.ones((1, 2))).sum()

    def train():
        net = Tagged(nx.random.key(4))
        opt = optim.adamw(0.05)
        state = opt.init(net)
        for _ in range(4):
            g = nx.grad(loss)(net, x)
            upd, state = opt.update(g, state, net)
            net = optim.apply_updates(net, upd)
        assert type(net) is Tagged and net.name == "t" and net.sizes == (3, 2)
        return [t.numpy() for t in jax.tree_util.tree_leaves((net, state))]

    _tree._BUILDERS.clear()
    hits = _tree._BUILDERS.hits
    with_programs = train()
    assert _tree._BUILDERS.hits > hits
    monkeypatch.setattr(_tree, "_make_builder", lambda example: None)
    _tree._BUILDERS.clear()
    walked = train()
    assert len(with_programs) == len(walked)
    for a, b in zip(with_programs, walked):
        np.testing.assert_array_equal(a, b)

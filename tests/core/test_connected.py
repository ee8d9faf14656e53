"""core/connected.py: which live pending tensors a read computes along with its value.

The search (:func:`connected._touches`) is checked against the definition it implements: a
pending graph touches the program when some pending node in it (the start included) reads a
program node or one of the program's leaf arrays. Reads are checked end to end as well."""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx
from nablax.core import connected as conn
from nablax.core.graph import SCALAR_TYPES, Var


def _node(t):
    return t._impl.src[0]


def _pending_inputs(node):
    for inp in node.inputs:
        if type(inp) is Var:
            m, j = inp
            if m.values is None or m.values[j] is None:
                yield m


def _reference(start, in_prog, leaf_ids, memo=None) -> bool:
    """The definition, by plain recursion over the pending graph (small graphs only)."""
    memo = {} if memo is None else memo
    if start in memo:
        return memo[start]
    hit = False
    for inp in start.inputs:
        if type(inp) is Var:
            m, j = inp
            if m in in_prog:
                hit = True
            elif m.values is not None and m.values[j] is not None:
                hit = id(m.values[j]) in leaf_ids
        elif type(inp.value) not in SCALAR_TYPES:
            hit = id(inp.value) in leaf_ids
        if hit:
            break
    if not hit:
        hit = any(_reference(m, in_prog, leaf_ids, memo) for m in _pending_inputs(start))
    memo[start] = hit
    return hit


def _random_graph(rng, n_leaves: int, n_nodes: int):
    leaves = [nx.tensor(rng.normal(size=3).astype(np.float32)) for _ in range(n_leaves)]
    for leaf in leaves:
        leaf.numpy()  # realized: its nodes read it as a leaf array
    made = []
    for _ in range(n_nodes):
        pool = leaves + made
        a = pool[rng.integers(len(pool))]
        kind = rng.integers(4)
        if kind == 0:
            t = nx.tanh(a)
        elif kind == 1:
            t = a * 0.5
        else:
            b = pool[rng.integers(len(pool))]
            t = a + b if kind == 2 else a * b
        made.append(t)
    return leaves, made


@pytest.mark.parametrize("seed", range(12))
def test_search_matches_the_definition_on_random_graphs(seed):
    rng = np.random.default_rng(seed)
    leaves, made = _random_graph(rng, 4, 70)
    nodes = [_node(t) for t in made]
    in_prog = {n for n in nodes[:40] if rng.random() < 0.15}
    leaf_ids = {id(leaf._impl.value) for leaf in leaves if rng.random() < 0.3}
    found = conn._Leaves({})
    found.ids = leaf_ids
    memo: dict = {}  # shared by every candidate, as in one realization
    order = [n for n in nodes if n not in in_prog]
    rng.shuffle(order)
    for n in order:
        assert conn._touches(n, in_prog, found, memo) == _reference(n, in_prog, leaf_ids), seed
    # every memoized answer is right too (the path to a hit, the nodes left without one)
    for n, got in memo.items():
        assert got == _reference(n, in_prog, leaf_ids)


def test_leaf_ids_are_computed_only_when_no_program_node_decides():
    x = nx.tensor(np.arange(4, dtype=np.float32))
    x.numpy()
    h = x * 2  # the program's node
    rest = (h + 1) * x  # reads the program node: decided before any leaf is asked
    leaves = conn._Leaves({_node(h): None})
    assert conn._touches(_node(rest), {_node(h)}, leaves, {})
    assert leaves.ids is None
    side = nx.tanh(x) + 1  # shares only the leaf ``x`` with the program
    assert conn._touches(_node(side), {_node(h)}, leaves, {})
    assert leaves.ids == {id(x._impl.value)}


def test_a_read_computes_what_shares_a_node_or_a_leaf_and_leaves_the_rest():
    x = nx.tensor(np.arange(4, dtype=np.float32))
    z = nx.tensor(np.ones(4, np.float32))
    x.numpy(), z.numpy()
    base = z
    for _ in range(20):  # a shared pending graph unrelated to the read
        base = base + nx.tanh(base) * base * 0.1
    h = x * 2
    loss = h.sum()
    apart = base * 3  # searched first: its whole graph is decided "not touching"
    via_node = base * h  # reads the program node through the graph decided above
    via_leaf = (base + 1) * x  # shares the leaf x only
    before = nx.cache_info().realizations
    assert loss.item() == 12.0
    assert nx.cache_info().realizations - before in (1, 2)  # the rest may run as a second program
    assert via_node.is_realized and via_leaf.is_realized
    assert not apart.is_realized  # (``base`` is computed: the user holds it, via_node reads it)
    b = np.ones(4, np.float32)
    for _ in range(20):
        b = b + np.tanh(b) * b * np.float32(0.1)
    xs = np.arange(4, dtype=np.float32)
    np.testing.assert_allclose(via_node.numpy(), b * xs * 2, rtol=1e-5)
    np.testing.assert_allclose(via_leaf.numpy(), (b + 1) * xs, rtol=1e-5)
    np.testing.assert_allclose(apart.numpy(), b * 3, rtol=1e-5)

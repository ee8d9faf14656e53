"""Backward-pass plans (``nablax/core/transforms/plan.py``): a reverse pass over a forward structure
seen before replays the recorded nodes instead of running the rules. Every primitive's replay is
checked in ``test_autodiff.py`` (``_check_plan_replay``); these tests cover the keying and the
fallbacks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.core.transforms import plan


@pytest.fixture(autouse=True)
def _fresh():
    nx.clear_caches()
    yield


def _replays() -> int:
    return plan.plan_info()[1]


def test_training_loop_replays_after_the_first_step():
    w = nx.tensor(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
    x = nx.tensor(np.ones((5, 4), np.float32))

    def loss(w, x):
        return nx.tanh(x @ w).sum() * 0.5

    wj = jnp.asarray(w.numpy())
    for step in range(4):
        v, g = nx.value_and_grad(loss)(w, x)
        vj, gj = jax.value_and_grad(lambda w: jnp.tanh(jnp.asarray(x.numpy()) @ w).sum() * 0.5)(wj)
        np.testing.assert_allclose(g.numpy(), gj, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(v.item(), vj, rtol=1e-5)
        w, wj = w - 0.1 * g, wj - 0.1 * gj
        nx.realize(w)  # a pending w would be a different structure (a node, not a leaf)
        assert _replays() == step  # step 0 records, every later step replays
    assert plan.plan_info()[2] == 1


@pytest.mark.parametrize("p", [2.0, 3.0, -0.5])
def test_python_scalars_are_part_of_the_plan_key(p):
    # the rule of x ** p folds p into the nodes it builds, so each p needs its own plan
    x = nx.tensor([1.5, 2.0, 3.0])
    for q in (p, 1.0 + p, p):
        g = nx.grad(lambda x, q=q: (x**q).sum())(x)
        want = jax.grad(lambda x, q=q: (x**q).sum())(jnp.asarray([1.5, 2.0, 3.0]))
        np.testing.assert_allclose(g.numpy(), want, rtol=1e-6)


def test_leaf_shapes_are_part_of_the_plan_key():
    for n in (3, 4, 3):
        x = nx.tensor(np.arange(n, dtype=np.float32))
        g = nx.grad(lambda x: (x * x).sum())(x)
        assert g.tolist() == [2.0 * i for i in range(n)]


def test_grad_of_grad_and_vjp_repeat_correctly():
    f = lambda x: nx.sin(x) * x  # noqa: E731
    fj = lambda x: jnp.sin(x) * x  # noqa: E731
    for _ in range(3):
        x = nx.tensor(0.7)
        np.testing.assert_allclose(
            nx.grad(nx.grad(f))(x).item(), jax.grad(jax.grad(fj))(0.7), rtol=1e-5
        )
        out, pull = nx.vjp(lambda x: nx.exp(x) * 2, nx.tensor([0.1, 0.2]))
        (ct,) = pull(nx.tensor([1.0, -1.0]))
        np.testing.assert_allclose(ct.numpy(), 2 * np.exp([0.1, 0.2]) * [1, -1], rtol=1e-6)


def test_unplannable_structure_falls_back_to_the_rules():
    # the gradient of x + 1 (scalar x) is the seed itself: no node was built, nothing to replay
    for _ in range(3):
        g = nx.grad(lambda x: x + 1.0)(nx.tensor(2.0))
        assert g.item() == 1.0
    assert _replays() == 0


def test_plans_off_runs_the_rules_every_time():
    with _config.override(backward_plans=False):
        for _ in range(3):
            nx.grad(lambda x: (x * x).sum())(nx.tensor([1.0, 2.0]))
    assert plan.plan_info() == (0, 0, 0)


def test_plan_store_is_bounded(monkeypatch):
    monkeypatch.setattr(plan, "_MAX_PLANS", 3)
    for n in range(1, 8):
        nx.grad(lambda x: (x * x).sum())(nx.ones(n))
    assert plan.plan_info()[0] == 3

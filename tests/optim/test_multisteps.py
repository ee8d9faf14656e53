"""``optim.MultiSteps`` against optax's semantics written out in NumPy (optax is not a
dependency), against PyTorch's gradient accumulation, and under ``nx.compile`` / ``nx.vmap``."""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx
from nablax import optim


def _grads(n, shape=(3,), seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(n)]


class OptaxMultiStepsRef:
    """optax.MultiSteps.update, transcribed (optax/_src/wrappers.py): a running mean
    ``acc + (g - acc) / (mini_step + 1)`` (or a sum), ``cond(mini_step < k - 1, mid, final)``,
    the inner optimizer here SGD with momentum ``buf = m * buf + g; update = -lr * buf``."""

    def __init__(self, k_of, lr=0.1, momentum=0.9, use_grad_mean=True, skip=None):
        self.k_of, self.lr, self.m, self.mean, self.skip = k_of, lr, momentum, use_grad_mean, skip

    def init(self, shape):
        return {
            "mini": 0,
            "gstep": 0,
            "buf": np.zeros(shape, np.float32),
            "acc": np.zeros(shape, np.float32),
        }

    def update(self, g, s):
        if self.skip is not None and self.skip(g):
            return np.zeros_like(g), dict(s)
        k = self.k_of(s["gstep"])
        acc = s["acc"] + (g - s["acc"]) / (s["mini"] + 1) if self.mean else s["acc"] + g
        if s["mini"] < k - 1:
            return np.zeros_like(g), {**s, "mini": s["mini"] + 1, "acc": acc}
        buf = self.m * s["buf"] + acc
        return -self.lr * buf, {
            "mini": 0,
            "gstep": s["gstep"] + 1,
            "buf": buf,
            "acc": np.zeros_like(acc),
        }


def _check(opt, ref, grads, shape=(3,)):
    params = {"w": nx.zeros(shape)}
    state, rs = opt.init(params), ref.init(shape)
    for i, g in enumerate(grads):
        u, state = opt.update({"w": nx.tensor(g)}, state, params)
        ru, rs = ref.update(g, rs)
        np.testing.assert_allclose(u["w"].numpy(), ru, rtol=1e-6, atol=1e-7, err_msg=f"step {i}")
        assert int(state.mini_step) == rs["mini"] and int(state.gradient_step) == rs["gstep"]
        np.testing.assert_allclose(state.acc_grads["w"].numpy(), rs["acc"], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(
            state.inner_opt_state[0].trace["w"].numpy(), rs["buf"], rtol=1e-6
        )
        assert bool(opt.has_updated(state)) == (rs["mini"] == 0 and rs["gstep"] > 0)


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("use_grad_mean", [True, False])
def test_matches_optax_semantics(k, use_grad_mean):
    opt = optim.MultiSteps(optim.sgd(0.1, momentum=0.9), k, use_grad_mean=use_grad_mean)
    ref = OptaxMultiStepsRef(lambda step: k, use_grad_mean=use_grad_mean)
    _check(opt, ref, _grads(8))


def test_every_k_schedule_is_called_with_the_gradient_step():
    seen = []

    def every_k(step):
        seen.append(step.dtype)
        return nx.where(step < 2, 2, 3)  # k = 2 for the first two applied updates, then 3

    opt = optim.MultiSteps(optim.sgd(0.1, momentum=0.9), every_k)
    _check(opt, OptaxMultiStepsRef(lambda s: 2 if s < 2 else 3), _grads(11, seed=1))
    assert set(seen) == {nx.int32}


def test_should_skip_update_fn_as_optax():
    def skip_not_finite(updates, gradient_step, params):
        finite = nx.all(nx.isfinite(updates["w"]))
        return nx.logical_not(finite), ()

    grads = _grads(7, seed=2)
    grads[2] = np.array([np.nan, 1.0, 2.0], np.float32)
    grads[5] = np.array([np.inf, 0.0, 0.0], np.float32)
    opt = optim.MultiSteps(optim.sgd(0.1, momentum=0.9), 2, should_skip_update_fn=skip_not_finite)
    ref = OptaxMultiStepsRef(lambda s: 2, skip=lambda g: not np.isfinite(g).all())
    _check(opt, ref, grads)


def test_adam_accumulation_matches_torch():
    torch = pytest.importorskip("torch")
    k, steps = 3, 9
    w0 = np.random.default_rng(3).standard_normal((4,)).astype(np.float32)
    xs = np.random.default_rng(4).standard_normal((steps, 5, 4)).astype(np.float32)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.Adam([tw], lr=0.05)
    for i in range(steps):
        ((torch.tensor(xs[i]) @ tw) ** 2).mean().div(k).backward()  # torch: mean via loss / k
        if (i + 1) % k == 0:
            topt.step()
            topt.zero_grad()
    opt = optim.MultiSteps(optim.adam(0.05), k)
    params = {"w": nx.tensor(w0)}
    state = opt.init(params)
    for i in range(steps):
        g = nx.grad(lambda p, x=xs[i]: ((nx.tensor(x) @ p["w"]) ** 2).mean())(params)
        updates, state = opt.update(g, state, params)
        params = optim.apply_updates(params, updates)
    np.testing.assert_allclose(params["w"].numpy(), tw.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_compiled_and_eager_steps_build_one_program():
    opt = optim.MultiSteps(optim.adam(0.01), 4)
    grads = _grads(9, (2, 3), seed=5)

    @nx.compile
    def step(params, state, g):
        updates, state = opt.update({"w": g}, state, params)
        return optim.apply_updates(params, updates), state

    params = {"w": nx.ones((2, 3))}
    state = opt.init(params)
    eager_p, eager_s = params, opt.init(params)
    nx.clear_caches()
    for g in grads:
        params, state = step(params, state, nx.tensor(g))
        u, eager_s = opt.update({"w": nx.tensor(g)}, eager_s, eager_p)
        eager_p = optim.apply_updates(eager_p, u)
        eager_p["w"].numpy()
    assert step.cache_info().traces == 1
    assert nx.cache_info().compiles <= 3  # the eager step: one structure, whatever the position
    np.testing.assert_allclose(params["w"].numpy(), eager_p["w"].numpy(), rtol=1e-6)
    assert int(state.gradient_step) == 2 and int(state.mini_step) == 1


def test_vmap_over_independent_problems():
    opt = optim.MultiSteps(optim.sgd(0.5), 2)
    gs = np.stack(_grads(2, (4, 3), seed=6))  # two steps of a batch of 4 problems

    def two_steps(g0, g1):
        p = {"w": nx.zeros(3)}
        s = opt.init(p)
        _, s = opt.update({"w": g0}, s, p)
        u, s = opt.update({"w": g1}, s, p)
        return u["w"]

    out = nx.vmap(two_steps)(nx.tensor(gs[0]), nx.tensor(gs[1]))
    np.testing.assert_allclose(out.numpy(), -0.5 * (gs[0] + gs[1]) / 2, rtol=1e-6)


def test_state_is_a_pytree_that_saves(tmp_path):
    opt = optim.MultiSteps(optim.adam(0.1), 2)
    params = {"w": nx.ones(2), "b": None}
    state = opt.init(params)
    _, state = opt.update({"w": nx.ones(2), "b": None}, state, params)
    assert isinstance(state, optim.MultiStepsState) and state.skip_state == ()
    assert len(nx.tree.leaves(state)) == 2 + 3 + 1  # counters, adam's (count, mu, nu), acc
    nx.save(tmp_path / "s.safetensors", state)
    back = nx.load(tmp_path / "s.safetensors", like=state)
    assert int(back.mini_step) == 1
    np.testing.assert_array_equal(back.acc_grads["w"].numpy(), state.acc_grads["w"].numpy())
    chained = optim.chain(optim.clip_by_global_norm(1.0), opt.gradient_transformation())
    s2 = chained.init(params)
    u, s2 = chained.update({"w": nx.ones(2), "b": None}, s2, params)
    assert u["w"].tolist() == [0.0, 0.0]


def test_errors_name_multisteps():
    with pytest.raises(ValueError, match="optim.MultiSteps: every_k_schedule=0"):
        optim.MultiSteps(optim.sgd(0.1), 0)
    with pytest.raises(TypeError, match="optim.MultiSteps: opt is a str"):
        optim.MultiSteps("adam", 2)
    opt = optim.MultiSteps(optim.sgd(0.1), 2)
    with pytest.raises(TypeError, match="optim.MultiSteps: update: state is a dict"):
        opt.update({"w": nx.ones(2)}, {}, None)
    with pytest.raises(ValueError, match="optim.MultiSteps"):
        opt.update({"v": nx.ones(2)}, opt.init({"w": nx.ones(2)}))

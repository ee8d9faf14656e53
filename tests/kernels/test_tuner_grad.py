"""Training calls are tuned on forward plus backward (API §6: "a training call is tuned on forward
plus backward"): a ``tune_grad`` kernel called under ``jax.grad`` times ``jax.vjp`` of its
custom-VJP call, so a config with a cheap forward and an expensive backward loses there while it
wins a forward-only tuning; the two choices are cached under separate keys."""

from __future__ import annotations

import dataclasses
import importlib
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Invocation,
    Kernel,
    Tuner,
    library,
)
from nablax.kernels.store.fingerprint import device_fingerprint
from nablax.kernels.tuner import tuning_key, wants_grad

attn_mod = importlib.import_module("nablax.kernels.library.attention")


@dataclasses.dataclass(frozen=True)
class Split:
    fwd: int  # matmul steps in the forward pass
    bwd: int  # matmul steps in the backward pass


def _steps(x, n: int):
    return jax.lax.fori_loop(0, n, lambda _, y: jnp.tanh(y @ y), x)


class SlowBackward(Kernel):
    """A kernel whose configs trade forward time against backward time."""

    tune_grad = True

    def run(self, x, *, cfg):
        return _steps(x, cfg.fwd)

    def fwd_with_residuals(self, x, *, cfg):
        return self.run(x, cfg=cfg), None

    def vjp(self, res, y, dy, x, *, cfg):
        return (_steps(dy, cfg.bwd),)

    def candidate_cfgs(self, inv):
        return [CHEAP_FWD, CHEAP_BWD]


# margins of about 100x (1 vs 200 and 2000 vs 1 steps of a 128x128 matmul, milliseconds apart):
# robust to the few-ms preemptions of a loaded 2-core machine (40x, 1 ms apart, were not)
CHEAP_FWD, CHEAP_BWD = Split(1, 2000), Split(200, 1)


def _x():
    return jnp.asarray(np.random.default_rng(0).standard_normal((128, 128)) / 16, jnp.float32)


class RecordingTuner(Tuner):
    """Keeps every TuneResult (the chain calls ``tune``)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.results = []

    def tune(self, *a, **kw):
        result = super().tune(*a, **kw)
        self.results.append(result)
        return result


def test_tune_times_forward_plus_backward_when_asked():
    k = SlowBackward("slow_backward")
    inv = Invocation(k.versioned_id, (_x(),), {})
    tuner = Tuner(warmup=1, iters=5, progress=False)
    fwd = tuner.tune(k, inv, [CHEAP_FWD, CHEAP_BWD], min_gain=0, grad=False)
    both = tuner.tune(k, inv, [CHEAP_FWD, CHEAP_BWD], min_gain=0, grad=True)
    assert (fwd.best, fwd.objective) == (CHEAP_FWD, "forward")
    assert (both.best, both.objective) == (CHEAP_BWD, "forward+backward")
    assert all(math.isfinite(t.median_s) for t in both.timings)


def test_a_call_under_jax_grad_is_tuned_on_forward_plus_backward_under_its_own_key():
    k = SlowBackward("slow_backward_chain")
    tuner = RecordingTuner(warmup=1, iters=5, progress=False)
    chain = ConfigSelectorChain(
        ConfigCache(), AutotunePolicy(min_gain=0), tuner=tuner, persistent=False
    )
    x = _x()
    seen = []

    def loss(x):
        inv = Invocation(k.versioned_id, (x,), {})
        seen.append((wants_grad(k, inv), tuning_key(k, inv), inv.call_key))
        return Executor(chain)(k, x).sum()

    jax.grad(loss)(x)
    grad_wanted, key, call_key = seen[0]
    assert grad_wanted and key == call_key + ":fwd+bwd"
    assert tuner.results[-1].objective == "forward+backward"
    assert chain.cache.get(device_fingerprint(), k.versioned_id, key) == CHEAP_BWD
    # the same shapes called for inference: tuned on the forward alone, under the plain key
    Executor(chain)(k, x)
    assert tuner.results[-1].objective == "forward"
    assert chain.cache.get(device_fingerprint(), k.versioned_id, call_key) == CHEAP_FWD
    assert not wants_grad(library.MATMUL, Invocation("matmul@v1", (x, x), {}))


@pytest.fixture
def interpret(monkeypatch):
    monkeypatch.setattr(attn_mod, "INTERPRET", True)


def test_attention_training_call_tunes_every_impl_on_forward_plus_backward(interpret):
    """Every CPU candidate of the bundled attention (blocked tiles, XLA, Pallas in interpret
    mode) compiles and times forward plus backward; the tuned call's gradient is right."""
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(rng.standard_normal((1, 24, 2, 8)), jnp.float32) for _ in range(3))
    inv = Invocation(library.ATTENTION.versioned_id, (q, k, v), {"causal": True})
    cands = library.ATTENTION.candidate_cfgs(inv)
    assert {c.impl for c in cands} == {None, "xla", "pallas"}
    result = Tuner(warmup=1, iters=2, progress=False).tune(
        library.ATTENTION, inv, cands, min_gain=0, grad=True
    )
    assert result.objective == "forward+backward"
    bad = [(t.cfg, t.error) for t in result.timings if not math.isfinite(t.median_s)]
    assert not bad, bad
    f = lambda q: library.attention(q, k, v, causal=True, cfg=result.best).sum()  # noqa: E731
    ref = lambda q: attn_mod.attention_reference(q, k, v, causal=True).sum()  # noqa: E731
    tol = 100 * (2.0**-10 if jax.default_backend() == "gpu" else float(jnp.finfo(q.dtype).eps))
    np.testing.assert_allclose(jax.grad(f)(q), jax.grad(ref)(q), rtol=tol, atol=tol)


def _chain(tuner):
    return ConfigSelectorChain(
        ConfigCache(), AutotunePolicy(min_gain=0), tuner=tuner, persistent=False
    )


def test_one_executor_keeps_a_training_and_an_inference_choice_for_one_shape():
    """The executor's memo of a call's config is keyed on whether the call is differentiated:
    an inference call after a training call of the same shapes is tuned (and runs) on its own."""
    k = SlowBackward("slow_backward_memo")
    tuner = RecordingTuner(warmup=1, iters=5, progress=False)
    ex = Executor(_chain(tuner))
    x = _x()
    jax.grad(lambda x: ex(k, x).sum())(x)
    assert [r.objective for r in tuner.results] == ["forward+backward"]
    ex(k, x)
    ex(k, x)  # memoized now: no third tuning
    assert [r.objective for r in tuner.results] == ["forward+backward", "forward"]


def test_nablax_tensors_under_nx_grad_are_a_training_call():
    """nx.grad of a kernel call on nablax Tensors is tuned on forward plus backward (core reports
    that its tensors are differentiated), an eager call on the same shapes on the forward alone;
    both gradients and values match JAX's."""
    import nablax as nx

    k = SlowBackward("slow_backward_tensors")
    tuner = RecordingTuner(warmup=1, iters=5, progress=False)
    ex = Executor(_chain(tuner))
    x = _x()
    g = nx.grad(lambda t: ex(k, t).sum())(nx.tensor(np.asarray(x)))
    assert [r.objective for r in tuner.results] == ["forward+backward"]
    want = jax.grad(lambda a: Executor(_chain(Tuner(progress=False)))(k, a, cfg=CHEAP_BWD).sum())
    np.testing.assert_allclose(g.numpy(), want(x), rtol=1e-5, atol=1e-6)
    y = ex(k, nx.tensor(np.asarray(x)))
    assert [r.objective for r in tuner.results] == ["forward+backward", "forward"]
    np.testing.assert_allclose(y.numpy(), _steps(x, CHEAP_FWD.fwd), rtol=1e-5, atol=1e-6)

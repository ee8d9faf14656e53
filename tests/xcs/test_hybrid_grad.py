"""xcs.grad: the engine follows the library the tensor code uses; in hybrids, orchestration calls
see real values and their results are constants (nablax/xcs/transforms.py, runtime.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import xcs

PROMPTS: list = []


@xcs.mark_orchestration
def judge(prompt):
    """A stand-in LLM judge: records what it was asked; the score depends on the text only."""
    assert not isinstance(prompt, jax.core.Tracer), "an orchestration call received a tracer"
    PROMPTS.append(prompt)
    return 0.5 + 0.1 * len(str(prompt))


@xcs.mark_orchestration
def norm_service(values):
    """Receives an array (a remote service would serialize it)."""
    assert isinstance(values, (np.ndarray, jax.Array)) and not isinstance(values, jax.core.Tracer)
    PROMPTS.append(("norm", np.asarray(values).tolist()))
    return float(np.linalg.norm(np.asarray(values)))


def describe(x):
    """A plain helper that formats a value (xcs.grad rewrites it too)."""
    return f"first={x[0]:.2f}"


@pytest.fixture(autouse=True)
def _clear():
    PROMPTS.clear()


def scored_loss(x):  # unmarked: classified hybrid (orchestration calls + jnp)
    w1 = judge(f"rate {x[1]:.3f} and {x!s}")
    w2 = norm_service(x)
    w3 = judge(describe(x)) + float(x[0]) + judge(str(x.sum()))
    return jnp.sum(jnp.sin(x) * x) * w1 + w2 * jnp.sum(x**2) + w3 * x[0]


def test_jax_hybrid_uses_jax_grad_with_real_values_in_orchestration():
    assert xcs.classify(scored_loss).kind == "hybrid"
    x = jnp.array([0.3, 1.7, -0.4])
    scored_loss(x)  # plain Python: what every call should receive
    plain = list(PROMPTS)
    PROMPTS.clear()

    g = xcs.grad(scored_loss)(x)
    assert isinstance(g, jax.Array)
    assert [str(p) for p in PROMPTS] == [str(p) for p in plain]  # same calls, once each
    w1, w2 = judge(plain[0]), norm_service(np.asarray(x))
    w3 = judge(plain[2]) + float(x[0]) + judge(plain[3])

    def constants_loss(v):  # the orchestration results, frozen: the reference gradient
        return jnp.sum(jnp.sin(v) * v) * w1 + w2 * jnp.sum(v**2) + w3 * v[0]

    np.testing.assert_allclose(g, jax.grad(constants_loss)(x), rtol=1e-5)


def test_marked_hybrid_with_aux_keeps_non_array_payloads():
    @xcs.mark_hybrid
    def loss(x):
        answer = judge(f"{x.shape[0]} items, mean {jnp.mean(x):.1f}")
        return jnp.sum(x**3), {"answer": answer, "tokens": [1, 2]}

    x = jnp.array([1.0, 2.0])
    g, aux = xcs.grad(loss, has_aux=True)(x)
    np.testing.assert_allclose(g, 3 * x**2)
    assert PROMPTS == ["2 items, mean 1.5"] and aux == {
        "answer": judge(PROMPTS[0]),
        "tokens": [1, 2],
    }


def test_nablax_hybrid_uses_nx_grad_and_converts_arrays():
    def loss(t):
        w = judge(f"weight for {t.shape}")  # nablax tensors are eager: real values already
        return nx.sum(nx.tanh(t) * w)

    t = nx.tensor([0.2, -1.0])
    g = xcs.grad(loss)(t)
    want = nx.grad(lambda v: nx.sum(nx.tanh(v) * judge("weight for (2,)")))(t)
    assert isinstance(g, nx.Tensor)
    np.testing.assert_allclose(g.numpy(), want.numpy(), rtol=1e-6)
    gj = xcs.grad(loss)(jnp.array([0.2, -1.0]))  # concrete jax arrays are converted both ways
    assert isinstance(gj, jax.Array)
    np.testing.assert_allclose(np.asarray(gj), want.numpy(), rtol=1e-6)

    def nx_code(v):  # tensor code, JAX-traceable, but nablax: nx.grad, not jax.grad
        return nx.sum(nx.exp(v) * 2.0)

    ge = xcs.grad(nx_code)(jnp.array([0.0, 1.0]))
    assert isinstance(ge, jax.Array)
    np.testing.assert_allclose(np.asarray(ge), 2.0 * np.exp([0.0, 1.0]), rtol=1e-6)


def test_silent_source_lets_the_arguments_choose(monkeypatch):
    used = []
    real = jax.grad
    monkeypatch.setattr(jax, "grad", lambda *a, **k: used.append(1) or real(*a, **k))

    @xcs.mark_tensor
    def energy(x):
        return (x * x * 0.5).sum()  # methods only: no library named in the source

    gj = xcs.grad(energy)(jnp.array([1.0, -2.0]))
    assert used == [1] and isinstance(gj, jax.Array) and gj.tolist() == [1.0, -2.0]
    gn = xcs.grad(energy)(nx.tensor([1.0, -2.0]))
    assert used == [1] and isinstance(gn, nx.Tensor) and gn.tolist() == [1.0, -2.0]

    def jnp_code(x):
        return jnp.sum(jnp.cos(x))

    gt = xcs.grad(jnp_code)(nx.tensor([0.5]))  # JAX code on a concrete nablax Tensor
    assert isinstance(gt, nx.Tensor)
    np.testing.assert_allclose(gt.numpy(), -np.sin([0.5]), rtol=1e-6)


def test_values_traced_by_the_other_library_raise_with_the_reason():
    def nx_code(t):
        return nx.sum(nx.exp(t))

    with pytest.raises(xcs.XCSError, match=r"chose nx\.grad .*uses nablax.*JAX tracer"):
        jax.jit(xcs.grad(nx_code))(jnp.ones(2))

    def jnp_code(x):
        return jnp.sum(jnp.exp(x))

    with pytest.raises(xcs.XCSError, match=r"chose jax\.grad .*uses JAX.*nablax transform"):
        nx.grad(lambda t: xcs.grad(jnp_code)(t).sum())(nx.tensor([1.0]))


def test_orchestration_inputs_unknown_under_jit_raise():
    def by_value(x):
        return jnp.sum(x) * norm_service(x)

    with pytest.raises(xcs.XCSError, match=r"norm_service with args\[0\].*jax\.jit"):
        jax.jit(xcs.grad(by_value))(jnp.ones(3))

    def by_text(x):
        return jnp.sum(x) * judge(f"{x[0]}")

    with pytest.raises(xcs.XCSError, match="a string formatted from a traced"):
        jax.jit(xcs.grad(by_text))(jnp.ones(3))

    def percent_format(x):  # %-formatting is not rewritten: the tracer's text is caught
        return jnp.sum(x) * judge("value %s" % (x,))  # noqa: UP031

    with pytest.raises(xcs.XCSError, match="holding a JAX tracer's text"):
        xcs.grad(percent_format)(jnp.ones(2))
    assert PROMPTS == []


def test_engine_errors_say_which_engine_and_why():
    bias = nx.tensor(1.0)

    def mixes(x):
        return jnp.sum(x) + bias  # a nablax Tensor captured by JAX code meets a tracer

    with pytest.raises(TypeError) as e:
        xcs.grad(mixes)(jnp.ones(2))
    notes = " ".join(e.value.__notes__)
    assert "mixes with jax.grad because its source uses both JAX and nablax" in notes

    def host(x):
        return np.sum(np.sin(x))

    with pytest.raises(xcs.XCSError, match="host code that neither jax.grad nor nx.grad"):
        xcs.grad(host)(np.ones(2))

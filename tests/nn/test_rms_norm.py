"""``nn.functional.rms_norm`` and ``nn.RMSNorm`` against PyTorch's: values in every float dtype
(PyTorch normalizes float16/bfloat16 in float32), default eps, gradients, and the module under
``nx.grad`` / ``nx.vmap`` / ``nx.compile``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn
from nablax.errors import DTypeError, ShapeError

torch = pytest.importorskip("torch")  # the references (a run without PyTorch skips)

TORCH = {nx.float32: torch.float32, nx.float16: torch.float16, nx.bfloat16: torch.bfloat16}


def _rand(shape, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def _ulp(dt) -> float:
    return float(jnp.finfo(dt).eps)


@pytest.mark.parametrize("dt", [nx.float32, nx.float16, nx.bfloat16])
@pytest.mark.parametrize("shape, norm", [((2, 5), (5,)), ((2, 3, 4), (3, 4)), ((6,), 6)])
@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_matches_torch(dt, shape, norm, eps):
    a = _rand(shape)
    w = _rand(norm if isinstance(norm, tuple) else (norm,), 1)
    ta = torch.tensor(a).to(TORCH[dt])
    for weight in (None, w):
        tw = None if weight is None else torch.tensor(weight).to(TORCH[dt])
        ref = torch.nn.functional.rms_norm(
            ta, norm if isinstance(norm, tuple) else (norm,), tw, eps
        )
        out = F.rms_norm(
            nx.tensor(a).astype(dt),
            norm,
            None if weight is None else nx.tensor(weight).astype(dt),
            eps,
        )
        assert out.dtype == dt
        tol = 4 * _ulp(
            dt
        )  # a few roundings: sums and rsqrt differ in order and precision by device
        np.testing.assert_allclose(
            out.astype(nx.float32).numpy(), ref.float().numpy(), rtol=tol, atol=tol
        )


def test_default_eps_is_the_float32_epsilon_as_torch():
    """A tiny input shows eps: PyTorch adds float32's epsilon even for half inputs (its docs say
    ``finfo(input.dtype).eps``; the kernel uses the computing type's)."""
    a = np.array([[1e-4, 2e-4, -1e-4, 3e-5]], np.float32)
    for dt in (nx.float32, nx.float16, nx.bfloat16):
        ref = torch.nn.functional.rms_norm(torch.tensor(a).to(TORCH[dt]), (4,)).float().numpy()
        out = F.rms_norm(nx.tensor(a).astype(dt), (4,)).astype(nx.float32).numpy()
        np.testing.assert_allclose(out, ref, rtol=4 * _ulp(dt), atol=4 * _ulp(dt))


def test_mixed_weight_dtype_keeps_the_input_dtype_as_torch():
    a, w = _rand((3, 4)), _rand((4,), 1)
    ref = torch.nn.functional.rms_norm(torch.tensor(a).bfloat16(), (4,), torch.tensor(w))
    out = F.rms_norm(nx.tensor(a).astype(nx.bfloat16), (4,), nx.tensor(w))
    assert out.dtype == nx.bfloat16 and ref.dtype == torch.bfloat16
    np.testing.assert_array_equal(out.astype(nx.float32).numpy(), ref.float().numpy())


def test_rms_norm_gradients_match_torch():
    a, w, g = _rand((3, 5)), _rand((5,), 1), _rand((3, 5), 2)
    ta = torch.tensor(a, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    (torch.nn.functional.rms_norm(ta, (5,), tw, 1e-5) * torch.tensor(g)).sum().backward()
    gx, gw = nx.grad(
        lambda x, w: (F.rms_norm(x, (5,), w, 1e-5) * nx.tensor(g)).sum(), argnums=(0, 1)
    )(nx.tensor(a), nx.tensor(w))
    np.testing.assert_allclose(gx.numpy(), ta.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw.numpy(), tw.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_rms_norm_module_matches_torch_module():
    m = nn.RMSNorm((2, 3), eps=1e-4)
    tm = torch.nn.RMSNorm((2, 3), eps=1e-4)
    assert m.weight.shape == tuple(tm.weight.shape) and m.weight.dtype == nx.float32
    np.testing.assert_array_equal(m.weight.numpy(), tm.weight.detach().numpy())
    a = _rand((4, 2, 3))
    np.testing.assert_allclose(
        m(nx.tensor(a)).numpy(), tm(torch.tensor(a)).detach().numpy(), rtol=1e-6, atol=1e-6
    )
    assert nn.RMSNorm(3, elementwise_affine=False).weight is None
    assert nn.RMSNorm(3).eps is None and torch.nn.RMSNorm(3).eps is None
    assert nn.RMSNorm(3, dtype=nx.bfloat16).weight.dtype == nx.bfloat16


def test_rms_norm_module_under_grad_vmap_and_compile():
    m = nn.RMSNorm(4)
    a = _rand((5, 4))
    g = nx.grad(lambda m, x: m(x).sum())(m, nx.tensor(a))
    assert type(g) is nn.RMSNorm and g.weight.shape == (4,)
    tm = torch.nn.RMSNorm(4)
    tm(torch.tensor(a)).sum().backward()
    np.testing.assert_allclose(g.weight.numpy(), tm.weight.grad.numpy(), rtol=1e-5, atol=1e-6)
    v = nx.vmap(m)(nx.tensor(a))
    np.testing.assert_allclose(v.numpy(), m(nx.tensor(a)).numpy(), rtol=1e-6, atol=1e-7)
    step = nx.compile(lambda m, x: m(x))
    np.testing.assert_allclose(step(m, nx.tensor(a)).numpy(), v.numpy(), rtol=1e-6, atol=1e-7)
    step(m, nx.tensor(a))
    assert step.cache_info().traces == 1


def test_rms_norm_errors():
    with pytest.raises(ShapeError, match="rms_norm: input \\(2, 3\\) does not end with"):
        F.rms_norm(nx.ones((2, 3)), (4,))
    with pytest.raises(DTypeError, match="rms_norm: needs a float tensor"):
        F.rms_norm(nx.ones((2, 3), dtype=nx.int32), (3,))
    with pytest.raises(ShapeError, match="rms_norm: weight has shape"):
        F.rms_norm(nx.ones((2, 3)), (3,), nx.ones(2))
    with pytest.raises(ValueError, match="nn.RMSNorm: normalized_shape=0"):
        nn.RMSNorm(0)


def test_float32_rms_norm_is_one_node_equal_to_the_separate_ops():
    """float32 with a float32 weight of the normalized shape: one ``rms_norm`` node, equal to the
    separate ops (as float16 keeps them) and to PyTorch."""
    from nablax.core.graph import toposort

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal(6).astype(np.float32)
    y = F.rms_norm(nx.tensor(x), (6,), nx.tensor(w), eps=1e-6)
    assert [n.prim.name for n in toposort([y._impl.src[0]])] == ["rms_norm"]
    u = nx.tensor(x)
    sep = u * nx.rsqrt((u * u).mean(axis=-1, keepdims=True) + 1e-6) * nx.tensor(w)
    np.testing.assert_allclose(y.numpy(), sep.numpy(), rtol=1e-6, atol=1e-6)
    ref = torch.nn.functional.rms_norm(torch.tensor(x), (6,), torch.tensor(w), eps=1e-6)
    np.testing.assert_allclose(y.numpy(), ref.numpy(), rtol=1e-5, atol=1e-6)
    # a bfloat16 weight on float32 input keeps the separate ops (and their promotion)
    y2 = F.rms_norm(nx.tensor(x), (6,), nx.tensor(w).astype(nx.bfloat16), eps=1e-6)
    assert "rms_norm" not in [n.prim.name for n in toposort([y2._impl.src[0]])]
    assert y2.dtype == nx.float32

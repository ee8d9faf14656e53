"""The two primitives that exist only inside ``nx.compile`` traces, so no eager OpSpec can build
them (tests/core/op_specs.py names them in ``STAGING_ONLY``): ``compile_input`` (a placeholder for
an argument, never lowered) and ``dimension_value`` (a symbolic size used as a value, with
``dynamic_dims``). Their shape rules, lowerings and derivatives are checked here against JAX."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.primitive import REGISTRY
from nablax.errors import GraphBreakError


def test_compile_input_shape_rule_and_no_lowering():
    p = REGISTRY["compile_input"]
    params = ((2, 3), np.dtype(np.float32), 0)
    assert p.abstract_eval(params) == (((2, 3), np.dtype(np.float32)),)
    with pytest.raises(GraphBreakError, match="placeholder"):
        p.lower(params)
    with pytest.raises(GraphBreakError, match="placeholder"):
        p.batch(params, ())
    assert p.jvp(params, [], [], [None]) == [None] and p.vjp(params, [None], [], [None]) == []


def test_placeholders_carry_gradients_through_compile_like_jax():
    """A compiled function's arguments are placeholders: differentiating through them (the
    marker on top carries the derivative, the placeholder's own is zero) matches ``jax.grad``."""

    def f(w, x):
        return (nx.tanh(x @ w) ** 2).sum()

    def f_ref(w, x):
        return (jnp.tanh(x @ w) ** 2).sum()

    rng = np.random.default_rng(0)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    x = rng.standard_normal((5, 4)).astype(np.float32)
    got = nx.compile(nx.grad(f))(nx.tensor(w), nx.tensor(x)).numpy()
    np.testing.assert_allclose(got, jax.grad(f_ref)(w, x), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.float32])
def test_dimension_value_shape_rule_matches_lowering(dtype):
    p = REGISTRY["dimension_value"]
    (n,) = jax.export.symbolic_shape("n")
    params = (n, np.dtype(dtype))
    ((shape, dt),) = p.abstract_eval(params)
    # the lowering traced with a symbolic size, as nx.compile's dynamic_dims lowers it
    out = jax.eval_shape(
        lambda a: p.lower((a.shape[0], np.dtype(dtype))), jax.ShapeDtypeStruct((n,), np.float32)
    )
    assert (shape, dt) == (tuple(out.shape), np.dtype(out.dtype))
    assert p.lower((7, np.dtype(dtype))).item() == 7
    assert p.batch((7, np.dtype(dtype)), ()).item() == 7


def test_dimension_value_in_a_compiled_mean_matches_numpy_for_every_size():
    f = nx.compile(lambda x: x.sum(0) / x.shape[0], dynamic_dims={0: {0: "n"}})
    rng = np.random.default_rng(1)
    for n in (2, 5, 9):
        x = rng.standard_normal((n, 3)).astype(np.float32)
        np.testing.assert_allclose(f(nx.tensor(x)).numpy(), x.mean(0), rtol=1e-6, atol=1e-7)
    assert f.cache_info().traces == 1
    # its derivative is zero: the gradient of the mean is 1/n per element, as jax.grad gives
    g = nx.compile(nx.grad(lambda x: (x.sum(0) / x.shape[0]).sum()), dynamic_dims={0: {0: "n"}})
    x = rng.standard_normal((4, 3)).astype(np.float32)
    want = jax.grad(lambda v: (v.sum(0) / v.shape[0]).sum())(x)
    np.testing.assert_allclose(g(nx.tensor(x)).numpy(), want, rtol=1e-6)

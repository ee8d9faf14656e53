"""JAX 0.10 through 0.12 (API.md §6): the pins give Python 3.11 JAX 0.10 and Python 3.12+ the
newest, ``nablax[cuda]`` installs JAX's CUDA build, and where JAX's own results changed between
those releases nablax gives the installed JAX's (arccosh's derivative below -1)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

ROOT = Path(__file__).resolve().parents[2]


def _version(text: str) -> tuple[int, int]:
    major, minor = text.split(".")[:2]
    return int(major), int(minor)


def test_installed_jax_is_supported():
    assert (0, 10) <= _version(jax.__version__) < (0, 13), jax.__version__


def test_pins_by_python_version_and_the_cuda_extra():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    jax_pins = [d for d in meta["dependencies"] if d.startswith("jax[cpu]")]
    assert sorted(jax_pins) == [
        "jax[cpu]>=0.10,<0.11,!=0.10.2; python_version<'3.12'",
        "jax[cpu]>=0.10,<0.13,!=0.10.2; python_version>='3.12'",
    ]
    # jaxlib 0.10.2's CPU backend crashes and miscomputes (tests/core/test_jaxlib_bugs.py)
    assert "jaxlib!=0.10.2" in meta["dependencies"]
    extras = meta["optional-dependencies"]
    assert sorted(extras["cuda"]) == [
        "jax[cuda12]>=0.10,<0.11,!=0.10.2; python_version<'3.12'",
        "jax[cuda12]>=0.10,<0.13,!=0.10.2; python_version>='3.12'",
    ]
    # the test extra installs on 3.12 without PyTorch's multi-GB CUDA wheel
    torch = [d for d in extras["test"] if d.startswith("torch")]
    assert torch == ["torch==2.13.0; python_version<'3.12'"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_arccosh_derivative_is_the_installed_jax_one(dtype):
    """JAX 0.10's slope is rsqrt(x*x - 1) (finite below -1, where the value is NaN; inf at -1),
    newer JAX's rsqrt(x - 1) * rsqrt(x + 1) (NaN below -1 and at -1). nablax follows the installed
    JAX (it gave 0.577 at -2 with JAX 0.12, whose slope there is NaN)."""
    if dtype == np.float64 and not jax.config.jax_enable_x64:
        pytest.skip("float64 needs jax_enable_x64")
    xs = np.array([-7.0, -2.0, -1.0, -0.5, 0.5, 1.0, 1.5, 7.0, np.inf], dtype)
    want = np.asarray(jax.vmap(jax.grad(jnp.arccosh))(jnp.asarray(xs)))
    got = nx.vmap(nx.grad(nx.arccosh))(nx.tensor(xs)).numpy()
    np.testing.assert_array_equal(got, want)  # NaN and inf in the same places, equal elsewhere
    # the same through a jvp and a reverse pass over a vector (one node, no vmap)
    _, tangent = nx.jvp(nx.arccosh, (nx.tensor(xs),), (nx.ones(xs.shape, dtype),))
    np.testing.assert_allclose(tangent.numpy(), want, rtol=1e-6)
    grad = nx.grad(lambda x: nx.arccosh(x).sum())(nx.tensor(xs[xs >= 1]))
    np.testing.assert_allclose(grad.numpy(), want[xs >= 1], rtol=1e-6)

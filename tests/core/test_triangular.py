"""``nx.triu``/``nx.tril``, ``Tensor.masked_fill``, ``nx.hann_window`` and ``nx.minmax`` against
PyTorch and NumPy: values, gradients, and under ``nx.vmap`` / ``nx.compile``."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import torch
except ImportError:  # no PyTorch (the Python 3.12 run installs none): only its comparisons skip
    torch = None

import nablax as nx
from nablax.errors import DTypeError

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@needs_torch
@pytest.mark.parametrize("fn", ["triu", "tril"])
@pytest.mark.parametrize("k", [-2, -1, 0, 1, 3])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (5, 2), (2, 3, 4)])
def test_triangles_match_torch(fn, k, shape):
    a = _rand(shape)
    ref = getattr(torch, fn)(torch.tensor(a), k).numpy()
    np.testing.assert_array_equal(getattr(nx, fn)(nx.tensor(a), k).numpy(), ref)
    np.testing.assert_array_equal(getattr(nx.tensor(a), fn)(k=k).numpy(), ref)


@pytest.mark.parametrize("fn", ["triu", "tril"])
def test_triangles_of_ints_bools_and_vectors_match_numpy(fn):
    i = np.arange(12, dtype=np.int32).reshape(3, 4)
    b = i % 3 == 0
    np.testing.assert_array_equal(getattr(nx, fn)(nx.tensor(i), 1).numpy(), getattr(np, fn)(i, 1))
    out = getattr(nx, fn)(nx.tensor(b))
    assert out.dtype == nx.bool_
    np.testing.assert_array_equal(out.numpy(), getattr(np, fn)(b))
    v = np.arange(1.0, 4.0, dtype=np.float32)  # NumPy: a vector is the rows of a square matrix
    np.testing.assert_array_equal(getattr(nx, fn)(nx.tensor(v)).numpy(), getattr(np, fn)(v))
    nan = np.full((2, 2), np.nan, np.float32)  # zeroed, not multiplied by 0
    np.testing.assert_array_equal(getattr(nx, fn)(nx.tensor(nan)).numpy(), getattr(np, fn)(nan))


def test_triangle_errors_name_the_function():
    with pytest.raises(ValueError, match="triu"):
        nx.triu(nx.tensor(1.0))
    with pytest.raises(TypeError, match="tril: k must be an int"):
        nx.tril(nx.ones((2, 2)), 0.5)


@needs_torch
@pytest.mark.parametrize("fn", ["triu", "tril"])
def test_triangle_gradient_vmap_and_compile(fn):
    a, w = _rand((3, 4)), _rand((3, 4), 1)
    ta = torch.tensor(a, requires_grad=True)
    (getattr(torch, fn)(ta, 1) * torch.tensor(w)).sum().backward()
    g = nx.grad(lambda x: (getattr(nx, fn)(x, 1) * nx.tensor(w)).sum())(nx.tensor(a))
    np.testing.assert_array_equal(g.numpy(), ta.grad.numpy())
    batch = _rand((5, 3, 4), 2)
    out = nx.vmap(lambda x: getattr(nx, fn)(x, -1))(nx.tensor(batch))
    np.testing.assert_array_equal(out.numpy(), getattr(np, fn)(batch, -1))
    f = nx.compile(lambda x, k: getattr(nx, fn)(x, k), static_argnums=(1,))
    np.testing.assert_array_equal(f(nx.tensor(a), 2).numpy(), getattr(np, fn)(a, 2))


def test_diagonal_offset_is_a_runtime_value():
    """Eager calls that differ only in ``k`` share compiled programs (API.md §1)."""
    x = nx.tensor(_rand((4, 4)))
    nx.clear_caches()
    for k in range(1, 6):
        nx.triu(x, k).numpy()
    assert nx.cache_info().compiles <= 2


@needs_torch
def test_masked_fill_matches_torch():
    a = _rand((2, 3))
    m = np.array([True, False, True])
    for value in (-1.5, 0, 7):
        ref = torch.tensor(a).masked_fill(torch.tensor(m), value).numpy()
        np.testing.assert_array_equal(nx.tensor(a).masked_fill(nx.tensor(m), value).numpy(), ref)
    # the mask broadcasts the input too; a 0-d tensor value; the result keeps the input's dtype
    m2 = np.array([[True], [False]])
    ref = torch.zeros(3).masked_fill(torch.tensor(m2), torch.tensor(2.5)).numpy()
    out = nx.zeros(3).masked_fill(nx.tensor(m2), nx.tensor(2.5))
    np.testing.assert_array_equal(out.numpy(), ref)
    i = np.array([1, 2, 3, 2**30 + 1], np.int32)  # ints never pass through float32
    mi = np.array([True, False, True, False])
    for value in (1.7, -1.7, 5):
        ref = torch.tensor(i).masked_fill(torch.tensor(mi), value).numpy()
        out = nx.tensor(i).masked_fill(nx.tensor(mi), value)
        assert out.dtype == nx.int32
        np.testing.assert_array_equal(out.numpy(), ref)
    out = nx.zeros(2, dtype=nx.bfloat16).masked_fill(nx.tensor([True, False]), nx.tensor(2.5))
    assert out.dtype == nx.bfloat16 and out.astype(nx.float32).tolist() == [2.5, 0.0]
    b = nx.tensor([False, False]).masked_fill(nx.tensor([True, False]), 2)
    assert b.dtype == nx.bool_ and b.tolist() == [True, False]


def test_masked_fill_errors():
    with pytest.raises(DTypeError, match="masked_fill: mask must be a bool tensor"):
        nx.ones(3).masked_fill(nx.ones(3), 0.0)
    with pytest.raises(ValueError, match="masked_fill: value must be a scalar or a 0-d"):
        nx.ones(3).masked_fill(nx.ones(3) > 0, nx.ones(3))


@needs_torch
def test_masked_fill_gradients_match_torch():
    a, w = _rand((2, 3)), _rand((2, 3), 1)
    m = np.array([[True, False, False], [False, True, True]])
    ta = torch.tensor(a, requires_grad=True)
    tv = torch.tensor(0.5, requires_grad=True)
    (ta.masked_fill(torch.tensor(m), tv) * torch.tensor(w)).sum().backward()
    gx, gv = nx.grad(
        lambda x, v: (x.masked_fill(nx.tensor(m), v) * nx.tensor(w)).sum(), argnums=(0, 1)
    )(nx.tensor(a), nx.tensor(0.5))
    np.testing.assert_allclose(gx.numpy(), ta.grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(gv.numpy(), tv.grad.numpy(), rtol=1e-6)


def test_masked_fill_under_vmap_and_compile():
    a = _rand((4, 3))
    m = a > 0
    out = nx.vmap(lambda x, mm: x.masked_fill(mm, -9.0))(nx.tensor(a), nx.tensor(m))
    np.testing.assert_array_equal(out.numpy(), np.where(m, -9.0, a))
    f = nx.compile(lambda x, v: x.masked_fill(x > 0, v))
    np.testing.assert_array_equal(f(nx.tensor(a), 1.0).numpy(), np.where(m, 1.0, a))
    np.testing.assert_array_equal(f(nx.tensor(a), 2.0).numpy(), np.where(m, 2.0, a))


@needs_torch
@pytest.mark.parametrize("n", [0, 1, 2, 5, 16])
@pytest.mark.parametrize("periodic", [True, False])
def test_hann_window_matches_torch(n, periodic):
    ref = torch.hann_window(n, periodic=periodic, dtype=torch.float64).numpy()
    out = nx.hann_window(n, periodic=periodic)
    assert out.dtype == nx.float32 and out.shape == (n,)
    np.testing.assert_allclose(out.numpy(), ref, rtol=0, atol=float(np.finfo(np.float32).eps))
    assert nx.hann_window(n, dtype=nx.bfloat16).dtype == nx.bfloat16


def test_hann_window_errors():
    with pytest.raises(ValueError, match="hann_window: window_length must be >= 0"):
        nx.hann_window(-1)
    with pytest.raises(DTypeError, match="hann_window: dtype must be a float dtype"):
        nx.hann_window(3, dtype=nx.int32)


def test_minmax_values_gradient_and_vmap():
    a = _rand((3, 4))
    r = nx.minmax(nx.tensor(a))
    assert set(r) == {"min", "max"} and r["min"].shape == ()
    assert (r["min"].item(), r["max"].item()) == (a.min(), a.max())
    g = nx.grad(lambda x: nx.minmax(x)["max"] - nx.minmax(x)["min"])(nx.tensor(a))
    expected = (a == a.max()).astype(np.float32) - (a == a.min()).astype(np.float32)
    np.testing.assert_array_equal(g.numpy(), expected)
    v = nx.vmap(nx.minmax)(nx.tensor(a))
    np.testing.assert_array_equal(v["min"].numpy(), a.min(axis=1))
    np.testing.assert_array_equal(v["max"].numpy(), a.max(axis=1))
    with pytest.raises(ValueError, match="minmax: the input is empty"):
        nx.minmax(nx.zeros((0, 2)))

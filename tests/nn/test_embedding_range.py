"""``F.embedding`` / ``nn.Embedding`` never read another row for an id outside ``[0, num)``
(it clamped: id 5 of 3 rows silently returned row 2; PyTorch raises)."""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn

W = np.arange(12.0, dtype=np.float32).reshape(4, 3)


@pytest.mark.parametrize("bad", [4, 5, 100, -1, -4, -5])
def test_out_of_range_ids_give_nan_rows(bad):
    out = F.embedding(nx.tensor([1, bad]), nx.tensor(W)).numpy()
    np.testing.assert_array_equal(out[0], W[1])
    assert np.isnan(out[1]).all()


def test_in_range_ids_and_gradients_unchanged():
    ids = nx.tensor([[0, 3], [2, 2]])
    np.testing.assert_array_equal(F.embedding(ids, nx.tensor(W)).numpy(), W[[[0, 3], [2, 2]]])
    g = nx.grad(lambda w: F.embedding(ids, w).sum())(nx.tensor(W)).numpy()
    np.testing.assert_array_equal(g, np.array([[1] * 3, [0] * 3, [2] * 3, [1] * 3], np.float32))


def test_gradient_skips_out_of_range_rows():
    def f(w):
        e = F.embedding(nx.tensor([7, 1]), w)
        return nx.where(nx.isnan(e), 0.0, e).sum()

    g = nx.grad(f)(nx.tensor(W))
    np.testing.assert_array_equal(g.numpy()[1], np.ones(3, np.float32))
    assert np.isfinite(g.numpy()).all() and g.numpy().sum() == 3


def test_module_and_compile_agree():
    emb = nn.Embedding(4, 3, key=nx.random.key(0))
    ids = nx.tensor([3, 4, -1], dtype=nx.int32)
    eager = emb(ids).numpy()
    compiled = nx.compile(lambda m, i: m(i))(emb, ids).numpy()
    np.testing.assert_array_equal(np.isnan(eager), np.isnan(compiled))
    assert np.isnan(eager[1:]).all() and np.isfinite(eager[0]).all()


def test_unsigned_ids():
    out = F.embedding(nx.tensor(np.array([3, 9], np.uint8)), nx.tensor(W)).numpy()
    np.testing.assert_array_equal(out[0], W[3])
    assert np.isnan(out[1]).all()


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int32])
def test_negative_ids_of_narrow_ints_never_read_a_row_of_a_large_table(dtype):
    """A negative id becomes an unsigned index of 32 bits (2**31 or more): with a table of more
    rows than a narrow int's unsigned range (-1 as uint8 would be row 255), still a NaN row, and
    its gradient reaches no row."""
    big = np.arange(300 * 2, dtype=np.float32).reshape(300, 2)
    ids = nx.tensor(np.array([-1, 5, -128, 127], dtype))
    out = F.embedding(ids, nx.tensor(big)).numpy()
    assert np.isnan(out[[0, 2]]).all()
    np.testing.assert_array_equal(out[[1, 3]], big[[5, 127]])

    def f(w):
        e = F.embedding(ids, w)
        return nx.where(nx.isnan(e), 0.0, e * e).sum()

    g = nx.grad(f)(nx.tensor(big)).numpy()
    want = np.zeros_like(big)
    want[[5, 127]] = 2 * big[[5, 127]]
    np.testing.assert_array_equal(g, want)

"""Audit round 2 (issue 35) of ``nablax.nn``: a cross-entropy target outside ``[0, C)`` never gives a
finite loss (API.md section 10), and an ``nn.Module`` attribute without a field is never dropped.

Oracles: ``torch.nn.functional.cross_entropy`` for the rows with valid targets (PyTorch raises
``IndexError`` for a bad target on the CPU; nablax, whose ops are lazy, gives NaN as JAX's
out-of-bounds gather does: ``jnp.take_along_axis`` fills NaN).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F

torch = pytest.importorskip("torch")
TF = torch.nn.functional

N_CLS = 4
BAD_TARGETS = [N_CLS, N_CLS + 7, -1, -2, -99, -101, 2**31 - 1, -(2**31)]


def _logits(n=5, *more, seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal((n, N_CLS, *more)).astype(dtype)


def _weight():
    return nx.tensor([0.5, 2.0, 1.0, 3.0])


@pytest.mark.parametrize("bad", BAD_TARGETS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_out_of_range_target_gives_nan_never_a_finite_loss(bad, weighted, smoothing):
    """The bad row's loss is NaN in ``'none'``, so ``'mean'``/``'sum'`` are NaN; the other rows are
    PyTorch's values (old code: the bad row counted 0, or the weight gather wrapped/filled)."""
    x = _logits()
    y = np.array([0, bad, 3, -100, 1], np.int32)
    w = _weight() if weighted else None
    kw = {"label_smoothing": smoothing}
    for reduction in ("mean", "sum"):
        loss = F.cross_entropy(nx.tensor(x), nx.tensor(y), w, reduction=reduction, **kw).item()
        assert math.isnan(loss), (reduction, loss)
    per_row = F.cross_entropy(nx.tensor(x), nx.tensor(y), w, reduction="none", **kw).numpy()
    assert np.isnan(per_row[1]) and per_row[3] == 0.0, per_row
    good = np.array([0, 0, 3, -100, 1])  # the same rows, the bad one replaced
    tw = None if w is None else torch.tensor(w.numpy())
    want = TF.cross_entropy(
        torch.tensor(x), torch.tensor(good).long(), tw, reduction="none", **kw
    ).numpy()
    keep = [0, 2, 3, 4]
    np.testing.assert_allclose(per_row[keep], want[keep], rtol=1e-6, atol=1e-7)
    with pytest.raises(IndexError):  # the reference's choice for the CPU: an error
        TF.cross_entropy(torch.tensor(x), torch.tensor(y).long(), tw)


@pytest.mark.parametrize("weighted", [False, True])
def test_out_of_range_target_gradient_is_nan_in_its_row(weighted):
    """The bad row's logits get a NaN gradient (not a silent zero); valid rows get PyTorch's."""
    x = _logits(seed=1)
    y = np.array([2, -1, 0, 3, 9], np.int32)
    w = _weight() if weighted else None
    g = nx.grad(lambda a: F.cross_entropy(a, nx.tensor(y), w, reduction="sum"))(nx.tensor(x))
    g = g.numpy()
    assert np.isnan(g[[1, 4]]).all(), g
    tx = torch.tensor(x, requires_grad=True)
    tw = None if w is None else torch.tensor(w.numpy())
    good = np.where((y >= 0) & (y < N_CLS), y, 0)
    TF.cross_entropy(tx, torch.tensor(good).long(), tw, reduction="sum").backward()
    np.testing.assert_allclose(g[[0, 2, 3]], tx.grad.numpy()[[0, 2, 3]], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weighted", [False, True])
def test_out_of_range_target_is_nan_under_compile_and_vmap(weighted):
    w = _weight() if weighted else None
    x = _logits(seed=2)
    y = np.array([0, 1, 4, 2, 3], np.int32)

    def f(a, t):
        return F.cross_entropy(a, t, w)

    assert math.isnan(nx.compile(f)(nx.tensor(x), nx.tensor(y)).item())
    ok = np.array([0, 1, 1, 2, 3], np.int32)
    want = TF.cross_entropy(
        torch.tensor(x), torch.tensor(ok).long(), None if w is None else torch.tensor(w.numpy())
    ).item()
    np.testing.assert_allclose(nx.compile(f)(nx.tensor(x), nx.tensor(ok)).item(), want, rtol=1e-6)
    xs = np.stack([x, x])
    ys = np.stack([ok, y])
    got = nx.vmap(f)(nx.tensor(xs), nx.tensor(ys)).numpy()
    assert np.isnan(got[1]) and got[0] == pytest.approx(want, rel=1e-6), got
    gc = nx.compile(nx.grad(f))(nx.tensor(x), nx.tensor(y)).numpy()
    assert np.isnan(gc[2]).all() and np.isfinite(np.delete(gc, 2, axis=0)).all(), gc


def test_spatial_targets_and_half_precision_logits():
    """``(N, C, d)`` logits with one bad target: NaN; float16 and bfloat16 logits as well."""
    x = _logits(2, 3, seed=3)
    y = np.array([[0, 3, 1], [2, 5, -100]], np.int32)
    per = F.cross_entropy(nx.tensor(x), nx.tensor(y), reduction="none").numpy()
    assert np.isnan(per[1, 1]) and not np.isnan(np.delete(per.ravel(), 4)).any(), per
    for dt in (nx.float16, nx.bfloat16):
        lo = nx.tensor(x).astype(dt)
        loss = F.cross_entropy(lo, nx.tensor(y))
        assert loss.dtype == dt and math.isnan(loss.item())


def test_narrow_and_unsigned_targets_compare_exactly():
    """uint8 target 156 is not ``ignore_index=-100`` (JAX would wrap -100 to 156 in uint8), and
    uint32 targets beyond int32 are out of range; valid narrow targets give PyTorch's loss."""
    x = _logits(seed=4)
    y = np.array([0, 3, 1, 2, 2])
    want = TF.cross_entropy(torch.tensor(x), torch.tensor(y).long()).item()
    for dt in (np.uint8, np.int8, np.int16, np.uint32):
        got = F.cross_entropy(nx.tensor(x), nx.tensor(y.astype(dt))).item()
        assert got == pytest.approx(want, rel=1e-6), dt
    for w in (None, _weight()):
        y156 = nx.tensor(np.array([0, 156, 1, 2, 2], np.uint8))
        assert math.isnan(F.cross_entropy(nx.tensor(x), y156, w).item())
        y_big = nx.tensor(np.array([0, 2**31 + 1, 1, 2, 2], np.uint32))
        assert math.isnan(F.cross_entropy(nx.tensor(x), y_big, w).item())


def test_ignore_index_inside_and_outside_the_classes():
    """An ``ignore_index`` that is a class still ignores it; one beyond int32 matches nothing."""
    x = _logits(seed=5)
    y = np.array([0, 3, 1, 2, 2], np.int32)
    for w in (None, _weight()):
        tw = None if w is None else torch.tensor(w.numpy())
        got = F.cross_entropy(nx.tensor(x), nx.tensor(y), w, ignore_index=2).item()
        want = TF.cross_entropy(torch.tensor(x), torch.tensor(y).long(), tw, ignore_index=2)
        assert got == pytest.approx(want.item(), rel=1e-6)
        got = F.cross_entropy(nx.tensor(x), nx.tensor(y), w, ignore_index=2**40).item()
        want = TF.cross_entropy(torch.tensor(x), torch.tensor(y).long(), tw, ignore_index=2**40)
        assert got == pytest.approx(want.item(), rel=1e-6)


def test_fused_node_kept_and_matches_jax_take_along_axis():
    """The unweighted loss stays one ``cross_entropy`` node; a bad target's NaN is what JAX's own
    gather gives for an index past the end (the reference this NaN choice follows)."""
    from nablax.core.graph import toposort

    x = _logits(seed=6)
    y = np.array([0, 4, 1, 2, 2], np.int32)
    loss = F.cross_entropy(nx.tensor(x), nx.tensor(y), reduction="none")
    assert [n.prim.name for n in toposort([loss._impl.src.node])] == ["cross_entropy"]
    logp = jnp.asarray(x) - jnp.log(jnp.sum(jnp.exp(jnp.asarray(x)), axis=1, keepdims=True))
    ref = -jnp.take_along_axis(logp, jnp.asarray(y)[:, None], axis=1)[:, 0]
    np.testing.assert_allclose(loss.numpy(), np.asarray(ref), rtol=1e-5, atol=1e-6)

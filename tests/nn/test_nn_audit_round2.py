"""Audit round 2 (issue 35) of ``nablax.nn``: a cross-entropy target outside ``[0, C)`` never gives a
finite loss (API.md section 10), and an ``nn.Module`` attribute without a field is never dropped.

Oracles: ``torch.nn.functional.cross_entropy`` for the rows with valid targets (PyTorch raises
``IndexError`` for a bad target on the CPU; nablax, whose ops are lazy, gives NaN as JAX's
out-of-bounds gather does: ``jnp.take_along_axis`` fills NaN).
"""

from __future__ import annotations

import math
from functools import cached_property

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn

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


# ---- nn.Module: an attribute without a field is refused at construction -------------------------


def _key():
    return nx.random.key(0)


def test_attribute_without_a_field_is_refused_naming_class_attribute_and_fix():
    """Old code accepted ``self.head`` and the first ``value_and_grad`` failed with
    "'Net' object has no attribute 'head'" (the transforms rebuild a module from its fields)."""

    class Net(nn.Module):
        body: nn.Linear

        def __init__(self, key):
            self.body = nn.Linear(2, 2, key=key)
            self.head = nn.Linear(2, 1, key=key)

        def __call__(self, x):
            return self.head(self.body(x))

    with pytest.raises(
        TypeError,
        match=r"Net\.__init__ set self\.head \(Linear\), which is not a "
        r"field of Net.*dropped.*Fix: declare it in the class body, `head: nn.Linear`",
    ):
        Net(_key())


def test_static_configuration_without_a_field_is_refused_with_the_static_declaration():
    class Scaled(nn.Module):
        w: nx.Tensor

        def __init__(self):
            self.w = nx.ones(2)
            self.factor = 3.0
            self.act = nx.relu

        def __call__(self, x):
            return self.act(x * self.w * self.factor)

    with pytest.raises(
        TypeError,
        match=r"self\.factor \(float\).*also not fields: act.*"
        r"`factor: float = nn.field\(static=True\)`",
    ):
        Scaled()


def test_post_init_private_names_and_subclasses_are_refused_too():
    class Post(nn.Module):
        w: nx.Tensor

        def __post_init__(self):
            self.scale = nx.ones(1)

    with pytest.raises(
        TypeError, match=r"Post\.__init__ set self\.scale \(Tensor\).*`scale: nx.Tensor`"
    ):
        Post(nx.ones(2))

    class Cached(nn.Module):
        w: nx.Tensor

        def __init__(self):
            self.w = nx.ones(2)
            self._norm = self.w.sum()  # a private cache would vanish the same way

    with pytest.raises(TypeError, match=r"Cached\.__init__ set self\._norm"):
        Cached()

    class Base(nn.Module):
        w: nx.Tensor

        def __init__(self):
            self.w = nx.ones(2)

    class Child(Base):
        def __init__(self):
            super().__init__()
            self.extra = 1

    Base()  # the base alone is fine
    with pytest.raises(TypeError, match=r"Child\.__init__ set self\.extra \(int\)"):
        Child()


def test_declared_fields_survive_every_transform_and_cached_property_is_recomputed():
    """The fix the error suggests works: the same model with declared fields goes through
    ``value_and_grad``, ``compile``, ``vmap`` and an optimizer step. A ``functools.cached_property``
    computed in ``__init__`` is allowed: a transform drops it, and it is recomputed from the
    fields on the next access."""
    from nablax import optim

    class Net(nn.Module):
        body: nn.Linear
        head: nn.Linear
        factor: float = nn.field(static=True)

        def __init__(self, key):
            k1, k2 = nx.random.split(key)
            self.body = nn.Linear(2, 3, key=k1)
            self.head = nn.Linear(3, 1, key=k2)
            self.factor = 2.0
            assert self.n_params == 13

        @cached_property
        def n_params(self):
            return sum(int(np.prod(t.shape)) for t in nx.tree.leaves(self))

        def __call__(self, x):
            return self.head(nx.relu(self.body(x))) * self.factor

    m = Net(_key())
    x = nx.ones((4, 2))
    loss, g = nx.value_and_grad(lambda m, x: m(x).sum())(m, x)
    assert type(g) is Net and g.head.weight.shape == (1, 3) and g.factor == 2.0
    assert g.n_params == 13  # recomputed on the rebuilt gradient module
    got = nx.compile(lambda m, x: m(x).sum())(m, x).item()
    assert got == pytest.approx(loss.item(), rel=1e-6)
    per = nx.vmap(lambda x: m(x[None]).sum())(x)
    assert per.shape == (4,)
    opt = optim.sgd(0.1)
    upd, _ = opt.update(g, opt.init(m), m)
    new = optim.apply_updates(m, upd)
    assert type(new) is Net and new.factor == 2.0

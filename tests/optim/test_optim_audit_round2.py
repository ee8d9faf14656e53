"""Audit round 2 (issue 35) of ``nablax.optim``: ``global_norm`` and ``clip_by_global_norm`` are
exact for float16, bfloat16, integer and bool leaves (API.md section 10): the norm is float32 and
never overflows to ``inf`` or wraps; each clipped update keeps its leaf's dtype.

Oracles: NumPy float64 for the norm and the clipped values; ``torch.nn.utils.clip_grad_norm_`` on
float32 gradients (its float16 norm overflows to ``inf`` and zeroes the gradients, which is the bug
nablax does not copy: checked below so that the difference is on record).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import optim
from nablax.errors import DTypeError

torch = pytest.importorskip("torch")


def _tree(arrays):
    return {k: nx.tensor(v) for k, v in arrays.items()}


def _np_norm(arrays):
    return math.sqrt(sum(float(np.sum(np.asarray(v, np.float64) ** 2)) for v in arrays.values()))


def _eps(dt):
    return float(jnp.finfo(dt).eps)  # bfloat16 included


BIG_F16 = {"a": np.full((4,), 60000.0, np.float16), "b": np.full((3,), 300.0, np.float16)}
INTS = {
    "i32": np.array([100000, -100000, 46341], np.int32),  # squares wrap int32
    "i8": np.array([100, -128], np.int8),
    "u8": np.array([255, 200], np.uint8),
    "flag": np.array([True, False, True]),
}


def test_global_norm_float16_beyond_sqrt_65504_is_exact():
    """The norm itself (old code already squared float16 in float32; a guard for the rewrite). The
    clipped leaves were the bug: see the next test."""
    got = optim.global_norm(_tree(BIG_F16))
    assert got.dtype == nx.float32
    assert got.item() == pytest.approx(_np_norm(BIG_F16), rel=1e-6)


def test_global_norm_of_integer_and_bool_leaves_does_not_wrap():
    """Old code: ``x * x`` in int32 wrapped (100000**2 > 2**31) and bools multiplied as ``and``."""
    got = optim.global_norm(_tree(INTS))
    assert got.dtype == nx.float32
    assert got.item() == pytest.approx(_np_norm(INTS), rel=1e-6)
    for k, v in INTS.items():
        one = optim.global_norm({k: nx.tensor(v)}).item()
        assert one == pytest.approx(_np_norm({k: v}), rel=1e-6), k


@pytest.mark.parametrize("dt", [np.float16, nx.bfloat16])
def test_clip_half_precision_with_a_huge_norm_is_scaled_not_zeroed(dt):
    """Old code cast the norm to float16 (``inf`` past 65504) and returned zeros; now each leaf is
    ``g * max_norm / norm`` rounded once to its dtype. torch's clip_grad_norm_ zeroes here."""
    arrays = {k: v.astype(dt) for k, v in BIG_F16.items()}
    opt = optim.clip_by_global_norm(1.0)
    out, _ = opt.update(_tree(arrays), opt.init(_tree(arrays)))
    norm = _np_norm(arrays)
    for k, v in arrays.items():
        assert out[k].dtype == np.dtype(dt)
        want = np.asarray(v, np.float64) / norm
        np.testing.assert_allclose(out[k].numpy().astype(np.float64), want, rtol=2 * _eps(dt))
    assert optim.global_norm(out).item() == pytest.approx(1.0, rel=4 * _eps(dt))
    if dt is np.float16:  # the reference's behaviour, which nablax deliberately does not copy
        p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float16))
        p.grad = torch.tensor(arrays["a"])
        assert math.isinf(torch.nn.utils.clip_grad_norm_([p], 1.0).item())
        assert not p.grad.any()


def test_clip_integer_and_bool_updates_keep_their_dtype():
    """Integer updates are scaled in float32 and truncated toward zero (so the clipped norm stays
    at most ``max_norm``); old code returned float32 leaves scaled by a wrapped norm."""
    opt = optim.clip_by_global_norm(1000.0)
    out, _ = opt.update(_tree(INTS), opt.init(_tree(INTS)))
    norm = _np_norm(INTS)
    for k, v in INTS.items():
        assert out[k].dtype == v.dtype, k
        if v.dtype != bool:
            want = np.trunc(np.asarray(v, np.float64) * (1000.0 / norm))
            np.testing.assert_array_equal(out[k].numpy(), want.astype(v.dtype), err_msg=k)
    assert optim.global_norm({k: out[k] for k in ("i32", "i8", "u8")}).item() <= 1000.0
    big = optim.clip_by_global_norm(1e9)
    small, _ = big.update(_tree(INTS), big.init(None))
    for k, v in INTS.items():  # below max_norm: returned unchanged, dtype included
        np.testing.assert_array_equal(small[k].numpy(), v)
        assert small[k].dtype == v.dtype


def test_clip_matches_torch_on_float32_and_numpy_on_mixed_trees():
    """Float32 leaves (where torch is exact): torch's values to float32 rounding (torch adds 1e-6
    to the norm). A mixed float16/float32 tree: NumPy's float64 values rounded to each dtype
    (torch's float16 per-leaf norm is off by float16 rounding there)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((5, 3)).astype(np.float32) * 10
    b = rng.standard_normal(7).astype(np.float32) * 10
    opt = optim.clip_by_global_norm(2.0)
    out, _ = opt.update(_tree({"w": w, "b": b}), opt.init(None))
    params = [torch.nn.Parameter(torch.zeros(v.shape)) for v in (w, b)]
    for p, v in zip(params, (w, b)):
        p.grad = torch.tensor(v)
    torch.nn.utils.clip_grad_norm_(params, 2.0)
    for p, k in zip(params, ("w", "b")):
        np.testing.assert_allclose(out[k].numpy(), p.grad.numpy(), rtol=4e-6, atol=1e-6)
    mixed = {"w": w, "h": (rng.standard_normal(7) * 10).astype(np.float16)}
    out, _ = opt.update(_tree(mixed), opt.init(None))
    norm = _np_norm(mixed)
    for k, v in mixed.items():
        assert out[k].dtype == v.dtype
        want = np.asarray(v, np.float64) * (2.0 / norm)
        tol = 2 * _eps(v.dtype)
        np.testing.assert_allclose(out[k].numpy(), want, rtol=tol, atol=1e-7, err_msg=k)


def test_clip_inside_compile_and_chain():
    arrays = {k: v.astype(np.float16) for k, v in BIG_F16.items()}
    opt = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.5))
    params = _tree({k: np.zeros_like(v) for k, v in arrays.items()})
    state = opt.init(params)

    @nx.compile
    def step(p, g, s):
        u, s = opt.update(g, s, p)
        return optim.apply_updates(p, u), s

    new, _ = step(params, _tree(arrays), state)
    norm = _np_norm(arrays)
    for k, v in arrays.items():
        assert new[k].dtype == nx.float16
        np.testing.assert_allclose(new[k].numpy(), -0.5 * v.astype(np.float64) / norm, rtol=2e-3)


def test_complex_leaves_are_refused_by_name():
    """``x * x`` of a complex leaf is not ``|x|**2`` (old code returned a complex 'norm')."""
    with pytest.raises(DTypeError, match=r"optim\.global_norm: a complex64 leaf \(1,\)"):
        optim.global_norm({"z": nx.tensor([3 + 4j])})
    opt = optim.clip_by_global_norm(1.0)
    with pytest.raises(DTypeError, match=r"optim\.clip_by_global_norm: a complex64.*real and"):
        opt.update({"z": nx.tensor([3 + 4j])}, opt.init(None))

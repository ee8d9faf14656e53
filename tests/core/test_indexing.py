"""Indexing (API.md §1): basic, advanced, mixed and boolean indices against NumPy; ``.at[]`` updates
against ``jax.numpy``; ``x[idx] = v`` rebinding; out-of-range errors at build time; and hypothesis
property tests with random shapes and index tuples."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nablax as nx

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
X = np.arange(4 * 5 * 6, dtype=np.float32).reshape(4, 5, 6) - 50.0


def _realizations() -> int:
    return nx.cache_info().realizations


def _check(idx, x=X):
    """``nx.tensor(x)[idx]`` built lazily equals ``x[idx]`` (value, shape and dtype)."""
    expected = x[idx]
    t = nx.tensor(x) * 1  # pending: indexing must build, not realize
    before = _realizations()
    got = t[idx]
    assert _realizations() == before
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got.numpy(), expected)


BASIC = [
    1,
    -1,
    (0, 2),
    (-4, -5, -6),
    (3, 4, 5),
    slice(None),
    slice(1, 3),
    slice(None, None, 2),
    slice(None, None, -1),
    slice(-1, 0, -2),
    slice(10, -10, -3),
    slice(2, 1),  # empty
    (slice(None), slice(1, None, 2), slice(None, None, -3)),
    None,
    (None, 1, None),
    Ellipsis,
    (Ellipsis, 0),
    (0, Ellipsis, slice(1, 3)),
    (Ellipsis, None),
    (slice(None), None, Ellipsis, -1),
    (),
]


@pytest.mark.parametrize("idx", BASIC, ids=repr)
def test_basic_indexing(idx):
    _check(idx)


ADVANCED = [
    [0, 2],
    [-1, 0, -1],
    np.array([[0, 1], [3, 2]]),
    (np.array([0, 3]), np.array([1, 4])),
    (np.array([[0], [3]]), np.array([1, 4, 2])),  # broadcast index arrays
    (np.array([1, 2]), np.array([0, 1]), np.array([5, -6])),
    np.array([], dtype=np.int64),
    # mixed basic + advanced (NumPy: adjacent advanced indices stay in place, separated go first)
    (slice(None), [0, 2]),
    (slice(None), [0, 2], [1, 3]),
    ([0, 1], slice(None), [2, 3]),
    (0, slice(None), [1, 2]),
    ([1, 3], slice(1, 4), 2),
    (slice(None), np.array([[0], [4]]), np.array([1, 5])),
    (None, [0, 1], Ellipsis, 2),
    (Ellipsis, [0, 5]),
    (slice(None, None, -1), [4, 0], None),
    ([2], 1, slice(None, None, 2)),
]


@pytest.mark.parametrize("idx", ADVANCED, ids=repr)
def test_advanced_and_mixed_indexing(idx):
    _check(idx)


def test_index_tensors_pending_and_realized():
    x = nx.tensor(X)
    i = nx.arange(3) * 2 - 1  # pending int tensor: [-1, 1, 3]
    np.testing.assert_array_equal(x[i].numpy(), X[np.array([-1, 1, 3])])
    j = nx.tensor([[0, 1], [2, 3]])
    np.testing.assert_array_equal(x[:, j, -1].numpy(), X[:, np.array([[0, 1], [2, 3]]), -1])
    np.testing.assert_array_equal(
        x[i, j[:, :1]].numpy(), X[np.array([-1, 1, 3]), np.array([[0], [2]])]
    )
    # a 0-d int tensor indexes like an int
    np.testing.assert_array_equal(x[nx.tensor(2)].numpy(), X[2])


def test_index_tensor_out_of_range_follows_jax():
    # values unknown at build time: reads clamp, as in jax.numpy
    x = nx.tensor(X)
    i = nx.tensor([0, 7]) * 1
    np.testing.assert_array_equal(x[i].numpy(), np.asarray(jnp.asarray(X)[jnp.array([0, 7])]))


MASKS = [
    lambda x: x > 0,
    lambda x: (x % 3) == 0,
    lambda x: x[:, :, 0] > 0,
    lambda x: x[:, 0, 0] > -100,
    lambda x: x < -1000,  # all false: empty result
]


@pytest.mark.parametrize("k", range(len(MASKS)))
def test_boolean_mask_tensor(k):
    expected = X[MASKS[k](X)]
    t = nx.tensor(X) + 0
    mask = MASKS[k](t)
    before = _realizations()
    got = t[mask]  # realizes: the result shape depends on data
    assert _realizations() > before
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.numpy(), expected)


@pytest.mark.parametrize(
    "idx",
    [
        np.array([True, False, True, True]),
        (slice(None), np.array([False, True, True, False, True])),
        (np.array([True, False, False, True]), slice(None), 2),
        (1, np.array([True] * 5), np.array([0, 5, 1, 2, 3])),
        np.ones((4, 5), dtype=bool),
        (Ellipsis, np.arange(6) % 2 == 0),
        np.zeros((4, 5, 6), dtype=bool),
    ],
    ids=repr,
)
def test_boolean_mask_numpy(idx):
    _check(idx)


_SCALAR_BOOL_BUG = "BUG: a 0-d boolean index indexes axis 0 instead of adding a new axis"


@pytest.mark.parametrize(
    "idx",
    [
        True,
        False,
        (0, False),
        (Ellipsis, True),
    ],
    ids=repr,
)
def test_scalar_boolean_index(idx):
    _check(idx)


def test_scalar_boolean_tensor_index():
    t = nx.arange(3)
    assert t[nx.tensor(True)].shape == (1, 3)
    assert t[t.sum() < 0].shape == (0, 3)


def test_list_of_bools_is_a_mask():
    np.testing.assert_array_equal(
        nx.tensor(X)[[True, False, True, False]].numpy(), X[[True, False, True, False]]
    )


# ---- out-of-range and invalid indices: IndexError when the op is built ------------------------


@pytest.mark.parametrize(
    "idx",
    [
        4,
        -5,
        (0, 5),
        (0, 0, 6),
        (0, 0, 0, 0),
        [0, 4],
        np.array([-5]),
        (slice(None), [1, 5]),
        (Ellipsis, Ellipsis),
        np.array([True, False]),
        (slice(None), np.array([True] * 4 + [False, False])),  # axis 1 has size 5
        1.5,
        (slice(None), "a"),
    ],
    ids=repr,
)
def test_invalid_index_raises_at_build(idx):
    t = nx.tensor(X) * 1
    before = _realizations()
    with pytest.raises(IndexError):
        X[idx]
    with pytest.raises(IndexError):
        t[idx]
    assert _realizations() == before


@pytest.mark.parametrize("idx", [4, (0, -6), [1, 9], np.array([[0], [4]])], ids=repr)
def test_invalid_update_index_raises_at_build(idx):
    t = nx.tensor(X) * 1
    before = _realizations()
    with pytest.raises(IndexError):
        t.at[idx].set(0.0)
    with pytest.raises(IndexError):
        t.at[idx].add(1.0)
    with pytest.raises(IndexError):
        t[idx] = 0.0
    assert _realizations() == before


# ---- .at[].set / .add ------------------------------------------------------------------------


UPDATES = [
    (1, 5.0),
    ((slice(None), 2), np.arange(6, dtype=np.float32)),
    ((Ellipsis, -1), 0.5),
    ([0, 2], np.ones((2, 5, 6), np.float32)),
    ((slice(1, 3), [4, 0]), np.full((2, 2, 6), -1.0, np.float32)),
    ((np.array([[0], [3]]), np.array([1, 2])), 7.0),
    (X > 0, 0.0),
    ((slice(None, None, -2), None, 1), 2.0),
]


@pytest.mark.parametrize("idx,v", UPDATES, ids=[repr(u[0])[:40] for u in UPDATES])
@pytest.mark.parametrize("mode", ["set", "add"])
def test_at_update_matches_jax(idx, v, mode):
    x = nx.tensor(X)
    out = getattr(x.at[idx], mode)(nx.tensor(v) if isinstance(v, np.ndarray) else v)
    jidx = np.asarray(idx) if isinstance(idx, list) else idx  # jax wants arrays, not lists
    ref = getattr(jnp.asarray(X).at[jidx], mode)(v)
    assert out.shape == ref.shape and out.dtype == ref.dtype
    np.testing.assert_array_equal(out.numpy(), np.asarray(ref))
    np.testing.assert_array_equal(x.numpy(), X)  # .at returns a new tensor
    if mode == "set":  # and equals NumPy's in-place assignment
        y = X.copy()
        y[idx] = v
        np.testing.assert_array_equal(out.numpy(), y)


def test_at_add_accumulates_duplicates():
    x = nx.zeros(5)
    out = x.at[nx.tensor([0, 0, 2, 0])].add(1.0)
    assert out.tolist() == [3.0, 0.0, 1.0, 0.0, 0.0]
    out = nx.zeros((3, 2), dtype=nx.int32).at[[1, 1, 2]].add(nx.tensor([[1, 2], [10, 20], [5, 5]]))
    assert out.tolist() == [[0, 0], [11, 22], [5, 5]]


def test_at_update_casts_values_to_the_tensor_dtype():
    out = nx.arange(4).at[1].set(2.7)
    assert out.dtype == nx.int32 and out.tolist() == [0, 2, 2, 3]
    out = nx.zeros(3, dtype=nx.float16).at[0].add(nx.tensor(1.5))
    assert out.dtype == nx.float16 and out.tolist() == [1.5, 0.0, 0.0]


def test_at_update_value_shape_mismatch_raises():
    with pytest.raises(nx.errors.ShapeError):
        nx.zeros((3, 4)).at[0].set(nx.ones(3))


def test_at_get_equals_getitem():
    x = nx.tensor(X)
    np.testing.assert_array_equal(x.at[1, ::2].get().numpy(), X[1, ::2])


# ---- x[idx] = v ------------------------------------------------------------------------------


def test_setitem_rebinds_and_earlier_results_keep_old_values():
    x = nx.arange(6.0)
    alias = x
    s = x[1:4]  # pending slice taken before the assignment
    d = x * 2  # pending result
    r = x[2:3] + 0
    r.numpy()  # realized before the assignment
    x[2] = 100.0
    assert alias is x and x.tolist() == [0.0, 1.0, 100.0, 3.0, 4.0, 5.0]
    assert s.tolist() == [1.0, 2.0, 3.0]
    assert d.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]
    assert r.tolist() == [2.0]
    t = x[1:3]  # taken after: sees the new value
    x[1:3] = nx.tensor([-1.0, -2.0])
    assert t.tolist() == [1.0, 100.0]
    assert x.tolist() == [0.0, -1.0, -2.0, 3.0, 4.0, 5.0]


def test_setitem_matches_numpy_assignment():
    x = nx.tensor(X)
    y = X.copy()
    for idx, v in [((0, 1), 9.0), ((slice(None), -1), -3.0), (X[..., 0] > 0, 1.0), ([1, 3], 0.0)]:
        x[idx] = v
        y[idx] = v
    np.testing.assert_array_equal(x.numpy(), y)


def test_setitem_casts_like_numpy():
    x = nx.arange(5)
    x[0] = 2.7
    y = np.arange(5, dtype=np.int32)
    y[0] = 2.7
    assert x.dtype == nx.int32 and x.tolist() == y.tolist()


# ---- take / take_along_axis edge behaviour ---------------------------------------------------


def test_take_out_of_range_concrete_follows_jnp_fill_mode():
    # jnp.take's default mode="fill" (tests/core/test_inputs.py covers every mode)
    got = nx.take(nx.arange(5), np.array([5]))
    assert got.tolist() == jnp.take(jnp.arange(5), np.array([5])).tolist()


def test_take_along_axis_out_of_range_concrete_follows_jnp_fill_mode():
    before = nx.cache_info().realizations
    got = nx.take_along_axis(nx.zeros((2, 3)), np.array([[5]]), 1)
    assert nx.cache_info().realizations == before  # building it realizes nothing
    want = jnp.take_along_axis(jnp.zeros((2, 3)), np.array([[5]]), 1)
    np.testing.assert_array_equal(got.numpy(), want)


# ---- hypothesis: random shapes and index tuples vs NumPy -------------------------------------


@st.composite
def _basic_case(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5))
    idx = draw(hnp.basic_indices(shape, allow_newaxis=True, allow_ellipsis=True))
    return shape, idx


@SETTINGS
@given(_basic_case())
def test_property_basic_indices(case):
    shape, idx = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    _check(idx, x)


@st.composite
def _mixed_case(draw):
    """Random mix of slices, ints, None and integer arrays (broadcast together) over a shape."""
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5))
    adv_shape = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    idx = []
    for side in shape:
        kind = draw(st.sampled_from(["slice", "int", "array", "array", "new_axis"]))
        if kind == "slice":
            idx.append(draw(st.slices(side)))
        elif kind == "int":
            idx.append(draw(st.integers(-side, side - 1)))
        elif kind == "array":
            idx.append(draw(hnp.arrays(np.int32, adv_shape, elements=st.integers(-side, side - 1))))
        else:  # a new axis, then a full slice for this dimension
            idx += [None, slice(None)]
    # per-dimension items (a new axis comes with a slice): positions of dimension boundaries
    bounds = [i for i, v in enumerate(idx) if v is not None] + [len(idx)]
    if draw(st.booleans()):  # an Ellipsis stands for a run of dimensions
        a = draw(st.integers(0, len(bounds) - 1))
        b = draw(st.integers(a, len(bounds) - 1))
        idx = idx[: bounds[a]] + [Ellipsis] + idx[bounds[b] :]
    else:  # trailing dimensions may be left out
        idx = idx[: bounds[draw(st.integers(0, len(bounds) - 1))]]
    return shape, tuple(idx)


@SETTINGS
@given(_mixed_case(), st.booleans())
def test_property_advanced_and_mixed_indices(case, as_tensors):
    shape, idx = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    if not as_tensors:
        _check(idx, x)
        return
    # index arrays given as (realized) nablax tensors: same result, no bounds check needed
    tidx = tuple(nx.tensor(i) if isinstance(i, np.ndarray) else i for i in idx)
    got = nx.tensor(x)[tidx]
    np.testing.assert_array_equal(got.numpy(), x[idx])


@SETTINGS
@given(_mixed_case(), st.sampled_from(["set", "add"]))
def test_property_at_updates(case, mode):
    shape, idx = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    target = x[idx].shape
    v = np.arange(int(np.prod(target)), dtype=np.float32).reshape(target) + 0.5
    got = getattr(nx.tensor(x).at[idx], mode)(nx.tensor(v))
    ref = getattr(jnp.asarray(x).at[idx], mode)(v)
    np.testing.assert_array_equal(got.numpy(), np.asarray(ref))


@SETTINGS
@given(
    hnp.arrays(
        np.float32,
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=4),
        elements=st.floats(-3, 3, width=32, allow_subnormal=False),
    )
)
def test_property_boolean_masks(x):
    t = nx.tensor(x)
    np.testing.assert_array_equal(t[t > 0].numpy(), x[x > 0])
    m = x[..., 0] < 0
    if m.ndim:  # 0-d masks: test_scalar_boolean_index
        np.testing.assert_array_equal(t[nx.tensor(m)].numpy(), x[m])
        np.testing.assert_array_equal(t[m].numpy(), x[m])

"""Broadcasting and type promotion of binary ops (API.md §1: NumPy broadcasting, JAX promotion with
weakly typed Python scalars).

- hypothesis: random broadcast-compatible shapes give NumPy's values and shapes;
- incompatible shapes raise ``nx.errors.ShapeError`` when the op is *built* (no realization), with a
  message naming the op and both shapes;
- the promotion table over {bool, int32, float16, bfloat16, float32} x (same + Python bool/int/float)
  equals ``jax.numpy``'s (x64 disabled), values included.
"""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import nablax as nx
from nablax.errors import DTypeError, ShapeError

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

BF16 = np.dtype(jnp.bfloat16)
DTYPES = [np.dtype(bool), np.dtype(np.int32), np.dtype(np.float16), BF16, np.dtype(np.float32)]
PY_SCALARS = [True, 2, 1.5]

# name -> (nablax function, numpy function)
BINARY = {
    "add": (nx.add, np.add),
    "subtract": (nx.subtract, np.subtract),
    "multiply": (nx.multiply, np.multiply),
    "maximum": (nx.maximum, np.maximum),
    "less": (nx.less, np.less),
    "not_equal": (nx.not_equal, np.not_equal),
    "arctan2": (nx.arctan2, np.arctan2),
    "operator.mul": (operator.mul, np.multiply),
    "operator.ge": (operator.ge, np.greater_equal),
}


def _realizations() -> int:
    return nx.cache_info().realizations


def _values(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@SETTINGS
@given(
    hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    st.sampled_from(sorted(BINARY)),
)
def test_property_broadcast_matches_numpy(shapes, name):
    (sa, sb), expected_shape = shapes.input_shapes, shapes.result_shape
    a, b = _values(sa, 0), _values(sb, 1)
    fn, np_fn = BINARY[name]
    out = fn(nx.tensor(a), nx.tensor(b))
    assert out.shape == expected_shape
    np.testing.assert_allclose(out.numpy(), np_fn(a, b), rtol=1e-6, atol=1e-6)


@SETTINGS
@given(hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=3, max_side=3))
def test_property_where_broadcasts_three_ways(shapes):
    sc, sx, sy = shapes.input_shapes
    c = _values(sc, 2) > 0
    x, y = _values(sx, 3), _values(sy, 4)
    out = nx.where(nx.tensor(c), nx.tensor(x), nx.tensor(y))
    assert out.shape == shapes.result_shape
    np.testing.assert_array_equal(out.numpy(), np.where(c, x, y))


@SETTINGS
@given(
    hnp.array_shapes(min_dims=0, max_dims=3, max_side=3).flatmap(
        lambda s: st.tuples(
            st.just(s), hnp.broadcastable_shapes(s, min_dims=0, max_dims=3, max_side=3)
        )
    )
)
def test_property_broadcast_to(shapes):
    target, src = shapes
    x = _values(src, 5)
    out = nx.broadcast_to(nx.tensor(x), np.broadcast_shapes(src, target))
    np.testing.assert_array_equal(out.numpy(), np.broadcast_to(x, np.broadcast_shapes(src, target)))


@st.composite
def _incompatible_shapes(draw):
    """Two shapes that share trailing axes except one, where the sizes differ and neither is 1."""
    a = list(draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4)))
    b = list(a[-draw(st.integers(1, len(a))) :])
    k = draw(st.integers(0, len(b) - 1))
    sizes = draw(st.lists(st.integers(2, 5), min_size=2, max_size=2, unique=True))
    a[len(a) - len(b) + k], b[k] = sizes
    # sizes elsewhere in b may become 1 (still broadcastable there)
    b = [1 if i != k and draw(st.booleans()) else d for i, d in enumerate(b)]
    if draw(st.booleans()):
        a, b = b, a
    return tuple(a), tuple(b)


@SETTINGS
@given(_incompatible_shapes(), st.sampled_from(sorted(BINARY)))
def test_property_incompatible_shapes_raise_at_build(shapes, name):
    sa, sb = shapes
    with pytest.raises(ValueError):
        np.broadcast_shapes(sa, sb)
    fn, _ = BINARY[name]
    a = nx.tensor(_values(sa, 0)) * 2  # pending inputs: an error at realization would be too late
    b = nx.tensor(_values(sb, 1)) + 1
    before = _realizations()
    with pytest.raises(ShapeError) as e:
        fn(a, b)
    assert _realizations() == before
    msg = str(e.value)
    op = {"operator.mul": "multiply", "operator.ge": "greater_equal"}.get(name, name)
    assert op in msg and str(sa) in msg and str(sb) in msg, msg


def test_broadcast_error_message_names_the_op_once():
    with pytest.raises(ShapeError) as e:
        nx.add(nx.ones((2, 3)), nx.ones(4))
    assert str(e.value).startswith("nx.add: "), str(e.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: nx.where(nx.ones((2, 3)) > 0, nx.ones(4), 0.0),
        lambda: nx.where(nx.ones(5) > 0, nx.ones((2, 3)), nx.ones(3)),
        lambda: nx.clip(nx.ones((2, 3)), nx.zeros(2), 1.0),
        lambda: nx.broadcast_to(nx.ones((2, 3)), (3, 3)),
        lambda: nx.broadcast_to(nx.ones((2, 3)), (3,)),
        lambda: nx.matmul(nx.ones((2, 3, 4)), nx.ones((3, 4, 5))),
        lambda: nx.ones((3,)).at[0].set(nx.ones(2)),
        lambda: nx.take_along_axis(nx.ones((2, 3)), nx.zeros((3, 1), dtype=nx.int32), 1),
    ],
    ids=[
        "where_x",
        "where_cond",
        "clip",
        "broadcast_to",
        "broadcast_to_rank",
        "matmul_batch",
        "at_set",
        "take_along_axis",
    ],
)
def test_other_broadcasting_ops_raise_shape_error_at_build(build):
    before = _realizations()
    with pytest.raises(ShapeError):
        build()
    assert _realizations() == before


# ---- type promotion --------------------------------------------------------------------------


def _operand(d, seed):
    if isinstance(d, np.dtype):
        v = np.random.default_rng(seed).integers(1, 4, (2, 3))
        return v.astype(bool) if d == np.dtype(bool) else v.astype(np.float32).astype(d)
    return d  # a Python scalar


PROMO_OPS = {  # one of each dtype policy: arithmetic, float-valued, comparison, bool-refusing
    "less": (nx.less, jnp.less),
    "add": (nx.add, jnp.add),
    "multiply": (nx.multiply, jnp.multiply),
    "divide": (nx.divide, jnp.divide),
    "maximum": (nx.maximum, jnp.maximum),
    "subtract": (nx.subtract, jnp.subtract),
}


def _promo_params():
    out = []
    for lhs in DTYPES:
        for rhs in DTYPES + PY_SCALARS:
            name = f"{lhs}-{rhs!r}" if not isinstance(rhs, np.dtype) else f"{lhs}-{rhs}"
            out.append(pytest.param(lhs, rhs, False, id=name))
            if not isinstance(rhs, np.dtype):
                out.append(pytest.param(lhs, rhs, True, id=f"{rhs!r}-{lhs}"))
    return out


@pytest.mark.parametrize("lhs,rhs,scalar_left", _promo_params())
def test_promotion_matches_jax(lhs, rhs, scalar_left):
    a, b = _operand(lhs, 0), _operand(rhs, 1)
    if scalar_left:
        a, b = b, a
    ta = nx.tensor(a) if isinstance(a, np.ndarray) else a
    tb = nx.tensor(b) if isinstance(b, np.ndarray) else b
    ja = jnp.asarray(a) if isinstance(a, np.ndarray) else a
    jb = jnp.asarray(b) if isinstance(b, np.ndarray) else b
    outs, refs = [], []
    for op, (fn, jfn) in sorted(PROMO_OPS.items()):
        try:
            ref = jfn(ja, jb)
        except TypeError:  # jnp refuses (e.g. bool - bool): nablax must refuse when building
            before = _realizations()
            with pytest.raises(TypeError):
                fn(ta, tb)
            assert _realizations() == before
            continue
        out = fn(ta, tb)
        assert out.dtype == ref.dtype, f"{op}({a!r:.20}, {b!r:.20}): {out.dtype} != jnp {ref.dtype}"
        outs.append(out)
        refs.append(ref)
    nx.realize(*outs)
    for out, ref in zip(outs, refs):
        v = out.numpy()
        assert v.dtype == ref.dtype
        np.testing.assert_allclose(
            v.astype(np.float32), np.asarray(ref).astype(np.float32), rtol=1e-2
        )


def test_bool_arithmetic_errors_are_dtype_errors():
    b = nx.tensor([True, False])
    for fn in (nx.subtract, nx.power, nx.floor_divide, nx.mod):
        with pytest.raises(DTypeError):
            fn(b, b)
    with pytest.raises(DTypeError):
        nx.negative(b)


@pytest.mark.parametrize(
    "a,b",
    [
        (np.float64(2.0), np.float16),
        (np.float32(2.0), np.float16),
        (np.int32(3), np.float16),
        (np.arange(3.0), np.float16),  # float64 arrays become float32 (x64 disabled)
        (np.arange(3), BF16),
        (np.array(2, np.int8), np.int32),
        (np.array([True]), np.int32),
    ],
    ids=repr,
)
def test_numpy_operands_promote_like_jax(a, b):
    t = np.ones(3, dtype=b)
    for x, y in ((nx.tensor(t), a), (a, nx.tensor(t))):
        jx = jnp.asarray(t) if isinstance(x, nx.Tensor) else x
        jy = jnp.asarray(t) if isinstance(y, nx.Tensor) else y
        assert (x + y).dtype == (jx + jy).dtype, (a, b)

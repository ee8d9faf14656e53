"""Shape, axis and dtype errors are raised when the op is built (before any realization), with a
message that names the op and the offending shapes / axis / dtype (DESIGN.md, convention 4)."""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx

try:
    from .build_errors import raises_at_build as _raises
    from .build_errors import shape_re as _shape_re
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    from build_errors import raises_at_build as _raises
    from build_errors import shape_re as _shape_re
from nablax.errors import DTypeError, NablaxError, ShapeError


def _pending(shape, dtype=nx.float32):
    """A tensor whose value is not computed yet: an error found only at realization shows up."""
    t = nx.ones(shape, dtype=dtype)  # constant-filled tensors are lazy
    assert not t.is_realized
    return t


# ---- matmul ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sa,sb",
    [((2, 3), (4, 5)), ((3,), (4,)), ((2, 3), (2,)), ((5, 2, 3), (5, 4, 2)), ((4,), (3, 5, 4))],
)
def test_matmul_contraction_mismatch(sa, sb):
    a, b = _pending(sa), _pending(sb)
    _raises(ShapeError, lambda: nx.matmul(a, b), "matmul", _shape_re(sa), _shape_re(sb))
    _raises(ShapeError, lambda: a @ b, "matmul")


def test_matmul_batch_mismatch_and_scalars():
    _raises(ShapeError, lambda: _pending((2, 3, 4)) @ _pending((3, 4, 5)), "matmul", "(2,)", "(3,)")
    _raises(ShapeError, lambda: nx.matmul(_pending(()), _pending((3,))), "matmul")


def test_dot_and_einsum_mismatch():
    _raises(
        ShapeError, lambda: nx.dot(_pending((2, 3)), _pending((4, 2))), "dot", "(2, 3)", "(4, 2)"
    )
    _raises(
        ShapeError,
        lambda: nx.einsum("ij,jk->ik", _pending((2, 3)), _pending((4, 2))),
        "einsum",
        "(2, 3)",
        "(4, 2)",
    )


# ---- reshape ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,new",
    [((2, 3), (4, 2)), ((2, 3), (4, -1)), ((2, 3), (-1, -1)), ((6,), (0, -1)), ((0, 3), (2,))],
)
def test_reshape_wrong_size(shape, new):
    x = _pending(shape)
    needles = [str(new)] if new.count(-1) > 1 else [str(shape), str(new)]
    _raises(ShapeError, lambda: nx.reshape(x, new), "reshape", *needles)
    _raises(ShapeError, lambda: x.reshape(*new), "reshape")


def test_reshape_and_transpose_refuse_float_sizes_and_axes_every_time():
    """A float size is a TypeError, as NumPy (``int()`` used to truncate ``2.5`` to ``2``), and a
    float axes tuple that equals a permutation seen before is refused too (the permutation memo
    checks element types: ``(1.0, 0.0) == (1, 0)``)."""
    x = nx.arange(24).reshape(2, 3, 4)
    for _ in range(2):  # the second round finds (6, 4) and (2, 3, 4) memoized for this shape
        assert x.reshape(6, 4).shape == (6, 4) and x.reshape(2, 3, 4).shape == (2, 3, 4)
        for bad in ((2.5, 3, 4), (6.0, 4), (2.0, 3, 4)):
            _raises(TypeError, lambda bad=bad: x.reshape(bad), "reshape", "ints")
        _raises(ShapeError, lambda: x.reshape(6, 5), "reshape")
    assert x.reshape(np.int64(6), 4).shape == (6, 4)
    for _ in range(2):  # the second call finds (1, 0, 2) memoized
        assert x.transpose(1, 0, 2).shape == (3, 2, 4)
        _raises(TypeError, lambda: x.transpose(1.0, 0.0, 2.0), "transpose", "ints")
        _raises(ShapeError, lambda: x.transpose(1, 1, 2), "transpose", "permutation")
    np.testing.assert_array_equal(
        x.transpose(2, 0, 1).numpy(), np.arange(24).reshape(2, 3, 4).transpose(2, 0, 1)
    )


# ---- axes ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,build",
    [
        ("sum", lambda x: nx.sum(x, axis=2)),
        ("sum", lambda x: x.sum(axis=-3)),
        ("sum", lambda x: nx.sum(x, axis=(0, 0))),
        ("mean", lambda x: nx.mean(x, axis=(0, 5))),
        ("max", lambda x: nx.max(x, axis=2)),
        ("var", lambda x: nx.var(x, axis=7)),
        ("argmax", lambda x: nx.argmax(x, axis=2)),
        ("cumsum", lambda x: nx.cumsum(x, axis=-3)),
        ("softmax", lambda x: nx.softmax(x, axis=2)),
        ("log_softmax", lambda x: nx.log_softmax(x, axis=-3)),
        ("logsumexp", lambda x: nx.logsumexp(x, axis=3)),
        ("concatenate", lambda x: nx.concatenate([x, x], axis=2)),
        ("concatenate", lambda x: nx.concatenate([x, x], axis=-3)),
        ("stack", lambda x: nx.stack([x, x], axis=4)),
        ("split", lambda x: nx.split(x, 2, axis=2)),
        ("squeeze", lambda x: nx.squeeze(x, axis=0)),
        ("expand_dims", lambda x: nx.expand_dims(x, 4)),
        ("transpose", lambda x: nx.transpose(x, (0, 0))),
        ("transpose", lambda x: nx.transpose(x, (0, 2))),
        ("swapaxes", lambda x: nx.swapaxes(x, 0, 2)),
        ("moveaxis", lambda x: nx.moveaxis(x, 0, 3)),
        ("flip", lambda x: nx.flip(x, 2)),
        ("sort", lambda x: nx.sort(x, axis=2)),
        ("topk", lambda x: nx.topk(x, 4)),
        ("take", lambda x: nx.take(x, np.array([0]), axis=2)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_axis(name, build):
    x = _pending((2, 3))
    msg = _raises(ShapeError, lambda: build(x), name)
    assert isinstance(ShapeError(msg), ValueError)  # ShapeError is a ValueError, as NumPy's


def test_axis_errors_name_the_axis_and_rank():
    _raises(ShapeError, lambda: nx.sum(_pending((2, 3)), axis=2), "axis=2", "2 dimension")
    _raises(
        ShapeError, lambda: nx.softmax(_pending((4,)), axis=1), "softmax", "axis=1", "1 dimension"
    )


def test_axis_errors_name_the_shape():
    _raises(ShapeError, lambda: nx.sum(_pending((2, 3)), axis=2), "(2, 3)")


# ---- concatenate / stack ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "shapes,axis",
    [
        ([(2, 3), (2, 4)], 0),
        ([(2, 3), (3,)], 0),
        ([(2, 3), (2, 3), (3, 2)], 1),
        ([(1, 2, 3), (1, 3, 3)], -1),
    ],
)
def test_concatenate_shape_mismatch(shapes, axis):
    ts = [_pending(s) for s in shapes]
    bad = next(
        s
        for s in shapes[1:]
        if len(s) != len(shapes[0])
        or any(a != b for i, (a, b) in enumerate(zip(s, shapes[0])) if i != axis % len(shapes[0]))
    )
    _raises(
        ShapeError, lambda: nx.concatenate(ts, axis=axis), "concatenate", str(shapes[0]), str(bad)
    )


def test_concatenate_zero_dim_and_empty_list():
    _raises(ShapeError, lambda: nx.concatenate([_pending(()), _pending(())]), "concatenate")
    _raises(ValueError, lambda: nx.concatenate([]), "concatenate")
    _raises(ShapeError, lambda: nx.stack([_pending((2,)), _pending((3,))]), "stack", "(2,)", "(3,)")


def test_split_and_pad_errors():
    _raises(ShapeError, lambda: nx.split(_pending((5,)), 2), "split", "5")
    _raises(ShapeError, lambda: nx.pad(_pending((2, 3)), ((1, 1), (1, 1), (1, 1))), "pad")
    _raises(
        ShapeError,
        lambda: nx.broadcast_to(_pending((2, 3)), (4, 3)),
        "broadcast_to",
        "(2, 3)",
        "(4, 3)",
    )


# ---- dtypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name,build",
    [
        ("bitwise_and", lambda f, i: nx.bitwise_and(f, f)),
        ("bitwise_or", lambda f, i: nx.bitwise_or(i, f)),
        ("bitwise_xor", lambda f, i: f ^ i),
        ("bitwise_and", lambda f, i: f & True),
        ("bitwise_or", lambda f, i: 1 | f),
        ("invert", lambda f, i: ~f),
        ("bitwise_and", lambda f, i: i & 1.5),
    ],
    ids=[
        "and",
        "or_mixed",
        "xor_op",
        "and_bool_scalar",
        "ror_int",
        "invert",
        "int_and_float_scalar",
    ],
)
def test_bitwise_on_floats(name, build):
    f, i = _pending((2, 3)), _pending((2, 3), nx.int32)
    msg = _raises(DTypeError, lambda: build(f, i), name, "float32")
    assert "logical" in msg  # the fix names the alternative


def test_dtype_errors_are_type_errors():
    with pytest.raises(TypeError):
        nx.bitwise_and(nx.ones(2), nx.ones(2))
    assert issubclass(DTypeError, NablaxError) and issubclass(ShapeError, NablaxError)


@pytest.mark.parametrize(
    "name,build",
    [
        ("subtract", lambda b: b - b),
        ("negative", lambda b: -b),
        ("power", lambda b: b**b),
        ("matmul", lambda b: b @ b),
        ("einsum", lambda b: nx.einsum("i,i->", b, b)),
    ],
    ids=["subtract", "negative", "power", "matmul", "einsum"],
)
def test_bool_operand_errors(name, build):
    _raises(DTypeError, lambda: build(_pending((3,), nx.bool_)), name)


def test_sign_of_bool_raises_at_build():
    _raises(DTypeError, lambda: nx.sign(_pending((3,), nx.bool_)), "sign")


def test_random_dtype_and_key_errors():
    k = nx.random.key(0)
    _raises(DTypeError, lambda: nx.random.normal(k, (2,), dtype=nx.int32), "normal", "int32")
    _raises(
        DTypeError, lambda: nx.random.randint(k, (2,), 0, 5, dtype=nx.float32), "randint", "float32"
    )
    _raises(TypeError, lambda: nx.random.normal(nx.ones(3), (2,)), "key")


def test_bad_dtype_argument():
    _raises(DTypeError, lambda: nx.zeros(3, dtype="not-a-dtype"), "not-a-dtype")


# ---- scalar conversion of non-scalars ---------------------------------------------------------


def test_item_of_non_scalar():
    x = _pending((2, 3))
    _raises(ValueError, x.item, "item", "(2, 3)")
    _raises(ValueError, _pending((0,)).item, "item", "(0,)")
    assert not x.is_realized
    assert _pending((1, 1)).item() == 1.0  # one element is fine


def test_bool_of_non_scalar():
    x = _pending((2,))
    msg = _raises(ValueError, lambda: bool(x), "(2,)")
    assert "ambiguous" in msg and "any" in msg
    with pytest.raises(ValueError):
        if x > 0:
            pass
    assert not x.is_realized
    assert bool(_pending((1,))) is True


def test_float_int_of_non_scalar():
    x = _pending((3,))
    _raises(TypeError, lambda: float(x), "(3,)")
    _raises(TypeError, lambda: int(x), "(3,)")
    assert not x.is_realized


def test_len_and_iter_of_0d():
    x = _pending(())
    with pytest.raises(TypeError):
        len(x)
    with pytest.raises(TypeError):
        iter(x).__next__()


def test_expand_dims_repeated_axis():
    _raises(ShapeError, lambda: nx.expand_dims(_pending((2, 3)), (0, 0)), "expand_dims", "repeated")


def test_int_tensor_to_negative_int_power_raises_at_build():
    x = nx.tensor(np.array([2, 3], np.int32))
    assert (x**2).tolist() == [4, 9]
    assert (x**3).tolist() == [8, 27]  # same structure again: the scalar becomes an argument
    _raises(TypeError, lambda: x**-1, "power")


def test_eye_negative_size_raises_at_build():
    _raises(ValueError, lambda: nx.eye(-1), "eye")


def test_var_of_complex_is_a_clear_dtype_error():
    # it used to fail with AttributeError ('Tensor' has no 'conj') deep inside var
    with pytest.raises(nx.errors.DTypeError, match=r"nx.var: complex tensors \(complex64\)"):
        nx.var(nx.tensor([1 + 1j, 2j]))
    with pytest.raises(nx.errors.DTypeError, match="nx.var"):
        nx.std(nx.tensor([1 + 1j, 2j]))

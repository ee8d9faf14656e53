"""Audit round 2 (issue 35, item 16): host data and Python scalars at the edges of their dtypes.

- ``nx.tensor`` of a big-endian NumPy array converts to native byte order with equal values (it
  raised a JAX-internal ``TypeError``, as ``jnp.asarray`` still does), and a big-endian dtype
  argument means its native twin.
- A Python int operand of an integer tensor follows JAX (the oracle: ``jax.numpy`` on the same
  data): within int32 it wraps into a narrower dtype (``int8_tensor + 300`` adds 44), eagerly, in
  ``nx.compile`` with the int as a literal, and with the int as a traced argument; beyond int32 it
  must fit the dtype, else nablax's ``OverflowError`` names the op, the value, the dtype and the
  fix (old eager code raised NumPy's "Python integer 300 out of bounds for int8" at realization,
  far from the op, while the traced argument wrapped).
- Integer ``**`` with a Python exponent is exact (``jnp.power`` with a concrete exponent), for
  exponents of 64 and more too and for exponents beyond the tensor's dtype.
"""

from __future__ import annotations

import operator

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

# ---- big-endian host data -----------------------------------------------------------------------

BIG_ENDIAN = [
    np.array([1.5, -2.25], ">f4"),
    np.array([1.5, -2.25], ">f8"),
    np.array([1.5, -2.25], ">f2"),
    np.array([1, -2, 2**31 - 1], ">i4"),
    np.array([1, -2, 2**31 - 1], ">i8"),
    np.array([1, 65535], ">u2"),
    np.array([7, 2**32 - 1], ">u4"),
    np.array([1 + 2j, -3j], ">c8"),
    np.arange(12, dtype=">f4").reshape(3, 4)[:, ::-2],  # strided
    np.arange(70000, dtype=">f4"),  # past the aligned-copy size
]


@pytest.mark.parametrize("a", BIG_ENDIAN, ids=[str(a.dtype) + str(a.shape) for a in BIG_ENDIAN])
def test_big_endian_arrays_convert_to_native_with_equal_values(a):
    """JAX itself refuses these (``jnp.asarray`` raises the same TypeError), so the oracle is
    the native-order copy: ``nx.tensor`` of it gives the dtype and values, equal to the data."""
    native = a.astype(a.dtype.newbyteorder("="))
    t = nx.tensor(a)
    want = nx.tensor(native)
    assert t.dtype == want.dtype and t.dtype.isnative
    np.testing.assert_array_equal(t.numpy(), want.numpy())
    np.testing.assert_array_equal(t.numpy(), a)  # values equal to the host data
    np.testing.assert_array_equal((t + 0).numpy(), np.asarray(jnp.asarray(native) + 0))


def test_big_endian_dtype_arguments_mean_the_native_dtype():
    assert nx.tensor([1, 2], dtype=">f4").dtype == np.float32
    assert nx.tensor(np.array([1, 2], ">i2"), dtype=">i2").tolist() == [1, 2]
    assert nx.ones(2).astype(">i2").dtype == np.int16
    assert nx.zeros(2, dtype=">f2").dtype == np.float16
    x = nx.tensor(np.array([1.0, 2.0], "<f4")) + np.array([3.0, 4.0], ">f4")
    assert x.tolist() == [4.0, 6.0]
    f = nx.compile(lambda x: x * 2)
    assert f(nx.tensor(np.array([1.0, 2.0], ">f4"))).tolist() == [2.0, 4.0]


def test_compile_converts_numpy_arguments_as_nx_tensor_does():
    """nx.compile handed NumPy arguments to jax.jit as they were: a big-endian one raised JAX's
    TypeError and an int64 one beyond int32 wrapped silently (nx.tensor raises for it)."""
    f = nx.compile(lambda x: x * 2)
    assert f(np.array([1.0, 2.0], ">f4")).tolist() == [2.0, 4.0]
    assert f(np.array([1.0, 2.0], ">f4")).tolist() == [2.0, 4.0]  # the cached program
    assert f(np.array([1, 2], ">i8")).tolist() == [2, 4]
    assert f(np.array([3, 4])).tolist() == [6, 8]  # int64 in range: converted as by JAX
    with pytest.raises(OverflowError, match=r"nx.compile: value 1099511627776 cannot be conv"):
        f(np.array([1, 2**40]))
    with pytest.raises(OverflowError):
        nx.tensor(np.array([1, 2**40]))  # the same rule as nx.tensor


# ---- Python ints against integer tensors: JAX's weak-type wrapping ------------------------------

INT_DATA = {
    np.int8: [1, -3, 100, 0, 127, -128],
    np.uint8: [1, 3, 100, 0, 255],
    np.int16: [1, -3, 30000, 0],
    np.uint16: [1, 3, 65535, 0],
    np.int32: [1, -3, 2**31 - 1, 0],
    np.uint32: [1, 3, 2**32 - 1, 0],
}
VALUES = [300, -300, 256, -1, 70000, -129, 2**31 - 1, -(2**31)]
OPS = {
    "add": operator.add,
    "subtract": operator.sub,
    "multiply": operator.mul,
    "rsub": lambda a, b: b - a,
    "equal": operator.eq,
    "less": operator.lt,
    "floor_divide": operator.floordiv,
    "mod": operator.mod,
    "maximum": lambda a, b: (nx if isinstance(a, nx.Tensor) else jnp).maximum(a, b),
    "where": lambda a, b: (nx if isinstance(a, nx.Tensor) else jnp).where(a > 1, a, b),
}


def _jax(fn, a, v):
    with np.errstate(all="ignore"):
        return np.asarray(fn(jnp.asarray(a), v))


@pytest.mark.filterwarnings("ignore:nablax.*different programs:RuntimeWarning")  # by design
@pytest.mark.parametrize("dt", list(INT_DATA), ids=lambda d: d.__name__)
@pytest.mark.parametrize("op", list(OPS))
def test_python_int_wraps_as_in_jax_eager_compiled_and_traced(dt, op):
    a = np.array(INT_DATA[dt], dt)
    fn = OPS[op]
    for v in VALUES:
        if op in ("floor_divide", "mod") and _jax(lambda x, k: x * 0 + k, a, v)[0] == 0:
            continue  # a wrapped divisor of zero: integer division by zero is unspecified
        want = _jax(fn, a, v)
        got = fn(nx.tensor(a), v)
        assert got.dtype == want.dtype, (v, got.dtype, want.dtype)
        np.testing.assert_array_equal(got.numpy(), want, err_msg=f"eager {op} {v}")
        lit = nx.compile(lambda x, v=v: fn(x, v))(nx.tensor(a))
        np.testing.assert_array_equal(lit.numpy(), want, err_msg=f"compiled literal {op} {v}")
        traced = nx.compile(fn)(nx.tensor(a), v)
        np.testing.assert_array_equal(traced.numpy(), want, err_msg=f"traced {op} {v}")


def test_the_audit_example_int8_plus_300():
    x = nx.tensor(np.array([1, 2], np.int8))
    want = np.asarray(jnp.array([1, 2], jnp.int8) + 300)
    assert want.tolist() == [45, 46]
    assert (x + 300).tolist() == [45, 46] and (x + 300).dtype == np.int8
    assert nx.compile(lambda x: x + 300)(x).tolist() == [45, 46]
    assert nx.compile(lambda x, k: x + k)(x, 300).tolist() == [45, 46]
    assert (300 + x).tolist() == [45, 46]


@pytest.mark.parametrize(
    "build, op",
    [
        (lambda x: x + 2**40, "add"),
        (lambda x: 2**31 - x, "subtract"),
        (lambda x: x * (-(2**31) - 1), "multiply"),
        (lambda x: x == 2**40, "equal"),
        (lambda x: nx.maximum(x, 2**33), "maximum"),
        (lambda x: nx.where(x > 0, x, 2**40), "where"),
        (lambda x: nx.where(x > 0, 2**40, 1), "where"),
    ],
)
def test_ints_beyond_int32_raise_nablax_overflow_error(build, op):
    """JAX raises ``OverflowError`` for these too; nablax's names the op, value, dtype and fix,
    at the op (not at realization)."""
    x = nx.tensor(np.array([1, 2], np.int8))
    with pytest.raises(OverflowError) as e:
        build(x)
    msg = str(e.value)
    assert msg.startswith(f"nx.{op}: Python int "), msg
    assert "does not fit dtype int" in msg and "Fix: pass a float" in msg, msg
    with pytest.raises(OverflowError):
        build(jnp.array([1, 2], jnp.int8) if op != "where" else nx.tensor([1]))  # JAX raises too
    with pytest.raises(OverflowError, match=f"nx.{op}: Python int"):
        nx.compile(build)(x)


def test_uint32_keeps_exact_ints_beyond_int32_and_float_tensors_are_untouched():
    u = nx.tensor(np.array([1, 2], np.uint32))
    assert (u + (2**32 - 1)).tolist() == [0, 1]  # fits uint32 exactly: no error, no wrap of it
    f = nx.tensor(np.array([1.0], np.float16))
    assert (f + 300).tolist() == [301.0] and (f + 300).dtype == np.float16
    g = nx.tensor(np.array([1.0], np.float32))  # JAX raises here; nablax rounds, as for a float
    assert (g + 2**40).tolist() == [float(np.float32(2**40 + 1))]


@pytest.mark.parametrize("dt", [np.int8, np.uint8, np.int16, np.int32, np.uint32])
def test_integer_power_with_python_exponents_is_exact(dt):
    """``jnp.power`` with a concrete exponent is exact modulo ``2**bits``; JAX's traced integer
    power squares only six times (old nablax passed the exponent as a traced constant: int32
    ``3 ** 100`` came out as -1953380655, not -818408495), and an exponent beyond int8 wrapped."""
    a = np.array([0, 1, 2, 3, 5, 7, -3 if np.dtype(dt).kind == "i" else 255], dt)
    for e in (0, 1, 2, 7, 63, 64, 100, 127, 128, 200, 256, 300, 1000, 2**31 - 1):
        want = np.asarray(jnp.asarray(a) ** e)
        exact = [pow(int(v), e, 1 << (8 * a.itemsize)) for v in a]  # plain Python
        assert (want.astype(np.int64) % (1 << (8 * a.itemsize))).tolist() == exact
        for got in (
            nx.tensor(a) ** e,
            nx.compile(lambda x, e=e: x**e)(nx.tensor(a)),
            nx.compile(lambda x, k: x**k)(nx.tensor(a), e),
        ):
            assert got.dtype == want.dtype
            np.testing.assert_array_equal(got.numpy(), want, err_msg=f"{dt.__name__} ** {e}")

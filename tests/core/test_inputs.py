"""Inputs are copied and converted exactly (issue 14, part A).

- Host memory the user still owns (NumPy arrays, ``__array__`` objects, buffers) is copied on every
  path that turns it into a tensor, whatever its alignment, size and dtype; a ``jax.Array`` is
  shared (API.md).
- Conversions are exact or raise: ints that do not fit raise ``OverflowError`` (where JAX raises,
  and where it would silently wrap), floats follow NumPy/JAX (``inf``); non-numeric data raises a
  ``TypeError`` naming the function the user called.
- ``take`` / ``take_along_axis`` follow ``jnp``'s ``mode=`` (values, gradients, vmap), and
  ``x[idx_tensor]`` follows ``x[idx]`` in JAX.
- Errors of composite ops name the op the user called.
"""

from __future__ import annotations

import array

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

BF16 = np.dtype(jnp.bfloat16)

# ---- copies of host memory -------------------------------------------------------------------


def _buffer(n: int, dtype, offset: int) -> np.ndarray:
    """A 1-d array of ``n`` elements whose data address is ``offset`` (mod 64): 0 is the
    alignment JAX's CPU client adopts without a copy, the others are not."""
    dt = np.dtype(dtype)
    raw = np.empty(n * dt.itemsize + 128 + offset, np.uint8)
    start = -raw.ctypes.data % 64 + offset
    out = raw[start : start + n * dt.itemsize].view(dt)
    assert out.ctypes.data % 64 == offset
    out[...] = (np.arange(n) % 7 + 1).astype(dt)
    return out


DTYPES = [np.float32, np.int32, np.float16, np.bool_, np.uint8, BF16, np.complex64, np.float64]
SIZES = [16, 1 << 16]  # small, and large enough for the aligned-copy path (>= 128 KiB as f32)
OFFSETS = [0, 16, 1]  # 64-byte aligned, 16-byte aligned, misaligned for every dtype


class _ArrayLike:
    """Something with ``__array__`` that hands out its own buffer (as torch does)."""

    def __init__(self, a):
        self.a = a

    def __array__(self, dtype=None, copy=None):
        return self.a


def _ones_like_np(buf):
    return nx.ones(buf.shape, nx.asarray(buf[:1]).dtype)


# each: buf -> (tensor, expected values computed from a private copy of buf)
PATHS = {
    "Tensor": lambda b: (nx.Tensor(b), b.copy()),
    "tensor": lambda b: (nx.tensor(b), b.copy()),
    "asarray": lambda b: (nx.asarray(b), b.copy()),
    "tensor_dtype": lambda b: (nx.tensor(b, dtype=nx.float32), np.real(b).astype(np.float32)),
    "array_like": lambda b: (nx.tensor(_ArrayLike(b)), b.copy()),
    "memoryview": lambda b: (nx.tensor(memoryview(b.view(np.uint8))), b.view(np.uint8).copy()),
    "add": lambda b: (_ones_like_np(b) + b, np.ones_like(b) + b),
    "radd": lambda b: (b + _ones_like_np(b), b + np.ones_like(b)),
    "where": lambda b: (nx.where(b != 0, b, _ones_like_np(b)), np.where(b != 0, b, 1)),
    "full": lambda b: (nx.full(b.shape, b), b.copy()),
    "at_set": lambda b: (nx.zeros(b.shape, nx.asarray(b[:1]).dtype).at[:].set(b), b.copy()),
    "concatenate": lambda b: (nx.concatenate([b, b]), np.concatenate([b, b])),
}


def _as_float64(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.float32).astype(np.float64) if a.dtype == BF16 else a.astype(np.complex128)


LAZY_PATHS = ("add", "radd", "where", "full", "at_set", "concatenate")


def _copy_cases():
    """(path, dtype, offset, n, realize_first) combinations worth running: conversions return
    realized tensors (no pending variant); lazy ops at the large size only for aligned and
    misaligned f32/i32; memoryviews of bytes for two dtypes."""
    for path in PATHS:
        lazy = path in LAZY_PATHS
        for dtype in DTYPES:
            if path == "memoryview" and dtype not in (np.float32, np.bool_):
                continue
            for offset in OFFSETS:
                for n in SIZES:
                    if lazy and n > 16 and (offset == 16 or dtype not in (np.float32, np.int32)):
                        continue
                    for realize_first in (False, True) if lazy else (False,):
                        yield pytest.param(
                            path,
                            dtype,
                            offset,
                            n,
                            realize_first,
                            id=f"{path}-{np.dtype(dtype).name}-{offset}-{n}"
                            + ("-realized" if realize_first else ""),
                        )


@pytest.mark.parametrize("path, dtype, offset, n, realize_first", list(_copy_cases()))
def test_host_memory_is_copied(path, dtype, offset, n, realize_first):
    buf = _buffer(n, dtype, offset)
    t, want = PATHS[path](buf)
    if realize_first:
        t.numpy()
    buf[...] = 0  # the user's buffer changes afterwards
    got = t.numpy()
    np.testing.assert_array_equal(_as_float64(got), _as_float64(want.astype(got.dtype)))


def test_buffer_protocol_objects_are_copied():
    for src in (bytearray(b"\x01\x02\x03"), array.array("i", [1, 2, 3])):
        t = nx.tensor(src)
        want = np.array(src).copy()
        src[0] = 9
        np.testing.assert_array_equal(t.numpy(), want)


def test_torch_tensor_is_copied():
    torch = pytest.importorskip("torch")
    src = torch.arange(1 << 16, dtype=torch.float32)  # its numpy view shares this memory
    t = nx.tensor(src)
    src.zero_()
    np.testing.assert_array_equal(t.numpy(), np.arange(1 << 16, dtype=np.float32))


def test_index_arrays_are_copied():
    x = nx.arange(10) * 1
    idx = _buffer(16, np.int32, 0) % 10
    g, tk, ta = x[idx], nx.take(x, idx), nx.take_along_axis(x, idx, axis=0)
    want = np.arange(10)[idx.copy()]
    idx[...] = 0
    for t in (g, tk, ta):
        np.testing.assert_array_equal(t.numpy(), want)


def test_asarray_shares_a_jax_array_and_tensor_copies_the_object():
    j = jnp.arange(1 << 16, dtype=jnp.float32)
    assert nx.asarray(j).to_jax().unsafe_buffer_pointer() == j.unsafe_buffer_pointer()
    a = nx.arange(3)
    b = nx.tensor(a)  # a new tensor object: setitem on it leaves ``a`` alone
    b[0] = 7
    assert a.tolist() == [0, 1, 2] and b.tolist() == [7, 1, 2]
    assert nx.asarray(a) is a


# ---- overflow: exact or raise ----------------------------------------------------------------

OVERFLOWS = [
    ("tensor", lambda: nx.tensor([1, 2**40])),
    ("tensor", lambda: nx.tensor(2**40)),
    ("tensor", lambda: nx.tensor([2**40], dtype=nx.int32)),
    ("tensor", lambda: nx.tensor(-(2**31) - 1)),
    ("tensor", lambda: nx.tensor([2**63])),
    ("tensor", lambda: nx.tensor([2**70])),
    ("tensor", lambda: nx.tensor([[1], [2**70]])),
    ("tensor", lambda: nx.tensor([-1], dtype=nx.uint32)),
    ("tensor", lambda: nx.tensor([300], dtype=nx.uint8)),
    ("tensor", lambda: nx.tensor(np.array([1, 2**40]))),  # JAX wraps this int64 array to int32
    ("tensor", lambda: nx.tensor(np.int64(2**40))),
    ("tensor", lambda: nx.tensor(np.array([300]), dtype=nx.uint8)),
    ("tensor", lambda: nx.tensor(np.array([3e9]), dtype=nx.int32)),
    ("tensor", lambda: nx.tensor([float("inf")], dtype=nx.int32)),
    ("tensor", lambda: nx.Tensor(2**40)),
    ("asarray", lambda: nx.asarray([2**40])),
    ("full", lambda: nx.full((2,), 2**40, dtype=nx.int32)),
    ("full", lambda: nx.full((2,), 2**40)),
    ("full", lambda: nx.full((2,), 2.0**40, dtype=nx.int32)),
    ("full", lambda: nx.full((2,), np.int64(2**40))),
    ("full", lambda: nx.full((2,), [2**40, 1])),
    ("full_like", lambda: nx.full_like(nx.arange(2), 2**40)),
    ("arange", lambda: nx.arange(0, 2**40, 2**39)),
    ("linspace", lambda: nx.linspace(0, 1e20, 3, dtype=nx.int32)),
    ("add", lambda: nx.ones(2, dtype=nx.int32) + np.array([2**40])),
    ("where", lambda: nx.where(nx.ones(2) > 0, np.array([2**40]), nx.arange(2))),
    ("at[].set", lambda: nx.arange(3).at[0].set(2**40)),
    ("at[].set", lambda: nx.zeros(3, dtype=nx.uint8).at[0].set(-1)),
    ("pad", lambda: nx.pad(nx.arange(2), 1, constant_values=2**40)),
    ("take", lambda: nx.take(nx.arange(3), [5], fill_value=2**40)),
]


@pytest.mark.parametrize(
    "op, build", OVERFLOWS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(OVERFLOWS)]
)
def test_ints_that_do_not_fit_raise_overflow_error(op, build):
    with pytest.raises(OverflowError) as e:
        build()
    assert str(e.value).startswith(f"nx.{op}:"), str(e.value)
    assert "does not fit" in str(e.value) or "cannot be converted" in str(e.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda m: m.asarray([1, 2**40]),
        lambda m: m.asarray(2**40),
        lambda m: m.asarray([2**40], dtype=m.int32),
    ],
)
def test_overflow_where_jax_raises_too(build):
    with pytest.raises(OverflowError):
        build(jnp)
    with pytest.raises(OverflowError):
        build(nx)


@pytest.mark.parametrize(
    "build",
    [
        lambda: nx.tensor([float("nan")], dtype=nx.int32),
        lambda: nx.tensor(np.array([1.0, np.nan]), dtype=nx.int32),
        lambda: nx.tensor(float("nan"), dtype=nx.int32),
        lambda: nx.full((2,), float("nan"), dtype=nx.int32),
    ],
)
def test_nan_to_an_integer_dtype_raises_value_error(build):
    with pytest.raises(ValueError, match="NaN|nan"):
        build()


def test_imaginary_parts_are_never_dropped():
    with pytest.raises(TypeError, match="imaginary"):
        nx.tensor(np.array([1 + 2j]), dtype=nx.float32)
    with pytest.raises(TypeError, match="imaginary"):
        nx.full((2,), 1 + 2j, dtype=nx.float32)
    assert nx.tensor(np.array([1 + 0j]), dtype=nx.float32).tolist() == [1.0]


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize(
    "build",
    [
        lambda m: m.asarray([1e10, -1e10, 1.0], dtype=m.float16),
        lambda m: m.asarray(1e10, dtype=m.float16),
        lambda m: m.asarray(np.array([1e300, 1.0])),
        lambda m: m.asarray(1e300),
        lambda m: m.asarray([70000], dtype=m.float16),
        lambda m: m.full((2,), 1e10, dtype=m.float16),
        lambda m: m.asarray(np.array([1.5, -1.5, 2.7]), dtype=m.int32),  # truncates toward zero
        lambda m: m.asarray([2**31 - 1, -(2**31)]),
        lambda m: m.asarray(np.array([2**31 - 1, -(2**31)], dtype=np.int64)),
        lambda m: m.asarray([2**32 - 1], dtype=m.uint32),
        lambda m: m.asarray([2**70, 1.5]),
        lambda m: m.asarray([0, 2, -3], dtype=m.bool_),
    ],
)
def test_conversions_that_jax_allows_match_jax(build):
    want = build(jnp)
    got = build(nx)
    assert got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


# ---- non-numeric input -----------------------------------------------------------------------

NON_NUMERIC = [
    ("tensor", "object", lambda: nx.tensor(object())),
    ("tensor", "NoneType", lambda: nx.tensor(None)),
    ("tensor", "dict", lambda: nx.tensor({"a": 1})),
    ("tensor", "ndarray", lambda: nx.tensor(np.array([1, 2], dtype=object))),
    ("tensor", "list", lambda: nx.tensor([[1, 2], [3]])),  # ragged
    ("tensor", "str", lambda: nx.tensor("ab")),
    ("tensor", "bytes", lambda: nx.tensor(b"ab")),
    ("tensor", "list", lambda: nx.tensor([1, None])),
    ("tensor", "ndarray", lambda: nx.tensor(np.array(["a"]))),
    ("tensor", "set", lambda: nx.tensor({1, 2})),
    ("tensor", "NoneType", lambda: nx.Tensor(None)),
    ("asarray", "NoneType", lambda: nx.asarray(None)),
    ("asarray", "list", lambda: nx.asarray([1, "a"])),
    ("full", "NoneType", lambda: nx.full((2,), None)),
    ("full", "str", lambda: nx.full((2,), "a")),
    ("full_like", "dict", lambda: nx.full_like(nx.ones(2), {})),
    ("zeros_like", "NoneType", lambda: nx.zeros_like(None)),
    ("add", "dict", lambda: nx.ones(3) + {"a": 1}),
    ("multiply", "str", lambda: nx.ones(3) * "a"),
    ("where", "NoneType", lambda: nx.where(None, 1.0, 2.0)),
    ("exp", "object", lambda: nx.exp(object())),
    ("reshape", "NoneType", lambda: nx.reshape(None, 3)),
    ("take", "NoneType", lambda: nx.take(None, [0])),
    ("take", "list", lambda: nx.take(nx.ones(3), [[0], [1, 2]])),
    ("getitem", "NoneType", lambda: nx.core.ops.index.getitem(None, 0)),
    ("at[].set", "dict", lambda: nx.ones(3).at[0].set({})),
]


@pytest.mark.parametrize(
    "op, type_name, build",
    NON_NUMERIC,
    ids=[f"{o}-{t}-{i}" for i, (o, t, _) in enumerate(NON_NUMERIC)],
)
def test_non_numeric_input_raises_type_error_naming_the_function(op, type_name, build):
    with pytest.raises(TypeError) as e:
        build()
    msg = str(e.value)
    assert msg.startswith(f"nx.{op}:"), msg
    assert type_name in msg, msg
    assert "Error interpreting argument" not in msg
    assert "Python numbers" in msg  # says what is accepted


# ---- take / take_along_axis: jnp's modes -----------------------------------------------------

IDX = np.array([[0, -1, -4], [3, 5, 2]])  # in range, negative, too negative, too large
X34 = (np.arange(12, dtype=np.float32) - 5.5).reshape(3, 4)


IDX_FORMS = {
    "numpy": lambda a: a,
    "list": lambda a: a.tolist(),
    "tensor": lambda a: nx.tensor(a),
    "pending": lambda a: nx.tensor(a) * 1,
    "jax": lambda a: jnp.asarray(a),
    "int8": lambda a: nx.tensor(a.astype(np.int8)),
    "uint32": lambda a: nx.tensor(a.astype(np.uint32)),
}


@pytest.mark.parametrize("mode", [None, "fill", "clip", "wrap"])
@pytest.mark.parametrize("axis", [None, 0, 1, -1])
@pytest.mark.parametrize("form", list(IDX_FORMS))
def test_take_matches_jnp(mode, axis, form):
    raw = np.abs(IDX) if form == "uint32" else IDX
    idx = IDX_FORMS[form](raw)
    want = jnp.take(jnp.asarray(X34), jnp.asarray(raw), axis=axis, mode=mode)
    got = nx.take(nx.tensor(X34), idx, axis=axis, mode=mode)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


@pytest.mark.parametrize("dtype", [np.int32, np.uint8, np.bool_, np.float16, BF16, np.int8])
@pytest.mark.parametrize("fill_value", [None, 3])
def test_take_fill_values_match_jnp(dtype, fill_value):
    x = (np.arange(5) % 3).astype(dtype)
    idx = np.array([0, 7, -9, -1])
    want = jnp.take(jnp.asarray(x), idx, fill_value=fill_value)
    for i in (idx, nx.tensor(idx)):
        got = nx.take(nx.tensor(x), i, fill_value=fill_value)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(
            np.asarray(got.numpy(), np.float32), np.asarray(want, np.float32)
        )


@pytest.mark.parametrize("mode", [None, "fill", "clip"])
@pytest.mark.parametrize(
    "axis, idx",
    [
        (1, np.array([[0, -1, 4, -5], [2, 1, -4, 7], [3, 3, 0, -2]])),
        (0, np.array([[2, -1, 3, -4]])),  # broadcasts along axis 1
        (-1, np.array([[5], [-1], [1]])),
        (None, np.array([0, 11, -12, 12, -13])),
    ],
)
def test_take_along_axis_matches_jnp(mode, axis, idx):
    want = jnp.take_along_axis(jnp.asarray(X34), jnp.asarray(idx), axis=axis, mode=mode)
    for i in (idx, nx.tensor(idx) * 1, jnp.asarray(idx)):
        got = nx.take_along_axis(nx.tensor(X34), i, axis=axis, mode=mode)
        assert got.shape == want.shape
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))


@pytest.mark.parametrize("mode", [None, "clip", "wrap"])
@pytest.mark.parametrize("axis", [None, 1])
def test_take_gradients_match_jax_grad(mode, axis):
    w = np.arange(1.0, 7.0, dtype=np.float32).reshape(IDX.shape)
    if axis == 1:
        w = np.broadcast_to(w, (3, *IDX.shape))

    def f(m, x, i):
        y = m.take(x, i, axis=axis, mode=mode)
        return (m.where(y == y, y, 0.0) * w).sum()  # the NaN fill is masked out

    want = jax.grad(lambda x: f(jnp, x, jnp.asarray(IDX)))(jnp.asarray(X34))
    for idx in (IDX, nx.tensor(IDX)):
        got = nx.grad(lambda x, i=idx: f(nx, x, i))(nx.tensor(X34))
        np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-6)


@pytest.mark.parametrize("mode", [None, "clip"])
def test_take_along_axis_gradients_match_jax_grad(mode):
    idx = np.array([[0, -1, 4, -5], [2, 1, -4, 7], [3, 3, 0, -2]])
    w = np.arange(1.0, 13.0, dtype=np.float32).reshape(3, 4)

    def f(m, x):
        y = m.take_along_axis(x * x, idx, axis=1, mode=mode)
        return (m.where(y == y, y, 0.0) * w).sum()

    want = jax.grad(lambda x: f(jnp, x))(jnp.asarray(X34))
    got = nx.grad(lambda x: f(nx, x))(nx.tensor(X34))
    np.testing.assert_allclose(got.numpy(), np.asarray(want), rtol=1e-6)


@pytest.mark.parametrize("mode", [None, "clip", "wrap"])
def test_take_under_vmap_matches_jax_vmap(mode):
    xs = np.stack([X34, X34 * 2, -X34])
    idxs = np.stack([IDX, IDX[::-1], -IDX])
    for in_axes, args in (((0, None), (xs, IDX)), ((None, 0), (X34, idxs)), ((0, 0), (xs, idxs))):
        want = jax.vmap(lambda x, i: jnp.take(x, i, axis=1, mode=mode), in_axes)(*args)
        got = nx.vmap(lambda x, i: nx.take(x, i, axis=1, mode=mode), in_axes)(
            *(nx.tensor(a) for a in args)
        )
        np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    jac = jax.jacfwd(lambda x: jnp.take(x, IDX, mode=mode if mode else "fill", fill_value=0.0))
    njac = nx.jacfwd(lambda x: nx.take(x, IDX, mode=mode, fill_value=0.0))
    np.testing.assert_array_equal(njac(nx.tensor(X34)).numpy(), np.asarray(jac(jnp.asarray(X34))))


def test_take_along_axis_under_vmap_matches_jax_vmap():
    xs = np.stack([X34, X34 * 2])
    idx = np.array([[0, -1, 4, -5], [2, 1, -4, 7], [3, 3, 0, -2]])
    idxs = np.stack([idx, -idx])
    want = jax.vmap(lambda x, i: jnp.take_along_axis(x, i, axis=1))(xs, idxs)
    got = nx.vmap(lambda x, i: nx.take_along_axis(x, i, axis=1))(nx.tensor(xs), nx.tensor(idxs))
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


def test_take_mode_errors_and_empty_axes_follow_jnp():
    x = nx.ones((2, 3))
    with pytest.raises(ValueError, match="nx.take: mode='raise'"):
        nx.take(x, [0], mode="raise")
    with pytest.raises(ValueError):
        jnp.take_along_axis(jnp.ones((2, 3)), jnp.zeros((2, 1), int), axis=1, mode="wrap")
    with pytest.raises(ValueError, match="nx.take_along_axis: mode='wrap'"):
        nx.take_along_axis(x, np.zeros((2, 1), int), axis=1, mode="wrap")
    with pytest.raises(TypeError, match="nx.take: indices must be integers"):
        nx.take(x, [0.5])
    with pytest.raises(TypeError, match="nx.take_along_axis: indices must be integers"):
        nx.take_along_axis(x, nx.zeros((2, 1)), axis=1)
    with pytest.raises(IndexError, match="nx.take: cannot take from axis 0 of size 0"):
        nx.take(nx.ones((0, 3)), [0], axis=0)
    assert nx.take(nx.ones((0, 3)), np.zeros(0, int), axis=0).shape == (0, 3)
    e = jnp.take_along_axis(jnp.ones((2, 0)), jnp.zeros((2, 2), int), axis=1)
    got = nx.take_along_axis(nx.ones((2, 0)), np.zeros((2, 2), int), axis=1)
    np.testing.assert_array_equal(got.numpy(), np.asarray(e))


def test_integer_index_tensor_reads_follow_jax_indexing():
    # x[idx] in JAX: negative indices wrap once, then out-of-range reads clamp (values), and the
    # gradient of such a read is dropped (promise_in_bounds); nablax matches both
    idx = np.array([0, -1, -4, 3, 5, 2])
    w = np.arange(1.0, 7.0, dtype=np.float32)
    x = np.arange(3.0, dtype=np.float32)
    got = nx.tensor(x)[nx.tensor(idx)]
    np.testing.assert_array_equal(got.numpy(), np.asarray(jnp.asarray(x)[idx]))
    want = jax.grad(lambda v: (v[jnp.asarray(idx)] * w).sum())(jnp.asarray(x))
    g = nx.grad(lambda v: (v[nx.tensor(idx)] * w).sum())(nx.tensor(x))
    np.testing.assert_array_equal(g.numpy(), np.asarray(want))
    xs = np.stack([x, x + 10])
    want = jax.vmap(lambda v: v[jnp.asarray(idx)])(xs)
    got = nx.vmap(lambda v: v[nx.tensor(idx)])(nx.tensor(xs))
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))


# ---- errors of composite ops name the op the user called ------------------------------------

X = nx.ones((2, 3))
X3 = nx.ones((2, 3, 4))
COMPOSITE_ERRORS = [
    ("tile", lambda: nx.tile(X, -1)),
    ("tile", lambda: nx.tile(X, (2, -1))),
    ("tile", lambda: nx.tile(X, 1.5)),
    ("unsqueeze", lambda: nx.unsqueeze(X, 5)),
    ("unsqueeze", lambda: X.unsqueeze(-5)),
    ("permute", lambda: nx.permute(X, 0, 0)),
    ("permute", lambda: X.permute(0, 5)),
    ("moveaxis", lambda: nx.moveaxis(X3, [0, 0], [1, 2])),
    ("moveaxis", lambda: nx.moveaxis(X3, [0, 1], [2, 2])),
    ("repeat", lambda: nx.repeat(X, [1, 2, 3], axis=0)),
    ("repeat", lambda: nx.repeat(X, [-1, 1], axis=0)),
    ("repeat", lambda: nx.repeat(X, -1)),
    ("repeat", lambda: nx.repeat(X, 1.5)),
    ("chunk", lambda: nx.chunk(X, 1.5)),
    ("chunk", lambda: nx.chunk(X, 2, axis=5)),
    ("split", lambda: nx.split(X, 1.5)),
    ("split", lambda: nx.split(X, [0.5])),
    ("ravel", lambda: nx.ravel(None)),
    ("ravel", lambda: nx.ravel("a")),
    ("reshape", lambda: nx.reshape(X, "ab")),
    ("full", lambda: nx.full((2,), [1.0, 2.0, 3.0])),
    ("full", lambda: nx.full((-1,), 0.0)),
    ("zeros", lambda: nx.zeros((-1,))),
    ("ones", lambda: nx.ones((2, -3))),
    ("zeros", lambda: nx.zeros("ab")),
    ("full_like", lambda: nx.full_like(X, None)),
    ("ones_like", lambda: nx.ones_like("a")),
    ("take", lambda: nx.take(X, [0], axis=5)),
    ("take", lambda: nx.take(X, [0.5])),
    ("take_along_axis", lambda: nx.take_along_axis(X, [0], axis=0)),
    ("take_along_axis", lambda: nx.take_along_axis(X, np.zeros((2, 1), int), axis=None)),
    ("take_along_axis", lambda: nx.take_along_axis(X, np.zeros((3, 1), int), axis=1)),
    ("one_hot", lambda: nx.one_hot(nx.arange(3), -1)),
    ("one_hot", lambda: nx.one_hot(nx.arange(3), 2.5)),
    ("unbind", lambda: nx.unbind(nx.tensor(1.0))),
    ("unbind", lambda: nx.unbind(X, 3)),
    ("pad", lambda: nx.pad(X, 1, constant_values="a")),
    ("pad", lambda: nx.pad(X, "a")),
    ("arange", lambda: nx.arange("a")),
    ("linspace", lambda: nx.linspace(0, 1e20, 3, dtype=nx.int32)),
    ("linspace", lambda: nx.linspace(0, 1, 2.5)),
    ("linspace", lambda: nx.linspace("a", 1, 3)),
    ("eye", lambda: nx.eye(3, k=0.5)),
    ("asarray", lambda: nx.asarray(None)),
]


@pytest.mark.parametrize(
    "op, build", COMPOSITE_ERRORS, ids=[f"{o}-{i}" for i, (o, _) in enumerate(COMPOSITE_ERRORS)]
)
def test_composite_op_errors_name_the_op_called(op, build):
    before = nx.cache_info().realizations
    with pytest.raises((TypeError, ValueError, IndexError, OverflowError)) as e:
        build()
    assert str(e.value).startswith(f"nx.{op}:"), str(e.value)
    assert nx.cache_info().realizations == before  # raised when the op is built

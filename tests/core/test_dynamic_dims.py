"""``nx.compile(dynamic_dims=...)``: a Python decision on a symbolic size is never baked into the
trace. Every case runs the compiled function on a sweep of sizes (1, even, odd, prime) and
compares values, shapes, dtypes and Python outputs with running the function eagerly on each
size; decisions that depend on the size must fall back to one trace per size with one warning,
decisions that hold for every size (and shape-polymorphic code) must keep one trace."""

from __future__ import annotations

import math
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

SIZES = (4, 1, 2, 3, 7, 12)  # the first call traces; then 1, even, odd, prime, composite
DYN = {0: {0: "n"}}


def _x(n: int, cols: int = 3) -> nx.Tensor:
    return nx.tensor(np.arange(n * cols, dtype=np.float32).reshape(n, cols) / 7 - 1)


def _assert_same(got, want, n):
    got_leaves, got_def = jax.tree_util.tree_flatten(got, is_leaf=lambda v: v is None)
    want_leaves, want_def = jax.tree_util.tree_flatten(want, is_leaf=lambda v: v is None)
    assert got_def == want_def, (n, got_def, want_def)
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, nx.Tensor):
            assert isinstance(g, nx.Tensor), (n, g)
            assert (g.shape, g.dtype) == (w.shape, w.dtype), (n, g.shape, w.shape)
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-5, atol=1e-6)
        else:
            assert type(g) is type(w) and g == w, (n, g, w)


def _sweep(fn, dynamic_dims=DYN, make=lambda n: (_x(n),), sizes=SIZES, **kw):
    """Compile ``fn``, call it on every size (twice), compare with eager; return the compiled
    function and the warnings raised."""
    f = nx.compile(fn, dynamic_dims=dynamic_dims, **kw)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for n in sizes:
                args = make(n)
                _assert_same(f(*args), fn(*args), n)
    # the eager references compile a program per size at one line: nablax's recompile warning
    # (core/recompiles.py) is right to name it, and is not what these tests count
    return f, [str(w.message) for w in caught if "different programs" not in str(w.message)]


# ---- decisions that depend on the size: one trace per size, one warning ----------------------


def _loop(x):
    acc = x[0] * 0
    for i in range(x.shape[0]):
        acc = acc + x[i] * i
    return acc


def _caught(x):
    try:
        k = int(x.shape[0])
    except Exception:  # the decision is recorded even when the function swallows the error
        k = 1
    return x * k


SIZE_DEPENDENT = {
    "eq": lambda x: x * 2 if x.shape[0] == 4 else x,
    "ne": lambda x: x * 2 if x.shape[0] != 1 else x,
    "mod_eq": lambda x: x.reshape(2, -1) if x.shape[0] % 2 == 0 else x.reshape(1, -1),
    "mod_bool": lambda x: x * 2 if x.shape[0] % 2 else x,
    "divmod": lambda x: x * 2 if divmod(x.shape[0], 3)[1] == 0 else x,
    "floordiv_eq": lambda x: x * 2 if x.shape[0] // 2 * 2 == x.shape[0] else x,
    "minus_one_bool": lambda x: x * 2 if x.shape[0] - 1 else x,
    "lt": lambda x: x * 2 if x.shape[0] < 3 else x,
    "le": lambda x: x * 2 if x.shape[0] <= 3 else x,
    "gt": lambda x: x * 2 if x.shape[0] > 2 else x,
    "ge": lambda x: x * 2 if x.shape[0] >= 3 else x,
    "int": lambda x: x * int(x.shape[0]),
    "float": lambda x: x * float(x.shape[0]),
    "truediv": lambda x: x * (x.shape[0] / 2),
    "times_float": lambda x: x * (x.shape[0] * 0.5),
    "power_of_two": lambda x: x * (2 ** x.shape[0]),
    "hash_dict": lambda x: x * {4: 2.0, 12: 3.0}.get(x.shape[0], 1.0),
    "set_member": lambda x: x * 2 if x.shape[0] in {2, 7} else x,
    "tuple_member": lambda x: x * 2 if x.shape[0] in (2, 7) else x,
    "range": _loop,
    "len_range": lambda x: sum((x[i] for i in range(len(x))), x[0] * 0),
    "list_index": lambda x: x * [1.0, 2.0, 3.0][x.shape[0] % 3],
    "shape_tuple_eq": lambda x: x * 2 if x.shape == (4, 3) else x,
    "min": lambda x: x * min(x.shape[0], 3),
    "max": lambda x: x * max(x.shape[0], 3),
    "sorted": lambda x: x * sorted([x.shape[0], 3])[0],
    "abs": lambda x: x * abs(x.shape[0] - 3),
    "math_sqrt": lambda x: x * math.sqrt(x.shape[0]),
    "math_log2": lambda x: x * math.log2(x.shape[0]),
    "math_isqrt": lambda x: x * math.isqrt(x.shape[0]),
    "math_ceil": lambda x: x * math.ceil(x.shape[0] / 2),
    "format_spec": lambda x: (x, f"{x.shape[0]:03d}"),
    "bit_length": lambda x: x * x.shape[0].bit_length(),
    "numpy_array": lambda x: x + np.arange(x.shape[0], dtype=np.float32)[:, None],
    "caught": _caught,
}


@pytest.mark.parametrize("name", sorted(SIZE_DEPENDENT))
def test_size_dependent_decision_traces_per_size_with_one_warning(name):
    f, msgs = _sweep(SIZE_DEPENDENT[name])
    assert len(msgs) == 1, msgs
    assert "each size is traced on its own" in msgs[0].lower()
    assert "test_dynamic_dims.py:" in msgs[0]  # names the user's line
    info = f.cache_info()
    k = len(SIZES)
    # one abandoned symbolic trace, then one trace and one executable per size; the second
    # round of calls is all hits
    assert (info.traces, info.misses, info.hits, info.executables, info.size) == (
        k + 1,
        k,
        k,
        k,
        k,
    )


def _even_odd(x):
    if x.shape[0] % 2 == 0:
        return x.reshape(2, -1)
    return x.reshape(1, -1)


def test_even_odd_branch_is_not_baked_in():
    # JAX's symbolic `n % 2 == 0` is False for every n (structural comparison): without the
    # guard, every size took the odd branch
    f = nx.compile(_even_odd, dynamic_dims=DYN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shapes = [f(nx.ones((n, 6))).shape for n in (4, 3, 6, 1)]
    assert shapes == [(2, 12), (1, 18), (2, 18), (1, 6)]
    assert len(caught) == 1
    msg = str(caught[0].message)
    assert "mod(n, 2) == 0" in msg and "(if x.shape[0] % 2 == 0:)" in msg
    assert caught[0].filename == __file__  # the warning points at the call
    assert f.cache_info().traces == 5 and f.cache_info().executables == 4


def test_fallback_is_per_signature_and_clear_cache_forgets_it():
    f = nx.compile(lambda x: x * 2 if x.shape[0] > 2 else x, dynamic_dims=DYN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in (3, 1, 5):
            assert f(nx.ones((n, 2))).shape == (n, 2)
        # another signature (dtype) gets its own symbolic attempt (and its own warning)
        assert f(nx.ones((2, 2), nx.int32)).tolist() == [[1, 1], [1, 1]]
        assert len(caught) == 2
        assert f.cache_info().traces == 1 + 3 + 1 + 1
        f.clear_cache()
        assert f(nx.ones((3, 2))).tolist() == [[2.0, 2.0]] * 3
        assert len(caught) == 3 and f.cache_info().traces == 2


def test_fullgraph_true_still_traces_per_size():
    # a size decision is not a realization: no GraphBreakError, just one trace per size
    f, msgs = _sweep(SIZE_DEPENDENT["mod_eq"], fullgraph=True)
    assert len(msgs) == 1 and f.cache_info().traces == len(SIZES) + 1


# ---- decisions that hold for every size, and shape-polymorphic code: one trace -------------


POLYMORPHIC = {
    "n_eq_n": lambda x: x * 2 if x.shape[0] == x.shape[0] else x,
    "ge_1": lambda x: x * 2 if x.shape[0] >= 1 else x,
    "gt_0": lambda x: x * 2 if x.shape[0] > 0 else x,
    "lt_0": lambda x: x if x.shape[0] < 0 else x * 2,
    "ne_0": lambda x: x * 2 if x.shape[0] != 0 else x,
    "bool": lambda x: x * 2 if x.shape[0] else x,
    "two_n": lambda x: x * 2 if 2 * x.shape[0] == x.shape[0] + x.shape[0] else x,
    "mod_1": lambda x: x * 2 if x.shape[0] % 1 == 0 else x,
    "static_dim": lambda x: x * 2 if x.shape[1] == 3 else x,
    "max_1": lambda x: x.reshape(max(x.shape[0], 1), 3),
    "min_0": lambda x: x + min(x.shape[0], 0),
    "round_floor_pos": lambda x: x.reshape(round(x.shape[0]), math.floor(3)) + (+x.shape[0] * 0),
    "eq_string": lambda x: x * 2 if x.shape[0] != "n" else x,
    "ndim": lambda x: x.sum(0) if x.ndim == 2 else x,
    "size_as_tensor": lambda x: nx.where(nx.asarray(x.shape[0]) % 2 == 0, x * 2, x - 1),
}


@pytest.mark.parametrize("name", sorted(POLYMORPHIC))
def test_decision_true_for_every_size_keeps_one_trace(name):
    f, msgs = _sweep(POLYMORPHIC[name])
    assert msgs == []
    info = f.cache_info()
    assert (info.traces, info.misses, info.executables, info.size) == (1, 1, len(SIZES), 1)


def test_sizes_as_tensor_values():
    def f(x):
        n = x.shape[0]
        return x.sum(0) / n, x * n, n * x, x - n // 2, (x + n % 3) * (n - 1), x.mean(0) * n

    g, msgs = _sweep(f)
    assert msgs == [] and g.cache_info().traces == 1


def test_reshape_and_creation_with_symbolic_dims():
    def f(x):
        n = x.shape[0]
        return (
            x.reshape(n, -1, 1),
            x.reshape(1, n * 3),
            x.reshape(1, math.prod(x.shape)),
            x.reshape(3, -1),
            x.reshape(-1),
            x + nx.zeros((n, 3)),
            nx.broadcast_to(x[:, :1], (n, 5)),
            nx.concatenate([x, x * 2], axis=0).reshape(2, n, 3).sum(0),
        )

    g, msgs = _sweep(f)
    assert msgs == [] and g.cache_info().traces == 1


def test_ops_after_symbolic_dims_stay_polymorphic():
    def f(x):
        y = (x.T @ x, x @ x.T, nx.einsum("ij,kj->ik", x, x), nx.tile(x, (2, 1)), x[None])
        return y, nx.softmax(x, axis=0), nx.cumsum(x, axis=0), nx.flip(x, 0), x + x[:1]

    g, msgs = _sweep(f)
    assert msgs == [] and g.cache_info().traces == 1


def test_sizes_returned_as_python_values_are_each_calls_ints():
    def f(x):
        n = x.shape[0]
        return x * 2, n, n // 2, {"rows": (n * 3, "tag"), "cols": x.shape[1]}

    g, msgs = _sweep(f)  # _assert_same checks type int and value per size
    assert msgs == [] and g.cache_info().traces == 1


def test_two_arguments_sharing_a_name():
    def f(x, y):
        same = x.shape[0] == y.shape[0]  # one symbol: equal for every size
        return (x * y).sum(0) / x.shape[0], same, nx.concatenate([x, y], axis=1)

    make = lambda n: (_x(n), _x(n, 3) * 2)  # noqa: E731
    g, msgs = _sweep(f, {0: {0: "n"}, 1: {0: "n"}}, make)
    assert msgs == [] and g.cache_info().traces == 1
    # two names: their equality depends on the sizes
    h, msgs = _sweep(f, {0: {0: "n"}, 1: {0: "m"}}, make)
    assert len(msgs) == 1 and "n == m" in msgs[0]
    assert h.cache_info().traces == len(SIZES) + 1


def test_grad_and_vmap_inside_the_compiled_function():
    w = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)

    def f(x, w):
        loss = lambda w: ((x @ w) ** 2).sum() / x.shape[0]  # noqa: E731
        rows = nx.vmap(lambda r: r * 2 + r.sum() / r.shape[0])(x)
        per_row = nx.vmap(nx.grad(lambda r: (r**2).sum() * x.shape[0]))(x)
        return nx.grad(loss)(w), rows, per_row

    def f_jax(x, w):
        n = x.shape[0]
        return (
            jax.grad(lambda w: ((x @ w) ** 2).sum() / n)(w),
            jax.vmap(lambda r: r * 2 + r.sum() / r.shape[0])(x),
            jax.vmap(jax.grad(lambda r: (r**2).sum() * n))(x),
        )

    g, msgs = _sweep(f, make=lambda n: (_x(n), nx.tensor(w)))
    assert msgs == [] and g.cache_info().traces == 1
    for n in SIZES:  # and against JAX
        for a, b in zip(g(_x(n), nx.tensor(w)), f_jax(jnp.asarray(_x(n).numpy()), w)):
            np.testing.assert_allclose(a.numpy(), b, rtol=1e-5, atol=1e-6)


def test_size_dependent_decision_inside_grad_falls_back():
    def f(x):
        return nx.grad(lambda x: (x**2).sum() * (2.0 if x.shape[0] % 2 == 0 else 3.0))(x)

    g, msgs = _sweep(f)
    assert len(msgs) == 1 and g.cache_info().traces == len(SIZES) + 1


def test_size_zero_is_traced_on_its_own():
    # jax.export sizes are >= 1 (and the guard relies on it): size 0 gets a concrete trace
    f, msgs = _sweep(lambda x: (x.sum(0), x.shape[0] >= 1), sizes=(3, 0, 5, 0))
    assert msgs == []
    assert (f.cache_info().traces, f.cache_info().size) == (2, 2)


def test_a_size_kept_past_its_trace_is_an_error():
    kept = []

    def f(x):
        kept.append(x.shape[0])
        return x * 2

    nx.compile(f, dynamic_dims=DYN)(nx.ones((2, 2)))
    assert str(kept[0]) == "n"
    with pytest.raises(ValueError, match="from a trace that is over"):
        bool(kept[0] == 2)


def test_compiled_helper_inside_sees_the_same_guarded_sizes():
    # the inner compiled function runs inline in the outer trace, on the outer symbolic sizes
    helper = nx.compile(lambda x: x.sum(0) / x.shape[0])
    f, msgs = _sweep(lambda x: helper(x) * 2)
    assert msgs == [] and f.cache_info().traces == 1
    branchy = nx.compile(lambda x: x * 2 if x.shape[0] % 2 == 0 else x)
    f, msgs = _sweep(lambda x: branchy(x) + 1)
    assert len(msgs) == 1 and f.cache_info().traces == len(SIZES) + 1


def test_tensors_kept_from_a_symbolic_trace_never_join_eager_programs():
    # a tensor built in the trace from a captured tensor has a symbolic shape: it must not be
    # computed along with a later eager program that reads the same captured tensor
    b = nx.tensor([1.0, 2.0, 3.0])
    kept = []

    def f(x):
        y = nx.broadcast_to(b, (x.shape[0], 3)) * 2
        kept.append(y)
        return x + y

    assert nx.compile(f, dynamic_dims=DYN)(nx.ones((4, 3))).tolist() == [[3.0, 5.0, 7.0]] * 4
    assert (b * 2).tolist() == [2.0, 4.0, 6.0]

"""``nx.vmap``, generated from the op table (``op_specs.py``) and the primitive registry, plus the
composition matrix with autodiff (against JAX), pytree ``in_axes``/``out_axes`` and errors.

Each op case runs under ``nx.vmap`` on a batch of 3 examples (the case's arrays with their
elements shuffled, so values stay in the op's domain) and is compared with a Python loop over the
examples: every tensor argument mapped at axis 0; the first mapped at its last axis (the others
broadcast with ``in_axes=None``); and, with two or more tensor arguments, the first broadcast and
the second mapped.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.core.primitive import REGISTRY

try:
    from . import op_specs as S
except ImportError:  # tests/ is not a package: pytest put this directory on sys.path
    import op_specs as S

B = 3
_MAX_CASES = 3


def _is_arrays(a) -> bool:
    """An array argument, or a list of arrays (concatenate, stack): mapped as one."""
    if isinstance(a, list):
        return bool(a) and all(isinstance(v, np.ndarray) for v in a)
    return isinstance(a, np.ndarray)


def _tensor_slots(case) -> list[int]:
    return [k for k, a in enumerate(case.args) if _is_arrays(a)]


def _configs(case):
    slots = _tensor_slots(case)
    if not slots:
        return []
    out = [("all0", {k: 0 for k in slots})]
    first = case.args[slots[0]]
    first = first[0] if isinstance(first, list) else first
    out.append(("first_last", {slots[0]: first.ndim}))  # the new axis after the last one
    if len(slots) > 1:
        out.append(("second0", {slots[1]: 0}))
    return out


def _params():
    out = []
    for spec in S.SPECS:
        if not spec.lazy:
            continue  # data-dependent shapes (boolean masks) cannot be batched, as in JAX
        dt = spec.dtypes[0]
        for i, case in enumerate(spec.cases(dt)[:_MAX_CASES]):
            if (
                case.xfail is not None
                or case.kwargs
                and any(isinstance(v, np.ndarray) for v in case.kwargs.values())
            ):
                continue
            for name, axes in _configs(case):
                out.append(pytest.param(spec, case, axes, id=f"{spec.name}-{i}-{name}"))
    return out


VMAP_PARAMS = _params()


def _examples(a, rng) -> list:
    if isinstance(a, list):
        per = [_examples(v, rng) for v in a]
        return [[p[e] for p in per] for e in range(B)]
    flat = a.reshape(-1)
    return [a] + [rng.permutation(flat).reshape(a.shape) for _ in range(B - 1)]


def _stack(outs: list, axis: int = 0):
    return np.stack([np.asarray(o) for o in outs], axis=axis)


@pytest.mark.parametrize("spec,case,axes", VMAP_PARAMS)
def test_vmap_matches_python_loop(spec, case, axes):
    rng = np.random.default_rng(sum(map(ord, spec.name)))
    per_example = {k: _examples(case.args[k], rng) for k in axes}
    kwargs = S.to_nx(case.kwargs)

    def example_args(e):
        return [per_example[k][e] if k in axes else a for k, a in enumerate(case.args)]

    # the loop: the op on each example, unbatched
    loop_outs = [S.outputs(spec.fn(*S.to_nx(example_args(e)), **kwargs)) for e in range(B)]
    # vmap: mapped arguments stacked along their in_axes
    batched_args, in_axes = [], []
    for k, a in enumerate(case.args):
        if k in axes:
            ex = per_example[k]
            if isinstance(a, list):
                cols = [[ex[e][i] for e in range(B)] for i in range(len(a))]
                batched_args.append([nx.tensor(_stack(c, axes[k])) for c in cols])
            else:
                batched_args.append(nx.tensor(_stack(ex, axes[k])))
            in_axes.append(axes[k])
        else:
            batched_args.append(S.to_nx(a))
            in_axes.append(None)

    def f(*xs):
        return tuple(S.outputs(spec.fn(*xs, **kwargs)))

    got = nx.vmap(f, in_axes=tuple(in_axes))(*batched_args)
    assert len(got) == len(loop_outs[0])
    for j, g in enumerate(got):
        want = _stack([loop[j].numpy() for loop in loop_outs])
        assert g.shape == want.shape and g.dtype == want.dtype, (j, g.shape, want.shape)
        rtol, atol = S.tolerance(g.dtype, spec.tol_scale)
        S.assert_close(g.numpy(), want, rtol, atol, f"{spec.name} output {j} (vmap vs loop)")


def test_every_primitive_has_a_batching_rule():
    missing = sorted(n for n, p in REGISTRY.items() if p.batch is None)
    assert not missing, f"primitives without a batch rule: {missing}"


def test_every_batchable_primitive_is_vmap_checked():
    checked = set()
    for p in VMAP_PARAMS:
        checked |= p.values[0].prims
    # iota has no inputs (never batched); the vmap view primitives are exercised by every test
    exempt = {"iota", "incr_batch_dims", "decr_batch_dims"} | set(S.STAGING_ONLY)
    missing = sorted(set(REGISTRY) - checked - exempt)
    assert not missing, f"primitives no vmap test exercises: {missing}"


# ---- axes, nesting, pytrees --------------------------------------------------------------------


def _x(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("in_axis", [0, 1, 2, -1, -3])
@pytest.mark.parametrize("out_axis", [0, 1, -1])
def test_in_and_out_axes_match_jax(in_axis, out_axis):
    x = _x((2, 3, 4))
    f_nx = lambda t: nx.tanh(t) @ nx.ones((t.shape[-1], 5)) + t.sum()  # noqa: E731
    f_j = lambda t: jnp.tanh(t) @ jnp.ones((t.shape[-1], 5)) + t.sum()  # noqa: E731
    got = nx.vmap(f_nx, in_axes=in_axis, out_axes=out_axis)(nx.tensor(x))
    want = jax.vmap(f_j, in_axes=in_axis, out_axes=out_axis)(x)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


def test_nested_vmap_matches_jax():
    a, b = _x((3, 4)), _x((5, 4), 1)
    f_nx = lambda u, v: (u * v).sum() + nx.sin(u).max()  # noqa: E731
    f_j = lambda u, v: (u * v).sum() + jnp.sin(u).max()  # noqa: E731
    got = nx.vmap(nx.vmap(f_nx, in_axes=(None, 0)), in_axes=(0, None))(nx.tensor(a), nx.tensor(b))
    want = jax.vmap(jax.vmap(f_j, in_axes=(None, 0)), in_axes=(0, None))(a, b)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    # three levels, the middle one unmapped for one argument
    c = _x((2, 3, 5, 4), 2)
    g_nx = nx.vmap(nx.vmap(nx.vmap(f_nx), in_axes=(None, 0)), in_axes=(0, 0))
    g_j = jax.vmap(jax.vmap(jax.vmap(f_j), in_axes=(None, 0)), in_axes=(0, 0))
    a2 = _x((2, 5, 4), 3)
    np.testing.assert_allclose(
        g_nx(nx.tensor(a2), nx.tensor(c)).numpy(), g_j(a2, c), rtol=1e-5, atol=1e-5
    )


def test_pytree_in_axes_and_outputs():
    params = {"w": _x((4, 2)), "b": _x((2,), 1)}
    xs = _x((6, 4), 2)

    def f_nx(p, x):
        y = x @ p["w"] + p["b"]
        return {"y": y, "n": (y * y).sum()}, [x.mean()]

    def f_j(p, x):
        y = x @ p["w"] + p["b"]
        return {"y": y, "n": (y * y).sum()}, [x.mean()]

    p_nx = {k: nx.tensor(v) for k, v in params.items()}
    got = nx.vmap(f_nx, in_axes=({"w": None, "b": None}, 0), out_axes=({"y": 1, "n": 0}, [0]))(
        p_nx, nx.tensor(xs)
    )
    want = jax.vmap(f_j, in_axes=({"w": None, "b": None}, 0), out_axes=({"y": 1, "n": 0}, [0]))(
        params, xs
    )
    for g, w in zip(nx.tree.leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(g.numpy(), w, rtol=1e-5, atol=1e-5)
    # an unmapped output is broadcast along the batch axis, as in JAX
    out = nx.vmap(lambda x, c: c * 2, in_axes=(0, None))(nx.tensor(xs), nx.tensor(1.5))
    assert out.shape == (6,) and out.tolist() == [3.0] * 6
    # out_axes=None for an unbatched output returns it once
    out = nx.vmap(lambda x, c: (x.sum(), c), in_axes=(0, None), out_axes=(0, None))(
        nx.tensor(xs), nx.tensor(1.5)
    )
    assert out[1].shape == () and out[0].shape == (6,)
    # axis_size with nothing mapped
    out = nx.vmap(lambda c: c + 1, in_axes=None, axis_size=4)(nx.tensor(1.0))
    assert out.tolist() == [2.0] * 4
    # keyword arguments are mapped over axis 0
    out = nx.vmap(lambda x, *, s: x * s)(nx.tensor(xs[:3, 0]), s=nx.tensor([1.0, 2.0, 3.0]))
    np.testing.assert_allclose(out.numpy(), xs[:3, 0] * [1, 2, 3])


def test_random_under_vmap_matches_jax():
    keys = jax.random.split(jax.random.key_data(jax.random.PRNGKey(0)), 4)
    got = nx.vmap(lambda k: nx.random.normal(k, (3,)))(nx.tensor(np.asarray(keys)))
    want = jax.vmap(lambda k: jax.random.normal(jax.random.wrap_key_data(k), (3,)))(keys)
    np.testing.assert_array_equal(got.numpy(), np.asarray(want))
    # a broadcast key gives every example the same numbers, as in JAX
    k = nx.tensor(np.asarray(keys[0]))
    got = nx.vmap(lambda x, k: x + nx.random.uniform(k, (3,)), in_axes=(0, None))(
        nx.zeros((2, 3)), k
    )
    np.testing.assert_array_equal(got.numpy()[0], got.numpy()[1])


# ---- compositions with autodiff ----------------------------------------------------------------


def _loss_nx(w, x, y):
    return (nx.tanh(x @ w) - y).__pow__(2).mean()


def _loss_j(w, x, y):
    return ((jnp.tanh(x @ w) - y) ** 2).mean()


def _data():
    return _x((4, 3)), _x((8, 4), 1), _x((8, 3), 2)


def test_vmap_of_grad_gives_per_example_gradients():
    w, x, y = _data()
    got = nx.vmap(nx.grad(_loss_nx), in_axes=(None, 0, 0))(
        nx.tensor(w), nx.tensor(x[:, None]), nx.tensor(y[:, None])
    )
    want = jax.vmap(jax.grad(_loss_j), in_axes=(None, 0, 0))(w, x[:, None], y[:, None])
    assert got.shape == (8, 4, 3)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-6)


def test_grad_of_vmap_matches_jax():
    w, x, y = _data()

    def total_nx(w):
        return nx.vmap(lambda xi, yi: _loss_nx(w, xi, yi))(
            nx.tensor(x[:, None]), nx.tensor(y[:, None])
        ).sum()

    def total_j(w):
        return jax.vmap(lambda xi, yi: _loss_j(w, xi, yi))(x[:, None], y[:, None]).sum()

    np.testing.assert_allclose(
        nx.grad(total_nx)(nx.tensor(w)).numpy(), jax.grad(total_j)(w), rtol=1e-5, atol=1e-6
    )


def test_vmap_of_vmap_of_grad_and_vmap_of_jvp_match_jax():
    w, x, y = _data()
    xs, ys = x.reshape(2, 4, 1, 4), y.reshape(2, 4, 1, 3)
    g = nx.vmap(nx.vmap(nx.grad(_loss_nx), in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    gj = jax.vmap(jax.vmap(jax.grad(_loss_j), in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    np.testing.assert_allclose(
        g(nx.tensor(w), nx.tensor(xs), nx.tensor(ys)).numpy(), gj(w, xs, ys), rtol=1e-5, atol=1e-6
    )
    tangents = _x((5, 4, 3), 4)

    def jv_nx(t):
        return nx.jvp(lambda w: _loss_nx(w, nx.tensor(x), nx.tensor(y)), (nx.tensor(w),), (t,))[1]

    def jv_j(t):
        return jax.jvp(lambda w: _loss_j(w, x, y), (w,), (t,))[1]

    np.testing.assert_allclose(
        nx.vmap(jv_nx)(nx.tensor(tangents)).numpy(), jax.vmap(jv_j)(tangents), rtol=1e-5
    )


def test_jacobians_and_hessian_on_vmap_match_jax():
    x = _x((3,))
    f_nx = lambda v: nx.stack([nx.sin(v).sum() * v[0], (v * v).prod(), v[1] ** 3])  # noqa: E731
    f_j = lambda v: jnp.stack([jnp.sin(v).sum() * v[0], (v * v).prod(), v[1] ** 3])  # noqa: E731
    for nfn, jfn in ((nx.jacrev, jax.jacrev), (nx.jacfwd, jax.jacfwd)):
        np.testing.assert_allclose(
            nfn(f_nx)(nx.tensor(x)).numpy(), jfn(f_j)(x), rtol=1e-5, atol=1e-6
        )
    s_nx = lambda v: (nx.sin(v) * v).sum() * v[0]  # noqa: E731
    s_j = lambda v: (jnp.sin(v) * v).sum() * v[0]  # noqa: E731
    np.testing.assert_allclose(
        nx.hessian(s_nx)(nx.tensor(x)).numpy(), jax.hessian(s_j)(x), rtol=1e-5, atol=1e-6
    )


# ---- errors ------------------------------------------------------------------------------------


def test_mismatched_sizes_name_the_arguments():
    with pytest.raises(ValueError, match=r"args\[0\] has size 3, args\[1\] has size 4"):
        nx.vmap(lambda a, b: a + b)(nx.ones((3, 2)), nx.ones((4, 2)))


def test_python_if_on_batched_value_suggests_where():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(nx.errors.ConcretizationError, match="nx.where"):
        nx.vmap(f)(nx.ones((3, 2)))


def test_non_tensor_output_and_bad_axes_raise_clearly():
    with pytest.raises(TypeError, match="returned a str at output"):
        nx.vmap(lambda x: "no")(nx.ones(3))
    with pytest.raises(ValueError, match=r"in_axes=2 for args\[0\].*shape \(3,\)"):
        nx.vmap(lambda x: x, in_axes=2)(nx.ones(3))
    with pytest.raises(ValueError, match="in_axes has 1 entries"):
        nx.vmap(lambda a, b: a, in_axes=(0,))(nx.ones(3), nx.ones(3))
    with pytest.raises(ValueError, match="axis_size"):
        nx.vmap(lambda a: a, in_axes=None)(nx.ones(3))
    with pytest.raises(ValueError, match="out_axes is None"):
        nx.vmap(lambda a: a, out_axes=None)(nx.ones(3))
    with pytest.raises(TypeError, match="no axis to map"):
        nx.vmap(lambda a: a)(1.0)


def test_jacobians_of_functions_that_use_vmap_match_jax():
    X, w = _x((5, 3)), _x((3,), 1)

    def f_nx(w):
        return nx.vmap(lambda x: nx.sin((x * w).sum()))(nx.tensor(X))

    def f_j(w):
        return jax.vmap(lambda x: jnp.sin((x * w).sum()))(X)

    for nfn, jfn in ((nx.jacrev, jax.jacrev), (nx.jacfwd, jax.jacfwd)):
        np.testing.assert_allclose(
            nfn(f_nx)(nx.tensor(w)).numpy(), jfn(f_j)(w), rtol=1e-5, atol=1e-6
        )
    np.testing.assert_allclose(
        nx.hessian(lambda w: f_nx(w).sum())(nx.tensor(w)).numpy(),
        jax.hessian(lambda w: f_j(w).sum())(w),
        rtol=1e-5,
        atol=1e-6,
    )
    # vmapping the vjp function of such an f by hand: the new level stays apart from f's own
    _, pull = nx.vjp(f_nx, nx.tensor(w))
    _, pull_j = jax.vjp(f_j, w)
    cts = _x((4, 5), 2)
    np.testing.assert_allclose(
        nx.vmap(pull)(nx.tensor(cts))[0].numpy(), jax.vmap(pull_j)(cts)[0], rtol=1e-5, atol=1e-6
    )


def test_grad_through_nested_vmaps_with_broadcast_levels_matches_jax():
    A, Bm, w = _x((2, 3)), _x((4, 3), 1), _x((3,), 2)

    def g_nx(w):
        inner = nx.vmap(lambda a, b: (a * b * w).sum() ** 2, in_axes=(None, 0))
        return nx.vmap(inner, in_axes=(0, None))(nx.tensor(A), nx.tensor(Bm)).sum()

    def g_j(w):
        inner = jax.vmap(lambda a, b: (a * b * w).sum() ** 2, in_axes=(None, 0))
        return jax.vmap(inner, in_axes=(0, None))(A, Bm).sum()

    np.testing.assert_allclose(nx.grad(g_nx)(nx.tensor(w)).numpy(), jax.grad(g_j)(w), rtol=1e-5)

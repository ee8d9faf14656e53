"""Misuse of the autodiff API raises clear errors (DESIGN.md, convention 4): the message names the
API, the user's function, the argument path (``args[1]['w']``), shapes and dtypes. Errors are raised
before any value is computed."""

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


def _x(*shape, dtype=nx.float32):
    return nx.ones(shape, dtype=dtype) * 2  # pending: an error found at realization would show


# ---- grad / value_and_grad -------------------------------------------------------------------


@pytest.mark.parametrize("api", [nx.grad, nx.value_and_grad])
@pytest.mark.parametrize("shape", [(3,), (2, 4)])
def test_grad_of_non_scalar_output(api, shape):
    def vector_loss(w):
        return w * 2.0

    name = api.__name__
    _raises(TypeError, lambda: api(vector_loss)(_x(*shape)), name, "vector_loss", _shape_re(shape))


def test_grad_of_non_tensor_or_integer_output():
    def returns_float(w):
        return 3.0

    def counts(w):
        return (w > 0).sum()

    _raises(TypeError, lambda: nx.grad(returns_float)(_x(3)), "returns_float", "float")
    _raises(TypeError, lambda: nx.grad(counts)(_x(3)), "counts", "int32")


@pytest.mark.parametrize(
    "argnums,args,path,dtype",
    [
        (0, lambda: (_x(3, dtype=nx.int32), {"w": _x(3)}), "args[0]", "int32"),
        (1, lambda: (_x(3), {"w": _x(3, dtype=nx.int32)}), "args[1]['w']", "int32"),
        ((0, 1), lambda: (_x(3), {"w": _x(3, dtype=nx.bool_)}), "args[1]['w']", "bool"),
        (0, lambda: ((_x(3), _x(3, dtype=nx.int32)), None), "args[0][1]", "int32"),
        (0, lambda: (2, None), "args[0]", "int32"),
    ],
    ids=["int", "dict_int", "dict_bool", "tuple", "python_int"],
)
def test_grad_wrt_integer_input(argnums, args, path, dtype):
    def loss(a, p):
        return nx.sum(nx.tree.leaves(a)[0] * 1.0)

    for api in (nx.grad, nx.value_and_grad):
        _raises(TypeError, lambda api=api: api(loss, argnums=argnums)(*args()), "loss", path, dtype)


def test_grad_wrt_integer_dataclass_field():
    @nx.tree.register_dataclass
    class P:
        w: object
        n: object

    def loss(p):
        return (p.w * p.n).sum()

    _raises(TypeError, lambda: nx.grad(loss)(P(_x(2), _x(2, dtype=nx.int32))), "args[0].n", "int32")


def test_integer_inputs_outside_argnums_are_fine():
    def loss(w, idx):
        return (w * idx).sum()

    w = nx.tensor([1.0, 2.0, 3.0])
    g = nx.grad(loss)(w, nx.tensor([1, 0, 2]))
    np.testing.assert_array_equal(g.numpy(), [1.0, 0.0, 2.0])


def test_grad_of_non_array_argument_and_bad_argnums():
    def loss(w):
        return w.sum()

    _raises(TypeError, lambda: nx.grad(loss)("abc"), "args[0]", "str", "loss")
    _raises(ValueError, lambda: nx.grad(loss, argnums=2)(_x(3)), "argnums=2", "loss")


@pytest.mark.parametrize(
    "out",
    [lambda w: w.sum(), lambda w: (w.sum(), 1, 2), lambda w: [w.sum()]],
    ids=["bare", "triple", "single_list"],
)
def test_has_aux_needs_a_pair(out):
    def with_aux(w):
        return out(w)

    for api in (nx.grad, nx.value_and_grad):
        _raises(
            TypeError,
            lambda api=api: api(with_aux, has_aux=True)(_x(3)),
            "has_aux",
            "with_aux",
            "pair",
        )
    _raises(TypeError, lambda: nx.vjp(with_aux, _x(3), has_aux=True), "nx.vjp", "with_aux", "pair")


# ---- vjp / jvp -------------------------------------------------------------------------------


def test_vjp_cotangent_of_wrong_shape_or_structure():
    def double(w):
        return w * 2.0

    _, f_vjp = nx.vjp(double, _x(3))
    _raises(ValueError, lambda: f_vjp(nx.ones(2)), "nx.vjp", "double", "(2,)", "(3,)")
    _raises(ValueError, lambda: f_vjp(nx.ones((3, 1))), "(3, 1)", "(3,)")
    _raises(ValueError, lambda: f_vjp((nx.ones(3), nx.ones(3))), "nx.vjp", "structure", "double")

    def pair(w):
        return {"a": w, "b": w.sum()}

    _, f_vjp = nx.vjp(pair, _x(3))
    _raises(ValueError, lambda: f_vjp({"a": nx.ones(3), "b": nx.ones(3)}), "['b']", "(3,)", "()")


def test_jvp_tangent_mismatch():
    def f(a, p):
        return a * p["b"]

    a, b = _x(3), _x(3)
    good = (nx.ones(3), {"b": nx.ones(3)})
    _raises(
        ValueError,
        lambda: nx.jvp(f, (a, {"b": b}), (nx.ones(2), good[1])),
        "primals[0]",
        "(2,)",
        "(3,)",
    )
    _raises(
        ValueError,
        lambda: nx.jvp(f, (a, {"b": b}), (good[0], {"b": nx.ones(4)})),
        "primals[1]['b']",
        "(4,)",
    )
    for dt in (nx.float16, nx.int32):
        bad = (good[0], {"b": nx.ones(3, dtype=dt)})
        _raises(
            TypeError,
            lambda bad=bad: nx.jvp(f, (a, {"b": b}), bad),
            "primals[1]['b']",
            str(np.dtype(dt)),
            "float32",
        )
    _raises(ValueError, lambda: nx.jvp(f, (a, {"b": b}), (good[0],)), "2 primal", "1 tangent")
    _raises(ValueError, lambda: nx.jvp(f, (a, {"b": b}), (good[0], (nx.ones(3),))), "structure")
    _raises(TypeError, lambda: nx.jvp(lambda v: v, a, nx.ones(3)), "tuples")


# ---- backward --------------------------------------------------------------------------------


def test_backward_of_non_scalar_needs_gradient():
    w = nx.tensor([1.0, 2.0]).requires_grad_()
    _raises(RuntimeError, lambda: (w * 2.0).backward(), "backward", _shape_re((2,)), "gradient")
    assert w.grad is None


def test_requires_grad_of_integer_tensor():
    _raises(TypeError, lambda: nx.tensor([1, 2]).requires_grad_(), "requires_grad_", "int32")


def test_backward_with_gradient_of_wrong_shape():
    w = nx.tensor([1.0, 2.0]).requires_grad_()
    _raises(ValueError, lambda: (w * 2.0).backward(nx.ones(3)), "backward", "(3,)", "(2,)")


def test_backward_without_requires_grad_leaves():
    y = nx.tensor([1.0, 2.0])
    realized = y.sum()
    realized.item()
    _raises(RuntimeError, realized.backward, "requires_grad_")
    _raises(RuntimeError, (y * 2.0).sum().backward, "requires_grad_")


# ---- custom_vjp ------------------------------------------------------------------------------


def _custom(bwd, fwd=None):
    @nx.custom_vjp
    def scaled(x, y):
        return x * y

    if bwd is not None:
        scaled.defvjp(fwd or (lambda x, y: (x * y, (x, y))), bwd)
    return scaled


def test_custom_vjp_errors():
    x, y = _x(3), _x(3)

    def loss(f):
        return lambda a: f(a, y).sum()

    f = _custom(None)
    _raises(TypeError, lambda: nx.grad(loss(f))(x), "scaled", "defvjp")
    f = _custom(lambda res, g: (g * res[1],))
    _raises(TypeError, lambda: nx.grad(loss(f))(x), "bwd", "scaled", "2")
    f = _custom(lambda res, g: (g.sum(), g))
    _raises(ValueError, lambda: nx.grad(loss(f))(x), "bwd", "args[0]", "(3,)")
    f = _custom(lambda res, g: (g, g), fwd=lambda x, y: x * y)
    _raises(TypeError, lambda: nx.grad(loss(f))(x), "fwd", "scaled")
    f = _custom(lambda res, g: (g * res[1], g * res[0]))
    _raises(TypeError, lambda: nx.jvp(lambda a: f(a, y), (x,), (nx.ones(3),)), "nx.jvp", "scaled")

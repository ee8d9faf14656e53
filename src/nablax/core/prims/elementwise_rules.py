"""JVP/VJP rules of the elementwise primitives (see ``_rules.py`` for the rule signatures).

Unary and binary primitives get their rules from tables of partial derivatives written with nablax
ops; primitives without a partial have a zero derivative or no float output.
"""

from __future__ import annotations

import math

from ..tensor import Tensor
from . import _shard
from ._batch import elementwise_rule
from ._rules import nondifferentiable, unbroadcast
from .elementwise import (
    _SCALARS,
    BINARY,
    PRIMS,
    UNARY,
    _stop_gradient,
    astype,
    convert,
    cos,
    cosh,
    divide,
    dtypes,
    equal,
    exp,
    floor,
    greater_equal,
    log,
    negative,
    power,
    rsqrt,
    select,
    sin,
    sinh,
    where,
)
from .shape import broadcast_to

# ---- derivatives -----------------------------------------------------------------------------
# d(out)/d(x) of unary primitives, as nablax ops of (x, out). Primitives absent here have a zero
# derivative (sign, floor, ...) or no float output (isnan, invert).


def _unary_partials():
    two_over_sqrt_pi = 2 / math.sqrt(math.pi)
    ln2, inv_ln10 = math.log(2), 1 / math.log(10)
    return {
        "negative": lambda x, y: -1.0,
        "abs": lambda x, y: where(greater_equal(x, 0), 1.0, -1.0),  # JAX: 1 at 0
        "exp": lambda x, y: y,
        "log": lambda x, y: 1.0 / x,
        "log1p": lambda x, y: 1.0 / (x + 1.0),
        "log2": lambda x, y: 1.0 / x / ln2,
        "log10": lambda x, y: 1.0 / x * inv_ln10,
        "expm1": lambda x, y: y + 1.0,
        "sqrt": lambda x, y: 0.5 / y,
        "rsqrt": lambda x, y: -0.5 * y / x,
        "sin": lambda x, y: cos(x),
        "cos": lambda x, y: -sin(x),
        "tan": lambda x, y: 1.0 + y * y,
        "tanh": lambda x, y: 1.0 - y * y,
        "sigmoid": lambda x, y: y * (1.0 - y),
        "erf": lambda x, y: two_over_sqrt_pi * exp(-(x * x)),
        # JAX's formulas (lax.py), so that boundary points give JAX's inf/nan: e.g. arcsin at
        # +-1 and arccosh at 1 give inf; arccosh below -1 has a finite slope (nan value)
        "arcsin": lambda x, y: rsqrt(1.0 - x * x),
        "arccos": lambda x, y: -rsqrt(1.0 - x * x),
        "arctan": lambda x, y: 1.0 / (1.0 + x * x),
        "sinh": lambda x, y: cosh(x),
        "cosh": lambda x, y: sinh(x),
        "arcsinh": lambda x, y: rsqrt(x * x + 1.0),
        "arccosh": lambda x, y: rsqrt(x * x - 1.0),
        "arctanh": lambda x, y: 1.0 / (1.0 + x) / (1.0 - x),
    }


def _reciprocal(b):
    # a Python scalar stays a scalar (weakly typed), except 0, which must give inf like JAX
    if type(b) in _SCALARS and b != 0:
        return 1.0 / b
    return divide(1.0, b)


def _scale(t, partial):
    # partials of add/subtract are the literals 1.0 / -1.0: no multiply node for those
    if type(partial) is float:
        if partial == 1.0:
            return t
        if partial == -1.0:
            return negative(t)
    return t * partial


def _balanced(a, b, y):
    # JAX's rule for max/min: the winner gets the whole tangent, ties split it evenly
    return where(equal(a, y), where(equal(b, y), 0.5, 1.0), 0.0)


def _power_base_partial(a, b, y):
    if type(b) in (int, float):  # a Python exponent (x ** 2): fold the test in Python
        return 0.0 if b == 0 else b * power(a, b - 1)
    return where(equal(b, 0), 0.0, b * power(a, b - 1))


def _binary_partials():
    return {
        "add": (lambda a, b, y: 1.0, lambda a, b, y: 1.0),
        "subtract": (lambda a, b, y: 1.0, lambda a, b, y: -1.0),
        "multiply": (lambda a, b, y: b, lambda a, b, y: a),
        "divide": (lambda a, b, y: _reciprocal(b), lambda a, b, y: -y / b),
        "mod": (lambda a, b, y: 1.0, lambda a, b, y: -floor(divide(a, b))),
        "power": (
            _power_base_partial,
            lambda a, b, y: log(where(equal(a, 0), 1.0, a)) * y,
        ),
        "maximum": (lambda a, b, y: _balanced(a, b, y), lambda a, b, y: _balanced(b, a, y)),
        "minimum": (lambda a, b, y: _balanced(a, b, y), lambda a, b, y: _balanced(b, a, y)),
        "arctan2": (
            lambda a, b, y: b / (a * a + b * b),
            lambda a, b, y: -a / (a * a + b * b),
        ),
    }


def _is_float_dtype(d) -> bool:
    return dtypes.is_inexact(d)


def _unary_rules(name, partial):
    def jvp(params, tangents, primals, outs):
        t = tangents[0]
        if t is None or not _is_float_dtype(outs[0].dtype):
            return [None]
        dt = outs[0].dtype
        return [astype(astype(t, dt) * partial(primals[0], outs[0]), dt)]

    def vjp(params, cts, primals, outs):
        ct, x = cts[0], primals[0]
        if ct is None or not _is_float_dtype(x.dtype):
            return [None]
        g = ct * partial(astype(x, outs[0].dtype), outs[0])
        return [astype(g, x.dtype)]

    PRIMS[name].jvp = jvp
    PRIMS[name].vjp = vjp


def _binary_rules(name, partials):
    pa, pb = partials

    def operands(primals, dt):
        # scalars stay Python scalars (weakly typed); tensors compute in the op's dtype
        return [p if type(p) is not Tensor else astype(p, dt) for p in primals]

    def jvp(params, tangents, primals, outs):
        dt = outs[0].dtype
        if not _is_float_dtype(dt):
            return [None]
        a, b = operands(primals, params[0])
        y = outs[0]
        acc = None
        for t, p in zip(tangents, (pa, pb)):
            if t is not None:
                term = _scale(astype(t, dt), p(a, b, y))
                acc = term if acc is None else acc + term
        if acc is not None:
            acc = astype(acc, dt)
            if acc.shape != y.shape:
                acc = broadcast_to(acc, y.shape)
        return [acc]

    def vjp(params, cts, primals, outs):
        ct = cts[0]
        if ct is None or not _is_float_dtype(outs[0].dtype):
            return [None, None]
        a, b = operands(primals, params[0])
        y = outs[0]
        res = []
        for x, p in zip(primals, (pa, pb)):
            if type(x) is not Tensor or not _is_float_dtype(x.dtype):
                res.append(None)
                continue
            g = unbroadcast(_scale(ct, p(a, b, y)), x.shape)
            res.append(astype(g, x.dtype))
        return res

    PRIMS[name].jvp = jvp
    PRIMS[name].vjp = vjp


def _select_jvp(params, tangents, primals, outs):
    _, tx, ty = tangents
    if tx is None and ty is None:
        return [None]
    c = primals[0]
    dt = outs[0].dtype
    tx = astype(tx, dt) if tx is not None else 0.0
    ty = astype(ty, dt) if ty is not None else 0.0
    return [broadcast_to(where(c, tx, ty), outs[0].shape)]


def _select_vjp(params, cts, primals, outs):
    ct = cts[0]
    c, x, y = primals
    if ct is None:
        return [None, None, None]
    res = [None]
    for v, first in ((x, True), (y, False)):
        if type(v) is Tensor and _is_float_dtype(v.dtype):
            branch = where(c, ct, 0.0) if first else where(c, 0.0, ct)
            res.append(astype(unbroadcast(branch, v.shape), v.dtype))
        else:
            res.append(None)  # a scalar or integer branch has no cotangent: build nothing
    return res


def _convert_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not _is_float_dtype(params[0]) or not _is_float_dtype(primals[0].dtype):
        return [None]
    return [astype(t, params[0])]


def _convert_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not _is_float_dtype(x.dtype) or not _is_float_dtype(params[0]):
        return [None]
    return [astype(ct, x.dtype)]


def _install_rules() -> None:
    partials = _unary_partials()
    for name in UNARY:
        if name in partials:
            _unary_rules(name, partials[name])
        else:
            nondifferentiable(PRIMS[name])  # sign/floor/ceil/round: zero; predicates: no float out
    bpartials = _binary_partials()
    for name in BINARY:
        if name in bpartials:
            _binary_rules(name, bpartials[name])
        else:
            nondifferentiable(PRIMS[name])  # comparisons, bitwise, floor_divide
    select.jvp, select.vjp = _select_jvp, _select_vjp
    convert.jvp, convert.vjp = _convert_jvp, _convert_vjp
    nondifferentiable(_stop_gradient)


_install_rules()


def _install_batch_rules() -> None:
    for p in (*PRIMS.values(), select, convert, _stop_gradient):
        p.batch = elementwise_rule(p)


_install_batch_rules()


def _install_shard_rules() -> None:
    for p in (*PRIMS.values(), select, convert, _stop_gradient):
        p.shard = _shard.elementwise


_install_shard_rules()

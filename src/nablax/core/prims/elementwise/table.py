"""The element-wise primitives: one table row per primitive holds everything about it.

A row of :data:`UNARY` or :data:`BINARY` gives, for one primitive named as NumPy names the
function:

- its dtype kind (``arith``, ``float``, ``compare``, ...): the shape/dtype rule (NumPy broadcasting,
  the kind's computation and output dtypes; dtype_rules.py);
- its lowering: the ``jax.numpy``/``lax`` function, called on inputs cast to the computation dtype;
- its derivative: the partial derivative(s) of the output, as nablax ops of the inputs and the
  output, from which the jvp and vjp rules are made (``None``: a zero derivative, as for ``sign``
  or ``floor``, or no float output, as for comparisons);
- batching and sharding: the element-wise rules every row shares (broadcast the batch prefixes;
  outputs are laid out as their inputs).

``select`` (``where``), ``convert_element_type`` (``astype``) and ``stop_gradient`` are records of
their own (select_cast.py), as is ``relu`` (relu.py). Each primitive has one builder (``exp``,
``add``, ...; made by builders.py), which the NumPy-style functions of core/ops/elementwise.py
re-export next to the composites (``exp2``, ``trunc``, ...).

Derivative formulas are JAX's (lax.py), so that boundary points give JAX's inf/nan.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .... import _caches
from ...dtypes import bool_
from ...primitive import primitive
from ...tensor import Tensor
from .. import _shard
from .._batch import batched_elementwise
from .._rules import NONDIFFERENTIABLE, unbroadcast
from .builders import _SCALARS, _operand, _unary, make_binary, make_unary
from .dtype_rules import cast_lower, elementwise_aval
from .dtype_rules import is_float_dtype as _is_float_dtype
from .select_cast import astype, where

_TWO_OVER_SQRT_PI = 2 / math.sqrt(math.pi)
_LN2, _INV_LN10 = math.log(2), 1 / math.log(10)

# ---- the records -----------------------------------------------------------------------------
# name: (dtype kind, lowering, d(out)/d(x) as a function of (x, out) or None)
UNARY = {
    "negative": ("arith", jnp.negative, lambda x, y: -1.0),
    "abs": ("real", jnp.abs, lambda x, y: where(greater_equal(x, 0), 1.0, -1.0)),  # JAX: 1 at 0
    "sign": ("arith", jnp.sign, None),
    "exp": ("float", jnp.exp, lambda x, y: y),
    "log": ("float", jnp.log, lambda x, y: 1.0 / x),
    "log1p": ("float", jnp.log1p, lambda x, y: 1.0 / (x + 1.0)),
    "log2": ("float", jnp.log2, lambda x, y: 1.0 / x / _LN2),
    "log10": ("float", jnp.log10, lambda x, y: 1.0 / x * _INV_LN10),
    "expm1": ("float", jnp.expm1, lambda x, y: y + 1.0),
    "sqrt": ("float", jnp.sqrt, lambda x, y: 0.5 / y),
    "rsqrt": ("float", lax.rsqrt, lambda x, y: -0.5 * y / x),
    "sin": ("float", jnp.sin, lambda x, y: cos(x)),
    "cos": ("float", jnp.cos, lambda x, y: -sin(x)),
    "tan": ("float", jnp.tan, lambda x, y: 1.0 + y * y),
    "tanh": ("float", jnp.tanh, lambda x, y: 1.0 - y * y),
    # arcsin at +-1 and arccosh at 1 give inf; arccosh below -1: the installed JAX's slope
    "arcsin": ("float", jnp.arcsin, lambda x, y: rsqrt(1.0 - x * x)),
    "arccos": ("float", jnp.arccos, lambda x, y: -rsqrt(1.0 - x * x)),
    "arctan": ("float", jnp.arctan, lambda x, y: 1.0 / (1.0 + x * x)),
    "sinh": ("float", jnp.sinh, lambda x, y: cosh(x)),
    "cosh": ("float", jnp.cosh, lambda x, y: sinh(x)),
    "arcsinh": ("float", jnp.arcsinh, lambda x, y: rsqrt(x * x + 1.0)),
    "arccosh": ("float", jnp.arccosh, lambda x, y: _arccosh_slope(x)),
    "arctanh": ("float", jnp.arctanh, lambda x, y: 1.0 / (1.0 + x) / (1.0 - x)),
    "sigmoid": ("float", lax.logistic, lambda x, y: y * (1.0 - y)),
    "erf": ("float", lax.erf, lambda x, y: _TWO_OVER_SQRT_PI * exp(-(x * x))),
    "floor": ("real", jnp.floor, None),
    "ceil": ("real", jnp.ceil, None),
    "round": ("real", jnp.round, None),
    "isnan": ("predicate", jnp.isnan, None),
    "isinf": ("predicate", jnp.isinf, None),
    "isfinite": ("predicate", jnp.isfinite, None),
    "invert": ("bitwise", jnp.invert, None),
}


# probes of the installed JAX's behaviour, made on first use (never at import: the backend may not
# be up); a cleared probe is made again
_JAX_PROBES = _caches.Cache("ops.jax_probes", 16)


def _probe_arccosh_slope() -> bool:
    one = np.float32(1.0)
    with jax.ensure_compile_time_eval():
        slope = jax.jvp(lax.acosh, (np.float32(-2.0),), (one,))[1]
    return bool(np.isnan(np.asarray(slope)))


def _jax_arccosh_slope_is_nan_below_minus_one() -> bool:
    """Whether the installed JAX's derivative of arccosh is NaN below -1 (where the value is).

    JAX changed the formula between the supported releases: 0.10 uses ``rsqrt(x*x - 1)`` (a finite
    slope at a NaN value below -1, inf at -1), newer releases ``rsqrt(x - 1) * rsqrt(x + 1)`` (NaN
    below -1 and at -1). nablax gives the installed JAX's derivative; one eager evaluation,
    the first time an arccosh is differentiated (never at import: the backend may not be up).
    """
    return _JAX_PROBES.get_or_make("arccosh_slope_nan_below_minus_one", _probe_arccosh_slope)


def _arccosh_slope(x):
    if _jax_arccosh_slope_is_nan_below_minus_one():
        return rsqrt(x - 1.0) * rsqrt(x + 1.0)
    return rsqrt(x * x - 1.0)


def _reciprocal(b):
    # a Python scalar stays a scalar (weakly typed), except 0, which must give inf like JAX
    if type(b) in _SCALARS and b != 0:
        return 1.0 / b
    return divide(1.0, b)


def _balanced(a, b, y):
    # JAX's rule for max/min: the winner gets the whole tangent, ties split it evenly
    return where(equal(a, y), where(equal(b, y), 0.5, 1.0), 0.0)


def _power_base_partial(a, b, y):
    if type(b) in (int, float):  # a Python exponent (x ** 2): fold the test in Python
        return 0.0 if b == 0 else b * power(a, b - 1)
    return where(equal(b, 0), 0.0, b * power(a, b - 1))


def _power_lower(a, b):
    """``jnp.power``, but an integer power raised over all the exponent's bits: JAX squares only
    six times for a traced integer exponent (``jit(jnp.power)(int32 3, 100)`` is not ``3**100``
    modulo ``2**32``, while eager ``jnp.power`` with a concrete exponent is), and nablax passes
    Python exponents as program arguments. Negative exponents keep JAX's result."""
    if not jnp.issubdtype(a.dtype, jnp.integer):
        return jnp.power(a, b)
    a, b = jnp.broadcast_arrays(a, b)
    one = jnp.ones((), b.dtype)
    acc = jnp.where((a == 0) & (b != 0), jnp.zeros_like(a), jnp.ones_like(a))
    x, e = a, b
    for _ in range(jnp.iinfo(b.dtype).bits):
        acc = jnp.where((e & one) != 0, acc * x, acc)
        x = x * x
        e = lax.shift_right_logical(e, one)
    if jnp.issubdtype(b.dtype, jnp.signedinteger):
        acc = jnp.where(b < 0, jnp.power(a, b), acc)
    return acc


# name: (dtype kind, lowering, (d(out)/d(a), d(out)/d(b)) as functions of (a, b, out) or None)
BINARY = {
    "add": ("arith", jnp.add, (lambda a, b, y: 1.0, lambda a, b, y: 1.0)),
    "subtract": ("arith", jnp.subtract, (lambda a, b, y: 1.0, lambda a, b, y: -1.0)),
    "multiply": ("arith", jnp.multiply, (lambda a, b, y: b, lambda a, b, y: a)),
    "divide": ("float", jnp.true_divide, (lambda a, b, y: _reciprocal(b), lambda a, b, y: -y / b)),
    "floor_divide": ("arith", jnp.floor_divide, None),
    "mod": ("arith", jnp.remainder, (lambda a, b, y: 1.0, lambda a, b, y: -floor(divide(a, b)))),
    "power": (
        "arith",
        _power_lower,
        (_power_base_partial, lambda a, b, y: log(where(equal(a, 0), 1.0, a)) * y),
    ),
    "maximum": (
        "arith",
        jnp.maximum,
        (lambda a, b, y: _balanced(a, b, y), lambda a, b, y: _balanced(b, a, y)),
    ),
    "minimum": (
        "arith",
        jnp.minimum,
        (lambda a, b, y: _balanced(a, b, y), lambda a, b, y: _balanced(b, a, y)),
    ),
    "arctan2": (
        "float",
        jnp.arctan2,
        (lambda a, b, y: b / (a * a + b * b), lambda a, b, y: -a / (a * a + b * b)),
    ),
    "equal": ("compare", jnp.equal, None),
    "not_equal": ("compare", jnp.not_equal, None),
    "less": ("compare", jnp.less, None),
    "less_equal": ("compare", jnp.less_equal, None),
    "greater": ("compare", jnp.greater, None),
    "greater_equal": ("compare", jnp.greater_equal, None),
    "bitwise_and": ("bitwise", jnp.bitwise_and, None),
    "bitwise_or": ("bitwise", jnp.bitwise_or, None),
    "bitwise_xor": ("bitwise", jnp.bitwise_xor, None),
}

# ---- derivative rules from the partials --------------------------------------------------------


def _scale(t, partial):
    # partials of add/subtract are the literals 1.0 / -1.0: no multiply node for those
    if type(partial) is float:
        if partial == 1.0:
            return t
        if partial == -1.0:
            return negative(t)
    return t * partial


def _unary_derivative(partial) -> dict:
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

    return {"jvp": jvp, "vjp": vjp}


def _binary_derivative(partials) -> dict:
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
                acc = acc.broadcast_to(y.shape)
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

    return {"jvp": jvp, "vjp": vjp}


def _record(name: str, kind: str, lower, derivative: dict):
    return primitive(
        name,
        elementwise_aval(name, kind),
        cast_lower(lower),
        **derivative,
        rules=batched_elementwise,
        shard=_shard.elementwise,
    )


PRIMS = {}
for _name, (_kind, _fn, _partial) in UNARY.items():
    _d = NONDIFFERENTIABLE if _partial is None else _unary_derivative(_partial)
    PRIMS[_name] = _record(_name, _kind, _fn, _d)
for _name, (_kind, _bfn, _partials) in BINARY.items():
    _d = NONDIFFERENTIABLE if _partials is None else _binary_derivative(_partials)
    PRIMS[_name] = _record(_name, _kind, _bfn, _d)

# ---- builders --------------------------------------------------------------------------------

_Builder = Callable[..., Tensor]
_fns: dict[str, _Builder] = {n: make_unary(n, PRIMS[n], UNARY[n][0]) for n in UNARY}
_fns.update({n: make_binary(n, PRIMS[n], BINARY[n][0]) for n in BINARY})
negative: _Builder = _fns["negative"]
abs: _Builder = _fns["abs"]  # noqa: A001 - NumPy name
sign: _Builder = _fns["sign"]
exp: _Builder = _fns["exp"]
log: _Builder = _fns["log"]
log1p: _Builder = _fns["log1p"]
log2: _Builder = _fns["log2"]
log10: _Builder = _fns["log10"]
expm1: _Builder = _fns["expm1"]
sqrt: _Builder = _fns["sqrt"]
rsqrt: _Builder = _fns["rsqrt"]
sin: _Builder = _fns["sin"]
cos: _Builder = _fns["cos"]
tan: _Builder = _fns["tan"]
tanh: _Builder = _fns["tanh"]
arcsin: _Builder = _fns["arcsin"]
arccos: _Builder = _fns["arccos"]
arctan: _Builder = _fns["arctan"]
sinh: _Builder = _fns["sinh"]
cosh: _Builder = _fns["cosh"]
arcsinh: _Builder = _fns["arcsinh"]
arccosh: _Builder = _fns["arccosh"]
arctanh: _Builder = _fns["arctanh"]
sigmoid: _Builder = _fns["sigmoid"]
erf: _Builder = _fns["erf"]
floor: _Builder = _fns["floor"]
ceil: _Builder = _fns["ceil"]
isnan: _Builder = _fns["isnan"]
isinf: _Builder = _fns["isinf"]
isfinite: _Builder = _fns["isfinite"]
invert: _Builder = _fns["invert"]
add: _Builder = _fns["add"]
subtract: _Builder = _fns["subtract"]
multiply: _Builder = _fns["multiply"]
divide: _Builder = _fns["divide"]
floor_divide: _Builder = _fns["floor_divide"]
mod: _Builder = _fns["mod"]
power: _Builder = _fns["power"]
maximum: _Builder = _fns["maximum"]
minimum: _Builder = _fns["minimum"]
arctan2: _Builder = _fns["arctan2"]
equal: _Builder = _fns["equal"]
not_equal: _Builder = _fns["not_equal"]
less: _Builder = _fns["less"]
less_equal: _Builder = _fns["less_equal"]
greater: _Builder = _fns["greater"]
greater_equal: _Builder = _fns["greater_equal"]
bitwise_and: _Builder = _fns["bitwise_and"]
bitwise_or: _Builder = _fns["bitwise_or"]
bitwise_xor: _Builder = _fns["bitwise_xor"]


def round(x, decimals: int = 0) -> Tensor:  # noqa: A001 - NumPy name
    """Round half to even, as ``numpy.round``; ``decimals`` may be non-zero for float tensors."""
    prim = PRIMS["round"]
    if decimals == 0:
        return _unary("round", prim, "real", x)
    scale = 10.0**decimals
    return _unary("round", prim, "real", x * scale) / scale


# Composites that other primitive families' rules use (the rest: core/ops/elementwise.py)


def clip(x, min=None, max=None) -> Tensor:  # noqa: A002 - NumPy names
    """Limit values to ``[min, max]`` (either may be ``None``), as ``numpy.clip``."""
    out = x if type(x) is Tensor else Tensor._wrap(_operand(x, "clip"))
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return out


def logical_and(x1, x2) -> Tensor:
    return bitwise_and(astype(x1, bool_), astype(x2, bool_))

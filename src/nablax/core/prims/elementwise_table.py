"""The element-wise primitive tables (``name -> (dtype kind, jax function)``) and dtype policies.

``elementwise.py`` makes one primitive per entry (named as NumPy names the function), lowered by
calling the jax function on inputs cast to the computation dtype that the entry's kind gives.
Everything else element-wise is a composite of these (``exp2``, ``trunc``, ...).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ...errors import DTypeError, op_error
from .. import dtypes
from ..dtypes import bool_

# ---- dtype policies --------------------------------------------------------------------------
# kind -> (computation dtype, output dtype) given the promoted input dtype.


def _kind_arith(op, d):
    if d == bool_ and op in ("subtract", "power", "negative", "floor_divide", "mod", "sign"):
        raise op_error(
            DTypeError, op, "not supported for bool tensors", "cast with .astype(nx.int32)"
        )
    return d, d


def _kind_float(op, d):
    f = dtypes.to_float(d)
    return f, f


def _kind_compare(op, d):
    return d, bool_


def _kind_bitwise(op, d):
    if not (d == bool_ or dtypes.is_integer(d)):
        raise op_error(
            DTypeError, op, f"needs integer or bool tensors, got {d}", "use logical_* for masks"
        )
    return d, d


def _kind_predicate(op, d):
    return d, bool_


def _kind_real(op, d):
    if dtypes.is_complex(d):
        raise op_error(DTypeError, op, f"not defined for complex dtype {d}")
    if d == bool_ and op == "round":
        raise op_error(DTypeError, op, "not defined for bool tensors", "cast with .astype(...)")
    return d, d


KINDS = {
    "arith": _kind_arith,
    "float": _kind_float,
    "compare": _kind_compare,
    "bitwise": _kind_bitwise,
    "predicate": _kind_predicate,
    "real": _kind_real,
}

UNARY = {
    # name: (kind, jax function)
    "negative": ("arith", jnp.negative),
    "abs": ("real", jnp.abs),
    "sign": ("arith", jnp.sign),
    "exp": ("float", jnp.exp),
    "log": ("float", jnp.log),
    "log1p": ("float", jnp.log1p),
    "log2": ("float", jnp.log2),
    "log10": ("float", jnp.log10),
    "expm1": ("float", jnp.expm1),
    "sqrt": ("float", jnp.sqrt),
    "rsqrt": ("float", lax.rsqrt),
    "sin": ("float", jnp.sin),
    "cos": ("float", jnp.cos),
    "tan": ("float", jnp.tan),
    "tanh": ("float", jnp.tanh),
    "arcsin": ("float", jnp.arcsin),
    "arccos": ("float", jnp.arccos),
    "arctan": ("float", jnp.arctan),
    "sinh": ("float", jnp.sinh),
    "cosh": ("float", jnp.cosh),
    "arcsinh": ("float", jnp.arcsinh),
    "arccosh": ("float", jnp.arccosh),
    "arctanh": ("float", jnp.arctanh),
    "sigmoid": ("float", lax.logistic),
    "erf": ("float", lax.erf),
    "floor": ("real", jnp.floor),
    "ceil": ("real", jnp.ceil),
    "round": ("real", jnp.round),
    "isnan": ("predicate", jnp.isnan),
    "isinf": ("predicate", jnp.isinf),
    "isfinite": ("predicate", jnp.isfinite),
    "invert": ("bitwise", jnp.invert),
}

BINARY = {
    "add": ("arith", jnp.add),
    "subtract": ("arith", jnp.subtract),
    "multiply": ("arith", jnp.multiply),
    "divide": ("float", jnp.true_divide),
    "floor_divide": ("arith", jnp.floor_divide),
    "mod": ("arith", jnp.remainder),
    "power": ("arith", jnp.power),
    "maximum": ("arith", jnp.maximum),
    "minimum": ("arith", jnp.minimum),
    "arctan2": ("float", jnp.arctan2),
    "equal": ("compare", jnp.equal),
    "not_equal": ("compare", jnp.not_equal),
    "less": ("compare", jnp.less),
    "less_equal": ("compare", jnp.less_equal),
    "greater": ("compare", jnp.greater),
    "greater_equal": ("compare", jnp.greater_equal),
    "bitwise_and": ("bitwise", jnp.bitwise_and),
    "bitwise_or": ("bitwise", jnp.bitwise_or),
    "bitwise_xor": ("bitwise", jnp.bitwise_xor),
}

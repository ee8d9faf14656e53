"""Element-wise functions: unary math, binary arithmetic/comparison/bitwise, ``where``, ``astype``.

The functions that build one primitive each (``exp``, ``add``, ``where``, ...) come from
core/prims/elementwise.py, where each primitive's record holds all its rules; the composites
(``exp2``, ``reciprocal``, ``trunc``, ``logical_*``, ``square``) are written here with them.
Element-wise functions broadcast implicitly (NumPy rules) and treat Python scalars as weakly typed.

Functions take NumPy's names; ``asin acos atan asinh acosh atanh`` (Nabla's and PyTorch's
spellings) are the same functions as ``arcsin`` & co. Values are bit for bit ``jax.numpy``'s:

>>> import nablax as nx
>>> nx.arcsin(nx.tensor([0.0, 1.0])).tolist(), nx.asin is nx.arcsin
([0.0, 1.5707963705062866], True)
>>> nx.cosh(nx.tensor(0.0)).item(), nx.tensor([2.0, 4.0]).reciprocal().tolist()
(1.0, [0.5, 0.25])
"""

from __future__ import annotations

import math

from ...errors import DTypeError, op_error
from .. import dtypes
from ..dtypes import bool_
from ..prims.elementwise import (  # noqa: F401 - the builders, re-exported
    _operand,
    abs,
    add,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    astype,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    ceil,
    clip,
    convert,
    cos,
    cosh,
    divide,
    equal,
    erf,
    exp,
    expm1,
    floor,
    floor_divide,
    greater,
    greater_equal,
    invert,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log2,
    log10,
    logical_and,
    maximum,
    minimum,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    round,
    rsqrt,
    select,
    sigmoid,
    sign,
    sin,
    sinh,
    sqrt,
    stop_gradient,
    subtract,
    tan,
    tanh,
    where,
)
from ..tensor import Tensor

true_divide = divide
remainder = mod
# Nabla's and PyTorch's spellings: the same function objects
asin, acos, atan, asinh, acosh, atanh = arcsin, arccos, arctan, arcsinh, arccosh, arctanh


def square(x) -> Tensor:
    """``x * x``."""
    return multiply(x, x)


# Composites: jnp computes these with the same operations (the same bits in every dtype, complex
# included), so they need no primitive of their own and every transform comes for free. (log2 and
# log10 are primitives: as composites, complex zeros and infinities gave nan parts.)
_LN2 = math.log(2)  # the constant XLA's exp2 multiplies by, rounded to the input's dtype


def _tensor(x, op: str) -> Tensor:
    return x if type(x) is Tensor else Tensor._wrap(_operand(x, op))


def exp2(x) -> Tensor:
    """``2 ** x``, as ``jax.numpy.exp2`` (which XLA computes as ``exp(x * log(2))``, as here).

    >>> import nablax as nx
    >>> nx.exp2(nx.tensor([-1, 0, 3])).tolist()
    [0.5, 1.0, 8.0]
    """
    return exp(multiply(_tensor(x, "exp2"), _LN2))


def reciprocal(x) -> Tensor:
    """``1 / x``, as ``jax.numpy.reciprocal`` and ``torch.reciprocal``: ints and bools give float32
    (``numpy.reciprocal`` keeps integers), ``1 / 0`` is inf.

    >>> import nablax as nx
    >>> nx.reciprocal(nx.tensor([2, 0])).tolist()
    [0.5, inf]
    """
    return divide(1.0, _tensor(x, "reciprocal"))


def trunc(x) -> Tensor:
    """Round towards zero, as ``jax.numpy.trunc``; integer and bool tensors come back unchanged.

    >>> import nablax as nx
    >>> nx.trunc(nx.tensor([-1.7, 2.5])).tolist()
    [-1.0, 2.0]
    """
    t = _tensor(x, "trunc")
    if dtypes.is_complex(t.dtype):
        raise op_error(DTypeError, "trunc", f"not defined for complex dtype {t.dtype}")
    if not dtypes.is_inexact(t.dtype):
        return t
    return where(less(t, 0), ceil(t), floor(t))


def logical_not(x) -> Tensor:
    return invert(astype(x, bool_))


def logical_or(x1, x2) -> Tensor:
    return bitwise_or(astype(x1, bool_), astype(x2, bool_))


def logical_xor(x1, x2) -> Tensor:
    return bitwise_xor(astype(x1, bool_), astype(x2, bool_))

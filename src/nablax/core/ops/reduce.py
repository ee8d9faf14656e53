"""Reductions, scans and sorts (NumPy's names): the builders of core/prims/reduce.py and the
statistics written with them (``mean``, ``var``, ``std``, ``logsumexp``)."""

from __future__ import annotations

import math

import numpy as np

from ...errors import DTypeError, op_error
from .. import dtypes
from ..prims import _autocast
from ..prims import reduce as _prims_reduce
from ..prims._util import norm_axes
from ..prims.reduce import (  # noqa: F401, A004 - the builders (NumPy names), re-exported
    _impl,
    _keep,
    _reduced_shape,
    all,
    any,
    argmax,
    argmin,
    argsort,
    max,
    min,
    sort,
    topk,
)
from ..tensor import Tensor
from .creation import full
from .elementwise import astype, exp, log, multiply, sqrt, stop_gradient, subtract, where
from .shape import reshape


def _count(shape, axes) -> int:
    return math.prod(shape[a] for a in axes)


# The summing reductions compute in float32 under nx.autocast (core/autocast.py); the rest is
# the builders of core/prims/reduce.py (derivative rules call those, never these).


def _f32(x):
    return _autocast.cast_inputs("reduction", x)[0]


def sum(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:  # noqa: A001
    return _prims_reduce.sum(_f32(x), axis, keepdims, dtype)


def prod(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
    return _prims_reduce.prod(_f32(x), axis, keepdims, dtype)


def cumsum(x, axis=None, dtype=None) -> Tensor:
    return _prims_reduce.cumsum(_f32(x), axis, dtype)


sum.__doc__ = _prims_reduce.sum.__doc__
prod.__doc__ = _prims_reduce.prod.__doc__
cumsum.__doc__ = _prims_reduce.cumsum.__doc__


def mean(x, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
    """Arithmetic mean over ``axis``; integer inputs give float32.

    >>> import nablax as nx
    >>> nx.mean(nx.arange(6).reshape(2, 3), axis=1).tolist()
    [1.0, 4.0]
    """
    xi = _impl(x, "mean")
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.to_float(xi.dtype)
    t = astype(Tensor._wrap(xi), dt)
    axes = norm_axes("mean", axis, xi.shape)
    return sum(t, axes, keepdims) / _count(xi.shape, axes)


def var(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Variance with NumPy's default ``ddof=0``.

    >>> import nablax as nx
    >>> nx.var(nx.tensor([1.0, 3.0])).item()
    1.0
    """
    xi = _impl(x, "var")
    if dtypes.is_complex(xi.dtype):  # nablax has no conj/real yet to form |x - mean|^2
        raise op_error(
            DTypeError,
            "var",
            f"complex tensors ({xi.dtype}) are not supported",
            "take the variance of the real and imaginary parts separately",
        )
    t = astype(Tensor._wrap(xi), dtypes.to_float(xi.dtype))
    axes = norm_axes("var", axis, xi.shape)
    centered = subtract(t, mean(t, axes, keepdims=True))
    sq = multiply(centered, centered)
    return sum(sq, axes, keepdims) / (_count(xi.shape, axes) - ddof)


def std(x, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
    """Standard deviation with NumPy's default ``ddof=0``.

    >>> import nablax as nx
    >>> nx.std(nx.tensor([1.0, 3.0]), ddof=1).item()
    1.4142135381698608
    """
    return sqrt(var(x, axis, keepdims, ddof))


def logsumexp(x, axis=None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` computed stably (shifted by the max), as ``jax.nn.logsumexp``.

    >>> import nablax as nx
    >>> round(nx.logsumexp(nx.tensor([1000.0, 1000.0])).item(), 2)
    1000.69
    """
    xi = _impl(_f32(x), "logsumexp")
    t = astype(Tensor._wrap(xi), dtypes.to_float(xi.dtype))
    axes = norm_axes("logsumexp", axis, xi.shape)
    if _count(xi.shape, axes) == 0:  # empty sum: log(0) = -inf, as jax.nn.logsumexp
        return _keep(
            full(_reduced_shape(xi.shape, axes), -np.inf, t.dtype), xi.shape, axes, keepdims
        )
    m = stop_gradient(max(t, axes, keepdims=True))
    m = where(m.isfinite(), m, 0.0)
    out = log(sum(exp(subtract(t, m)), axes, keepdims=True)) + m
    return _keep(reshape(out, _reduced_shape(xi.shape, axes)), xi.shape, axes, keepdims)

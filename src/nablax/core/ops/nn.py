"""Neural-network functions, all composites: activations following ``jax.nn`` (``relu``, ``gelu``,
``silu``, ``softplus``), ``softmax`` and ``log_softmax``."""

from __future__ import annotations

from .. import dtypes
from ..prims import _autocast
from ..prims import fused_nn as _fused_nn
from ..prims._util import norm_axes
from ..prims.elementwise import relu as _relu
from ..tensor import Tensor, to_impl
from .elementwise import (
    astype,
    erf,
    exp,
    log,
    log1p,
    minimum,
    multiply,
    sigmoid,
    stop_gradient,
    subtract,
    tanh,
    where,
)
from .reduce import max, sum


def _t(x) -> Tensor:
    t = x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x))
    return astype(t, dtypes.to_float(t.dtype))


def relu(x) -> Tensor:
    """``max(x, 0)`` as ``jax.nn.relu``: NaN stays NaN, and the gradient at 0 is 0.

    >>> import nablax as nx
    >>> nx.relu(nx.tensor([-1.0, 0.0, 2.0, float("nan")])).tolist()
    [0.0, 0.0, 2.0, nan]
    """
    t = x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x))
    if t.dtype == dtypes.bool_:
        return where(t, 1, 0)  # as jax.nn.relu: an int32 0/1
    return _relu(t)


def gelu(x, approximate: bool = True) -> Tensor:
    """GELU as ``jax.nn.gelu`` (tanh approximation by default)."""
    x = _t(x)
    if dtypes.is_floating(x.dtype):
        return _fused_nn.gelu(x, approximate)  # one node, one backward node (prims/fused_nn.py)
    return _fused_nn.gelu_formula(x, approximate, tanh, erf)


def silu(x) -> Tensor:
    """``x * sigmoid(x)`` (a.k.a. swish)."""
    x = _t(x)
    return multiply(x, sigmoid(x))


def softplus(x) -> Tensor:
    """``log(1 + exp(x))``, computed stably."""
    x = _t(x)
    # log1p(exp(x)) is exact in float32 below 15 and equals x above it; its derivative is
    # sigmoid(x) everywhere (0.5 at 0, as jax.nn.softplus), which max(x,0)+log1p(exp(-|x|)) misses
    return where(x > 15.0, x, log1p(exp(minimum(x, 20.0))))  # clamp away from the switch: no tie


def softmax(x, axis=-1) -> Tensor:
    """``exp(x) / sum(exp(x))`` along ``axis``, shifted by the max for stability.

    >>> import nablax as nx
    >>> [round(v, 4) for v in nx.softmax(nx.tensor([1., 2., 3.])).tolist()]
    [0.09, 0.2447, 0.6652]
    """
    x = _autocast.cast_inputs("softmax", _t(x))[0]
    axes = norm_axes("softmax", axis, x.shape)
    e = exp(subtract(x, stop_gradient(max(x, axes, keepdims=True))))
    return e / sum(e, axes, keepdims=True)


def log_softmax(x, axis=-1) -> Tensor:
    """``x - logsumexp(x)`` along ``axis``."""
    x = _autocast.cast_inputs("log_softmax", _t(x))[0]
    axes = norm_axes("log_softmax", axis, x.shape)
    shifted = subtract(x, stop_gradient(max(x, axes, keepdims=True)))  # as jax.nn.log_softmax
    return subtract(shifted, log(sum(exp(shifted), axes, keepdims=True)))

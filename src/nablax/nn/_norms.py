"""RMS normalization: ``nn.functional.rms_norm`` and ``nn.RMSNorm``, PyTorch's.

As ``torch.rms_norm``: float16/bfloat16 inputs are normalized and scaled by ``weight`` in float32
(their "opmath" type) and rounded once to the input's dtype; ``eps=None``
is the float32 machine epsilon for those three dtypes (what PyTorch uses: the epsilon of the
computing type; its docs say ``torch.finfo(input.dtype).eps``, which is the same for float32).
Inside ``nx.autocast`` the norm computes and returns float32, as every autocast norm does.
"""

from __future__ import annotations

import numpy as np

from ..core import autocast as _autocast
from ..core import dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.prims import fused_nn as _fused_nn
from ..core.tensor import Tensor, to_impl
from ..errors import DTypeError, ShapeError, op_error
from ._module import Module, field


def _shape(name: str, normalized_shape) -> tuple:
    shp = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if not all(isinstance(d, (int, np.integer)) and d > 0 for d in shp):
        raise op_error(
            ValueError,
            name,
            f"normalized_shape={normalized_shape!r} must be a positive int or a tuple of them",
        )
    return tuple(int(d) for d in shp)


def _opmath(dt) -> np.dtype:
    return dtypes.float32 if dt in (dtypes.float16, dtypes.bfloat16) else dt


def rms_norm(input, normalized_shape, weight=None, eps=None) -> Tensor:  # noqa: A002 - torch's name
    """``x / sqrt(mean(x**2) + eps) * weight`` over the last ``len(normalized_shape)`` dims, as
    ``torch.nn.functional.rms_norm`` (float16/bfloat16 computed in float32; ``eps=None``: the
    float32 machine epsilon, as PyTorch).

    >>> import nablax as nx, nablax.nn.functional as F
    >>> [round(v, 4) for v in F.rms_norm(nx.tensor([3.0, 4.0]), (2,)).tolist()]
    [0.8485, 1.1314]
    """
    name = "nn.functional.rms_norm"
    x = input if isinstance(input, Tensor) else Tensor._wrap(to_impl(input, op=name))
    if not dtypes.is_floating(x.dtype):
        raise op_error(
            DTypeError,
            name,
            f"needs a float tensor, got {x.dtype} {x.shape}",
            "cast with x.astype(nx.float32)",
        )
    shape = _shape(name, normalized_shape)
    if x.shape[x.ndim - len(shape) :] != shape:
        raise op_error(
            ShapeError, name, f"input {x.shape} does not end with normalized_shape {shape}"
        )
    if weight is not None and tuple(weight.shape) != shape:
        raise op_error(
            ShapeError,
            name,
            f"weight has shape {tuple(weight.shape)}, expected normalized_shape {shape}",
        )
    x = _autocast.cast_inputs("norm", x)[0]
    out_dt = x.dtype
    ct = _opmath(out_dt)
    eps = float(np.finfo(ct).eps) if eps is None else eps
    fused = _fused_nn.rms_norm(x, shape, weight, eps)  # one node for float32/float64
    if fused is not None:
        return fused
    eps = float(eps)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    u = x.astype(ct)
    ms = _ew.square(u).mean(axis=axes, keepdims=True)
    y = u * _ew.rsqrt(ms + eps)
    if weight is not None:
        w = weight if isinstance(weight, Tensor) else Tensor._wrap(to_impl(weight, op=name))
        y = y * w.astype(ct)
    return y.astype(out_dt)


class RMSNorm(Module):
    """RMS normalization over the trailing ``normalized_shape`` dims, scaled by ``weight`` (ones
    at first; ``elementwise_affine=False`` keeps none), as ``torch.nn.RMSNorm``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> m = nn.RMSNorm(2)
    >>> [round(v, 4) for v in m(nx.tensor([3.0, 4.0])).tolist()], m.weight.shape
    ([0.8485, 1.1314], (2,))
    """

    weight: Tensor | None
    normalized_shape: tuple = field(static=True)
    eps: float | None = field(static=True, default=None)

    def __init__(self, normalized_shape, eps=None, elementwise_affine=True, *, dtype=None):
        shp = _shape("nn.RMSNorm", normalized_shape)
        self.weight = _cr.ones(shp, dtype=dtype or dtypes.float32) if elementwise_affine else None
        self.normalized_shape = shp
        self.eps = None if eps is None else float(eps)

    def __call__(self, x) -> Tensor:
        return rms_norm(x, self.normalized_shape, self.weight, self.eps)

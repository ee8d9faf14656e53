"""``nablax.nn.functional``: the functions behind the layers, with ``torch.nn.functional``'s
arguments and defaults (``gelu`` is exact by default, ``softmax`` takes ``dim``, pooling takes
``kernel_size, stride=None, padding=0``), on nablax tensors. Every function is lazy and
differentiable; the layouts are PyTorch's (``NCHW`` images, ``(out, in, kh, kw)`` kernels).

>>> import nablax as nx
>>> import nablax.nn.functional as F
>>> F.cross_entropy(nx.tensor([[2.0, 0.0], [0.0, 2.0]]), nx.tensor([0, 1])).item() < 0.13
True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..core import dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.ops import index as _ix
from ..core.ops import linalg as _la
from ..core.ops import nn as _nn
from ..core.ops import random as _random
from ..core.ops import reduce as _red
from ..core.ops import shape as _sh
from ..core.prims import _autocast
from ..core.prims import fused as _fused
from ..core.prims import fused_nn as _fused_nn
from ..core.prims import window as _win
from ..core.tensor import Tensor, to_impl
from ..errors import DTypeError, ShapeError, op_error
from ._norms import rms_norm  # noqa: F401 - nn.functional.rms_norm
from ._sdpa import scaled_dot_product_attention  # noqa: F401 - nn.functional's

__all__ = [
    "relu",
    "gelu",
    "silu",
    "softmax",
    "log_softmax",
    "cross_entropy",
    "mse_loss",
    "dropout",
    "layer_norm",
    "rms_norm",
    "linear",
    "embedding",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "one_hot",
    "scaled_dot_product_attention",
]


def _t(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x))


def _float(name: str, x: Any) -> Tensor:
    t = _t(x)
    if not dtypes.is_floating(t.dtype):
        raise op_error(
            DTypeError,
            f"nn.functional.{name}",
            f"needs a float tensor, got {t.dtype} {t.shape}",
            "cast with x.astype(nx.float32)",
        )
    return _autocast.cast_inputs(_AUTOCAST_F32[name], t)[0] if name in _AUTOCAST_F32 else t


# Functions that compute in float32 under nx.autocast (core/autocast.py); conv2d's convolution
# and linear's product are cast by their ops.
_AUTOCAST_F32 = {"cross_entropy": "loss", "mse_loss": "loss", "layer_norm": "norm"}


def _reduce(name: str, loss: Tensor, reduction: str, count: Any = None) -> Tensor:
    if reduction == "none":
        return loss
    if reduction == "sum":
        return loss.sum()
    if reduction == "mean":
        return loss.mean() if count is None else loss.sum() / count
    raise op_error(
        ValueError,
        f"nn.functional.{name}",
        f"reduction={reduction!r} is not one of 'mean', 'sum', 'none'",
    )


# ---- activations --------------------------------------------------------------------------------


def relu(input) -> Tensor:
    """``max(input, 0)`` (``torch.nn.functional.relu``; gradient 0 at 0).

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.relu(nx.tensor([-1.0, 2.0])).tolist()
    [0.0, 2.0]
    """
    return _nn.relu(input)


def gelu(input, approximate: str = "none") -> Tensor:
    """GELU, exact (``approximate='none'``, PyTorch's default) or ``'tanh'``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> round(F.gelu(nx.tensor([1.0])).item(), 4)
    0.8413
    """
    if approximate not in ("none", "tanh"):
        raise op_error(
            ValueError, "nn.functional.gelu", f"approximate={approximate!r}", "use 'none' or 'tanh'"
        )
    return _nn.gelu(input, approximate=approximate == "tanh")


def silu(input) -> Tensor:
    """``input * sigmoid(input)``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> round(F.silu(nx.tensor([1.0])).item(), 4)
    0.7311
    """
    return _nn.silu(input)


def softmax(input, dim: int = -1) -> Tensor:
    """Softmax along ``dim``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.softmax(nx.tensor([0.0, 0.0]), dim=0).tolist()
    [0.5, 0.5]
    """
    return _nn.softmax(input, axis=dim)


def log_softmax(input, dim: int = -1) -> Tensor:
    """Log-softmax along ``dim``, computed stably.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> round(F.log_softmax(nx.tensor([0.0, 0.0]), dim=0).tolist()[0], 4)
    -0.6931
    """
    return _nn.log_softmax(input, axis=dim)


# ---- losses -------------------------------------------------------------------------------------


def cross_entropy(
    input,
    target,
    weight=None,
    *,
    reduction: str = "mean",
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> Tensor:
    """Cross entropy of logits ``input`` ``(N, C)`` or ``(N, C, d1, ...)`` (or ``(C,)``) with integer
    class ``target`` ``(N,)`` / ``(N, d1, ...)`` (or class probabilities of ``input``'s shape), as
    ``torch.nn.functional.cross_entropy``: ``reduction`` ``'mean'`` (over the targets not equal to
    ``ignore_index``), ``'sum'`` or ``'none'``, and ``label_smoothing`` in ``[0, 1]``. ``weight``,
    a float ``(C,)`` tensor, rescales each class's terms; with integer targets, ``'mean'`` then
    divides by the sum of the targets' weights (PyTorch's rule).

    An integer target outside ``[0, C)`` that is not ``ignore_index`` makes its row's loss (and
    its logits' gradient) NaN, so a reduced loss is NaN, never a finite number. PyTorch raises
    ``IndexError`` on the CPU (a device assert on CUDA); nablax cannot raise without reading the
    targets back, which a lazy op (and one inside ``nx.compile``, ``nx.vmap`` or ``nx.grad``)
    does not do, so it gives NaN as JAX's out-of-bounds gather does (``jnp.take_along_axis``).

    >>> import nablax as nx, nablax.nn.functional as F
    >>> logits = nx.tensor([[1.0, 2.0, 0.5], [0.1, 0.2, 3.0]])
    >>> round(F.cross_entropy(logits, nx.tensor([1, 2])).item(), 4)
    0.287
    >>> round(F.cross_entropy(logits, nx.tensor([1, 2]), nx.tensor([1.0, 3.0, 1.0])).item(), 4)
    0.3757
    """
    name = "nn.functional.cross_entropy"
    x = _float("cross_entropy", input)
    y = _t(target)
    if not 0.0 <= label_smoothing <= 1.0:
        raise op_error(ValueError, name, f"label_smoothing={label_smoothing} is not in [0, 1]")
    if x.ndim == 0:
        raise op_error(ShapeError, name, "input must have a class axis, got a 0-d tensor")
    c_axis = 0 if x.ndim == 1 else 1
    n_cls = x.shape[c_axis]
    w = None if weight is None else _class_weight(name, weight, x, c_axis)
    if dtypes.is_floating(y.dtype):  # class probabilities
        logp = _nn.log_softmax(x, axis=c_axis)
        if y.shape != x.shape:
            raise op_error(
                ShapeError,
                name,
                f"probability targets {y.shape} must have the input's shape {x.shape}",
            )
        if label_smoothing:
            y = y * (1.0 - label_smoothing) + label_smoothing / n_cls
        if w is not None:
            logp = logp * _sh.reshape(w, (n_cls,) + (1,) * (x.ndim - c_axis - 1))
        return _reduce("cross_entropy", -(y * logp).sum(axis=c_axis), reduction, None)
    expected = x.shape[:c_axis] + x.shape[c_axis + 1 :]
    if y.shape != expected:
        raise op_error(
            ShapeError,
            name,
            f"integer targets {y.shape} do not fit input {x.shape}: expected {expected} "
            f"(the input's shape without its class axis {c_axis})",
        )
    if reduction not in ("mean", "sum", "none"):
        return _reduce("cross_entropy", x, reduction)  # raises, naming the reductions
    if not dtypes.is_integer(y.dtype):
        raise op_error(
            DTypeError,
            name,
            f"target is {y.dtype}: give integer class indices or float class probabilities",
            "cast it with target.astype(nx.int32)",
        )
    if w is not None:
        return _weighted_cross_entropy(x, y, w, c_axis, ignore_index, label_smoothing, reduction)
    # one node (core/prims/fused.py): log-softmax, the target's log-probability as a masked sum
    # over the class axis (not a gather: it fuses, and a split batch stays split), smoothing,
    # ignore_index and the reduction
    return _fused.cross_entropy(x, y, c_axis, ignore_index, label_smoothing, reduction)


def _class_weight(name: str, weight, x: Tensor, c_axis: int) -> Tensor:
    """``weight`` checked: float, one entry per class of ``x`` (class axis ``c_axis``)."""
    w = _t(weight)
    n_cls = x.shape[c_axis]
    if w.shape != (n_cls,):
        raise op_error(
            ShapeError,
            name,
            f"weight has shape {w.shape}, but input {x.shape} has {n_cls} classes on axis {c_axis}",
            f"give one weight per class, shape ({n_cls},)",
        )
    if not dtypes.is_floating(w.dtype):
        raise op_error(
            DTypeError,
            name,
            f"weight is {w.dtype}",
            "give float weights, e.g. w.astype(nx.float32)",
        )
    return w.astype(x.dtype)


_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1  # an ignore_index beyond these matches no target


def _weighted_cross_entropy(x, y, w, c_axis, ignore_index, label_smoothing, reduction) -> Tensor:
    """Integer-target cross-entropy with class weights ``w`` ``(C,)``, as PyTorch: the target's
    term times its class weight, the smoothing term summed over the classes with their weights,
    and ``'mean'`` divided by the sum of the counted targets' weights."""
    n_cls = x.shape[c_axis]
    logp = _nn.log_softmax(x, axis=c_axis)
    y = y.astype(dtypes.int32)  # as the fused node: no comparison with a wrapped Python int
    valid = y != ignore_index if _INT32_MIN <= ignore_index <= _INT32_MAX else y == y
    bad = valid & ((y < 0) | (y >= n_cls))  # a counted target outside [0, C): NaN, as unweighted
    cls = _ew.where(valid & ~bad, y, 0)
    picked = _sh.squeeze(_ix.take_along_axis(logp, _sh.unsqueeze(cls, c_axis), axis=c_axis), c_axis)
    w_y = _ix.take(w, cls)  # each target's class weight
    loss = -(w_y * picked)
    if label_smoothing:
        w_b = _sh.reshape(w, (n_cls,) + (1,) * (x.ndim - c_axis - 1))  # along the class axis
        smooth = -(logp * w_b).sum(axis=c_axis)
        loss = (1.0 - label_smoothing) * loss + (label_smoothing / n_cls) * smooth
    loss = _ew.where(valid, loss * _ew.where(bad, math.nan, 1.0).astype(loss.dtype), 0.0)
    if reduction == "mean":
        return loss.sum() / _ew.where(valid, w_y, 0.0).sum()
    return _reduce("cross_entropy", loss, reduction)


def mse_loss(input, target, reduction: str = "mean") -> Tensor:
    """Mean squared error, as ``torch.nn.functional.mse_loss``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.mse_loss(nx.tensor([1.0, 3.0]), nx.tensor([0.0, 1.0])).item()
    2.5
    """
    x = _float("mse_loss", input)
    y = _t(target)
    if x.shape != y.shape:
        raise op_error(
            ShapeError,
            "nn.functional.mse_loss",
            f"input {x.shape} and target {y.shape} differ",
            "reshape one of them (PyTorch would broadcast with a warning)",
        )
    return _reduce("mse_loss", _ew.square(x - y), reduction)


# ---- layers as functions ------------------------------------------------------------------------


def linear(input, weight, bias=None) -> Tensor:
    """``input @ weight.T + bias`` with PyTorch's ``(out_features, in_features)`` weight.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.linear(nx.ones((1, 2)), nx.ones((3, 2)), nx.zeros(3)).tolist()
    [[2.0, 2.0, 2.0]]
    """
    x, w = _t(input), _t(weight)
    fused = _fused_nn.linear(x, w, bias)  # one node and one backward node (issue 37)
    if fused is not None:
        return fused
    if x.ndim >= 1 and w.ndim == 2:
        # one einsum, no transpose node: the weight's gradient comes out in (out, in) order
        # directly (``x @ w.T`` would make XLA copy a transposed gradient every step)
        y = _la.einsum("...i,oi->...o", x, w) if x.shape[-1:] == w.shape[1:] else x @ w.T
    else:
        y = x @ w.T
    return y if bias is None else y + _autocast.cast_inputs("linear", _t(bias))[0]


def embedding(input, weight) -> Tensor:
    """Rows of ``weight`` ``(num, dim)`` at the integer indices ``input``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.embedding(nx.tensor([1]), nx.arange(6.0).reshape(3, 2)).tolist()
    [[2.0, 3.0]]

    An index outside ``[0, num)`` gives a row of NaN (PyTorch raises; a lazy op cannot, and
    clamping would silently read another row):

    >>> F.embedding(nx.tensor([3, -1]), nx.arange(6.0).reshape(3, 2)).tolist()
    [[nan, nan], [nan, nan]]
    """
    ids = _t(input)
    if dtypes.is_floating(ids.dtype):
        raise op_error(
            DTypeError,
            "nn.functional.embedding",
            f"indices must be integers, got {ids.dtype}",
            "cast with ids.astype(nx.int32)",
        )
    w = _t(weight)
    n = w.shape[0]
    if (
        ids.dtype.kind == "i"
    ):  # a negative id is out of range too (torch raises), not "from the end":
        # as a 32-bit unsigned index it is 2**31 or more, past every row (one cast node)
        small = ids.dtype.itemsize <= 4 and type(n) is int and n <= 2**31
        ids = ids.astype(dtypes.uint32) if small else _ew.where(ids < 0, n, ids)
    # out-of-range ids give NaN rows (a lazy op cannot raise as torch does; never another row)
    return _ix.take(w, ids, axis=0, mode="fill")


def dropout(input, p: float = 0.5, training: bool = True, *, key=None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)``.

    Identity when ``key is None`` or ``training`` is false: randomness is explicit in nablax, so
    evaluation code simply passes no key.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.dropout(nx.ones(3), 0.5).tolist()
    [1.0, 1.0, 1.0]
    >>> sorted(set(F.dropout(nx.ones(100), 0.5, key=nx.random.key(0)).tolist()))
    [0.0, 2.0]
    """
    if not 0.0 <= p <= 1.0:
        raise op_error(ValueError, "nn.functional.dropout", f"p={p} is not in [0, 1]")
    x = _t(input)
    if key is None or not training or p == 0.0:
        return x
    if p == 1.0:
        return _cr.zeros_like(x)
    keep = _random.bernoulli(key, 1.0 - p, x.shape)
    return _ew.where(keep, x / (1.0 - p), 0.0).astype(x.dtype)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """Normalize over the last ``len(normalized_shape)`` dims (biased variance), then scale and
    shift, as ``torch.nn.functional.layer_norm``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> [round(v, 3) for v in F.layer_norm(nx.tensor([1.0, 3.0]), (2,)).tolist()]
    [-1.0, 1.0]
    """
    fast = _fused_nn.layer_norm_call(input, normalized_shape, weight, bias, eps)
    if fast is not None:  # a fusing call whose shapes, dtypes and options were checked before
        return fast
    x = _float("layer_norm", input)
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    if x.shape[x.ndim - len(shape) :] != shape:
        raise op_error(
            ShapeError,
            "nn.functional.layer_norm",
            f"input {x.shape} does not end with normalized_shape {shape}",
        )
    if _fused_nn.layer_norm_fusable(x, shape, weight, bias, eps):
        return _fused_nn.layer_norm(x, len(shape), weight, bias, eps)  # one node (issue 37)
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    xc = x - mu
    var = _ew.square(xc).mean(axis=axes, keepdims=True)
    y = xc * _ew.rsqrt(var + eps)
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


def _pair(name: str, arg: str, v: Any) -> tuple:
    t = (v, v) if isinstance(v, int) else tuple(v)
    if len(t) != 2 or not all(isinstance(i, int) for i in t):
        raise op_error(
            ValueError, f"nn.functional.{name}", f"{arg}={v!r} must be an int or a pair of ints"
        )
    return t


def _nchw(name: str, x: Tensor) -> tuple[Tensor, bool]:
    if x.ndim == 3:  # (C, H, W): unbatched, as PyTorch accepts
        return _sh.expand_dims(x, 0), True
    if x.ndim != 4:
        raise op_error(
            ShapeError,
            f"nn.functional.{name}",
            f"input must be (N, C, H, W) or (C, H, W), got {x.shape}",
            "reshape flat images with x.reshape(n, c, h, w)",
        )
    return x, False


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups: int = 1) -> Tensor:
    """2-d convolution, ``NCHW`` input and ``(out, in // groups, kh, kw)`` weight, as
    ``torch.nn.functional.conv2d`` (``padding`` an int, a pair, ``'valid'`` or ``'same'``).

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.conv2d(nx.ones((1, 1, 3, 3)), nx.ones((2, 1, 2, 2))).shape
    (1, 2, 2, 2)
    """
    x, unbatched = _nchw("conv2d", _float("conv2d", input))
    w = _t(weight)
    op = "nn.functional.conv2d"
    dil = _pair("conv2d", "dilation", dilation)
    if isinstance(padding, str):
        if padding == "valid":
            pads: Any = 0
        elif padding == "same":
            if _pair("conv2d", "stride", stride) != (1, 1):
                raise op_error(ValueError, op, "padding='same' needs stride=1 (as in PyTorch)")
            pads = []
            for k, d in zip(w.shape[2:], dil):
                total = d * (k - 1)
                pads.append((total // 2, total - total // 2))
        else:
            raise op_error(ValueError, op, f"padding={padding!r}", "use an int, 'valid' or 'same'")
    else:
        pads = _pair("conv2d", "padding", padding)
    y = _win.conv(x, w, stride, pads, 1, dil, groups, op=op)
    if bias is not None:
        y = y + _sh.reshape(_autocast.cast_inputs("conv", _t(bias))[0], (-1, 1, 1))
    return _sh.squeeze(y, 0) if unbatched else y


def _pool_geometry(name, x, kernel_size, stride, padding, ceil_mode, dilation=(1, 1)):
    """``(kernel, stride, ((lo, hi) padding per spatial dim))`` of a torch pooling call: ``hi``
    adds, with ``ceil_mode``, the overhang of the last window past the padded input."""
    k = _pair(name, "kernel_size", kernel_size)
    s = k if stride is None or stride == () else _pair(name, "stride", stride)
    p = _pair(name, "padding", padding)
    op = f"nn.functional.{name}"
    for pi, ki in zip(p, k):
        if pi > ki // 2:
            raise op_error(
                ValueError, op, f"padding {p} must be at most half of kernel_size {k} (as PyTorch)"
            )
    pads = []
    for size, ki, si, pi, di in zip(x.shape[2:], k, s, p, dilation):
        ki = di * (ki - 1) + 1  # the span of a dilated window
        span = size + 2 * pi - ki
        if span < 0:
            raise op_error(
                ShapeError, op, f"kernel_size {k} is larger than the padded input {x.shape}"
            )
        out = (-(-span // si) if ceil_mode else span // si) + 1
        if ceil_mode and (out - 1) * si >= size + pi:  # the last window must start in the input
            out -= 1
        pads.append((pi, pi + max(0, (out - 1) * si + ki - (size + 2 * pi))))
    return k, s, tuple(pads)


def max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    """Max over ``kernel_size`` windows (``stride`` defaults to ``kernel_size``; padding is
    ``-inf``; ``dilation`` spaces a window's elements), as ``torch.nn.functional.max_pool2d``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.max_pool2d(nx.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    >>> F.max_pool2d(nx.arange(16.0).reshape(1, 1, 4, 4), 2, stride=1, dilation=2).tolist()
    [[[[10.0, 11.0], [14.0, 15.0]]]]
    """
    dil = _pair("max_pool2d", "dilation", dilation)
    x, unbatched = _nchw("max_pool2d", _t(input))
    k, s, pads = _pool_geometry("max_pool2d", x, kernel_size, stride, padding, ceil_mode, dil)
    if dil == (1, 1):
        y = _win.reduce_window(
            x, "max", (1, 1) + k, (1, 1) + s, ((0, 0), (0, 0)) + pads, op="nn.functional.max_pool2d"
        )
    else:
        y = _dilated_max_pool(x, k, s, pads, dil)
    return _sh.squeeze(y, 0) if unbatched else y


def _dilated_max_pool(x: Tensor, k, s, pads, dil) -> Tensor:
    """``max_pool2d`` with a dilated window, from strided slices: JAX differentiates no dilated
    ``reduce_window`` max. Each of the ``kh * kw`` window positions is one strided slice of the
    padded input; the maximum is picked with the first ``argmax`` in row-major window order, so
    the gradient goes to that one element, as PyTorch's (a NaN is the maximum, as there)."""
    if dtypes.is_floating(x.dtype):
        low: Any = -math.inf
    elif x.dtype == dtypes.bool_:
        low = False
    else:
        low = int(np.iinfo(x.dtype).min)
    xp = _sh.pad(x, ((0, 0), (0, 0)) + tuple(pads), constant_values=low)
    out = [
        (n + lo + hi - (d * (kk - 1) + 1)) // ss + 1
        for n, (lo, hi), kk, ss, d in zip(x.shape[2:], pads, k, s, dil)
    ]
    views = [
        xp[
            :,
            :,
            i * dil[0] : i * dil[0] + (out[0] - 1) * s[0] + 1 : s[0],
            j * dil[1] : j * dil[1] + (out[1] - 1) * s[1] + 1 : s[1],
        ]
        for i in range(k[0])
        for j in range(k[1])
    ]
    stacked = _sh.stack(views, axis=-1)
    first = _red.argmax(stacked, axis=-1, keepdims=True)
    return _sh.squeeze(_ix.take_along_axis(stacked, first, axis=-1), -1)


def avg_pool2d(
    input,
    kernel_size,
    stride=None,
    padding=0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    divisor_override=None,
):
    """Mean over ``kernel_size`` windows, as ``torch.nn.functional.avg_pool2d``: the divisor
    counts the zero padding unless ``count_include_pad=False``, but never the part of a
    ``ceil_mode`` window past the padded input; ``divisor_override`` replaces it.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.avg_pool2d(nx.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    >>> F.avg_pool2d(nx.arange(9.0).reshape(1, 1, 3, 3), 2, ceil_mode=True).tolist()
    [[[[2.0, 3.5], [6.5, 8.0]]]]
    """
    x, unbatched = _nchw("avg_pool2d", _float("avg_pool2d", input))
    k, s, pads = _pool_geometry("avg_pool2d", x, kernel_size, stride, padding, ceil_mode)
    args = ((1, 1) + k, (1, 1) + s, ((0, 0), (0, 0)) + pads)
    total = _win.reduce_window(x, "sum", *args, op="nn.functional.avg_pool2d")
    if divisor_override is not None:
        y = total / divisor_override
    elif all(lo == hi == 0 for lo, hi in pads) or (
        count_include_pad and all(hi == lo for lo, hi in pads)
    ):
        y = total / math.prod(k)  # every window covers k elements that count
    else:
        # the divisor of each window: how many of its elements count, from a window sum of ones
        # over the counted region (the input, or the input with its padding)
        if count_include_pad:
            region = tuple(n + 2 * lo for n, (lo, _) in zip(x.shape[2:], pads))
            inner = tuple((0, hi - lo) for lo, hi in pads)  # only the ceil_mode overhang is empty
        else:
            region, inner = x.shape[2:], pads
        ones = _cr.ones((1, 1) + region, dtype=x.dtype)
        count = _win.reduce_window(
            ones, "sum", args[0], args[1], ((0, 0), (0, 0)) + inner, op="nn.functional.avg_pool2d"
        )
        y = total / count
    return _sh.squeeze(y, 0) if unbatched else y


def one_hot(tensor, num_classes: int = -1) -> Tensor:
    """``int32`` one-hot encoding along a new last axis, as ``torch.nn.functional.one_hot``
    (``num_classes=-1`` reads the largest class from the data, which needs a concrete tensor).

    >>> import nablax as nx, nablax.nn.functional as F
    >>> F.one_hot(nx.tensor([0, 2])).tolist()
    [[1, 0, 0], [0, 0, 1]]
    """
    t = _t(tensor)
    if dtypes.is_floating(t.dtype):
        raise op_error(DTypeError, "nn.functional.one_hot", f"needs integer classes, got {t.dtype}")
    if num_classes == -1:
        num_classes = int(_red.max(t).item()) + 1 if t.size else 0
    return _ix.one_hot(t, num_classes, dtype=dtypes.int32)

"""The layers: ``Linear``, ``Conv2d``, ``LayerNorm``, ``Embedding``, ``Dropout``, pooling,
activations, ``Flatten``, ``Lambda``, ``Sequential`` and ``MLP``.

Weights use PyTorch's layouts and PyTorch's default initialisation, so state dicts move between the
two unchanged: ``Linear`` and ``Conv2d`` draw weight and bias from ``U(-1/sqrt(fan_in),
1/sqrt(fan_in))`` (what ``kaiming_uniform_(a=sqrt(5))`` amounts to), ``Embedding`` from
``N(0, 1)``, and ``LayerNorm`` starts at ones and zeros. ``key=None`` draws from nablax's global
random stream (``nx.random.seed``), like PyTorch's global generator.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from ..core import dtypes
from ..core.ops import creation as _cr
from ..core.ops import nn as _nn
from ..core.ops import random as _random
from ..core.ops import shape as _sh
from ..core.tensor import Tensor
from . import functional as F
from ._module import Module, field


def _uniform(key, shape: tuple, bound: float, dtype) -> Tensor:
    return _random.uniform(key, shape, -bound, bound, dtype=dtype)


def _keys(key, n: int) -> list:
    if key is None:
        return [None] * n
    ks = _random.split(key, n)
    return [ks[i] for i in range(n)]  # indexing, not iteration: stays lazy (and works under vmap)


def _positive(cls: str, **sizes: Any) -> None:
    for name, v in sizes.items():
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ValueError(f"nn.{cls}: {name}={v!r} must be a positive int")


class Linear(Module):
    """``y = x @ weight.T + bias`` with ``weight`` ``(out_features, in_features)`` (PyTorch's
    layout and initialisation). Accepts any leading dims.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> lin = nn.Linear(3, 2, key=nx.random.key(0))
    >>> lin
    Linear(weight=f32[2,3], bias=f32[2], in_features=3, out_features=2)
    >>> lin(nx.ones((5, 3))).shape
    (5, 2)
    """

    weight: Tensor
    bias: Tensor | None
    in_features: int = field(static=True)
    out_features: int = field(static=True)

    def __init__(self, in_features: int, out_features: int, *, bias=True, key=None, dtype=None):
        _positive("Linear", in_features=in_features, out_features=out_features)
        dt = dtype or dtypes.float32
        kw, kb = _keys(key, 2)
        bound = 1.0 / math.sqrt(in_features)
        self.weight = _uniform(kw, (out_features, in_features), bound, dt)
        self.bias = _uniform(kb, (out_features,), bound, dt) if bias else None
        self.in_features = in_features
        self.out_features = out_features

    def __call__(self, x) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class Conv2d(Module):
    """2-d convolution over ``NCHW`` images with ``weight`` ``(out_channels, in_channels //
    groups, kh, kw)``; ``padding`` is an int, a pair, ``'valid'`` or ``'same'``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> conv = nn.Conv2d(1, 4, 3, padding=1, key=nx.random.key(0))
    >>> conv(nx.ones((2, 1, 8, 8))).shape
    (2, 4, 8, 8)
    """

    weight: Tensor
    bias: Tensor | None
    in_channels: int = field(static=True)
    out_channels: int = field(static=True)
    kernel_size: tuple = field(static=True)
    stride: tuple = field(static=True, default=(1, 1))
    padding: Any = field(static=True, default=(0, 0))
    dilation: tuple = field(static=True, default=(1, 1))
    groups: int = field(static=True, default=1)

    def __init__(
        self,
        in_ch: int,
        out_ch: int,
        kernel_size,
        *,
        stride=1,
        padding=0,
        dilation=1,
        groups: int = 1,
        bias=True,
        key=None,
        dtype=None,
    ):
        _positive("Conv2d", in_ch=in_ch, out_ch=out_ch, groups=groups)
        if in_ch % groups or out_ch % groups:
            raise ValueError(
                f"nn.Conv2d: in_ch={in_ch} and out_ch={out_ch} must be divisible by groups={groups}"
            )
        ks = F._pair("Conv2d", "kernel_size", kernel_size)
        dt = dtype or dtypes.float32
        kw, kb = _keys(key, 2)
        bound = 1.0 / math.sqrt(in_ch // groups * ks[0] * ks[1])
        self.weight = _uniform(kw, (out_ch, in_ch // groups) + ks, bound, dt)
        self.bias = _uniform(kb, (out_ch,), bound, dt) if bias else None
        self.in_channels, self.out_channels, self.kernel_size = in_ch, out_ch, ks
        self.stride = F._pair("Conv2d", "stride", stride)
        self.padding = (
            padding if isinstance(padding, str) else F._pair("Conv2d", "padding", padding)
        )
        self.dilation = F._pair("Conv2d", "dilation", dilation)
        self.groups = groups

    def __call__(self, x) -> Tensor:
        return F.conv2d(
            x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups
        )


class LayerNorm(Module):
    """Normalize over the trailing ``shape`` dims, then scale by ``weight`` and shift by ``bias``
    (ones and zeros at first; ``elementwise_affine=False`` keeps neither).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> [round(v, 3) for v in nn.LayerNorm(2)(nx.tensor([1.0, 3.0])).tolist()]
    [-1.0, 1.0]
    """

    weight: Tensor | None
    bias: Tensor | None
    normalized_shape: tuple = field(static=True)
    eps: float = field(static=True, default=1e-5)

    def __init__(self, shape, eps: float = 1e-5, *, elementwise_affine=True, bias=True, dtype=None):
        shp = (shape,) if isinstance(shape, int) else tuple(shape)
        _positive("LayerNorm", **{f"shape[{i}]": d for i, d in enumerate(shp)})
        dt = dtype or dtypes.float32
        self.weight = _cr.ones(shp, dtype=dt) if elementwise_affine else None
        self.bias = _cr.zeros(shp, dtype=dt) if elementwise_affine and bias else None
        self.normalized_shape = shp
        self.eps = float(eps)

    def __call__(self, x) -> Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)


class Embedding(Module):
    """A lookup table ``weight`` ``(num_embeddings, embedding_dim)``, drawn from ``N(0, 1)``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.Embedding(10, 4, key=nx.random.key(0))(nx.tensor([[1, 2, 3]])).shape
    (1, 3, 4)
    """

    weight: Tensor
    num_embeddings: int = field(static=True)
    embedding_dim: int = field(static=True)

    def __init__(self, num: int, dim: int, *, key=None, dtype=None):
        _positive("Embedding", num=num, dim=dim)
        self.weight = _random.normal(key, (num, dim), dtype=dtype or dtypes.float32)
        self.num_embeddings, self.embedding_dim = num, dim

    def __call__(self, ids) -> Tensor:
        return F.embedding(ids, self.weight)


class Dropout(Module):
    """Dropout with probability ``p``, called as ``m(x, key=k)``; identity when ``key is None``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.Dropout(0.5)(nx.ones(2)).tolist()
    [1.0, 1.0]
    """

    p: float = field(static=True, default=0.5)

    def __init__(self, p: float = 0.5):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"nn.Dropout: p={p} is not in [0, 1]")
        self.p = float(p)

    def __call__(self, x, *, key=None) -> Tensor:
        return F.dropout(x, self.p, key=key)


class _Pool2d(Module):
    """The pooling layers' common configuration."""

    kernel_size: Any = field(static=True)
    stride: Any = field(static=True, default=None)
    padding: Any = field(static=True, default=0)


class MaxPool2d(_Pool2d):
    """``nn.functional.max_pool2d`` as a layer (``torch.nn.MaxPool2d``'s arguments, without
    ``return_indices``).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.MaxPool2d(2)(nx.ones((1, 3, 8, 8))).shape
    (1, 3, 4, 4)
    >>> nn.MaxPool2d(3, stride=2, dilation=2, ceil_mode=True)(nx.ones((1, 3, 8, 8))).shape
    (1, 3, 3, 3)
    """

    dilation: Any = field(static=True, default=1)
    ceil_mode: bool = field(static=True, default=False)

    def __call__(self, x) -> Tensor:
        return F.max_pool2d(
            x, self.kernel_size, self.stride, self.padding, self.dilation, self.ceil_mode
        )


class AvgPool2d(_Pool2d):
    """``nn.functional.avg_pool2d`` as a layer (``torch.nn.AvgPool2d``'s arguments).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.AvgPool2d(2)(nx.ones((1, 3, 8, 8))).shape
    (1, 3, 4, 4)
    >>> nn.AvgPool2d(2, ceil_mode=True)(nx.ones((1, 3, 7, 7))).shape
    (1, 3, 4, 4)
    """

    ceil_mode: bool = field(static=True, default=False)
    count_include_pad: bool = field(static=True, default=True)
    divisor_override: Any = field(static=True, default=None)

    def __call__(self, x) -> Tensor:
        return F.avg_pool2d(
            x,
            self.kernel_size,
            self.stride,
            self.padding,
            self.ceil_mode,
            self.count_include_pad,
            self.divisor_override,
        )


class Flatten(Module):
    """Flatten dims ``start_dim`` to ``end_dim`` into one (PyTorch's defaults: 1 to -1).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.Flatten()(nx.ones((2, 3, 4))).shape
    (2, 12)
    """

    start_dim: int = field(static=True, default=1)
    end_dim: int = field(static=True, default=-1)

    def __call__(self, x) -> Tensor:
        n = x.ndim
        s, e = self.start_dim % n, self.end_dim % n
        return _sh.reshape(x, x.shape[:s] + (-1,) + x.shape[e + 1 :])


class Lambda(Module):
    """A parameter-free function as a layer (``Sequential`` wraps plain functions in it).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.Lambda(nx.relu)(nx.tensor([-1.0, 1.0])).tolist()
    [0.0, 1.0]
    """

    fn: Callable = field(static=True)

    def __call__(self, x, **kwargs) -> Tensor:
        return self.fn(x, **kwargs)


class ReLU(Module):
    """``nn.functional.relu`` as a layer.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.ReLU()(nx.tensor([-2.0, 2.0])).tolist()
    [0.0, 2.0]
    """

    def __call__(self, x) -> Tensor:
        return _nn.relu(x)


class GELU(Module):
    """``nn.functional.gelu`` as a layer (exact unless ``approximate='tanh'``).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> round(nn.GELU()(nx.tensor([1.0])).item(), 4)
    0.8413
    """

    approximate: str = field(static=True, default="none")

    def __call__(self, x) -> Tensor:
        return F.gelu(x, self.approximate)


class Tanh(Module):
    """``nx.tanh`` as a layer.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> nn.Tanh()(nx.tensor([0.0])).tolist()
    [0.0]
    """

    def __call__(self, x) -> Tensor:
        return x.tanh()


def _takes_key(layer: Any) -> bool:
    fn = layer.fn if isinstance(layer, Lambda) else layer.__call__
    try:
        return "key" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class Sequential(Module):
    """Layers applied in order; plain functions are wrapped in ``Lambda``. ``m(x, key=k)`` splits
    ``k`` among the layers that take a ``key`` (``Dropout``); without a key they run
    deterministically. Indexing and slicing give layers and sub-``Sequential``\\ s.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> k1, k2 = nx.random.split(nx.random.key(0))
    >>> model = nn.Sequential(nn.Linear(4, 8, key=k1), nx.relu, nn.Linear(8, 2, key=k2))
    >>> model(nx.ones((3, 4))).shape, len(model)
    ((3, 2), 3)
    """

    layers: tuple

    def __init__(self, *layers):
        if len(layers) == 1 and isinstance(layers[0], (list, tuple)):
            layers = tuple(layers[0])
        wrapped = []
        for i, layer in enumerate(layers):
            if isinstance(layer, Module):
                wrapped.append(layer)
            elif callable(layer):
                wrapped.append(Lambda(layer))
            else:
                raise TypeError(
                    f"nn.Sequential: layer {i} is a {type(layer).__name__}, not a Module or a "
                    f"function"
                )
        self.layers = tuple(wrapped)

    def __call__(self, x, *, key=None) -> Tensor:
        keys = _keys(key, len(self.layers))
        for layer, k in zip(self.layers, keys):
            x = layer(x, key=k) if k is not None and _takes_key(layer) else layer(x)
        return x

    def __len__(self) -> int:
        return len(self.layers)

    def __iter__(self):
        return iter(self.layers)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return Sequential(*self.layers[i])
        return self.layers[i]


class MLP(Module):
    """``Linear`` layers of ``sizes[i] -> sizes[i + 1]`` with ``activation`` between them (none
    after the last).

    >>> import nablax as nx
    >>> from nablax import nn
    >>> mlp = nn.MLP([64, 128, 10], key=nx.random.key(0))
    >>> mlp(nx.ones((5, 64))).shape
    (5, 10)
    """

    layers: tuple
    activation: Callable = field(static=True)

    def __init__(self, sizes, activation: Callable = _nn.relu, *, key=None, dtype=None):
        sizes = list(sizes)
        if len(sizes) < 2:
            raise ValueError(
                f"nn.MLP: sizes={sizes} needs at least an input and an output size, e.g. [64, 10]"
            )
        keys = _keys(key, len(sizes) - 1)
        self.layers = tuple(
            Linear(a, b, key=k, dtype=dtype) for a, b, k in zip(sizes[:-1], sizes[1:], keys)
        )
        self.activation = activation

    def __call__(self, x) -> Tensor:
        for layer in self.layers[:-1]:
            x = self.activation(layer(x))
        return self.layers[-1](x)

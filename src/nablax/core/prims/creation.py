"""Creation primitives and builders: ``iota`` (a record with all its rules) and the constant
fills ``full``/``zeros``/``ones`` (+ ``_like``), lazy broadcasts of a scalar (the shape family's
``broadcast_in_dim``) that XLA fuses into their consumers instead of materializing them. The
composites over them (``tensor``, ``asarray``, ``arange``, ``linspace``, ``eye``) are in
core/ops/creation.py.
"""

from __future__ import annotations

import numpy as np
from jax import lax

from .. import dtypes
from ..build import bind
from ..host import exact_scalar
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _shard
from ._batch import batched_by_vmap
from ._rules import NONDIFFERENTIABLE
from ._util import norm_shape
from .elementwise import astype
from .shape import _broadcast_to, _filled

_SCALARS = (bool, int, float, complex)

# batched through jax.vmap of the lowering; no useful layout to propose: replicated (correct)
iota_p = primitive(
    "iota",
    lambda params,: ((params[1], params[0]),),
    lambda params: lax.broadcasted_iota(params[0], params[1], params[2]),
    differentiable=False,
    rules=batched_by_vmap,
    shard=_shard.replicated,
    **NONDIFFERENTIABLE,
)


def iota(dtype, shape, dimension: int) -> Tensor:
    """``lax.broadcasted_iota``: indices along ``dimension`` of a tensor of ``shape`` (lazy)."""
    return Tensor._wrap(bind(iota_p, [], (dtypes.canonicalize(dtype), tuple(shape), dimension))[0])


def full(shape, fill_value, dtype=None) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (lazy; fused into consumers).

    ``fill_value`` may be a scalar or anything that broadcasts to ``shape``; it must fit ``dtype``
    (an int too large raises ``OverflowError``, as :func:`tensor`).

    >>> import nablax as nx
    >>> nx.full((2,), 7).tolist()
    [7, 7]
    """
    return _full("full", shape, fill_value, dtype)


def _full(op: str, shape, fill_value, dtype) -> Tensor:
    shape = norm_shape(op, shape)
    dt = None if dtype is None else dtypes.canonicalize(dtype)
    if type(fill_value) not in _SCALARS and not isinstance(fill_value, np.generic):
        t = (
            fill_value
            if isinstance(fill_value, Tensor)
            else Tensor._wrap(to_impl(fill_value, dt, op))
        )
        return _broadcast_to(astype(t, t.dtype if dt is None else dt), shape, op)
    if dt is None:
        dt = dtypes.scalar_dtype(fill_value)
    return _filled(shape, exact_scalar(fill_value, dt, op), dt)


def zeros(shape, dtype=None) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise).

    >>> import nablax as nx
    >>> nx.zeros((2, 1)).tolist()
    [[0.0], [0.0]]
    """
    return _full("zeros", shape, 0, dtypes.canonicalize(dtype))


def ones(shape, dtype=None) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise).

    >>> import nablax as nx
    >>> nx.ones(2, "int32").tolist()
    [1, 1]
    """
    return _full("ones", shape, 1, dtypes.canonicalize(dtype))


def _like(op: str, x, fill_value, dtype) -> Tensor:
    xi = x._impl if isinstance(x, Tensor) else to_impl(x, op=op)
    return _full(op, xi.shape, fill_value, dtype if dtype is not None else xi.dtype)


def full_like(x, fill_value, dtype=None) -> Tensor:
    """A tensor shaped like ``x`` (and of its dtype unless ``dtype`` is given) filled with
    ``fill_value``.

    >>> import nablax as nx
    >>> nx.full_like(nx.arange(3), 5).tolist()
    [5, 5, 5]
    """
    return _like("full_like", x, fill_value, dtype)


def zeros_like(x, dtype=None) -> Tensor:
    """Zeros shaped like ``x``, of its dtype unless ``dtype`` is given.

    >>> import nablax as nx
    >>> nx.zeros_like(nx.arange(2)).tolist()
    [0, 0]
    """
    return _like("zeros_like", x, 0, dtype)


def ones_like(x, dtype=None) -> Tensor:
    """Ones shaped like ``x``, of its dtype unless ``dtype`` is given.

    >>> import nablax as nx
    >>> nx.ones_like(nx.zeros(2), "bool").tolist()
    [True, True]
    """
    return _like("ones_like", x, 1, dtype)

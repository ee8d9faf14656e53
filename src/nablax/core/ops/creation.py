"""Creation ops: ``tensor``, ``asarray``, ``zeros``/``ones``/``full`` (+ ``_like``), ``arange``,
``linspace``, ``eye``.

Constant-filled tensors are lazy (a broadcast of a scalar), so XLA fuses them into their consumers
instead of materializing them.
"""

from __future__ import annotations

import math

import jax
import numpy as np
from jax import lax

from ...errors import op_error
from .. import dtypes
from ..graph import Const
from ..primitive import primitive
from ..tensor import Tensor, bind, impl_from_array, to_impl
from ._util import norm_shape
from .shape import broadcast_in_dim_p

iota_p = primitive(
    "iota",
    lambda params,: ((params[1], params[0]),),
    lambda params: lax.broadcasted_iota(params[0], params[1], params[2]),
    differentiable=False,
)


def tensor(data, dtype=None) -> Tensor:
    """A realized tensor from Python data, a NumPy array, a ``jax.Array`` or another Tensor (copy
    semantics are those of ``jnp.asarray``). Python floats become float32, ints int32.

    >>> import nablax as nx
    >>> nx.tensor([[1., 2.], [3., 4.]]).shape
    (2, 2)
    """
    if isinstance(data, Tensor):
        from .elementwise import astype

        return data if dtype is None else astype(data, dtype)
    return Tensor(data, dtype)


def asarray(a, dtype=None) -> Tensor:
    """Like :func:`tensor`; a ``jax.Array`` of the same dtype is wrapped without copying."""
    if isinstance(a, Tensor):
        from .elementwise import astype

        return a if dtype is None else astype(a, dtype)
    if isinstance(a, jax.Array) and (dtype is None or dtypes.canonicalize(dtype) == a.dtype):
        return Tensor._wrap(impl_from_array(a))
    return Tensor._wrap(to_impl(a, dtype))


def _dtype_of(value, dtype):
    if dtype is not None:
        return dtypes.canonicalize(dtype)
    if isinstance(value, Tensor):
        return value.dtype
    return dtypes.scalar_dtype(value)


def full(shape, fill_value, dtype=None) -> Tensor:
    """A tensor of ``shape`` filled with ``fill_value`` (lazy; fused into consumers)."""
    shape = norm_shape("full", shape)
    dt = _dtype_of(fill_value, dtype)
    if isinstance(fill_value, Tensor) or isinstance(fill_value, (np.ndarray, jax.Array, list)):
        from .elementwise import astype
        from .shape import broadcast_to

        return broadcast_to(astype(asarray(fill_value), dt), shape)
    if type(fill_value) not in (bool, int, float, complex):
        fill_value = np.asarray(fill_value).item()
    if dtypes.is_integer(dt) and isinstance(fill_value, float) and not fill_value.is_integer():
        fill_value = int(fill_value)
    c = Const(fill_value, dt)
    return Tensor._wrap(bind(broadcast_in_dim_p, [c], (shape, ()))[0])


def zeros(shape, dtype=None) -> Tensor:
    """A tensor of zeros (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 0, dtypes.canonicalize(dtype))


def ones(shape, dtype=None) -> Tensor:
    """A tensor of ones (float32 unless ``dtype`` says otherwise)."""
    return full(shape, 1, dtypes.canonicalize(dtype))


def _like(x):
    return x if isinstance(x, Tensor) else asarray(x)


def full_like(x, fill_value, dtype=None) -> Tensor:
    x = _like(x)
    return full(x.shape, fill_value, dtype if dtype is not None else x.dtype)


def zeros_like(x, dtype=None) -> Tensor:
    return full_like(x, 0, dtype)


def ones_like(x, dtype=None) -> Tensor:
    return full_like(x, 1, dtype)


def iota(dtype, shape, dimension: int) -> Tensor:
    """``lax.broadcasted_iota``: indices along ``dimension`` of a tensor of ``shape`` (lazy)."""
    return Tensor._wrap(bind(iota_p, [], (dtypes.canonicalize(dtype), tuple(shape), dimension))[0])


def arange(start, stop=None, step=None, dtype=None) -> Tensor:
    """Evenly spaced values in ``[start, stop)``, as ``numpy.arange`` (int32 for int arguments).

    >>> import nablax as nx
    >>> nx.arange(2, 11, 3).tolist()
    [2, 5, 8]
    """
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    if step == 0:
        raise op_error(ValueError, "arange", "step must not be zero")
    args = (start, stop, step)
    if all(isinstance(a, (int, np.integer)) for a in args) and (
        dtype is None or dtypes.is_integer(dtypes.canonicalize(dtype))
    ):
        dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.int32
        n = max(0, -(-(int(stop) - int(start)) // int(step)))
        t = iota(dt, (n,), 0)
        if step != 1:
            t = t * int(step)
        return t + int(start) if start else t
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.float32
    return asarray(np.arange(start, stop, step).astype(dt))


def linspace(start, stop, num: int = 50, endpoint: bool = True, dtype=None) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop``, as ``numpy.linspace``."""
    if num < 0:
        raise op_error(ValueError, "linspace", f"num must be >= 0, got {num}")
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.float32
    vals = np.linspace(float(start), float(stop), num, endpoint=endpoint)
    if dtypes.is_integer(dt):
        vals = np.floor(vals)  # NumPy and JAX floor for integer dtypes
    return asarray(vals.astype(dt))


def eye(N: int, M: int | None = None, k: int = 0, dtype=None) -> Tensor:
    """Identity-like matrix with ones on the ``k``-th diagonal."""
    M = N if M is None else M
    N, M = norm_shape("eye", (N, M))
    dt = dtypes.canonicalize(dtype)
    rows = iota(dtypes.int32, (N, M), 0)
    cols = iota(dtypes.int32, (N, M), 1)
    mask = (rows + k) == cols if k else rows == cols
    return mask.astype(dt)


def _size(shape) -> int:
    return math.prod(shape)


def _install_rules() -> None:
    from ._rules import nondifferentiable

    nondifferentiable(iota_p)


_install_rules()


def _install_vmap_and_shard_rules() -> None:
    # batched through jax.vmap of the lowering; no useful layout to propose: replicated (correct)
    from . import _shard
    from ._batch import vmap_rule

    for p in (iota_p,):
        p.batch = vmap_rule(p)
        p.shard = _shard.replicated


_install_vmap_and_shard_rules()

"""``relu``: one node instead of ``where(x > 0, x, 0)``, which built a mask the backward pass had
to keep; its derivative reads the output, as torch's does."""

from __future__ import annotations

import jax

from ...build import bind
from ...primitive import primitive
from ...tensor import Tensor
from .. import _shard
from .._batch import batched_elementwise
from .._rules import vjp_prim
from .builders import _unary
from .dtype_rules import cast_lower, elementwise_aval
from .dtype_rules import is_float_dtype as _is_float_dtype
from .select_cast import astype


def _relu_grad(y: Tensor, ct: Tensor) -> Tensor:
    """``ct`` where ``x > 0``, else 0, read from the output ``y = relu(x)``: ``y > 0`` exactly where
    ``x > 0`` (a NaN ``x`` gives a NaN ``y``, and both give 0, as jax.nn.relu's derivative), so the
    backward pass reads the activation the next layer keeps anyway, as torch's does. One node: the
    derived ``vjp[relu]`` (``jax.vjp`` of jax.nn.relu), evaluated at ``y``; it is linear in ``ct``
    and flat in ``y``, so it is also the tangent map, and its own derivatives are JAX's."""
    dp = vjp_prim(relu_p, (0,), (0,))
    return Tensor._wrap(bind(dp, [y._impl, ct._impl], ((y.dtype,),))[0])


def _relu_jvp(params, tangents, primals, outs):
    t, y = tangents[0], outs[0]
    if t is None or not _is_float_dtype(y.dtype):
        return [None]
    return [_relu_grad(y, astype(t, y.dtype))]


def _relu_vjp(params, cts, primals, outs):
    ct, y = cts[0], outs[0]
    if ct is None or not _is_float_dtype(y.dtype):
        return [None]
    return [_relu_grad(y, astype(ct, y.dtype))]


relu_p = primitive(
    "relu",
    elementwise_aval("relu", "real"),
    cast_lower(jax.nn.relu),
    jvp=_relu_jvp,
    vjp=_relu_vjp,
    rules=batched_elementwise,
    shard=_shard.elementwise,
    doc="max(x, 0) as jax.nn.relu: NaN stays NaN, the derivative at 0 is 0.",
)


def relu(x) -> Tensor:
    """``max(x, 0)`` of an int or float tensor, as ``jax.nn.relu`` (one node)."""
    return _unary("relu", relu_p, "real", x)

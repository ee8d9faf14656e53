"""The three element-wise primitives that are not rows of the table: ``select`` (``where``),
``convert_element_type`` (``astype``) and ``stop_gradient``, with their builders.

Their parameter is a dtype as for the table's rows (the dtype of the result), and they batch and
shard as every element-wise primitive does; the rest of the family uses ``astype`` and ``where``
to write its derivatives.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from ....errors import op_error
from ... import dtypes
from ...build import TensorImpl, bind
from ...dtypes import promote, promote_scalar
from ...graph import Literal
from ...primitive import primitive
from ...tensor import Tensor
from .. import _shard
from .._batch import batched_elementwise
from .._rules import NONDIFFERENTIABLE, unbroadcast
from .._util import broadcast_shapes
from .builders import _SCALARS, _operand
from .dtype_rules import is_float_dtype as _is_float_dtype
from .dtype_rules import weak_int


def _select_aval(params, c, x, y):
    shape = broadcast_shapes("where", c[0], x[0], y[0])
    return ((shape, params[0]),)


def _select_lower(params, c, x, y):
    dt = params[0]
    return jnp.where(c.astype(bool), x.astype(dt), y.astype(dt))


def _select_jvp(params, tangents, primals, outs):
    _, tx, ty = tangents
    if tx is None and ty is None:
        return [None]
    c = primals[0]
    dt = outs[0].dtype
    tx = astype(tx, dt) if tx is not None else 0.0
    ty = astype(ty, dt) if ty is not None else 0.0
    return [where(c, tx, ty).broadcast_to(outs[0].shape)]


def _select_vjp(params, cts, primals, outs):
    ct = cts[0]
    c, x, y = primals
    if ct is None:
        return [None, None, None]
    res = [None]
    for v, first in ((x, True), (y, False)):
        if type(v) is Tensor and _is_float_dtype(v.dtype):
            branch = where(c, ct, 0.0) if first else where(c, 0.0, ct)
            res.append(astype(unbroadcast(branch, v.shape), v.dtype))
        else:
            res.append(None)  # a scalar or integer branch has no cotangent: build nothing
    return res


select = primitive(
    "select",
    _select_aval,
    _select_lower,
    jvp=_select_jvp,
    vjp=_select_vjp,
    rules=batched_elementwise,
    shard=_shard.elementwise,
)


def _convert_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not _is_float_dtype(params[0]) or not _is_float_dtype(primals[0].dtype):
        return [None]
    return [astype(t, params[0])]


def _convert_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not _is_float_dtype(x.dtype) or not _is_float_dtype(params[0]):
        return [None]
    return [astype(ct, x.dtype)]


convert = primitive(
    "convert_element_type",
    lambda params, x: ((x[0], params[0]),),
    lambda params, x: lax.convert_element_type(x, params[0]),
    jvp=_convert_jvp,
    vjp=_convert_vjp,
    rules=batched_elementwise,
    shard=_shard.elementwise,
)

_stop_gradient = primitive(
    "stop_gradient",
    lambda params, x: (x,),
    lambda params, x: lax.stop_gradient(x),
    **NONDIFFERENTIABLE,
    rules=batched_elementwise,
    shard=_shard.elementwise,
)


def astype(x, dtype) -> Tensor:
    """Cast to ``dtype`` (a no-op node is not created when the dtype already matches)."""
    xi = x._impl if type(x) is Tensor else _operand(x, "astype")
    dt = dtypes.canonicalize(dtype)
    if dt == xi.dtype:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return Tensor._wrap(bind(convert, [xi], (dt,))[0])


def where(condition, x=None, y=None) -> Tensor:
    """Choose ``x`` where ``condition`` is true, else ``y`` (both broadcast; scalars weakly typed).

    The one-argument form (indices of true elements) depends on data and is not supported; use
    ``nx.argwhere``-style masks via boolean indexing instead.

    >>> import nablax as nx
    >>> nx.where(nx.arange(4) > 1, 1.0, 0.0).tolist()
    [0.0, 0.0, 1.0, 1.0]
    """
    if x is None or y is None:
        raise op_error(
            TypeError, "where", "needs three arguments (condition, x, y)", "use x[mask] for indices"
        )
    ci = _operand(condition, "where")
    tx, ty = type(x), type(y)
    if (tx is not Tensor and hasattr(tx, "_weak_binary")) or (
        ty is not Tensor and hasattr(ty, "_weak_binary")
    ):  # a traced Python number (nx.compile argument)
        x, y = _untrace_weak(x, y)
    xs, ys = type(x) in _SCALARS, type(y) in _SCALARS
    xi: TensorImpl | Literal
    yi: TensorImpl | Literal
    if xs and ys:  # two weakly typed scalars: no device array needed to find the dtype
        dt = promote(dtypes.scalar_dtype(x), dtypes.scalar_dtype(y))
        yi = Literal(_weak(y, dt), dt)
        xi = Literal(_weak(x, dt), dt)
    elif xs:
        yi = _operand(y, "where")
        dt = promote_scalar(yi.dtype, type(x))
        xi = Literal(_weak(x, dt), dt)
    elif ys:
        xi = _operand(x, "where")
        dt = promote_scalar(xi.dtype, type(y))
        yi = Literal(_weak(y, dt), dt)
    else:
        xi, yi = _operand(x, "where"), _operand(y, "where")
        dt = promote(xi.dtype, yi.dtype)
    return Tensor._wrap(bind(select, [ci, xi, yi], (dt,))[0])


def _untrace_weak(x, y):
    """``where``'s branches when one is a traced Python number (an ``nx.compile`` argument, weakly
    typed): cast to the dtype a Python number would take there, as ``jnp.where`` under
    ``jax.jit`` does (``where(c, int8_x, k)`` stays int8 for a traced ``k``, as for ``k = 300``)."""
    kinds = [v._kind if hasattr(type(v), "_weak_binary") else type(v) for v in (x, y)]
    weak = [k in _SCALARS for k in kinds]
    if all(weak):
        dt = promote(dtypes.scalar_dtype(kinds[0](0)), dtypes.scalar_dtype(kinds[1](0)))
    else:
        strong = y if weak[0] else x
        si = strong._impl if isinstance(strong, Tensor) else _operand(strong, "where")
        dt = promote_scalar(si.dtype, kinds[0] if weak[0] else kinds[1])
    return tuple(
        Tensor._wrap(v._impl).astype(dt) if hasattr(type(v), "_weak_binary") else v for v in (x, y)
    )


def _weak(v, dt):
    """A Python scalar operand of ``where`` as its value in ``dt`` (an int wraps as JAX wraps it)."""
    return weak_int("where", v, dt) if type(v) is int else v


def stop_gradient(x) -> Tensor:
    """Identity whose gradient is zero (see ``nx.grad``)."""
    xi = x._impl if type(x) is Tensor else _operand(x, "stop_gradient")
    out = bind(_stop_gradient, [xi])[0]
    assert out.src is not None  # a new node's output
    out.src[0].trace = None  # constant for every transform: never walked, freed like eager code
    return Tensor._wrap(out)

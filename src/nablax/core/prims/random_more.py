"""``nx.random.categorical`` and ``nx.random.fold_in``: two more keyed random primitives, lowered
to ``jax.random``'s own functions on the same raw threefry key data, so their values are bit for
bit JAX's for the same key (the other samplers: core/prims/random.py).

>>> import nablax as nx
>>> k = nx.random.fold_in(nx.random.key(0), 7)
>>> nx.random.categorical(k, nx.tensor([0.0, 0.0, 5.0]), shape=(4,)).shape
(4,)
"""

from __future__ import annotations

import operator

import jax
import numpy as np

from ... import _caches
from ...errors import DTypeError, ShapeError, op_error
from .. import dtypes
from ..build import TensorImpl, bind
from ..graph import Literal
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from ._util import is_concrete, norm_axis, norm_shape
from .random import _RULES, _as_key, _key_aval, _wrap_key

__all__ = ["categorical", "fold_in"]

_shape_cache = _caches.Cache("ops.categorical_shapes", 1024)


def _categorical_lower(params, k, logits):
    axis, shape = params
    return jax.random.categorical(_wrap_key(k), logits, axis, shape)


def _categorical_aval(params, key_aval, logits_aval):
    key = (params, logits_aval[0])
    r = _shape_cache.get(key)
    if r is None:
        try:
            out = jax.eval_shape(
                lambda k, lg: _categorical_lower(params, k, lg),
                jax.ShapeDtypeStruct((2,), np.uint32),
                jax.ShapeDtypeStruct(logits_aval[0], logits_aval[1]),
            )
        except (TypeError, ValueError) as e:
            raise op_error(
                ShapeError,
                "random.categorical",
                f"shape={params[1]} does not fit logits of shape {logits_aval[0]} "
                f"(axis {params[0]}): {e}",
                "shape must broadcast with the logits' shape without `axis`",
            ) from None
        r = ((tuple(out.shape), dtypes.int32),)
        if is_concrete(key):
            _shape_cache.put(key, r)
    return r


categorical_p = primitive("random_categorical", _categorical_aval, _categorical_lower, **_RULES)


def _fold_in_lower(params, k, data):
    return jax.random.key_data(jax.random.fold_in(_wrap_key(k), data))


fold_in_p = primitive(
    "random_fold_in",
    lambda params, k, data: (_key_aval(()),),
    _fold_in_lower,
    **_RULES,
)


def categorical(key, logits, axis: int = -1, shape=None) -> Tensor:
    """Samples of the categorical distributions whose unnormalized log-probabilities are
    ``logits`` along ``axis``: int32 indices, bit for bit ``jax.random.categorical`` with the same
    key. ``shape=None`` gives the logits' shape without ``axis``; otherwise ``shape`` must
    broadcast with it (extra leading axes draw more samples). ``key=None`` uses the global key.

    >>> import nablax as nx
    >>> logits = nx.log(nx.tensor([[0.0, 1.0], [1.0, 0.0]]))
    >>> nx.random.categorical(nx.random.key(0), logits).tolist()
    [1, 0]
    """
    k = _as_key(key, "categorical")
    lg = logits if isinstance(logits, Tensor) else Tensor._wrap(to_impl(logits))
    if not dtypes.is_floating(lg.dtype):
        lg = lg.astype(dtypes.to_float(lg.dtype))
    if lg.ndim == 0:
        raise op_error(
            ShapeError, "random.categorical", "logits must be at least 1-D, got a 0-d tensor"
        )
    ax = norm_axis("random.categorical", axis, lg.ndim)
    shp = None if shape is None else norm_shape("random.categorical", shape)
    return Tensor._wrap(bind(categorical_p, [k._impl, lg._impl], (ax, shp))[0])


def fold_in(key, data) -> Tensor:
    """A new key from ``key`` and the integer ``data``: bit for bit ``jax.random.fold_in``.
    ``data`` is a Python int in ``[0, 2**32)`` or a 0-d tensor (cast to uint32, as JAX does); it
    is a runtime value, so folding in different numbers reuses one compiled program.

    >>> import jax
    >>> import nablax as nx
    >>> k = nx.random.fold_in(nx.random.key(0), 3)
    >>> k.tolist() == jax.random.fold_in(jax.random.PRNGKey(0), 3).tolist()
    True
    """
    k = _as_key(key, "fold_in")
    di: TensorImpl | Literal
    if isinstance(data, (bool, int, np.integer)):
        d = operator.index(data)
        if not 0 <= d < 2**32:
            raise op_error(
                ValueError,
                "random.fold_in",
                f"data={d} is not a 32-bit unsigned integer",
                "pass a number in [0, 2**32), or an int32 tensor (it wraps, as in JAX)",
            )
        di = Literal(d, dtypes.uint32)
    else:
        t = data if isinstance(data, Tensor) else Tensor._wrap(to_impl(data))
        if t.ndim != 0:
            raise op_error(
                ShapeError,
                "random.fold_in",
                f"data must be a scalar, got shape {t.shape}",
                "use nx.vmap(nx.random.fold_in, in_axes=(None, 0)) to fold in many",
            )
        if t.dtype == dtypes.complex64:
            raise op_error(DTypeError, "random.fold_in", "data must be real, got complex64")
        di = t.astype(dtypes.uint32)._impl
    return Tensor._wrap(bind(fold_in_p, [k._impl, di], ())[0])

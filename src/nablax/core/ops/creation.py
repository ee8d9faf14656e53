"""Array creation (NumPy's names): the builders of core/prims/creation.py (``iota``, the
constant fills ``full``/``zeros``/``ones`` and their ``_like`` forms) and the functions written
with them or with host data (``tensor``, ``asarray``, ``arange``, ``linspace``, ``eye``)."""

from __future__ import annotations

import operator

import jax
import numpy as np

from ...errors import op_error
from .. import dtypes
from ..build import impl_from_array
from ..host import exact_scalar
from ..prims._util import norm_shape
from ..prims.creation import (  # noqa: F401 - the builders, re-exported
    full,
    full_like,
    iota,
    ones,
    ones_like,
    zeros,
    zeros_like,
)
from ..tensor import Tensor, to_impl
from ..transforms.sizes import bounded_by_sizes, decide_ge, is_symbolic, show, size_dependent
from .elementwise import astype


def tensor(data, dtype=None) -> Tensor:
    """A realized tensor from Python data, a NumPy array, a ``jax.Array`` or another Tensor.

    Python floats become float32, ints int32 (as JAX without x64). Host memory is always copied:
    writing to a NumPy array later never changes the tensor. Host data converts exactly or raises
    (``OverflowError`` for an int that does not fit, also for int64 arrays that JAX would wrap to
    int32; ``TypeError`` for non-numeric data); floats round as in NumPy and overflow to ``inf``.
    A ``jax.Array`` or Tensor with another ``dtype`` is cast, as ``astype``.

    >>> import nablax as nx
    >>> nx.tensor([[1., 2.], [3., 4.]]).shape
    (2, 2)
    >>> nx.tensor([1, 2**40])
    Traceback (most recent call last):
    OverflowError: nx.tensor: value 1099511627776 cannot be converted to int32 exactly ...
    """
    if isinstance(data, Tensor):
        # a new tensor object: ``t[i] = v`` on the result never changes ``data``
        return Tensor._wrap((data if dtype is None else astype(data, dtype))._impl)
    return Tensor._wrap(to_impl(data, dtype, "tensor"))


def asarray(a, dtype=None) -> Tensor:
    """Like :func:`tensor` (host data is copied), but a Tensor of the right dtype is returned as
    is and a ``jax.Array`` of the same dtype is wrapped without copying (it is immutable).

    >>> import jax.numpy as jnp, nablax as nx
    >>> nx.asarray(jnp.arange(3)).tolist()
    [0, 1, 2]
    """
    if isinstance(a, Tensor):
        return a if dtype is None else astype(a, dtype)
    if isinstance(a, jax.Array) and (dtype is None or dtypes.canonicalize(dtype) == a.dtype):
        return Tensor._wrap(impl_from_array(a))
    return Tensor._wrap(to_impl(a, dtype, "asarray"))


def arange(start, stop=None, step=None, dtype=None) -> Tensor:
    """Evenly spaced values in ``[start, stop)``, as ``numpy.arange`` (int32 for int arguments).

    A symbolic size (``nx.compile(dynamic_dims=...)``) as ``start`` or ``stop`` gives one program
    for every size when the step is an int and the endpoints stay within the sizes they are made
    of (``n``, ``n - 1``, ``n // 2``, ``-n``); otherwise (``1000 * n``, a float step, an int8
    result: values or overflow depend on the size) ``nx.compile`` traces once per size.

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
    if any(is_symbolic(a) for a in args):
        return _symbolic_arange(start, stop, step, dtype)
    if all(isinstance(a, (int, np.integer)) for a in args) and (
        dtype is None or dtypes.is_integer(dtypes.canonicalize(dtype))
    ):
        dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.int32
        start, stop, step = int(start), int(stop), int(step)
        n = max(0, -(-(stop - start) // step))
        for v in (start, start + (n - 1) * step, (n - 1) * step) if n else ():
            exact_scalar(v, dt, "arange")  # every value (and the iota * step) fits the dtype
        t = iota(dt, (n,), 0)
        if step != 1:
            t = t * step
        return t + start if start else t
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.float32
    try:
        vals = np.arange(start, stop, step)
    except (TypeError, ValueError) as e:
        raise op_error(TypeError, "arange", f"start, stop and step must be numbers ({e})") from None
    return Tensor._wrap(to_impl(vals, dt, "arange"))


_SYMBOLIC_LIMIT = 2**29  # |concrete endpoint| allowed beside a symbolic one (int32 headroom)


def _symbolic_arange(start, stop, step, dtype) -> Tensor:
    """``arange`` with a symbolic size (``nx.compile(dynamic_dims=...)``) among its arguments:
    one iota that serves every size when the endpoints are integers within the sizes they are
    made of (``n``, ``n - 1``, ``n // 2``: the values fit int32 for sizes up to 2**30) and the
    step a concrete int; otherwise a size-dependent decision (nx.compile traces per size)."""
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.int32
    ends = (start, stop)
    if not (
        isinstance(step, (int, np.integer))
        and all(is_symbolic(a) or isinstance(a, (int, np.integer)) for a in ends)
        and all(bounded_by_sizes(a, _SYMBOLIC_LIMIT) for a in ends)
        and (dt == dtypes.int32 or dtypes.is_floating(dt))
    ):
        what = ", ".join(show(a) if is_symbolic(a) else repr(a) for a in (start, stop, step))
        size_dependent("arange", f"{what}, dtype={dt}", start, stop, step)
    step = int(step)
    start, stop = (a if is_symbolic(a) else int(a) for a in ends)
    n = -((start - stop) // step)  # ceil((stop - start) / step): a size or an int
    if is_symbolic(n):
        if not decide_ge(n, 0):  # sizes may make it negative: an empty result there
            n = n.max(0) if hasattr(n, "max") else max(n, 0)
    else:
        n = max(0, n)
    t = iota(dtypes.int32, (n,), 0)
    if step != 1:
        t = t * step
    t = t + start if not (isinstance(start, int) and start == 0) else t
    return t if t.dtype == dt else astype(t, dt)


def linspace(start, stop, num: int = 50, endpoint: bool = True, dtype=None) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop``, as ``numpy.linspace``.

    >>> import nablax as nx
    >>> nx.linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    num = _index("linspace", "num", num)
    if num < 0:
        raise op_error(ValueError, "linspace", f"num must be >= 0, got {num}")
    dt = dtypes.canonicalize(dtype) if dtype is not None else dtypes.float32
    try:
        vals = np.linspace(float(start), float(stop), num, endpoint=endpoint)
    except (TypeError, ValueError) as e:
        raise op_error(TypeError, "linspace", f"start and stop must be numbers ({e})") from None
    if dtypes.is_integer(dt):
        vals = np.floor(vals)  # NumPy and JAX floor for integer dtypes
    return Tensor._wrap(to_impl(vals, dt, "linspace"))


def eye(N: int, M: int | None = None, k: int = 0, dtype=None) -> Tensor:
    """Identity-like matrix with ones on the ``k``-th diagonal.

    >>> import nablax as nx
    >>> nx.eye(2, 3, k=1).tolist()
    [[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]
    """
    M = N if M is None else M
    N, M = norm_shape("eye", (N, M))
    k = _index("eye", "k", k)
    dt = dtypes.canonicalize(dtype)
    rows = iota(dtypes.int32, (N, M), 0)
    cols = iota(dtypes.int32, (N, M), 1)
    mask = (rows + k) == cols if k else rows == cols
    return mask.astype(dt)


def _index(op: str, name: str, v) -> int:
    try:
        return operator.index(v)
    except TypeError:
        raise op_error(TypeError, op, f"{name} must be an int, got {v!r}") from None

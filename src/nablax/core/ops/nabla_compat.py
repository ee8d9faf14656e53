"""Functions Nabla has and NumPy does not: ``hann_window`` (Nabla's, i.e. ``torch.hann_window``)
and ``minmax`` (a dict of the global minimum and maximum)."""

from __future__ import annotations

import operator

import numpy as np

from ...errors import DTypeError, op_error
from .. import dtypes
from ..tensor import Tensor, to_impl
from .reduce import max, min


def hann_window(window_length: int, *, periodic: bool = True, dtype=None) -> Tensor:
    """A 1-D Hann window of ``window_length`` points, as Nabla's and ``torch.hann_window``:
    ``0.5 - 0.5 * cos(2 * pi * n / N)`` for ``n`` in ``[0, window_length)``, with ``N =
    window_length`` when ``periodic`` (the default, for spectral analysis) and ``window_length
    - 1`` otherwise (symmetric, for filter design). Lengths 0 and 1 give ``[]`` and ``[1.0]``.
    Computed in float64 on the host and rounded once to ``dtype`` (default float32).

    >>> import nablax as nx
    >>> [round(v, 4) for v in nx.hann_window(4).tolist()]
    [0.0, 0.5, 1.0, 0.5]
    """
    try:
        n = operator.index(window_length)
    except TypeError:
        raise op_error(
            TypeError, "hann_window", f"window_length must be an int, got {window_length!r}"
        ) from None
    if n < 0:
        raise op_error(ValueError, "hann_window", f"window_length must be >= 0, got {n}")
    dt = dtypes.canonicalize(dtype)
    if not dtypes.is_floating(dt):
        raise op_error(DTypeError, "hann_window", f"dtype must be a float dtype, got {dt}")
    if n <= 1:
        w = np.ones(n)
    else:
        w = 0.5 - 0.5 * np.cos(2.0 * np.pi * np.arange(n) / (n if periodic else n - 1))
    return Tensor._wrap(to_impl(w.astype(dt), op="hann_window"))


def minmax(x) -> dict:
    """The minimum and maximum over all elements, as Nabla's ``minmax``: a dict ``{"min": ...,
    "max": ...}`` of 0-d tensors of ``x``'s dtype (lazy, differentiable as ``nx.min``/``nx.max``).

    >>> import nablax as nx
    >>> r = nx.minmax(nx.tensor([[3., -1.], [7., 2.]]))
    >>> r["min"].item(), r["max"].item()
    (-1.0, 7.0)
    """
    t = x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x, op="minmax"))
    if t.size == 0:
        raise op_error(
            ValueError, "minmax", f"the input is empty (shape {t.shape}): it has no min or max"
        )
    return {"min": min(t), "max": max(t)}

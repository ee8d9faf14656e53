"""Masking: ``triu``/``tril`` (NumPy's) and ``masked_fill`` (PyTorch's), composites of ``iota``,
comparisons and ``where``, so every transform (grad, vmap, compile, shard_map) comes for free.

The diagonal offset ``k`` enters the graph as a runtime scalar (``rows + k``), never as program
identity: calls that differ only in ``k`` share one compiled program (API.md §1).
"""

from __future__ import annotations

import operator

from ...errors import DTypeError, op_error
from .. import dtypes
from ..prims.creation import iota
from ..prims.elementwise import where
from ..tensor import Tensor, to_impl
from .elementwise import astype
from .shape import broadcast_to


def _tensor(x, op: str) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x, op=op))


def _offset(op: str, k) -> int:
    try:
        return operator.index(k)
    except TypeError:
        raise op_error(TypeError, op, f"k must be an int, got {k!r}") from None


def _triangle(op: str, x, k, upper: bool) -> Tensor:
    t = _tensor(x, op)
    k = _offset(op, k)
    if t.ndim == 0:
        raise op_error(
            ValueError, op, "the input must be at least 1-D, got a 0-d tensor", "pass a matrix"
        )
    if t.ndim == 1:  # NumPy: a vector is the rows of a square matrix
        t = broadcast_to(t, (t.shape[0], t.shape[0]))
    n, m = t.shape[-2:]
    rows = iota(dtypes.int32, (n, m), 0)
    cols = iota(dtypes.int32, (n, m), 1)
    shifted = rows + k if k else rows
    keep = shifted <= cols if upper else shifted >= cols
    return where(keep, t, False if t.dtype == dtypes.bool_ else 0)


def triu(x, k: int = 0) -> Tensor:
    """The upper triangle of the last two axes: elements below the ``k``-th diagonal are zeroed,
    as ``numpy.triu``/``torch.triu`` (``k > 0`` above the main diagonal, ``k < 0`` below; leading
    axes are a batch; a 1-D input is the rows of a square matrix, as in NumPy).

    >>> import nablax as nx
    >>> nx.triu(nx.ones((3, 3)), k=1).tolist()
    [[0.0, 1.0, 1.0], [0.0, 0.0, 1.0], [0.0, 0.0, 0.0]]
    """
    return _triangle("triu", x, k, upper=True)


def tril(x, k: int = 0) -> Tensor:
    """The lower triangle of the last two axes: elements above the ``k``-th diagonal are zeroed,
    as ``numpy.tril``/``torch.tril``.

    >>> import nablax as nx
    >>> nx.tril(nx.ones((2, 3))).tolist()
    [[1.0, 0.0, 0.0], [1.0, 1.0, 0.0]]
    """
    return _triangle("tril", x, k, upper=False)


def masked_fill(x, mask, value) -> Tensor:
    """``value`` where the boolean ``mask`` is true, else ``x``: PyTorch's ``Tensor.masked_fill``.

    ``mask`` and ``x`` broadcast together; ``value`` is a Python scalar or a 0-d tensor (it gets
    a gradient); the result has ``x``'s dtype (a float value on an integer tensor is truncated
    toward zero, as in PyTorch).

    >>> import nablax as nx
    >>> x = nx.tensor([[1., 2.], [3., 4.]])
    >>> x.masked_fill(nx.tensor([True, False]), -1.0).tolist()
    [[-1.0, 2.0], [-1.0, 4.0]]
    """
    t = _tensor(x, "masked_fill")
    m = _tensor(mask, "masked_fill")
    if m.dtype != dtypes.bool_:
        raise op_error(
            DTypeError,
            "masked_fill",
            f"mask must be a bool tensor, got {m.dtype}{list(m.shape)}",
            "pass a comparison such as x > 0, or mask.astype(nx.bool_)",
        )
    if isinstance(value, Tensor) or hasattr(value, "shape"):
        v = _tensor(value, "masked_fill")
        if v.ndim != 0:
            raise op_error(
                ValueError,
                "masked_fill",
                f"value must be a scalar or a 0-d tensor, got shape {v.shape}",
                "use nx.where(mask, values, x) to fill from a tensor",
            )
        out = where(m, astype(v, t.dtype), t)
    elif isinstance(value, (bool, int, float)):
        # converted on the host, so the tensor's own values never pass through another dtype
        if t.dtype == dtypes.bool_:
            value = bool(value)
        elif dtypes.is_integer(t.dtype):
            value = int(value)
        out = where(m, value, t)
    else:
        raise op_error(
            TypeError, "masked_fill", f"value must be a number or a 0-d tensor, got {value!r}"
        )
    return out if out.dtype == t.dtype else astype(out, t.dtype)

"""Linear algebra: ``einsum``, ``matmul`` and ``dot`` (builders of the ``einsum`` primitive,
core/prims/linalg.py) and the products written with them."""

from ..prims.linalg import (  # noqa: F401, A004 - NumPy names
    dot,
    einsum,
    matmul,
)
from ..tensor import Tensor, to_impl
from .shape import reshape


def outer(a, b) -> Tensor:
    """Outer product of the flattened inputs, as ``numpy.outer``.

    >>> import nablax as nx
    >>> nx.outer(nx.tensor([1., 2.]), nx.tensor([3., 4., 5.])).tolist()
    [[3.0, 4.0, 5.0], [6.0, 8.0, 10.0]]
    """
    ta = a if isinstance(a, Tensor) else Tensor._wrap(to_impl(a))
    tb = b if isinstance(b, Tensor) else Tensor._wrap(to_impl(b))
    return reshape(ta, (-1, 1)) * reshape(tb, (1, -1))

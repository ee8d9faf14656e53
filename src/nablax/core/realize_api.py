"""``nx.realize``: compute the pending work of several tensors as one program (the public entry
of core/realize.py, which sits below ``Tensor`` and knows only impls)."""

from __future__ import annotations

import jax

from .realize import realize_impls
from .tensor import Tensor


def realize(*tensors) -> None:
    """Compute all pending work behind ``tensors`` as one program (pytrees of tensors allowed).

    >>> import nablax as nx
    >>> a = nx.ones(3) * 2
    >>> b = a + 1
    >>> nx.realize(a, b)
    >>> a.is_realized and b.is_realized
    True
    """
    if len(tensors) == 1 and type(tensors[0]) is Tensor:  # the common nx.realize(x)
        impl = tensors[0]._impl
        if impl.value is None:
            realize_impls([impl])
        return
    impls = []
    for t in jax.tree_util.tree_leaves(tensors):  # a Tensor is a leaf (not a pytree node)
        if isinstance(t, Tensor) and t._impl.value is None:
            impls.append(t._impl)
    if impls:
        realize_impls(impls)

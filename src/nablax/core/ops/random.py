"""Random numbers (``nx.random``): the builders of the random primitives (core/prims/random.py)
and the samplers written with them."""

import numpy as np

from ..prims.random import (  # noqa: F401, A004 - NumPy names
    key,
    normal,
    randint,
    seed,
    split,
    uniform,
)
from ..tensor import Tensor


def bernoulli(key=None, p=0.5, shape=None) -> Tensor:  # noqa: F811 - the argument is named key
    """Booleans that are true with probability ``p`` (same values as ``jax.random.bernoulli``).

    >>> import nablax as nx
    >>> nx.random.bernoulli(nx.random.key(0), 0.5, (3,)).dtype
    dtype('bool')
    """
    pt = p if isinstance(p, Tensor) else None
    if shape is None:
        shape = pt.shape if pt is not None else np.shape(p)
    return uniform(key, shape) < p

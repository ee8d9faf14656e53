"""``nx.random``: keyed random numbers, bit-for-bit those of ``jax.random`` with the same key.

``import nablax.random`` and ``nx.random`` are the same module. The primitives and their rules are
in ``nablax/core/prims/random.py``; ``bernoulli`` is a composite in ``nablax/core/ops/random.py``.

>>> import nablax.random as nr
>>> nr.normal(nr.key(0), (2,)).shape
(2,)
"""

from .core.ops.random import bernoulli, key, normal, randint, seed, split, uniform
from .core.prims.random_more import categorical, fold_in

__all__ = [
    "key",
    "split",
    "normal",
    "uniform",
    "randint",
    "bernoulli",
    "seed",
    "categorical",
    "fold_in",
]

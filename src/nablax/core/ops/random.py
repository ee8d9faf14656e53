"""Random numbers: builders of the random primitives (core/prims/random.py)."""

from ..prims.random import (  # noqa: F401, A004 - NumPy names
    bernoulli,
    key,
    normal,
    randint,
    seed,
    split,
    uniform,
)

"""Linear algebra: ``einsum`` (core/prims/linalg.py) and the products written with it."""

from ..prims.linalg import (  # noqa: F401, A004 - NumPy names
    dot,
    einsum,
    matmul,
    outer,
)

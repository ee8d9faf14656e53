"""Array creation (``zeros``, ``arange``, ``eye``...): builders over ``iota``/``broadcast_in_dim`` (core/prims/creation.py)."""

from ..prims.creation import (  # noqa: F401, A004 - NumPy names
    arange,
    asarray,
    eye,
    full,
    full_like,
    iota,
    linspace,
    ones,
    ones_like,
    tensor,
    zeros,
    zeros_like,
)

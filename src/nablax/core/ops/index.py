"""Indexing (``x[i]``, ``x.at[i].set(v)``, ``take``...): builders of gather/scatter (core/prims/index.py) and composites."""

from ..prims.index import (  # noqa: F401, A004 - NumPy names
    _IndexUpdateHelper,
    _setitem,
    fill_code,
    fill_value,
    getitem,
    one_hot,
    take,
    take_along_axis,
)

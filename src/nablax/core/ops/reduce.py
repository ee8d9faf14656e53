"""Reductions, scans and sorts (NumPy's names): builders of the reduction primitives (core/prims/reduce.py) and composites."""

from ..prims.reduce import (  # noqa: F401, A004 - NumPy names
    all,
    any,
    argmax,
    argmin,
    argsort,
    cumsum,
    logsumexp,
    max,
    mean,
    min,
    prod,
    sort,
    std,
    sum,
    topk,
    var,
)

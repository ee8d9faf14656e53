"""The element-wise primitives, one module per concept:

- ``table``: the table of primitives (one row per primitive: dtype kind, lowering, partial
  derivatives), the records made from it, and one builder per row (``exp``, ``add``, ...);
- ``dtype_rules``: dtype resolution of the operands (the dtype kinds: computation and output
  dtypes of the promoted input dtype; the value of a Python int operand in a dtype);
- ``builders``: the hot-path builders that check operands and bind one node (the tensor with
  Python scalar case specialized per op);
- ``select_cast``: ``select``/``where``, ``convert_element_type``/``astype`` and ``stop_gradient``;
- ``relu``: the one-node ``relu`` whose derivative reads its output.

This package's namespace is the family's interface (the builders, the records, ``UNARY``,
``BINARY``, ``PRIMS``): ``from nablax.core.prims.elementwise import exp, where``.
"""

from .builders import _operand  # noqa: F401 - used by core/ops/elementwise.py
from .relu import relu, relu_p  # noqa: F401
from .select_cast import _stop_gradient, astype, convert, select, stop_gradient, where  # noqa: F401
from .table import (  # noqa: F401
    _JAX_PROBES,
    BINARY,
    PRIMS,
    UNARY,
    _fns,
    abs,
    add,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    ceil,
    clip,
    cos,
    cosh,
    divide,
    equal,
    erf,
    exp,
    expm1,
    floor,
    floor_divide,
    greater,
    greater_equal,
    invert,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log2,
    log10,
    logical_and,
    maximum,
    minimum,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sinh,
    sqrt,
    subtract,
    tan,
    tanh,
)

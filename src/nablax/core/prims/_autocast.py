"""What ``nx.autocast`` does to an op's inputs (the context manager itself: core/autocast.py).

The state is ``CTX.autocast`` (core/context.py): this thread's autocast compute dtype, or None.
It is read when an op is *built*, so the graph records the casts (or, for ``einsum``, the compute
dtype in the node's params): realization caches, backward plans and vmap see ordinary graphs, and
``nx.compile`` keys its traces on the state (core/transforms/compile/compiled.py). Derivative rules run
with the state cleared (core/transforms/vjp.py, jvp.py), so a backward pass computes in the dtypes
its forward pass used, as PyTorch's, and gradients reach float32 parameters as float32 through the
casts' own derivative.

Op classes, as PyTorch's autocast lists:

- ``"matmul"``, ``"einsum"``, ``"linear"``, ``"conv"``, ``"attention"``: floating inputs are cast
  to the autocast dtype;
- ``"softmax"``, ``"log_softmax"``, ``"norm"``, ``"loss"``, ``"reduction"``: float16 and bfloat16
  inputs are cast to float32 (other inputs are left as they are).
"""

from __future__ import annotations

from .. import dtypes
from ..context import CTX
from ..tensor import Tensor

LOW_PRECISION = frozenset({"matmul", "einsum", "linear", "conv", "attention"})
FLOAT32 = frozenset({"softmax", "log_softmax", "norm", "loss", "reduction"})
_CLASSES = LOW_PRECISION | FLOAT32
_HALF = (dtypes.float16, dtypes.bfloat16)


def compute_dtype(op_class: str, dt):
    """The dtype an op of ``op_class`` computes in for an input of dtype ``dt`` under the
    current autocast state (``dt`` itself outside ``nx.autocast`` or when it does not apply)."""
    if op_class not in _CLASSES:
        raise ValueError(
            f"nablax.core.autocast.cast_inputs: unknown op class {op_class!r}; use one of "
            f"{sorted(_CLASSES)}"
        )
    ac = CTX.autocast
    if ac is None or not dtypes.is_floating(dt):
        return dt
    if op_class in LOW_PRECISION:
        return ac
    return dtypes.float32 if dt in _HALF else dt


def cast_inputs(op_class: str, *tensors) -> tuple:
    """``tensors`` as an op of ``op_class`` takes them under the current ``nx.autocast`` (see the
    module docstring): floating tensors cast as the class says, everything else (ints, bools,
    None, Python numbers) unchanged. Outside ``nx.autocast`` the inputs come back as they are.

    >>> import nablax as nx
    >>> from nablax.core.autocast import cast_inputs
    >>> with nx.autocast(nx.bfloat16):
    ...     q, n = cast_inputs("attention", nx.ones(2), nx.arange(2))
    >>> q.dtype, n.dtype
    (dtype(bfloat16), dtype('int32'))
    """
    if CTX.autocast is None:
        if op_class not in _CLASSES:
            compute_dtype(op_class, dtypes.float32)  # raises: the same error inside and outside
        return tensors
    out = []
    for t in tensors:
        if isinstance(t, Tensor):
            dt = compute_dtype(op_class, t.dtype)
            if dt != t.dtype:
                t = t.astype(dt)
        out.append(t)
    return tuple(out)

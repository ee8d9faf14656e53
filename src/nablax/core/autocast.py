"""``nx.autocast``: mixed precision as ``torch.autocast``, a context manager and a decorator.

Inside it, matmuls, einsums, linear layers, convolutions and attention compute in the autocast
dtype (their floating inputs cast), while softmax, log_softmax, layer and RMS norms, losses and
the summing reductions (``sum``, ``mean``, ``prod``, ``cumsum``, ``var``, ``std``,
``logsumexp``) compute in float32. The state is per thread (``CTX.autocast``, core/context.py),
read when each op is built (core/prims/_autocast.py says which op does what), so:

- eager code, ``nx.grad`` and ``nx.vmap`` see ordinary graphs with the casts in them; derivative
  rules run with the state cleared, so the backward pass computes in the forward pass's dtypes
  and a float32 parameter's gradient is float32 (the derivative of its cast);
- ``nx.compile`` keys its traces on the state around the call: one function called inside and
  outside ``autocast`` has two traces and never replays the wrong one;
- another thread never sees this thread's autocast.

Ops that implement an op class elsewhere (``nn.functional.scaled_dot_product_attention``) call
:func:`cast_inputs` on their inputs.
"""

from __future__ import annotations

import contextlib
import threading

from ..errors import DTypeError, op_error
from . import dtypes
from .context import CTX
from .prims._autocast import FLOAT32, LOW_PRECISION, cast_inputs, compute_dtype

__all__ = ["autocast", "cast_inputs", "compute_dtype", "get_dtype", "LOW_PRECISION", "FLOAT32"]

_ALLOWED = (dtypes.bfloat16, dtypes.float16)


def get_dtype():
    """This thread's autocast compute dtype, or None outside ``nx.autocast``."""
    return CTX.autocast


class autocast(contextlib.ContextDecorator):  # noqa: N801 - torch's name
    """Run the enclosed code (or the decorated function) in mixed precision, as
    ``torch.autocast``: matmuls, einsums, linear layers, convolutions and attention compute in
    ``dtype`` (``nx.bfloat16`` or ``nx.float16``; floating inputs are cast), softmax,
    log_softmax, layer/RMS norms, losses and the summing reductions compute in float32.
    ``enabled=False`` turns autocast off inside an enclosing one. Works in eager code and under
    ``nx.grad``, ``nx.vmap`` and ``nx.compile`` (whose cache is keyed on the state); gradients of
    float32 parameters are float32. The state belongs to the calling thread.

    >>> import nablax as nx
    >>> w = nx.ones((3, 2))
    >>> with nx.autocast(nx.bfloat16):
    ...     y = nx.ones((4, 3)) @ w
    ...     p = nx.softmax(y)
    >>> y.dtype, p.dtype, w.dtype
    (dtype(bfloat16), dtype('float32'), dtype('float32'))
    >>> nx.grad(lambda w: nx.autocast()(lambda: (nx.ones((4, 3)) @ w).sum())())(w).dtype
    dtype('float32')
    """

    def __init__(self, dtype=dtypes.bfloat16, enabled: bool = True) -> None:
        dt = dtypes.canonicalize(dtype)
        if dt not in _ALLOWED:
            raise op_error(
                DTypeError,
                "autocast",
                f"dtype must be nx.bfloat16 or nx.float16, got {dt}",
                "pass nx.bfloat16 (the default) or nx.float16",
            )
        if not isinstance(enabled, bool):
            raise op_error(TypeError, "autocast", f"enabled must be a bool, got {enabled!r}")
        self.dtype = dt
        self.enabled = enabled
        self._saved = threading.local()  # one stack per thread: a decorator may run in many

    def __enter__(self) -> autocast:
        stack = self._saved.__dict__.setdefault("stack", [])
        stack.append(CTX.autocast)
        CTX.autocast = self.dtype if self.enabled else None
        return self

    def __exit__(self, *exc) -> None:
        CTX.autocast = self._saved.stack.pop()

    def __repr__(self) -> str:
        return f"nx.autocast(dtype={self.dtype}, enabled={self.enabled})"

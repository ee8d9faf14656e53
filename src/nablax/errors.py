"""Error classes of nablax and helpers that make their messages useful.

Messages name the API (``nx.matmul``), the offending argument, the shapes/dtypes involved and how to
fix the problem.
"""

from __future__ import annotations

from typing import Any


class NablaxError(Exception):
    """Base class of nablax-specific errors."""


class ShapeError(NablaxError, ValueError):
    """Incompatible shapes or an out-of-range axis, raised when the op is built."""


class DTypeError(NablaxError, TypeError):
    """An operation does not support the dtype(s) it was given."""


class GraphBreakError(NablaxError, RuntimeError):
    """A value was needed (realization) where a whole-graph trace was required."""


class ConcretizationError(NablaxError, RuntimeError):
    """A Python value was requested from a tensor that has no concrete value (being traced)."""


class NoConfigError(NablaxError, LookupError):
    """The kernel config selection chain found no config for an invocation."""


def describe(x: Any) -> str:
    """Short description of an argument for error messages: ``float32[2,3]`` or the Python type."""
    shape = getattr(x, "shape", None)
    dtype = getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return f"{dtype}[{','.join(str(d) for d in shape)}]"
    return f"{type(x).__name__} {x!r}"[:80]


def op_error(cls: type[Exception], op: str, problem: str, fix: str | None = None) -> Exception:
    """Build an exception whose message reads ``nx.<op>: <problem>. <fix>``."""
    msg = f"nx.{op}: {problem}"
    if fix:
        msg += f". Fix: {fix}"
    return cls(msg)


class ConfigError(NablaxError, ValueError):
    """An option was given a value it does not accept (wrong type, out of range, or an
    unparsable ``NABLAX_*`` environment variable). The message names the option, its variable and
    the accepted values."""


class UnknownOptionError(NablaxError, KeyError, AttributeError):
    """No option has this name. The message lists close matches and every option."""

    def __str__(self) -> str:  # KeyError's str() would quote the whole message
        return str(self.args[0]) if self.args else ""


class XCSError(NablaxError, RuntimeError):
    """An ``nablax.xcs`` transform cannot apply to a function (e.g. ``grad`` of orchestration)."""

"""Argument checks and messages of ``nx.compile`` (compiled.py): names for any callable, static
argument numbers checked against the signature as ``jax.jit`` does, and the graph-break warning
that names the fix that applies."""

from __future__ import annotations

import functools
import inspect

_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def callable_name(f) -> str:
    """A readable name for any callable: a function's qualified name, ``partial(g)`` for a
    ``functools.partial``, the class name of an object with ``__call__``."""
    name = getattr(f, "__qualname__", None) or getattr(f, "__name__", None)
    if isinstance(name, str):
        return name
    if isinstance(f, functools.partial):
        return f"partial({callable_name(f.func)})"
    return type(f).__qualname__


def check_static_argnums(name: str, sig, nums: tuple) -> None:
    """``static_argnums`` beyond the positional parameters of ``sig`` raise ``ValueError`` (as
    ``jax.jit``), unless the function takes ``*args``; unknown signatures are checked per call
    (:func:`check_static_positions`)."""
    if sig is None or not nums:
        return
    params = list(sig.parameters.values())
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
        return
    n = sum(1 for p in params if p.kind in _BY_POSITION)
    bad = [i for i in nums if not -n <= i < n]
    if bad:
        raise ValueError(
            f"nx.compile({name}): static_argnums={nums} names position {bad[0]}, but the function "
            f"takes {n} positional argument{'' if n == 1 else 's'}{_params(params)}. Fix: number "
            f"the static arguments from 0 among the positional parameters, or name them with "
            f"static_argnames"
        )


def _params(params) -> str:
    names = [p.name for p in params if p.kind in _BY_POSITION]
    return f" ({', '.join(names)})" if names else ""


def check_static_positions(name: str, nums: tuple, n_args: int, kwargs) -> None:
    """For a callable without a signature: a static position past the call's positional
    arguments raises ``ValueError`` (there is no parameter it could name)."""
    bad = [i for i in nums if not -n_args <= i < n_args]
    if bad:
        raise ValueError(
            f"nx.compile({name}): static_argnums names position {bad[0]}, but this call passes "
            f"{n_args} positional argument{'' if n_args == 1 else 's'}. Fix: pass the static "
            f"argument by position, or drop it from static_argnums"
        )


def eager_fallback_message(err: Exception) -> str:
    """A graph break's message for the warning of ``fullgraph=False``: the clause suggesting
    ``fullgraph=False`` (which is what is happening) left out."""
    msg = str(err)
    for clause in (
        ", or use fullgraph=False to run this signature eagerly",
        ", or use fullgraph=False",
    ):
        msg = msg.replace(clause, "")
    return msg if msg.endswith(".") else msg + "."

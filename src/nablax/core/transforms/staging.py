"""Staging a function into one XLA program: the machinery ``nx.compile`` and ``nx.shard_map``
share.

The function runs once on *placeholder* tensors (pending tensors whose nodes stand for the
arguments; ``compile_input``), which records its whole lazy graph; :func:`lower` turns the graph
from the placeholders (plus the arrays it captured) to the outputs into a Python function over JAX
values, to be jitted. While a function is being staged (:func:`trace_graph`), a realization that
needs a placeholder is a graph break (:class:`~nablax.errors.GraphBreakError`, naming the user's
line), and pending tensors built on placeholders are forgotten afterwards so no eager program ever
picks them up. Symbolic sizes (``dynamic_dims``) used as values become ``dimension_value`` nodes
(core/tensor.py builds them: ``to_impl`` of a symbolic size).
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import numpy as np

from ...errors import GraphBreakError
from .. import hooks as _hooks
from .. import realize as _realize
from ..build import bind_known
from ..context import CTX
from ..graph import SCALAR_TYPES, Var, _next_seq, encode, run_steps, toposort
from ..primitive import primitive, zero_jvp, zero_vjp
from ..tensor import Tensor

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _placeholder_lower(params, *xs):  # pragma: no cover - never lowered: replaced by arguments
    raise GraphBreakError("nx.compile: a placeholder argument has no value while tracing")


def _placeholder_batch(params, bds):  # pragma: no cover - never lowered, batched or not
    return _placeholder_lower(params)


def _placeholder_shard(params, layouts, in_avals, out_avals):  # pragma: no cover - as above
    raise GraphBreakError("nx.compile: a placeholder argument has no layout while tracing")


# A placeholder node stands for an argument of the traced program. It is never lowered (the
# program reads its arguments instead: the lowering and the batch and sharding rules raise), and
# transforms see it as an untraced input, so its derivative is zero (a differentiated argument is
# marked by a trace_input node on top of it).
compile_input_p = primitive(
    "compile_input",
    lambda params: ((params[0], params[1]),),
    _placeholder_lower,
    jvp=zero_jvp,
    vjp=zero_vjp,
    batch=_placeholder_batch,
    shard=_placeholder_shard,
    differentiable=False,
    doc="An argument of a function being traced by nx.compile (see transforms/compile/compiled.py).",
)


def _user_frame() -> str:
    """``file:line`` of the innermost frame outside nablax (where the user's code realized)."""
    for fr in reversed(traceback.extract_stack()):
        if not os.path.abspath(fr.filename).startswith(_PKG_DIR):
            return f"{fr.filename}:{fr.lineno} ({fr.line})"
    return "<unknown>"


class _Tracing:
    """Marks a trace in progress: realizations that need a placeholder raise GraphBreakError."""

    def __enter__(self):
        CTX.tracing_depth += 1
        self.epoch = _realize.epoch()
        return self

    def __exit__(self, *exc):
        CTX.tracing_depth -= 1


def _check_no_placeholder(nodes) -> None:
    """Called by realization while tracing: a placeholder in the program is a graph break (or,
    when the program needs only traced Python numbers, a concretization error naming them)."""
    needed = [n for n in nodes if n.prim is compile_input_p]
    if not needed:
        return
    # CTX.scalar_args: placeholder node -> the Python number argument it stands for (a
    # scalars.ScalarArg); such a value needed by a program is a ConcretizationError naming
    # static_argnums, not a graph break
    scalar_args = CTX.scalar_args
    origins = [scalar_args.get(n) for n in needed]
    if all(o is not None for o in origins):
        first = origins[0]
        assert first is not None  # as all the others
        raise first.error("read the value of", origins)
    raise GraphBreakError(
        f"nx.compile: the traced function needs a concrete value at {_user_frame()}. "
        f"Fix: keep values lazy inside the function (nx.cond / nx.switch instead of a Python "
        f"if, nx.while_loop / nx.fori_loop / nx.scan instead of a Python while, nx.where for "
        f"element-wise choices; "
        f"return tensors instead of calling .item()), or use fullgraph=False to run this "
        f"signature eagerly"
    )


_hooks.set_tracing_check(_check_no_placeholder)  # core/hooks.py: late binding 3


def forget_traced(placeholders, since: int | None = None) -> None:
    """Drop the pending tensors that depend on the trace's placeholders from the pending list, so
    no later eager realization pulls them into its program (they have no values); with ``since``
    (the node sequence number at the trace's start), every tensor built during the trace too
    (its shapes may be symbolic, ``dynamic_dims``: an eager program cannot compute it)."""
    dep = dict.fromkeys(placeholders, True)

    def depends(node) -> bool:
        stack = [node]
        while stack:
            n = stack[-1]
            if n in dep:
                stack.pop()
                continue
            todo = [
                m
                for inp in n.inputs or ()
                if type(inp) is Var and (m := inp[0]) not in dep and m.values is None
            ]
            if todo:
                stack.extend(todo)
                continue
            dep[n] = any(type(inp) is Var and dep.get(inp[0], False) for inp in n.inputs or ())
            stack.pop()
        return dep[node]

    keep = []
    for wr in CTX.pending:
        impl = wr()
        if impl is None or impl.value is not None:
            continue
        node = impl.src[0]
        if (since is None or node.seq < since) and not depends(node):
            keep.append(wr)
    CTX.pending[:] = keep


def make_placeholder(t: Any, k: int):
    """``(node, tensor)``: a pending tensor standing for argument ``k`` (shape/dtype of ``t``, a
    tensor or any object with ``shape`` and ``dtype``)."""
    (impl,) = bind_known(compile_input_p, (), (t.shape, t.dtype, k), ((t.shape, t.dtype),))
    return impl.src[0], Tensor._wrap(impl)


def trace_graph(f, args, placeholders):
    """Run ``f(*args)`` on placeholder tensors as a whole-graph trace (realizations needing a
    placeholder raise GraphBreakError); pending tensors built during it are forgotten after."""
    since = _next_seq()
    try:
        with _Tracing() as tr:
            out = f(*args)
            if _realize.epoch() != tr.epoch:
                raise GraphBreakError(
                    f"nx.compile: {getattr(f, '__qualname__', f)} realized a value while being "
                    f"traced (a graph break). Fix: keep values lazy inside the function, or use "
                    f"fullgraph=False"
                )
        return out
    finally:  # pending tensors built while tracing must never join an eager program
        forget_traced(placeholders, since)


def lower(out_impls, placeholders):
    """``program(*args, *captured)`` (to be jitted) computing ``out_impls`` from the placeholders
    and the realized arrays the graph captured; returns ``(program, captured)``."""
    order = toposort([i.src[0] for i in out_impls if i.src is not None])
    pos = {n: i for i, n in enumerate(placeholders)}
    captured: list = []
    cap_ids: dict = {}

    def source(inp) -> tuple:
        """Where an external value comes from: ("arg", k), ("cap", k) or ("lit", numpy scalar)."""
        if type(inp) is Var:
            m, j = inp
            if m.prim is compile_input_p:
                return ("arg", pos[m])
            return ("cap", _capture(m.values[j], captured, cap_ids))  # realized outside
        if type(inp.value) in SCALAR_TYPES:
            return ("lit", np.asarray(inp.value, inp.dtype))
        return ("cap", _capture(inp.value, captured, cap_ids))

    slot: dict = {}
    steps, n_slots, ext_refs = encode([n for n in order if n.prim is not compile_input_p], slot)
    ext = [source(inp) for inp in ext_refs]
    outs = []  # a slot, or a source
    for impl in out_impls:
        r = impl.src
        if r is None:
            outs.append(("cap", _capture(impl.value, captured, cap_ids)))
        else:
            outs.append(slot[r[0]] + r[1] if r[0] in slot else source(r))

    n_args = len(placeholders)

    def program(*flat):
        args, caps = flat[:n_args], flat[n_args:]

        def get(c):
            return args[c[1]] if c[0] == "arg" else caps[c[1]] if c[0] == "cap" else c[1]

        env = run_steps(steps, [None] * n_slots, [get(c) for c in ext])
        return [env[c] if type(c) is int else get(c) for c in outs]

    return program, captured


def _capture(arr, captured: list, ids: dict) -> int:
    k = ids.get(id(arr))
    if k is None:
        k = ids[id(arr)] = len(captured)
        captured.append(arr)
    return k

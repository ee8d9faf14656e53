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
import weakref
from typing import Any

import numpy as np

from ...errors import GraphBreakError
from .. import realize as _realize
from ..build import TensorImpl
from ..context import CTX
from ..graph import SCALAR_TYPES, Const, Node, _next_seq, split_ref, src_node, toposort
from ..primitive import Primitive
from ..tensor import Tensor

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _placeholder_lower(params, *xs):  # pragma: no cover - never lowered: replaced by arguments
    raise GraphBreakError("nx.compile: a placeholder argument has no value while tracing")


# Not an operation, so not in the registry: a placeholder node stands for an argument of the
# traced program. It is never lowered (the program reads its arguments instead) and transforms
# see it as an untraced input, so it needs no derivative or batching rule.
compile_input_p = Primitive(
    "compile_input",
    lambda params: ((params[0], params[1]),),
    _placeholder_lower,
    differentiable=False,
    doc="An argument of a function being traced by nx.compile (see transforms/compile.py).",
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


# Placeholder node -> the Python number argument it stands for (a scalars.ScalarArg); such a
# value needed by a program is a ConcretizationError naming static_argnums, not a graph break.
SCALAR_ARGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _check_no_placeholder(nodes) -> None:
    """Called by realization while tracing: a placeholder in the program is a graph break (or,
    when the program needs only traced Python numbers, a concretization error naming them)."""
    needed = [n for n in nodes if n.prim is compile_input_p]
    if not needed:
        return
    origins = [SCALAR_ARGS.get(n) for n in needed]
    if all(o is not None for o in origins):
        first = origins[0]
        assert first is not None  # as all the others
        raise first.error("read the value of", origins)
    raise GraphBreakError(
        f"nx.compile: the traced function needs a concrete value at {_user_frame()}. "
        f"Fix: keep values lazy inside the function (use nx.where instead of Python if, "
        f"return tensors instead of calling .item()), or use fullgraph=False to run this "
        f"signature eagerly"
    )


_realize._tracing_check = _check_no_placeholder


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
                if (r := split_ref(inp)) is not None and (m := r[0]) not in dep and m.values is None
            ]
            if todo:
                stack.extend(todo)
                continue
            dep[n] = any(
                (r := split_ref(inp)) is not None and dep.get(r[0], False) for inp in n.inputs or ()
            )
            stack.pop()
        return dep[node]

    keep = []
    for wr in CTX.pending:
        impl = wr()
        if impl is None or impl.value is not None:
            continue
        node = src_node(impl.src)
        if (since is None or node.seq < since) and not depends(node):
            keep.append(wr)
    CTX.pending[:] = keep


def make_placeholder(t: Any, k: int):
    """``(node, tensor)``: a pending tensor standing for argument ``k`` (shape/dtype of ``t``, a
    tensor or any object with ``shape`` and ``dtype``)."""
    node = Node(compile_input_p, (t.shape, t.dtype, k), (), 1, None)
    impl = TensorImpl(node, None, t.shape, t.dtype)
    node.outs = (weakref.ref(impl),)
    return node, Tensor._wrap(impl)


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
    order = toposort([src_node(i.src) for i in out_impls if i.src is not None])
    pos = {n: i for i, n in enumerate(placeholders)}
    slot: dict = {}
    captured: list = []
    cap_ids: dict = {}
    steps = []
    for n in order:
        if n.prim is compile_input_p:
            continue
        codes = []
        for inp in n.inputs:
            t = type(inp)
            if t is Node or t is tuple:
                m, j = (inp, 0) if t is Node else inp
                if m.prim is compile_input_p:
                    codes.append(("arg", pos[m]))
                elif m in slot:
                    codes.append(("node", m, j))
                else:  # realized outside the program
                    codes.append(("cap", _capture(m.values[j], captured, cap_ids)))
            elif t is Const:
                codes.append(("lit", np.asarray(inp.value, inp.dtype)))
            elif t in SCALAR_TYPES:
                codes.append(("lit", np.asarray(inp, n.params[0])))
            else:
                codes.append(("cap", _capture(inp, captured, cap_ids)))
        slot[n] = True
        steps.append((n, n.prim, n.params, codes, n.bdims[0] if n.bdims else None))
    outs = []
    for impl in out_impls:
        if impl.src is None:
            outs.append(("cap", _capture(impl.value, captured, cap_ids)))
        else:
            m, j = (impl.src, 0) if type(impl.src) is Node else impl.src
            outs.append(("arg", pos[m]) if m.prim is compile_input_p else ("node", m, j))

    n_args = len(placeholders)

    def program(*flat):
        args, caps = flat[:n_args], flat[n_args:]
        env: dict = {}

        def get(c):
            kind = c[0]
            if kind == "arg":
                return args[c[1]]
            if kind == "cap":
                return caps[c[1]]
            if kind == "lit":
                return c[1]
            v = env[c[1]]
            return v[c[2]] if c[1].prim.multiple_results else v

        for n, prim, params, codes, bds in steps:
            vals = [get(c) for c in codes]
            env[n] = prim.lower(params, *vals) if bds is None else prim.batch(params, bds, *vals)
        return [get(c) for c in outs]

    return program, captured


def _capture(arr, captured: list, ids: dict) -> int:
    k = ids.get(id(arr))
    if k is None:
        k = ids[id(arr)] = len(captured)
        captured.append(arr)
    return k

"""Staging a function into a *logical* sub-program: the machinery of the control-flow nodes
(``nx.cond``, ``nx.switch``, ``nx.while_loop``, ``nx.fori_loop``, ``nx.scan``, ``nx.checkpoint``).

A branch or loop body runs once per call on placeholder tensors (:class:`~.subprogram.Stage`, the
machinery of ``nx.shard_map``). Its sub-graph becomes a :class:`~.subprogram.Body` (hashable by
structure, so the realization cache compiles a repeated call once) and every outside tensor it reads
becomes one more input of the node (closure conversion: gradients flow to closed-over tensors).

Unlike a ``shard_map`` body, a control-flow body is *logical*: its placeholders have no vmap batch
axes, whatever the operands' batch axes are. The node's batch rule is then ``jax.vmap`` of the
``jax.lax`` lowering, so a batched predicate or trip count behaves exactly as in JAX (``cond`` runs
both branches and selects, ``while_loop`` runs until every example is done), and the derivative
rules are JAX's derivatives of that lowering (``prims._rules.derived_from_jax``).

A body that reads a vmap-batched tensor from its closure would record batched nodes. Such a
tensor is found after the first run; the function then runs again with the tensor standing for a
logical placeholder while it runs (its impl points at the placeholder, and is restored at once),
so the body stays logical and the batched tensor is an ordinary batched input of the node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .... import tree as _tree
from ....errors import ConcretizationError, GraphBreakError
from ...build import bind_known
from ...context import CTX
from ...graph import Literal, Var, _next_seq
from ...tensor import Tensor
from ..subprogram import Body, Stage, common_batch

_MAX_RESTAGE = 4


def fname(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def as_tensor(x, what: str, path: str, dtype=None) -> Tensor:
    """A leaf given to a control-flow function as a tensor (arrays and Python numbers convert)."""
    if isinstance(x, Tensor):
        return x if dtype is None or x.dtype == dtype else x.astype(dtype)
    if (
        isinstance(x, (bool, int, float, complex, np.ndarray, np.generic))
        or hasattr(x, "__jax_array__")
        or type(x).__module__.startswith("jax")
    ):
        return Tensor(x, dtype)
    raise TypeError(
        f"nx.{what}: {path} is a {type(x).__name__}; every leaf must be a tensor, an array or a "
        f"Python number. Fix: pass static values through a closure instead"
    )


class Staged:
    """One staged function: its body, the node inputs it needs (operand refs, then the refs of
    the outside tensors it read, then its scalars), their batch shapes, and its output tree."""

    __slots__ = ("body", "refs", "bshapes", "out_def", "out_avals")

    def __init__(self, body: Body, refs: list, bshapes: list, out_def: Any) -> None:
        self.body, self.refs, self.bshapes, self.out_def = body, refs, bshapes, out_def
        self.out_avals = body.out_avals

    def inputs(self) -> tuple[list, list]:
        """``(refs, batch shapes)`` of every node input, the body's scalars last."""
        lits = [Literal(v, d) for v, d in self.body.lits]
        return self.refs + lits, self.bshapes + [()] * len(lits)

    def in_avals(self) -> list:
        """Logical ``(shape, dtype)`` of every node input (the placeholders', then scalars)."""
        return [i.aval for i in self.body.ins] + [((), d) for _, d in self.body.lits]


def _bshape_of(ref) -> tuple:
    if type(ref) is Var:
        m = ref[0]
        return m.bdims[1] if m.bdims is not None else ()
    return ()


def stage(
    f: Callable, operands: list[Tensor], make_args, what: str, prepare=None, avals=None
) -> Staged:
    """Run ``f(*make_args(placeholders))`` on one logical placeholder per operand (of the
    operand's shape and dtype, or ``avals[k]``) and return the staged body. ``prepare(out)``
    returns ``(tensor leaves, treedef)`` of ``f``'s result and checks it (raising a clear error;
    default: any pytree of tensors and numbers)."""
    swapped: dict = {}  # batched outside Var -> its TensorImpl (stands for a placeholder)
    for _ in range(_MAX_RESTAGE):
        lo = _next_seq()
        staged, batched = _stage_once(f, operands, make_args, what, prepare, avals, swapped)
        if not batched:
            return staged
        for ref in _batched_roots(batched, lo):
            impl = ref[0].outs[ref[1]]()
            if impl is None or impl.src != ref:
                raise NotImplementedError(
                    f"nx.{what}: {fname(f)} reads a vmap-batched tensor from its closure that is "
                    f"no longer referenced. Fix: pass it to nx.{what} as an operand"
                )
            swapped[ref] = impl
    raise NotImplementedError(
        f"nx.{what}: {fname(f)} reads different vmap-batched tensors from its closure each time "
        f"it runs. Fix: pass them to nx.{what} as operands"
    )


def _batched_roots(refs, lo: int) -> list:
    """The batched tensors that existed before the body ran and that the batched values it read
    from outside are computed from (values computed from them alone while it ran were hoisted
    out of the body: they are temporaries)."""
    roots: dict = {}
    seen: set = set()
    stack = list(refs)
    while stack:
        r = stack.pop()
        if type(r) is not Var:
            raise NotImplementedError(
                "a control-flow body reads a vmap-batched tensor that has already been computed "
                "from its closure. Fix: pass it to the control-flow function as an operand"
            )
        if r in seen:
            continue
        seen.add(r)
        m = r[0]
        if m.seq < lo or m.inputs is None or m.values is not None:
            roots[r] = None
            continue
        bds = m.bdims[0] if m.bdims is not None else ()
        stack.extend(i for i, b in zip(m.inputs, bds) if b)
    return list(roots)


def _stage_once(f, operands, make_args, what, prepare, avals, swapped):
    saved_depths = (CTX.vmap_depth, CTX.vjp_depth)
    CTX.vmap_depth = CTX.vjp_depth = 0  # the body is logical: no vmap encloses it
    CTX.cf_depth += 1  # control-flow bodies being staged by this thread
    try:
        with Stage() as st:
            avals = avals or [(t.shape, t.dtype) for t in operands]
            phs = [st.add(shape, dtype, (), None) for shape, dtype in avals]
            saved = []
            try:
                for impl in swapped.values():
                    ph = st.add(impl.shape, impl.dtype, (), None)
                    saved.append((impl, impl.src, impl.value, impl.lit, impl.batch_shape))
                    impl.src, impl.value, impl.lit = ph._impl.src, None, None
                    impl.batch_shape = ()
                try:
                    out = f(*make_args(phs))
                except (GraphBreakError, ConcretizationError) as e:
                    raise _renamed(e, what, f) from None
                leaves, out_def = prepare(out) if prepare else _default_prepare(out, what, f)
                body = st.finish(leaves, None, [None] * len(leaves))
            finally:
                for impl, src, value, lit, bshape in saved:
                    impl.src, impl.value, impl.lit, impl.batch_shape = src, value, lit, bshape
            captured = list(st.captured)
    finally:
        CTX.vmap_depth, CTX.vjp_depth = saved_depths
        CTX.cf_depth -= 1
    n_op = len(operands)
    refs = [t._impl.ref for t in operands] + list(swapped) + captured
    bshapes = [t._impl.batch_shape for t in operands]
    bshapes += [impl.batch_shape for impl in swapped.values()]
    bshapes += [_bshape_of(r) for r in captured]
    batched = [r for r, i in zip(captured, body.ins[n_op + len(swapped) :]) if i.bshape]
    return Staged(body, refs, bshapes, out_def), batched


def _default_prepare(out, what: str, f) -> tuple[list, Any]:
    leaves, out_def = _tree.flatten(out)
    paths = [p for p, _ in _tree.leaves_with_path(out, prefix="output")]
    return [as_tensor(v, what, f"{p} of {fname(f)}") for p, v in zip(paths, leaves)], out_def


def _renamed(e: Exception, what: str, f) -> Exception:
    msg = str(e).replace("nx.compile:", f"nx.{what}:", 1)
    msg = msg.replace(", or use fullgraph=False to run this signature eagerly", "")
    return type(e)(
        f"{msg}. {fname(f)} is traced once into a sub-graph of the nx.{what} node, so its "
        f"tensors have no values while it runs"
    )


def needs_residuals(refs) -> bool:
    """Whether a control-flow node on ``refs`` belongs to a differentiation trace that nablax's
    backward pass will walk (inside another control-flow body, JAX differentiates the whole
    lowering instead)."""
    if CTX.cf_depth:
        return False
    return any(type(r) is Var and r[0].trace is not None for r in refs)


def add_node(prim, params: tuple, refs: list, bshapes: list, out_avals) -> list[Tensor]:
    """Add one control-flow node (inputs ``refs``, with their batch shapes) to the graph."""
    out_b = common_batch(bshapes)
    bdims = (tuple(len(b) for b in bshapes), out_b) if out_b else None
    impls = bind_known(prim, refs, params, tuple(out_avals), bdims=bdims)
    return [Tensor._wrap(i) for i in impls]

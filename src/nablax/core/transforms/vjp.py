"""Reverse mode: ``nx.vjp``, ``nx.grad``, ``nx.value_and_grad``, ``nx.jacrev``, ``nx.hessian`` and
the PyTorch-style ``requires_grad_`` / ``backward`` / ``.grad``.

The backward pass walks the traced nodes between the outputs and the transform's markers in reverse
topological order and applies each primitive's ``vjp`` rule. Rules build lazy nablax ops, so
gradients are graphs too: they realize together with everything else, and they can be
differentiated again (``grad(grad(f))``).
"""

from __future__ import annotations

import functools
import operator
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from ... import _config
from ... import tree as _tree
from ...errors import op_error
from ..build import TensorImpl
from ..context import CTX
from ..graph import end_trace, gc_paused
from ..ops.creation import ones_like, zeros
from ..tensor import Tensor
from . import plan as _plan
from .trace import (
    GRAD_ROOT,
    LEAVES,
    LazyOutputs,
    _mark_leaves,
    collect,
    depends,
    is_float,
    mark,
    marker_of,
    open_trace,
    ref_key,
    tensor_of,
    trace_input_p,
)
from .vmap import sum_to_batch, vmap_depth


def backward_pass(seeds, markers, trace=None, depth: int = 0) -> dict:
    """Cotangents of ``markers`` given ``seeds = [(tensor, cotangent), ...]``.

    Returns ``{marker_node: cotangent Tensor}`` (markers that receive nothing are absent).
    ``markers`` is ordered (a dict). With the transform's ``trace``, the pass is recorded as a plan
    for this forward structure, or replayed from one (see :mod:`.plan`). ``depth``: the number of
    vmaps enclosing the transform (see :func:`.vmap.sum_to_batch`).
    """
    key = frame = None
    if trace is not None and _config.get("backward_plans"):
        roots = [t._impl.src[0] for t, ct in seeds if t._impl.src is not None]
        key, frame = _plan.signature(collect(roots, markers), markers, seeds, trace, depth)
        if key is not None:
            plan = _plan.lookup(key)
            if _plan.is_plan(plan):
                return _plan.replay(plan, frame, markers)
            if plan is not None:
                key = None  # this structure is known to be unplannable
    ctx = CTX
    saved, ctx.vjp_depth = ctx.vjp_depth, depth  # read by the batch-level rules (vmap.py)
    # rules compute in their forward node's dtypes, never under nx.autocast (core/autocast.py)
    saved_autocast, ctx.autocast = ctx.autocast, None
    try:
        result = _run_rules(seeds, markers, depth)
    finally:
        ctx.vjp_depth = saved
        ctx.autocast = saved_autocast
    if key is not None:
        assert frame is not None  # signature() gives both or neither
        _plan.record(key, frame, markers, result)
    return result


def _run_rules(seeds, markers, depth: int) -> dict:
    cts: dict = {}
    roots = []
    for t, ct in seeds:
        src = t._impl.src
        if src is None or ct is None:
            continue
        _accumulate(cts, src, ct)  # keyed by Var: (node, index)
        roots.append(src[0])
    order = collect(roots, markers)
    dep = depends(order, markers)
    memo: dict = {}
    result = {}
    for n in reversed(order):
        if n not in dep:
            continue
        if n in markers:
            ct = cts.pop((n, 0), None)
            if ct is not None:
                result[n] = ct
            continue
        nout = len(n.outs)
        out_cts = [cts.pop((n, j), None) for j in range(nout)]
        if all(c is None for c in out_cts):
            continue
        refs = n.inputs
        assert refs is not None  # traced nodes keep their inputs while their trace is alive
        ins = [tensor_of(inp, n, memo, k) for k, inp in enumerate(refs)]
        in_cts = n.prim.rule("vjp")(n.params, out_cts, ins, LazyOutputs(n, memo))
        for inp, ct, x in zip(refs, in_cts, ins):
            if ct is None:
                continue
            key = ref_key(inp)
            if key is not None and key[0] in dep:
                if ct._impl.batch_shape != x._impl.batch_shape:  # x may be shared by examples
                    # levels no input had were made by the node (a vmap entry), not broadcast
                    fwd = n.bdims[1][: max(n.bdims[0])] if n.bdims is not None else ()
                    ct = sum_to_batch(ct, x._impl.batch_shape, fwd, depth)
                _accumulate(cts, key, ct)
    return result


def _accumulate(cts: dict, key, ct) -> None:
    prev = cts.get(key)
    cts[key] = ct if prev is None else prev + ct


# ---- argument handling -----------------------------------------------------------------------


def _fname(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def _as_tensor(leaf, api: str, f, path, allow_int: bool) -> Tensor | None:
    """A differentiated input as a Tensor; integer inputs raise (grad) or are skipped (vjp).
    ``path``: the leaf's path for errors, or a function returning it (paths cost a tree walk)."""
    if type(leaf) is Tensor and is_float(leaf.dtype):  # the common case: nothing to say
        return leaf
    if callable(path):
        path = path()
    if isinstance(leaf, Tensor):
        t = leaf
    elif isinstance(leaf, (float, np.floating)) or hasattr(leaf, "__array__"):
        t = Tensor(leaf)
    elif isinstance(leaf, (bool, int, np.integer)):
        t = Tensor(leaf)
    else:
        raise TypeError(
            f"nx.{api}: argument {path} of {_fname(f)} is a {type(leaf).__name__}, which cannot be "
            f"differentiated. Fix: pass tensors, or exclude it with argnums"
        )
    if not is_float(t.dtype):
        if allow_int:
            return None
        raise TypeError(
            f"nx.{api}: argument {path} of {_fname(f)} has integer/bool dtype {t.dtype} "
            f"(shape {t.shape}); gradients are only defined for float inputs. Fix: cast it with "
            f".astype(nx.float32), or leave it out of argnums"
        )
    return t


def _mark_args(api, f, args, argnums, trace, allow_int):
    """Replace the float tensor leaves of ``args[argnums]`` by markers of ``trace``."""
    args = list(args)
    per_arg = []  # for each argnum: (treedef, [marker node or None per leaf], [original leaf])
    for a in argnums:
        if a >= len(args) or a < -len(args):
            raise op_error(
                ValueError,
                api,
                f"argnums={a} but {_fname(f)} was called with {len(args)} positional argument(s)",
            )
        leaves, treedef = _tree.flatten(args[a])
        fast = _mark_leaves(leaves, trace, trace_input_p, is_float)  # a model's parameters
        if fast is not None:
            new_leaves, nodes = fast
            per_arg.append((treedef, nodes, leaves))
            args[a] = _tree.unflatten(treedef, new_leaves)
            continue
        new_leaves, nodes = [], []
        for i, leaf in enumerate(leaves):
            if type(leaf) is Tensor and is_float(leaf.dtype):  # the common case: nothing to say
                t = leaf
            else:
                path = functools.partial(_leaf_path, args[a], f"args[{a}]", i)
                t = _as_tensor(leaf, api, f, path, allow_int)
                if t is None:
                    new_leaves.append(leaf)
                    nodes.append(None)
                    continue
            m = mark(t, trace)
            new_leaves.append(m)
            nodes.append(m._impl.src[0])  # its marker node
        per_arg.append((treedef, nodes, leaves))
        args[a] = _tree.unflatten(treedef, new_leaves)
    return args, per_arg


def _leaf_path(tree, prefix: str, i: int) -> str:
    return _tree.leaves_with_path(tree, prefix=prefix)[i][0]


def _norm_argnums(argnums) -> tuple[tuple[int, ...], bool]:
    if isinstance(argnums, int):
        return (argnums,), True
    return tuple(argnums), False


def _split_aux(api, f, out, has_aux):
    if not has_aux:
        return out, None
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise TypeError(
            f"nx.{api}: with has_aux=True, {_fname(f)} must return a pair (output, aux), "
            f"got {type(out).__name__}"
        )
    return out[0], out[1]


def _out_tensors(api, f, out) -> tuple[list, Any]:
    leaves, treedef = _tree.flatten(out)
    for path, leaf in _tree.leaves_with_path(out, prefix="output"):
        if not isinstance(leaf, Tensor):
            raise TypeError(
                f"nx.{api}: {_fname(f)} returned a {type(leaf).__name__} at {path}; outputs to "
                f"differentiate must be tensors. Fix: return tensors, or move it into aux "
                f"(has_aux=True)"
            )
    return leaves, treedef


def check_readable(api: str, f, what: str, t: Tensor) -> Tensor:
    """A transform's result never keeps a batch level that no enclosing ``nx.vmap`` owns (it
    could never be read): a clear error at call time instead of an unreadable tensor."""
    depth = vmap_depth()
    if t._impl.batch_dims > depth:
        raise NotImplementedError(
            f"nx.{api}: {what} of {_fname(f)} came out with batch shape {t._impl.batch_shape} "
            f"under {depth} enclosing nx.vmap call(s), so it could not be read; nablax does not "
            f"support this composition of transforms (please report it, with the code)"
        )
    return t


_TENSOR_ONLY = frozenset((Tensor,))
_BATCH_SHAPE = operator.attrgetter("_impl.batch_shape")


def _cotangents(per_arg, grads: dict, single: bool, api: str = "vjp", f=None):
    out = []
    depth = vmap_depth()
    for a, (treedef, nodes, leaves) in enumerate(per_arg):
        if depth == 0 and None not in nodes:  # a model's parameters (Nodes compare by identity)
            vals = list(map(grads.get, nodes))
            if set(map(type, vals)) == _TENSOR_ONLY and not any(map(_BATCH_SHAPE, vals)):
                out.append(_tree.unflatten(treedef, vals))  # each a tensor, none batched
                continue
        vals = []
        for node, leaf in zip(nodes, leaves):
            if node is None:
                vals.append(None)
                continue
            g = grads.get(node)
            if g is not None:
                if len(g._impl.batch_shape) > depth:  # check_readable's test: it raises
                    check_readable(api, f, f"the cotangent of differentiated argument {a}", g)
            else:
                shape = leaf.shape if hasattr(leaf, "shape") else ()
                dt = leaf.dtype if isinstance(leaf, Tensor) else Tensor(leaf).dtype
                g = zeros(shape, dt)
            vals.append(g)
        out.append(_tree.unflatten(treedef, vals))
    return out[0] if single else tuple(out)


# ---- public API ------------------------------------------------------------------------------


class _VJPFunction:
    """The ``f_vjp`` returned by :func:`vjp`; its trace stays alive while this object exists."""

    def __init__(self, f, out_leaves, out_treedef, per_arg, trace) -> None:
        self._f = f
        self._out_leaves = out_leaves
        self._out_treedef = out_treedef
        self._per_arg = per_arg
        self._trace = trace
        self._depth = vmap_depth()

    def __call__(self, cotangent):
        leaves, treedef = _tree.flatten(cotangent)
        if treedef != self._out_treedef:
            raise ValueError(
                f"nx.vjp: the cotangent's structure {treedef} does not match the output structure "
                f"{self._out_treedef} of {_fname(self._f)}"
            )
        seeds = []
        for (path, out), ct in zip(
            _tree.leaves_with_path(_tree.unflatten(self._out_treedef, self._out_leaves), "output"),
            leaves,
        ):
            ct = ct if isinstance(ct, Tensor) else Tensor(ct, out.dtype)
            if ct.shape != out.shape:
                raise ValueError(
                    f"nx.vjp: cotangent for {path} of {_fname(self._f)} has shape {ct.shape}, "
                    f"expected {out.shape} (the output's shape)"
                )
            seeds.append((out, ct))
        markers = dict.fromkeys(n for _, nodes, _ in self._per_arg for n in nodes if n is not None)
        with gc_paused():
            grads = backward_pass(seeds, markers, self._trace, self._depth)
        return _cotangents(self._per_arg, grads, False, "vjp", self._f)


def vjp(f: Callable, *primals, has_aux: bool = False):
    """Evaluate ``f(*primals)`` and return ``(out, f_vjp)`` (``(out, f_vjp, aux)`` with ``has_aux``),
    where ``f_vjp(cotangent)`` gives one cotangent per primal, as ``jax.vjp``.

    >>> import nablax as nx
    >>> out, f_vjp = nx.vjp(lambda x: (x * x).sum(), nx.tensor([1.0, 2.0]))
    >>> f_vjp(nx.tensor(1.0))[0].tolist()
    [2.0, 4.0]
    """
    with open_trace() as trace:
        args, per_arg = _mark_args("vjp", f, primals, tuple(range(len(primals))), trace, True)
        out = f(*args)
    out, aux = _split_aux("vjp", f, out, has_aux)
    leaves, treedef = _out_tensors("vjp", f, out)
    f_vjp = _VJPFunction(f, leaves, treedef, per_arg, trace)
    trace.owner = weakref.ref(f_vjp)  # the forward graph stays walkable while f_vjp exists
    weakref.finalize(f_vjp, end_trace, trace)
    return (out, f_vjp, aux) if has_aux else (out, f_vjp)


def _value_and_grad_impl(api, f, argnums, has_aux, args, kwargs):
    nums, single = _norm_argnums(argnums)
    with gc_paused(), open_trace() as trace:
        try:
            margs, per_arg = _mark_args(api, f, args, nums, trace, False)
            out = f(*margs, **kwargs)
            out, aux = _split_aux(api, f, out, has_aux)
            if not isinstance(out, Tensor):
                raise TypeError(
                    f"nx.{api}: {_fname(f)} must return a scalar tensor, it returned "
                    f"{type(out).__name__}"
                )
            if out.shape != ():
                raise TypeError(
                    f"nx.{api}: {_fname(f)} must return a scalar (shape ()), it returned "
                    f"{out.dtype}{list(out.shape)}. Fix: reduce it (e.g. .sum() or .mean()), or "
                    f"use nx.vjp / nx.jacrev for non-scalar outputs"
                )
            if not is_float(out.dtype):
                raise TypeError(
                    f"nx.{api}: {_fname(f)} returned a {out.dtype} scalar; differentiate a float "
                    f"output"
                )
            nodes = per_arg[0][1]
            if len(per_arg) == 1 and None not in nodes:  # a model: every leaf marked
                markers = dict.fromkeys(nodes)
            else:
                markers = dict.fromkeys(n for _, ns, _ in per_arg for n in ns if n is not None)
            grads = backward_pass([(out, ones_like(out))], markers, trace, vmap_depth())
            g = _cotangents(per_arg, grads, single, api, f)
        finally:
            end_trace(trace)
    return (out, aux, g) if has_aux else (out, None, g)


def value_and_grad(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """``f`` and its gradient w.r.t. ``args[argnums]`` in one call, as ``jax.value_and_grad``.

    >>> import nablax as nx
    >>> v, g = nx.value_and_grad(lambda x: (x ** 3).sum())(nx.tensor([1.0, 2.0]))
    >>> v.item(), g.tolist()
    (9.0, [3.0, 12.0])
    """

    @functools.wraps(f)
    def run(*args, **kwargs):
        out, aux, g = _value_and_grad_impl("value_and_grad", f, argnums, has_aux, args, kwargs)
        return ((out, aux), g) if has_aux else (out, g)

    return run


def grad(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """Gradient of a scalar-valued ``f`` w.r.t. ``args[argnums]``, as ``jax.grad``.

    >>> import nablax as nx
    >>> nx.grad(lambda x: (x * x).sum())(nx.tensor([1.0, -3.0])).tolist()
    [2.0, -6.0]
    >>> nx.grad(nx.grad(lambda x: x ** 3))(nx.tensor(2.0)).item()
    12.0
    """

    @functools.wraps(f)
    def run(*args, **kwargs):
        _, aux, g = _value_and_grad_impl("grad", f, argnums, has_aux, args, kwargs)
        return (g, aux) if has_aux else g

    return run


# ---- PyTorch-style convenience ---------------------------------------------------------------


def requires_grad_(self: Tensor, requires_grad: bool = True) -> Tensor:
    """Make this tensor a leaf whose ``.grad`` is filled by ``backward()`` (PyTorch style).

    >>> import nablax as nx
    >>> w = nx.tensor([1.0, 2.0]).requires_grad_()
    >>> (w * w).sum().backward()
    >>> w.grad.tolist()
    [2.0, 4.0]
    """
    if not requires_grad:
        if self in LEAVES:
            LEAVES.discard(self)
            self._impl = TensorImpl(None, self._realized_value(), self._impl.shape, self.dtype)
        return self
    if self in LEAVES:
        return self
    if not is_float(self.dtype):
        raise TypeError(
            f"requires_grad_: only float tensors can require gradients, got {self.dtype}"
        )
    m = mark(self, GRAD_ROOT)
    self._impl = m._impl
    LEAVES.by_marker[marker_of(m)] = weakref.ref(self)
    LEAVES.add(self)
    return self


def _backward(self: Tensor, gradient=None) -> None:
    """Accumulate d(self)/d(leaf) into ``leaf.grad`` for every ``requires_grad`` leaf it uses."""
    if gradient is None:
        if self.shape != ():
            raise RuntimeError(
                f"backward: grad can be implicitly created only for scalar outputs, this tensor "
                f"has shape {self.shape}. Fix: pass gradient=..., or reduce it first"
            )
        gradient = ones_like(self)
    elif not isinstance(gradient, Tensor):
        gradient = Tensor(gradient, self.dtype)
    if gradient.shape != self.shape:
        raise ValueError(
            f"backward: gradient has shape {gradient.shape}, but the tensor has shape "
            f"{self.shape}; they must match"
        )
    src = self._impl.src
    if src is None:
        raise RuntimeError(
            "backward: this tensor does not depend on any tensor with requires_grad_() "
            "(or its graph was already freed)"
        )
    roots = [src[0]]
    markers = {n for n in collect(roots, set(LEAVES.by_marker)) if n in LEAVES.by_marker}
    if not markers:
        raise RuntimeError(
            "backward: this tensor does not depend on any tensor with requires_grad_() "
            "(or its graph was already freed)"
        )
    grads = backward_pass([(self, gradient)], markers, depth=vmap_depth())
    for node, g in grads.items():
        leaf = LEAVES.by_marker[node]()
        if leaf is not None:
            prev = getattr(leaf, "_grad", None)
            leaf._grad = g if prev is None else prev + g

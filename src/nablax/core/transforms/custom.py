"""``nx.custom_vjp``: a function with a user-defined backward pass.

Called with no live differentiation trace on its arguments, the function runs as written. Under a
trace, ``fwd`` runs on the arguments and its outputs are routed through one multi-output
``custom_vjp_call`` node whose inputs are the (traced) arguments: the backward pass therefore skips
``fwd``'s internals and calls the user's ``bwd`` instead.

Levels, as in JAX: the call belongs to the innermost live trace of its arguments. While ``fwd``
runs for that trace, a call of the same function at that trace is its primal function (``fwd``
may call ``f`` itself, the pattern of JAX's documentation), while an enclosing trace still sees
a custom call there (second order differentiates ``fwd``'s residuals and ``bwd`` with the same
rule, as ``jax.grad(jax.grad(f))`` does).

The per-call data (``bwd``, residuals, structures) travels in an :class:`~.trace.Opaque`
parameter, which never changes the structure key, so repeated calls reuse the compiled program;
backward plans never replay such a node, so ``bwd`` (user code) runs on every backward pass.
Keyword arguments and defaults are bound to positions first, as ``jax.custom_vjp`` does.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from ... import tree as _tree
from ..build import bind
from ..context import CTX
from ..graph import _self_alive
from ..ops.creation import zeros_like
from ..ops.elementwise import stop_gradient
from ..primitive import primitive
from ..prims import _shard
from ..prims._batch import batched_by_vmap
from ..tensor import Tensor
from .trace import Opaque
from .vjp import _fname


class _Record:
    """What the backward rule of one custom_vjp call needs."""

    out_def: Any  # treedef of fwd's output, set once the call is traced

    def __init__(self, fn, res, arg_paths, tensor_pos, n_leaves, arg_treedefs, nondiff) -> None:
        self.fn = fn
        self.res = res
        self.arg_paths = arg_paths  # path string per tensor input
        self.tensor_pos = tensor_pos  # (arg index, leaf index) per tensor input
        self.n_leaves = n_leaves  # leaves per differentiable positional argument
        self.arg_treedefs = arg_treedefs
        self.nondiff = nondiff  # values of nondiff_argnums, passed first to bwd


def _live(trace):
    """``trace`` or its nearest enclosing trace that is still running (None: none is)."""
    while trace is not None and not _self_alive(trace):
        trace = trace.parent
    return trace


def _traced(t: Tensor) -> bool:
    """Whether ``t`` is recorded by a live differentiation trace (kernel calls ask this too)."""
    src = t._impl.src
    return src is not None and _live(src[0].trace) is not None


def _call_trace(leaves):
    """The innermost live differentiation trace the tensor arguments are recorded in."""
    best = None
    for x in leaves:
        if isinstance(x, Tensor) and x._impl.src is not None:
            t = _live(x._impl.src[0].trace)
            if t is not None and (best is None or t.level > best.level):
                best = t
    return best


def _positional(fn, args: tuple, kwargs: dict) -> tuple:
    """The arguments with keywords and defaults bound to their positions, as ``jax.custom_vjp``
    does: a tensor passed by keyword is differentiated like any other, and ``fwd``/``bwd`` see
    (and ``bwd`` returns a cotangent for) every positional parameter."""
    try:
        sig = inspect.signature(fn.fun)
    except (TypeError, ValueError):  # no signature (a builtin): positional arguments as given
        if kwargs:
            raise TypeError(
                f"nx.custom_vjp: {_fname(fn.fun)} has no inspectable signature, so its keyword "
                f"arguments cannot be bound to positions. Fix: pass them positionally"
            ) from None
        return args
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as e:
        raise TypeError(f"nx.custom_vjp: bad arguments for {_fname(fn.fun)}: {e}") from None
    bound.apply_defaults()
    if bound.kwargs:
        raise TypeError(
            f"nx.custom_vjp: keyword argument(s) {sorted(bound.kwargs)} of {_fname(fn.fun)} have "
            f"no position (keyword-only or **kwargs), but fwd and bwd take positional arguments "
            f"only. Fix: make them positional parameters, or close over them"
        )
    return tuple(bound.args)


class custom_vjp:
    """Define a function's gradient by hand, as ``jax.custom_vjp``.

    >>> import nablax as nx
    >>> @nx.custom_vjp
    ... def clip_grad(x):
    ...     return x
    >>> def fwd(x):
    ...     return x, None
    >>> def bwd(res, g):
    ...     return (nx.clip(g, -1.0, 1.0),)
    >>> clip_grad.defvjp(fwd, bwd)
    >>> nx.grad(lambda x: (clip_grad(x) * 5.0).sum())(nx.ones(2)).tolist()
    [1.0, 1.0]

    ``fwd`` may call the function itself (there it is the primal function):

    >>> @nx.custom_vjp
    ... def f(x):
    ...     return nx.sin(x)
    >>> def f_fwd(x):
    ...     return f(x), nx.cos(x)
    >>> def f_bwd(cos_x, g):
    ...     return (2.0 * cos_x * g,)
    >>> f.defvjp(f_fwd, f_bwd)
    >>> round(nx.grad(f)(nx.tensor(0.0)).item(), 4)
    2.0
    """

    def __init__(self, fun: Callable, nondiff_argnums: tuple[int, ...] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        """``fwd(*args) -> (out, residuals)`` (``fwd`` may call this function: there it is the
        primal function); ``bwd(*nondiff_args, residuals, out_cotangent)`` returns a tuple with one
        cotangent (pytree or None) per differentiable positional argument."""
        self.fwd = fwd
        self.bwd = bwd

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any):
        trace = _call_trace(_tree.leaves((args, kwargs)))
        running = [t for fn, t in CTX.custom_fwd if fn is self]
        while trace is not None and any(t is trace for t in running):
            trace = _live(trace.parent)  # our own fwd for that trace: the primal function there
        if trace is None:
            return self.fun(*args, **kwargs)
        if self.fwd is None or self.bwd is None:
            raise TypeError(
                f"nx.custom_vjp: {_fname(self.fun)} is differentiated but has no rule; call "
                f"{_fname(self.fun)}.defvjp(fwd, bwd) first"
            )
        return self._call_traced(_positional(self, args, kwargs), trace)

    def _call_traced(self, args: tuple, trace):
        inputs, paths, positions, n_leaves, treedefs = [], [], [], [], []
        for i, a in enumerate(args):
            if i in self.nondiff_argnums:
                continue
            leaves, treedef = _tree.flatten(a)
            treedefs.append(treedef)
            n_leaves.append(len(leaves))
            for k, (path, leaf) in enumerate(_tree.leaves_with_path(a, prefix=f"args[{i}]")):
                if isinstance(leaf, Tensor):
                    inputs.append(leaf._impl)
                    paths.append(path)
                    positions.append((len(treedefs) - 1, k))
        # fwd sees the arguments as they are: its residuals stay connected to enclosing traces
        # (second order); the custom node sends no cotangent into fwd's internals
        stack = CTX.custom_fwd
        stack.append((self, trace))
        assert self.fwd is not None  # checked by __call__
        try:
            result = self.fwd(*args)
        finally:
            stack.pop()
        if not (isinstance(result, (tuple, list)) and len(result) == 2):
            raise TypeError(
                f"nx.custom_vjp: fwd of {_fname(self.fun)} must return (output, residuals), "
                f"got {type(result).__name__}"
            )
        out, res = result
        out_leaves, out_def = _tree.flatten(out)
        for path, o in _tree.leaves_with_path(out, prefix="output"):
            if not isinstance(o, Tensor):
                raise TypeError(
                    f"nx.custom_vjp: fwd of {_fname(self.fun)} returned a {type(o).__name__} at "
                    f"{path}; outputs must be tensors"
                )
        outs = [stop_gradient(o)._impl for o in out_leaves]
        nondiff = tuple(args[i] for i in self.nondiff_argnums)
        rec = _Record(self, res, paths, positions, n_leaves, treedefs, nondiff)
        rec.out_def = out_def
        impls = bind(custom_vjp_call_p, inputs + outs, (len(inputs), len(outs), Opaque(rec)))
        return _tree.unflatten(out_def, [Tensor._wrap(i) for i in impls])


def _custom_vjp_rule(params, cts, primals, outs):
    n_in, n_out, opaque = params
    rec = opaque.obj
    fn = rec.fn
    name = _fname(fn.fun)
    out_cts = [c if c is not None else zeros_like(o) for c, o in zip(cts, outs[:n_out])]
    got = fn.bwd(*rec.nondiff, rec.res, _tree.unflatten(rec.out_def, out_cts))
    n_args = len(rec.n_leaves)
    if not isinstance(got, (tuple, list)) or len(got) != n_args:
        count = len(got) if isinstance(got, (tuple, list)) else f"a {type(got).__name__}, not 1"
        raise TypeError(
            f"nx.custom_vjp: bwd of {name} returned {count} cotangent(s); expected a tuple of "
            f"{n_args} (one per differentiable positional argument of {name})"
        )
    per_arg = []
    for i, (g, treedef, n) in enumerate(zip(got, rec.arg_treedefs, rec.n_leaves)):
        if g is None:
            per_arg.append([None] * n)
            continue
        leaves, gdef = _tree.flatten(g)
        if gdef != treedef:
            raise TypeError(
                f"nx.custom_vjp: bwd of {name} returned a cotangent for argument {i} with "
                f"structure {gdef}; the argument has structure {treedef}"
            )
        per_arg.append(leaves)
    result = []
    for (a, k), path, primal in zip(rec.tensor_pos, rec.arg_paths, primals[:n_in]):
        g = per_arg[a][k]
        if g is not None:
            g = g if isinstance(g, Tensor) else Tensor(g, primal.dtype)
            if g.shape != primal.shape:
                raise ValueError(
                    f"nx.custom_vjp: bwd of {name} returned a cotangent of shape {g.shape} for "
                    f"{path}, which has shape {primal.shape}"
                )
            if g.dtype != primal.dtype:
                g = g.astype(primal.dtype)
        result.append(g)
    return result + [None] * n_out


def _custom_jvp_rule(params, tangents, primals, outs):
    raise TypeError(
        f"nx.jvp: can't apply forward-mode autodiff to the custom_vjp function "
        f"{_fname(params[2].obj.fn.fun)}; use reverse mode (nx.grad / nx.vjp)"
    )


custom_vjp_call_p = primitive(
    "custom_vjp_call",
    lambda params, *avals: tuple(avals[params[0] :]),
    lambda params, *xs: tuple(xs[params[0] :]),
    jvp=_custom_jvp_rule,
    vjp=_custom_vjp_rule,
    # batched through jax.vmap of the lowering; no useful layout to propose: replicated (correct)
    rules=batched_by_vmap,
    shard=_shard.replicated,
    multiple_results=True,
    doc="Outputs of a custom_vjp function (inputs: its traced arguments, then its outputs).",
)

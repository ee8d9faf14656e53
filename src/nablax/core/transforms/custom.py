"""``nx.custom_vjp``: a function with a user-defined backward pass.

Called with no live differentiation trace on its arguments, the function runs as written. Under a
trace, ``fwd`` runs on detached arguments and its outputs are routed through one multi-output
``custom_vjp_call`` node whose inputs are the (traced) arguments: the backward pass therefore skips
``fwd``'s internals and calls the user's ``bwd`` instead. The per-call data (``bwd``, residuals,
structures) travels in an :class:`~.trace.Opaque` parameter, which never changes the structure key,
so repeated calls reuse the compiled program.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ... import tree as _tree
from ..graph import split_ref
from ..primitive import primitive
from ..tensor import Tensor, bind
from .trace import Opaque
from .vjp import _fname

custom_vjp_call_p = primitive(
    "custom_vjp_call",
    lambda params, *avals: tuple(avals[params[0] :]),
    lambda params, *xs: tuple(xs[params[0] :]),
    multiple_results=True,
    doc="Outputs of a custom_vjp function (inputs: its traced arguments, then its outputs).",
)


class _Record:
    """What the backward rule of one custom_vjp call needs."""

    def __init__(self, fn, res, arg_paths, tensor_pos, n_leaves, arg_treedefs, nondiff) -> None:
        self.fn = fn
        self.res = res
        self.arg_paths = arg_paths  # path string per tensor input
        self.tensor_pos = tensor_pos  # (arg index, leaf index) per tensor input
        self.n_leaves = n_leaves  # leaves per differentiable positional argument
        self.arg_treedefs = arg_treedefs
        self.nondiff = nondiff  # values of nondiff_argnums, passed first to bwd


def _traced(t: Tensor) -> bool:
    src = t._impl.src
    if src is None:
        return False
    n = split_ref(src)[0]
    return n.trace is not None and n.trace.alive()


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
    """

    def __init__(self, fun: Callable, nondiff_argnums: tuple[int, ...] = ()) -> None:
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.nondiff_argnums = tuple(nondiff_argnums)
        self.fwd: Callable | None = None
        self.bwd: Callable | None = None

    def defvjp(self, fwd: Callable, bwd: Callable) -> None:
        """``fwd(*args) -> (out, residuals)``; ``bwd(*nondiff_args, residuals, out_cotangent)``
        returns a tuple with one cotangent (pytree or None) per differentiable positional argument."""
        self.fwd = fwd
        self.bwd = bwd

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def __call__(self, *args: Any, **kwargs: Any):
        leaves = _tree.leaves(args)
        if not any(isinstance(x, Tensor) and _traced(x) for x in leaves):
            return self.fun(*args, **kwargs)
        if self.fwd is None or self.bwd is None:
            raise TypeError(
                f"nx.custom_vjp: {_fname(self.fun)} is differentiated but has no rule; call "
                f"{_fname(self.fun)}.defvjp(fwd, bwd) first"
            )
        return self._call_traced(args, kwargs)

    def _call_traced(self, args, kwargs):
        from ..ops.elementwise import stop_gradient

        inputs, paths, positions, n_leaves, treedefs, detached_args = [], [], [], [], [], []
        for i, a in enumerate(args):
            if i in self.nondiff_argnums:
                detached_args.append(a)
                continue
            leaves, treedef = _tree.flatten(a)
            treedefs.append(treedef)
            n_leaves.append(len(leaves))
            with_paths = _tree.leaves_with_path(a, prefix=f"args[{i}]")
            det = []
            for k, ((path, leaf), _) in enumerate(zip(with_paths, leaves)):
                if isinstance(leaf, Tensor):
                    inputs.append(leaf._impl)
                    paths.append(path)
                    positions.append((len(treedefs) - 1, k))
                # fwd sees the arguments as they are: its residuals stay connected to enclosing
                # traces (second order); the custom node sends no cotangent into fwd's internals
                det.append(leaf)
            detached_args.append(_tree.unflatten(treedef, det))
        result = self.fwd(*detached_args, **kwargs)
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
    from ..ops.creation import zeros_like

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


custom_vjp_call_p.vjp = _custom_vjp_rule
custom_vjp_call_p.jvp = _custom_jvp_rule


def _install_vmap_and_shard_rules() -> None:
    # batched through jax.vmap of the lowering; no useful layout to propose: replicated (correct)
    from ..ops import _shard
    from ..ops._batch import vmap_rule

    for p in (custom_vjp_call_p,):
        p.batch = vmap_rule(p)
        p.shard = _shard.replicated


_install_vmap_and_shard_rules()

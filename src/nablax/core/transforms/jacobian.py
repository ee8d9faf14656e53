"""``nx.jacrev``, ``nx.jacfwd`` and ``nx.hessian``.

Built from :func:`~.vjp.vjp` (one cotangent basis vector per output element) and
:func:`~.jvp.jvp` (one tangent basis vector per input element). Results have JAX's layout: for an
output of shape ``O`` and an input of shape ``I`` the Jacobian has shape ``O + I``; pytree outputs
and ``argnums`` tuples nest as in JAX (output structure outside, argument structure inside).

Note: the basis vectors are processed in a Python loop; issue #4 (vmap) batches them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ... import tree as _tree
from ..tensor import Tensor
from .jvp import jvp
from .vjp import _norm_argnums, _split_aux, vjp


def _basis(shape, dtype, k: int) -> Tensor:
    from ..ops.creation import zeros

    size = 1
    for d in shape:
        size *= d
    flat = zeros((size,), dtype)
    flat = flat.at[k].set(1.0)
    return flat.reshape(shape)


def _stack_rows(rows, out_shape, in_shape) -> Tensor:
    from ..ops.creation import zeros
    from ..ops.shape import stack

    if not rows:
        return zeros(tuple(out_shape) + tuple(in_shape))
    return stack(rows).reshape(tuple(out_shape) + tuple(in_shape))


def _restrict(f, args, nums):
    def g(*diff):
        a = list(args)
        for i, v in zip(nums, diff):
            a[i] = v
        return f(*a)

    return g


def jacrev(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """Jacobian of ``f`` by reverse mode, as ``jax.jacrev``.

    >>> import nablax as nx
    >>> nx.jacrev(lambda x: x * x)(nx.tensor([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    """

    @functools.wraps(f)
    def wrapped(*args):
        nums, single = _norm_argnums(argnums)
        g = _restrict(f, args, nums)
        res = vjp(g, *[args[i] for i in nums], has_aux=has_aux)
        out, f_vjp = res[0], res[1]
        aux = res[2] if has_aux else None
        out_leaves, out_def = _tree.flatten(out)
        per_out = []
        for oi, o in enumerate(out_leaves):
            rows = []  # one tuple of per-argument cotangent pytrees per element of o
            for k in range(o.size):
                cts = [
                    _basis(o.shape, o.dtype, k) if j == oi else _zeros_like(p)
                    for j, p in enumerate(out_leaves)
                ]
                rows.append(f_vjp(_tree.unflatten(out_def, cts)))
            per_arg = []
            for ai, i in enumerate(nums):
                arg = args[i]
                leaves, adef = _tree.flatten(arg)
                jl = []
                for li, leaf in enumerate(leaves):
                    in_shape = getattr(leaf, "shape", ())
                    col = [_tree.leaves(r[ai])[li] for r in rows]
                    jl.append(_stack_rows(col, o.shape, in_shape))
                per_arg.append(_tree.unflatten(adef, jl))
            per_out.append(per_arg[0] if single else tuple(per_arg))
        jac = _tree.unflatten(out_def, per_out)
        return (jac, aux) if has_aux else jac

    return wrapped


def _zeros_like(t):
    from ..ops.creation import zeros_like

    return zeros_like(t)


def jacfwd(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """Jacobian of ``f`` by forward mode, as ``jax.jacfwd``.

    >>> import nablax as nx
    >>> nx.jacfwd(lambda x: x * x)(nx.tensor([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    """

    @functools.wraps(f)
    def wrapped(*args):
        from ..ops.shape import stack

        nums, single = _norm_argnums(argnums)
        diff = [args[i] for i in nums]
        diff = [_tree.map(lambda x: x if isinstance(x, Tensor) else Tensor(x), d) for d in diff]
        g = _restrict(f, args, nums)
        aux_box = []

        def g_out(*d):
            out = g(*d)
            out, aux = _split_aux("jacfwd", f, out, has_aux)
            aux_box.append(aux)
            return out

        flat_in, in_def = _tree.flatten(tuple(diff))
        cols_per_leaf = []  # for each input leaf: list of output tangent pytrees, one per element
        out_struct = None
        for li, leaf in enumerate(flat_in):
            cols = []
            for k in range(leaf.size):
                tangents = [
                    _basis(leaf.shape, leaf.dtype, k) if j == li else _zeros_like(x)
                    for j, x in enumerate(flat_in)
                ]
                out, t = jvp(g_out, tuple(diff), _tree.unflatten(in_def, tangents))
                out_struct = out
                cols.append(t)
            cols_per_leaf.append(cols)
        if out_struct is None:
            out_struct = g_out(*diff)
        out_leaves, out_def = _tree.flatten(out_struct)
        per_out = []
        for oi, o in enumerate(out_leaves):
            jl = []
            for li, leaf in enumerate(flat_in):
                cols = [_tree.leaves(c)[oi] for c in cols_per_leaf[li]]
                if cols:
                    j = stack(cols, axis=-1).reshape(tuple(o.shape) + tuple(leaf.shape))
                else:
                    j = _stack_rows([], o.shape, leaf.shape)
                jl.append(j)
            per_arg = _tree.unflatten(in_def, jl)
            per_out.append(per_arg[0] if single else tuple(per_arg))
        jac = _tree.unflatten(out_def, per_out)
        return (jac, aux_box[-1]) if has_aux else jac

    return wrapped


def hessian(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """Hessian of a scalar ``f``: ``jacfwd(jacrev(f))``, as ``jax.hessian``.

    >>> import nablax as nx
    >>> nx.hessian(lambda x: (x ** 3).sum())(nx.tensor([1.0, 2.0])).tolist()
    [[6.0, 0.0], [0.0, 12.0]]
    """
    return jacfwd(jacrev(f, argnums, has_aux), argnums, has_aux)

"""``nx.jacrev``, ``nx.jacfwd`` and ``nx.hessian``, built on ``nx.vmap``.

``jacrev`` pulls back the whole identity basis of each output at once: ``vmap`` of the ``vjp``
function over the basis vectors. ``jacfwd`` pushes forward the identity basis of each input:
``vmap`` of ``jvp`` over the basis tangents. Results have JAX's layout: for an output of shape
``O`` and an input of shape ``I`` the Jacobian has shape ``O + I``; pytree outputs and ``argnums``
tuples nest as in JAX (output structure outside, argument structure inside).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from ... import tree as _tree
from ..ops.creation import eye, zeros_like
from ..ops.shape import moveaxis
from ..tensor import Tensor
from .jvp import jvp
from .vjp import _norm_argnums, _split_aux, vjp
from .vmap import vmap


def _eye(shape, dtype) -> Tensor:
    """The identity basis of a tensor of ``shape``: shape ``(size,) + shape``."""
    size = 1
    for d in shape:
        size *= d
    return eye(size, dtype=dtype).reshape((size,) + tuple(shape))


def _zeros_like(t):
    return zeros_like(t)


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

            def pull(basis_vector, oi=oi):
                cts = [
                    basis_vector if j == oi else _zeros_like(p) for j, p in enumerate(out_leaves)
                ]
                return f_vjp(_tree.unflatten(out_def, cts))

            rows = vmap(pull)(_eye(o.shape, o.dtype))  # per argnum: pytree, leading axis o.size
            per_arg = []
            for ai, i in enumerate(nums):
                leaves, adef = _tree.flatten(rows[ai])
                orig = _tree.leaves(args[i])
                jl = [
                    r.reshape(tuple(o.shape) + tuple(getattr(a, "shape", ())))
                    for r, a in zip(leaves, orig)
                ]
                per_arg.append(_tree.unflatten(adef, jl))
            per_out.append(per_arg[0] if single else tuple(per_arg))
        jac = _tree.unflatten(out_def, per_out)
        return (jac, aux) if has_aux else jac

    return wrapped


def jacfwd(f: Callable, argnums=0, has_aux: bool = False) -> Callable:
    """Jacobian of ``f`` by forward mode, as ``jax.jacfwd``.

    >>> import nablax as nx
    >>> nx.jacfwd(lambda x: x * x)(nx.tensor([1.0, 2.0])).tolist()
    [[2.0, 0.0], [0.0, 4.0]]
    """

    @functools.wraps(f)
    def wrapped(*args):
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
        cols_per_leaf = []  # per input leaf: output tangent pytree with a leading basis axis
        for li, leaf in enumerate(flat_in):

            def push(basis_vector, li=li):
                tangents = [
                    basis_vector if j == li else _zeros_like(x) for j, x in enumerate(flat_in)
                ]
                return jvp(g_out, tuple(diff), _tree.unflatten(in_def, tangents))[1]

            cols_per_leaf.append(vmap(push)(_eye(leaf.shape, leaf.dtype)))
        out_struct = g_out(*diff)
        out_leaves, out_def = _tree.flatten(out_struct)
        per_out = []
        for oi, o in enumerate(out_leaves):
            jl = []
            for li, leaf in enumerate(flat_in):
                col = _tree.leaves(cols_per_leaf[li])[oi]  # (leaf.size,) + o.shape
                j = moveaxis(col, 0, -1) if o.ndim else col
                jl.append(j.reshape(tuple(o.shape) + tuple(leaf.shape)))
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

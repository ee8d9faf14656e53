"""Residuals of a control-flow node, so that its backward pass does not run the loop forward again.

The derivative rules of a control-flow node are JAX's derivatives of its ``jax.lax`` lowering. A
plain ``jax.vjp`` of the lowering inside the backward node would compute the whole loop forward a
second time (the forward node's intermediates are not visible to it): ``value_and_grad`` of a
1000-step RNN would cost two forward passes and one backward pass instead of one and one.

So a ``scan`` or ``cond`` node built on tensors under a live differentiation trace lowers to the
forward half of ``jax.vjp`` instead: it returns its outputs *and* the residuals JAX's linearization
keeps (the leaves of the ``vjp`` function, a pytree), as extra outputs of the same node. The
backward rule binds one ``cf_pullback`` node on those residuals and the cotangents, which rebuilds
the ``vjp`` function from the leaves and applies it. Residual outputs nobody reads (a plain forward
pass, forward mode) are dead code that XLA removes.

The residuals' avals and pytree structure are found once per node structure with
``jax.eval_shape`` (cached: the structure is a deterministic function of the node's parameters
and input avals, which are the cache key). The pullback node has JAX-derived rules as well, so
second-order derivatives differentiate through it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .... import _caches
from ....errors import NablaxError
from ...ops.creation import zeros_like
from ...primitive import primitive
from ...prims._rules import cast_like, derived_from_jax, is_float_tensor
from .stage import add_node

# (primitive, parameters, input avals, differentiated inputs) -> Residuals
_cache = _caches.Cache("control_flow.residuals", 256)


class Residuals:
    """The residual outputs of one node structure: which inputs are differentiated, the
    residuals' avals (the node's extra outputs) and the ``vjp`` function's pytree structure.
    Equal by ``(diff_in, avals, n_out)``: the structure follows from the node's other parameters,
    which are part of every key the node is in."""

    __slots__ = ("diff_in", "in_dtypes", "avals", "n_out", "out_float", "treedef", "_key", "_hash")

    def __init__(self, diff_in, in_dtypes, avals, n_out, out_float, treedef) -> None:
        self.diff_in, self.in_dtypes, self.avals, self.n_out = diff_in, in_dtypes, avals, n_out
        self.out_float, self.treedef = out_float, treedef
        self._key = (diff_in, in_dtypes, avals, n_out, out_float)
        self._hash = hash(self._key)

    def __eq__(self, other) -> bool:
        return type(other) is Residuals and other._key == self._key

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Residuals({len(self.avals)} arrays)"


def _forward(lower, params, xs, dtypes, diff_in):
    """``(outputs, vjp function)`` of ``lower`` with respect to the inputs ``diff_in``. JAX's
    choice of residuals depends on which values are constants (a scalar the enclosing program
    baked in) and which are the same object (one value read twice); an optimization barrier makes
    every input a distinct traced value, so the residuals depend only on the inputs' avals, as
    :func:`residuals_for` assumes."""
    xs = [v if isinstance(v, jax.Array) else jnp.asarray(v, d) for v, d in zip(xs, dtypes)]
    # one barrier per input: a joint one would tie their tangents (a constant's symbolic zero
    # would become a real zero under an enclosing jax.jvp: NaN through pow's exponent rule)
    xs = [lax.optimization_barrier(v) for v in xs]

    def f(*d):
        full = list(xs)
        for i, v in zip(diff_in, d):
            full[i] = v
        return tuple(lower(params, *full))

    return jax.vjp(f, *[xs[i] for i in diff_in])


def with_residuals(lower):
    """The lowering of a node whose last parameter is a :class:`Residuals` or None: with one,
    the outputs are followed by the residual arrays."""

    def lowering(params, *xs):
        res = params[-1]
        if res is None:
            return lower(params, *xs)
        outs, pull = _forward(lower, params, xs, res.in_dtypes, res.diff_in)
        leaves = jax.tree_util.tree_leaves(pull)
        got = tuple((tuple(v.shape), np.dtype(v.dtype)) for v in leaves)
        if got != res.avals:  # never expected: the backward node would misread them
            raise NablaxError(
                f"nablax internal error: the residuals of a control-flow node changed between "
                f"its staging and its lowering ({len(got)} vs {len(res.avals)} arrays). Please "
                f"report it; nx.config.backward_plans does not affect it"
            )
        return tuple(outs) + tuple(leaves)

    return lowering


def residuals_for(prim, params: tuple, in_avals: list, constant: list) -> Residuals | None:
    """The :class:`Residuals` a node of ``prim`` with ``params`` (last one None) and logical
    input avals needs, or None when no input is differentiable (floating point, and not a
    ``constant``: the Python numbers of its bodies, which have no derivative)."""
    diff_in = tuple(
        i for i, ((_, d), c) in enumerate(zip(in_avals, constant)) if _is_float(d) and not c
    )
    if not diff_in:
        return None
    key = (prim.name, params, tuple(in_avals), diff_in)
    hit = _cache.get(key)
    if hit is not None:
        return hit
    structs = [jax.ShapeDtypeStruct(tuple(s), np.dtype(d)) for s, d in in_avals]
    box: list = []

    in_dtypes = tuple(np.dtype(d) for _, d in in_avals)

    def probe(*xs):
        outs, pull = _forward(prim.lower, params, xs, in_dtypes, diff_in)
        leaves, treedef = jax.tree_util.tree_flatten(pull)
        box.append(treedef)
        return outs, leaves

    outs, leaves = jax.eval_shape(probe, *structs)
    avals = tuple((tuple(v.shape), np.dtype(v.dtype)) for v in leaves)
    out_float = tuple(_is_float(o.dtype) for o in outs)
    res = Residuals(diff_in, in_dtypes, avals, len(outs), out_float, box[0])
    _cache.put(key, res)
    return res


def _is_float(dtype) -> bool:
    return np.dtype(dtype).kind in "fc" or np.dtype(dtype) == jax.numpy.bfloat16


# ---- the backward node ---------------------------------------------------------------------------


def _pull_lower(params, *xs):
    res, out_avals, _ = params
    n_res = len(res.avals)
    pull = jax.tree_util.tree_unflatten(res.treedef, list(xs[:n_res]))
    given = iter(xs[n_res:])
    cts = tuple(
        next(given) if fl else np.zeros(shape, jax.dtypes.float0)
        for fl, (shape, _) in zip(res.out_float, out_avals)
    )
    return tuple(pull(cts))


cf_pullback_p = primitive(
    "cf_pullback",
    lambda params, *avals: tuple(params[2]),
    _pull_lower,
    rules=derived_from_jax,
    multiple_results=True,
    doc="The backward pass of a control-flow node from its residuals: residuals, then the "
    "cotangents of its floating-point outputs.",
)


def vjp_from_residuals(params, cts, primals, outs) -> list | None:
    """The vjp rule of a node built with residuals (``params[-1]``); None when cotangents reach
    the residuals themselves (a second-order pass through the ``cf_pullback`` node), which the
    caller then differentiates with JAX's derivative of the whole lowering."""
    res = params[-1]
    n_out = res.n_out
    if any(c is not None for c in cts[n_out:]):
        return None
    result = [None] * len(primals)
    if all(c is None for c in cts[:n_out]):
        return result
    refs, bshapes = [], []
    for t in list(outs)[n_out:]:
        refs.append(t._impl.ref)
        bshapes.append(t._impl.batch_shape)
    out_avals = []
    for j in range(n_out):
        o = outs[j]
        out_avals.append((o.shape, o.dtype))
        if not res.out_float[j]:
            continue
        c = cts[j]
        c = cast_like(c, o) if c is not None else zeros_like(o)
        refs.append(c._impl.ref)
        bshapes.append(c._impl.batch_shape)
    avals = tuple((primals[i].shape, primals[i].dtype) for i in res.diff_in)
    grads = add_node(cf_pullback_p, (res, tuple(out_avals), avals), refs, bshapes, avals)
    for i, g in zip(res.diff_in, grads):
        if is_float_tensor(primals[i]):
            result[i] = g
    return result

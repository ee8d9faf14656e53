"""Kernel calls on nablax Tensors: one ``kernel_call`` node in the lazy graph.

The kernel layer (``nablax.kernels``) sits below core and never imports it: this module registers
:func:`call_on_tensors` with the kernel executor, which hands it every call that has Tensor
arguments.

The node's parameter is the call's :class:`~._call.CallSpec` (kernel, config, structure), so the
realization cache keys on it and repeated calls reuse the compiled program. Under a
differentiation trace the node also outputs the kernel's residuals (``fwd_with_residuals``), and
its VJP rule adds one node that lowers to the kernel's ``vjp``; that node's own derivatives (second
order) and the forward node's JVP come from JAX's derivative of their lowerings. Differentiating
the backward node also gives the residuals cotangents (attention's logsumexp depends on ``q`` and
``k``), which the kernel's ``vjp`` does not take: then the forward node's VJP is JAX's derivative
of its whole lowering, residuals included.
"""

from __future__ import annotations

import jax

from ... import _caches
from ...kernels import executor as _executor
from ...kernels._call import CallSpec
from ..build import bind, bind_known
from ..primitive import Primitive, derived, primitive
from ..prims import _rules
from ..tensor import Tensor, to_impl
from ..transforms.custom import _traced
from .creation import zeros_like

# (spec, with_res, in_avals) / ("res", spec, in_avals) -> traced output structure; bounded like
# the executor's memo. A plain dict read on the hot path: an entry costs an abstract trace to
# remake, but a program calls a few signatures, far below the bound
_avals = _caches.DictCache("ops.kernel_call_structures", 4096)


def _flat_call(spec: CallSpec, with_res: bool):
    """The node's lowering as a function of the array leaves, returning a flat tuple."""

    def f(*arrays):
        if with_res:
            y, res = spec.with_residuals(*arrays)
            return tuple(jax.tree_util.tree_leaves(y)) + tuple(jax.tree_util.tree_leaves(res))
        return tuple(jax.tree_util.tree_leaves(spec.plain(*arrays)))

    return f


def _structure(spec: CallSpec, with_res: bool, in_avals: tuple):
    """(flat output avals, output treedef, output count, whether the output is one array) of a
    call; traced once per signature."""
    key = (spec, with_res, in_avals)
    hit = _avals.data.get(key)
    if hit is not None:
        return hit
    structs = [jax.ShapeDtypeStruct(s, d) for s, d in in_avals]
    y_struct = jax.eval_shape(spec.plain, *structs)
    leaves, treedef = jax.tree_util.tree_flatten(y_struct)
    flat = jax.eval_shape(_flat_call(spec, with_res), *structs)
    single = jax.tree_util.treedef_is_leaf(treedef)
    out = (tuple((tuple(o.shape), o.dtype) for o in flat), treedef, len(leaves), single)
    _avals.put(key, out)
    return out


def _abstract(params, *avals):
    spec, with_res = params
    return _structure(spec, with_res, tuple((tuple(s), d) for s, d in avals))[0]


def _lower(params, *xs):
    spec, with_res = params
    return _flat_call(spec, with_res)(*xs)


def _vjp_prim(n_arrays: int, n_res: int, n_out: int) -> Primitive:
    """The backward node: inputs (arrays, residuals, outputs, output cotangents)."""
    key = ("kernel_vjp", n_arrays, n_res, n_out)
    return derived(key, lambda: _make_vjp_prim(n_arrays, n_res, n_out))


def _make_vjp_prim(n_arrays: int, n_res: int, n_out: int) -> Primitive:
    def aval(params, *avals):
        return tuple(avals[:n_arrays])

    def lower(params, *xs):
        spec, res_def, y_def = params
        arrays = xs[:n_arrays]
        res = jax.tree_util.tree_unflatten(res_def, xs[n_arrays : n_arrays + n_res])
        y = jax.tree_util.tree_unflatten(y_def, xs[n_arrays + n_res : n_arrays + n_res + n_out])
        dy = jax.tree_util.tree_unflatten(y_def, xs[n_arrays + n_res + n_out :])
        grads = spec.backward(arrays, res, y, dy)
        return tuple(
            g if g is not None else jax.numpy.zeros(a.shape, a.dtype) for g, a in zip(grads, arrays)
        )

    # second order: JAX's derivative of the kernel's vjp (batched by jax.vmap, replicated)
    return Primitive(
        f"kernel_vjp[{n_arrays},{n_res},{n_out}]",
        aval,
        lower,
        rules=_rules.derived_from_jax,
        multiple_results=True,
    )


def _res_treedef(spec: CallSpec, in_avals: tuple):
    """The residuals' pytree structure (traced once per signature, like ``_structure``)."""
    key = ("res", spec, in_avals)
    hit = _avals.data.get(key)
    if hit is None:
        structs = [jax.ShapeDtypeStruct(s, d) for s, d in in_avals]
        _, res = jax.eval_shape(spec.with_residuals, *structs)
        hit = jax.tree_util.tree_structure(res)
        _avals.put(key, hit)
    return hit


def _kernel_vjp_rule(params, cts, primals, outs):
    spec, with_res = params
    impls = [p._impl if isinstance(p, Tensor) else to_impl(p) for p in primals]
    in_avals = tuple((tuple(i.shape), i.dtype) for i in impls)
    _, y_def, n_out, _ = _structure(spec, with_res, in_avals)
    if with_res and any(c is not None for c in cts[n_out:]):
        # Second order: differentiating the backward node sends cotangents to the residuals
        # (attention's logsumexp) as well as to the outputs. The kernel's vjp takes only the
        # outputs' (dropping the others gave wrong second derivatives), so the whole node,
        # residuals included, goes through JAX's derivative of its forward lowering.
        return _derived_vjp(params, cts, primals, outs)
    if with_res:
        flat = list(outs)
    else:  # built outside a trace but differentiated anyway: recompute the residuals
        flat = [Tensor._wrap(i) for i in bind(kernel_call_p, impls, (spec, True))]
    y, res = flat[:n_out], flat[n_out:]
    dys = [c if c is not None else zeros_like(o) for c, o in zip(cts[:n_out], y)]
    res_def = _res_treedef(spec, in_avals)
    p = _vjp_prim(len(impls), len(res), n_out)
    ins = impls + [t._impl for t in res] + [t._impl for t in y] + [t._impl for t in dys]
    grads = bind(p, ins, (spec, res_def, y_def))
    return [Tensor._wrap(g) if _rules.is_float_tensor(x) else None for g, x in zip(grads, primals)]


kernel_call_p = primitive(
    "kernel_call",
    _abstract,
    _lower,
    vjp=_kernel_vjp_rule,
    # jvp through JAX's derivative of the kernel's run; batched through jax.vmap of the lowering;
    # no useful layout to propose: replicated
    rules=_rules.derived_from_jax,
    multiple_results=True,
    doc="A nablax.kernels Kernel run with a fixed config (outputs, then residuals when traced).",
)


def call_on_tensors(spec: CallSpec, leaves: list):
    """Add the kernel call to the lazy graph; returns the output pytree of Tensors."""
    arrays = []
    traced = False
    for i in spec.array_pos:
        x = leaves[i]
        if type(x) is Tensor:  # the common case: no call to convert it
            xi = x._impl
            arrays.append(xi)
            if not traced and xi.src is not None:
                traced = _traced(x)
            continue
        arrays.append(to_impl(x))
        if not traced and isinstance(x, Tensor):
            traced = _traced(x)
    in_avals = tuple([(tuple(i.shape), i.dtype) for i in arrays])
    hit = _avals.data.get((spec, traced, in_avals))  # a repeated call (every transformer block)
    avals, y_def, n_out, single = hit if hit is not None else _structure(spec, traced, in_avals)
    # the output avals are known (kernel_call_p's rule would look up the same _structure)
    impls = bind_known(kernel_call_p, arrays, (spec, traced), avals)
    if single:  # one array out (attention, matmul...): no tree to rebuild
        return Tensor._wrap(impls[0])
    return jax.tree_util.tree_unflatten(y_def, [Tensor._wrap(i) for i in impls[:n_out]])


def _differentiated(x) -> bool:
    """Whether ``x`` is a tensor inside a live differentiation (its node belongs to a trace)."""
    if type(x) is not Tensor:
        return False
    src = x._impl.src
    return src is not None and src[0].trace is not None


_derived_vjp = _rules.derived_from_jax(kernel_call_p)["vjp"]

_executor.register_tensor_type(Tensor, call_on_tensors, _differentiated)

"""``nx.shard_map``: run a function written for whole tensors partitioned over a device mesh.

A call ``nx.shard_map(f, mesh, in_specs, out_specs)(*args)`` is **one lazy graph node**, a
``shard_map_call``, as ``jax.shard_map`` is one primitive in a jaxpr:

1. ``f`` runs (on every call: eager means eager) on *placeholder* tensors standing for the
   argument leaves, each behind a marker of a private differentiation trace. Its ops record a
   sub-graph. Tensors that ``f`` reads without getting them as arguments (closures, values built
   outside) are cut out of the sub-graph and become inputs too (closure conversion), so the
   transforms around the call see them; Python scalars in the sub-graph are passed as runtime
   scalars, so a changing learning rate does not recompile.
2. The sub-graph becomes a :class:`Body`: hashable by its *structure* (primitives, parameters,
   wiring, shapes, dtypes, shardings; never values), so the realization cache recognizes the
   same program on the next call and does not compile again.
3. The node's inputs are the argument tensors, the captured tensors and the scalars; its
   lowering runs the sub-graph's lowerings between ``jax.lax.with_sharding_constraint`` calls:
   inputs laid out as ``in_specs`` says, outputs as the *plan* (``out_specs``, or the layouts
   nablax infers with the primitives' sharding rules, core/prims/_shard.py). Inside the enclosing
   ``jax.jit`` program XLA's SPMD partitioner does the rest, so results equal ``f``'s unsharded
   results, and ``.sharding`` of each output shows the plan.

Every transform sees an ordinary primitive with rules:

- **vjp**: a second ``shard_map_call`` whose body runs nablax's backward pass over ``f``'s own
  sub-graph (so ``nx.custom_vjp`` functions and kernel calls inside ``f`` use their own rules),
  recomputing the forward values it needs. Cotangents are constrained like their primals. That
  body has rules too, so ``grad(grad(...))`` works;
- **jvp**: likewise, a node running the forward-mode pass over the sub-graph;
- **vmap**: ``f`` is staged on placeholders with the arguments' batch axes, so the body is already
  batched; sharding constraints leave batch axes unsharded;
- **sharding**: the node's outputs have the plan's layouts;
- **compile**: tracing records the node like any other.

>>> import nablax as nx
>>> mesh = nx.DeviceMesh((1,), ("dp",))
>>> rows = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
>>> f = nx.shard_map(lambda x, w: (x @ w).sum(), mesh, in_specs={0: rows})
>>> nx.grad(f, argnums=1)(nx.ones((4, 3)), nx.ones((3, 2))).tolist()
[[4.0, 4.0], [4.0, 4.0], [4.0, 4.0]]
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import jax
import numpy as np

from ... import tree as _tree
from ...errors import GraphBreakError
from ..build import bind_known
from ..graph import Literal
from ..primitive import primitive
from ..prims._rules import cast_like, is_float_tensor
from ..sharding import DeviceMesh, ShardingSpec
from ..tensor import Tensor
from .jvp import forward_pass
from .subprogram import Body, Stage
from .trace import is_float, output_tensor
from .vjp import backward_pass

_NO_SUM = 1 << 30  # backward-pass depth: batch levels are summed at the node's boundary


def _abstract(params, *avals):
    return tuple(params[0].out_avals)


def _call(body: Body, refs: list, bds: list) -> list:
    """Add the node running ``body`` on ``refs`` (node-input references, one per body input,
    with ``bds`` batch axes each) to the graph; returns its output impls."""
    all_refs = tuple(refs) + tuple(Literal(v, d) for v, d in body.lits)
    all_bds = tuple(bds) + (0,) * len(body.lits)
    bdims = (all_bds, body.out_bshape) if any(all_bds) or body.out_bshape else None
    impls = bind_known(shard_map_call_p, all_refs, (body,), body.out_avals, bdims=bdims)
    for impl, spec in zip(impls, body.plan):
        impl.sharding = spec
    return impls


# ---- derivative rules ------------------------------------------------------------------------


def _outputs(body: Body) -> list:
    memo: dict = {}
    return [output_tensor(m, j, memo) for m, j in body.outs]


def _vjp(params, cts, primals, outs):
    body = params[0]
    nt = len(body.ins)
    res = [None] * len(primals)
    diff = [k for k in range(nt) if is_float_tensor(primals[k])]
    seeds = [j for j, c in enumerate(cts) if c is not None and is_float(body.out_avals[j][1])]
    if not diff or not seeds:
        return res
    cts = {j: cast_like(cts[j], outs[j]) for j in seeds}
    with Stage() as st:
        st.reuse(body.ins)
        fwd = _outputs(body)
        pairs = [
            (fwd[j], st.add(fwd[j].shape, fwd[j].dtype, cts[j]._impl.batch_shape, body.plan[j]))
            for j in seeds
        ]
        markers = dict.fromkeys(body.ins[k].marker for k in diff)
        grads = backward_pass(pairs, markers, None, _NO_SUM)
        got = [(k, grads[body.ins[k].marker]) for k in diff if body.ins[k].marker in grads]
        if not got:
            return res
        bwd = st.finish([g for _, g in got], body.mesh, [body.ins[k].spec for k, _ in got])
        captured = st.captured
    refs = [p._impl.ref for p in primals[:nt]] + [cts[j]._impl.ref for j in seeds] + captured
    for (k, _), impl in zip(got, _call(bwd, refs, [len(i.bshape) for i in bwd.ins])):
        res[k] = Tensor._wrap(impl)
    return res


def _jvp(params, tangents, primals, outs):
    body = params[0]
    nt = len(body.ins)
    res = [None] * len(body.outs)
    diff = [k for k in range(nt) if tangents[k] is not None and is_float_tensor(primals[k])]
    fouts = [j for j, (_, d) in enumerate(body.out_avals) if is_float(d)]
    if not diff or not fouts:
        return res
    tans = [cast_like(tangents[k], primals[k]) for k in diff]
    with Stage() as st:
        st.reuse(body.ins)
        tin = {}
        for k, t in zip(diff, tans):
            shape, dtype = body.ins[k].aval
            tin[body.ins[k].marker] = st.add(shape, dtype, t._impl.batch_shape, body.ins[k].spec)
        fwd = _outputs(body)
        touts = forward_pass([fwd[j] for j in fouts], tin)
        got = [(j, t) for j, t in zip(fouts, touts) if t is not None]
        if not got:
            return res
        jb = st.finish([t for _, t in got], body.mesh, [body.plan[j] for j, _ in got])
        captured = st.captured
    refs = [p._impl.ref for p in primals[:nt]] + [t._impl.ref for t in tans] + captured
    for (j, _), impl in zip(got, _call(jb, refs, [len(i.bshape) for i in jb.ins])):
        res[j] = Tensor._wrap(impl)
    return res


shard_map_call_p = primitive(
    "shard_map_call",
    _abstract,
    lambda params, *xs: params[0].run(xs),
    jvp=_jvp,
    vjp=_vjp,
    batch=lambda params, bds, *xs: params[0].run(xs),  # staged already batched
    shard=lambda params, lays, ins, outs: params[0].layouts(),
    multiple_results=True,
    doc="One nx.shard_map call: its staged sub-graph run under sharding constraints.",
)


# ---- the public transform --------------------------------------------------------------------

_KEEP = object()  # in_specs says nothing about the leaf: it keeps its own .sharding


def _fname(f) -> str:
    return getattr(f, "__qualname__", None) or getattr(f, "__name__", None) or repr(f)


def _spec_leaves(spec, tree, path: str, what: str, f) -> list:
    """Broadcast ``spec`` (a ShardingSpec, None, ``_KEEP`` or a tuple/list/dict prefix of
    ``tree``) over ``tree``'s leaves: ``[(path, leaf, spec), ...]``."""
    if spec is None or spec is _KEEP or isinstance(spec, ShardingSpec):
        return [(p, leaf, spec) for p, leaf in _tree.leaves_with_path(tree, prefix=path)]
    if isinstance(spec, (tuple, list)) and isinstance(tree, (tuple, list)):
        if len(spec) != len(tree):
            raise ValueError(
                f"nx.shard_map: {what} gives {len(spec)} entries for {path} of {_fname(f)}, "
                f"which has {len(tree)}. Fix: one entry per element, or one spec for all"
            )
        return [
            x
            for k, (s, t) in enumerate(zip(spec, tree))
            for x in _spec_leaves(s, t, f"{path}[{k}]", what, f)
        ]
    if isinstance(spec, dict) and isinstance(tree, dict):
        if set(spec) != set(tree):
            raise ValueError(
                f"nx.shard_map: {what} for {path} of {_fname(f)} has keys "
                f"{sorted(map(str, spec))}, the value has keys {sorted(map(str, tree))}"
            )
        return [
            x
            for k in sorted(tree)
            for x in _spec_leaves(spec[k], tree[k], f"{path}[{k!r}]", what, f)
        ]
    raise TypeError(
        f"nx.shard_map: {what} for {path} of {_fname(f)} must be a ShardingSpec, None, or a "
        f"tuple/list/dict matching its structure; got {type(spec).__name__} for a "
        f"{type(tree).__name__}"
    )


def _arg_entry(in_specs, k: int, f):
    if in_specs is None:
        return _KEEP
    if isinstance(in_specs, dict):
        return in_specs.get(k, _KEEP)
    if isinstance(in_specs, (tuple, list)):
        return in_specs[k] if k < len(in_specs) else _KEEP
    if isinstance(in_specs, ShardingSpec):
        return in_specs
    raise TypeError(
        f"nx.shard_map: in_specs of {_fname(f)} must be a dict {{position: spec}}, a tuple of "
        f"specs, or None; got {type(in_specs).__name__}"
    )


def _leaf_spec(spec, t: Tensor, mesh: DeviceMesh, path: str):
    if spec is _KEEP:
        own = t.sharding
        return (
            own if own is not None and own.mesh == mesh else ShardingSpec.replicated(mesh, t.ndim)
        )
    if spec is None:
        return ShardingSpec.replicated(mesh, t.ndim)
    if spec.mesh != mesh:
        raise ValueError(
            f"nx.shard_map: the spec for {path} is over {spec.mesh!r}, but the function is "
            f"mapped over {mesh!r}. Fix: build the spec with the same mesh"
        )
    spec.check(t.shape, f"nx.shard_map: in_specs for {path}")
    return spec


def _out_plan(out_specs, out, tensors, mesh, f):
    """One logical spec per output tensor, or None: infer the plan."""
    if out_specs is None:
        return None
    if isinstance(out_specs, ShardingSpec):
        entries = [(p, o, out_specs) for p, o in _tree.leaves_with_path(out, prefix="output")]
    else:
        entries = _spec_leaves(out_specs, out, "output", "out_specs", f)
    plan = []
    for path, o, s in entries:
        if not isinstance(o, Tensor):
            continue
        s = ShardingSpec.replicated(mesh, o.ndim) if s is None else s
        if s.mesh != mesh:
            raise ValueError(
                f"nx.shard_map: out_specs for {path} is over {s.mesh!r}, but the function is "
                f"mapped over {mesh!r}"
            )
        s.check(o.shape, f"nx.shard_map: out_specs for {path}")
        plan.append(s)
    return plan


def shard_map(f: Callable, mesh: DeviceMesh, in_specs=None, out_specs=None) -> Callable:
    """Run ``f`` (written for whole tensors) partitioned over ``mesh``; results equal ``f``'s.

    ``in_specs``: ``{position: spec}`` or a tuple with one entry per positional argument; an
    entry is a ``ShardingSpec`` (for every tensor leaf of that argument), ``None`` (replicated),
    or a tuple/list/dict matching the argument's pytree structure. An argument it does not
    mention keeps its own ``.sharding`` (replicated if it has none over ``mesh``). ``out_specs``:
    one spec for every output, or a pytree of specs matching the outputs (``None`` entries:
    replicated); ``None`` (the default): the plan nablax infers with the primitives' sharding
    rules, shown by each output's ``.sharding``.

    The call is one lazy, differentiable graph node: ``nx.grad``, ``nx.vjp``, ``nx.jvp``,
    ``backward()``, ``nx.vmap`` and ``nx.compile`` go through it.

    >>> import nablax as nx
    >>> mesh = nx.DeviceMesh((1,), ("dp",))
    >>> rows = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    >>> f = nx.shard_map(lambda x, w: x @ w, mesh, in_specs={0: rows})
    >>> y = f(nx.ones((4, 3)), nx.ones((3, 2)))
    >>> y.tolist()[0], y.sharding.dims
    ([3.0, 3.0], [DimSpec(['dp']), DimSpec([])])
    >>> g = nx.shard_map(lambda p: {"s": p["a"] + p["b"]}, mesh)
    >>> g({"a": nx.ones(2), "b": nx.ones(2)})["s"].tolist()
    [2.0, 2.0]
    """
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(
            f"nx.shard_map: mesh must be an nx.DeviceMesh, got {type(mesh).__name__}. Fix: "
            f"nx.DeviceMesh(shape, axis_names)"
        )

    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        if kwargs:
            raise TypeError(
                f"nx.shard_map: {_fname(f)} was called with keyword arguments "
                f"{sorted(kwargs)}; in_specs are positional. Fix: pass them positionally"
            )
        entries = []
        for k, a in enumerate(args):
            entries += _spec_leaves(_arg_entry(in_specs, k, f), a, f"args[{k}]", "in_specs", f)
        leaves, treedef = _tree.flatten(args)
        with Stage() as st:
            new, refs = [], []
            for (path, _, spec), leaf in zip(entries, leaves):
                if not isinstance(leaf, (Tensor, jax.Array, np.ndarray)):
                    new.append(leaf)  # a static value, seen by f as it is
                    continue
                t = leaf if isinstance(leaf, Tensor) else Tensor(leaf)
                s = _leaf_spec(spec, t, mesh, path)
                new.append(st.add(t.shape, t.dtype, t._impl.batch_shape, s))
                refs.append(t._impl.ref)
            try:
                out = f(*_tree.unflatten(treedef, new))
            except GraphBreakError as e:
                msg = str(e).replace("nx.compile:", "nx.shard_map:", 1)
                raise GraphBreakError(msg) from None
            out_leaves, out_def = _tree.flatten(out)
            tensors = [o for o in out_leaves if isinstance(o, Tensor)]
            body = st.finish(tensors, mesh, _out_plan(out_specs, out, tensors, mesh, f))
            captured = st.captured
        impls = iter(_call(body, refs + captured, [len(i.bshape) for i in body.ins]))
        res = [Tensor._wrap(next(impls)) if isinstance(o, Tensor) else o for o in out_leaves]
        return _tree.unflatten(out_def, res)

    return wrapped

"""Device meshes and sharding specs (API.md §5): ``nx.devices``, ``nx.DeviceMesh``, ``nx.DimSpec``,
``nx.ShardingSpec``, ``Tensor.shard`` and what ``Tensor.sharding`` reports. ``nx.shard_map`` is
in core/transforms/shard_map.py.

A :class:`DeviceMesh` names the axes of an n-d grid of devices (a ``jax.sharding.Mesh``). A
:class:`ShardingSpec` says, per tensor dimension, which mesh axes split it (a :class:`DimSpec`;
empty: replicated along that dimension).

``x.shard(mesh, dim_specs)``:

- on a realized, untransformed tensor, places the data at once (``x.to_jax().sharding`` is the
  ``NamedSharding``);
- on a pending tensor (built by ops not run yet, differentiated by ``nx.grad``, batched by
  ``nx.vmap``, or traced by ``nx.compile``/``nx.shard_map``) adds one lazy ``sharding_constraint``
  node (``jax.lax.with_sharding_constraint`` when it runs). Under ``nx.vmap`` the spec describes
  the logical dimensions; the batch axes stay unsharded. Its gradient is the cotangent under the
  same constraint, so ``nx.grad`` flows through it.

``Tensor.sharding`` is intrinsic (as in the seed design) and costs nothing on the op-building hot
path, because it is computed only when read:

1. a spec set explicitly (``x.shard``, the outputs of ``nx.shard_map``) is returned as it is;
2. a realized tensor reports where its data is: the spec of its ``jax.Array``'s ``NamedSharding``
   (``None`` for a single-device array). After a realization XLA's placement is authoritative:
   for slices and gathers it can differ from the plan a pending tensor shows;
3. a pending tensor reports the layout *propagated* from the realized leaves of its graph that
   carry a ``NamedSharding`` through every op with the primitives' sharding rules
   (core/prims/_shard.py): exactly the plan ``nx.shard_map`` infers for the same ops. ``None`` when
   no leaf is sharded.

Multi-process: the same code runs in several processes (or hosts) after
``nx.distributed.initialize()`` in each; ``nx.devices()`` then lists every process's devices and a
mesh spans them (tests/distributed runs 2 processes x 2 CPU devices through
``python -m nablax.launch``). Single-process tests use 8 virtual CPU devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts).

>>> import nablax as nx
>>> mesh = nx.DeviceMesh((1,), ("dp",))
>>> x = nx.ones((4, 2)).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
>>> x.sharding
ShardingSpec(mesh=DeviceMesh((1,), ('dp',)), dims=[DimSpec(['dp']), DimSpec([])])
>>> (x * 2).sum(axis=1).sharding.dims  # propagated through the ops, before anything runs
[DimSpec(['dp'])]
"""

from __future__ import annotations

from typing import cast

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding

from . import hooks as _hooks
from .build import bind, impl_from_array
from .graph import Var, toposort
from .mesh import DeviceMesh, DimSpec, ShardingSpec, devices  # noqa: F401 - re-exported
from .primitive import primitive
from .prims import _rules
from .prims._shard import fit
from .tensor import Tensor
from .transforms.trace import input_aval, node_avals

# ---- Tensor.shard and its graph node ---------------------------------------------------------


def _constraint_lower(params, x):
    return jax.lax.with_sharding_constraint(x, params[0].named())


def _constraint_batch(params, bds, x):  # the batch axes stay unsharded
    return jax.lax.with_sharding_constraint(x, params[0].named(bds[0]))


def _constraint_transpose(params, ct, x):
    return Tensor._wrap(bind(sharding_constraint_p, [ct._impl], params)[0])


sharding_constraint_p = primitive(
    "sharding_constraint",
    lambda params, x: (x,),
    _constraint_lower,
    batch=_constraint_batch,
    shard=lambda params, lays, ins, outs: (params[0].layout(),),
    # the constraint is the identity on values: its tangent and cotangent get the same layout
    rules=_rules.linear(_constraint_transpose),
    doc="Tensor.shard of a pending tensor: its value laid out as the spec says (no other effect).",
)


def _shard(self: Tensor, mesh: DeviceMesh, dim_specs) -> Tensor:
    """This tensor laid out over ``mesh`` as ``dim_specs`` says (a list of :class:`DimSpec` or a
    :class:`ShardingSpec`). A realized tensor is placed at once; a pending one (lazy ops,
    ``nx.grad``, ``nx.vmap``, ``nx.compile``) gets a lazy sharding constraint.

    >>> import nablax as nx
    >>> mesh = nx.DeviceMesh((1,), ("dp",))
    >>> y = (nx.ones((2, 3)) + 1).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    >>> y.is_realized, y.sharding.dims
    (False, [DimSpec(['dp']), DimSpec([])])
    """
    spec = dim_specs if isinstance(dim_specs, ShardingSpec) else ShardingSpec(mesh, dim_specs)
    if spec.mesh != mesh:
        raise ValueError(
            f"Tensor.shard: the ShardingSpec is over {spec.mesh!r} but mesh={mesh!r}. Fix: "
            f"pass a spec over the same mesh"
        )
    spec.check(self.shape, "Tensor.shard")
    impl = self._impl
    if impl.value is not None and impl.src is None and not impl.batch_shape:
        t = Tensor._wrap(impl_from_array(jax.device_put(impl.value, spec.named())))
    else:
        t = Tensor._wrap(bind(sharding_constraint_p, [impl], (spec,))[0])
    t._impl.sharding = spec
    return t


# ---- propagation of layouts through a graph --------------------------------------------------


def named_layout(value, mesh: DeviceMesh, ndim: int, skip: int):
    """The logical layout of a realized array over ``mesh``, or None (not laid out over it)."""
    s = getattr(value, "sharding", None)
    if type(s) is not NamedSharding or s.mesh != mesh.jax_mesh:
        return None
    return ShardingSpec.from_named(mesh, s, ndim, skip).layout()


def propagate(order, out_refs, mesh: DeviceMesh, given: dict | None = None) -> list:
    """The layout of each of ``out_refs`` (``Var`` objects), propagated through the
    nodes ``order`` (topologically sorted) with every primitive's sharding rule. ``given`` fixes
    the layouts of some nodes' first output (placeholders); realized arrays the nodes read
    contribute their ``NamedSharding`` over ``mesh``; everything else starts replicated."""
    sizes = dict(zip(mesh.axis_names, mesh.shape))
    given = given or {}
    lay: dict = {(n, 0): layout for n, layout in given.items()}
    memo: dict = {}
    for n in order:
        if n in given:
            continue
        outs = node_avals(n, memo)
        ins, avals = [], []
        for k, inp in enumerate(n.inputs):
            aval = input_aval(inp, n, memo, k)
            rank = len(aval[0])
            got = None
            if type(inp) is Var:
                got = lay.get(inp)
                m, j = inp
                if got is None and m.values is not None and m.values[j] is not None:
                    nb = len(m.bdims[1]) if m.bdims is not None else 0
                    got = named_layout(m.values[j], mesh, rank, nb)
            elif hasattr(inp.value, "sharding"):
                nb = n.bdims[0][k] if n.bdims is not None else 0
                got = named_layout(inp.value, mesh, rank, nb)
            ins.append(got if got is not None else ((),) * rank)
            avals.append(aval)
        proposed = n.prim.rule("shard")(n.params, ins, avals, outs)
        for j, ((shape, _), p) in enumerate(zip(outs, proposed)):
            lay[(n, j)] = fit(p, shape, sizes)
    return [lay.get(r, ()) for r in out_refs]


def infer_plan(out_impls, placeholders, in_layouts, mesh: DeviceMesh) -> list:
    """The layout of each output of a traced graph, propagated from the placeholders' layouts
    (``in_layouts[k]`` for ``placeholders[k]``) with every primitive's sharding rule."""
    roots = [i.src[0] for i in out_impls if i.src is not None]
    order = toposort(roots)
    given = dict(zip(placeholders, in_layouts))
    refs = [i.src for i in out_impls]
    got = propagate(order, [r for r in refs if r is not None], mesh, given)
    it = iter(got)
    return [next(it) if r is not None else ((),) * len(i.shape) for r, i in zip(refs, out_impls)]


def _leaf_mesh(order) -> DeviceMesh | None:
    """The mesh of the first node that lays its output out over one (its parameters name a mesh:
    ``x.shard``, ``nx.shard_map``) or reads a realized array with a ``NamedSharding``."""
    for n in order:
        for p in n.params:
            m = getattr(p, "mesh", None)
            if isinstance(m, DeviceMesh):
                return m
        for inp in n.inputs:
            if type(inp) is Var:
                m, j = inp
                if m.values is None or m.values[j] is None:
                    continue
                v = m.values[j]
            else:
                v = inp.value
            s = getattr(v, "sharding", None)
            if type(s) is NamedSharding:
                return DeviceMesh.from_jax(cast(Mesh, s.mesh))  # a concrete array's: not abstract
    return None


def sharding_of(impl) -> ShardingSpec | None:
    """``Tensor.sharding`` when no spec was set explicitly (see the module docstring)."""
    if impl.value is not None:
        s = getattr(impl.value, "sharding", None)
        if type(s) is not NamedSharding:
            return None
        mesh = DeviceMesh.from_jax(cast(Mesh, s.mesh))  # a concrete array's: not abstract
        return ShardingSpec.from_named(mesh, s, len(impl.shape), len(impl.batch_shape))
    order = toposort([impl.src[0]])
    leaf_mesh = _leaf_mesh(order)
    if leaf_mesh is None:
        return None
    (layout,) = propagate(order, [impl.src], leaf_mesh)
    return ShardingSpec.from_layout(leaf_mesh, layout)


_hooks.set_sharding_of(sharding_of)  # core/hooks.py: late binding 2


def _to_local(t):
    """``Tensor.to_local``: the block of ``t`` this process's devices hold (no communication)."""
    arr = t.to_jax()
    if arr.is_fully_addressable:
        return Tensor._wrap(impl_from_array(arr))
    shards = arr.addressable_shards
    bounds = [[s.index[d].indices(n)[:2] for s in shards] for d, n in enumerate(arr.shape)]
    lo = [min(b[0] for b in bd) for bd in bounds]
    hi = [max(b[1] for b in bd) for bd in bounds]
    out = np.empty([h - low for low, h in zip(lo, hi)], dtype=arr.dtype)
    for s in shards:
        idx = tuple(
            slice(sl.indices(n)[0] - low, sl.indices(n)[1] - low)
            for sl, n, low in zip(s.index, arr.shape, lo)
        )
        out[idx] = np.asarray(s.data)
    return Tensor._wrap(impl_from_array(jax.device_put(out, jax.local_devices()[0])))


def _host_readable(v, what: str):
    """``v`` if this process holds all of its data; else an error that says how to read it."""
    if getattr(v, "is_fully_addressable", True) or v.is_fully_replicated:
        return v
    n = len({d.process_index for d in v.sharding.device_set})
    raise RuntimeError(
        f"{what}: this tensor (shape {tuple(v.shape)}, dtype {v.dtype}) lies on devices of {n} "
        f"processes and this process holds only part of it. Fix: nx.distributed.gather(x) on "
        f"every process to read the whole value, or x.to_local() for this process's piece"
    )

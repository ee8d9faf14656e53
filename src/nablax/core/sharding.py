"""Device meshes and sharding specs (API.md §5): ``nx.devices``, ``nx.DeviceMesh``, ``nx.DimSpec``,
``nx.ShardingSpec``, ``Tensor.shard`` and ``nx.shard_map``.

A :class:`DeviceMesh` names the axes of an n-d grid of devices (a ``jax.sharding.Mesh``). A
:class:`ShardingSpec` says, per tensor dimension, which mesh axes split it (a :class:`DimSpec`;
empty: replicated along that dimension). ``x.shard(mesh, dim_specs)`` places a tensor that way.

``nx.shard_map(f, mesh, in_specs, out_specs)`` has global-view semantics: ``f`` is written for
unsharded tensors; it is traced once per signature like ``nx.compile`` (transforms/compile.py) and
the traced program is compiled by XLA's SPMD partitioner with the inputs' shardings
(``jax.jit`` with ``NamedSharding`` in/out shardings), so its results equal ``f``'s. The output
shardings (the *sharding plan*, shown by ``.sharding``) are inferred by propagating the inputs'
layouts through the traced graph with each primitive's sharding rule (core/ops/_shard.py), unless
``out_specs`` fixes them; XLA is asked to produce exactly that plan.

Multi-host: the same code runs on several machines after ``jax.distributed.initialize()`` on
each (one process per host); ``nx.devices()`` then lists every device of the cluster and a mesh
spans them. This cannot be exercised in the test suite (one machine); tests use 8 virtual CPU
devices (``XLA_FLAGS=--xla_force_host_platform_device_count=8`` before JAX starts).

>>> import nablax as nx
>>> mesh = nx.DeviceMesh((1,), ("dp",))
>>> x = nx.ones((4, 2)).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
>>> x.sharding
ShardingSpec(mesh=DeviceMesh((1,), ('dp',)), dims=[DimSpec(['dp']), DimSpec([])])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from .. import tree as _tree
from .graph import Node, src_node
from .tensor import Tensor, impl_from_array


def devices() -> list:
    """Every device JAX can use (all hosts' after ``jax.distributed.initialize``)."""
    return list(jax.devices())


class DeviceMesh:
    """An n-d grid of devices with named axes."""

    def __init__(self, shape: Sequence[int], axis_names: Sequence[str], devices=None) -> None:
        shape, names = tuple(int(d) for d in shape), tuple(axis_names)
        if len(shape) != len(names):
            raise ValueError(
                f"nx.DeviceMesh: shape {shape} has {len(shape)} axes but {len(names)} axis names "
                f"{names} were given"
            )
        if len(set(names)) != len(names):
            raise ValueError(f"nx.DeviceMesh: axis names {names} repeat a name")
        devs = list(devices) if devices is not None else jax.devices()
        need = math.prod(shape)
        if len(devs) < need:
            raise ValueError(
                f"nx.DeviceMesh: shape {shape} needs {need} devices, only {len(devs)} available "
                f"({devs[0].platform if devs else 'none'}). Fix: a smaller mesh, or on CPU set "
                f"XLA_FLAGS=--xla_force_host_platform_device_count=N before JAX starts"
            )
        self.shape, self.axis_names = shape, names
        self.jax_mesh = Mesh(np.array(devs[:need], dtype=object).reshape(shape), names)

    def size(self, axis: str) -> int:
        return self.shape[self.axis_names.index(axis)]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DeviceMesh) and self.jax_mesh == other.jax_mesh

    def __hash__(self) -> int:
        return hash((self.shape, self.axis_names))

    def __repr__(self) -> str:
        return f"DeviceMesh({self.shape}, {self.axis_names})"


class DimSpec:
    """The mesh axes one tensor dimension is split over (``[]``: replicated)."""

    def __init__(self, axes: Sequence[str] = ()) -> None:
        self.axes = tuple([axes] if isinstance(axes, str) else axes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DimSpec) and self.axes == other.axes

    def __hash__(self) -> int:
        return hash(self.axes)

    def __repr__(self) -> str:
        return f"DimSpec({list(self.axes)})"


class ShardingSpec:
    """How a tensor is laid out over a mesh: one :class:`DimSpec` per dimension."""

    def __init__(self, mesh: DeviceMesh, dim_specs: Sequence[DimSpec]) -> None:
        dims = [d if isinstance(d, DimSpec) else DimSpec(d or ()) for d in dim_specs]
        used: dict = {}
        for k, d in enumerate(dims):
            for a in d.axes:
                if a not in mesh.axis_names:
                    raise ValueError(
                        f"nx.ShardingSpec: dimension {k} names mesh axis {a!r}, but the mesh has "
                        f"axes {list(mesh.axis_names)}"
                    )
                if a in used:
                    raise ValueError(
                        f"nx.ShardingSpec: mesh axis {a!r} is used twice (dimensions {used[a]} "
                        f"and {k}); each mesh axis can split one dimension"
                    )
                used[a] = k
        self.mesh, self.dims = mesh, dims

    def partition_spec(self) -> PartitionSpec:
        return PartitionSpec(*[d.axes if len(d.axes) != 1 else d.axes[0] for d in self.dims])

    def named(self) -> NamedSharding:
        return NamedSharding(self.mesh.jax_mesh, self.partition_spec())

    def check(self, shape: tuple, what: str) -> None:
        if len(self.dims) != len(shape):
            raise ValueError(
                f"{what}: the spec has {len(self.dims)} dimension(s) but the tensor has shape "
                f"{shape} (rank {len(shape)}). Fix: one DimSpec per dimension"
            )
        for k, (n, d) in enumerate(zip(shape, self.dims)):
            parts = math.prod(self.mesh.size(a) for a in d.axes)
            if n % parts:
                raise ValueError(
                    f"{what}: dimension {k} of size {n} is not divisible by mesh axes "
                    f"{list(d.axes)} ({parts} parts). Fix: pad the tensor or use fewer axes"
                )

    @classmethod
    def from_named(cls, mesh: DeviceMesh, sharding, ndim: int) -> ShardingSpec:
        spec = getattr(sharding, "spec", PartitionSpec())
        entries = list(spec) + [None] * (ndim - len(spec))
        dims = []
        for e in entries[:ndim]:
            axes = () if e is None else (e,) if isinstance(e, str) else tuple(e)
            dims.append(DimSpec(axes))
        return cls(mesh, dims)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ShardingSpec) and self.mesh == other.mesh and self.dims == other.dims
        )

    def __hash__(self) -> int:
        return hash((self.mesh, tuple(self.dims)))

    def __repr__(self) -> str:
        return f"ShardingSpec(mesh={self.mesh!r}, dims={self.dims!r})"


def _shard(self: Tensor, mesh: DeviceMesh, dim_specs) -> Tensor:
    """This tensor placed over ``mesh`` as ``dim_specs`` says (realizes it)."""
    spec = dim_specs if isinstance(dim_specs, ShardingSpec) else ShardingSpec(mesh, dim_specs)
    spec.check(self.shape, "Tensor.shard")
    value = jax.device_put(self._realized_value(), spec.named())
    t = Tensor._wrap(impl_from_array(value))
    t._impl.sharding = spec
    return t


Tensor.shard = _shard


def infer_plan(out_impls, placeholders, in_layouts, mesh: DeviceMesh) -> list:
    """The layout of each output, propagated from the placeholders' layouts through the traced
    graph with every primitive's sharding rule (core/ops/_shard.py)."""
    from .graph import split_ref, toposort
    from .ops._shard import fit
    from .transforms.staging import compile_input_p
    from .transforms.trace import input_aval, node_avals

    sizes = dict(zip(mesh.axis_names, mesh.shape))
    roots = [src_node(i.src) for i in out_impls if i.src is not None]
    lay: dict = {}
    memo: dict = {}
    for n in toposort(roots):
        if n.prim is compile_input_p:
            lay[(n, 0)] = in_layouts[n.params[2]]
            continue
        outs = node_avals(n, memo)
        if n.bdims is not None:  # vmap batch axes: not part of the logical plan
            for j, (shape, _) in enumerate(outs):
                lay[(n, j)] = ((),) * len(shape)
            continue
        ins, avals = [], []
        for k, inp in enumerate(n.inputs):
            aval = input_aval(inp, n, memo, k)
            r = split_ref(inp)
            ins.append(lay.get(r, ((),) * len(aval[0])) if r is not None else ((),) * len(aval[0]))
            avals.append(aval)
        proposed = n.prim.rule("shard")(n.params, ins, avals, outs)
        for j, ((shape, _), p) in enumerate(zip(outs, proposed)):
            lay[(n, j)] = fit(p, shape, sizes)
    out = []
    for impl in out_impls:
        if impl.src is None:
            out.append(((),) * len(impl.shape))
        else:
            m, j = (impl.src, 0) if type(impl.src) is Node else impl.src
            out.append(lay[(m, j)])
    return out


_KEEP = object()


def _spec_for(specs, k: int):
    """The spec ``in_specs`` gives argument ``k``: a ``ShardingSpec``, ``None`` (replicated), or
    ``_KEEP`` when it says nothing about it (the tensor keeps its own ``.sharding``)."""
    if specs is None:
        return _KEEP
    if isinstance(specs, dict):
        return specs.get(k, _KEEP)
    return specs[k] if k < len(specs) else _KEEP


def shard_map(f: Callable, mesh: DeviceMesh, in_specs=None, out_specs=None) -> Callable:
    """Run ``f`` (written for whole tensors) partitioned over ``mesh``; results equal ``f``'s.

    ``in_specs``: ``{position: ShardingSpec or None}`` or a tuple (``None``: replicated; an
    argument it does not mention keeps its own ``.sharding``, replicated if it has none); ``out_specs``: one spec for every output or a pytree of
    specs (``None``: the plan nablax infers with the primitives' sharding rules).

    >>> import nablax as nx
    >>> mesh = nx.DeviceMesh((1,), ("dp",))
    >>> rows = nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    >>> f = nx.shard_map(lambda x, w: x @ w, mesh, in_specs={0: rows})
    >>> y = f(nx.ones((4, 3)), nx.ones((3, 2)))
    >>> y.tolist()[0], y.sharding.dims
    ([3.0, 3.0], [DimSpec(['dp']), DimSpec([])])
    """
    from .transforms.staging import lower, make_placeholder, trace_graph

    cache: dict = {}

    def wrapped(*args):
        for k, a in enumerate(args):
            if not isinstance(a, Tensor):
                raise TypeError(
                    f"nx.shard_map: argument {k} of {getattr(f, '__name__', f)} is a "
                    f"{type(a).__name__}; pass tensors"
                )
        specs = []
        for k, a in enumerate(args):
            s = _spec_for(in_specs, k)
            if s is _KEEP:
                s = a.sharding
            if s is not None:
                s.check(a.shape, f"nx.shard_map in_specs[{k}]")
            specs.append(s)
        key = tuple((a.shape, a.dtype, s) for a, s in zip(args, specs))
        entry = cache.get(key)
        if entry is None:
            placeholders, ph_args = zip(*[make_placeholder(a, k) for k, a in enumerate(args)])
            out = trace_graph(f, ph_args, list(placeholders))
            leaves, out_def = _tree.flatten(out)
            impls = [t._impl for t in leaves]
            program, captured = lower(impls, list(placeholders))
            replicated = NamedSharding(mesh.jax_mesh, PartitionSpec())
            in_sh = [s.named() if s is not None else replicated for s in specs]
            in_sh += [replicated] * len(captured)
            if out_specs is None:  # the plan nablax infers (every primitive's sharding rule)
                layouts = [
                    tuple(d.axes for d in s.dims) if s is not None else ((),) * a.ndim
                    for s, a in zip(specs, args)
                ]
                plan = [
                    ShardingSpec(mesh, [DimSpec(a) for a in lay])
                    for lay in infer_plan(impls, placeholders, layouts, mesh)
                ]
            elif isinstance(out_specs, ShardingSpec):
                plan = [out_specs] * len(leaves)
            else:
                given = _tree.leaves(out_specs, is_leaf=lambda s: s is None)
                plan = [
                    s if s is not None else ShardingSpec(mesh, [DimSpec()] * t.ndim)
                    for s, t in zip(given, leaves)
                ]
            for k, (s, t) in enumerate(zip(plan, leaves)):
                s.check(t.shape, f"nx.shard_map out_specs (output {k})")
            fn = jax.jit(program, in_shardings=in_sh, out_shardings=[s.named() for s in plan])
            entry = cache[key] = (fn, captured, out_def, plan)
        fn, captured, out_def, plan = entry
        vals = [a._realized_value() for a in args]
        outs = fn(*vals, *captured)
        res = []
        for v, spec in zip(outs, plan):
            t = Tensor._wrap(impl_from_array(v))
            t._impl.sharding = spec
            res.append(t)
        return _tree.unflatten(out_def, res)

    return wrapped

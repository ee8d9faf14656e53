"""Device meshes and sharding specs (API.md §5): ``nx.devices``, ``nx.DeviceMesh``, ``nx.DimSpec``,
``nx.ShardingSpec``, ``Tensor.shard`` and ``nx.shard_map``.

A :class:`DeviceMesh` names the axes of an n-d grid of devices (a ``jax.sharding.Mesh``). A
:class:`ShardingSpec` says, per tensor dimension, which mesh axes split it (a :class:`DimSpec`;
empty: replicated along that dimension). ``x.shard(mesh, dim_specs)`` places a tensor that way.

``nx.shard_map(f, mesh, in_specs, out_specs)`` has global-view semantics: ``f`` is written for
unsharded tensors; it is traced once per signature like ``nx.compile`` (transforms/compile.py) and
the traced program is compiled by XLA's SPMD partitioner with the inputs' shardings
(``jax.jit`` with ``NamedSharding`` in/out shardings), so its results equal ``f``'s. Output
shardings are what the partitioner chose (shown by ``.sharding``) unless ``out_specs`` fixes
them.

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


def _spec_for(specs, k: int):
    if specs is None:
        return None
    if isinstance(specs, dict):
        return specs.get(k)
    return specs[k] if k < len(specs) else None


def shard_map(f: Callable, mesh: DeviceMesh, in_specs=None, out_specs=None) -> Callable:
    """Run ``f`` (written for whole tensors) partitioned over ``mesh``; results equal ``f``'s.

    ``in_specs``: ``{position: ShardingSpec or None}`` or a tuple (``None``: replicated, or keep
    the tensor's own ``.sharding``); ``out_specs``: one spec for a single output or a pytree of
    specs (``None``: the partitioner's choice, shown by ``.sharding``).
    """
    from .transforms.compile import _lower, _make_placeholder, trace_graph

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
            s = _spec_for(in_specs, k) or a.sharding
            if s is not None:
                s.check(a.shape, f"nx.shard_map in_specs[{k}]")
            specs.append(s)
        key = tuple((a.shape, a.dtype, s) for a, s in zip(args, specs))
        entry = cache.get(key)
        if entry is None:
            placeholders, ph_args = zip(*[_make_placeholder(a, k) for k, a in enumerate(args)])
            out = trace_graph(f, ph_args, list(placeholders))
            leaves, out_def = _tree.flatten(out)
            program, captured = _lower([t._impl for t in leaves], list(placeholders))
            replicated = NamedSharding(mesh.jax_mesh, PartitionSpec())
            in_sh = [s.named() if s is not None else replicated for s in specs]
            in_sh += [replicated] * len(captured)
            out_sh = None
            if out_specs is not None:
                flat = out_specs if isinstance(out_specs, ShardingSpec) else None
                if flat is not None:
                    out_sh = [flat.named()] * len(leaves)
                else:
                    out_sh = [
                        s.named() if s is not None else replicated
                        for s in _tree.leaves(out_specs, is_leaf=lambda s: s is None)
                    ]
            fn = jax.jit(program, in_shardings=in_sh, out_shardings=out_sh)
            entry = cache[key] = (fn, captured, out_def, [t.ndim for t in leaves])
        fn, captured, out_def, ndims = entry
        vals = [a._realized_value() for a in args]
        outs = fn(*vals, *captured)
        res = []
        for v, nd in zip(outs, ndims):
            t = Tensor._wrap(impl_from_array(v))
            t._impl.sharding = ShardingSpec.from_named(mesh, v.sharding, nd)
            res.append(t)
        return _tree.unflatten(out_def, res)

    return wrapped

"""The layout types, at the bottom of core (they import no nablax module, so ``Tensor``'s
annotations and core/sharding.py both can): ``nx.devices``, ``nx.DeviceMesh`` (named axes over
an n-d grid of devices, a ``jax.sharding.Mesh``), ``nx.DimSpec`` (the mesh axes that split one
tensor dimension) and ``nx.ShardingSpec`` (one ``DimSpec`` per dimension). What uses them,
``Tensor.shard``, ``Tensor.sharding`` and the layout propagation, is in core/sharding.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def devices() -> list:
    """Every device JAX can use (all hosts' after ``jax.distributed.initialize``).

    >>> import nablax as nx
    >>> len(nx.devices()) >= 1
    True
    """
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

    @classmethod
    def from_jax(cls, mesh: Mesh) -> DeviceMesh:
        """The mesh of a ``jax.sharding.Mesh`` (e.g. a ``NamedSharding``'s)."""
        self = object.__new__(cls)
        self.shape = tuple(int(d) for d in mesh.devices.shape)
        self.axis_names = tuple(mesh.axis_names)
        self.jax_mesh = mesh
        return self

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

    @classmethod
    def replicated(cls, mesh: DeviceMesh, ndim: int) -> ShardingSpec:
        return cls(mesh, [DimSpec()] * ndim)

    @classmethod
    def from_layout(cls, mesh: DeviceMesh, layout) -> ShardingSpec:
        """From a layout: one tuple of mesh axis names per dimension (core/prims/_shard.py)."""
        return cls(mesh, [DimSpec(a) for a in layout])

    def layout(self) -> tuple:
        return tuple(d.axes for d in self.dims)

    def partition_spec(self, batch_dims: int = 0) -> PartitionSpec:
        """The ``PartitionSpec``; ``batch_dims`` leading vmap batch axes stay unsharded."""
        entries = [d.axes if len(d.axes) != 1 else d.axes[0] for d in self.dims]
        return PartitionSpec(*([None] * batch_dims + entries))

    def named(self, batch_dims: int = 0) -> NamedSharding:
        return NamedSharding(self.mesh.jax_mesh, self.partition_spec(batch_dims))

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
    def from_named(cls, mesh: DeviceMesh, sharding, ndim: int, skip: int = 0) -> ShardingSpec:
        """The spec of a ``NamedSharding`` for a value of rank ``skip + ndim``, without its
        first ``skip`` (vmap batch) dimensions."""
        spec = getattr(sharding, "spec", PartitionSpec())
        entries = list(spec) + [None] * (skip + ndim - len(spec))
        dims = []
        for e in entries[skip : skip + ndim]:
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

"""``Invocation``: one call of a kernel, and its ``call_key``.

The call key identifies what a config was chosen for. It must be equal for the same call in two
processes and different whenever the computation may differ, so it is built only from stable data:
the versioned op id, the pytree structure of the arguments, the shape and dtype of every array
leaf, the value of every static leaf, and the shard_map mesh and specs. Memory addresses and reprs
that contain them never enter it: a function is keyed by its module, qualified name, code, defaults
and the values its closure captured; a ``functools.partial`` by its function and bound arguments.
A static value that cannot be keyed stably raises a ``TypeError`` naming its argument path.

>>> import jax.numpy as jnp
>>> from nablax.kernels import Invocation
>>> a = Invocation("matmul@v1", (jnp.ones((4, 8)), jnp.ones((8, 2))), {})
>>> b = Invocation("matmul@v1", (jnp.zeros((4, 8)), jnp.zeros((8, 2))), {})
>>> a.call_key == b.call_key, a.signature
(True, 'args[0]=float32[4,8], args[1]=float32[8,2]')
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import math
import types
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np


def _is_array(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, (type, np.dtype))


def _dtype_name(dt: Any) -> str:
    try:
        return np.dtype(dt).name
    except TypeError:
        return str(dt)


def array_desc(x: Any) -> str:
    """``float32[4,8]`` for arrays, tracers, ShapeDtypeStructs and nablax Tensors."""
    return f"{_dtype_name(x.dtype)}[{','.join(str(int(d)) for d in x.shape)}]"


def _code_key(code: types.CodeType, seen: set[int]) -> str:
    consts = []
    for c in code.co_consts:
        consts.append(_code_key(c, seen) if isinstance(c, types.CodeType) else repr(c))
    return hashlib.sha256(
        repr((code.co_name, code.co_code, code.co_names, code.co_varnames, consts)).encode()
    ).hexdigest()[:16]


def static_key(x: Any, path: str, seen: set[int] | None = None) -> str:
    """A stable text key of a static value (see the module docstring)."""
    seen = set() if seen is None else seen
    if x is None or isinstance(x, (bool, int, str, bytes)):
        return f"{type(x).__name__}:{x!r}"
    if isinstance(x, float):
        return "float:" + ("nan" if math.isnan(x) else float.hex(x))
    if isinstance(x, complex):
        return f"complex:{float.hex(x.real)},{float.hex(x.imag)}"
    if isinstance(x, enum.Enum):
        return f"enum:{type(x).__module__}.{type(x).__qualname__}.{x.name}"
    if isinstance(x, np.dtype):
        return f"dtype:{x.name}"
    if isinstance(x, type) or type(x).__name__ == "_ScalarMeta":  # classes; jnp.float32 & co
        try:
            return f"dtype:{np.dtype(x).name}"
        except TypeError:
            return f"type:{x.__module__}.{x.__qualname__}"
    if isinstance(x, np.generic):
        return f"np:{x.dtype.name}:{x.item()!r}"
    if id(x) in seen:
        return "cycle"
    seen = seen | {id(x)}
    if isinstance(x, (tuple, list, frozenset, set)):
        items = [static_key(v, f"{path}[{i}]", seen) for i, v in enumerate(x)]
        if isinstance(x, (set, frozenset)):
            items.sort()
        return f"{type(x).__name__}({','.join(items)})"
    if isinstance(x, Mapping):
        items = sorted(
            (static_key(k, path, seen), static_key(v, f"{path}[{k!r}]", seen)) for k, v in x.items()
        )
        return "dict{" + ",".join(f"{k}:{v}" for k, v in items) + "}"
    if isinstance(x, functools.partial):
        return (
            f"partial({static_key(x.func, path, seen)};{static_key(x.args, path, seen)};"
            f"{static_key(x.keywords, path, seen)})"
        )
    if isinstance(x, types.MethodType):
        return f"method({static_key(x.__self__, path, seen)}.{x.__func__.__qualname__})"
    if isinstance(x, types.FunctionType):
        return _function_key(x, path, seen)
    if isinstance(x, (types.BuiltinFunctionType, np.ufunc)):
        return f"builtin:{getattr(x, '__module__', '')}.{getattr(x, '__qualname__', x.__name__)}"
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        fields = {f.name: getattr(x, f.name) for f in dataclasses.fields(x)}
        return f"dc:{type(x).__module__}.{type(x).__qualname__}{static_key(fields, path, seen)}"
    key_fn = getattr(x, "__nablax_key__", None)
    if callable(key_fn):
        return f"obj:{type(x).__module__}.{type(x).__qualname__}:{key_fn()}"
    raise TypeError(
        f"nablax.kernels.Invocation: can't build a stable call key for the static argument at "
        f"{path} of type {type(x).__module__}.{type(x).__qualname__}: only numbers, strings, "
        f"enums, dtypes, tuples/lists/dicts of them, frozen dataclasses, functions and partials "
        f"are keyed by value. Fix: pass an array, one of those, or give the class a "
        f"__nablax_key__(self) -> str method"
    )


def _function_key(fn: types.FunctionType, path: str, seen: set[int]) -> str:
    cells = []
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # empty cell (not yet assigned)
            cells.append(f"{name}=<empty>")
            continue
        cells.append(f"{name}={_leaf_key(value, f'{path}<closure {name}>', seen)}")
    defaults = static_key(fn.__defaults__ or (), path, seen)
    kwdefaults = static_key(fn.__kwdefaults__ or {}, path, seen)
    return (
        f"fn:{fn.__module__}.{fn.__qualname__}:{_code_key(fn.__code__, seen)}:"
        f"{defaults}:{kwdefaults}:[{';'.join(cells)}]"
    )


def _leaf_key(x: Any, path: str, seen: set[int]) -> str:
    if _is_array(x) and not isinstance(x, np.generic):
        return "array:" + array_desc(x)
    return static_key(x, path, seen)


def _mesh_key(mesh: Any) -> str:
    if mesh is None:
        return "none"
    shape = getattr(mesh, "shape", None)
    if isinstance(shape, Mapping):
        return "mesh(" + ",".join(f"{k}={v}" for k, v in shape.items()) + ")"
    return static_key(tuple(shape) if shape is not None else repr(type(mesh)), "mesh")


@dataclasses.dataclass(frozen=True, eq=False)
class Invocation:
    """One call of a kernel: the (versioned) op id, the prepared arguments and the call options.

    ``op_id`` is the versioned id (``"matmul@v1"``); an unversioned id equal to the kernel's
    ``op_id`` (how ejKernel code builds invocations) is accepted by ``ConfigSelectorChain``, which
    adds the kernel's version. ``override_cfg`` is an explicit ``cfg=``, used for this call only.
    ``method="shard_map"`` with ``mesh`` / ``in_specs`` / ``out_specs`` runs the kernel per shard.

    Keyword-only, as in ejKernel: ``batch_axes`` (a mapping from argument name to its batch axis,
    part of the call key when given), ``stamp`` (the executor's ``stamp=``: True, False or a mode
    ``"hash"`` / ``"json"`` / ``"none"``; not part of the call key) and ``check_vma`` (passed to
    ``jax.shard_map``; None keeps JAX's default).

    >>> import jax.numpy as jnp
    >>> from nablax.kernels import Invocation
    >>> inv = Invocation("scale", (jnp.ones(3),), {}, batch_axes={"x": 0}, stamp=False)
    >>> inv.versioned_op_id, inv.batch_axes, inv.stamp, inv.override_cfg
    ('scale@v1', {'x': 0}, False, None)
    >>> plain = Invocation("scale", (jnp.ones(3),), {})
    >>> inv.call_key == plain.call_key  # batch_axes is part of the key, stamp is not
    False
    """

    op_id: str
    args: tuple
    kwargs: dict
    override_cfg: Any = None
    method: str | None = None
    mesh: Any = None
    in_specs: Any = None
    out_specs: Any = None
    batch_axes: Any = dataclasses.field(default=None, kw_only=True)
    stamp: bool | str = dataclasses.field(default=True, kw_only=True)
    check_vma: bool | None = dataclasses.field(default=None, kw_only=True)

    @property
    def versioned_op_id(self) -> str:
        """``op_id`` with its version: ``op_id`` itself when it names one (``"matmul@v1"``, what
        the executor builds), else ``op_id`` at nablax's default version 1 (the chain uses the
        kernel's own version for such invocations)."""
        return self.op_id if "@v" in self.op_id else f"{self.op_id}@v1"

    @functools.cached_property
    def _parts(self) -> tuple[str, str]:
        leaves, treedef = jax.tree_util.tree_flatten_with_path((self.args, self.kwargs))
        keys, desc = [], []
        seen: set[int] = set()
        for kp, leaf in leaves:
            path = _path_str(kp)
            if _is_array(leaf) and not isinstance(leaf, np.generic):
                keys.append(f"{path}=array:{array_desc(leaf)}")
                desc.append(f"{path}={array_desc(leaf)}")
            else:
                keys.append(f"{path}={static_key(leaf, path, seen)}")
                desc.append(f"{path}={leaf!r}"[:60])
        ctx = ""
        if self.method is not None:
            ctx = (
                f"|method={self.method}|mesh={_mesh_key(self.mesh)}|"
                f"in={static_key(_spec_key(self.in_specs), 'in_specs')}|"
                f"out={static_key(_spec_key(self.out_specs), 'out_specs')}"
            )
        if self.batch_axes is not None:
            ctx += f"|batch_axes={static_key(self.batch_axes, 'batch_axes')}"
        text = f"{self.op_id}|{_treedef_key(treedef)}|{';'.join(keys)}{ctx}"
        return hashlib.sha256(text.encode()).hexdigest()[:40], ", ".join(desc)

    @property
    def call_key(self) -> str:
        """Stable hex key (40 characters) of this call; see the module docstring."""
        return self._parts[0]

    @property
    def signature(self) -> str:
        """Human-readable shapes/dtypes and static values (for messages and ``nablax cache``)."""
        return self._parts[1]


def _path_str(kp: tuple) -> str:
    # (args, kwargs) is the root: render args[0], kwargs['causal'], ...
    head = ("args", "kwargs")[kp[0].idx] if kp else ""
    return head + jax.tree_util.keystr(kp[1:])


def _treedef_key(treedef: Any) -> str:
    # the treedef's str names node types by class name only (no addresses)
    return str(treedef)


def _spec_key(specs: Any) -> Any:
    """Specs (PartitionSpecs, nablax ShardingSpecs, tuples of them) as plain nested tuples."""
    if specs is None or isinstance(specs, (str, int)):
        return specs
    if isinstance(specs, (tuple, list)) and not type(specs).__name__ == "PartitionSpec":
        return tuple(_spec_key(s) for s in specs)
    if isinstance(specs, Mapping):
        return {k: _spec_key(v) for k, v in specs.items()}
    return f"{type(specs).__name__}{tuple(specs) if hasattr(specs, '__iter__') else repr(specs)}"

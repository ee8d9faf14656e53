"""Build the JAX callable of one kernel call with a fixed config.

``CallSpec`` splits a call's ``(args, kwargs)`` into array leaves (the callable's inputs) and static
leaves (closed over), and builds from the kernel's hooks:

- ``forward(*arrays)``: ``run`` with a custom VJP (``fwd_with_residuals`` / ``vjp``; array leaves
  only, static leaves closed over, ``None`` gradients allowed, keyword arrays handled), named by
  the profile stamp (an inner ``jax.jit`` whose name, ``<stamp_prefix>_<op>_v<version>_<hash>``,
  shows in lowered HLO and profiles; the call's ``stamp=`` picks the mode, else
  ``NABLAX_OPS_STAMP``), wrapped in ``jax.shard_map`` (with the call's ``check_vma``) for
  ``method="shard_map"``;
- ``tune_fn(*arrays)``: ``run`` alone (shard-mapped for ``method="shard_map"``), what the tuner
  times;
- ``plain(*arrays)``, ``with_residuals(*arrays)`` and ``backward(arrays, res, y, dy)``: the pieces
  the nablax graph node lowers to (nablax differentiates its own graph).

A spec is hashable by value (kernel identity, config, structure, static key), so it can be a
graph-node parameter and a cache key.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from .. import _config
from .invocation import Invocation, _is_array, static_key
from .kernel import version_tag
from .store.fingerprint import get_device_platform


class CallSpec:
    """A kernel call's structure and config (see the module docstring)."""

    __slots__ = (
        "kernel", "cfg", "treedef", "template", "array_pos", "n_pos", "static_key", "method",
        "mesh", "in_specs", "out_specs", "platform", "call_key", "_hash", "_fns", "stamp",
        "prefix", "check_vma",
    )  # fmt: skip

    def __init__(
        self,
        kernel: Any,
        inv: Invocation,
        cfg: Any,
        call_key: str | None = None,
        stamp_prefix: str = "nablax_kernel",
    ):
        leaves, self.treedef = jax.tree_util.tree_flatten((inv.args, inv.kwargs))
        self.array_pos = tuple(
            i for i, x in enumerate(leaves) if _is_array(x) and not isinstance(x, np.generic)
        )
        arrays = set(self.array_pos)
        self.template = tuple(None if i in arrays else x for i, x in enumerate(leaves))
        self.static_key = static_key(
            tuple(x for i, x in enumerate(leaves) if i not in arrays), "static"
        )
        self.kernel, self.cfg, self.n_pos = kernel, cfg, len(inv.args)
        self.method, self.mesh = inv.method, _jax_mesh(inv.mesh)
        self.in_specs, self.out_specs = inv.in_specs, inv.out_specs
        self.platform = get_device_platform()
        self.call_key = call_key if call_key is not None else inv.call_key
        self.stamp, self.prefix = stamp_mode(inv.stamp), stamp_prefix
        self.check_vma = inv.check_vma if self.method == "shard_map" else None
        self._hash = hash((id(kernel), cfg, self.treedef, self.static_key, self.method))
        self._fns: dict[str, Any] = {}

    # -- value semantics (graph-node parameter) ---------------------------------------------------
    def _ident(self) -> tuple:
        return (
            self.cfg, self.treedef, self.static_key, self.method, self.call_key, self.stamp,
            self.prefix, self.check_vma,
        )  # fmt: skip

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, CallSpec)
            and other.kernel is self.kernel
            and other._ident() == self._ident()
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"CallSpec({self.kernel.versioned_id}, {self.cfg})"

    # -- argument plumbing ------------------------------------------------------------------------
    def rebuild(self, arrays: tuple | list) -> tuple[tuple, dict]:
        leaves = list(self.template)
        for i, a in zip(self.array_pos, arrays):
            leaves[i] = a
        return jax.tree_util.tree_unflatten(self.treedef, leaves)

    def _hook(self, name: str):
        return self.kernel.hook(name, self.platform, self.method == "shard_map")

    # -- the pieces -------------------------------------------------------------------------------
    def plain(self, *arrays):
        args, kw = self.rebuild(arrays)
        return self._hook("run")(*args, cfg=self.cfg, **kw)

    def with_residuals(self, *arrays):
        args, kw = self.rebuild(arrays)
        return self._hook("fwd_with_residuals")(*args, cfg=self.cfg, **kw)

    def backward(self, arrays, res, y, dy) -> list:
        """Cotangent per array leaf (None for zero) from the kernel's ``vjp``."""
        args, kw = self.rebuild(arrays)
        grads = self._hook("vjp")(res, y, dy, *args, cfg=self.cfg, **kw)
        return self._grads_per_leaf(grads, args, kw, arrays)

    def _grads_per_leaf(self, grads, args, kw, arrays) -> list:
        name = f"{self.kernel.versioned_id} ({type(self.kernel).__name__}.vjp)"
        n = self.n_pos
        kw_grads = {}
        if isinstance(grads, (tuple, list)) and len(grads) == n + 1 and isinstance(grads[-1], dict):
            grads, kw_grads = tuple(grads[:-1]), grads[-1]
        if not isinstance(grads, (tuple, list)) or len(grads) != n:
            got = len(grads) if isinstance(grads, (tuple, list)) else type(grads).__name__
            raise TypeError(
                f"nablax.kernels: {name} returned {got} gradient(s); expected a tuple of {n}, one "
                f"per positional argument (None for no gradient), optionally followed by a dict of "
                f"keyword-argument gradients"
            )
        per_arg = []
        for i, (g, a) in enumerate(zip(grads, args)):
            per_arg.append(_up_to(g, a, f"args[{i}]", name))
        per_kw = {k: _up_to(kw_grads.get(k), v, f"kwargs[{k!r}]", name) for k, v in kw.items()}
        flat = jax.tree_util.tree_leaves(
            (tuple(per_arg), per_kw), is_leaf=lambda x: isinstance(x, _Slot)
        )
        out = []
        for i, a in zip(self.array_pos, arrays):
            g = flat[i].value
            if g is not None:
                g = jnp.asarray(g)
                if tuple(g.shape) != tuple(a.shape):
                    raise ValueError(
                        f"nablax.kernels: {name} returned a gradient of shape {tuple(g.shape)} "
                        f"for {flat[i].path}, which has shape {tuple(a.shape)}"
                    )
                if g.dtype != a.dtype:
                    g = g.astype(a.dtype)
            out.append(g)
        return out

    # -- the jax callable -------------------------------------------------------------------------
    def forward(self):
        """``f(*arrays) -> output`` with the custom VJP, the stamp and shard_map applied."""
        fn = self._fns.get("forward")
        if fn is None:
            fn = self._fns["forward"] = self._build_forward()
        return fn

    def jitted(self):
        """``jax.jit`` of :meth:`forward` (the executor's call on concrete arrays)."""
        fn = self._fns.get("jitted")
        if fn is None:
            fn = self._fns["jitted"] = jax.jit(self.forward())
        return fn

    def tune_fn(self):
        """``run`` alone with this config (shard-mapped for ``method="shard_map"``, so collectives
        in ``run_shard_map`` find their mesh axes): what the tuner compiles and times."""
        fn = self._fns.get("tune")
        if fn is None:
            fn = self.plain if self.method != "shard_map" else self._shard_mapped(self.plain)
            self._fns["tune"] = fn
        return fn

    def _build_forward(self):
        @jax.custom_vjp
        def call(*arrays):
            return self.plain(*arrays)

        def fwd(*arrays):
            y, res = self.with_residuals(*arrays)
            return y, (res, y, arrays)

        def bwd(saved, dy):
            res, y, arrays = saved
            return tuple(self.backward(arrays, res, y, dy))

        call.defvjp(fwd, bwd)
        body = _stamped(call, self)
        if self.method == "shard_map":
            body = self._shard_mapped(body)
        return body

    def _shard_mapped(self, body):
        from jax.sharding import PartitionSpec as P

        if self.mesh is None:
            raise ValueError(
                f"nablax.kernels.Executor: method='shard_map' for {self.kernel.versioned_id} "
                f"needs mesh= (a jax Mesh or nx.DeviceMesh)"
            )
        # in_specs is a prefix of the positional arguments (as jax.shard_map's); array leaves of
        # keyword arguments are replicated
        n_kw_arrays = len(self.array_pos) - _count_arrays(self.treedef, self.template, self.n_pos)
        pos_specs = _leaf_specs(self.in_specs, self, "in_specs")
        specs = tuple(pos_specs) + (P(),) * n_kw_arrays
        out_specs = _to_pspec(self.out_specs) if self.out_specs is not None else P()
        extra = {} if self.check_vma is None else {"check_vma": bool(self.check_vma)}
        return jax.shard_map(body, mesh=self.mesh, in_specs=specs, out_specs=out_specs, **extra)

    def stamp_name(self) -> str:
        digest = hashlib.sha256(f"{self.call_key}|{self.cfg!r}".encode()).hexdigest()[:10]
        op = re.sub(r"[^0-9A-Za-z_]", "_", self.kernel.op_id)
        version = re.sub(r"[^0-9A-Za-z_]", "_", version_tag(self.kernel))
        return f"{self.prefix}_{op}_v{version}_{digest}"

    def stamp_json(self) -> str:
        return json.dumps(
            {
                "op": self.kernel.versioned_id,
                "call_key": self.call_key,
                "cfg": repr(self.cfg),
                "impl": self._hook("run").__name__,
            },
            sort_keys=True,
        )


class _Slot:
    __slots__ = ("value", "path")

    def __init__(self, value, path):
        self.value, self.path = value, path


def _up_to(g: Any, arg: Any, path: str, name: str) -> Any:
    """``g`` shaped like ``arg`` with each leaf wrapped in a _Slot (None gradients spread)."""
    with_path, treedef = jax.tree_util.tree_flatten_with_path(arg)
    paths = [path + jax.tree_util.keystr(kp) for kp, _ in with_path]
    if g is None:
        vals = [None] * len(paths)
    else:
        try:
            vals = treedef.flatten_up_to(g)
        except (ValueError, TypeError) as e:
            raise TypeError(
                f"nablax.kernels: {name} returned a gradient for {path} whose structure does not "
                f"match the argument ({treedef}): {e}"
            ) from None
    return jax.tree_util.tree_unflatten(treedef, [_Slot(v, p) for v, p in zip(vals, paths)])


STAMP_MODES = ("hash", "json", "none")


def stamp_mode(stamp: Any, where: str = "Executor") -> str | None:
    """The stamp mode of a call's ``stamp=``: True (or None) → None (``NABLAX_OPS_STAMP`` decides),
    False → ``"none"``, a mode string → itself."""
    if stamp is True or stamp is None:
        return None
    if stamp is False:
        return "none"
    if isinstance(stamp, str) and stamp.lower() in STAMP_MODES:
        return stamp.lower()
    raise ValueError(
        f"nablax.kernels.{where}: stamp= must be True (name the call as NABLAX_OPS_STAMP says), "
        f"False (no name) or one of {STAMP_MODES}, got {stamp!r}. Fix: e.g. stamp=False or "
        f"stamp='json'"
    )


def _stamped(fn, spec: CallSpec):
    mode = spec.stamp if spec.stamp is not None else _config.get("ops_stamp")
    if mode == "none":
        return fn
    text = spec.stamp_json() if mode == "json" else None

    def body(*arrays):
        if text is None:
            return fn(*arrays)
        with jax.named_scope(text):
            return fn(*arrays)

    body.__name__ = body.__qualname__ = spec.stamp_name()
    return jax.jit(body)


def _count_arrays(treedef, template, n_pos) -> int:
    args, _ = jax.tree_util.tree_unflatten(treedef, list(range(len(template))))
    idx = jax.tree_util.tree_leaves(args)
    return sum(1 for i in idx if template[i] is None)


def _leaf_specs(specs, spec: CallSpec, what: str) -> list:
    """One PartitionSpec per array leaf of the positional arguments (``specs`` is a prefix)."""
    from jax.sharding import PartitionSpec as P

    args, _ = jax.tree_util.tree_unflatten(spec.treedef, list(range(len(spec.template))))
    if specs is None:
        specs = tuple(P() for _ in args)
    if not isinstance(specs, (tuple, list)) or len(specs) != len(args):
        raise ValueError(
            f"nablax.kernels.Executor: {what} for {spec.kernel.versioned_id} must have one spec "
            f"per positional argument ({len(args)}), got {specs!r}"
        )
    out = []
    for s, a in zip(specs, args):
        for i in jax.tree_util.tree_leaves(a):
            if spec.template[i] is None:
                out.append(_to_pspec(s))
    return out


def _to_pspec(s: Any):
    from jax.sharding import PartitionSpec as P

    if s is None:
        return P()
    if isinstance(s, P):
        return s
    if hasattr(s, "partition_spec"):  # nx.ShardingSpec
        return s.partition_spec()
    if isinstance(s, (tuple, list)):
        return type(s)(_to_pspec(x) for x in s)
    raise TypeError(f"nablax.kernels.Executor: can't use {s!r} as a shard_map spec")


def _jax_mesh(mesh: Any):
    return getattr(mesh, "jax_mesh", mesh)

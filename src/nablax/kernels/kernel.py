"""The ``Kernel`` base class and the most-specific-first dispatch of its hooks.

A kernel is one heavy operation with several implementations and a tunable, frozen, hashable
config. Subclasses override ``run`` (and optionally ``heuristic_cfg``, ``candidate_cfgs``,
``prepare``, ``fwd_with_residuals``, ``vjp``). Any of those hooks may also be written for one
platform or context by adding a suffix: ``run_gpu``, ``run_cpu``, ``run_tpu``, ``run_shard_map``,
``run_shard_map_gpu`` (likewise ``vjp_gpu``, ``candidate_cfgs_shard_map``, ...). The executor calls
the most specific one that exists: ``<hook>_shard_map_<platform>`` → ``<hook>_shard_map`` →
``<hook>_<platform>`` → ``<hook>``, where the ``shard_map`` forms are only considered for
``method="shard_map"`` calls.

>>> import dataclasses, jax.numpy as jnp
>>> from nablax.kernels import Kernel
>>> @dataclasses.dataclass(frozen=True)
... class ScaleCfg:
...     unroll: int = 1
>>> class Scale(Kernel):
...     def run(self, x, *, cfg, factor=2.0):
...         return x * factor
...     def heuristic_cfg(self, inv):
...         return ScaleCfg()
>>> k = Scale("scale")
>>> k.versioned_id
'scale@v1'
>>> class SeedStyle(Scale):       # ejKernel's spelling: a string version, op_id as a class attribute
...     op_id = "seed_scale"
...     version = "2"
>>> SeedStyle().versioned_id
'seed_scale@v2'
>>> k.hook("run", "cpu")(jnp.ones(2), cfg=ScaleCfg()).tolist()
[2.0, 2.0]
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import jax
import numpy as np

if TYPE_CHECKING:
    from .invocation import Invocation

Cfg = TypeVar("Cfg")
Out = TypeVar("Out")

HOOKS = ("run", "heuristic_cfg", "candidate_cfgs", "fwd_with_residuals", "vjp")
PLATFORMS = ("cpu", "gpu", "tpu")


class Kernel(Generic[Cfg, Out]):
    """Base class of tunable kernels (see the module docstring).

    ``op_id`` names the operation (``"matmul"``): the constructor's argument, else a class
    attribute ``op_id``, else ``"<module>.<ClassName>"`` (as in ejKernel). ``version`` (a class
    attribute, default 1) is bumped when an implementation changes in a way that makes stored
    configs or timings stale: caches key on the versioned id ``"matmul@v1"``. It may be an int
    (``version = 1``) or ejKernel's string spelling (``version = "1"``); both give ``@v1``, and a
    non-numeric tag such as ``"2b"`` is kept as written (``@v2b``).
    """

    version: int | str = 1

    def __init__(self, op_id: str | None = None) -> None:
        if op_id is None:
            declared = getattr(type(self), "op_id", None)
            op_id = declared if isinstance(declared, str) else _default_op_id(type(self))
        if not isinstance(op_id, str) or not op_id or "@" in op_id or op_id.strip() != op_id:
            raise ValueError(
                f"nablax.kernels.Kernel: op_id must be a non-empty string without '@' or "
                f"surrounding spaces, got {op_id!r}. Fix: pass a name such as "
                f"{type(self).__name__}('my_op')"
            )
        version_tag(self)  # validates the class's version now, not at the first call
        self.op_id = op_id
        self._hooks: dict[tuple[str, str, bool], Callable] = {}

    @property
    def versioned_id(self) -> str:
        """``"<op_id>@v<version>"``: the id caches and stamps use."""
        return f"{self.op_id}@v{version_tag(self)}"

    # -- hooks (defaults) -------------------------------------------------------------------------
    def run(self, *args: Any, cfg: Cfg, **kw: Any) -> Out:
        """Compute the output with config ``cfg``; must be traceable by ``jax.jit``."""
        raise NotImplementedError(
            f"nablax.kernels: kernel {self.versioned_id} ({type(self).__name__}) defines no run "
            f"method; override run(self, *args, cfg, **kw)"
        )

    def heuristic_cfg(self, inv: Invocation) -> Cfg | None:
        """A good-enough config for ``inv`` without measuring, or None when there is none."""
        return None

    def candidate_cfgs(self, inv: Invocation) -> Sequence[Cfg]:
        """Configs the autotuner may time for ``inv`` (empty: this kernel cannot be tuned)."""
        return ()

    def prepare(self, *args: Any, **kw: Any) -> tuple[tuple, dict]:
        """Normalize the arguments before a config is chosen (e.g. cast, reshape, fill defaults).
        Returns ``(args, kwargs)``."""
        return args, kw

    def fwd_with_residuals(self, *args: Any, cfg: Cfg, **kw: Any) -> tuple[Out, Any]:
        """Output and the residuals ``vjp`` needs (a pytree of arrays). Default: no residuals."""
        return self.hook("run", _platform_of_default())(*args, cfg=cfg, **kw), None

    def vjp(self, res: Any, y: Out, dy: Out, *args: Any, cfg: Cfg, **kw: Any) -> tuple:
        """One gradient per positional argument (a pytree like it, or None for zero).

        The default differentiates ``run`` with ``jax.vjp`` (recomputing the forward pass) with
        respect to the floating-point array leaves of the positional arguments.
        """
        return default_vjp(self, dy, args, kw, cfg)

    # -- dispatch -------------------------------------------------------------------------------
    def hook(self, name: str, platform: str, shard_map: bool = False) -> Callable:
        """The most specific implementation of hook ``name`` for ``platform`` and context."""
        key = (name, platform, shard_map)
        hooks = self.__dict__.setdefault("_hooks", {})  # a subclass may skip Kernel.__init__
        fn = hooks.get(key)
        if fn is None:
            fn = hooks[key] = self._resolve(name, platform, shard_map)
        return fn

    def hook_name(self, name: str, platform: str, shard_map: bool = False) -> str:
        """Which method ``hook`` picks (for messages, stamps and tests)."""
        return self.hook(name, platform, shard_map).__name__

    def _resolve(self, name: str, platform: str, shard_map: bool) -> Callable:
        if name not in HOOKS:
            raise ValueError(f"nablax.kernels: unknown hook {name!r}; hooks are {HOOKS}")
        names = [f"{name}_shard_map_{platform}", f"{name}_shard_map"] if shard_map else []
        names += [f"{name}_{platform}", name]
        for n in names:
            fn = getattr(self, n, None)
            if callable(fn):
                return fn
        raise AssertionError(f"base Kernel defines {name}")  # pragma: no cover

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.versioned_id!r})"


_VERSION_TEXT = re.compile(r"[0-9A-Za-z][0-9A-Za-z._-]*")


def version_tag(kernel: Any) -> str:
    """The text after ``@v`` in a kernel's versioned id: an int (or a string of digits, ejKernel's
    spelling) gives its decimal value, so ``1`` and ``"1"`` both give ``"1"``; other strings of
    letters, digits, ``.``, ``_`` and ``-`` are kept as written."""
    v = getattr(kernel, "version", 1)
    if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
        return str(v)
    if isinstance(v, str) and v.strip().isdigit():
        return str(int(v.strip()))
    if isinstance(v, str) and _VERSION_TEXT.fullmatch(v):
        return v
    raise ValueError(
        f"nablax.kernels.Kernel: {type(kernel).__name__}.version must be an int >= 0 or a "
        f"version string of letters, digits, '.', '_' or '-' (such as \"1\" or \"2.1\"), got "
        f'{v!r}. Fix: declare e.g. version = 1 (or version = "1") on the class'
    )


def _default_op_id(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}".replace("<locals>.", "")


def _platform_of_default() -> str:
    from .store.fingerprint import get_device_platform

    return get_device_platform()


def _is_float_array(x: Any) -> bool:
    dt = getattr(x, "dtype", None)
    return hasattr(x, "shape") and dt is not None and jax.numpy.issubdtype(np.dtype(dt), np.inexact)


def default_vjp(kernel: Kernel, dy: Any, args: tuple, kw: dict, cfg: Any) -> tuple:
    """Gradients of ``kernel.run`` by ``jax.vjp`` over the float array leaves of ``args``."""
    run = kernel.hook("run", _platform_of_default())
    leaves, treedef = jax.tree_util.tree_flatten(args)
    diff = [i for i, x in enumerate(leaves) if _is_float_array(x)]

    def f(*dleaves):
        full = list(leaves)
        for i, v in zip(diff, dleaves):
            full[i] = v
        return run(*jax.tree_util.tree_unflatten(treedef, full), cfg=cfg, **kw)

    _, pullback = jax.vjp(f, *[leaves[i] for i in diff])
    grads = pullback(dy)
    full: list[Any] = [None] * len(leaves)
    for i, g in zip(diff, grads):
        full[i] = g
    per_leaf = jax.tree_util.tree_unflatten(treedef, full)
    return tuple(per_leaf)


def check_cfg(kernel: Kernel, cfg: Any, where: str) -> None:
    """Configs must be frozen dataclasses (hashable, comparable, storable)."""
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        raise TypeError(
            f"nablax.kernels: {where} for {kernel.versioned_id} returned a {type(cfg).__name__}; "
            f"configs must be frozen dataclass instances (@dataclasses.dataclass(frozen=True))"
        )
    if not type(cfg).__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"nablax.kernels: config class {type(cfg).__qualname__} of {kernel.versioned_id} "
            f"is not frozen; declare it with @dataclasses.dataclass(frozen=True)"
        )

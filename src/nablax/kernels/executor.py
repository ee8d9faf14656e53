"""``Executor``: prepare → choose a config → dispatch → custom VJP → stamp → record.

``Executor(chooser, stamp_prefix="nablax_kernel")(kernel, *args, cfg=None, method=None,
mesh=None, in_specs=None, out_specs=None, stamp=True, check_vma=None, **kw)`` runs one kernel
call (ejKernel's keywords are accepted: ``_cfg=`` is ``cfg=``; ``stamp=`` and ``check_vma=`` as
below; any other keyword goes to the kernel):

1. ``kernel.prepare(*args, **kw)`` normalizes the arguments;
2. the chooser (a :class:`~.selection.ConfigSelectorChain`) picks the config;
3. the most specific ``run`` for the platform and context is called through a ``jax.custom_vjp``
   built from the kernel's ``fwd_with_residuals`` / ``vjp`` (see ``_call.py``), inside an inner
   ``jax.jit`` named by the profile stamp (``<stamp_prefix>_<op>_v<version>_<hash>``; the
   mode is ``NABLAX_OPS_STAMP``'s unless this call's ``stamp=`` says otherwise: False or
   ``"none"`` for no name, ``"hash"``, ``"json"``), under ``jax.shard_map`` for
   ``method="shard_map"`` (``check_vma=`` is passed to it; None keeps JAX's default);
4. with ``NABLAX_OPS_RECORD=1`` the invocation's abstract signature is recorded once per process
   in the persistent database.

``jax.Array`` arguments give ``jax.Array`` results (a jitted call outside tracing; an inlined one
under ``jax.jit``/``jax.grad``/``jax.vmap``); nablax Tensor arguments give lazy Tensors (one graph
node, differentiable by ``nx.grad`` through the kernel's ``vjp``). Repeated calls with the same
shapes take a fast path: a memo from the call's shape signature to its call key and compiled
function, checked against the memory cache, so the overhead over calling the jitted kernel
directly is a few microseconds.

>>> import dataclasses, jax.numpy as jnp
>>> from nablax.kernels import Kernel, Executor, ConfigSelectorChain, AutotunePolicy
>>> @dataclasses.dataclass(frozen=True)
... class Cfg:
...     scale: float = 2.0
>>> class Scale(Kernel):
...     def run(self, x, *, cfg):
...         return x * cfg.scale
...     def heuristic_cfg(self, inv):
...         return Cfg()
>>> ex = Executor(ConfigSelectorChain(policy=AutotunePolicy(allow_autotune=False),
...                                   persistent=False))
>>> ex(Scale("scale"), jnp.ones(3)).tolist()
[2.0, 2.0, 2.0]
>>> ex(Scale("scale"), jnp.ones(3), cfg=Cfg(3.0)).tolist()
[3.0, 3.0, 3.0]
>>> ex(Scale("scale"), jnp.ones(3), _cfg=Cfg(4.0), stamp=False).tolist()  # ejKernel's spelling
[4.0, 4.0, 4.0]
"""

from __future__ import annotations

import json
import re
import threading
import weakref
from collections.abc import Hashable
from typing import Any

import jax
import numpy as np
from jax.core import Tracer

from .. import _caches, _config
from . import tuner as _tuner
from ._call import CallSpec, stamp_mode
from .invocation import Invocation, _is_array, array_desc
from .kernel import Kernel
from .selection import Choice, ConfigSelectorChain, _overlays

_SIMPLE_STATIC = (bool, int, float, str, type(None))
_PREFIX = re.compile(r"[A-Za-z_][0-9A-Za-z_]*")
_MEMO_SIZE = 4096
_LIVE: weakref.WeakSet = weakref.WeakSet()  # every live Executor (nx.cache_info, clear_caches)


def _memo_limit() -> int:
    # a spec holds its compiled programs: bounded like the realization cache (option
    # max_executables), so a process calling many shapes keeps its memory
    return min(_MEMO_SIZE, max(1, _config.get("max_executables")))


_CONCRETE: tuple = (np.ndarray,)  # the common leaf types, matched exactly (+ jax's, at first use)


class Executor:
    """Runs kernels with chosen configs (see the module docstring).

    ``chooser``: a :class:`ConfigSelectorChain` (default: a new one), or any object with
    ejKernel's ``choose(inv, kernel) -> cfg`` (asked on every call, nothing memoized).
    ``stamp_prefix``: the first part of the name calls get in lowered HLO and profiles.
    """

    def __init__(
        self, chooser: ConfigSelectorChain | Any = None, stamp_prefix: str = "nablax_kernel"
    ) -> None:
        global _CONCRETE
        if len(_CONCRETE) == 1:
            _CONCRETE = (type(jax.numpy.zeros(())), np.ndarray)
        self.chooser = chooser if chooser is not None else ConfigSelectorChain()
        if not callable(getattr(self.chooser, "choose", None)):
            raise TypeError(
                f"nablax.kernels.Executor: chooser must be a ConfigSelectorChain or have a "
                f"choose(inv, kernel) method, got {type(self.chooser).__name__}. Fix: "
                f"Executor(ConfigSelectorChain(...))"
            )
        if not isinstance(stamp_prefix, str) or not _PREFIX.fullmatch(stamp_prefix):
            raise ValueError(
                f"nablax.kernels.Executor: stamp_prefix must be a name of letters, digits and "
                f"'_' (it starts function names in lowered HLO), got {stamp_prefix!r}. Fix: e.g. "
                f"stamp_prefix='my_ops'"
            )
        self.stamp_prefix = stamp_prefix
        self._chain = isinstance(self.chooser, ConfigSelectorChain)
        # shape signature -> (spec, generation, policy), and (kernel id, call_key, cfg, ...) ->
        # CallSpec: LRU caches bounded by the option max_executables
        self._memo = _caches.Cache("kernels.executor.calls", _memo_limit, register=False)
        self._specs = _caches.Cache("kernels.executor.specs", _memo_limit, register=False)
        # (op, call key) pairs recorded (NABLAX_OPS_RECORD=1) by this executor
        self._recorded = _caches.Cache("kernels.executor.recorded", _MEMO_SIZE, register=False)
        # (kernel id, caller's key, differentiated) -> (kernel, spec, generation, policy, the
        # call's _known_sig): calls through call_known
        self._known = _caches.Cache("kernels.executor.known", _memo_limit, register=False)
        _LIVE.add(self)

    def __call__(
        self,
        kernel: Kernel,
        *args: Any,
        cfg: Any = None,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        stamp: bool | str = True,
        check_vma: bool | None = None,
        **kw: Any,
    ) -> Any:
        if "_cfg" in kw:
            cfg = _cfg_alias(cfg, kw, "Executor")
        _check_call(kernel, method, check_vma, "Executor")
        spec, kind, leaves, _ = self._resolve(
            kernel, args, kw, cfg, method, mesh, in_specs, out_specs, stamp, check_vma
        )
        if kind == _TENSORS:
            return _tensor_call(spec, leaves)
        arrays = [leaves[i] for i in spec.array_pos]
        if kind == _TRACERS:
            return spec.forward()(*arrays)
        return spec.jitted()(*arrays)

    def call_known(self, kernel: Kernel, key: Hashable, *args: Any, **kw: Any) -> Any:
        """``self(kernel, *args, **kw)`` for a caller that knows that ``key`` (hashable) fixes
        everything about the call but the identity of its lazy tensor arguments: their shapes
        and dtypes and the keywords, so that ``kernel.prepare`` returns the same arguments and
        keywords and the call has the same signature. A repeated call then skips preparing,
        flattening and signing the arguments (nn's ``scaled_dot_product_attention`` calls this
        in every transformer block). Sound by construction: the memo holds the spec the full
        path chose, under the same conditions as the call memo (no overlay or recording active,
        the memory cache and policy unchanged, differentiation state in the key), and only for
        calls whose prepared arguments are the tensors given, in order; any other call takes
        the full path. A hit also compares the arguments' shapes and dtypes and the keywords
        with the stored call's, so a ``key`` that misses something costs misses, never a wrong
        node.

        >>> import nablax as nx
        >>> from nablax.kernels import library, default_executor
        >>> a, b = nx.ones((4, 8)), nx.ones((8, 2))
        >>> key = ("matmul", a.shape, b.shape, a.dtype, b.dtype)  # all the call depends on
        >>> [default_executor().call_known(library.MATMUL, key, a, b).sum().item() for _ in "ab"]
        [64.0, 64.0]
        """
        pred = _tuner._tensor_differentiated
        diff = bool(
            pred is not None and getattr(kernel, "tune_grad", False) and any(map(pred, args))
        )
        fkey = (id(kernel), key, diff)
        chooser = self.chooser
        hit = self._known.get(fkey) if self._chain else None
        if (
            hit is not None and hit[0] is kernel
            and hit[2] == chooser.cache.generation and hit[3] is chooser.policy
            and not _overlays.get() and not _config.get("ops_record")
            and hit[4] == _known_sig(args, kw)  # a key that misses something: a miss, never wrong
        ):  # fmt: skip
            return _tensor_call(hit[1], list(args))
        _check_call(kernel, None, None, "Executor")
        spec, kind, leaves, sig = self._resolve(
            kernel, args, kw, None, None, None, None, None, True, None
        )
        if kind != _TENSORS:
            raise TypeError(
                f"nablax.kernels.Executor.call_known: {kernel.versioned_id} takes lazy nablax "
                f"Tensors here, got {[type(a).__name__ for a in args]}. Fix: call the executor "
                f"itself"
            )
        memo = None if sig is None else self._memo.peek(sig)
        n = len(args)
        if (
            memo is not None and memo[0] is spec
            and all(leaves[i] is args[i] for i in range(n))
            and all(i < n for i in spec.array_pos)
        ):  # fmt: skip
            self._known.put(fkey, (kernel, spec, memo[1], memo[2], _known_sig(args, kw)))
        return _tensor_call(spec, leaves)

    def _resolve(
        self,
        kernel: Kernel,
        args: tuple,
        kw: dict,
        cfg: Any,
        method: str | None,
        mesh: Any,
        in_specs: Any,
        out_specs: Any,
        stamp: bool | str,
        check_vma: bool | None,
    ) -> tuple[CallSpec, int, list, tuple | None]:
        """``(spec, kind, leaves, sig)`` of a call: the spec it runs, whether its arrays are
        JAX arrays, tracers or lazy tensors, the flattened prepared arguments, and the memo
        signature (None when the call is not memoizable by signature)."""
        if type(kernel).prepare is not Kernel.prepare:
            args, kw = _prepared(kernel, args, kw)
        leaves, treedef = jax.tree_util.tree_flatten((args, kw))
        sig, kind = _signature(kernel, leaves, treedef)
        if (
            sig is not None
            and getattr(kernel, "tune_grad", False)
            and _tuner.differentiated(leaves)
        ):
            # a training call of a kernel tuned on forward plus backward: its own choice
            sig = (*sig, "fwd+bwd")
        if stamp is not True:
            stamp_mode(stamp)  # a bad value is named before anything runs
            sig = None if sig is None else (*sig, "stamp", stamp)
        spec = None
        if cfg is None and method is None and sig is not None:
            spec = self._fast_spec(sig)
        if spec is None:
            inv = Invocation(
                kernel.versioned_id, args, kw, cfg, method, mesh, in_specs, out_specs,
                stamp=stamp, check_vma=check_vma,
            )  # fmt: skip
            choice = self._select(inv, kernel)
            # overlay and override choices hold for this call / scope only: never memoized
            memoize = method is None and choice.source not in ("overlay", "override", "chooser")
            memo_sig = sig if memoize else None
            spec = self._spec(kernel, inv, choice.cfg, memo_sig)
            if _config.get("ops_record"):
                self._record(kernel, inv)
        return spec, kind, leaves, sig

    def _select(self, inv: Invocation, kernel: Kernel) -> Choice:
        if self._chain:
            return self.chooser.select(inv, kernel)
        return Choice(self.chooser.choose(inv, kernel), "chooser")

    def choose_config(
        self,
        kernel: Kernel,
        *args: Any,
        cfg: Any = None,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        stamp: bool | str = True,
        check_vma: bool | None = None,
        **kw: Any,
    ) -> Any:
        """The config a call with these arguments would use, without running the kernel
        (ejKernel's ``choose_config``): prepares the arguments and asks the chooser, so a cache
        miss may autotune and store the result, exactly as the call would. Takes the call's
        keywords (``cfg=`` / ``_cfg=`` is returned as is, after checking it).

        >>> import jax.numpy as jnp
        >>> from nablax.kernels import library, default_executor
        >>> cfg = default_executor().choose_config(library.MATMUL, jnp.ones((4, 8)), jnp.ones((8, 2)))
        >>> type(cfg).__name__
        'MatmulCfg'
        """
        if "_cfg" in kw:
            cfg = _cfg_alias(cfg, kw, "Executor.choose_config")
        _check_call(kernel, method, check_vma, "Executor.choose_config")
        stamp_mode(stamp, "Executor.choose_config")
        args, kw = _prepared(kernel, args, kw)
        inv = Invocation(
            kernel.versioned_id, args, kw, cfg, method, mesh, in_specs, out_specs,
            stamp=stamp, check_vma=check_vma,
        )  # fmt: skip
        return self._select(inv, kernel).cfg

    def clear(self) -> None:
        """Forget memoized calls, which calls were recorded, and the memory cache's configs (the
        persistent one is kept)."""
        for memo in self._memos():
            memo.clear()
        cache = getattr(self.chooser, "cache", None)
        if cache is not None:
            cache.clear()

    def _memos(self) -> tuple[_caches.Cache, ...]:
        return (self._memo, self._specs, self._recorded, self._known)

    # -- fast path ---------------------------------------------------------------------------------
    def _fast_spec(self, sig: tuple) -> CallSpec | None:
        """The memoized spec of a call with this signature, while nothing it depends on changed:
        no overlay is active, the memory cache saw no put or clear, and the policy is the same."""
        memo = self._memo.get(sig)
        if memo is None or _overlays.get():
            return None
        spec, generation, policy = memo
        chooser = self.chooser
        if generation != chooser.cache.generation or policy is not chooser.policy:
            return None
        return spec

    def _spec(self, kernel: Kernel, inv: Invocation, cfg: Any, sig: tuple | None) -> CallSpec:
        call_key = inv.call_key
        skey = (id(kernel), call_key, cfg, inv.stamp, inv.check_vma)
        spec = self._specs.get(skey)
        if spec is None or spec.kernel is not kernel:
            spec = CallSpec(kernel, inv, cfg, call_key, self.stamp_prefix)
            self._specs.put(skey, spec)
        if sig is not None:
            chooser = self.chooser
            self._memo.put(sig, (spec, chooser.cache.generation, chooser.policy))
        return spec

    def _record(self, kernel: Kernel, inv: Invocation) -> None:
        rec = (kernel.versioned_id, inv.call_key)
        if rec in self._recorded:
            return
        store = getattr(self.chooser, "persistent", None)
        if store is None:
            return
        leaves = jax.tree_util.tree_leaves((inv.args, inv.kwargs))
        data: dict = {
            "signature": inv.signature,
            "leaves": [array_desc(x) if _is_array(x) else repr(x) for x in leaves],
            "method": inv.method,
        }
        # replayable by `nablax tune --recorded`: positional arrays and plain keyword values
        if all(_is_array(a) for a in inv.args) and all(
            type(v) in _SIMPLE_STATIC for v in inv.kwargs.values()
        ):
            data["shapes"] = [[list(map(int, a.shape)), np.dtype(a.dtype).name] for a in inv.args]
            data["static_kwargs"] = dict(inv.kwargs)
        store.record_invocation(kernel.versioned_id, inv.call_key, json.dumps(data))
        self._recorded.put(rec, True)

    # -- compile -----------------------------------------------------------------------------------
    def compile(
        self,
        kernel: Kernel,
        *example_args: Any,
        cfg: Any = None,
        method: str | None = None,
        mesh: Any = None,
        in_specs: Any = None,
        out_specs: Any = None,
        stamp: bool | str = True,
        check_vma: bool | None = None,
        **kw: Any,
    ):
        """A jitted function for calls shaped like ``example_args`` / ``kw``, with the config
        chosen now and fixed (its ``.cfg``). Static (non-array) arguments must equal the
        example's. Takes the call's keywords (``_cfg=`` too); the result is differentiable.

        >>> import jax.numpy as jnp
        >>> from nablax.kernels import library, default_executor
        >>> f = default_executor().compile(library.MATMUL, jnp.ones((4, 8)), jnp.ones((8, 2)))
        >>> f(jnp.ones((4, 8)), jnp.ones((8, 2))).shape
        (4, 2)
        """
        if "_cfg" in kw:
            cfg = _cfg_alias(cfg, kw, "Executor.compile")
        _check_call(kernel, method, check_vma, "Executor.compile")
        stamp_mode(stamp, "Executor.compile")
        args, kw2 = _prepared(kernel, example_args, kw)
        inv = Invocation(
            kernel.versioned_id, args, kw2, cfg, method, mesh, in_specs, out_specs,
            stamp=stamp, check_vma=check_vma,
        )  # fmt: skip
        spec = self._spec(kernel, inv, self._select(inv, kernel).cfg, None)
        jitted = jax.jit(spec.forward())
        want = spec.static_key

        def compiled(*call_args: Any, **call_kw: Any) -> Any:
            a, k = _prepared(kernel, call_args, call_kw)
            leaves, treedef = jax.tree_util.tree_flatten((a, k))
            if treedef != spec.treedef or _static_key(leaves, spec) != want:
                raise ValueError(
                    f"nablax.kernels.Executor.compile: {kernel.versioned_id} was compiled for "
                    f"({inv.signature}); this call's structure or static arguments differ. Fix: "
                    f"compile again for these arguments, or call the executor directly"
                )
            return jitted(*[leaves[i] for i in spec.array_pos])

        compiled.cfg = spec.cfg  # type: ignore[attr-defined]
        compiled.__name__ = f"compiled_{kernel.op_id}"
        return compiled


def _known_sig(args: tuple, kw: dict) -> tuple:
    """What a ``call_known`` hit checks besides its key: the arguments' types, shapes and dtypes
    and the keywords' names, types and values."""
    return (
        tuple([(type(a), a.shape, a.dtype) for a in args]),
        tuple([(k, type(v), v) for k, v in kw.items()]),
    )


def _cfg_alias(cfg: Any, kw: dict, where: str) -> Any:
    """ejKernel's ``_cfg=`` keyword: the same as ``cfg=`` (giving both is an error)."""
    alias = kw.pop("_cfg")
    if cfg is not None and alias is not None and alias is not cfg:
        raise TypeError(
            f"nablax.kernels.{where}: got both cfg={cfg!r} and _cfg={alias!r}; _cfg is ejKernel's "
            f"spelling of cfg. Fix: pass only one of them"
        )
    return alias if cfg is None else cfg


def _check_call(kernel: Any, method: Any, check_vma: Any, where: str) -> None:
    if not isinstance(kernel, Kernel):
        raise TypeError(
            f"nablax.kernels.{where}: the first argument must be a Kernel instance, got "
            f"{type(kernel).__name__}"
        )
    if method not in (None, "shard_map"):
        raise ValueError(
            f"nablax.kernels.{where}: method must be None or 'shard_map', got {method!r}"
        )
    if check_vma is not None and not isinstance(check_vma, bool):
        raise TypeError(
            f"nablax.kernels.{where}: check_vma must be True, False or None (JAX's default), got "
            f"{type(check_vma).__name__}. Fix: e.g. check_vma=False"
        )


def _prepared(kernel: Kernel, args: tuple, kw: dict) -> tuple[tuple, dict]:
    out = kernel.prepare(*args, **kw)
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise TypeError(
            f"nablax.kernels: {type(kernel).__name__}.prepare of {kernel.versioned_id} must "
            f"return (args_tuple, kwargs_dict), got {type(out).__name__}"
        )
    return tuple(out[0]), out[1]


_ARRAYS, _TRACERS, _TENSORS = 0, 1, 2


def _signature(kernel: Kernel, leaves: list, treedef: Any) -> tuple[tuple | None, int]:
    """A cheap hashable signature of a call (None when a static leaf is not a plain value:
    functions and objects are keyed through the full Invocation every time), and whether the
    array leaves include tracers or nablax Tensors."""
    sig: list = [id(kernel), treedef]
    kind = _ARRAYS
    for x in leaves:
        t = type(x)
        if t in _CONCRETE:
            sig.append((x.shape, x.dtype))
        elif t in _TENSOR_TYPES:  # exact type first: isinstance of jax.Array is slow
            sig.append((x.shape, x.dtype))
            kind = _TENSORS
        elif t in _SIMPLE_STATIC:
            sig.append((t, x))
        elif isinstance(x, (jax.Array, np.ndarray)):
            sig.append((x.shape, x.dtype))
            if isinstance(x, Tracer):
                kind = max(kind, _TRACERS)
        elif _TENSOR_TYPES and isinstance(x, _TENSOR_TYPES):
            sig.append((x.shape, x.dtype))
            kind = _TENSORS
        else:
            tensors = _TENSOR_TYPES and any(isinstance(y, _TENSOR_TYPES) for y in leaves)
            return None, (_TENSORS if tensors else kind)
    return tuple(sig), kind


# Lazy tensor types of the layer above (nablax core registers Tensor and its graph-node builder
# when it is imported; this layer never imports core)
_TENSOR_TYPES: tuple = ()
_tensor_call: Any = None


def register_tensor_type(cls: type, call: Any, differentiated: Any = None) -> None:
    """Route calls with ``cls`` arguments to ``call(spec, leaves)`` (used by nablax core);
    ``differentiated(x)`` tells whether such an argument is being differentiated (so a kernel
    tuned on forward plus backward makes its training choice, see tuner.wants_grad)."""
    global _TENSOR_TYPES, _tensor_call
    _TENSOR_TYPES = (*_TENSOR_TYPES, cls) if cls not in _TENSOR_TYPES else _TENSOR_TYPES
    _tensor_call = call
    if differentiated is not None:
        _tuner.set_tensor_differentiated(differentiated)


def _static_key(leaves: list, spec: CallSpec) -> str:
    from .invocation import static_key

    arrays = set(spec.array_pos)
    return static_key(tuple(x for i, x in enumerate(leaves) if i not in arrays), "static")


_default: Executor | None = None
_default_lock = threading.Lock()


def default_executor() -> Executor:
    """The process-wide executor used by ``nablax.kernels.library`` (memory cache, the default
    persistent database, autotuning allowed unless ``NABLAX_AUTOTUNE=0``)."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Executor(ConfigSelectorChain())
    return _default


def _stats() -> _caches.CacheStats:
    """The memoized calls, specs and recorded calls of every live executor, summed
    (``nx.cache_info()``)."""
    live = list(_LIVE)
    infos = [c.info() for ex in live for c in ex._memos()]
    return _caches.CacheStats(
        "kernels.executor",
        sum(i.hits or 0 for i in infos),
        sum(i.misses or 0 for i in infos),
        sum(i.size for i in infos),
        sum(c.maxsize or 0 for ex in live for c in ex._memos()),
        sum(i.evictions or 0 for i in infos),
    )


def _clear_all() -> None:
    """Empty every live executor's memos and its memory config cache (``nx.clear_caches()``)."""
    for ex in list(_LIVE):
        ex.clear()


_caches.register("kernels.executor", _stats, _clear_all)

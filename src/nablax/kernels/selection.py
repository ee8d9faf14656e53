"""How a kernel call gets its config: ``ConfigSelectorChain`` and its scoped controls.

Order (first hit wins): explicit ``cfg=`` (this call only: never cached, never persisted) →
overlay (``overlay_cache``, scoped by contextvars) → memory ``ConfigCache`` → ``PersistentCache`` →
autotune (``Tuner``) → heuristic → ``NoConfigError`` naming the op and the call key.

``AutotunePolicy`` says what a cache miss may do; ``policy_override`` changes a chain's policy for
a block of code in the current thread / task only. A heuristic result is stored with source
``"heuristic"``: a later lookup under a policy that wants autotuning ignores it and tunes, so a
process without autotuning never blocks a later one from tuning. Processes that tune one call at
the same time agree on one config: the persistent write is a compare-and-set, and a process that
finds another's entry stored meanwhile uses that one (``Choice.source == "persistent"``).

A call that needs a gradient of a kernel that tunes on forward plus backward (``tune_grad``, the
bundled attention) is tuned and cached under its own key (``tuner.tuning_key``): training and
inference calls of the same shapes each get the config fastest for what they run.

The baseline rule: when a kernel has both ``heuristic_cfg`` and ``candidate_cfgs``, autotuning
times the heuristic's config beside the candidates and keeps it unless the fastest candidate is
clearly faster: by more than ``min_gain`` (default 3 %) in the median of per-round time ratios and
in at least three rounds of four. So a tuned config is never a noisy measurement's accident, and a
kernel author's default stays unless measurably beaten. ``AutotunePolicy(min_gain=0)`` turns the
rule off: the fastest candidate by median wins (ejKernel's rule), the heuristic's config timed
only when it is itself a candidate.

A tuner whose class overrides ejKernel's ``Tuner.autotune`` or ``Tuner.measure`` (or any object
with an ``autotune(make_fn, args, kwargs, candidates)`` method) is called that way, on concrete
arrays, and its answer is stored as the autotuned config (without timings).

>>> import dataclasses, jax.numpy as jnp
>>> from nablax.kernels import (Kernel, Invocation, ConfigSelectorChain, ConfigCache,
...     AutotunePolicy, overlay_cache, device_fingerprint)
>>> @dataclasses.dataclass(frozen=True)
... class Cfg:
...     tile: int
>>> class Double(Kernel):
...     def run(self, x, *, cfg):
...         return x * 2
...     def heuristic_cfg(self, inv):
...         return Cfg(8)
>>> k = Double("double")
>>> chain = ConfigSelectorChain(ConfigCache(), AutotunePolicy(allow_autotune=False),
...                             persistent=False)
>>> inv = Invocation(k.versioned_id, (jnp.ones(4),), {})
>>> chain.select(inv, k)
Choice(cfg=Cfg(tile=8), source='heuristic')
>>> with overlay_cache({(device_fingerprint(), k.versioned_id, inv.call_key): Cfg(2)}):
...     chain.choose(inv, k)
Cfg(tile=2)
>>> chain.select(inv, k).source
'memory'
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import time
import warnings
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import jax

from .. import _config
from ..errors import NoConfigError
from ._call import CallSpec
from .cache import ConfigCache, PersistentCache, cfg_to_json, declared_config_types
from .invocation import Invocation
from .kernel import Kernel, check_cfg
from .store.fingerprint import device_fingerprint, get_device_platform
from .tuner import (
    Tuner,
    TuneResult,
    check_min_gain,
    concrete_call,
    outside_traces,
    tuning_key,
)

_FALLBACKS = ("autotune", "heuristic", "error")
_FALLBACK_ALIASES = {"heuristics": "heuristic"}  # ejKernel's spelling


@dataclasses.dataclass(frozen=True)
class AutotunePolicy:
    """What a cache miss may do.

    ``cache_miss_fallback``: ``"autotune"`` (tune, else heuristic), ``"heuristic"`` (heuristic,
    else tune; ejKernel's spelling ``"heuristics"`` is accepted and stored as ``"heuristic"``) or
    ``"error"`` (raise ``NoConfigError``). ``allow_autotune`` / ``allow_heuristics`` switch the two
    steps off. ``min_gain`` (keyword-only): how much faster than the heuristic's config a candidate
    must be to be chosen (the baseline rule in the module docstring); None uses the tuner's own
    (0.03 unless ``Tuner(min_gain=...)``), 0 means the fastest candidate wins.

    >>> from nablax.kernels import AutotunePolicy
    >>> AutotunePolicy(cache_miss_fallback="heuristics").cache_miss_fallback
    'heuristic'
    >>> AutotunePolicy(min_gain=0).min_gain
    0.0
    """

    allow_autotune: bool = True
    allow_heuristics: bool = True
    cache_miss_fallback: str = "autotune"
    min_gain: float | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        fallback = _FALLBACK_ALIASES.get(self.cache_miss_fallback, self.cache_miss_fallback)
        if fallback not in _FALLBACKS:
            raise ValueError(
                f"nablax.kernels.AutotunePolicy: cache_miss_fallback must be one of {_FALLBACKS} "
                f"(or ejKernel's 'heuristics'), got {self.cache_miss_fallback!r}. Fix: e.g. "
                f"AutotunePolicy(cache_miss_fallback='heuristic')"
            )
        object.__setattr__(self, "cache_miss_fallback", fallback)
        object.__setattr__(self, "min_gain", check_min_gain(self.min_gain, "AutotunePolicy"))

    @property
    def wants_autotune(self) -> bool:
        return self.allow_autotune and self.cache_miss_fallback == "autotune"


@dataclasses.dataclass(frozen=True)
class Choice:
    """A chosen config and where it came from (override, overlay, memory, persistent, autotune,
    heuristic)."""

    cfg: Any
    source: str


_UNSEEN = object()  # _store's "no compare-and-set": the store cannot say what it held


_overlays: contextvars.ContextVar[tuple[Mapping, ...]] = contextvars.ContextVar(
    "nablax_kernel_overlays", default=()
)
_policies: contextvars.ContextVar[dict[int, AutotunePolicy] | None] = contextvars.ContextVar(
    "nablax_kernel_policies", default=None
)


@contextlib.contextmanager
def overlay_cache(entries: Mapping[tuple[str, str, str], Any]) -> Iterator[None]:
    """Use these configs, keyed ``(device, versioned_op_id, call_key)``, ahead of every cache in
    this block (current thread / task only; nothing is stored anywhere). Inner overlays win."""
    if not isinstance(entries, Mapping):
        raise TypeError(
            f"nablax.kernels.overlay_cache: expected a mapping {{(device, op_id, call_key): cfg}}, "
            f"got {type(entries).__name__}"
        )
    for key in entries:
        if not (isinstance(key, tuple) and len(key) == 3 and all(isinstance(k, str) for k in key)):
            raise TypeError(
                f"nablax.kernels.overlay_cache: keys must be (device, versioned_op_id, call_key) "
                f"string triples, got {key!r}"
            )
    token = _overlays.set((dict(entries),) + _overlays.get())
    try:
        yield
    finally:
        _overlays.reset(token)


@contextlib.contextmanager
def policy_override(
    selector: ConfigSelectorChain,
    allow_autotune: bool | None = None,
    allow_heuristics: bool | None = None,
    cache_miss_fallback: str | None = None,
    min_gain: float | None = None,
) -> Iterator[AutotunePolicy]:
    """Change ``selector``'s policy in this block (current thread / task only). Yields the policy
    in force. Arguments left None keep the chain's current values.

    >>> from nablax.kernels import ConfigSelectorChain, policy_override
    >>> chain = ConfigSelectorChain(persistent=False)
    >>> with policy_override(chain, allow_autotune=False) as p:
    ...     chain.policy.allow_autotune, p.cache_miss_fallback
    (False, 'autotune')
    >>> chain.policy.allow_autotune == chain._policy.allow_autotune
    True
    """
    if not isinstance(selector, ConfigSelectorChain):
        raise TypeError(
            f"nablax.kernels.policy_override: selector must be a ConfigSelectorChain, got "
            f"{type(selector).__name__} (an Executor's chain is executor.chooser)"
        )
    changes = {
        k: v
        for k, v in (
            ("allow_autotune", allow_autotune),
            ("allow_heuristics", allow_heuristics),
            ("cache_miss_fallback", cache_miss_fallback),
            ("min_gain", min_gain),
        )
        if v is not None
    }
    policy = dataclasses.replace(selector.policy, **changes)
    token = _policies.set({**(_policies.get() or {}), id(selector): policy})
    try:
        yield policy
    finally:
        _policies.reset(token)


def overlay_lookup(key: tuple[str, str, str]) -> Any:
    for layer in _overlays.get():
        cfg = layer.get(key)
        if cfg is not None:
            return cfg
    return None


UNTUNABLE_MAX = 4096  # call keys remembered as untunable per chain


class _KeyLock:
    """A lock that a ``WeakValueDictionary`` can hold (``threading.Lock`` takes no weak
    reference)."""

    __slots__ = ("_lock", "__weakref__")

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class ConfigSelectorChain:
    """Chooses configs (see the module docstring).

    ``cache``: memory cache (default: a new ``ConfigCache``); ``policy``: default
    ``AutotunePolicy(allow_autotune=<NABLAX_AUTOTUNE>)``; ``tuner``: default ``Tuner()``;
    ``persistent``: a ``PersistentCache``, None for the default database (opened on first use), or
    False for none.
    """

    def __init__(
        self,
        cache: ConfigCache | None = None,
        policy: AutotunePolicy | None = None,
        tuner: Tuner | None = None,
        persistent: PersistentCache | None | bool = None,
    ) -> None:
        self.cache = cache if cache is not None else ConfigCache()
        self._policy = policy or AutotunePolicy(allow_autotune=_config.get("autotune"))
        self.tuner = tuner if tuner is not None else Tuner()
        if not isinstance(self.tuner, Tuner) and not callable(getattr(self.tuner, "autotune", 0)):
            raise TypeError(
                f"nablax.kernels.ConfigSelectorChain: tuner must be a nablax.kernels.Tuner or have "
                f"ejKernel's autotune(make_fn, args, kwargs, candidates) method, got "
                f"{type(self.tuner).__name__}. Fix: pass Tuner(...) or a subclass"
            )
        self._persistent = persistent
        # one lock per call key while some thread holds or waits for it (weak values: a key's
        # lock goes away with its last user, so the dict does not grow with every key ever seen)
        self._locks: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()
        # call keys whose autotuning cannot succeed (no candidates, or every one failed): not
        # tried again; bounded (UNTUNABLE_MAX, emptied when full: a dropped key is tried again)
        self._untunable: set[tuple] = set()

    @property
    def policy(self) -> AutotunePolicy:
        """The policy in force here (a ``policy_override`` of this thread / task, else the chain's
        own)."""
        scoped = _policies.get()
        if scoped:
            p = scoped.get(id(self))
            if p is not None:
                return p
        return self._policy

    @property
    def persistent(self) -> PersistentCache | None:
        if self._persistent is None:
            with self._locks_guard:
                if self._persistent is None:
                    self._persistent = PersistentCache()
        return None if self._persistent is False else self._persistent

    def choose(self, inv: Invocation, kernel: Kernel) -> Any:
        """The config for ``inv`` (see the module docstring for the order)."""
        return self.select(inv, kernel).cfg

    def select(self, inv: Invocation, kernel: Kernel) -> Choice:
        """Like ``choose``, also saying which step of the chain answered."""
        if inv.op_id == kernel.op_id:  # ejKernel builds invocations with the unversioned id
            inv = dataclasses.replace(inv, op_id=kernel.versioned_id)
        if inv.op_id != kernel.versioned_id:
            raise ValueError(
                f"nablax.kernels.ConfigSelectorChain.choose: the invocation is for {inv.op_id!r} "
                f"but the kernel is {kernel.versioned_id!r}"
            )
        if inv.override_cfg is not None:
            check_cfg(kernel, inv.override_cfg, "cfg=")
            return Choice(inv.override_cfg, "override")
        key = (device_fingerprint(), inv.op_id, inv.call_key)
        cfg = overlay_lookup(key)
        if cfg is not None:
            return Choice(cfg, "overlay")
        # a training call (tuned on forward plus backward) has its own entry; see tuning_key
        key = (key[0], key[1], tuning_key(kernel, inv))
        policy = self.policy
        hit = self._cached(key, policy, kernel, inv)
        if hit is not None:
            return hit
        with self._key_lock(key):  # one tuning per key, however many threads miss at once
            # when the stored entry was written, read before the check below: _store replaces
            # it only if no other process stored the call meanwhile (else it uses theirs)
            seen = self._created(key)
            hit = self._cached(key, policy, kernel, inv)
            if hit is not None:
                return hit
            return self._miss(inv, kernel, key, policy, seen)

    def tune(self, inv: Invocation, kernel: Kernel) -> tuple[Choice, Any]:
        """Time the candidates of ``inv`` now, whatever the caches hold, and store the winner
        (``nablax tune`` uses this). Returns the choice and the ``TuneResult``."""
        plat, sm = get_device_platform(), inv.method == "shard_map"
        candidates = list(kernel.hook("candidate_cfgs", plat, sm)(inv) or ())
        if not candidates:
            raise self._no_config(
                inv, (device_fingerprint(),), "the kernel has no candidate configs"
            )
        for c in candidates:
            check_cfg(kernel, c, "candidate_cfgs")
        key = (device_fingerprint(), inv.op_id, tuning_key(kernel, inv))
        with self._key_lock(key):
            result = self._autotune(inv, kernel, candidates, self.policy)
            if result.best is None:
                raise self._no_config(inv, key, "every candidate failed")
            self._store(key, inv, result.best, "autotune", _timing_rows(result.timings))
        return Choice(result.best, "autotune"), result

    def _autotune(self, inv: Invocation, kernel: Kernel, candidates: list, policy) -> TuneResult:
        """Time the candidates with this chain's tuner (see the module docstring)."""
        tuner = self.tuner
        if not _seed_protocol(tuner):
            baseline = self._baseline(inv, kernel) if policy.min_gain != 0 else None
            return tuner.tune(kernel, inv, candidates, baseline, min_gain=policy.min_gain)
        start = time.perf_counter()
        with outside_traces():  # concrete arrays even inside an enclosing trace; see tuner.py
            args, kwargs, synthetic = concrete_call(inv)
            best = tuner.autotune(_make_fn(kernel, inv), args, kwargs, candidates)
        if best is not None:
            check_cfg(kernel, best, f"{type(tuner).__name__}.autotune")
        return TuneResult(best, (), synthetic, time.perf_counter() - start)

    def _baseline(self, inv: Invocation, kernel: Kernel) -> Any:
        """The heuristic's config, which tuning keeps unless a candidate is clearly faster."""
        plat, sm = get_device_platform(), inv.method == "shard_map"
        try:
            cfg = kernel.hook("heuristic_cfg", plat, sm)(inv)
        except Exception:  # noqa: BLE001 - a failing heuristic only loses the baseline
            return None
        return cfg

    def _usable(self, entry: Any, key: tuple, policy: AutotunePolicy) -> bool:
        return entry.source != "heuristic" or not policy.wants_autotune or key in self._untunable

    def _cached(self, key: tuple, policy: AutotunePolicy, kernel=None, inv=None) -> Choice | None:
        entry = self.cache.get_entry(*key)
        if entry is not None and self._usable(entry, key, policy):
            return Choice(entry.cfg, "memory")
        store = self.persistent
        if store is not None:
            # stored class names resolve only among the classes this kernel declares (cache.py)
            entry = store.get_entry(*key, types=lambda: declared_config_types(kernel, inv))
            if entry is not None and self._usable(entry, key, policy):
                self.cache.put(*key, entry.cfg, source=entry.source, timings=entry.timings)
                return Choice(entry.cfg, "persistent")
        return None

    def _key_lock(self, key: tuple) -> _KeyLock:
        """The lock of ``key``: the same object for every thread that holds a reference to it
        (the caller keeps it while it tunes), a new one once nobody does."""
        with self._locks_guard:
            lock = self._locks.get(key)
            if lock is None:
                lock = self._locks[key] = _KeyLock()
            return lock

    def _mark_untunable(self, key: tuple) -> None:
        if len(self._untunable) >= UNTUNABLE_MAX:
            self._untunable.clear()
        self._untunable.add(key)

    def _created(self, key: tuple) -> Any:
        """The persistent entry's ``created`` time (None: no entry), or ``_UNSEEN`` when there
        is no store or it cannot say (a store object without ``created``, or one that fails)."""
        store = self.persistent
        created = getattr(store, "created", None)
        if created is None:
            return _UNSEEN
        try:
            return created(*key)
        except Exception:  # noqa: BLE001 - a failing read only loses the compare-and-set
            return _UNSEEN

    def _miss(
        self, inv: Invocation, kernel: Kernel, key: tuple, policy: AutotunePolicy, seen: Any
    ) -> Choice:
        if policy.cache_miss_fallback == "error":
            raise self._no_config(inv, key, "the policy's cache_miss_fallback is 'error'")
        order = ("autotune", "heuristic")
        if policy.cache_miss_fallback == "heuristic":
            order = ("heuristic", "autotune")
        tried, timings = [], ()
        plat, sm = get_device_platform(), inv.method == "shard_map"
        for step in order:
            if step == "autotune" and policy.allow_autotune:
                candidates = list(kernel.hook("candidate_cfgs", plat, sm)(inv) or ())
                for c in candidates:
                    check_cfg(kernel, c, "candidate_cfgs")
                if not candidates:
                    tried.append("autotune (the kernel has no candidate configs)")
                    self._mark_untunable(key)
                    continue
                result = self._autotune(inv, kernel, candidates, policy)
                timings = _timing_rows(result.timings)
                if result.best is not None:
                    return self._store(key, inv, result.best, "autotune", timings, seen, kernel)
                tried.append("autotune (every candidate failed)")
                self._mark_untunable(key)
            elif step == "heuristic" and policy.allow_heuristics:
                cfg = kernel.hook("heuristic_cfg", plat, sm)(inv)
                if cfg is not None:
                    check_cfg(kernel, cfg, "heuristic_cfg")
                    return self._store(key, inv, cfg, "heuristic", timings, seen, kernel)
                tried.append("heuristic (heuristic_cfg returned None)")
            else:
                tried.append(f"{step} (not allowed by the policy)")
        raise self._no_config(inv, key, "tried " + ", ".join(tried))

    def _store(
        self,
        key: tuple,
        inv: Invocation,
        cfg: Any,
        source: str,
        timings: tuple,
        seen: Any = _UNSEEN,
        kernel: Kernel | None = None,
    ) -> Choice:
        """Store ``cfg`` in memory and in the persistent cache, and return the choice to use.

        With ``seen`` (the persistent entry's ``created`` when this miss began) the persistent
        write is a compare-and-set: if another process stored the call meanwhile (it tuned the
        same call at the same time), its entry is used here too, when usable, instead of this
        process's own result. Concurrent processes so agree on one config per call, and every
        later process reads that one: an autotuned choice (whose numerics may differ in the last
        bits from another candidate's) is the same everywhere on this machine.
        """
        store = self.persistent
        if store is not None:
            try:
                if seen is _UNSEEN:
                    store.put(*key, cfg, source=source, timings=timings, signature=inv.signature)
                else:
                    adopted = self._put_first(store, key, inv, cfg, source, timings, seen, kernel)
                    if adopted is not None:
                        return adopted
            except Exception as e:  # noqa: BLE001 - a read-only disk must not stop the call
                warnings.warn(
                    f"nablax.kernels: could not store the config of {inv.op_id} in {store.path}: "
                    f"{e}",
                    RuntimeWarning,
                    stacklevel=4,
                )
        self.cache.put(*key, cfg, source=source, timings=timings)
        return Choice(cfg, source)

    def _put_first(self, store, key, inv, cfg, source, timings, seen, kernel) -> Choice | None:
        """The compare-and-set write of ``_store``: None when this process's ``cfg`` was stored
        (or nothing usable is there), else the choice another process stored first."""
        for _ in range(3):
            if store.put(
                *key, cfg, source=source, timings=timings, signature=inv.signature,
                expect_created=seen,
            ):  # fmt: skip
                return None
            # another process wrote the entry meanwhile: use it if this process can (its class
            # is known here, and it is not a heuristic where this policy wants tuning) ...
            entry = store.get_entry(*key, types=lambda: declared_config_types(kernel, inv))
            if entry is not None and self._usable(entry, key, self.policy):
                self.cache.put(*key, entry.cfg, source=entry.source, timings=entry.timings)
                return Choice(entry.cfg, "persistent")
            seen = store.created(*key)  # ... else replace it, unless it changes again
        return None

    @staticmethod
    def _no_config(inv: Invocation, key: tuple, why: str) -> NoConfigError:
        return NoConfigError(
            f"nablax.kernels: no config for {inv.op_id} (call key {inv.call_key}; {inv.signature}) "
            f"on {key[0]}: {why}. Fix: pass cfg=..., allow autotuning or heuristics "
            f"(AutotunePolicy), or give the kernel heuristic_cfg / candidate_cfgs"
        )


def _seed_protocol(tuner: Any) -> bool:
    """Whether the chain calls ``tuner.autotune(make_fn, args, kwargs, candidates)`` (ejKernel's
    protocol: a foreign tuner, or a Tuner subclass that overrides ``autotune`` or ``measure`` but
    not ``tune``) instead of ``tuner.tune``."""
    if not isinstance(tuner, Tuner):
        return True
    cls = type(tuner)
    if cls.tune is not Tuner.tune:
        return False
    return cls.autotune is not Tuner.autotune or cls.measure is not Tuner.measure


def _make_fn(kernel: Kernel, inv: Invocation) -> Any:
    """ejKernel's ``make_fn``: ``cfg -> f(*args, **kwargs)`` running the kernel's most specific
    ``run`` (shard-mapped for ``method="shard_map"``) with that config."""

    def make_fn(cfg: Any) -> Any:
        def f(*args: Any, **kwargs: Any) -> Any:
            call = dataclasses.replace(inv, args=tuple(args), kwargs=dict(kwargs))
            spec = CallSpec(kernel, call, cfg, inv.call_key)
            leaves = jax.tree_util.tree_leaves((call.args, call.kwargs))
            return spec.tune_fn()(*[leaves[i] for i in spec.array_pos])

        f.__name__ = f"{kernel.op_id}_with_cfg"
        return f

    return make_fn


def _timing_rows(timings) -> tuple:
    return tuple((cfg_to_json(t.cfg), float(t.median_s), t.error) for t in timings)

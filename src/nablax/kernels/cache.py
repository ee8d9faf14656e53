"""The two config caches of the kernel layer: ``ConfigCache`` (memory) and ``PersistentCache``
(SQLite).

Both map ``(device, op_id, call_key)`` to a kernel config: ``device`` is a fingerprint string
(see :func:`~nablax.kernels.device_fingerprint`), ``op_id`` the versioned kernel id such as
``"matmul@v1"`` and ``call_key`` the invocation's stable key. A config is an instance of a frozen
dataclass whose fields are JSON-able scalars or tuples of them; :func:`cfg_to_json` and
:func:`cfg_from_json` store it as ``{"type": "module:qualname", "fields": {...}}``.

The persistent cache (``_sqlite.py``, re-exported here) is one SQLite file in WAL mode, opened once
per thread and per process, so any number of threads and processes may read and write it at the
same time. A file that is not a valid database is moved aside with a warning and replaced by an
empty one.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import json
import os
import sys
import threading
import time
import weakref
from collections import OrderedDict
from typing import Any

__all__ = ["CacheEntry", "ConfigCache", "PersistentCache", "cfg_from_json", "cfg_to_json"]

SOURCES = ("autotune", "heuristic")
_SCALARS = (int, float, str, bool, type(None))

# Classes seen by cfg_to_json in this process, for configs whose class cannot be imported by name
# (defined in a function, a doctest or a notebook cell): they still round-trip within the process.
_SEEN_CLASSES: dict[str, type] = {}

# Every live cache, so that a forked child can drop the connections and locks it inherited.
_LIVE_CACHES: weakref.WeakSet[Any] = weakref.WeakSet()
# A child must never use or close its parent's SQLite connections: they are parked here for good.
_ABANDONED: list[Any] = []


# --- configs <-> JSON ----------------------------------------------------------------------------


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _storable(v: Any) -> bool:
    # Exact types only: numpy scalars or IntEnums would come back as plain Python values.
    if type(v) in _SCALARS:
        return True
    return type(v) is tuple and all(_storable(x) for x in v)


def _encode(cfg: Any, api: str) -> str:
    cls = type(cfg)
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(
            f"{api}: the config must be an instance of a frozen dataclass, got {cls.__name__} "
            f"{cfg!r:.60}. Fix: declare it with @dataclasses.dataclass(frozen=True)."
        )
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"{api}: config class {cls.__qualname__} is a dataclass but not frozen, so it is not "
            f"a safe cache value. Fix: declare it with @dataclasses.dataclass(frozen=True)."
        )
    fields = {}
    for f in dataclasses.fields(cfg):
        if not f.init:  # rebuilt by the class itself (__post_init__)
            continue
        v = getattr(cfg, f.name)
        if not _storable(v):
            raise TypeError(
                f"{api}: field {f.name!r} of config class {cls.__qualname__} holds "
                f"{type(v).__name__} {v!r:.60}, which cannot be stored. Fix: use int, float, str, "
                f"bool, None or a tuple of them (e.g. int(x) for a numpy integer, tuple(x) for a "
                f"list)."
            )
        fields[f.name] = v
    name = _type_name(cls)
    _SEEN_CLASSES[name] = cls
    return json.dumps({"type": name, "fields": fields}, sort_keys=True, separators=(",", ":"))


def cfg_to_json(cfg: Any) -> str:
    """Serialize a kernel config (a frozen dataclass instance) to a stable JSON string.

    Keys are sorted, so equal configs give equal strings. Raises ``TypeError`` (naming the class,
    the field and the fix) for anything that could not be rebuilt by :func:`cfg_from_json`.

    >>> import dataclasses
    >>> from nablax.kernels.cache import cfg_to_json, cfg_from_json
    >>> @dataclasses.dataclass(frozen=True)
    ... class TileCfg:
    ...     block: int = 64
    ...     shape: tuple = (8, 8)
    >>> s = cfg_to_json(TileCfg())
    >>> s
    '{"fields":{"block":64,"shape":[8,8]},"type":"...:TileCfg"}'
    >>> cfg_from_json(s) == TileCfg()
    True
    """
    return _encode(cfg, "nablax.kernels.cache.cfg_to_json")


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _resolve_class(name: str) -> Any:
    mod_name, _, qualname = name.partition(":")
    try:
        obj: Any = importlib.import_module(mod_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        return obj
    except Exception:  # any import-time failure of a user module means: not importable here
        return _SEEN_CLASSES.get(name)


def cfg_from_json(s: str) -> Any:
    """Rebuild a config written by :func:`cfg_to_json` (JSON lists come back as tuples).

    Raises ``ValueError`` for text that is not such a JSON document and ``TypeError`` when the
    class cannot be imported or no longer accepts the stored fields (the caches then treat the
    entry as stale).

    >>> from nablax.kernels.cache import cfg_from_json
    >>> cfg_from_json('{"fields": {}, "type": "no_such_module:Cfg"}')
    Traceback (most recent call last):
    ...
    TypeError: nablax.kernels.cache.cfg_from_json: config class no_such_module:Cfg cannot be ...
    """
    api = "nablax.kernels.cache.cfg_from_json"
    try:
        doc = json.loads(s)
        name, fields = doc["type"], doc["fields"]
        if not isinstance(name, str) or not isinstance(fields, dict):
            raise TypeError("'type' must be a string and 'fields' an object")
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(
            f"{api}: {s!r:.80} is not a stored config ({e}). Fix: pass a string made by "
            f"cfg_to_json."
        ) from None
    cls = _resolve_class(name)
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(
            f"{api}: config class {name} cannot be imported in this process. Fix: make the module "
            f"importable (on sys.path) or re-tune; the stored entry is stale."
        )
    try:
        return cls(**{k: _tuplify(v) for k, v in fields.items()})
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{api}: config class {name} no longer accepts the stored fields {sorted(fields)} "
            f"({e}). Fix: re-tune; the stored entry is stale."
        ) from None


# --- entries -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One cached config with where it came from.

    ``timings`` holds ``(cfg_json, seconds, error)`` for every candidate that was timed (``seconds``
    is ``inf`` for a failed candidate, ``error`` its message or ``None``); it is empty for
    heuristic configs. ``signature`` is a human-readable description of the call's shapes.

    >>> from nablax.kernels.cache import CacheEntry
    >>> e = CacheEntry("cpu", "matmul@v1", "k", None, "heuristic", (), "0.1.0", 0.0)
    >>> (e.source, e.timings, e.signature)
    ('heuristic', (), '')
    """

    device: str
    op_id: str
    call_key: str
    cfg: Any
    source: str
    timings: tuple[tuple[str, float, str | None], ...]
    package_version: str
    created: float
    signature: str = ""


def _package_version() -> str:
    v = getattr(sys.modules.get("nablax"), "__version__", None)
    if isinstance(v, str):
        return v
    try:
        return importlib.metadata.version("nablax")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _check_args(api: str, device: Any, op_id: Any, call_key: Any, source: str = "autotune") -> None:
    for arg, v in (("device", device), ("op_id", op_id), ("call_key", call_key)):
        if not isinstance(v, str):
            raise TypeError(
                f"{api}: argument {arg!r} must be a str, got {type(v).__name__} {v!r:.60}. "
                f"Fix: pass the device fingerprint, the versioned op id (e.g. 'matmul@v1') and "
                f"Invocation.call_key as strings."
            )
    if source not in SOURCES:
        raise ValueError(f"{api}: source={source!r} is not one of {SOURCES}. Fix: pass one.")


def _norm_timings(timings: Any, api: str) -> tuple[tuple[str, float, str | None], ...]:
    """``(cfg_json, seconds, error_text_or_None)`` rows from cfg objects, exceptions, numbers."""
    rows = []
    for item in timings or ():
        try:
            c, secs, err = item
            secs = float(secs)
        except (TypeError, ValueError):
            raise TypeError(
                f"{api}: each item of timings must be (cfg, seconds, error), got {item!r:.80}. "
                f"Fix: pass a sequence of 3-tuples, seconds=inf for failed candidates."
            ) from None
        if isinstance(err, BaseException):
            err = f"{type(err).__name__}: {err}"
        err = None if err is None else str(err)
        rows.append((c if isinstance(c, str) else _encode(c, api), secs, err))
    return tuple(rows)


# --- memory cache --------------------------------------------------------------------------------


class ConfigCache:
    """Bounded, thread-safe LRU map ``(device, op_id, call_key) -> cfg`` in memory.

    ``generation`` grows on every ``put`` and ``clear``, so a caller can tell cheaply whether its
    own memo of earlier lookups is stale.

    >>> import dataclasses
    >>> from nablax.kernels import ConfigCache
    >>> @dataclasses.dataclass(frozen=True)
    ... class TileCfg:
    ...     block: int = 64
    >>> cache = ConfigCache(max_entries=2)
    >>> cache.put("cpu", "matmul@v1", "k1", TileCfg(32))
    >>> cache.get("cpu", "matmul@v1", "k1")
    TileCfg(block=32)
    >>> cache.get("cpu", "matmul@v1", "k2") is None
    True
    >>> cache.stats()
    {'hits': 1, 'misses': 1, 'size': 1, 'max_entries': 2, 'evictions': 0}
    """

    def __init__(self, max_entries: int = 4096):
        if type(max_entries) is not int or max_entries < 1:
            raise ValueError(
                f"nablax.kernels.ConfigCache: max_entries must be a positive int, got "
                f"{max_entries!r}. Fix: pass e.g. max_entries=4096."
            )
        self.max_entries = max_entries
        self._data: OrderedDict[tuple[str, str, str], CacheEntry] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0
        self.generation = 0
        _LIVE_CACHES.add(self)

    def get(self, device: str, op_id: str, call_key: str) -> Any:
        """The cached config, or ``None``; counts a hit or a miss and refreshes LRU order."""
        key = (device, op_id, call_key)
        with self._lock:
            entry = self._data.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._data.move_to_end(key)
            self._hits += 1
            return entry.cfg

    def get_entry(self, device: str, op_id: str, call_key: str) -> CacheEntry | None:
        """The whole :class:`CacheEntry`, or ``None`` (counts nothing, keeps LRU order)."""
        with self._lock:
            return self._data.get((device, op_id, call_key))

    def put(
        self,
        device: str,
        op_id: str,
        call_key: str,
        cfg: Any,
        *,
        source: str = "autotune",
        timings: Any = None,
        signature: str = "",
    ) -> None:
        """Store ``cfg`` (evicting the least recently used entry when full)."""
        api = "nablax.kernels.ConfigCache.put"
        _check_args(api, device, op_id, call_key, source)
        entry = CacheEntry(
            device, op_id, call_key, cfg, source, _norm_timings(timings, api),
            _package_version(), time.time(), signature,
        )  # fmt: skip
        key = (device, op_id, call_key)
        with self._lock:
            self._data[key] = entry
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
                self._evictions += 1
            self.generation += 1

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self._hits = self._misses = self._evictions = 0
            self.generation += 1

    def __len__(self) -> int:
        return len(self._data)

    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "max_entries", "evictions"}``."""
        with self._lock:
            return {
                "hits": self._hits,
                "misses": self._misses,
                "size": len(self._data),
                "max_entries": self.max_entries,
                "evictions": self._evictions,
            }

    def _after_fork_in_child(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at fork time


def _after_fork_in_child() -> None:
    for cache in list(_LIVE_CACHES):
        cache._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


from ._sqlite import PersistentCache  # noqa: E402 - uses the names above

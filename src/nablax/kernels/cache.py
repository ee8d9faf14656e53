"""The two config caches of the kernel layer: ``ConfigCache`` (memory) and ``PersistentCache``
(SQLite).

Both map ``(device, op_id, call_key)`` to a kernel config: ``device`` is a fingerprint string
(see :func:`~nablax.kernels.device_fingerprint`), ``op_id`` the versioned kernel id such as
``"matmul@v1"`` and ``call_key`` the invocation's stable key. A config is an instance of a frozen
dataclass whose fields are JSON-able scalars or tuples of them; :func:`cfg_to_json` and
:func:`cfg_from_json` store it as ``{"type": "module:qualname", "fields": {...}}``.

A stored class name is only ever looked up among classes this process declared -- the ``Cfg`` of
a ``Kernel[Cfg, Out]``, the configs a kernel's ``heuristic_cfg``/``candidate_cfgs`` return, classes
this process stored, and :func:`register_config_class` -- and, by ``PersistentCache``, among the
frozen dataclasses of modules this process has already imported (``sys.modules``, plain
``__dict__`` lookups), never imported: whoever can write the cache file must not choose which
module nablax imports. An entry whose class is found nowhere is left out with one warning per
class that names it and the fix (import its module, ``types=[Cls]``, or
:func:`register_config_class`).

The persistent cache waits at most ``nx.config.cache_lock_timeout`` seconds (default 5) for a
database another process holds locked; then it goes on in memory for this process, with one
warning (``fallback=False`` and read-only opens raise :class:`CacheFileError`). A file at the
cache's path that has SQLite's header but fails SQLite's own checks is moved aside (renamed
``<name>.corrupt-<time>``, never deleted) with a warning and a new database started, except by a
read-only open (``nablax cache list``/``show``), which changes nothing.

The persistent cache (``_sqlite.py``, re-exported here; the file format is ``_dbfile.py``) is one
SQLite file in WAL mode shared by threads and processes. When it cannot be used (an unwritable
folder, a file that is not nablax's, a newer schema), kernels keep working with one warning.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

from ._configs import (
    _LIVE_CACHES,
    CacheEntry,
    StoredConfig,
    _check_args,
    _norm_timings,
    _package_version,
    cfg_from_json,
    cfg_to_json,
    declared_config_types,
    register_config_class,
)
from ._sqlite import CacheFileError, PersistentCache

__all__ = [
    "CacheEntry",
    "CacheFileError",
    "ConfigCache",
    "PersistentCache",
    "StoredConfig",
    "cfg_from_json",
    "cfg_to_json",
    "declared_config_types",
    "register_config_class",
]

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

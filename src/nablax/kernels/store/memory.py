"""What the store keeps in memory: :class:`ConfigCache`, the bounded LRU map of kernel configs in
front of the persistent cache, and :class:`MemoryDB`, where a ``PersistentCache`` that cannot write
its file keeps this process's entries.

A ``ConfigCache`` keeps its entries in one ``nablax._caches.Cache`` (the one cache type of
nablax); ``live.py`` counts every live one as ``"kernels.config_caches"`` in ``nx.cache_info()``,
and ``nx.clear_caches()`` empties them all (the persistent database is kept).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from typing import Any

from ... import _caches
from .._configs import _LIVE_CACHES, CacheEntry, _check_args, _norm_timings, _package_version
from . import schema


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
        self._store = _caches.Cache("kernels.config_cache", max_entries, register=False)
        self._lock = threading.Lock()  # orders generation bumps
        self.generation = 0
        _LIVE_CACHES.add(self)

    def get(self, device: str, op_id: str, call_key: str) -> Any:
        """The cached config, or ``None``; counts a hit or a miss and refreshes LRU order."""
        entry = self._store.get((device, op_id, call_key))
        return None if entry is None else entry.cfg

    def get_entry(self, device: str, op_id: str, call_key: str) -> CacheEntry | None:
        """The whole :class:`CacheEntry`, or ``None`` (counts nothing, keeps LRU order)."""
        return self._store.peek((device, op_id, call_key))

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
        self._store.put((device, op_id, call_key), entry)  # evicts the least recently used
        with self._lock:
            self.generation += 1

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        self._store.clear()
        with self._lock:
            self.generation += 1

    def __len__(self) -> int:
        return len(self._store)

    def stats(self) -> dict[str, int]:
        """``{"hits", "misses", "size", "max_entries", "evictions"}``."""
        info = self._store.info()
        return {
            "hits": info.hits or 0,
            "misses": info.misses or 0,
            "size": info.size,
            "max_entries": self.max_entries,
            "evictions": info.evictions or 0,
        }

    def _after_fork_in_child(self) -> None:
        # another thread may have held a lock at fork time
        self._lock = threading.Lock()
        self._store._lock = threading.RLock()


class MemoryDB:
    """The entries of a cache that cannot write its file: one in-memory SQLite database with the
    same schema, shared by this object's threads (one statement sequence at a time)."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN")
        schema.build(self.conn, 0)
        self.conn.execute("COMMIT")
        self.lock = threading.Lock()

    def run(self, op: Any) -> Any:
        with self.lock:
            return op(self.conn)

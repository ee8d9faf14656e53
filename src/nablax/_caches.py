"""One bounded, thread-safe LRU :class:`Cache` type, and the registry behind ``nx.cache_info()``
and ``nx.clear_caches()``.

Every in-memory cache nablax keeps is registered here by a unique name: either a :class:`Cache`
(registered when it is constructed), a :class:`DictCache` (the same for the per-op hot paths: a
plain ``dict`` read without a lock, bounded on insertion) or, for a cache with bookkeeping of its
own (the realization cache, the executables of every ``nx.compile`` function, the kernel
executor), a pair of ``info``/``clear`` functions given to :func:`register`. :func:`infos` reports them all and
:func:`clear_all` empties them all. This module sits in the base layer (no nablax imports), so
the kernel layer and the core can both use it.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class CacheStats:
    """Counters of one registered cache: ``hits``/``misses`` (lookups that found / did not find
    an entry), ``size`` (entries held), ``maxsize`` (the bound; ``None`` when unbounded) and
    ``evictions`` (entries dropped to stay within the bound). A counter a cache does not keep is
    ``None``."""

    name: str
    hits: int | None
    misses: int | None
    size: int
    maxsize: int | None
    evictions: int | None


_registry: dict[str, tuple[Callable[[], CacheStats], Callable[[], None]]] = {}
_registry_lock = threading.Lock()


def register(name: str, info: Callable[[], CacheStats], clear: Callable[[], None]) -> None:
    """Register a cache under ``name``: ``info()`` returns its :class:`CacheStats`, ``clear()``
    empties it and resets its counters. Names are unique (``ValueError`` otherwise)."""
    with _registry_lock:
        if name in _registry:
            raise ValueError(
                f"nablax cache registry: a cache named {name!r} is already registered. "
                "Fix: give each cache a unique name."
            )
        _registry[name] = (info, clear)


_register = register  # for Cache.__init__, whose ``register`` flag hides the function


def infos() -> dict[str, CacheStats]:
    """``{name: CacheStats}`` of every registered cache, in registration order."""
    with _registry_lock:
        items = list(_registry.items())
    return {name: info() for name, (info, _) in items}


def clear_all() -> None:
    """Empty every registered cache and reset its counters."""
    with _registry_lock:
        clears = [clear for _, clear in _registry.values()]
    for clear in clears:
        clear()


class Cache:
    """A bounded, thread-safe LRU mapping with hit/miss/eviction counters, registered by name.

    ``maxsize`` is an int, a function returning one (read at every insertion, for bounds that
    follow an option), or ``None`` for an unbounded cache. ``on_evict(key, value)``, if given, is
    called (under the cache's lock) for every entry dropped to stay within the bound or by
    :meth:`evict`, not by :meth:`clear` (for bookkeeping tied to the entries, such as an index
    into them).

    >>> c = Cache("doc.example", maxsize=2, register=False)
    >>> c.put("a", 1); c.put("b", 2); c.get("a"); c.put("c", 3)
    1
    >>> c.get("b") is None, c.get_or_make("a", lambda: 0), c.info().evictions
    (True, 1, 1)
    """

    def __init__(
        self,
        name: str,
        maxsize: int | Callable[[], int] | None,
        *,
        register: bool = True,
        on_evict: Callable[[Hashable, Any], None] | None = None,
    ) -> None:
        self.name = name
        self._maxsize = maxsize
        self._on_evict = on_evict  # called (under the lock) with each evicted key and value
        self._data: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.RLock()
        self.hits = self.misses = self.evictions = 0
        if register:
            _register(name, self.info, self.clear)

    @property
    def maxsize(self) -> int | None:
        m = self._maxsize
        return m() if callable(m) else m

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._data

    def get(self, key: Hashable, default: Any = None) -> Any:
        """The value stored for ``key`` (marked most recently used), else ``default``."""
        with self._lock:
            # taken out and put back at the end: one comparison of the key with the stored one
            # (get and move_to_end would compare twice; structure keys are long tuples)
            value = self._data.pop(key, _MISSING)
            if value is _MISSING:
                self.misses += 1
                return default
            self._data[key] = value
            self.hits += 1
            return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The value stored for ``key``, else ``default``, counting nothing and keeping the LRU
        order (for reports and audits)."""
        with self._lock:
            return self._data.get(key, default)

    def put(self, key: Hashable, value: Any) -> None:
        """Store ``value`` for ``key``, evicting the least recently used entries over the bound."""
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            self._trim()

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The value for ``key``, computing and storing ``make()`` on a miss (under the lock, so
        concurrent callers make it once)."""
        with self._lock:
            value = self._data.pop(key, _MISSING)  # and put back at the end, as in get
            if value is not _MISSING:
                self._data[key] = value
                self.hits += 1
                return value
            self.misses += 1
            value = make()
            self._data[key] = value
            self._trim()
            return value

    def values(self) -> list:
        with self._lock:
            return list(self._data.values())

    def evict(self, n: int) -> int:
        """Drop the ``n`` least recently used entries (fewer if fewer are held), counted as
        evictions: for a cache that must shrink below its bound (the realization cache under
        memory-map pressure). Returns how many were dropped."""
        with self._lock:
            n = max(0, min(n, len(self._data)))
            for _ in range(n):
                self._pop_oldest()
            return n

    def _pop_oldest(self) -> None:
        key, value = self._data.popitem(last=False)
        self.evictions += 1
        if self._on_evict is not None:
            self._on_evict(key, value)

    def _trim(self) -> None:
        limit = self.maxsize
        if limit is None:
            return
        while len(self._data) > limit:
            self._pop_oldest()

    def clear(self) -> None:
        """Drop every entry and reset the counters."""
        with self._lock:
            self._data.clear()
            self.hits = self.misses = self.evictions = 0

    def info(self) -> CacheStats:
        with self._lock:
            return CacheStats(
                self.name, self.hits, self.misses, len(self._data), self.maxsize, self.evictions
            )


class HashedTuple(tuple):
    """A tuple that hashes its contents once, when made: for long structure keys (a program's
    or a backward plan's steps) that a :class:`Cache` hashes on every lookup and insertion.

    >>> k = HashedTuple(((1, 2), ("a",)))
    >>> k == ((1, 2), ("a",)) and hash(k) == hash(((1, 2), ("a",)))
    True
    """

    _hash: int  # (a tuple subclass cannot have non-empty __slots__)

    def __new__(cls, parts: tuple):
        self = super().__new__(cls, parts)
        self._hash = tuple.__hash__(self)
        return self

    def __hash__(self) -> int:
        return self._hash


class DictCache:
    """A bounded cache on a plain ``dict``, for the per-op hot paths (dtype promotion, broadcast
    shapes, element-wise dtype rules), where a locked :class:`Cache` lookup would cost more than
    the work it saves.

    Readers look ``data`` up directly (``cache.data[key]``, ``cache.data.get(key)``): no lock, no
    counters, no LRU order (reading a ``dict`` while another thread inserts is safe). :meth:`put`
    inserts under a lock and, at the bound, first drops the oldest entry (first in, first out).
    ``data`` stays the same ``dict`` object for the cache's life (:meth:`clear` empties it in
    place). Registered by name like :class:`Cache`: ``nx.cache_info()`` reports its ``size``,
    ``maxsize`` and ``evictions`` (``hits``/``misses`` are ``None``: not counted), and
    ``nx.clear_caches()`` empties it. Use it only where keys come from a small finite set (dtypes,
    op names, shapes in use) and the values are cheap to recompute, or where the keys in use stay
    far below the bound (an entry dropped first in, first out is remade once).

    >>> c = DictCache("doc.dict_example", maxsize=2, register=False)
    >>> c.put("a", 1), c.put("b", 2), c.put("c", 3)
    (1, 2, 3)
    >>> c.data, c.info().evictions
    ({'b': 2, 'c': 3}, 1)
    """

    __slots__ = ("name", "data", "maxsize", "evictions", "_lock", "__weakref__")

    def __init__(self, name: str, maxsize: int, *, register: bool = True) -> None:
        if not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(
                f"nablax DictCache({name!r}): maxsize must be a positive int, got {maxsize!r}. "
                "Fix: give the bound as an int >= 1 (an unbounded or option-driven cache is a "
                "Cache)."
            )
        self.name = name
        self.data: dict = {}
        self.maxsize = maxsize
        self.evictions = 0
        self._lock = threading.Lock()
        if register:
            _register(name, self.info, self.clear)

    def __len__(self) -> int:
        return len(self.data)

    def __contains__(self, key: Hashable) -> bool:
        return key in self.data

    def get(self, key: Hashable, default: Any = None) -> Any:
        return self.data.get(key, default)

    def put(self, key: Hashable, value: Any) -> Any:
        """Store ``value`` for ``key`` (dropping the oldest entries at the bound); returns
        ``value``."""
        with self._lock:
            data = self.data
            if key not in data:
                while len(data) >= self.maxsize:
                    del data[next(iter(data))]
                    self.evictions += 1
            data[key] = value
        return value

    def clear(self) -> None:
        """Drop every entry (in place) and reset the eviction counter."""
        with self._lock:
            self.data.clear()
            self.evictions = 0

    def info(self) -> CacheStats:
        return CacheStats(self.name, None, None, len(self.data), self.maxsize, self.evictions)


class CacheReport(dict):
    """``nx.cache_info()``'s answer: a ``dict`` of ``{name: CacheStats}`` over every registered
    cache, whose attributes are also those of ``summary`` (the realization cache's
    ``nx.CacheInfo``: ``compiles``, ``hits``, ``executables``, ``realizations``, ``evictions``),
    so code written when ``nx.cache_info()`` returned only that keeps working."""

    def __init__(self, stats: dict[str, CacheStats], summary: Any) -> None:
        super().__init__(stats)
        self.summary = summary

    def __getattr__(self, attr: str) -> Any:
        if attr == "summary":  # not set yet (unpickling): no recursion
            raise AttributeError(attr)
        return getattr(self.summary, attr)

    def __repr__(self) -> str:
        return f"{self.summary!r} {{{', '.join(f'{k!r}: {v!r}' for k, v in self.items())}}}"

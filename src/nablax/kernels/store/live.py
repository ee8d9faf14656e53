"""Every live cache object of the store, seen together: what a forked child must drop or renew,
and the ``nx.cache_info()`` / ``nx.clear_caches()`` view of the in-memory caches those objects
hold (``"kernels.config_caches"``: every ``ConfigCache``; ``"kernels.persistent_decoded"``: the
configs every ``PersistentCache`` decoded). The objects add themselves to
``_configs._LIVE_CACHES`` (a ``WeakSet``) when they are made."""

from __future__ import annotations

import os

from ... import _caches
from .._configs import _LIVE_CACHES
from .memory import ConfigCache
from .persistent import _DECODED, PersistentCache


def _of(cls: type) -> list:
    return [c for c in list(_LIVE_CACHES) if isinstance(c, cls)]


def _summed(name: str, stores: list[_caches.Cache], maxsize: int) -> _caches.CacheStats:
    infos = [s.info() for s in stores]
    return _caches.CacheStats(
        name,
        sum(i.hits or 0 for i in infos),
        sum(i.misses or 0 for i in infos),
        sum(i.size for i in infos),
        maxsize,
        sum(i.evictions or 0 for i in infos),
    )


def config_caches_info() -> _caches.CacheStats:
    """Every live ``ConfigCache``, summed."""
    live = _of(ConfigCache)
    return _summed(
        "kernels.config_caches", [c._store for c in live], sum(c.max_entries for c in live)
    )


def clear_config_caches() -> None:
    for c in _of(ConfigCache):
        c.clear()


def decoded_info() -> _caches.CacheStats:
    """The decoded configs of every live ``PersistentCache``, summed."""
    live = _of(PersistentCache)
    return _summed("kernels.persistent_decoded", [c._decoded for c in live], _DECODED * len(live))


def clear_decoded() -> None:
    for c in _of(PersistentCache):
        c._decoded.clear()


_caches.register("kernels.config_caches", config_caches_info, clear_config_caches)
_caches.register("kernels.persistent_decoded", decoded_info, clear_decoded)


def _after_fork_in_child() -> None:
    for cache in list(_LIVE_CACHES):
        cache._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)

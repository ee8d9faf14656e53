"""The kernel config caches under their documented path: ``ConfigCache`` (memory),
``PersistentCache`` (SQLite) and the config JSON helpers, re-exported from
:mod:`nablax.kernels.store` (see its docstring for the rules; its modules hold the code).

>>> from nablax.kernels.cache import ConfigCache, PersistentCache
>>> ConfigCache(max_entries=8).stats()["max_entries"]
8
"""

from __future__ import annotations

from .store import (
    CacheEntry,
    CacheFileError,
    ConfigCache,
    PersistentCache,
    StoredConfig,
    cfg_from_json,
    cfg_to_json,
    declared_config_types,
    register_config_class,
)

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

"""The kernel config store: ``ConfigCache`` (memory) and ``PersistentCache`` (SQLite).

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

The persistent cache is one SQLite file in WAL mode shared by threads and processes. It waits at
most ``nx.config.cache_lock_timeout`` seconds (default 5) for a database another process holds
locked; then it goes on in memory for this process, with one warning (``fallback=False`` and
read-only opens raise :class:`CacheFileError`). A file at the cache's path that has SQLite's
header but fails SQLite's own checks is moved aside (renamed ``<name>.corrupt-<time>``, never
deleted) with a warning and a new database started, except by a read-only open (``nablax cache
list``/``show``), which changes nothing. When the file cannot be used (an unwritable folder, a
file that is not nablax's, a newer schema), kernels keep working with one warning.

Module map, one idea each:

- ``fingerprint.py``: the ``device`` part of every key (platform, device kind, versions);
- ``memory.py``: what is kept in memory (``ConfigCache``; ``MemoryDB``, the entries of a
  persistent cache that cannot write its file);
- ``persistent.py``: ``PersistentCache``, when to read, write, degrade and salvage;
- ``schema.py``: the file format (schema, statements, recognition, migrations);
- ``connections.py``: SQLite connections, locks, transactions and error codes;
- ``salvage.py``: recovering a damaged file (copy what is readable, keep the damaged one);
- ``encoding.py``: timings as JSON, ``loader``/``dumper``, classes found among imported modules;
- ``arguments.py``: the constructor's path and ejKernel's arguments;
- ``messages.py``: the text of every warning and error, ``warn_once``.
- ``live.py``: every live cache object together (the fork hook; ``nx.cache_info()`` and
  ``nx.clear_caches()`` over every ``ConfigCache`` and ``PersistentCache``).

Config JSON, the entry records and argument checks are in ``nablax/kernels/_configs.py``.
``nablax.kernels.cache`` re-exports the public names (its documented path).
"""

from __future__ import annotations

from .._configs import (
    CacheEntry,
    StoredConfig,
    cfg_from_json,
    cfg_to_json,
    declared_config_types,
    register_config_class,
)
from . import live  # noqa: F401  (registers the caches, the fork hook)
from .fingerprint import device_fingerprint, get_device_platform
from .memory import ConfigCache
from .persistent import CacheFileError, PersistentCache

__all__ = [
    "CacheEntry",
    "CacheFileError",
    "ConfigCache",
    "PersistentCache",
    "StoredConfig",
    "cfg_from_json",
    "cfg_to_json",
    "declared_config_types",
    "device_fingerprint",
    "get_device_platform",
    "register_config_class",
]

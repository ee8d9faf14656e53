"""What the store says: the text of every warning and error of the persistent cache (the same
text is the warning and the CLI's error), and ``warn_once``, which points a warning at the first
caller outside nablax."""

from __future__ import annotations

import sys
import threading
import warnings
from pathlib import Path
from typing import Any

from ... import _config
from .._configs import _package_version
from . import schema

_FIX_LOCATION = (
    "Fix: set NABLAX_CACHE_DIR to a writable folder (e.g. NABLAX_CACHE_DIR=/tmp/nablax-cache) "
    "or pass PersistentCache(path=...)."
)
_MEMORY_ONLY = (
    "kernels keep working with an in-memory config cache only (tuned configs are not saved "
    "between runs)"
)
_API = "nablax.kernels.PersistentCache"

# --- messages (the same text is the warning and the CLI's error) --------------------------------


def os_reason(e: OSError) -> str:
    return f"{type(e).__name__}: {e.strerror or e}"


def location_message(path: Path, reason: str) -> str:
    return f"{_API}: cannot use {path}: {reason}. {_MEMORY_ONLY.capitalize()}. {_FIX_LOCATION}"


def not_ours_message(path: Path, detail: str) -> str:
    return (
        f"{_API}: {path} is {detail}, not a nablax kernel database; nablax never modifies it, and "
        f"{_MEMORY_ONLY}. Fix: move that file away, or set NABLAX_CACHE_DIR to another folder "
        f"(or pass another path)."
    )


def newer_message(path: Path, version: int) -> str:
    return (
        f"{_API}: {path} was written by a newer nablax (schema {version}; this nablax "
        f"{_package_version()} writes schema {schema.SCHEMA_VERSION}). This nablax never "
        f"modifies it: it reads the entries it understands and keeps new ones in memory for this "
        f"process. Fix: upgrade nablax here, or give this version its own folder with "
        f"NABLAX_CACHE_DIR."
    )


def read_only_file_message(path: Path, reason: str) -> str:
    return (
        f"{_API}: {path}: {reason}; nablax reads its entries and keeps new ones in memory for "
        f"this process. {_FIX_LOCATION}"
    )


def locked_message(path: Path, detail: str, *, memory: bool) -> str:
    """``path`` stayed locked by another process for longer than ``cache_lock_timeout``."""
    waited = _config.get("cache_lock_timeout")
    then = f" {_MEMORY_ONLY.capitalize()}." if memory else " Nothing was changed."
    return (
        f"{_API}: {path} is locked by another process ({detail}; waited {waited} s, the option "
        f"cache_lock_timeout).{then} Fix: let the process holding it finish (another nablax "
        f"tuning, or a program with the file open in a transaction), raise "
        f"NABLAX_CACHE_LOCK_TIMEOUT, or give this process its own NABLAX_CACHE_DIR."
    )


def read_only_message(path: Path, info: schema.FileInfo) -> str:
    """Why a read-only open (``nablax cache list``) cannot read ``path``."""
    if info.kind == "locked":
        return locked_message(path, info.detail, memory=False)
    if info.kind == "no_folder":
        return location_message(path, info.detail)
    if info.kind == "missing":
        return (
            f"{_API}: no kernel database at {path} (nothing has been stored there yet). Fix: run "
            f"kernels or `nablax tune` first, or pass the path of an existing database."
        )
    if info.kind in ("damaged", "corrupt"):
        return unreadable_message(path, info.detail)
    return (
        f"{_API}: {path} is {info.detail}, not a nablax kernel database; nothing was changed. "
        f"Fix: pass the path of a nablax kernel database (default: NABLAX_CACHE_DIR or the user "
        f"cache dir, file kernels.sqlite)."
    )


def unreadable_message(path: Path, err: Any, problem: str | None = None) -> str:
    if problem is not None:  # a file this nablax already reads only (e.g. a newer schema)
        return (
            f"{_API}: cannot read the entries of {path} ({err}); only the entries this process "
            f"stores are used. {problem}"
        )
    return (
        f"{_API}: cannot read {path} ({err}); a read never repairs or changes it. Fix: open it "
        f"read-write (any kernel call, or PersistentCache(path)) to salvage a damaged database, "
        f"or use the nablax that wrote it."
    )


def salvage_message(path: Path, problem: str, kept: int, lost: int, aside: str) -> str:
    return (
        f"{_API}: {path} failed SQLite's integrity check ({problem}). Salvaged {kept} "
        f"entr{'y' if kept == 1 else 'ies'} into a new {path.name}; lost {lost} whose keys were "
        f"found but whose rows could not be read (entries on pages that are gone entirely are "
        f"in neither count). The damaged file is kept at {aside}; delete it once it is no longer "
        f"needed."
    )


_warned: set[str] = set()
_warned_lock = threading.Lock()
_PKG_DIR = str(Path(__file__).resolve().parents[2])


def warn_once(message: str, once: bool = True) -> None:
    """A ``RuntimeWarning`` pointing at the first caller outside nablax; with ``once``, each
    message at most once per process."""
    if once:
        with _warned_lock:
            if message in _warned:
                return
            _warned.add(message)
    level, frame = 2, sys._getframe(1)  # stacklevel 2 is warn_once's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PKG_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


def moved_aside_message(path: Path, detail: str, aside: str) -> str:
    return (
        f"{_API}: {path} is {detail}. It was moved aside to {aside} (kept, never deleted) and a "
        f"new kernel database is started at {path}; delete the old file once it is no longer "
        f"needed."
    )


def undeclared_message(path: Path, key: tuple, name: str) -> str:
    module, _, qualname = name.partition(":")
    return (
        f"{_API}: config class {name} is not one this process declared, nor a frozen dataclass "
        f"of a module it has imported, so its entries in {path} (e.g. {key}) are not used "
        f"(nablax never imports a module named by a cache entry). Fix: import {module} first, "
        f"pass types=[{qualname}] to get/get_entry/entries, or call "
        f"nablax.kernels.cache.register_config_class({qualname})."
    )

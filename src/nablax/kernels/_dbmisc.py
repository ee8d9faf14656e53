"""Helpers of ``PersistentCache`` (``_sqlite.py``): where the file is, what its warnings say, the
in-memory store used when the file cannot be written, ejKernel's constructor arguments, and the
salvage of a damaged file."""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
import re
import sqlite3
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import platformdirs

from .. import _config
from . import _dbfile
from ._configs import _package_version, _type_name

try:  # POSIX only; elsewhere salvage is guarded within the process only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

_FIX_LOCATION = (
    "Fix: set NABLAX_CACHE_DIR to a writable folder (e.g. NABLAX_CACHE_DIR=/tmp/nablax-cache) "
    "or pass PersistentCache(path=...)."
)
_MEMORY_ONLY = (
    "kernels keep working with an in-memory config cache only (tuned configs are not saved "
    "between runs)"
)
_API = "nablax.kernels.PersistentCache"

# --- where -------------------------------------------------------------------------------------


def default_path() -> Path:
    folder = _config.get("cache_dir") or platformdirs.user_cache_dir("nablax")
    return Path(folder).expanduser() / "kernels.sqlite"


def resolve_path(path: Any) -> Path:
    if path is None:
        return default_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{_API}: path must be a str or os.PathLike, got {type(path).__name__} {path!r:.60}. "
            f"Fix: pass a file path such as '~/.cache/nablax/kernels.sqlite', or None."
        )
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise ValueError(
            f"{_API}: path={str(path)!r} is not a file path; each thread opens its own "
            f"connection, so an in-memory database would not be shared. Fix: use ConfigCache for "
            f"memory, or a file path such as tempfile.mkdtemp() + '/kernels.sqlite'."
        )
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(
            f"{_API}: path={str(path)!r} is a directory. Fix: pass a file path such as "
            f"{str(p / 'kernels.sqlite')!r}, or set NABLAX_CACHE_DIR for the folder."
        )
    return p


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


def newer_message(path: Path, schema: int) -> str:
    return (
        f"{_API}: {path} was written by a newer nablax (schema {schema}; this nablax "
        f"{_package_version()} writes schema {_dbfile.SCHEMA_VERSION}). This nablax never "
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


def read_only_message(path: Path, info: _dbfile.FileInfo) -> str:
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
_PKG_DIR = str(Path(__file__).resolve().parents[1])


def warn_once(message: str, once: bool = True) -> None:
    """A ``RuntimeWarning`` pointing at the first caller outside nablax; with ``once``, each
    message at most once per process."""
    if once:
        with _warned_lock:
            if message in _warned:
                return
            _warned.add(message)
    import sys

    level, frame = 2, sys._getframe(1)  # stacklevel 2 is warn_once's caller
    while frame is not None and frame.f_code.co_filename.startswith(_PKG_DIR):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RuntimeWarning, stacklevel=level)


# --- connections -------------------------------------------------------------------------------


def code(e: sqlite3.Error) -> int:  # (extended) result codes: Python >= 3.11
    return getattr(e, "sqlite_errorcode", 0) & 0xFF


def is_busy(e: sqlite3.Error) -> bool:
    return code(e) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def is_corrupt(e: sqlite3.Error) -> bool:
    return code(e) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def timings_to_json(timings: tuple[tuple[str, float, str | None], ...]) -> str:
    # JSON has no inf/nan: non-finite seconds are stored as the strings "inf" / "nan".
    rows = [[c, s if math.isfinite(s) else str(s), e] for c, s, e in timings]
    return json.dumps(rows, separators=(",", ":"))


def timings_from_json(s: str) -> tuple[tuple[str, float, str | None], ...]:
    return tuple((c, float(secs), err) for c, secs, err in json.loads(s))


class Conn:
    """One thread's connection, with the file identity and cache epoch it was opened under."""

    __slots__ = ("conn", "epoch", "ino", "__weakref__")

    def __init__(self, conn: sqlite3.Connection, epoch: int, ino: tuple[int, int] | None):
        self.conn, self.epoch, self.ino = conn, epoch, ino


def file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@contextlib.contextmanager
def interprocess_lock(path: Path) -> Iterator[None]:
    """Serialize salvage across processes (so only one replaces the file); waits at most
    ``cache_lock_timeout`` seconds for another process, then raises ``TimeoutError``."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with open(f"{path}.lock", "a") as f:
        deadline = time.monotonic() + float(_config.get("cache_lock_timeout"))
        while True:  # bounded like SQLite's own locks: a stopped process must not hang us
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path}.lock is held by another process") from None
                time.sleep(0.02)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def transaction(
    conn: sqlite3.Connection, statements: list[tuple[str, tuple]], guard: Any = None
) -> list[int]:
    """Run ``statements`` in one write transaction (after ``guard(conn)``); return row counts."""
    conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no deadlocking lock upgrade later
    try:
        if guard is not None:
            guard(conn)
        counts = [conn.execute(sql, params).rowcount for sql, params in statements]
        conn.execute("COMMIT")
    except BaseException:
        _dbfile.rollback(conn)
        raise
    return counts


# --- memory store --------------------------------------------------------------------------------


class MemoryDB:
    """The entries of a cache that cannot write its file: one in-memory SQLite database with the
    same schema, shared by this object's threads (one statement sequence at a time)."""

    def __init__(self) -> None:
        self.conn = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self.conn.execute("BEGIN")
        _dbfile.build(self.conn, 0)
        self.conn.execute("COMMIT")
        self.lock = threading.Lock()

    def run(self, op: Any) -> Any:
        with self.lock:
            return op(self.conn)


# --- ejKernel's constructor arguments ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Seed:
    path: Any
    opname: str | None
    loader: Any
    dumper: Any
    cfg_types: tuple[type, ...]


_OPNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(@v[0-9]+)?")


def seed_arguments(
    args: tuple, path: Any, opname: Any, loader: Any, dumper: Any, cfg_type: Any, ignored: dict
) -> Seed:
    """Accept ``PersistentCache(path)`` as well as ejKernel's ``PersistentCache(opname,
    path=None, loader=None, dumper=None, cfg_type=None)``, by position or keyword."""
    if len(args) > 5:
        raise TypeError(
            f"{_API}: too many positional arguments. Fix: PersistentCache(path) or ejKernel's "
            f"PersistentCache(opname, path, loader, dumper, cfg_type)."
        )
    given = {"path": path, "opname": opname, "loader": loader, "dumper": dumper,
             "cfg_type": cfg_type}  # fmt: skip
    if len(args) == 1 and path is None and opname is None:
        bare = isinstance(args[0], str) and _OPNAME.fullmatch(args[0])
        # ejKernel's PersistentCache("matmul") names an op; anything else is a path
        names = ("opname",) if bare and not os.path.exists(args[0]) else ("path",)
    else:
        names = ("opname", "path", "loader", "dumper", "cfg_type")
    for name, value in zip(names, args):
        if given[name] is not None:
            raise TypeError(f"{_API}: {name} given twice (by position and by keyword).")
        given[name] = value
    path, opname, loader, dumper, cfg_type = given.values()
    for name, fn in (("loader", loader), ("dumper", dumper)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{_API}: {name} must be callable, got {type(fn).__name__}.")
    if opname is not None and not isinstance(opname, str):
        raise TypeError(f"{_API}: opname must be a str, got {type(opname).__name__}.")
    types = () if cfg_type is None else cfg_type if isinstance(cfg_type, tuple) else (cfg_type,)
    if not all(isinstance(t, type) for t in types):
        raise TypeError(
            f"{_API}: cfg_type must be a class or a tuple of classes, got {cfg_type!r}."
        )
    if ignored:
        warnings.warn(
            f"{_API}: ignoring argument(s) {', '.join(sorted(ignored))}: nablax's SQLite cache "
            f"takes path, opname, loader, dumper, cfg_type, read_only and fallback.",
            RuntimeWarning,
            stacklevel=3,
        )
    return Seed(path, opname, loader, dumper, types)


def dump_with(dumper: Any, cfg: Any, api: str) -> str:
    try:
        value = dumper(cfg)
        return json.dumps(
            {"type": _type_name(type(cfg)), "value": value},
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{api}: the dumper's result for {type(cfg).__name__} {cfg!r:.60} is not JSON ({e}). "
            f"Fix: make dumper return dicts, lists, strings, finite numbers, bools or None."
        ) from None


def load_with(loader: Any, text: str) -> Any:
    try:
        doc = json.loads(text)
        value = doc["value"] if "value" in doc else doc["fields"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{_API}: {text!r:.80} is not a stored config ({e}).") from None
    try:
        return loader(value)
    except Exception as e:  # noqa: BLE001 - the user's loader: its failure makes the entry stale
        raise TypeError(
            f"{_API}: the loader failed on {text!r:.80} ({type(e).__name__}: {e}); the entry is "
            f"stale. Fix: make loader accept what dumper returns (or the config's fields), or "
            f"re-tune."
        ) from None


# --- salvage -------------------------------------------------------------------------------------


def _aside_name(path: Path) -> str:
    base = f"{path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
    aside = base
    for n in itertools.count(1):
        if not os.path.exists(aside):
            break
        aside = f"{base}-{n}"
    return aside


def move_aside(path: Path) -> str:
    """Rename ``path`` (and its ``-wal``/``-shm``) to a free ``.corrupt-<time>`` name beside it;
    nothing is deleted. The caller holds the inter-process lock. Returns the new name."""
    aside = _aside_name(path)
    os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    return aside


def move_aside_if_corrupt(path: Path) -> tuple[_dbfile.FileInfo, str | None]:
    """If ``path`` still fails SQLite's checks (another process may have moved it already),
    rename it aside and warn. ``(what is at the path now, None)``, or ``(info, the problem)`` when
    it could not be moved."""
    try:
        with interprocess_lock(path):
            info = _dbfile.inspect(path)
            if info.kind != "corrupt":
                return info, None
            try:
                aside = move_aside(path)
            except OSError as e:
                reason = f"{info.detail}, and it could not be moved aside ({os_reason(e)})"
                return info, location_message(path, reason)
            warn_once(moved_aside_message(path, info.detail, aside), once=False)
    except TimeoutError as e:
        return _dbfile.inspect(path), locked_message(path, str(e), memory=True)
    return _dbfile.inspect(path), None


def moved_aside_message(path: Path, detail: str, aside: str) -> str:
    return (
        f"{_API}: {path} is {detail}. It was moved aside to {aside} (kept, never deleted) and a "
        f"new kernel database is started at {path}; delete the old file once it is no longer "
        f"needed."
    )


def imported_class(name: str) -> type | None:
    """The frozen dataclass that ``'module:qualname'`` names, if that module is already imported:
    nothing is imported, and no module or class ``__getattr__`` hook runs (plain ``__dict__``
    lookups)."""
    module, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module)
    if obj is None or not qualname:
        return None
    for part in qualname.split("."):
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if obj is None:
            return None
    params = getattr(obj, "__dataclass_params__", None)
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and params is not None:
        return obj if params.frozen else None
    return None


def undeclared_message(path: Path, key: tuple, name: str) -> str:
    module, _, qualname = name.partition(":")
    return (
        f"{_API}: config class {name} is not one this process declared, nor a frozen dataclass "
        f"of a module it has imported, so its entries in {path} (e.g. {key}) are not used "
        f"(nablax never imports a module named by a cache entry). Fix: import {module} first, "
        f"pass types=[{qualname}] to get/get_entry/entries, or call "
        f"nablax.kernels.cache.register_config_class({qualname})."
    )


def salvage_and_replace(path: Path) -> tuple[int, int, str]:
    """Copy what ``path`` still holds into a new database, keep the damaged file beside it and put
    the new one in its place. The caller holds the inter-process lock. The path never stops
    existing: the damaged file is hard-linked aside, then the new one replaces it atomically."""
    tmp = Path(f"{path}.salvage-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    dst = sqlite3.connect(tmp, isolation_level=None)
    try:
        dst.execute("BEGIN IMMEDIATE")
        _dbfile.build(dst, 0)
        dst.execute("COMMIT")
        kept, lost = _dbfile.salvage(path, dst)
    finally:
        dst.close()
    aside = _aside_name(path)
    try:
        os.link(path, aside)
    except OSError:  # no hard links here: move it (the path is missing for a moment)
        os.replace(path, aside)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.replace(f"{path}{suffix}", f"{aside}{suffix}")
    os.replace(tmp, path)
    return kept, lost, aside

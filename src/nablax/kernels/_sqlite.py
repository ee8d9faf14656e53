"""``PersistentCache``: the SQLite half of the kernel config caches (see ``cache.py``, which
re-exports it).

One SQLite file in WAL mode, opened once per thread and per process, so any number of threads and
processes may read and write it at the same time. A file that is not a valid database is moved
aside with a warning and replaced by an empty one.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import sqlite3
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import platformdirs

from .. import _config
from .cache import (
    _ABANDONED,
    _LIVE_CACHES,
    CacheEntry,
    _check_args,
    _encode,
    _norm_timings,
    _package_version,
    cfg_from_json,
)

try:  # POSIX only; elsewhere corrupt-file recovery is guarded within the process only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

SCHEMA_VERSION = 1
_BUSY_TIMEOUT_S = 30.0
_MAX_ATTEMPTS = 60  # retries of a locked/busy statement on top of SQLite's own busy timeout

# --- persistent cache ----------------------------------------------------------------------------

# Timings live in their own (rowid) table: they are 10x larger than the rest of an entry, and in
# the WITHOUT ROWID configs table they spilled into overflow pages (47 MB and 28 µs gets at 10,000
# entries); apart, configs stays small and cached, and a get reads only it.
_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS configs (
        device TEXT NOT NULL, op_id TEXT NOT NULL, call_key TEXT NOT NULL,
        cfg_json TEXT NOT NULL, source TEXT NOT NULL, package_version TEXT NOT NULL,
        created REAL NOT NULL, signature TEXT NOT NULL DEFAULT '',
        PRIMARY KEY (device, op_id, call_key)) WITHOUT ROWID""",
    "CREATE INDEX IF NOT EXISTS configs_by_op ON configs (op_id)",
    """CREATE TABLE IF NOT EXISTS timings (
        device TEXT NOT NULL, op_id TEXT NOT NULL, call_key TEXT NOT NULL,
        timings_json TEXT NOT NULL, PRIMARY KEY (device, op_id, call_key))""",
    """CREATE TABLE IF NOT EXISTS invocations (
        op_id TEXT NOT NULL, call_key TEXT NOT NULL, signature_json TEXT NOT NULL,
        count INTEGER NOT NULL, first_seen REAL NOT NULL, last_seen REAL NOT NULL,
        PRIMARY KEY (op_id, call_key)) WITHOUT ROWID""",
)
_SQL_GET = "SELECT cfg_json FROM configs WHERE device = ? AND op_id = ? AND call_key = ?"
_SQL_ENTRIES = """SELECT c.device, c.op_id, c.call_key, c.cfg_json, c.source,
    coalesce(t.timings_json, '[]'), c.package_version, c.created, c.signature
    FROM configs AS c LEFT JOIN timings AS t USING (device, op_id, call_key)"""
_SQL_PUT = """INSERT INTO configs VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (device, op_id, call_key) DO UPDATE SET cfg_json = excluded.cfg_json,
    source = excluded.source, package_version = excluded.package_version,
    created = excluded.created, signature = excluded.signature"""
_SQL_PUT_TIMINGS = """INSERT INTO timings VALUES (?, ?, ?, ?)
    ON CONFLICT (device, op_id, call_key) DO UPDATE SET timings_json = excluded.timings_json"""
_SQL_RECORD = """INSERT INTO invocations VALUES (?, ?, ?, 1, ?, ?)
    ON CONFLICT (op_id, call_key) DO UPDATE SET count = count + 1,
    signature_json = excluded.signature_json, last_seen = excluded.last_seen"""
_ORDER = " ORDER BY c.op_id, c.device, c.call_key"


class _SchemaMismatch(sqlite3.DatabaseError):
    """The file is a database of another (newer or older) nablax schema: treated like corruption."""


def _is_busy(e: sqlite3.Error) -> bool:  # (extended) result codes: Python >= 3.11
    return getattr(e, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def _is_corrupt(e: sqlite3.Error) -> bool:
    code = getattr(e, "sqlite_errorcode", 0) & 0xFF
    return isinstance(e, _SchemaMismatch) or code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _timings_to_json(timings: tuple[tuple[str, float, str | None], ...]) -> str:
    # JSON has no inf/nan: non-finite seconds are stored as the strings "inf" / "nan".
    rows = [[c, s if math.isfinite(s) else str(s), e] for c, s, e in timings]
    return json.dumps(rows, separators=(",", ":"))


def _timings_from_json(s: str) -> tuple[tuple[str, float, str | None], ...]:
    return tuple((c, float(secs), err) for c, secs, err in json.loads(s))


class _Conn:
    """One thread's connection, with the file identity and cache epoch it was opened under."""

    __slots__ = ("conn", "epoch", "ino", "__weakref__")

    def __init__(self, conn: sqlite3.Connection, epoch: int, ino: tuple[int, int] | None):
        self.conn, self.epoch, self.ino = conn, epoch, ino


def _file_id(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@contextlib.contextmanager
def _interprocess_lock(path: Path) -> Iterator[None]:
    """Serialize corrupt-file recovery across processes (so only one moves the file aside)."""
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    with open(f"{path}.lock", "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _default_path() -> Path:
    folder = _config.get("cache_dir") or platformdirs.user_cache_dir("nablax")
    return Path(folder).expanduser() / "kernels.sqlite"


def _resolve_path(path: Any) -> Path:
    if path is None:
        return _default_path()
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise ValueError(
            f"nablax.kernels.PersistentCache: path={str(path)!r} is not a file path; each thread "
            f"opens its own connection, so an in-memory database would not be shared. Fix: use "
            f"ConfigCache for memory, or a file path such as tempfile.mkdtemp() + '/kernels.sqlite'."
        )
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(
            f"nablax.kernels.PersistentCache: path={str(path)!r} is a directory. Fix: pass a file "
            f"path such as {str(p / 'kernels.sqlite')!r}, or set NABLAX_CACHE_DIR for the folder."
        )
    return p


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        # The statement's own error is what propagates; a failing ROLLBACK adds nothing to it.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def _transaction(conn: sqlite3.Connection, statements: list[tuple[str, tuple]]) -> list[int]:
    """Run ``statements`` in one write transaction; return their row counts."""
    conn.execute("BEGIN IMMEDIATE")  # take the write lock now: no deadlocking lock upgrade later
    try:
        counts = [conn.execute(sql, params).rowcount for sql, params in statements]
        conn.execute("COMMIT")
    except BaseException:
        _rollback(conn)
        raise
    return counts


def _create_schema(conn: sqlite3.Connection, version: int) -> None:
    if version == 0:
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have created the schema since we read user_version.
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                for stmt in _SCHEMA:
                    conn.execute(stmt)
                conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
                version = SCHEMA_VERSION
            conn.execute("COMMIT")
        except BaseException:
            _rollback(conn)
            raise
    if version != SCHEMA_VERSION:
        raise _SchemaMismatch(f"schema version {version}, this nablax reads {SCHEMA_VERSION}")


def _setup(conn: sqlite3.Connection) -> None:
    # journal_mode is stored in the file: only switch (which needs a lock) when not WAL yet.
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version != SCHEMA_VERSION:
        _create_schema(conn, version)


class PersistentCache:
    """Kernel configs and their timings in one SQLite file, shared by threads and processes.

    ``path`` defaults to ``<cache_dir>/kernels.sqlite``, where ``cache_dir`` is the option
    ``NABLAX_CACHE_DIR`` or the user cache dir (``platformdirs``). Each thread (and each process,
    also after ``fork``) uses its own connection; writes are short ``BEGIN IMMEDIATE`` upserts, and a
    busy database is waited for and retried. A file that is not a valid database (or one of another
    schema version) is moved aside to ``<name>.corrupt-<timestamp>`` with a ``RuntimeWarning`` and
    replaced by an empty database. Entries whose config class can no longer be imported are stale:
    ``get`` warns once and returns ``None``.

    >>> import dataclasses, os, tempfile
    >>> from nablax.kernels import PersistentCache
    >>> @dataclasses.dataclass(frozen=True)
    ... class TileCfg:
    ...     block: int = 64
    >>> path = os.path.join(tempfile.mkdtemp(), "kernels.sqlite")
    >>> cache = PersistentCache(path)
    >>> cache.put("cpu", "matmul@v1", "k1", TileCfg(32), source="autotune",
    ...           timings=[(TileCfg(32), 0.001, None), (TileCfg(64), float("inf"), "OOM")])
    >>> PersistentCache(path).get("cpu", "matmul@v1", "k1")
    TileCfg(block=32)
    >>> cache.get_entry("cpu", "matmul@v1", "k1").timings[1][1:]
    (inf, 'OOM')
    >>> len(cache), cache.delete("matmul@v1"), len(cache)
    (1, 1, 0)
    >>> cache.close()
    """

    def __init__(self, path: str | os.PathLike[str] | None = None):
        self._path = _resolve_path(path)
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _conns, _warned and corrupt-file recovery
        self._conns: weakref.WeakSet[_Conn] = weakref.WeakSet()
        self._epoch = 0  # bumped to make every thread reopen (close, recovery, fork)
        self._warned: set[tuple[str, str, str]] = set()
        _LIVE_CACHES.add(self)
        self._run(lambda conn: None)  # open now, so a corrupt file is reported (and moved) here

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    def __repr__(self) -> str:
        return f"PersistentCache({str(self._path)!r})"

    # -- connections, retries and recovery --

    def _conn(self) -> sqlite3.Connection:
        h = getattr(self._local, "h", None)
        if h is None or h.epoch != self._epoch:
            h = self._open()
        return h.conn

    def _open(self) -> _Conn:
        self._local.h = None
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(
            self._path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        # The file this thread opened: recovery only moves it aside if it is still at our path.
        self._local.file_id = _file_id(self._path)
        try:
            _setup(conn)
        except BaseException:
            conn.close()
            raise
        h = _Conn(conn, self._epoch, self._local.file_id)
        with self._lock:
            self._conns.add(h)
        self._local.h = h
        return h

    def _run(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``op`` on this thread's connection, waiting out locks and recovering corruption."""
        deadline = None
        for attempt in itertools.count(1):
            try:
                return op(self._conn())
            except sqlite3.DatabaseError as e:  # OperationalError ("locked") is a subclass
                if _is_busy(e):
                    now = time.monotonic()
                    deadline = deadline or now + _BUSY_TIMEOUT_S
                    if now > deadline or attempt >= _MAX_ATTEMPTS:
                        raise
                    time.sleep(min(0.001 * attempt, 0.05))
                elif _is_corrupt(e) and attempt <= 3:
                    self._recover(e)
                else:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _recover(self, err: sqlite3.Error) -> None:
        h = getattr(self._local, "h", None)
        self._local.h = None
        if h is not None:
            with contextlib.suppress(sqlite3.Error):
                h.conn.close()
        with self._lock, _interprocess_lock(self._path):
            current = _file_id(self._path)
            # Another thread or process may have replaced the file already: then just reopen.
            if current is not None and current == getattr(self._local, "file_id", None):
                aside = self._move_aside()
                warnings.warn(
                    f"nablax.kernels.PersistentCache: {self._path} is not a usable kernel "
                    f"database ({err}); moved it to {aside} and started an empty one. Delete "
                    f"the moved file once it is no longer needed.",
                    RuntimeWarning,
                    stacklevel=5,
                )
            self._epoch += 1

    def _move_aside(self) -> str:
        base = f"{self._path}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"
        aside = base
        for n in itertools.count(1):
            if not os.path.exists(aside):
                break
            aside = f"{base}-{n}"
        os.replace(self._path, aside)
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.replace(f"{self._path}{suffix}", f"{aside}{suffix}")
        return aside

    def _after_fork_in_child(self) -> None:
        _ABANDONED.extend(self._conns)
        _ABANDONED.append(getattr(self._local, "h", None))
        self._conns = weakref.WeakSet()
        self._lock = threading.Lock()
        self._epoch += 1

    def _decode(self, cfg_json: str, key: tuple[str, str, str]) -> Any:
        try:
            return cfg_from_json(cfg_json)
        except (TypeError, ValueError) as e:
            with self._lock:
                first = key not in self._warned
                self._warned.add(key)
            if first:
                warnings.warn(f"{e} (entry {key} in {self._path})", RuntimeWarning, stacklevel=3)
            return None

    def _entry(self, row: tuple) -> CacheEntry | None:
        cfg = self._decode(row[3], row[:3])
        if cfg is None:
            return None
        d, op, key, _, source, timings, version, created, sig = row
        return CacheEntry(
            d, op, key, cfg, source, _timings_from_json(timings), version, created, sig
        )

    # -- configs --

    def get(self, device: str, op_id: str, call_key: str) -> Any:
        """The stored config, or ``None`` (absent, or stale: its class cannot be imported)."""
        _check_args("nablax.kernels.PersistentCache.get", device, op_id, call_key)
        key = (device, op_id, call_key)
        row = self._run(lambda conn: conn.execute(_SQL_GET, key).fetchone())
        return None if row is None else self._decode(row[0], key)

    def get_entry(self, device: str, op_id: str, call_key: str) -> CacheEntry | None:
        """The whole :class:`CacheEntry` (config, source, timings, version, time), or ``None``."""
        _check_args("nablax.kernels.PersistentCache.get_entry", device, op_id, call_key)
        key = (device, op_id, call_key)
        sql = _SQL_ENTRIES + " WHERE c.device = ? AND c.op_id = ? AND c.call_key = ?"
        row = self._run(lambda conn: conn.execute(sql, key).fetchone())
        return None if row is None else self._entry(row)

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
        """Store (or replace) the config of one call, with every candidate's timing.

        ``timings``: ``(cfg_or_cfg_json, seconds, error_or_None)`` per candidate.
        """
        api = "nablax.kernels.PersistentCache.put"
        _check_args(api, device, op_id, call_key, source)
        if not isinstance(signature, str):
            raise TypeError(f"{api}: signature must be a str, got {type(signature).__name__}.")
        cfg_json = _encode(cfg, api)
        timings_json = _timings_to_json(_norm_timings(timings, api))
        key = (device, op_id, call_key)
        stmts = [
            (_SQL_PUT, (*key, cfg_json, source, _package_version(), time.time(), signature)),
            (_SQL_PUT_TIMINGS, (*key, timings_json)),
        ]
        self._run(lambda conn: _transaction(conn, stmts))

    def entries(self, op_id: str | None = None) -> list[CacheEntry]:
        """All entries (of one versioned op id if given), sorted by op, device and call key.

        Stale entries (config class not importable) are left out, with a warning.
        """
        sql, params = _SQL_ENTRIES, ()
        if op_id is not None:
            sql, params = sql + " WHERE c.op_id = ?", (op_id,)
        rows = self._run(lambda conn: conn.execute(sql + _ORDER, params).fetchall())
        return [e for e in map(self._entry, rows) if e is not None]

    def delete(self, op_id: str | None = None) -> int:
        """Remove the configs of ``op_id`` (all configs if ``None``); return how many."""
        where, params = ("", ()) if op_id is None else (" WHERE op_id = ?", (op_id,))
        stmts = [("DELETE FROM configs" + where, params), ("DELETE FROM timings" + where, params)]
        return self._run(lambda conn: _transaction(conn, stmts))[0]

    def clear(self) -> None:
        """Remove every config and every recorded invocation."""
        stmts = [(f"DELETE FROM {t}", ()) for t in ("configs", "timings", "invocations")]
        self._run(lambda conn: _transaction(conn, stmts))

    def __len__(self) -> int:
        return self._run(lambda conn: conn.execute("SELECT COUNT(*) FROM configs").fetchone()[0])

    # -- recorded invocations (NABLAX_OPS_RECORD=1) --

    def record_invocation(self, op_id: str, call_key: str, signature_json: str) -> None:
        """Count one call of ``op_id`` with ``call_key`` (its abstract signature as JSON)."""
        api = "nablax.kernels.PersistentCache.record_invocation"
        _check_args(api, "", op_id, call_key)
        if not isinstance(signature_json, str):
            raise TypeError(
                f"{api}: signature_json must be a str, got {type(signature_json).__name__}. "
                f"Fix: pass json.dumps(...) of the abstract shapes and dtypes."
            )
        now = time.time()
        params = (op_id, call_key, signature_json, now, now)
        self._run(lambda conn: _transaction(conn, [(_SQL_RECORD, params)]))

    def recorded(self, op_id: str | None = None) -> list[tuple[str, str, str, int]]:
        """``(op_id, call_key, signature_json, count)`` of recorded invocations, sorted."""
        sql, params = "SELECT op_id, call_key, signature_json, count FROM invocations", ()
        if op_id is not None:
            sql, params = sql + " WHERE op_id = ?", (op_id,)
        sql += " ORDER BY op_id, call_key"
        return [tuple(r) for r in self._run(lambda conn: conn.execute(sql, params).fetchall())]

    # -- lifetime --

    def close(self) -> None:
        """Close every connection this object opened; a later call opens new ones.

        Call it when no other thread is using the cache.
        """
        with self._lock:
            conns, self._conns = list(self._conns), weakref.WeakSet()
            self._epoch += 1
        for h in conns:
            with contextlib.suppress(sqlite3.Error):
                h.conn.close()
        self._local.h = None

    def __enter__(self) -> PersistentCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

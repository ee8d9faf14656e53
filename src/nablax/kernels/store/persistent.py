"""``PersistentCache``: the SQLite half of the kernel config store -- when to read, write,
degrade and salvage (the file format is ``schema.py``; see the package docstring for the map).

One SQLite file in WAL mode, opened once per thread and per process, so any number of threads and
processes may read and write it at the same time. When the file cannot be used the cache degrades
instead of failing, with one ``RuntimeWarning`` that names the path, the reason and the fix:

- ``"memory"``: no usable file (the folder cannot be created or written, or the path holds
  something that is not a nablax kernel database, which is never touched);
- ``"read-only"``: the file was written by a newer nablax (never modified by this one), or cannot
  be written: its entries are read, new ones are kept in memory for this process.

A database that fails SQLite's own integrity check is salvaged: every entry that can still be read
is copied into a new file, the damaged one is kept beside it, and a warning gives both counts.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ... import _caches
from ...errors import NablaxError
from .._configs import (
    _ABANDONED,
    _LIVE_CACHES,
    CacheEntry,
    _check_args,
    _encode,
    _norm_timings,
    _package_version,
)
from . import arguments, connections, encoding, memory, messages, salvage, schema
from .schema import NewerSchema, NotOurs

_MAX_ATTEMPTS = 60  # retries of a locked/busy statement on top of SQLite's own busy timeout
_UNUSABLE = (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_PERM)
_DECODED = 1024  # decoded configs kept per cache object


class CacheFileError(NablaxError, RuntimeError):
    """The kernel database cannot be used as asked: a read-only open of something that is not a
    readable nablax kernel database, or a write where ``fallback=False``. The message names the
    path, what is there and the fix."""


class _Switched(Exception):
    """The cache changed mode (read-write -> read-only or memory) during an operation: redo it."""


class _Moved(Exception):
    """The file at the path is no longer the one this thread opened (salvaged by another)."""


class PersistentCache:
    """Kernel configs and their timings in one SQLite file, shared by threads and processes.

    ``path`` defaults to ``<cache_dir>/kernels.sqlite``, where ``cache_dir`` is the option
    ``NABLAX_CACHE_DIR`` or the user cache dir (``platformdirs``). Each thread (and each
    process, also after ``fork``) uses its own connection; writes are short ``BEGIN IMMEDIATE``
    upserts, and a busy database is waited for and retried.

    When the file cannot be used the cache degrades (``mode``) with one ``RuntimeWarning`` (its text
    is ``problem``) instead of failing: ``"memory"`` when there is no usable file (unwritable
    folder; a file that is not a nablax kernel database, which is never touched) and
    ``"read-only"`` for a file written by a newer nablax (read, never modified; new entries stay in
    memory). ``fallback=False`` raises :class:`CacheFileError` instead. A database that fails
    SQLite's integrity check is salvaged into a new file (see the module docstring). Stored config
    classes are looked up among declared classes, never imported (see ``nablax.kernels.store``).

    ``read_only=True`` opens an existing database for reading only (``nablax cache list``): it
    creates, renames and writes nothing, and raises :class:`CacheFileError` when the path is not a
    nablax kernel database.

    The arguments of ejKernel's ``PersistentCache(opname, path, loader, dumper, cfg_type)`` are
    accepted: a bare name such as ``"matmul"`` (or ``opname=``) selects nothing here, since one
    database holds every op, keyed by ``op_id``; ``loader``/``dumper`` convert configs to and from
    JSON values; ``cfg_type`` declares config classes for reading. Other keywords are ignored with
    one warning.

    >>> import dataclasses, os, tempfile
    >>> from nablax.kernels import PersistentCache
    >>> @dataclasses.dataclass(frozen=True)
    ... class TileCfg:
    ...     block: int = 64
    >>> path = os.path.join(tempfile.mkdtemp(), "kernels.sqlite")
    >>> cache = PersistentCache(path)
    >>> cache.put("cpu", "matmul@v1", "k1", TileCfg(32), source="autotune",
    ...           timings=[(TileCfg(32), 0.001, None), (TileCfg(64), float("inf"), "OOM")])
    True
    >>> PersistentCache(path).get("cpu", "matmul@v1", "k1")
    TileCfg(block=32)
    >>> cache.get_entry("cpu", "matmul@v1", "k1").timings[1][1:]
    (inf, 'OOM')
    >>> PersistentCache(path, read_only=True).entries()[0].cfg
    TileCfg(block=32)
    >>> len(cache), cache.delete("matmul@v1"), len(cache), cache.mode
    (1, 1, 0, 'read-write')
    >>> cache.close()
    """

    def __init__(
        self,
        *args: Any,
        path: str | os.PathLike[str] | None = None,
        opname: str | None = None,
        loader: Callable[[Any], Any] | None = None,
        dumper: Callable[[Any], Any] | None = None,
        cfg_type: Any = None,
        read_only: bool = False,
        fallback: bool = True,
        **ignored: Any,
    ):
        seed = arguments.seed_arguments(args, path, opname, loader, dumper, cfg_type, ignored)
        self.opname: str | None = seed.opname
        self._loader, self._dumper, self._types = seed.loader, seed.dumper, seed.cfg_types
        self._path = arguments.resolve_path(seed.path)
        self._read_only, self._fallback = bool(read_only), bool(fallback)
        self._local = threading.local()
        self._lock = threading.Lock()  # guards _conns, _warned, mode changes and salvage
        self._conns: weakref.WeakSet[connections.Conn] = weakref.WeakSet()
        self._epoch = 0  # bumped to make every thread reopen (close, mode change, salvage, fork)
        self._warned: set[tuple[str, str, str]] = set()
        # cfg_json -> config: configs are frozen, so equal text gives an equal config
        self._decoded = _caches.Cache("kernels.persistent_decoded", _DECODED, register=False)
        self._file: str | None = "ro" if read_only else "rw"  # how the file is used; None: not
        self._mem: memory.MemoryDB | None = None  # entries kept in this process only
        self.problem: str | None = None
        _LIVE_CACHES.add(self)
        if read_only:
            self._start_read_only()
        else:
            self._start()

    @property
    def path(self) -> Path:
        """The database file."""
        return self._path

    @property
    def mode(self) -> str:
        """``"read-write"``, ``"read-only"`` (reads the file, keeps new entries in memory, or
        refuses writes when opened with ``read_only=True``) or ``"memory"`` (no file)."""
        return {"rw": "read-write", "ro": "read-only", None: "memory"}[self._file]

    def __repr__(self) -> str:
        return f"PersistentCache({str(self._path)!r}, mode={self.mode!r})"

    # -- opening and degrading --

    def _start(self) -> None:
        info = schema.inspect(self._path)
        if info.kind == "corrupt":  # where the cache is to be kept: move it aside, start anew
            info = self._move_aside()
            if info is None:
                return
        if info.kind == "nablax" and info.schema > schema.SCHEMA_VERSION:
            self._degrade("ro", messages.newer_message(self._path, info.schema))
            return
        if info.kind in ("not_sqlite", "foreign", "not_file", "unreadable"):
            self._degrade(None, messages.not_ours_message(self._path, info.detail))
            return
        if info.kind == "no_folder":
            self._degrade(None, messages.location_message(self._path, info.detail))
            return
        if info.kind == "locked":
            self._degrade(None, messages.locked_message(self._path, info.detail, memory=True))
            return
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self._degrade(None, messages.location_message(self._path, messages.os_reason(e)))
            return
        with contextlib.suppress(_Switched):
            self._run(lambda conn: None)  # open now: create or migrate here
            if info.kind == "damaged":  # read it all now, so that it is salvaged here
                self._run(lambda conn: conn.execute("SELECT count(*) FROM configs").fetchone())

    def _move_aside(self) -> schema.FileInfo | None:
        """Rename a file that fails SQLite's checks aside (never delete it), with a warning;
        what is at the path now, or None when it could not be moved (the cache went to memory)."""
        with self._lock:
            info, problem = salvage.move_aside_if_corrupt(self._path)
        if problem is not None:
            self._degrade(None, problem)
            return None
        return info

    def _start_read_only(self) -> None:
        info = schema.inspect(self._path)
        if info.kind != "nablax":
            raise CacheFileError(messages.read_only_message(self._path, info))
        try:
            self._run(lambda conn: conn.execute("SELECT count(*) FROM configs").fetchone())
        except sqlite3.DatabaseError as e:
            raise CacheFileError(messages.unreadable_message(self._path, e)) from None

    def _degrade(self, file_mode: str | None, message: str) -> None:
        """Stop writing the file (``"ro"``: keep reading it; ``None``: forget it), keep new
        entries in memory, warn once per process and problem."""
        with self._lock:
            self._file = file_mode
            self.problem = message
            if self._mem is None:
                self._mem = memory.MemoryDB()
            self._epoch += 1
        if not self._fallback:
            raise CacheFileError(message)
        messages.warn_once(message)

    # -- connections, retries and recovery --

    def _conn(self) -> sqlite3.Connection:
        h = getattr(self._local, "h", None)
        if h is None or h.epoch != self._epoch:
            if h is not None:
                with contextlib.suppress(sqlite3.Error):
                    h.conn.close()
            h = self._open()
        return h.conn

    def _open(self) -> connections.Conn:
        self._local.h = None
        if self._file is None:
            raise _Switched()
        epoch = self._epoch
        if self._file == "ro":
            conn = connections.connect_readonly(self._path)
        else:
            conn = connections.connect_readwrite(self._path)
        # The file this thread opened: salvage and writes check it is still the one at our path.
        self._local.file_id = connections.file_id(self._path)
        try:
            if self._file == "rw":
                schema.prepare_for_writing(conn)
                schema.set_wal(conn)
        except BaseException:
            conn.close()
            raise
        h = connections.Conn(conn, epoch, self._local.file_id)
        with self._lock:
            self._conns.add(h)
        self._local.h = h
        return h

    def _guard(self, conn: sqlite3.Connection) -> None:
        """Inside a write transaction: is this still our file, and still a schema we may write?"""
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > schema.SCHEMA_VERSION:
            raise NewerSchema(version)
        if connections.file_id(self._path) != getattr(self._local, "file_id", None):
            raise _Moved()

    def _run(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        """Run ``op`` on this thread's file connection, waiting out locks, reopening a moved
        file, salvaging a damaged one; raises ``_Switched`` when the cache changed mode."""
        # SQLite waits up to the timeout inside one statement; the retries below cover the busy
        # answers it gives at once (a lock upgrade): together never longer than the timeout
        deadline = time.monotonic() + connections.busy_timeout_s()
        for attempt in itertools.count(1):
            try:
                return op(self._conn())
            except _Moved:  # salvaged or deleted by another process: use the file there now
                h, self._local.h = self._local.h, None
                with contextlib.suppress(sqlite3.Error):
                    h.conn.close()
                if attempt > 5:
                    raise CacheFileError(
                        f"nablax.kernels.PersistentCache: {self._path} keeps being replaced by "
                        f"another process. Fix: give this process its own NABLAX_CACHE_DIR."
                    ) from None
            except NewerSchema as e:
                self._degrade("ro", messages.newer_message(self._path, e.version))
                raise _Switched() from None
            except NotOurs as e:
                self._degrade(None, messages.not_ours_message(self._path, str(e)))
                raise _Switched() from None
            except sqlite3.DatabaseError as e:  # OperationalError ("locked") is a subclass
                if connections.is_busy(e):
                    if time.monotonic() > deadline or attempt >= _MAX_ATTEMPTS:
                        self._locked(e)  # raises
                    time.sleep(min(0.001 * attempt, 0.05))
                elif self._file == "rw" and connections.code(e) in _UNUSABLE:
                    readable = os.access(self._path, os.R_OK)
                    reason = f"it cannot be written ({type(e).__name__}: {e})"
                    if readable:
                        self._degrade("ro", messages.read_only_file_message(self._path, reason))
                    else:
                        self._degrade(None, messages.location_message(self._path, reason))
                    raise _Switched() from None
                elif self._file != "rw" and connections.code(e) == sqlite3.SQLITE_READONLY:
                    raise _Switched() from None  # another thread degraded the cache meanwhile
                elif self._file == "rw" and connections.is_corrupt(e) and attempt <= 3:
                    try:
                        self._recover(e)
                    except TimeoutError as t:  # another process holds the salvage lock
                        self._locked(t)
                    except NotOurs as n:  # replaced meanwhile by something that is not ours
                        self._degrade(None, messages.not_ours_message(self._path, str(n)))
                        raise _Switched() from None
                else:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _locked(self, err: sqlite3.Error) -> None:
        """Another process held the file locked past ``cache_lock_timeout``: a read-only open
        (``nablax cache list``) or ``fallback=False`` raises ``CacheFileError``; else the cache
        goes on in memory for this process (one warning) instead of waiting again."""
        h, self._local.h = getattr(self._local, "h", None), None
        if h is not None:
            with contextlib.suppress(sqlite3.Error):
                h.conn.close()
        if self._read_only:
            raise CacheFileError(messages.locked_message(self._path, str(err), memory=False))
        self._degrade(None, messages.locked_message(self._path, str(err), memory=self._fallback))
        raise _Switched()

    def _recover(self, err: sqlite3.Error) -> None:
        h = getattr(self._local, "h", None)
        self._local.h = None
        if h is not None:
            with contextlib.suppress(sqlite3.Error):
                h.conn.close()
        with self._lock, connections.interprocess_lock(self._path):
            # Another thread or process may have salvaged the file already: then just reopen.
            if connections.file_id(self._path) == getattr(self._local, "file_id", None):
                info = schema.inspect(self._path)
                if info.kind not in ("nablax", "damaged"):
                    raise NotOurs(info.detail)  # replaced by something that is not ours
                problems = schema.integrity_problems(self._path)
                if not problems:
                    raise err  # SQLite finds the file sound: nothing to salvage
                kept, lost, aside = salvage.salvage_and_replace(self._path)
                messages.warn_once(
                    messages.salvage_message(self._path, problems[0], kept, lost, aside), once=False
                )
            self._epoch += 1

    def _after_fork_in_child(self) -> None:
        _ABANDONED.extend(self._conns)
        _ABANDONED.append(getattr(self._local, "h", None))
        self._conns = weakref.WeakSet()
        self._lock = threading.Lock()
        self._decoded._lock = threading.RLock()  # another thread may have held it at fork time
        self._epoch += 1
        if self._mem is not None:  # the parent's connection is not safe here: start empty
            _ABANDONED.append(self._mem)
            self._mem = memory.MemoryDB()

    # -- reading and writing, whatever the mode --

    def _read(self, op: Callable[[sqlite3.Connection], Any]) -> tuple[Any, Any]:
        """``(memory result, file result)``; ``None`` where that part is absent or unreadable."""
        for _ in range(3):
            file_result = None
            if self._file is not None:
                try:
                    file_result = self._run(op)
                except _Switched:
                    continue
                except sqlite3.DatabaseError as e:
                    if self._read_only:
                        raise CacheFileError(messages.unreadable_message(self._path, e)) from None
                    if self._file != "ro":
                        raise
                    # A newer schema this nablax cannot read, or damage it must not repair.
                    messages.warn_once(messages.unreadable_message(self._path, e, self.problem))
            mem = self._mem
            return (mem.run(op) if mem is not None else None), file_result
        raise AssertionError("the cache kept changing mode")  # pragma: no cover

    def _first(self, op: Callable[[sqlite3.Connection], Any]) -> Any:
        """The row ``op`` finds in memory, else in the file (read-write: the file only, fast)."""
        if self._file == "rw" and self._mem is None:
            with contextlib.suppress(_Switched):
                return self._run(op)
        mem_row, file_row = self._read(op)
        return mem_row or file_row

    def _write(self, statements: list[tuple[str, tuple]], api: str) -> list[int]:
        while True:
            if self._file == "rw":
                try:
                    return self._run(
                        lambda conn: connections.transaction(conn, statements, self._guard)
                    )
                except _Switched:
                    continue
            if self._mem is None:
                raise CacheFileError(
                    f"{api}: {self._path} was opened with read_only=True. Fix: open it with "
                    f"PersistentCache(path) to change it."
                )
            return self._mem.run(lambda conn: connections.transaction(conn, statements))

    def _types_for(self, types: Any) -> Any:
        if not self._types:
            return types
        return lambda: (*self._types, *((types() if callable(types) else types) or ()))

    def _decode(self, cfg_json: str, key: tuple[str, str, str], types: Any = None) -> Any:
        cfg = self._decoded.get(cfg_json)
        if cfg is not None:
            return cfg
        try:
            if self._loader is not None:
                return encoding.load_with(self._loader, cfg_json)
            cfg, undeclared = encoding.decode_config(cfg_json, self._types_for(types))
            if undeclared is not None:
                self._warn((undeclared,), messages.undeclared_message(self._path, key, undeclared))
                return None
            self._decoded.put(cfg_json, cfg)
            return cfg
        except (TypeError, ValueError) as e:
            self._warn(key, f"{e} (entry {key} in {self._path})")
            return None

    def _warn(self, what: tuple, message: str) -> None:
        """One warning per ``what`` (an entry's key, or a class name) and cache object."""
        with self._lock:
            first = what not in self._warned
            self._warned.add(what)
        if first:
            messages.warn_once(message, once=False)

    def _entry(self, row: tuple, resolve: bool = True, types: Any = None) -> CacheEntry | None:
        if not resolve:  # the stored text, no class rebuilt (``nablax cache list``)
            return encoding.entry_from_row(row, encoding.stored_text(row[3]))
        cfg = self._decode(row[3], tuple(row[:3]), types)
        return None if cfg is None else encoding.entry_from_row(row, cfg)

    # -- configs --

    def get(self, device: str, op_id: str, call_key: str, *, types: Any = None) -> Any:
        """The stored config, or ``None`` (absent, or stale: its class is not declared or no longer
        fits). ``types``: config classes to accept besides the declared ones (see ``nablax.kernels.store``)."""
        _check_args("nablax.kernels.PersistentCache.get", device, op_id, call_key)
        key = (device, op_id, call_key)
        row = self._first(lambda conn: conn.execute(schema.SQL_GET, key).fetchone())
        return None if row is None else self._decode(row[0], key, types)

    def get_entry(
        self, device: str, op_id: str, call_key: str, *, types: Any = None
    ) -> CacheEntry | None:
        """The whole :class:`CacheEntry` (config, source, timings, version, time), or ``None``."""
        _check_args("nablax.kernels.PersistentCache.get_entry", device, op_id, call_key)
        key = (device, op_id, call_key)
        sql = schema.SQL_ENTRIES + " WHERE c.device = ? AND c.op_id = ? AND c.call_key = ?"
        row = self._first(lambda conn: conn.execute(sql, key).fetchone())
        return None if row is None else self._entry(row, True, types)

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
        expect_created: Any = ...,
    ) -> bool:
        """Store (or replace) one call's config and every candidate's timing; True when stored.

        ``timings``: ``(cfg_or_cfg_json, seconds, error_or_None)`` per candidate. A float or None
        ``expect_created`` (see ``created``) makes it a compare-and-set: stored only while the
        stored entry's ``created`` is still that (None: there is none), else nothing changes and
        the answer is False. Two processes tuning one call at once so keep the first result."""
        api = "nablax.kernels.PersistentCache.put"
        _check_args(api, device, op_id, call_key, source)
        if not isinstance(signature, str):
            raise TypeError(f"{api}: signature must be a str, got {type(signature).__name__}.")
        if expect_created is not ... and not isinstance(expect_created, (float, type(None))):
            kind = type(expect_created).__name__
            raise TypeError(
                f"{api}: expect_created must be a float from created() or None, got {kind}."
            )
        encode = _encode if self._dumper is None else self._dump
        cfg_json = encode(cfg, api)
        timings_json = encoding.timings_to_json(_norm_timings(timings, api, encode))
        key = (device, op_id, call_key)
        row = (*key, cfg_json, source, _package_version(), time.time(), signature)
        if expect_created is ...:
            statements = [(schema.SQL_PUT, row), (schema.SQL_PUT_TIMINGS, (*key, timings_json))]
        else:
            statements = [
                (schema.SQL_PUT_IF, (*row, expect_created)),
                (schema.SQL_PUT_TIMINGS_IF, (*key, timings_json, *key, row[6], cfg_json)),
            ]
        return self._write(statements, api)[0] > 0

    def created(self, device: str, op_id: str, call_key: str) -> float | None:
        """When one call's entry was written, or None (a stale entry counts too): see ``put``."""
        _check_args("nablax.kernels.PersistentCache.created", device, op_id, call_key)
        key = (device, op_id, call_key)
        row = self._first(lambda conn: conn.execute(schema.SQL_CREATED, key).fetchone())
        return None if row is None else row[0]

    def _dump(self, cfg: Any, api: str) -> str:
        return encoding.dump_with(self._dumper, cfg, api)

    def entries(
        self, op_id: str | None = None, *, resolve: bool = True, types: Any = None
    ) -> list[CacheEntry]:
        """All entries (of one versioned op id if given), sorted by op, device and call key.

        Stale entries (config class not declared, see ``nablax.kernels.store``) are left out, with a warning.
        ``resolve=False`` rebuilds no class at all: configs come back as :class:`StoredConfig`
        text (what ``nablax cache list`` shows).
        """
        sql, params = schema.SQL_ENTRIES, ()
        if op_id is not None:
            sql, params = sql + " WHERE c.op_id = ?", (op_id,)
        mem_rows, file_rows = self._read(lambda conn: conn.execute(sql, params).fetchall())
        rows = {tuple(r[:3]): r for r in file_rows or ()}
        rows.update({tuple(r[:3]): r for r in mem_rows or ()})  # this process's entries win
        out = (self._entry(rows[k], resolve, types) for k in sorted(rows, key=_op_first))
        return [e for e in out if e is not None]

    def delete(self, op_id: str | None = None) -> int:
        """Remove the configs of ``op_id`` (all configs if ``None``); return how many.

        In ``"read-only"`` mode only the entries kept in memory are removed."""
        where, params = ("", ()) if op_id is None else (" WHERE op_id = ?", (op_id,))
        stmts = [("DELETE FROM configs" + where, params), ("DELETE FROM timings" + where, params)]
        return self._write(stmts, "nablax.kernels.PersistentCache.delete")[0]

    def clear(self) -> None:
        """Remove every config and every recorded invocation (see ``delete`` for read-only)."""
        stmts = [(f"DELETE FROM {t}", ()) for t in ("configs", "timings", "invocations")]
        self._write(stmts, "nablax.kernels.PersistentCache.clear")

    def __len__(self) -> int:
        if self._mem is None:
            _, n = self._read(lambda conn: conn.execute("SELECT count(*) FROM configs").fetchone())
            return 0 if n is None else n[0]
        mem_keys, file_keys = self._read(lambda conn: conn.execute(schema.SQL_KEYS).fetchall())
        return len(set(mem_keys or ()) | set(file_keys or ()))

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
        self._write([(schema.SQL_RECORD, (op_id, call_key, signature_json, now, now))], api)

    def recorded(self, op_id: str | None = None) -> list[tuple[str, str, str, int]]:
        """``(op_id, call_key, signature_json, count)`` of recorded invocations, sorted (counts
        kept in memory in ``"read-only"`` mode are added to the file's)."""
        sql, params = schema.SQL_RECORDED, ()
        if op_id is not None:
            sql, params = sql + " WHERE op_id = ?", (op_id,)
        mem_rows, file_rows = self._read(lambda conn: conn.execute(sql, params).fetchall())
        merged: dict[tuple[str, str], tuple[str, str, str, int]] = {}
        for op, key, sig, count in [*(file_rows or ()), *(mem_rows or ())]:
            old = merged.get((op, key))
            merged[(op, key)] = (op, key, sig, count + (old[3] if old else 0))
        return [merged[k] for k in sorted(merged)]

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


def _op_first(key: tuple[str, str, str]) -> tuple[str, str, str]:
    device, op_id, call_key = key
    return (op_id, device, call_key)

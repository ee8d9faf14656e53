"""How the store talks to SQLite: connections (one per thread, or one that reads without creating
anything), how long a locked database is waited for, the file lock that serializes salvage across
processes, write transactions, and what SQLite's error codes mean here."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ... import _config

try:  # POSIX only; elsewhere salvage is guarded within the process only
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]


def busy_timeout_s() -> float:
    """How long to wait for a database another process holds locked: the option
    ``cache_lock_timeout`` (seconds), read at each connection."""
    return float(_config.get("cache_lock_timeout"))


def wal_files(path: Path) -> tuple[str, str]:
    return f"{path}-wal", f"{path}-shm"


def connect_readonly(path: Path) -> sqlite3.Connection:
    """A connection that cannot write and creates no file. With a live ``-wal``/``-shm`` pair it
    sees every committed write (``mode=ro``); without one the main file holds everything, and
    ``immutable=1`` reads it without creating the pair that ``mode=ro`` would leave behind."""
    wal, shm = wal_files(path)
    mode = "mode=ro" if os.path.exists(wal) and os.path.exists(shm) else "immutable=1"
    uri = f"file:{urllib.parse.quote(os.path.abspath(path))}?{mode}"
    return sqlite3.connect(
        uri, uri=True, timeout=busy_timeout_s(), isolation_level=None, check_same_thread=False
    )


def connect_readwrite(path: Path) -> sqlite3.Connection:
    """A connection for one thread's reads and writes (transactions are explicit)."""
    return sqlite3.connect(
        path, timeout=busy_timeout_s(), isolation_level=None, check_same_thread=False
    )


# --- error codes ---------------------------------------------------------------------------------


def code(e: BaseException) -> int:  # (extended) result codes: Python >= 3.11
    return getattr(e, "sqlite_errorcode", 0) & 0xFF


def is_busy(e: BaseException) -> bool:
    return code(e) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def is_corrupt(e: BaseException) -> bool:
    return code(e) in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


# --- one thread's connection -----------------------------------------------------------------------


class Conn:
    """One thread's connection, with the file identity and cache epoch it was opened under."""

    __slots__ = ("conn", "epoch", "ino", "__weakref__")

    def __init__(self, conn: sqlite3.Connection, epoch: int, ino: tuple[int, int] | None):
        self.conn, self.epoch, self.ino = conn, epoch, ino


def file_id(path: Path) -> tuple[int, int] | None:
    """``(device, inode)`` of the file at ``path`` (None when there is none): tells whether the
    file a thread opened is still the one at the path."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


# --- locks and transactions ------------------------------------------------------------------------


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


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        # The statement's own error is what propagates; a failing ROLLBACK adds nothing to it.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


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
        rollback(conn)
        raise
    return counts

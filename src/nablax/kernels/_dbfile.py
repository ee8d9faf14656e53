"""The kernel database file: its schema, how a file is recognized as nablax's, how it is read
without creating anything, migrated, checked and salvaged. ``PersistentCache`` (``_sqlite.py``)
decides when; this module only knows the file.

Rules (see the README section "Where nablax keeps data"):

- A file is nablax's when its SQLite header carries :data:`APPLICATION_ID` (or, for files written
  before the id was stamped, schema 1 with nablax's three tables). Anything else -- a text file,
  another application's SQLite database, an empty database of someone else's -- is never created,
  modified, renamed or migrated.
- Schema changes are migrations (:data:`MIGRATIONS`), each additive (new tables, new columns with
  defaults), run in one write transaction: a file is migrated in place atomically, and an older
  nablax can still read a newer file. A file of a newer schema is never written by an older nablax.
- Reading never creates a file: a WAL database whose ``-wal``/``-shm`` files do not exist is read
  as ``immutable`` (``mode=ro`` would create them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sqlite3
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from .. import _config

# Module attributes, read at call time (tests simulate another nablax by changing them).
SCHEMA_VERSION = 1
APPLICATION_ID = 0x6E784B43  # "nxKC": nablax kernel configs, at offset 68 of the SQLite header
_MAGIC = b"SQLite format 3\x00"
TABLES = frozenset({"configs", "timings", "invocations"})


def busy_timeout_s() -> float:
    """How long to wait for a database another process holds locked: the option
    ``cache_lock_timeout`` (seconds), read at each connection."""
    return float(_config.get("cache_lock_timeout"))


# Schema 1, frozen forever; a new file is BASE_SCHEMA plus every migration. Timings live in their
# own (rowid) table: in the WITHOUT ROWID configs table they spilled into overflow pages (47 MB
# and 28 µs gets at 10,000 entries); apart, a get reads only the small configs table.
BASE_SCHEMA = (
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
# MIGRATIONS[v]: the statements that turn schema v into v + 1 (additive only, see above).
MIGRATIONS: dict[int, tuple[str, ...]] = {}


class NewerSchema(sqlite3.DatabaseError):
    """The file was written by a newer nablax: this one must not write it."""

    def __init__(self, version: int):
        super().__init__(f"schema version {version}, newer than this nablax's {SCHEMA_VERSION}")
        self.version = version


class NotOurs(sqlite3.DatabaseError):
    """The file at the path is not (or no longer) a nablax kernel database."""


@dataclasses.dataclass(frozen=True)
class FileInfo:
    """What is at a path. ``kind``: ``"nablax"`` (``schema`` says which), ``"missing"``,
    ``"no_folder"`` (the folder cannot exist: a parent is a regular file), ``"empty"`` (0 bytes, or
    a SQLite database without tables or ids), ``"damaged"`` (nablax's header, unreadable inside),
    ``"not_sqlite"``, ``"foreign"`` (another application's SQLite database), ``"not_file"``,
    ``"unreadable"``. ``detail`` says it in words, for messages."""

    kind: str
    detail: str
    schema: int = 0


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


def _describe_bytes(head: bytes) -> str:
    text = head[:40]
    try:
        s = text.decode("utf-8")
    except UnicodeDecodeError:
        return "binary data, not a SQLite database"
    if s.isprintable() or all(ch.isprintable() or ch in "\r\n\t" for ch in s):
        return f"a text file starting with {s.splitlines()[0][:30]!r}" if s.strip() else "text"
    return "binary data, not a SQLite database"


def _missing(path: Path) -> FileInfo:
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                return FileInfo("no_folder", f"{parent} is a file, not a folder")
            return FileInfo("missing", "no such file")
    return FileInfo("missing", "no such file")  # pragma: no cover - '/' always exists


def _header_ids(head: bytes) -> tuple[int, int]:
    """(user_version, application_id) from the 100-byte SQLite header (big-endian)."""
    return int.from_bytes(head[60:64], "big"), int.from_bytes(head[68:72], "big")


def inspect(path: Path) -> FileInfo:
    """What ``path`` holds, found without creating or changing anything."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return _missing(path)
    except NotADirectoryError:
        return _missing(path)
    except OSError as e:
        return FileInfo("unreadable", f"cannot stat it ({type(e).__name__}: {e.strerror or e})")
    if not os.path.isfile(path):
        return FileInfo("not_file", "not a regular file")
    if st.st_size == 0:
        return FileInfo("empty", "an empty file")
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except OSError as e:
        return FileInfo("unreadable", f"cannot read it ({type(e).__name__}: {e.strerror or e})")
    if head.startswith(_MAGIC) and len(head) < 100:
        return FileInfo("corrupt", f"a SQLite file cut short ({len(head)} bytes, no full header)")
    if len(head) < 100 or not head.startswith(_MAGIC):
        return FileInfo("not_sqlite", _describe_bytes(head))
    version, app = _header_ids(head)
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            app = conn.execute("PRAGMA application_id").fetchone()[0]
            tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    except sqlite3.DatabaseError as e:
        if getattr(e, "sqlite_errorcode", 0) & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED):
            return FileInfo("locked", f"locked by another process ({e})", version)
        if app == APPLICATION_ID or (app == 0 and 1 <= version <= SCHEMA_VERSION):
            return FileInfo("damaged", f"a damaged nablax kernel database ({e})", version)
        if getattr(e, "sqlite_errorcode", 0) & 0xFF in (
            sqlite3.SQLITE_CORRUPT,
            sqlite3.SQLITE_NOTADB,
        ):
            # the SQLite header, but SQLite cannot read it: broken, whoever wrote it
            return FileInfo("corrupt", f"a SQLite file that fails SQLite's integrity check ({e})")
        return FileInfo("unreadable", f"a SQLite file this nablax cannot read ({e})")
    return classify(version, app, tables)


def classify(version: int, app: int, tables: set[str]) -> FileInfo:
    """Whose database this is, from its ids and table names."""
    if app == APPLICATION_ID or (app == 0 and version >= 1 and TABLES <= tables):
        return FileInfo("nablax", f"a nablax kernel database (schema {version})", version)
    if app == 0 and version == 0 and not tables:
        return FileInfo("empty", "an empty SQLite database")
    names = ", ".join(sorted(t for t in tables if not t.startswith("sqlite_"))[:6]) or "none"
    return FileInfo(
        "foreign",
        f"another application's SQLite database (application_id {app:#x}, user_version "
        f"{version}, tables: {names})",
    )


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def ids(conn: sqlite3.Connection) -> tuple[int, int]:
    return (
        conn.execute("PRAGMA user_version").fetchone()[0],
        conn.execute("PRAGMA application_id").fetchone()[0],
    )


def rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        # The statement's own error is what propagates; a failing ROLLBACK adds nothing to it.
        with contextlib.suppress(sqlite3.Error):
            conn.execute("ROLLBACK")


def build(conn: sqlite3.Connection, from_version: int) -> None:
    """Create (``from_version`` 0) or migrate the schema up to ``SCHEMA_VERSION`` (in the
    caller's transaction) and stamp the ids."""
    if from_version == 0:
        for stmt in BASE_SCHEMA:
            conn.execute(stmt)
        from_version = 1
    for v in range(from_version, SCHEMA_VERSION):
        for stmt in MIGRATIONS[v]:
            conn.execute(stmt)
    conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def prepare_for_writing(conn: sqlite3.Connection) -> int:
    """Make ``conn``'s file ready for this nablax: create the schema of an empty database, migrate
    an older one, stamp the ids -- all in one write transaction, so concurrent openers see either
    the old file or the finished one. Returns the schema it found. Raises :class:`NewerSchema`
    (nothing written) or :class:`NotOurs`."""
    version, app = ids(conn)
    if version > SCHEMA_VERSION:
        raise NewerSchema(version)
    if version == SCHEMA_VERSION and app == APPLICATION_ID:
        return version
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Read again under the write lock: another process may have built or migrated it.
        version, app = ids(conn)
        tables = _tables(conn)
        if version > SCHEMA_VERSION:
            raise NewerSchema(version)
        info = classify(version, app, tables)
        if info.kind not in ("nablax", "empty"):
            raise NotOurs(info.detail)
        if version < SCHEMA_VERSION or app != APPLICATION_ID:
            build(conn, version)
        conn.execute("COMMIT")
    except BaseException:
        rollback(conn)
        raise
    return version


def set_wal(conn: sqlite3.Connection) -> None:
    # journal_mode is stored in the file: only switch (which needs a lock) when not WAL yet.
    if conn.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = NORMAL")


def integrity_problems(path: Path) -> list[str]:
    """SQLite's own ``integrity_check`` of the file (empty when it passes)."""
    try:
        with contextlib.closing(connect_readonly(path)) as conn:
            rows = [r[0] for r in conn.execute("PRAGMA integrity_check(10)")]
    except sqlite3.DatabaseError as e:
        return [str(e)]
    return [] if rows == ["ok"] else rows


# --- salvage -------------------------------------------------------------------------------------

_KEYS = {"configs": "device, op_id, call_key", "timings": "device, op_id, call_key",
         "invocations": "op_id, call_key"}  # fmt: skip
# The columns of schema 1, which every later schema keeps (migrations only add).
_COLUMNS = {
    "configs": "device, op_id, call_key, cfg_json, source, package_version, created, signature",
    "timings": "device, op_id, call_key, timings_json",
    "invocations": "op_id, call_key, signature_json, count, first_seen, last_seen",
}
# Every way to walk a table's keys: a damaged page stops one walk, not the others (forward and
# backward through the table's own b-tree, and through an index that is a separate b-tree).
_KEY_WALKS = {
    "configs": ("", " INDEXED BY configs_by_op ORDER BY op_id", " INDEXED BY configs_by_op "
                "ORDER BY op_id DESC"),
    "timings": (" ORDER BY rowid", " ORDER BY rowid DESC", " ORDER BY device, op_id, call_key",
                " ORDER BY device DESC, op_id DESC, call_key DESC"),
    "invocations": ("", " ORDER BY op_id DESC, call_key DESC"),
}  # fmt: skip


def _walk(conn: sqlite3.Connection, sql: str) -> Iterator[tuple]:
    try:
        yield from conn.execute(sql)  # rows come one step at a time: all before the damage
    except sqlite3.DatabaseError:
        return


def _known_keys(conn: sqlite3.Connection, table: str) -> set[tuple]:
    cols = _KEYS[table]
    desc = ", ".join(f"{c} DESC" for c in cols.split(", "))
    walks = (*_KEY_WALKS[table], f" ORDER BY {cols}", f" ORDER BY {desc}")
    keys: set[tuple] = set()
    for w in dict.fromkeys(walks):
        keys.update(_walk(conn, f"SELECT {cols} FROM {table}{w}"))
    return {k for k in keys if all(isinstance(x, str) for x in k)}  # no garbled keys


# Column types of a sound row; JSON columns must parse. A damaged page can yield rows without an
# error (bytes of another cell, zeros): those fail these checks and count as lost.
_KINDS = {
    "configs": ("s", "s", "s", "j", "s", "s", "n", "s"),
    "timings": ("s", "s", "s", "j"),
    "invocations": ("s", "s", "j", "i", "n", "n"),
}


def _sound(row: tuple, kinds: tuple[str, ...]) -> bool:
    for v, k in zip(row, kinds):
        if k in "sj" and not (isinstance(v, str) and "\x00" not in v):
            return False
        if k == "j" and not _valid_json(v):
            return False
        if k == "n" and not isinstance(v, (int, float)):
            return False
        if k == "i" and not isinstance(v, int):
            return False
    return True


def _row(conn: sqlite3.Connection, table: str, key: tuple) -> tuple | None:
    """The row of ``key`` if it can be read and looks sound, else None."""
    where = " AND ".join(f"{c} = ?" for c in _KEYS[table].split(", "))
    sql = f"SELECT {_COLUMNS[table]} FROM {table} WHERE {where}"
    try:
        row = conn.execute(sql, key).fetchone()
    except sqlite3.DatabaseError:
        return None
    return row if row is not None and _sound(row, _KINDS[table]) else None


def salvage(src: Path, dst: sqlite3.Connection) -> tuple[int, int]:
    """Copy every entry of the damaged database ``src`` that can still be read, row by row, into
    ``dst`` (an empty database with the current schema). Returns ``(kept, lost)`` entries, where
    ``lost`` counts entries whose keys were found but whose config row could not be read."""
    try:
        conn = connect_readonly(src)
    except sqlite3.Error:
        return 0, 0
    kept = lost = 0
    with contextlib.closing(conn):
        try:
            # Read the table list even when a table's root page is gone (a truncated file): with
            # this flag SQLite skips the schema's sanity checks. It writes nothing by itself.
            conn.execute("PRAGMA writable_schema = ON")
            src_tables = _tables(conn)
        except sqlite3.DatabaseError:
            return 0, 0
        dst.execute("BEGIN IMMEDIATE")
        try:
            entries = set()
            for t in ("configs", "timings"):
                if t in src_tables:
                    entries |= _known_keys(conn, t)
            for key in sorted(entries):
                row = _row(conn, "configs", key) if "configs" in src_tables else None
                if row is None:
                    lost += 1
                    continue
                _insert(dst, "configs", row)
                t = _row(conn, "timings", key) if "timings" in src_tables else None
                if t is not None:
                    _insert(dst, "timings", t)
                kept += 1
            if "invocations" in src_tables:
                for key in sorted(_known_keys(conn, "invocations")):
                    row = _row(conn, "invocations", key)
                    if row is not None:
                        _insert(dst, "invocations", row)
            dst.execute("COMMIT")
        except BaseException:
            rollback(dst)
            raise
    return kept, lost


def _insert(dst: sqlite3.Connection, table: str, row: tuple) -> None:
    marks = ", ".join("?" * len(row))
    dst.execute(f"INSERT OR REPLACE INTO {table} ({_COLUMNS[table]}) VALUES ({marks})", row)


def _valid_json(s: object) -> bool:
    if not isinstance(s, str):
        return False
    try:
        json.loads(s)
    except ValueError:
        return False
    return True

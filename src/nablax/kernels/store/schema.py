"""The kernel database file format: its schema and statements, how a file is recognized as
nablax's, how it is migrated and checked. ``PersistentCache`` (``persistent.py``) decides when;
this module only knows the file (``salvage.py`` copies what a damaged one still holds).

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
import os
import sqlite3
from pathlib import Path

from .connections import connect_readonly, rollback

# Module attributes, read at call time (tests simulate another nablax by changing them).
SCHEMA_VERSION = 1
APPLICATION_ID = 0x6E784B43  # "nxKC": nablax kernel configs, at offset 68 of the SQLite header
_MAGIC = b"SQLite format 3\x00"
TABLES = frozenset({"configs", "timings", "invocations"})


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

# The statements of the store (columns of schema 1, which every later schema keeps).
SQL_GET = "SELECT cfg_json FROM configs WHERE device = ? AND op_id = ? AND call_key = ?"
SQL_ENTRIES = """SELECT c.device, c.op_id, c.call_key, c.cfg_json, c.source,
    coalesce(t.timings_json, '[]'), c.package_version, c.created, c.signature
    FROM configs AS c LEFT JOIN timings AS t USING (device, op_id, call_key)"""
SQL_PUT = """INSERT INTO configs (device, op_id, call_key, cfg_json, source, package_version,
    created, signature) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
    ON CONFLICT (device, op_id, call_key) DO UPDATE SET cfg_json = excluded.cfg_json,
    source = excluded.source, package_version = excluded.package_version,
    created = excluded.created, signature = excluded.signature"""
# put(..., expect_created=c): the same insert, but an existing row is replaced only while its
# ``created`` is still ``c`` (NULL: never), and the timings go in only with the row written here
SQL_PUT_IF = SQL_PUT + " WHERE configs.created IS ?"
SQL_PUT_TIMINGS_IF = """INSERT INTO timings (device, op_id, call_key, timings_json)
    SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM configs WHERE device = ? AND op_id = ?
    AND call_key = ? AND created = ? AND cfg_json = ?)
    ON CONFLICT (device, op_id, call_key) DO UPDATE SET timings_json = excluded.timings_json"""
SQL_CREATED = "SELECT created FROM configs WHERE device = ? AND op_id = ? AND call_key = ?"
SQL_PUT_TIMINGS = """INSERT INTO timings (device, op_id, call_key, timings_json)
    VALUES (?, ?, ?, ?)
    ON CONFLICT (device, op_id, call_key) DO UPDATE SET timings_json = excluded.timings_json"""
SQL_RECORD = """INSERT INTO invocations (op_id, call_key, signature_json, count, first_seen,
    last_seen) VALUES (?, ?, ?, 1, ?, ?)
    ON CONFLICT (op_id, call_key) DO UPDATE SET count = count + 1,
    signature_json = excluded.signature_json, last_seen = excluded.last_seen"""
SQL_KEYS = "SELECT device, op_id, call_key FROM configs"
SQL_RECORDED = "SELECT op_id, call_key, signature_json, count FROM invocations"


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


def table_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def ids(conn: sqlite3.Connection) -> tuple[int, int]:
    return (
        conn.execute("PRAGMA user_version").fetchone()[0],
        conn.execute("PRAGMA application_id").fetchone()[0],
    )


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
        tables = table_names(conn)
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

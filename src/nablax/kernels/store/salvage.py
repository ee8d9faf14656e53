"""Recovering a damaged kernel database: :func:`salvage` copies every entry a damaged file still
holds, row by row, into a new one (``salvage_and_replace`` puts it in place and keeps the damaged
file beside it); a file that fails SQLite's checks where the cache is to live is moved aside
(``move_aside_if_corrupt``). Nothing is ever deleted."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from . import messages, schema
from .connections import connect_readonly, interprocess_lock, rollback

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
            src_tables = schema.table_names(conn)
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


# --- replacing the file --------------------------------------------------------------------------


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


def move_aside_if_corrupt(path: Path) -> tuple[schema.FileInfo, str | None]:
    """If ``path`` still fails SQLite's checks (another process may have moved it already),
    rename it aside and warn. ``(what is at the path now, None)``, or ``(info, the problem)`` when
    it could not be moved."""
    try:
        with interprocess_lock(path):
            info = schema.inspect(path)
            if info.kind != "corrupt":
                return info, None
            try:
                aside = move_aside(path)
            except OSError as e:
                reason = f"{info.detail}, and it could not be moved aside ({messages.os_reason(e)})"
                return info, messages.location_message(path, reason)
            messages.warn_once(messages.moved_aside_message(path, info.detail, aside), once=False)
    except TimeoutError as e:
        return schema.inspect(path), messages.locked_message(path, str(e), memory=True)
    return schema.inspect(path), None


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
        schema.build(dst, 0)
        dst.execute("COMMIT")
        kept, lost = salvage(path, dst)
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

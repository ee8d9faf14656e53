"""Tests of nablax/kernels/store/connections.py: write transactions are all or nothing, the salvage
lock waits at most ``cache_lock_timeout``, a read-only connection creates no file, and SQLite's
error codes are told apart."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
import time

import pytest

from nablax import _config
from nablax.kernels.store import connections, schema


@pytest.fixture
def conn(tmp_path):
    c = connections.connect_readwrite(tmp_path / "kernels.sqlite")
    schema.prepare_for_writing(c)
    yield c
    c.close()


def _recorded(conn) -> list[tuple]:
    return conn.execute(schema.SQL_RECORDED).fetchall()


def test_transaction_runs_every_statement_and_returns_row_counts(conn):
    rec = schema.SQL_RECORD
    counts = connections.transaction(
        conn, [(rec, ("a@v1", "k", "{}", 1.0, 1.0)), (rec, ("a@v1", "k", "{}", 2.0, 2.0))]
    )
    assert counts == [1, 1] and _recorded(conn) == [("a@v1", "k", "{}", 2)]
    assert not conn.in_transaction


def test_a_failing_statement_rolls_back_the_whole_transaction(conn):
    statements = [
        (schema.SQL_RECORD, ("a@v1", "k", "{}", 1.0, 1.0)),
        ("INSERT INTO no_such_table VALUES (1)", ()),
    ]
    with pytest.raises(sqlite3.OperationalError, match="no_such_table"):
        connections.transaction(conn, statements)
    assert _recorded(conn) == [] and not conn.in_transaction


def test_a_guard_that_refuses_writes_nothing(conn):
    def guard(c):
        raise schema.NewerSchema(schema.SCHEMA_VERSION + 1)

    with pytest.raises(schema.NewerSchema):
        connections.transaction(conn, [(schema.SQL_RECORD, ("a", "k", "{}", 1.0, 1.0))], guard)
    assert _recorded(conn) == [] and not conn.in_transaction


def test_the_salvage_lock_is_waited_for_at_most_the_lock_timeout(tmp_path):
    path = tmp_path / "kernels.sqlite"
    held, release = threading.Event(), threading.Event()

    def holder():
        with connections.interprocess_lock(path):
            held.set()
            release.wait(10)

    t = threading.Thread(target=holder)
    t.start()
    try:
        assert held.wait(10)
        with _config.override(cache_lock_timeout=1):
            start = time.monotonic()
            with pytest.raises(TimeoutError, match=r"kernels.sqlite.lock is held"):
                with connections.interprocess_lock(path):
                    pass
            assert 0.9 < time.monotonic() - start < 5
    finally:
        release.set()
        t.join(10)
    with connections.interprocess_lock(path):  # free again
        pass


def test_a_read_only_connection_cannot_write_and_creates_no_file(tmp_path, conn):
    path = tmp_path / "kernels.sqlite"
    conn.execute("PRAGMA journal_mode = DELETE")  # no -wal/-shm pair: read as immutable
    before = sorted(p.name for p in tmp_path.iterdir())
    with contextlib.closing(connections.connect_readonly(path)) as ro:
        assert schema.TABLES <= schema.table_names(ro)
        with pytest.raises(sqlite3.DatabaseError) as err:
            ro.execute(schema.SQL_RECORD, ("a", "k", "{}", 1.0, 1.0))
    assert connections.code(err.value) == sqlite3.SQLITE_READONLY
    assert not connections.is_busy(err.value) and not connections.is_corrupt(err.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_error_codes_of_a_locked_and_a_broken_database(tmp_path, conn):
    path = tmp_path / "kernels.sqlite"
    conn.execute("BEGIN IMMEDIATE")  # hold the write lock
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=0, isolation_level=None)) as other:
            with pytest.raises(sqlite3.OperationalError) as err:
                other.execute("BEGIN IMMEDIATE")
        assert connections.is_busy(err.value) and not connections.is_corrupt(err.value)
    finally:
        conn.execute("ROLLBACK")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4096)
    with contextlib.closing(sqlite3.connect(junk)) as broken:
        with pytest.raises(sqlite3.DatabaseError) as err:
            broken.execute("SELECT * FROM sqlite_master").fetchall()
    assert connections.is_corrupt(err.value)


def test_file_id_tells_a_replaced_file(tmp_path):
    path = tmp_path / "f"
    assert connections.file_id(path) is None
    path.write_text("a")
    first = connections.file_id(path)
    other = tmp_path / "g"
    other.write_text("b")
    other.replace(path)
    assert first is not None and connections.file_id(path) not in (None, first)

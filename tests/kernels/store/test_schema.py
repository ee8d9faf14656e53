"""Tests of nablax/kernels/store/schema.py: whose file a database is, how an empty one is built and
an older one migrated in one transaction, and that a file that is not ours or is newer is never
written (the file-level behaviour through PersistentCache: test_files.py, test_environments.py)."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from nablax.kernels.store import schema
from nablax.kernels.store.connections import connect_readwrite


def _ids(path) -> tuple[int, int, set[str]]:
    with contextlib.closing(sqlite3.connect(path)) as raw:
        return (*schema.ids(raw), schema.table_names(raw))


@pytest.mark.parametrize(
    ("version", "app", "tables", "kind"),
    [
        (1, schema.APPLICATION_ID, set(), "nablax"),
        (1, 0, {"configs", "timings", "invocations"}, "nablax"),  # before the id was stamped
        (0, 0, set(), "empty"),
        (0, 0, {"users"}, "foreign"),
        (1, 0, {"configs"}, "foreign"),  # schema 1 without nablax's three tables
        (3, 1234, {"configs", "timings", "invocations"}, "foreign"),  # another application id
    ],
)
def test_classify_by_ids_and_tables(version, app, tables, kind):
    info = schema.classify(version, app, tables)
    assert info.kind == kind
    if kind == "foreign":
        assert (
            f"application_id {app:#x}" in info.detail and f"user_version {version}" in info.detail
        )


def test_prepare_builds_an_empty_database_and_stamps_it(tmp_path):
    path = tmp_path / "new.sqlite"
    with contextlib.closing(connect_readwrite(path)) as conn:
        assert schema.prepare_for_writing(conn) == 0  # found: nothing
        assert schema.prepare_for_writing(conn) == schema.SCHEMA_VERSION  # a no-op the 2nd time
    version, app, tables = _ids(path)
    assert (version, app) == (schema.SCHEMA_VERSION, schema.APPLICATION_ID)
    assert schema.TABLES <= tables
    assert schema.inspect(path).kind == "nablax"


def test_prepare_refuses_a_foreign_database_and_leaves_it_alone(tmp_path):
    path = tmp_path / "app.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
        raw.commit()
    before = path.read_bytes()
    with contextlib.closing(connect_readwrite(path)) as conn:
        with pytest.raises(schema.NotOurs, match="another application's SQLite database"):
            schema.prepare_for_writing(conn)
        assert not conn.in_transaction
    assert path.read_bytes() == before


def test_prepare_refuses_a_newer_schema_without_writing(tmp_path):
    path = tmp_path / "newer.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as raw:
        raw.execute(f"PRAGMA user_version = {schema.SCHEMA_VERSION + 1}")
        raw.execute(f"PRAGMA application_id = {schema.APPLICATION_ID}")
    before = path.read_bytes()
    with contextlib.closing(connect_readwrite(path)) as conn:
        with pytest.raises(schema.NewerSchema) as err:
            schema.prepare_for_writing(conn)
    assert err.value.version == schema.SCHEMA_VERSION + 1
    assert path.read_bytes() == before


def test_an_older_file_is_migrated_in_place(tmp_path, monkeypatch):
    path = tmp_path / "old.sqlite"
    with contextlib.closing(connect_readwrite(path)) as conn:
        schema.prepare_for_writing(conn)
        conn.execute(schema.SQL_RECORD, ("op@v1", "k", "{}", 1.0, 1.0))
    # a newer nablax: schema 2 adds a column (migrations are additive)
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 2)
    monkeypatch.setitem(schema.MIGRATIONS, 1, ("ALTER TABLE configs ADD COLUMN note TEXT",))
    with contextlib.closing(connect_readwrite(path)) as conn:
        assert schema.prepare_for_writing(conn) == 1
        columns = [r[1] for r in conn.execute("PRAGMA table_info(configs)")]
        kept = conn.execute(schema.SQL_RECORDED).fetchall()
    assert columns[-1] == "note" and kept == [("op@v1", "k", "{}", 1)]
    assert _ids(path)[:2] == (2, schema.APPLICATION_ID)


@pytest.mark.parametrize(
    ("content", "kind"),
    [
        (b"", "empty"),
        (b"milk\neggs\n", "not_sqlite"),
        (b"SQLite format 3\x00" + b"\x00" * 20, "corrupt"),  # SQLite's header, cut short
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 200, "not_sqlite"),
    ],
)
def test_inspect_names_what_a_file_holds_without_creating_anything(tmp_path, content, kind):
    path = tmp_path / "kernels.sqlite"
    path.write_bytes(content)
    assert schema.inspect(path).kind == kind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels.sqlite"]
    assert path.read_bytes() == content


def test_inspect_of_a_missing_file_and_of_a_path_under_a_file(tmp_path):
    assert schema.inspect(tmp_path / "none.sqlite").kind == "missing"
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    info = schema.inspect(blocker / "sub" / "kernels.sqlite")
    assert info.kind == "no_folder" and str(blocker) in info.detail

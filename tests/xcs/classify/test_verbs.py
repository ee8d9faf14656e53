"""``classify/verbs.py``: what the words of a name say (identifier words, write and read verbs,
an SQL statement's first keyword), checked against plain expectations and, for SQL, against
SQLite's own view of what a statement does."""

from __future__ import annotations

import sqlite3

import pytest

from nablax.xcs.classify.records import READ, WRITE
from nablax.xcs.classify.verbs import (
    creates_completion,
    own_name_writes,
    sql_status,
    tokens,
    verb_status,
)


@pytest.mark.parametrize(
    "name, words",
    [
        ("put_object", ["put", "object"]),
        ("sendMessage", ["send", "message"]),
        ("HTTPError", ["http", "error"]),
        ("get_s3_bucket2", ["get", "s", "3", "bucket", "2"]),
        ("__call__", ["call"]),
        ("", []),
    ],
)
def test_tokens_are_the_lowercase_words_of_an_identifier(name, words):
    assert tokens(name) == words


@pytest.mark.parametrize(
    "name, status",
    [
        ("send_invoice", (WRITE, "send")),
        ("list_objects", (READ, "list")),
        ("get_or_create", (WRITE, "create")),
        ("get_post", (READ, "get")),  # the first verb of a part decides: a post is read here
        ("chat_postMessage", (WRITE, "post")),  # a read noun lets a later write verb decide
        ("similarity_search", (READ, "similarity")),
        ("format_row", (None, "")),
        ("create_connection", (READ, "create_connection")),  # an exact entry
        ("DELETE", (WRITE, "delete")),
    ],
)
def test_verb_status(name, status):
    assert verb_status(name) == status


def test_own_names_ignore_weak_verbs():
    assert own_name_writes("send_invoice") == "send"
    assert own_name_writes("create_prompt") is None  # `create` alone is too common
    assert own_name_writes("add_numbers") is None
    assert own_name_writes("fetch_page") is None  # a read


def test_completion_requests_are_not_writes():
    assert creates_completion("create_completion") and creates_completion("createChatCompletion")
    assert not creates_completion("create_user")
    assert not creates_completion("delete_completion")  # another write verb


_SQL = [
    "SELECT * FROM t",
    "select count(*) from t where a > 1",
    "INSERT INTO t VALUES (1, 'x')",
    "UPDATE t SET b = 'y' WHERE a = 1",
    "DELETE FROM t WHERE a = 2",
    "REPLACE INTO t VALUES (3, 'z')",
    "CREATE TABLE u (a INTEGER)",
    "DROP TABLE t",
    "ALTER TABLE t ADD COLUMN c TEXT",
    "WITH s AS (SELECT a FROM t) SELECT * FROM s",
    "WITH s AS (SELECT a FROM t) DELETE FROM t WHERE a IN (SELECT a FROM s)",
    "PRAGMA table_info(t)",
    "VALUES (1), (2)",
    "EXPLAIN SELECT * FROM t",
]


def _sqlite_writes(statement: str) -> bool:
    """Whether SQLite's authorizer sees ``statement`` change the database."""
    writes = {
        sqlite3.SQLITE_INSERT,
        sqlite3.SQLITE_UPDATE,
        sqlite3.SQLITE_DELETE,
        sqlite3.SQLITE_CREATE_TABLE,
        sqlite3.SQLITE_DROP_TABLE,
        sqlite3.SQLITE_ALTER_TABLE,
    }
    seen: list[int] = []
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE TABLE t (a INTEGER, b TEXT)")

        def authorizer(action, *_):
            seen.append(action)
            return sqlite3.SQLITE_OK

        conn.set_authorizer(authorizer)
        conn.execute(statement)
    finally:
        conn.close()
    return bool(writes & set(seen))


@pytest.mark.parametrize("statement", _SQL)
def test_sql_status_agrees_with_sqlite(statement):
    assert sql_status(statement) == (WRITE if _sqlite_writes(statement) else READ)


def test_text_that_is_not_sql():
    assert sql_status("hello there") is None and sql_status("") is None and sql_status("42") is None

"""Corpus: data access and scripting: sqlite3 and SQLAlchemy-style sessions (reads vs writes),
pandas, redis / MongoDB handles passed in, files and paths, subprocesses, and blocking waits
(``time.sleep``) (labels: kind, effects)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import time
from pathlib import Path

import numpy as np

try:
    import pandas as pd
except ImportError:  # optional
    pd = None

try:
    from sqlalchemy import select, text
except ImportError:  # optional
    select = text = None

USERS_BY_AGE = "SELECT id, name FROM users WHERE age >= ? ORDER BY name"


def users_over(conn: sqlite3.Connection, age: int) -> list[tuple]:
    return conn.execute(USERS_BY_AGE, (age,)).fetchall()


def add_user(conn, name: str, email: str) -> int:
    cur = conn.execute("INSERT INTO users(name, email) VALUES (?, ?)", (name, email))
    conn.commit()
    return cur.lastrowid


def deactivate_users(db, ids: list[int]) -> None:
    db.executemany("UPDATE users SET active = 0 WHERE id = ?", [(i,) for i in ids])
    db.commit()


def count_orders(cursor, day: str) -> int:
    cursor.execute(f"SELECT COUNT(*) FROM orders WHERE day = '{day}'")
    return cursor.fetchone()[0]


def archive_old_rows(session, cutoff: str) -> int:
    result = session.execute(text("DELETE FROM events WHERE ts < :cutoff"), {"cutoff": cutoff})
    session.commit()
    return result.rowcount


def active_emails(session, User) -> list[str]:
    rows = session.execute(select(User.email).where(User.active.is_(True))).scalars()
    return list(rows)


def save_order(session, order) -> None:
    session.add(order)
    session.commit()


def monthly_revenue(path: str) -> pd.Series:
    df = pd.read_csv(path, parse_dates=["ts"])
    return df.groupby(df["ts"].dt.to_period("M"))["amount"].sum()


def clean_frame(df: pd.DataFrame) -> pd.DataFrame:
    df = df.dropna(subset=["price"]).copy()
    df["price_z"] = (df["price"] - df["price"].mean()) / df["price"].std()
    return df


def export_frame(df, out_path: str) -> str:
    df.to_parquet(out_path, index=False)
    return out_path


def cache_get(redis_client, key: str):
    raw = redis_client.get(key)
    return json.loads(raw) if raw is not None else None


def cache_put(redis_client, key: str, value, ttl: int = 3600) -> None:
    redis_client.set(key, json.dumps(value), ex=ttl)


def find_open_tickets(tickets, owner: str) -> list[dict]:
    return list(tickets.find({"owner": owner, "state": "open"}).limit(50))


def insert_ticket(collection, ticket: dict) -> str:
    return str(collection.insert_one(ticket).inserted_id)


def read_jsonl(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def write_jsonl(path: str, rows: list[dict]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def append_csv_row(path: str, row: list) -> None:
    with open(path, "a", newline="") as fh:
        csv.writer(fh).writerow(row)


def load_settings(path: Path) -> dict:
    return json.loads(path.read_text())


def store_settings(path: Path, settings: dict) -> None:
    path.write_text(json.dumps(settings, indent=2))


def clear_cache_dir(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder, exist_ok=True)


def newest_file(folder: str) -> str | None:
    paths = [os.path.join(folder, f) for f in os.listdir(folder)]
    return max(paths, key=os.path.getmtime) if paths else None


def compress_logs(folder: str) -> int:
    return subprocess.call(["gzip", "-r", folder])


def wait_for_file(path: str, timeout: float = 30.0, poll: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if os.path.exists(path):
            return True
        time.sleep(poll)
    return False


def polite_pause(seconds: float = 1.0) -> None:
    time.sleep(seconds)


def throttled(items, per_second: float = 2.0):
    for item in items:
        yield item
        time.sleep(1.0 / per_second)


def to_records(rows: list[tuple], columns: list[str]) -> list[dict]:
    return [dict(zip(columns, r)) for r in rows]


def sql_in_clause(values: list) -> str:
    return "(" + ", ".join("?" for _ in values) + ")"


def load_matrix(path: str):
    arr = np.load(path)
    return arr / np.linalg.norm(arr, axis=1, keepdims=True)


def dump_scores(path: str, scores) -> None:
    np.savetxt(path, np.asarray(scores), fmt="%.6f")


CASES = [
    ("users_over (annotated sqlite3.Connection, SELECT)", users_over, "orchestration", False),
    ("add_user (INSERT + commit)", add_user, "orchestration", True),
    ("deactivate_users (executemany UPDATE)", deactivate_users, "orchestration", True),
    ("count_orders (cursor, SELECT f-string)", count_orders, "orchestration", False),
    ("archive_old_rows (session.execute(text(DELETE)))", archive_old_rows, "orchestration", True),
    ("active_emails (session.execute(select))", active_emails, "orchestration", False),
    ("save_order (session.add + commit)", save_order, "orchestration", True),
    ("monthly_revenue (pandas read_csv)", monthly_revenue, "hybrid", False),
    ("clean_frame (pandas only)", clean_frame, "tensor", False),
    ("export_frame (to_parquet)", export_frame, "orchestration", True),
    ("cache_get (redis_client.get)", cache_get, "orchestration", False),
    ("cache_put (redis_client.set)", cache_put, "orchestration", True),
    ("find_open_tickets (tickets.find)", find_open_tickets, "orchestration", False),
    ("insert_ticket (collection.insert_one)", insert_ticket, "orchestration", True),
    ("read_jsonl", read_jsonl, "orchestration", False),
    ("write_jsonl", write_jsonl, "orchestration", True),
    ("append_csv_row", append_csv_row, "orchestration", True),
    ("load_settings (Path.read_text)", load_settings, "orchestration", False),
    ("store_settings (Path.write_text)", store_settings, "orchestration", True),
    ("clear_cache_dir (rmtree + makedirs)", clear_cache_dir, "orchestration", True),
    ("newest_file (listdir, getmtime)", newest_file, "orchestration", False),
    ("compress_logs (subprocess.call)", compress_logs, "orchestration", True),
    ("wait_for_file (sleep polling)", wait_for_file, "orchestration", False),
    ("polite_pause (time.sleep)", polite_pause, "orchestration", False),
    ("throttled (generator with sleep)", throttled, "orchestration", False),
    ("to_records", to_records, "pure", False),
    ("sql_in_clause", sql_in_clause, "pure", False),
    ("load_matrix (np.load)", load_matrix, "hybrid", False),
    ("dump_scores (np.savetxt)", dump_scores, "hybrid", True),
]

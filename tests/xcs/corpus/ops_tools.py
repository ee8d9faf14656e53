"""Corpus: scripts and service glue: shells, databases, files, sockets, HTTP (labels at bottom)."""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import shutil
import socket
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

log = logging.getLogger(__name__)

DB_PATH = os.environ.get("APP_DB", "app.sqlite3")


def git_revision(repo: str = ".") -> str:
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True
    )
    return out.stdout.strip()


def disk_usage_gb(path="/"):
    total, used, _free = shutil.disk_usage(path)
    return used / 2**30, total / 2**30


def record_event(kind: str, payload: dict) -> int:
    conn = sqlite3.connect(DB_PATH)
    try:
        cur = conn.execute(
            "INSERT INTO events(kind, payload, ts) VALUES (?, ?, ?)",
            (kind, json.dumps(payload), time.time()),
        )
        conn.commit()
        return cur.lastrowid
    finally:
        conn.close()


def recent_events(conn, limit=20):
    rows = conn.execute("SELECT kind, payload FROM events ORDER BY ts DESC LIMIT ?", (limit,))
    return [(k, json.loads(p)) for k, p in rows.fetchall()]


def summarize_events(events: list[tuple[str, dict]]) -> dict[str, int]:
    """Counts per kind; the 'requests' kind is HTTP requests the app made."""
    counts = Counter(kind for kind, _ in events)
    return dict(counts.most_common())


def read_config(path: str | Path) -> dict:
    text = Path(path).read_text(encoding="utf-8")
    return json.loads(text)


def write_report(rows: list[dict], out_dir: str) -> str:
    os.makedirs(out_dir, exist_ok=True)
    target = os.path.join(out_dir, f"report-{datetime.now(UTC):%Y%m%d}.csv")
    with open(target, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=sorted(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return target


def rows_to_csv_text(rows: list[dict]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=sorted(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def build_query_url(base: str, **params) -> str:
    query = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
    return f"{base}?{query}" if query else base


def fetch_json(url: str, timeout: float = 10.0) -> dict:
    req = urllib.request.Request(url, headers={"Accept": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def fetch_with_retry(url: str, attempts: int = 3, backoff: float = 0.5) -> dict:
    for attempt in range(attempts):
        try:
            return fetch_json(url)
        except OSError as exc:
            log.warning("fetch %s failed (%s), retrying", url, exc)
            time.sleep(backoff * 2**attempt)
    raise RuntimeError(f"gave up on {url}")


def port_is_open(host: str, port: int, timeout: float = 0.5) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def send_line(sock, line: str) -> None:
    sock.sendall((line + "\n").encode())


def rotate_logs(folder: str, keep: int = 5) -> list[str]:
    files = sorted(Path(folder).glob("*.log"), key=lambda p: p.stat().st_mtime, reverse=True)
    removed = []
    for old in files[keep:]:
        old.unlink()
        removed.append(old.name)
    return removed


def group_by_owner(records: list[dict]) -> dict[str, list[dict]]:
    groups = defaultdict(list)
    for r in records:
        groups[r.get("owner", "unknown")].append(r)
    return dict(groups)


def parse_duration(text: str) -> float:
    units = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    for suffix in sorted(units, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def run_pipeline_script(script: str, *args: str) -> int:
    proc = subprocess.Popen(["bash", script, *args])
    return proc.wait()


def ask_user_confirmation(prompt: str) -> bool:
    return input(f"{prompt} [y/N] ").strip().lower() in {"y", "yes"}


def backup_database(dest_dir: str) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest = os.path.join(dest_dir, f"app-{stamp}.sqlite3")
    shutil.copy2(DB_PATH, dest)
    return dest


def slugify(title: str) -> str:
    keep = [c.lower() if c.isalnum() else "-" for c in title.strip()]
    return "-".join(filter(None, "".join(keep).split("-")))


CASES = [
    ("git_revision", git_revision, "orchestration", True),
    ("disk_usage_gb", disk_usage_gb, "orchestration", False),
    ("record_event", record_event, "orchestration", True),
    ("recent_events", recent_events, "orchestration", False),
    ("summarize_events", summarize_events, "pure", False),
    ("read_config", read_config, "orchestration", False),
    ("write_report", write_report, "orchestration", True),
    ("rows_to_csv_text", rows_to_csv_text, "pure", False),
    ("build_query_url", build_query_url, "pure", False),
    ("fetch_json", fetch_json, "orchestration", False),
    ("fetch_with_retry", fetch_with_retry, "orchestration", False),
    ("port_is_open", port_is_open, "orchestration", False),
    ("send_line", send_line, "orchestration", True),
    ("rotate_logs", rotate_logs, "orchestration", True),
    ("group_by_owner", group_by_owner, "pure", False),
    ("parse_duration", parse_duration, "pure", False),
    ("run_pipeline_script", run_pipeline_script, "orchestration", True),
    ("ask_user_confirmation", ask_user_confirmation, "orchestration", True),
    ("backup_database", backup_database, "orchestration", True),
    ("slugify", slugify, "pure", False),
]

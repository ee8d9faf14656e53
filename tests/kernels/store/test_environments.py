"""The persistent kernel cache in hostile environments (issue 16, section 1), each in child
processes: an unusable cache folder, two nablax versions (schemas) sharing one file, a file
migrated while other processes write it.

A newer nablax is simulated in a child by raising ``schema.SCHEMA_VERSION`` and adding the
migration that a real release would add (a column with a default: migrations are additive).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nablax.kernels.cache import CacheFileError, PersistentCache

SRC = Path(__file__).resolve().parents[3] / "src"
OP = "matmul@v1"

# Prelude of every child: the config class lives in a real module (cfgmod.py in the test folder).
_PRELUDE = """
import json, sys, time, warnings
sys.path.insert(0, {folder!r})
warnings.simplefilter("always")
from nablax.kernels.store import schema
if {schema} == 2:  # a newer nablax: one additive migration
    schema.SCHEMA_VERSION = 2
    schema.MIGRATIONS[1] = ("ALTER TABLE configs ADD COLUMN note TEXT NOT NULL DEFAULT ''",)
from nablax.kernels.cache import PersistentCache
from cfgmod import Cfg
def out(**kw):
    print("RESULT " + json.dumps(kw), flush=True)
"""


def _cfgmod(folder: Path) -> None:
    (folder / "cfgmod.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass(frozen=True)\nclass Cfg:\n    i: int\n"
    )


def _env(**extra: str) -> dict:
    return {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": "cpu",
        **extra,
    }


def _child(folder: Path, body: str, schema: int = 1, env: dict | None = None, argv=()) -> dict:
    _cfgmod(folder)
    code = _PRELUDE.format(folder=str(folder), schema=schema) + textwrap.dedent(body)
    p = subprocess.run(
        [sys.executable, "-c", code, *argv],
        env=env or _env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return {**json.loads(line[7:]), "stderr": p.stderr}


def _spawn(folder: Path, body: str, schema: int, argv=()) -> subprocess.Popen:
    _cfgmod(folder)
    code = _PRELUDE.format(folder=str(folder), schema=schema) + textwrap.dedent(body)
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(p: subprocess.Popen) -> dict:
    out, err = p.communicate(timeout=300)
    assert p.returncode == 0, err[-3000:]
    line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def _snapshot(path: Path) -> tuple[bytes, int, list[str]]:
    return path.read_bytes(), path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


def _file_keys(path: Path) -> set[str]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
        return {r[0] for r in raw.execute("SELECT call_key FROM configs")}


# --- an unusable cache folder -------------------------------------------------------------------


def test_unwritable_cache_dir_kernels_work_with_one_warning_and_cli_exits_2(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a regular file where the cache folder should be\n")
    cache_dir = blocker / "nablax"  # cannot be created, even by root (chmod would not stop root)
    env = _env(NABLAX_CACHE_DIR=str(cache_dir))
    r = _child(
        tmp_path,
        """
        import numpy as np, jax.numpy as jnp
        from nablax.kernels import library
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
            y1 = np.asarray(library.matmul(jnp.asarray(a), jnp.asarray(a.T)))
            y2 = np.asarray(library.matmul(jnp.ones((5, 2)), jnp.ones((2, 7))))  # another key
            q = jnp.ones((1, 8, 2, 4))
            y3 = np.asarray(library.attention(q, q, q, causal=True))
        from nablax.kernels import default_executor
        store = default_executor().chooser.persistent
        out(ok=bool(np.allclose(y1, a @ a.T)) and y2.tolist() == np.full((5, 7), 2.0).tolist(),
            attn_shape=list(y3.shape), mode=store.mode, problem=store.problem,
            warnings=[str(w.message) for w in caught if w.category is RuntimeWarning])
        """,
        env=env,
    )
    assert r["ok"] and r["attn_shape"] == [1, 8, 2, 4] and r["mode"] == "memory"
    [msg] = r["warnings"]  # ONE warning for all the calls
    assert msg == r["problem"]
    assert str(cache_dir / "kernels.sqlite") in msg  # the path
    assert "is a file, not a folder" in msg and str(blocker) in msg  # the reason
    assert "NABLAX_CACHE_DIR=" in msg and "in-memory" in msg  # the fix and the consequence
    assert blocker.read_text().startswith("a regular file")  # untouched
    for action in ("list", "show", "clear"):
        p = subprocess.run(
            [sys.executable, "-c", "import sys; from nablax.cli import main; sys.exit(main())",
             "cache", action, "k"][: 6 if action == "show" else 5],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert p.returncode == 2, (action, p.stdout, p.stderr)
        assert p.stderr.strip() == msg, action  # the same message as the warning
        assert "Traceback" not in p.stderr


@dataclasses.dataclass(frozen=True)
class Cfg:
    block_m: int = 1


def test_unwritable_explicit_path_degrades_or_raises(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    path = blocker / "sub" / "kernels.sqlite"
    with pytest.warns(RuntimeWarning, match="cannot use .*is a file, not a folder") as rec:
        cache = PersistentCache(path)
    assert len(rec) == 1 and cache.mode == "memory" and str(path) in str(rec[0].message)
    cache.put("cpu", OP, "k", Cfg(block_m=8))  # kept in memory, for this object
    assert cache.get("cpu", OP, "k") == Cfg(block_m=8) and len(cache) == 1
    assert [e.call_key for e in cache.entries()] == ["k"] and cache.delete() == 1
    with pytest.raises(CacheFileError, match="cannot use"):
        PersistentCache(path, fallback=False)
    assert blocker.read_text() == "x"


# --- two nablax versions on one file -------------------------------------------------------------


_WRITE = """
cache = PersistentCache(sys.argv[1], cfg_type=Cfg)
before = cache.mode
for k in sys.argv[2].split(","):
    cache.put("cpu", "matmul@v1", k, Cfg(len(k)))
seen = {e.call_key: e.cfg.i for e in cache.entries()}
out(before=before, mode=cache.mode, seen=seen, len=len(cache), problem=cache.problem)
"""


def test_newer_schema_file_is_never_touched_but_read(tmp_path):
    _cfgmod(tmp_path)
    path = tmp_path / "kernels.sqlite"
    r = _child(tmp_path, _WRITE, schema=2, argv=[str(path), "new-a,new-b"])
    assert r["mode"] == "read-write"
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
    before = _snapshot(path)
    time.sleep(0.02)  # a write would give a different mtime
    r = _child(tmp_path, _WRITE, schema=1, argv=[str(path), "old-c"])
    assert _snapshot(path) == before  # bytes, mtime and the folder's files (no -wal/-shm left)
    assert r["before"] == r["mode"] == "read-only"
    # it reads the newer file's entries, and keeps its own new one in memory
    assert r["seen"] == {"new-a": 5, "new-b": 5, "old-c": 5} and r["len"] == 3
    assert "newer nablax (schema 2" in r["problem"] and "never modifies it" in r["problem"]
    assert r["stderr"].count("RuntimeWarning") == 1
    assert _file_keys(path) == {"new-a", "new-b"}


def test_two_schema_versions_alternating(tmp_path):
    """v1 writes, v2 migrates in place and writes, v1 reads both (read-only), v2 goes on; a v1
    process that opened the file before the migration stops writing it at its next put."""
    _cfgmod(tmp_path)
    path = tmp_path / "kernels.sqlite"
    long_lived = _spawn(
        tmp_path,
        """
        import pathlib
        cache = PersistentCache(sys.argv[1], cfg_type=Cfg)
        cache.put("cpu", "matmul@v1", "v1-early", Cfg(1))
        pathlib.Path(sys.argv[1] + ".ready").touch()
        while not pathlib.Path(sys.argv[1] + ".go").exists():
            time.sleep(0.01)
        cache.put("cpu", "matmul@v1", "v1-late", Cfg(2))  # the file is schema 2 by now
        out(mode=cache.mode, late=cache.get("cpu", "matmul@v1", "v1-late").i)
        """,
        schema=1,
        argv=[str(path)],
    )
    deadline = time.monotonic() + 120
    while not Path(f"{path}.ready").exists():
        assert long_lived.poll() is None and time.monotonic() < deadline, long_lived.stderr.read()
        time.sleep(0.01)
    assert _child(tmp_path, _WRITE, 1, argv=[str(path), "v1-a"])["mode"] == "read-write"
    r = _child(tmp_path, _WRITE, 2, argv=[str(path), "v2-b"])
    assert r["mode"] == "read-write" and set(r["seen"]) == {"v1-early", "v1-a", "v2-b"}
    Path(f"{path}.go").touch()
    late = _result(long_lived)
    assert late == {"mode": "read-only", "late": 2}  # kept in its memory, not in the file
    before = _snapshot(path)
    r = _child(tmp_path, _WRITE, 1, argv=[str(path), "v1-c"])
    assert r["mode"] == "read-only" and set(r["seen"]) == {"v1-early", "v1-a", "v2-b", "v1-c"}
    assert _snapshot(path)[:2] == before[:2]
    r = _child(tmp_path, _WRITE, 2, argv=[str(path), "v2-d"])
    assert r["mode"] == "read-write"
    assert _file_keys(path) == {"v1-early", "v1-a", "v2-b", "v2-d"}
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
        cols = [r[1] for r in raw.execute("PRAGMA table_info(configs)")]
        assert cols[-1] == "note"  # migrated once, in place


_HAMMER = """
import pathlib
name, n, late = sys.argv[2], int(sys.argv[3]), sys.argv[4] == "late"
if not late:
    cache = PersistentCache(sys.argv[1], cfg_type=Cfg)
pathlib.Path(sys.argv[1] + "." + name + ".ready").touch()
while not pathlib.Path(sys.argv[1] + ".go").exists():
    time.sleep(0.002)
if late:  # open (and migrate) while the others are writing
    time.sleep(0.05)
    cache = PersistentCache(sys.argv[1], cfg_type=Cfg)
to_file, to_memory = [], []
for i in range(n):
    key = f"{name}-{i}"
    cache.put("cpu", "matmul@v1", key, Cfg(i))
    (to_file if cache.mode == "read-write" else to_memory).append(key)
    time.sleep(0.001)
out(to_file=to_file, to_memory=to_memory, mode=cache.mode)
"""


def test_concurrent_writers_during_migration(tmp_path):
    """Three schema-1 writers and two schema-2 processes (both migrating) start together: no
    error, the file is migrated once, and every put that went to the file is there."""
    _cfgmod(tmp_path)
    path = tmp_path / "kernels.sqlite"
    _child(tmp_path, _WRITE, 1, argv=[str(path), "seed"])  # a schema-1 file with one entry
    procs = [
        _spawn(tmp_path, _HAMMER, 1, argv=[str(path), f"old{w}", "300", "early"]) for w in range(3)
    ]
    procs += [
        _spawn(tmp_path, _HAMMER, 2, argv=[str(path), f"new{w}", "60", "late"]) for w in range(2)
    ]
    deadline = time.monotonic() + 180
    while len(list(tmp_path.glob("*.ready"))) < 5:
        assert all(p.poll() is None for p in procs), [p.stderr.read() for p in procs]
        assert time.monotonic() < deadline
        time.sleep(0.01)
    (tmp_path / "kernels.sqlite.go").touch()
    results = [_result(p) for p in procs]
    in_file = _file_keys(path)
    for r in results:
        assert set(r["to_file"]) <= in_file  # nothing that went to the file was lost
        assert not set(r["to_memory"]) & in_file  # and an old writer never wrote the new file
    new = results[3:]
    assert all(r["mode"] == "read-write" and not r["to_memory"] for r in new)
    assert all(len(r["to_file"]) == 60 for r in new)
    old = results[:3]
    assert all(r["mode"] == "read-only" for r in old)  # all switched once the file was newer
    assert sum(len(r["to_file"]) for r in old) > 0  # they did write before the migration
    assert len(in_file) == 1 + 120 + sum(len(r["to_file"]) for r in old)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2

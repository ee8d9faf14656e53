"""Issue 35 items 12 and 20: a database another process holds locked is waited for at most
``cache_lock_timeout`` seconds, then reported clearly (kernel calls go on in memory); a config
class this process imported is found without being declared (never imported); a file that fails
SQLite's checks where the cache lives is moved aside (renamed, never deleted), except by a
read-only command."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import nablax as nx
from nablax import cli
from nablax.kernels.cache import CacheFileError, PersistentCache, register_config_class
from nablax.kernels.store import schema

SRC = Path(__file__).resolve().parents[3] / "src"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    "JAX_PLATFORMS": "cpu",
}
DEV, OP = "cpu|audit-device", "matmul@v1"

HOLDER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode=EXCLUSIVE")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("SELECT count(*) FROM configs").fetchone()
print("locked", flush=True)
time.sleep(60)
"""


@dataclasses.dataclass(frozen=True)
class AuditCfg:
    block: int = 8


register_config_class(AuditCfg)


@pytest.fixture
def locked_db(tmp_path):
    """A nablax kernel database that another process holds locked (exclusive) until the end."""
    path = tmp_path / "kernels.sqlite"
    with PersistentCache(path) as c:
        c.put(DEV, OP, "k0", AuditCfg(16))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(path)], stdout=subprocess.PIPE, text=True, env=ENV
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        yield path
    finally:
        holder.kill()
        holder.wait(10)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env={**ENV, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


# --- item 12: a locked database -------------------------------------------------------------------


def test_a_locked_database_is_waited_for_briefly_then_used_from_memory(locked_db):
    with nx.config.override(cache_lock_timeout=1):
        start = time.monotonic()
        with pytest.warns(RuntimeWarning, match="is locked by another process.*cache_lock_tim"):
            cache = PersistentCache(locked_db)
            cache.put(DEV, OP, "k1", AuditCfg(32))
        assert time.monotonic() - start < 5
    assert cache.mode == "memory"
    assert cache.get(DEV, OP, "k1") == AuditCfg(32)


def test_cache_clear_on_a_locked_database_says_so_quickly(locked_db, capsys):
    with nx.config.override(cache_lock_timeout=1):
        start = time.monotonic()
        code = cli.main(["cache", "clear", "--path", str(locked_db)])
        took = time.monotonic() - start
    err = capsys.readouterr().err
    assert code == 2 and took < 5, (code, took, err)
    assert "is locked by another process" in err and "Nothing was changed" in err, err
    assert "OperationalError" not in err


def test_a_kernel_call_on_a_locked_database_falls_back_to_memory(locked_db):
    r = _run(
        """
        import time, warnings
        import numpy as np, jax.numpy as jnp
        from nablax.kernels import library
        a = np.arange(37 * 19, dtype=np.float32).reshape(37, 19) / 100
        b = np.arange(19 * 11, dtype=np.float32).reshape(19, 11) / 100
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            t = time.monotonic()
            c = np.asarray(library.matmul(jnp.asarray(a), jnp.asarray(b)))
            took = time.monotonic() - t
        np.testing.assert_allclose(c, a @ b, rtol=1e-5, atol=1e-5)
        print("took", took)
        print("warned", any("is locked by another process" in str(x.message) for x in w))
        """,
        NABLAX_CACHE_DIR=str(locked_db.parent),
        NABLAX_CACHE_LOCK_TIMEOUT="1",
    )
    assert r.returncode == 0, r.stderr
    took = float(r.stdout.split("took")[1].split()[0])
    assert took < 8 and "warned True" in r.stdout, r.stdout + r.stderr


def test_inspect_reports_a_locked_file_as_locked_not_damaged(locked_db):
    (locked_db.parent / "kernels.sqlite-wal").touch()  # a live WAL pair: inspect must open it
    (locked_db.parent / "kernels.sqlite-shm").touch()
    with nx.config.override(cache_lock_timeout=1):
        info = schema.inspect(locked_db)
    assert info.kind in ("locked", "nablax"), info  # never "damaged": that would be salvaged


# --- item 20: a class imported but not declared ----------------------------------------------------


def test_an_imported_but_undeclared_class_is_found_and_a_missing_one_is_named(tmp_path):
    (tmp_path / "audit_cfgmod.py").write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class TileCfg:\n"
        "    block: int = 8\n"
    )
    db = tmp_path / "kernels.sqlite"
    env = {
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(tmp_path), str(SRC), os.environ.get("PYTHONPATH")])
        )
    }
    store = f"""
        from nablax.kernels import PersistentCache
        import audit_cfgmod
        PersistentCache({str(db)!r}).put("cpu", "op@v1", "k", audit_cfgmod.TileCfg(16))
        """
    assert _run(store, **env).returncode == 0
    read = f"""
        import sys, warnings
        from nablax.kernels import PersistentCache
        IMPORT
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            c = PersistentCache({str(db)!r})
            print("got", c.get("cpu", "op@v1", "k"), c.get("cpu", "op@v1", "k"))
        print("warnings", [str(x.message) for x in w])
        print("imported", "audit_cfgmod" in sys.modules)
        """
    r = _run(read.replace("IMPORT", "import audit_cfgmod"), **env)
    assert r.returncode == 0, r.stderr
    assert "got TileCfg(block=16) TileCfg(block=16)" in r.stdout, r.stdout
    assert "warnings []" in r.stdout, r.stdout
    r = _run(read.replace("IMPORT", "pass"), **env)
    assert r.returncode == 0, r.stderr
    assert "got None None" in r.stdout and "imported False" in r.stdout, r.stdout
    warned = r.stdout.split("warnings", 1)[1].split("\nimported")[0]
    assert warned.count("audit_cfgmod:TileCfg") == 1 and "types=[TileCfg]" in warned, warned


def test_an_imported_class_that_is_not_a_frozen_dataclass_is_never_built(tmp_path):
    cache = PersistentCache(tmp_path / "kernels.sqlite")
    cache.put(DEV, OP, "k", AuditCfg(4))
    raw = '{"fields": {}, "type": "subprocess:Popen"}'  # imported, but not a config class
    cache._write([("UPDATE configs SET cfg_json = ? WHERE call_key = 'k'", (raw,))], "test")
    cache._decoded.clear()
    with pytest.warns(RuntimeWarning, match="subprocess:Popen"):
        assert cache.get(DEV, OP, "k") is None


# --- item 20: a corrupt file where the cache lives -----------------------------------------------


def _corrupt_db(folder: Path) -> tuple[Path, bytes]:
    path = folder / "kernels.sqlite"
    with PersistentCache(path) as c:
        for i in range(50):
            c.put(DEV, OP, f"k{i}", AuditCfg(i))
    for extra in folder.glob("kernels.sqlite-*"):
        extra.unlink()
    data = bytearray(path.read_bytes())
    data[16:100] = bytes(range(84))  # the header after SQLite's magic: not readable any more
    path.write_bytes(bytes(data))
    return path, bytes(data)


def test_a_corrupt_file_at_the_cache_path_is_moved_aside_and_a_new_one_started(tmp_path):
    path, data = _corrupt_db(tmp_path)
    with pytest.warns(RuntimeWarning, match="moved aside to .*corrupt-.*never deleted"):
        cache = PersistentCache(path)
    assert cache.mode == "read-write"
    cache.put(DEV, OP, "new", AuditCfg(7))
    assert PersistentCache(path).get(DEV, OP, "new") == AuditCfg(7)
    asides = list(tmp_path.glob("kernels.sqlite.corrupt-*"))
    assert [p.read_bytes() for p in asides if not p.name.endswith(("-wal", "-shm"))] == [data]


def test_a_sqlite_file_cut_short_is_moved_aside_too(tmp_path):
    path = tmp_path / "kernels.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + bytes(20))  # the header cut short
    with pytest.warns(RuntimeWarning, match="cut short.*moved aside"):
        cache = PersistentCache(path)
    assert cache.mode == "read-write"
    assert len(list(tmp_path.glob("kernels.sqlite.corrupt-*"))) == 1


def test_read_only_commands_never_touch_a_corrupt_file(tmp_path, capsys):
    path, data = _corrupt_db(tmp_path)
    for action in ("list", "show"):
        assert cli.main(["cache", action, "k1", "--path", str(path)]) == 2
        assert "Traceback" not in capsys.readouterr().err
    with pytest.raises(CacheFileError):
        PersistentCache(path, read_only=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels.sqlite"]
    assert path.read_bytes() == data


def test_a_foreign_or_text_file_is_still_never_touched(tmp_path):
    path = tmp_path / "kernels.sqlite"
    path.write_text("not a database\n")
    with pytest.warns(RuntimeWarning, match="not a nablax kernel database"):
        cache = PersistentCache(path)
    assert cache.mode == "memory" and path.read_text() == "not a database\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kernels.sqlite"]
    np.testing.assert_equal(cache.get(DEV, OP, "k"), None)


FLOCK_HOLDER = """
import fcntl, sys, time
f = open(sys.argv[1], "a")
fcntl.flock(f, fcntl.LOCK_EX)
print("locked", flush=True)
time.sleep(60)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="flock")
def test_a_held_salvage_lock_is_waited_for_briefly_too(tmp_path):
    """The inter-process lock that guards salvage and moving aside is bounded like SQLite's."""
    path, _ = _corrupt_db(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", FLOCK_HOLDER, f"{path}.lock"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        r = _run(
            f"""
            import time, warnings
            from nablax.kernels import PersistentCache
            t = time.monotonic()
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                c = PersistentCache({str(path)!r})
            print("took", time.monotonic() - t, c.mode)
            print("warned", any("is locked by another process" in str(x.message) for x in w))
            """,
            NABLAX_CACHE_LOCK_TIMEOUT="1",
        )
    finally:
        holder.kill()
        holder.wait(10)
    assert r.returncode == 0, r.stderr
    took = float(r.stdout.split("took")[1].split()[0])
    assert took < 5 and "memory" in r.stdout and "warned True" in r.stdout, r.stdout

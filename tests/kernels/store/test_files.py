"""What the kernel cache does with files (issue 16, sections 1-2): reads never create, rename or
write anything; files that are not nablax's are never touched; a damaged database is salvaged
entry by entry; ejKernel's constructor arguments."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import warnings
from pathlib import Path

import numpy as np
import pytest

from nablax import _config, cli
from nablax.kernels.cache import (
    CacheFileError,
    PersistentCache,
    StoredConfig,
    cfg_to_json,
)
from nablax.kernels.store import schema

DEV, OP = "cpu|test-device", "matmul@v1"


@dataclasses.dataclass(frozen=True)
class Cfg:
    block_m: int = 128
    name: str = "tile"


def _state(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file in ``folder``: bytes and mtime (a read must leave this identical)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
        if p.is_file()
    }


def _text_file(folder: Path) -> Path:
    p = folder / "notes.txt"
    p.write_text("shopping list\nmilk\n")
    return p


def _foreign_db(folder: Path) -> Path:
    p = folder / "app.sqlite"
    with sqlite3.connect(p) as raw:
        raw.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
        raw.execute("INSERT INTO users (name) VALUES ('ada')")
        raw.execute("PRAGMA application_id = 1234")
    return p


def _empty_file(folder: Path) -> Path:
    p = folder / "empty.sqlite"
    p.write_bytes(b"")
    return p


def _nablax_db(folder: Path, n: int = 3, name: str = "kernels.sqlite") -> Path:
    path = folder / name
    with PersistentCache(path) as cache:
        for i in range(n):
            cache.put(DEV, OP, f"key-{i:04d}", Cfg(block_m=i), signature="x" * 200)
    return path


# --- reads never touch anything ------------------------------------------------------------------


@pytest.mark.parametrize(
    "make, words",
    [
        (_text_file, ["a text file starting with 'shopping list'", "not a nablax kernel database"]),
        (_foreign_db, ["another application's SQLite database", "tables: users", "0x4d2"]),
        (lambda d: d / "missing" / "kernels.sqlite", ["no kernel database at"]),
        (_empty_file, ["an empty file"]),
    ],
    ids=["text", "foreign-sqlite", "missing", "empty"],
)
def test_read_only_open_and_cli_reads_touch_nothing(tmp_path, capsys, make, words):
    path = make(tmp_path)
    before = _state(tmp_path)
    with pytest.raises(CacheFileError) as e:
        PersistentCache(path, read_only=True)
    for w in [str(path), *words, "Fix"]:
        assert w in str(e.value)
    for argv in (["cache", "list"], ["cache", "show", "key"]):
        assert cli.main([*argv, "--path", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.strip() == str(e.value) and "Traceback" not in err
    assert _state(tmp_path) == before  # nothing created, renamed or written
    assert not (tmp_path / "missing").exists()
    if path.name == "app.sqlite":  # no nablax tables were created in the other application's file
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as raw:
            tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master")}
        assert tables == {"users"}


def test_cli_list_of_a_closed_database_creates_no_files(tmp_path, capsys):
    path = _nablax_db(tmp_path)
    before = _state(tmp_path)
    assert set(before) == {"kernels.sqlite"}  # no -wal/-shm once closed
    assert cli.main(["cache", "list", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 entries" in out and "Cfg(block_m=2, name='tile')" in out
    assert _state(tmp_path) == before


def test_read_only_sees_a_live_writer(tmp_path):
    path = tmp_path / "kernels.sqlite"
    writer = PersistentCache(path)
    writer.put(DEV, OP, "a", Cfg(1))
    reader = PersistentCache(path, read_only=True)
    writer.put(DEV, OP, "b", Cfg(2))  # committed to the WAL, not yet to the main file
    assert [e.call_key for e in reader.entries(resolve=False)] == ["a", "b"]
    assert reader.get(DEV, OP, "b") == Cfg(2) and reader.mode == "read-only"
    with pytest.raises(CacheFileError, match=r"PersistentCache.put: .* read_only=True"):
        reader.put(DEV, OP, "c", Cfg(3))
    writer.close()
    reader.close()


def test_read_only_lists_configs_as_text_without_rebuilding_classes(tmp_path):
    path = tmp_path / "kernels.sqlite"
    cache = PersistentCache(path)
    cache.put(DEV, OP, "k", Cfg(7))
    with sqlite3.connect(path) as raw:  # a class this process never declared
        raw.execute(
            "UPDATE configs SET cfg_json = ?",
            ('{"fields": {"cmd": "rm -rf /"}, "type": "os:system"}',),
        )
    [e] = PersistentCache(path, read_only=True).entries(resolve=False)
    assert isinstance(e.cfg, StoredConfig) and repr(e.cfg) == "system(cmd='rm -rf /')"
    cache.close()


@pytest.mark.parametrize("make", [_text_file, _foreign_db], ids=["text", "foreign-sqlite"])
def test_read_write_open_of_a_file_not_ours_leaves_it_alone(tmp_path, make):
    path = make(tmp_path)
    before = _state(tmp_path)
    with pytest.warns(RuntimeWarning, match="not a nablax kernel database") as rec:
        cache = PersistentCache(path)
    assert len(rec) == 1 and "nablax never modifies it" in str(rec[0].message)
    assert cache.mode == "memory"
    cache.put(DEV, OP, "k", Cfg(1))
    assert cache.get(DEV, OP, "k") == Cfg(1) and len(cache) == 1
    cache.close()
    assert _state(tmp_path) == before
    assert cli.main(["cache", "clear", "--path", str(path)]) == 2  # a write refuses too
    assert _state(tmp_path) == before


def test_garbage_file_is_left_alone(tmp_path):
    path = _nablax_db(tmp_path)
    garbage = np.random.default_rng(0).bytes(8192)
    path.write_bytes(garbage)
    with pytest.warns(RuntimeWarning, match="binary data, not a SQLite database"):
        cache = PersistentCache(path)
    assert cache.mode == "memory" and len(cache) == 0
    assert path.read_bytes() == garbage and not list(tmp_path.glob("*.corrupt-*"))


def test_cli_clear_of_a_missing_database_creates_nothing(tmp_path, capsys):
    path = tmp_path / "sub" / "kernels.sqlite"
    assert cli.main(["cache", "clear", "--path", str(path)]) == 0
    assert "nothing to clear" in capsys.readouterr().out
    assert not (tmp_path / "sub").exists()


# --- damaged databases are salvaged --------------------------------------------------------------


def _salvage_warning(record) -> str:
    [msg] = [str(w.message) for w in record if "integrity check" in str(w.message)]
    return msg


def _counts(msg: str) -> tuple[int, int]:
    kept = int(msg.split("Salvaged ")[1].split(" ")[0])
    lost = int(msg.split("; lost ")[1].split(" ")[0])
    return kept, lost


def _checkpointed(path: Path) -> bytes:
    with sqlite3.connect(path) as raw:
        raw.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # all pages in the main file
    return path.read_bytes()


def _check_kept_entries(path: Path, kept: int) -> None:
    cache = PersistentCache(path)
    entries = cache.entries()
    assert len(entries) == kept
    for e in entries:  # every salvaged entry is exactly what was stored
        i = int(e.call_key.split("-")[1])
        assert e.cfg == Cfg(block_m=i) and e.signature == "x" * 200 and e.source == "autotune"
    cache.put(DEV, OP, "after", Cfg(5))
    assert PersistentCache(path).get(DEV, OP, "after") == Cfg(5)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    cache.close()


def test_damaged_page_is_salvaged_row_by_row(tmp_path):
    path = _nablax_db(tmp_path, n=400)
    with sqlite3.connect(path) as raw:
        leaves = [
            r[0]
            for r in raw.execute(
                "SELECT pageno FROM dbstat WHERE name = 'configs' AND pagetype = 'leaf' "
                "ORDER BY pageno"
            )
        ]
    data = bytearray(_checkpointed(path))
    page = leaves[len(leaves) // 2]
    data[(page - 1) * 4096 : page * 4096] = np.random.default_rng(1).bytes(4096)
    path.write_bytes(bytes(data))
    with pytest.warns(RuntimeWarning) as record:
        cache = PersistentCache(path)
        n = len(cache.entries())
    kept, lost = _counts(_salvage_warning(record))
    assert kept + lost == 400 and 1 <= lost <= 40 and n == kept  # one page of ~12 rows lost
    [aside] = [
        p for p in tmp_path.glob("kernels.sqlite.corrupt-*") if p.name[-4:] not in ("-wal", "-shm")
    ]
    assert aside.read_bytes() == bytes(data)  # the damaged file is kept as it was
    cache.close()
    _check_kept_entries(path, kept)


def test_truncated_file_is_salvaged(tmp_path):
    path = _nablax_db(tmp_path, n=400)
    data = _checkpointed(path)
    path.write_bytes(data[: len(data) // 2])
    with pytest.warns(RuntimeWarning) as record:
        cache = PersistentCache(path)
        n = len(cache)  # counting reads every page: finds the damage, salvages
    msg = _salvage_warning(record)
    kept, lost = _counts(msg)
    assert kept > 0 and lost > 0 and kept + lost <= 400 and n == kept
    assert str(path) in msg and ".corrupt-" in msg
    cache.close()
    _check_kept_entries(path, kept)


def test_sound_file_is_never_moved(tmp_path):
    path = _nablax_db(tmp_path, n=5)
    cache = PersistentCache(path)
    err = sqlite3.DatabaseError("database disk image is malformed")
    err.sqlite_errorcode = sqlite3.SQLITE_CORRUPT  # a spurious report: the check finds nothing
    with pytest.raises(sqlite3.DatabaseError, match="malformed"):
        cache._run(lambda conn: (_ for _ in ()).throw(err))
    assert not list(tmp_path.glob("*.corrupt-*")) and len(cache) == 5
    cache.close()


def test_legacy_file_without_application_id_is_adopted(tmp_path):
    path = tmp_path / "kernels.sqlite"  # what the first nablax wrote: schema 1, no id
    with sqlite3.connect(path) as raw:
        for stmt in schema.BASE_SCHEMA:
            raw.execute(stmt)
        raw.execute("PRAGMA user_version = 1")
        raw.execute(
            "INSERT INTO configs VALUES (?, ?, ?, ?, 'autotune', '0.1.0', 0, '')",
            (DEV, OP, "old", cfg_to_json(Cfg(3))),
        )
    assert schema.inspect(path).kind == "nablax"
    cache = PersistentCache(path)
    assert cache.mode == "read-write" and cache.get(DEV, OP, "old") == Cfg(3)
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA application_id").fetchone()[0] == schema.APPLICATION_ID
    cache.close()


# --- ejKernel's constructor arguments -------------------------------------------------------------


def test_seed_constructor_arguments(tmp_path):
    with _config.override(cache_dir=str(tmp_path / "default")):
        by_name = PersistentCache("matmul")  # ejKernel: an op name, not a path
        assert by_name.opname == "matmul"
        assert by_name.path == tmp_path / "default" / "kernels.sqlite"
        by_name.close()
    path = tmp_path / "seed.sqlite"
    dumped = []

    def dumper(cfg):
        dumped.append(cfg)
        return {"bm": cfg.block_m, "n": cfg.name}

    def loader(value):
        return Cfg(block_m=value["bm"], name=value["n"])

    keyword = PersistentCache("matmul", path=str(path))  # ejKernel's usual spelling
    assert (keyword.opname, keyword.path) == ("matmul", path)
    keyword.close()
    seed = PersistentCache("matmul", str(path), loader, dumper)
    seed.put(DEV, OP, "k", Cfg(9, "x"), timings=[(Cfg(9, "x"), 0.5, None)])
    assert dumped == [Cfg(9, "x"), Cfg(9, "x")]
    assert seed.get(DEV, OP, "k") == Cfg(9, "x") and seed.opname == "matmul"
    with sqlite3.connect(path) as raw:
        stored = raw.execute("SELECT cfg_json FROM configs").fetchone()[0]
    assert '"value":{"bm":9,"n":"x"}' in stored
    seed.close()
    with pytest.warns(RuntimeWarning, match=r"ignoring argument\(s\) max_size, ttl") as rec:
        other = PersistentCache(path=path, cfg_type=Cfg, ttl=3, max_size=5)
    assert len(rec) == 1
    other.put(DEV, OP, "plain", Cfg(1))
    assert other.get(DEV, OP, "plain") == Cfg(1)
    other.close()
    with pytest.raises(TypeError, match="loader given twice"):
        PersistentCache("matmul", str(path), loader, loader=loader)
    with pytest.raises(TypeError, match="dumper must be callable"):
        PersistentCache(path, dumper=3)
    with pytest.raises(TypeError, match=r"dumper's result .* is not JSON"):
        bad = PersistentCache(path, dumper=lambda c: {1, 2})
        bad.put(DEV, OP, "bad", Cfg())


def test_one_warning_per_problem_per_process(tmp_path):
    path = _text_file(tmp_path)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for _ in range(3):
            PersistentCache(path).close()
    assert len([w for w in rec if "not a nablax kernel database" in str(w.message)]) == 1
    assert os.path.getsize(path) == len("shopping list\nmilk\n")


def test_deleting_the_files_while_a_process_runs_resets_the_cache(tmp_path):
    """The documented reset (rm kernels.sqlite*) under a live cache: its next put starts a fresh
    database at the path, instead of writing into the deleted file."""
    path = _nablax_db(tmp_path, n=2)
    cache = PersistentCache(path)
    assert len(cache) == 2
    for p in tmp_path.glob("kernels.sqlite*"):
        p.unlink()
    cache.put(DEV, OP, "after-reset", Cfg(1))
    fresh = PersistentCache(path, read_only=True)
    assert [e.call_key for e in fresh.entries()] == ["after-reset"]
    fresh.close()
    cache.close()

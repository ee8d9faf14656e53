"""Tests of nablax/kernels/store/persistent.py (the SQLite cache) and of the config JSON and class
resolution it relies on (kernels/_configs.py). Files and environments: test_files.py,
test_environments.py, test_persistent_audit.py; the memory cache: test_memory.py."""

from __future__ import annotations

import dataclasses
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from nablax import _config
from nablax.kernels.cache import (
    PersistentCache,
    cfg_from_json,
    cfg_to_json,
    declared_config_types,
    register_config_class,
)

SRC = Path(__file__).resolve().parents[3] / "src"
DEV, OP = "cpu|test-device", "matmul@v1"


@dataclasses.dataclass(frozen=True)
class Cfg:
    block_m: int = 128
    block_n: int = 64
    scale: float = 0.5
    name: str = "tile"
    split_k: int | None = None
    swizzle: bool = False
    tiles: tuple = (1, (2, 3))


@dataclasses.dataclass
class MutableCfg:
    block: int = 1


@dataclasses.dataclass(frozen=True)
class ListCfg:
    blocks: object = dataclasses.field(default_factory=lambda: [1, 2])


@pytest.fixture
def db(tmp_path):
    cache = PersistentCache(tmp_path / "kernels.sqlite")
    yield cache
    cache.close()


# --- configs <-> JSON ----------------------------------------------------------------------------


def test_cfg_round_trip_keeps_types():
    cfg = Cfg(block_m=32, scale=-0.0, split_k=None, swizzle=True, tiles=(4, (5, None), 1.5))
    back = cfg_from_json(cfg_to_json(cfg))
    assert back == cfg and type(back) is Cfg
    assert type(back.tiles) is tuple and type(back.tiles[1]) is tuple
    assert math.copysign(1.0, back.scale) == -1.0
    inf_cfg = Cfg(scale=math.inf)
    assert cfg_from_json(cfg_to_json(inf_cfg)).scale == math.inf


def test_cfg_json_is_stable_and_sorted():
    s = cfg_to_json(Cfg())
    assert s == cfg_to_json(Cfg())
    assert s.index('"block_m"') < s.index('"block_n"') < s.index('"name"') < s.index('"tiles"')
    assert f'"type":"{Cfg.__module__}:Cfg"' in s


def test_cfg_class_defined_in_a_function_round_trips_in_process():
    @dataclasses.dataclass(frozen=True)
    class LocalCfg:
        unroll: int = 2

    assert cfg_from_json(cfg_to_json(LocalCfg(4))) == LocalCfg(4)


@pytest.mark.parametrize(
    "bad, words",
    [
        (object(), ["frozen dataclass", "object"]),
        (Cfg, ["frozen dataclass"]),
        (MutableCfg(), ["MutableCfg", "not frozen", "frozen=True"]),
        (ListCfg(), ["ListCfg", "'blocks'", "list", "tuple"]),
        (Cfg(block_m=np.int64(3)), ["Cfg", "'block_m'", "int64", "int(x)"]),
        (Cfg(name={"a": 1}), ["'name'", "dict"]),
    ],
)
def test_cfg_to_json_refuses_unstorable_configs(bad, words):
    with pytest.raises(TypeError) as e:
        cfg_to_json(bad)
    msg = str(e.value)
    assert msg.startswith("nablax.kernels.cache.cfg_to_json") and "Fix" in msg
    for w in words:
        assert w in msg


def test_cfg_from_json_errors():
    with pytest.raises(ValueError, match="not a stored config"):
        cfg_from_json("not json")
    with pytest.raises(ValueError, match="not a stored config"):
        cfg_from_json('{"fields": {}}')
    with pytest.raises(TypeError, match="is not one this process declared.*Fix"):
        cfg_from_json('{"type": "no_such_module_xyz:Cfg", "fields": {}}')
    register_config_class(Cfg)
    with pytest.raises(TypeError, match="no longer accepts"):
        cfg_from_json(f'{{"type": "{Cfg.__module__}:Cfg", "fields": {{"gone": 1}}}}')
    with pytest.raises(TypeError, match="register_config_class: expected frozen dataclass"):
        register_config_class(MutableCfg)


# --- config classes are resolved, never imported -------------------------------------------------


def test_stored_class_name_never_imports_a_module(tmp_path, monkeypatch):
    """Whoever can write the cache file must not choose what nablax imports."""
    marker = tmp_path / "imported.txt"
    (tmp_path / "evil_cfg_mod.py").write_text(
        f"import dataclasses, pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "@dataclasses.dataclass(frozen=True)\nclass Cfg:\n    a: int = 0\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    text = '{"fields": {"a": 1}, "type": "evil_cfg_mod:Cfg"}'
    with pytest.raises(TypeError, match="never imports"):
        cfg_from_json(text)
    cache = PersistentCache(tmp_path / "kernels.sqlite")
    cache.put(DEV, OP, "k", Cfg())
    with sqlite3.connect(cache.path) as raw:
        raw.execute("UPDATE configs SET cfg_json = ?", (text,))
    with pytest.warns(RuntimeWarning, match="evil_cfg_mod:Cfg is not one this process declared"):
        assert cache.get(DEV, OP, "k") is None
    assert [repr(e.cfg) for e in cache.entries(resolve=False)] == ["Cfg(a=1)"]
    assert not marker.exists() and "evil_cfg_mod" not in sys.modules
    cache.close()


def test_declared_config_types_and_explicit_types():
    from nablax.kernels import Invocation, Kernel, library

    @dataclasses.dataclass(frozen=True)
    class HeurCfg:
        t: int = 1

    @dataclasses.dataclass(frozen=True)
    class CandCfg:
        t: int = 2

    class K(Kernel):
        def run(self, x, *, cfg):
            return x

        def heuristic_cfg(self, inv):
            return HeurCfg()

        def candidate_cfgs(self, inv):
            return [CandCfg(), CandCfg(3)]

    k = K("declared")
    inv = Invocation(k.versioned_id, (np.ones(2),), {})
    assert declared_config_types(k) == ()  # no Kernel[Cfg, Out] base
    assert declared_config_types(k, inv) == (HeurCfg, CandCfg)
    assert declared_config_types(library.ATTENTION) == (library.AttentionCfg,)
    assert library.MatmulCfg in declared_config_types()  # every Kernel[Cfg, Out] defined so far
    text = cfg_to_json(HeurCfg(5)).replace("HeurCfg", "Other")  # a name nobody declared
    with pytest.raises(TypeError, match="not one this process declared"):
        cfg_from_json(text, types=[HeurCfg])
    assert cfg_from_json(cfg_to_json(CandCfg(4)), types=lambda: [CandCfg]) == CandCfg(4)


_FRESH = '''
import sys, types, warnings
import jax.numpy as jnp
warnings.simplefilter("error", RuntimeWarning)
from nablax.kernels import (AutotunePolicy, ConfigCache, ConfigSelectorChain, Executor,
    PersistentCache)

KERNELS = """
import dataclasses
from nablax.kernels import Kernel

@dataclasses.dataclass(frozen=True)
class HCfg:  # declared only by what heuristic_cfg returns
    scale: float = 2.0

@dataclasses.dataclass(frozen=True)
class GCfg:  # declared as the Cfg of Kernel[GCfg, ...]
    scale: float = 3.0

class H(Kernel):
    def run(self, x, *, cfg):
        return x * cfg.scale
    def heuristic_cfg(self, inv):
        return HCfg(SCALE)

class G(Kernel[GCfg, object]):
    def run(self, x, *, cfg):
        return x * cfg.scale
    def heuristic_cfg(self, inv):
        return GCfg(SCALE)
"""
# A module that cannot be imported by its name (like code built at run time).
mod = types.ModuleType("kernels_built_at_run_time")
mod.SCALE = float(sys.argv[2])
exec(KERNELS, mod.__dict__)
store = PersistentCache(sys.argv[1])
chain = ConfigSelectorChain(ConfigCache(), AutotunePolicy(allow_autotune=False), persistent=store)
ex = Executor(chain)
out = [float(ex(k, jnp.ones(2))[0]) for k in (mod.H("h"), mod.G("g"))]
print("RESULT", out, [e.source for e in store.entries()])
'''


def test_a_fresh_process_finds_configs_of_classes_its_kernels_declare(tmp_path):
    """The class of a stored config is found through the kernel (its heuristic's result or its
    Kernel[Cfg, Out] base), in a process that never stored it: no import, and no re-tuning."""
    script, path = tmp_path / "fresh.py", tmp_path / "kernels.sqlite"
    script.write_text(_FRESH)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": "cpu",
    }

    def run(scale: str) -> str:
        p = subprocess.run(
            [sys.executable, str(script), str(path), scale],
            env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert p.returncode == 0, p.stderr[-3000:]
        return p.stdout.split("RESULT ")[1].strip()

    assert run("5.0") == "[5.0, 5.0] ['heuristic', 'heuristic']"
    # the heuristic now says 7, but the stored configs (scale 5) are found and used, unwarned
    assert run("7.0") == "[5.0, 5.0] ['heuristic', 'heuristic']"


# --- persistent cache ----------------------------------------------------------------------------


def test_persistent_entries_survive_a_new_object(tmp_path):
    path = tmp_path / "sub" / "dir" / "kernels.sqlite"  # parent folders are created
    with PersistentCache(path) as cache:
        cache.put(DEV, OP, "k1", Cfg(block_m=16, tiles=(1, (2, 3))))
        cache.put(DEV, "attention@v2", "k2", Cfg(name="attn"), source="heuristic")
    again = PersistentCache(str(path))
    assert again.path == path and path.exists()
    assert again.get(DEV, OP, "k1") == Cfg(block_m=16, tiles=(1, (2, 3)))
    assert again.get(DEV, "attention@v2", "k2") == Cfg(name="attn")
    assert again.get(DEV, OP, "k2") is None and again.get("gpu|other", OP, "k1") is None
    assert len(again) == 2
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 1
    again.close()


def test_persistent_entry_details_round_trip(db):
    timings = [
        (Cfg(1), 0.003, None),
        (Cfg(2), math.inf, "RESOURCE_EXHAUSTED: out of memory"),
        (cfg_to_json(Cfg(3)), float("nan"), RuntimeError("bad")),
    ]
    before = time.time()
    db.put(DEV, OP, "k", Cfg(1), source="autotune", timings=timings, signature="a: f32[8,8]")
    e = PersistentCache(db.path).get_entry(DEV, OP, "k")
    assert (e.device, e.op_id, e.call_key, e.cfg) == (DEV, OP, "k", Cfg(1))
    assert (e.source, e.signature, e.package_version) == ("autotune", "a: f32[8,8]", "0.1.0")
    assert before - 1 <= e.created <= time.time() + 1
    assert e.timings[:2] == (
        (cfg_to_json(Cfg(1)), 0.003, None),
        (cfg_to_json(Cfg(2)), math.inf, "RESOURCE_EXHAUSTED: out of memory"),
    )
    assert math.isnan(e.timings[2][1]) and e.timings[2][2] == "RuntimeError: bad"
    db.put(DEV, OP, "k", Cfg(4), source="heuristic")  # upsert replaces every column
    e2 = db.get_entry(DEV, OP, "k")
    assert (e2.cfg, e2.source, e2.timings, e2.signature) == (Cfg(4), "heuristic", (), "")
    assert len(db) == 1


def test_put_with_expect_created_is_a_compare_and_set(db):
    assert db.created(DEV, OP, "k") is None
    assert db.put(DEV, OP, "k", Cfg(1), timings=[(Cfg(1), 0.1, None)], expect_created=None)
    first = db.created(DEV, OP, "k")
    assert isinstance(first, float) and first == db.get_entry(DEV, OP, "k").created
    # another writer came first: nothing changes, neither the config nor its timings
    assert not db.put(DEV, OP, "k", Cfg(2), timings=[(Cfg(2), 0.2, None)], expect_created=None)
    time.sleep(0.01)
    assert not db.put(DEV, OP, "k", Cfg(2), expect_created=first - 1.0)
    e = db.get_entry(DEV, OP, "k")
    assert (e.cfg, [t[1] for t in e.timings], e.created) == (Cfg(1), [0.1], first)
    # the row is still the one seen: replaced whole
    assert db.put(DEV, OP, "k", Cfg(3), source="heuristic", expect_created=first)
    e = db.get_entry(DEV, OP, "k")
    assert (e.cfg, e.source, e.timings) == (Cfg(3), "heuristic", ())
    assert db.created(DEV, OP, "k") > first
    assert db.put(DEV, OP, "k", Cfg(4)) is True  # without expect_created: always stored
    with pytest.raises(TypeError, match=r"PersistentCache.put: expect_created must be"):
        db.put(DEV, OP, "k", Cfg(5), expect_created="yesterday")
    with pytest.raises(TypeError, match=r"PersistentCache.created"):
        db.created(DEV, 3, "k")


def test_persistent_entries_delete_clear_len(db):
    for i in range(3):
        db.put(DEV, OP, f"m{i}", Cfg(block_m=i))
    db.put("gpu|h100", OP, "m0", Cfg(block_m=99))
    db.put(DEV, "attention@v1", "a0", Cfg(name="a"))
    assert len(db) == 5
    assert [(e.device, e.call_key) for e in db.entries(OP)] == [
        ("cpu|test-device", "m0"), ("cpu|test-device", "m1"), ("cpu|test-device", "m2"),
        ("gpu|h100", "m0"),
    ]  # fmt: skip
    assert [e.op_id for e in db.entries()] == ["attention@v1"] + [OP] * 4
    assert db.delete("no-such-op@v1") == 0
    assert db.delete(OP) == 4 and len(db) == 1 and db.get(DEV, OP, "m0") is None
    db.record_invocation(OP, "m0", '{"a": "f32[2]"}')
    db.clear()
    assert len(db) == 0 and db.entries() == [] and db.recorded() == []
    db.put(DEV, OP, "x", Cfg())
    assert db.delete() == 1


def test_persistent_recorded_invocations(db):
    db.record_invocation(OP, "k1", '{"a": "f32[2,2]"}')
    db.record_invocation(OP, "k1", '{"a": "f32[2,2]"}')
    db.record_invocation("attention@v1", "k9", "{}")
    assert db.recorded() == [("attention@v1", "k9", "{}", 1), (OP, "k1", '{"a": "f32[2,2]"}', 2)]
    assert db.recorded(OP) == [(OP, "k1", '{"a": "f32[2,2]"}', 2)]
    assert len(db) == 0  # invocations are not configs
    with pytest.raises(TypeError, match=r"record_invocation: signature_json must be a str"):
        db.record_invocation(OP, "k1", {"a": 1})


def test_persistent_put_errors_name_the_api(db):
    with pytest.raises(TypeError, match=r"PersistentCache.put: config class MutableCfg .*Fix"):
        db.put(DEV, OP, "k", MutableCfg())
    with pytest.raises(TypeError, match=r"PersistentCache.put: argument 'device' must be a str"):
        db.put(None, OP, "k", Cfg())
    with pytest.raises(ValueError, match=r"PersistentCache.put: source="):
        db.put(DEV, OP, "k", Cfg(), source="manual")
    with pytest.raises(ValueError, match=r"in-memory.*Fix"):
        PersistentCache(":memory:")
    with pytest.raises(ValueError, match=r"is a directory.*Fix"):
        PersistentCache(db.path.parent)
    assert len(db) == 0


def test_persistent_stale_class_returns_none_with_one_warning(db):
    db.put(DEV, OP, "k", Cfg())
    db.put(DEV, OP, "ok", Cfg(7))
    with sqlite3.connect(db.path) as raw:
        raw.execute(
            "UPDATE configs SET cfg_json = ? WHERE call_key = 'k'",
            ('{"fields": {"a": 1}, "type": "gone_module_xyz:OldCfg"}',),
        )
    with pytest.warns(RuntimeWarning, match="gone_module_xyz:OldCfg is not one this process"):
        assert db.get(DEV, OP, "k") is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per entry, not on every lookup
        assert db.get(DEV, OP, "k") is None and db.get_entry(DEV, OP, "k") is None
        assert [e.call_key for e in db.entries()] == ["ok"]
    assert len(db) == 2


def test_default_path_follows_cache_dir_option(tmp_path):
    with _config.override(cache_dir=str(tmp_path / "nx-cache")):
        cache = PersistentCache()
    assert cache.path == tmp_path / "nx-cache" / "kernels.sqlite"
    cache.put(DEV, OP, "k", Cfg())
    assert cache.path.exists() and PersistentCache(cache.path).get(DEV, OP, "k") == Cfg()
    cache.close()


def test_put_waits_for_another_writer(db):
    db.put(DEV, OP, "k0", Cfg())
    raw = sqlite3.connect(db.path, isolation_level=None, check_same_thread=False)
    raw.execute("BEGIN IMMEDIATE")  # hold the write lock for a while
    threading.Timer(0.3, lambda: raw.execute("COMMIT")).start()
    t0 = time.perf_counter()
    db.put(DEV, OP, "k1", Cfg(1))
    assert time.perf_counter() - t0 >= 0.2
    assert db.get(DEV, OP, "k1") == Cfg(1)
    raw.close()


def test_threads_hammering_one_persistent_cache(db):
    n_threads, n_ops, n_keys, errors, wrong = 8, 60, 40, [], []
    barrier = threading.Barrier(n_threads)

    def work(t):
        try:
            barrier.wait()
            for i in range(n_ops):
                k = (i + t * 5) % n_keys  # threads overlap; together they put every key
                if i % 3 != 1:
                    db.put(DEV, OP, f"k{k}", Cfg(block_m=k), timings=[(Cfg(k), 0.1, None)])
                got = db.get(DEV, OP, f"k{k}")
                if got is not None and got != Cfg(block_m=k):
                    wrong.append((k, got))
        except Exception as e:  # reported below
            errors.append((t, repr(e)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and wrong == []
    assert len(db) == n_keys
    assert all(db.get(DEV, OP, f"k{k}") == Cfg(block_m=k) for k in range(n_keys))


_WORKER = """
import pathlib, sys, time
sys.path.insert(0, {mod_dir!r})
from nablax.kernels.cache import PersistentCache
from worker_cfg import WCfg
w, folder = int(sys.argv[1]), pathlib.Path({mod_dir!r})
cache = PersistentCache({path!r})
(folder / f"ready-{{w}}").touch()
while not (folder / "go").exists():  # start together, so that the writers really overlap
    time.sleep(0.005)
for i in range(200):
    cache.put("cpu|w", "matmul@v1", f"w{{w}}-{{i}}", WCfg(w, i), timings=[(WCfg(w, i), 1e-3, None)])
"""


def test_processes_writing_the_same_file(tmp_path, monkeypatch):
    # The config class lives in a real module, so this process can import what the workers stored.
    (tmp_path / "worker_cfg.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass(frozen=True)\n"
        "class WCfg:\n    worker: int\n    i: int\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "shared.sqlite"
    script = textwrap.dedent(_WORKER.format(mod_dir=str(tmp_path), path=str(path)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": "cpu",
    }
    procs = [
        subprocess.Popen([sys.executable, "-c", script, str(w)], env=env, stderr=subprocess.PIPE)
        for w in range(4)
    ]
    deadline = time.monotonic() + 120
    while len(list(tmp_path.glob("ready-*"))) < 4 and time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            break  # a worker died early: its error is reported below
        time.sleep(0.01)
    (tmp_path / "go").touch()
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()[-2000:]
    from worker_cfg import WCfg

    cache = PersistentCache(path, cfg_type=WCfg)  # this process never stored a WCfg
    assert len(cache) == 800  # 4 writers x 200 puts: nothing lost
    assert cache.get("cpu|w", OP, "w3-199") == WCfg(3, 199)
    assert {e.cfg for e in cache.entries()} == {WCfg(w, i) for w in range(4) for i in range(200)}
    cache.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")  # jax warns about forking threads
def test_forked_child_opens_its_own_connection(db):
    db.put(DEV, OP, "parent", Cfg(1))
    parent_conn = db._conn()
    pid = os.fork()
    if pid == 0:  # child: must not touch the parent's connection
        code = 1
        try:
            db.put(DEV, OP, "child", Cfg(2))
            code = 0 if db.get(DEV, OP, "parent") == Cfg(1) else 2
            code = 3 if db._conn() is parent_conn else code
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db.get(DEV, OP, "child") == Cfg(2) and len(db) == 2

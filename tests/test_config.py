"""``nx.config``: update (process-wide), override (scoped per thread and task), reload (re-reads the
NABLAX_* variables), describe, and the errors for unknown names and bad values. The environment is
read at import (checked in a child process) and again on reload (checked in this one)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading

import pytest

import nablax
import nablax as nx
from nablax import _config
from nablax.errors import ConfigError, NablaxError, UnknownOptionError

# the options of src/nablax/_config.py (others may be added: NAMES comes from the registry)
CORE_NAMES = ["max_graph_depth", "max_executables", "async_rest_min_nodes", "backward_plans"]
KERNEL_NAMES = ["cache_dir", "ops_stamp", "ops_record", "autotune"]
NAMES = list(_config.options())
ENVS = ["NABLAX_" + n.upper() for n in NAMES]


@pytest.fixture(autouse=True)
def _restore_config():
    """Every test leaves the process-wide values (and their sources) as it found them."""
    values, sources = dict(_config._values), dict(_config._sources)
    yield
    _config._values.update(values)
    _config._sources.update(sources)


@pytest.fixture
def clean_env(monkeypatch):
    """No NABLAX_* variable set (the suite's NABLAX_CACHE_DIR included), values reloaded."""
    for env in ENVS:
        monkeypatch.delenv(env, raising=False)
    nx.config.reload()
    return monkeypatch


def _child(env: dict[str, str], code: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("NABLAX_")}
    full.update(env)
    return subprocess.run(
        [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120
    )


_DUMP = (
    "import json, nablax as nx\n"
    "from nablax import _config\n"
    f"names = {NAMES!r}\n"
    "print(json.dumps({n: [nx.config.get(n), getattr(nx.config, n), _config.get(n),"
    " _config.source(n)] for n in names}))\n"
)


def test_the_public_object_and_the_options_it_covers(clean_env):
    from nablax import config

    assert config is nx.config is nablax.config
    assert "config" in nablax.__all__
    assert set(CORE_NAMES + KERNEL_NAMES) <= set(NAMES)
    assert {n for n in dir(nx.config) if not n.startswith("_")} >= set(NAMES)
    for name, opt in _config.options().items():
        assert opt.env == "NABLAX_" + name.upper()
        assert getattr(nx.config, name) == nx.config.get(name) == _config.get(name)
        assert nx.config.get(name) == opt.default and _config.source(name) == "default"


# --- the environment -----------------------------------------------------------------------------


def test_environment_is_read_at_import_in_a_fresh_process(tmp_path):
    env = {
        "NABLAX_MAX_GRAPH_DEPTH": "123",
        "NABLAX_MAX_EXECUTABLES": " 7 ",
        "NABLAX_BACKWARD_PLANS": "off",
        "NABLAX_OPS_STAMP": "JSON",
        "NABLAX_OPS_RECORD": "Yes",
        "NABLAX_AUTOTUNE": "0",
        "NABLAX_CACHE_DIR": str(tmp_path),
        "NABLAX_ASYNC_REST_MIN_NODES": "",  # empty: unset
    }
    r = _child(env, _DUMP)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    want = {  # every other option: its default
        **{n: opt.default for n, opt in _config.options().items()},
        "max_graph_depth": 123,
        "max_executables": 7,
        "async_rest_min_nodes": 16,
        "backward_plans": False,
        "cache_dir": str(tmp_path),
        "ops_stamp": "json",
        "ops_record": True,
        "autotune": False,
    }
    for name, value in want.items():
        source = "env" if "NABLAX_" + name.upper() in env else "default"
        source = "default" if name == "async_rest_min_nodes" else source
        assert got[name] == [value, value, value, source], name


def test_a_bad_variable_fails_the_import_naming_it_and_the_accepted_values():
    r = _child({"NABLAX_MAX_EXECUTABLES": "lots", "NABLAX_AUTOTUNE": "maybe"}, "import nablax")
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()[-1]
    assert err.startswith("nablax.errors.ConfigError: import nablax: bad environment variables")
    assert "NABLAX_MAX_EXECUTABLES='lots' (option 'max_executables')" in err
    assert "an integer >= 0" in err
    assert "NABLAX_AUTOTUNE='maybe' (option 'autotune')" in err
    assert "1/0, true/false, yes/no, on/off" in err


def test_reload_picks_up_a_changed_variable_and_drops_updates(clean_env):
    clean_env.setenv("NABLAX_MAX_GRAPH_DEPTH", "77")
    assert nx.config.max_graph_depth == 2048  # read at import / reload, not on every get
    nx.config.reload()
    assert nx.config.max_graph_depth == _config.get("max_graph_depth") == 77
    assert _config.source("max_graph_depth") == "env"
    nx.config.update("autotune", False)
    nx.config.reload()
    assert nx.config.autotune is True and _config.source("autotune") == "default"
    clean_env.delenv("NABLAX_MAX_GRAPH_DEPTH")
    nx.config.reload()
    assert nx.config.max_graph_depth == 2048 and _config.source("max_graph_depth") == "default"


@pytest.mark.parametrize(
    "text, value",
    [("1", True), ("TRUE", True), (" yes ", True), ("On", True)]
    + [("0", False), ("false", False), ("NO", False), ("off", False)],
)
def test_boolean_variables(clean_env, text, value):
    clean_env.setenv("NABLAX_BACKWARD_PLANS", text)
    clean_env.setenv("NABLAX_AUTOTUNE", text)
    nx.config.reload()
    assert nx.config.backward_plans is value and nx.config.autotune is value


def test_reload_with_a_bad_variable_changes_nothing(clean_env):
    clean_env.setenv("NABLAX_ASYNC_REST_MIN_NODES", "5")
    clean_env.setenv("NABLAX_OPS_STAMP", "xml")
    with pytest.raises(ConfigError) as e:
        nx.config.reload()
    msg = str(e.value)
    assert msg.startswith("nx.config.reload: bad environment variable: NABLAX_OPS_STAMP='xml'")
    assert "one of 'hash', 'json', 'none'" in msg
    assert nx.config.async_rest_min_nodes == 16  # the good variable was not applied either
    clean_env.setenv("NABLAX_OPS_STAMP", "none")
    clean_env.setenv("NABLAX_MAX_GRAPH_DEPTH", "0")
    with pytest.raises(ConfigError, match=r"NABLAX_MAX_GRAPH_DEPTH='0'.*an integer >= 1: got 0"):
        nx.config.reload()


def test_reload_reaches_the_core(clean_env):
    clean_env.setenv("NABLAX_MAX_EXECUTABLES", "2")
    nx.config.reload()
    nx.clear_caches()
    for n in range(1, 5):
        (nx.ones(n) + 1).numpy()
    info = nx.cache_info()
    assert (info.executables, info.evictions) == (2, 2)


# --- update and override ---------------------------------------------------------------------------


def test_update_is_process_wide(clean_env):
    nx.config.update("max_graph_depth", 300)
    assert _config.source("max_graph_depth") == "update"
    seen = []
    t = threading.Thread(target=lambda: seen.append(_config.get("max_graph_depth")))
    t.start()
    t.join()
    assert seen == [300] and nx.config.max_graph_depth == 300
    nx.config.update("cache_dir", os.path.join("some", "dir"))
    assert nx.config.cache_dir == os.path.join("some", "dir")
    nx.config.update("ops_stamp", " JSON ")  # normalized like the variable
    assert nx.config.ops_stamp == "json"


def test_update_reaches_the_core_from_another_thread(clean_env):
    nx.config.update("max_graph_depth", 128)
    out = {}

    def loop():
        x = nx.zeros(())
        for _ in range(1000):
            x = x + 1
            out["depth"] = max(out.get("depth", 0), x._impl.depth)
        out["value"] = x.item()

    t = threading.Thread(target=loop)
    t.start()
    t.join()
    assert out["value"] == 1000.0 and out["depth"] <= 128 + 64  # realized along the way


def test_override_nests_wins_over_update_and_restores(clean_env):
    nx.config.update("max_graph_depth", 500)
    with nx.config.override(max_graph_depth=10, ops_stamp="json"):
        assert (nx.config.max_graph_depth, nx.config.ops_stamp) == (10, "json")
        assert _config.source("max_graph_depth") == "override"
        with _config.override(max_graph_depth=20):  # the internal spelling is the same thing
            assert nx.config.get("max_graph_depth") == 20 and nx.config.ops_stamp == "json"
        assert nx.config.max_graph_depth == 10
        nx.config.update("max_graph_depth", 600)  # process-wide: the override still wins here
        assert nx.config.max_graph_depth == 10
    assert nx.config.max_graph_depth == 600 and nx.config.ops_stamp == "hash"
    assert _config.source("max_graph_depth") == "update"


def test_override_is_per_thread(clean_env):
    barrier = threading.Barrier(2, timeout=30)
    seen = {}

    def worker(depth):
        with nx.config.override(max_graph_depth=depth):
            barrier.wait()  # both threads are inside their override now
            seen[depth] = [_config.get("max_graph_depth"), nx.config.max_graph_depth]
            barrier.wait()
        seen[depth].append(_config.get("max_graph_depth"))

    threads = [threading.Thread(target=worker, args=(d,)) for d in (11, 22)]
    with nx.config.override(max_graph_depth=33):  # a new thread does not inherit this either
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert nx.config.max_graph_depth == 33
    assert seen == {11: [11, 11, 2048], 22: [22, 22, 2048]}


def test_override_is_per_async_task(clean_env):
    async def task(value, log):
        with nx.config.override(ops_stamp=value):
            for _ in range(3):
                await asyncio.sleep(0)  # the other task runs in between
                log.append((value, nx.config.ops_stamp))

    async def main():
        log = []
        await asyncio.gather(task("json", log), task("none", log))
        return log, nx.config.ops_stamp

    log, after = asyncio.run(main())
    assert sorted(log) == [("json", "json")] * 3 + [("none", "none")] * 3
    assert after == "hash"


# --- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call, where",
    [
        (lambda: nx.config.update("max_graph_dept", 5), "nx.config.update"),
        (lambda: nx.config.override(max_graph_dept=5), "nx.config.override"),  # before `with`
        (lambda: nx.config.get("max_graph_dept"), "nx.config.get"),
        (lambda: _config.get("max_graph_dept"), "nx.config.get"),
        (lambda: nx.config.max_graph_dept, "nx.config"),
        (lambda: nx.config.describe("max_graph_dept"), "nx.config.describe"),
    ],
)
def test_unknown_names_are_named_with_close_matches_and_the_list(call, where):
    with pytest.raises(UnknownOptionError) as e:
        call()
    msg = str(e.value)
    assert msg.startswith(f"{where}: unknown option 'max_graph_dept'")
    assert "did you mean 'max_graph_depth'?" in msg
    assert "Known options: " + ", ".join(sorted(NAMES)) in msg
    assert isinstance(e.value, (NablaxError, KeyError, AttributeError))


def test_unknown_attribute_behaves_like_a_missing_attribute():
    assert not hasattr(nx.config, "no_such_option")
    assert getattr(nx.config, "no_such_option", "fallback") == "fallback"
    with pytest.raises(UnknownOptionError, match="unknown option 'zzz'. Known options"):
        nx.config.update("zzz", 1)  # nothing close: no suggestion


@pytest.mark.parametrize(
    "name, value, accepts",
    [
        ("max_graph_depth", "big", "an integer >= 1"),
        ("max_graph_depth", 0, "an integer >= 1"),
        ("max_graph_depth", 2.5, "an integer >= 1"),
        ("max_executables", True, "an integer >= 0"),
        ("async_rest_min_nodes", -1, "an integer >= 0"),
        ("backward_plans", 1, "True or False"),
        ("autotune", "yes", "True or False"),
        ("ops_stamp", "xml", "one of 'hash', 'json', 'none'"),
        ("ops_stamp", 3, "one of 'hash', 'json', 'none'"),
        ("cache_dir", 42, "a folder path (str or os.PathLike), or None"),
        ("cache_dir", "", "a folder path (str or os.PathLike), or None"),
    ],
)
def test_bad_values_are_refused_when_set(clean_env, name, value, accepts):
    before = nx.config.get(name)
    env = "NABLAX_" + name.upper()
    for where, call in [
        ("nx.config.update", lambda: nx.config.update(name, value)),
        ("nx.config.override", lambda: nx.config.override(**{name: value})),
    ]:
        with pytest.raises(ConfigError) as e:
            call()
        msg = str(e.value)
        assert msg.startswith(f"{where}: option {name!r} (variable {env}) must be {accepts}")
        assert isinstance(e.value, ValueError)
        assert nx.config.get(name) == before and _config.source(name) == "default"


def test_a_bad_value_in_override_applies_none_of_them(clean_env):
    with pytest.raises(ConfigError, match="'ops_stamp'"):
        with nx.config.override(max_graph_depth=9, ops_stamp="xml"):
            pytest.fail("the block must not run")
    assert nx.config.max_graph_depth == 2048


def test_attribute_assignment_is_refused_with_the_fix():
    with pytest.raises(AttributeError, match=r"Fix: nx.config.update\('max_graph_depth', 5\)"):
        nx.config.max_graph_depth = 5
    assert nx.config.max_graph_depth == _config.get("max_graph_depth")


# --- describe ------------------------------------------------------------------------------------


def test_describe_lists_every_option_with_value_source_variable_and_doc(clean_env, tmp_path):
    clean_env.setenv("NABLAX_CACHE_DIR", str(tmp_path))
    nx.config.reload()
    nx.config.update("ops_record", True)
    with nx.config.override(async_rest_min_nodes=0):
        text = str(nx.config)
        assert text == nx.config.describe()
    for name, opt in _config.options().items():
        value, source = {
            "cache_dir": (str(tmp_path), "env"),
            "ops_record": (True, "update"),
            "async_rest_min_nodes": (0, "override"),
        }.get(name, (opt.default, "default"))
        assert f"{name} = {value!r}  [{source}]\n" in text
        assert f"variable {opt.env}: " in text
        assert opt.doc[:60] in " ".join(text.split())
    assert nx.config.describe("ops_stamp").splitlines()[0] == "ops_stamp = 'hash'  [default]"
    assert repr(nx.config).startswith("nx.config(max_graph_depth=2048, ")

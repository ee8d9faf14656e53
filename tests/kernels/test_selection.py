"""The config selection chain: order, scoping, persistence rules, tuning (kernels/selection.py,
kernels/tuner.py)."""

from __future__ import annotations

import math
import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest
from _kernels import Repeat, Reps

from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Invocation,
    Kernel,
    NoConfigError,
    PersistentCache,
    Tuner,
    device_fingerprint,
    overlay_cache,
    policy_override,
)

DEV = device_fingerprint()
SRC = Path(__file__).resolve().parents[2] / "src"


class FakeTuner(Tuner):
    """Deterministic timings: seconds per config from a table (the timed runs still happen once,
    so a candidate that fails to compile still fails)."""

    def __init__(self, table):
        super().__init__(warmup=0, iters=1)
        self.table = table
        self.timed: list = []

    def time_once(self, compiled, arrays, cfg):
        self.timed.append(cfg)
        return self.table[cfg]


@pytest.fixture
def kernel():
    return Repeat("repeat_sel")


@pytest.fixture
def store(tmp_path):
    s = PersistentCache(tmp_path / "k.sqlite")
    yield s
    s.close()


def _inv(k, n=8, cfg=None):
    return Invocation(k.versioned_id, (jnp.ones((n, n)), jnp.eye(n)), {}, cfg)


def _chain(store, table=None, **policy):
    table = table or {Reps(300): 3.0, Reps(3): 1.0, Reps(30): 2.0}
    return ConfigSelectorChain(ConfigCache(), AutotunePolicy(**policy), FakeTuner(table), store)


def test_chain_order(kernel, store):
    chain = _chain(store)
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    # explicit cfg beats everything and is stored nowhere
    assert chain.select(_inv(kernel, cfg=Reps(7)), kernel).source == "override"
    assert len(chain.cache) == 0 and len(store) == 0
    # empty caches: autotune picks the fastest by the fake timings, stores it in both caches
    first = chain.select(inv, kernel)
    assert (first.cfg, first.source) == (Reps(3), "autotune")
    assert chain.tuner.timed == [Reps(300), Reps(3), Reps(30)]
    entry = store.get_entry(*key)
    assert entry.source == "autotune" and len(entry.timings) == 3
    assert chain.select(inv, kernel).source == "memory"
    # overlay beats the memory cache
    with overlay_cache({key: Reps(99)}):
        assert chain.select(inv, kernel) == type(first)(Reps(99), "overlay")
    # a new process (fresh memory cache) finds it in the persistent cache, without tuning
    chain2 = _chain(store)
    assert chain2.select(inv, kernel).source == "persistent"
    assert chain2.tuner.timed == []
    assert chain2.select(inv, kernel).source == "memory"


def test_heuristic_when_autotune_is_off_then_tuned_later(kernel, store):
    inv = _inv(kernel)
    no_tune = _chain(store, allow_autotune=False)
    assert no_tune.select(inv, kernel).source == "heuristic"
    assert store.get_entry(DEV, kernel.versioned_id, inv.call_key).source == "heuristic"
    assert no_tune.select(inv, kernel).source == "memory"  # reused where tuning is not wanted
    later = _chain(store)  # autotuning allowed: the stored heuristic config does not stop it
    choice = later.select(inv, kernel)
    assert (choice.cfg, choice.source) == (Reps(3), "autotune")
    assert store.get_entry(DEV, kernel.versioned_id, inv.call_key).source == "autotune"


def test_fallback_orders_and_no_config_error(kernel, store):
    inv = _inv(kernel)
    assert _chain(store, cache_miss_fallback="heuristic").select(inv, kernel).source == "heuristic"
    with pytest.raises(NoConfigError) as e:
        _chain(store, cache_miss_fallback="error").select(_inv(kernel, 4), kernel)
    assert kernel.versioned_id in str(e.value) and _inv(kernel, 4).call_key in str(e.value)

    class Bare(Kernel):
        def run(self, x, *, cfg):
            return x

    bare = Bare("bare")
    with pytest.raises(NoConfigError, match="bare@v1.*no candidate configs.*returned None"):
        _chain(False).choose(Invocation(bare.versioned_id, (jnp.ones(2),), {}), bare)
    with pytest.raises(ValueError, match="cache_miss_fallback"):
        AutotunePolicy(cache_miss_fallback="never")


def test_failing_candidate_scores_inf_and_is_reported(store):
    class Fragile(Repeat):
        def run(self, x, w, *, cfg):
            if cfg.n == 30:
                raise RuntimeError("tile too large for this shape")
            return super().run(x, w, cfg=cfg)

    k = Fragile("fragile")
    inv = _inv(k)
    with pytest.warns(RuntimeWarning, match="1 of 3 candidate.*fragile@v1.*tile too large"):
        choice = _chain(store).select(inv, k)
    assert choice.cfg == Reps(3)
    timings = store.get_entry(DEV, k.versioned_id, inv.call_key).timings
    failed = [t for t in timings if t[2] is not None]
    assert len(failed) == 1 and math.isinf(failed[0][1]) and "tile too large" in failed[0][2]


def test_overlay_and_policy_are_scoped_per_thread(kernel):
    chain = _chain(False, allow_autotune=False)
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    inside, release, seen = threading.Event(), threading.Event(), {}

    def scoped():
        with overlay_cache({key: Reps(42)}), policy_override(chain, allow_heuristics=False):
            seen["a_overlay"] = chain.choose(inv, kernel)
            seen["a_policy"] = chain.policy.allow_heuristics
            inside.set()
            release.wait(10)

    def other():
        inside.wait(10)
        seen["b_choice"] = chain.select(inv, kernel)
        seen["b_policy"] = chain.policy.allow_heuristics
        release.set()

    threads = [threading.Thread(target=scoped), threading.Thread(target=other)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert seen["a_overlay"] == Reps(42) and seen["a_policy"] is False
    assert seen["b_choice"].cfg == Reps(3) and seen["b_choice"].source == "heuristic"
    assert seen["b_policy"] is True
    # nothing left behind after the block
    assert chain.select(inv, kernel).source == "memory" and chain.policy.allow_heuristics


def test_override_is_never_cached_or_persisted(kernel, store):
    ex = Executor(_chain(store))
    x, w = jnp.ones((8, 8)), jnp.eye(8)
    ex(kernel, x, w, cfg=Reps(5))
    assert len(ex.chooser.cache) == 0 and len(store) == 0
    ex(kernel, x, w)
    assert ex.chooser.cache.get(DEV, kernel.versioned_id, _inv(kernel).call_key) == Reps(3)
    ex(kernel, x, w, cfg=Reps(5))  # after the memo exists, the override still wins, still unstored
    entry = store.get_entry(DEV, kernel.versioned_id, _inv(kernel).call_key)
    assert entry.cfg == Reps(3) and len(store) == 1


def test_executor_memo_follows_overlay_policy_and_cache(kernel):
    ex = Executor(_chain(False, allow_autotune=False))
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    x, w = jnp.ones((8, 8)), jnp.eye(8)
    picked = []
    orig = ex._spec

    def spy(k, inv, cfg, sig):
        picked.append(cfg)
        return orig(k, inv, cfg, sig)

    ex._spec = spy
    ex(kernel, x, w)
    ex(kernel, x, w)  # memo: no new choice
    assert picked == [Reps(3)]
    with overlay_cache({key: Reps(1)}):
        ex(kernel, x, w)
    ex(kernel, x, w)  # the overlay's choice was not memoized
    assert picked == [Reps(3), Reps(1)]
    ex.chooser.cache.clear()
    ex.chooser.cache.put(*key, Reps(2))
    ex(kernel, x, w)
    assert picked[-1] == Reps(2)


def test_autotune_under_jit_times_real_runs_and_picks_the_fastest(store):
    """Candidates differ ~7000x in cost (3 vs 20000 iterations of a 32x32 matmul); under jax.jit the
    tuner must time compiled runs on synthetic arrays, not the trace (which costs the same for
    every candidate and would be ~0 s)."""

    class Costly(Repeat):
        def candidate_cfgs(self, inv):
            return [Reps(20000), Reps(3)]

    k = Costly("repeat_jit")
    chain = ConfigSelectorChain(ConfigCache(), AutotunePolicy(), Tuner(warmup=1, iters=5), store)
    ex = Executor(chain)
    x, w = jnp.ones((32, 32)), jnp.eye(32)
    out = jax.jit(lambda x: ex(k, x, w))(x)
    assert out.shape == (32, 32)
    inv = Invocation(k.versioned_id, (x, w), {})
    entry = store.get_entry(DEV, k.versioned_id, inv.call_key)
    assert entry.cfg == Reps(3) and entry.source == "autotune"
    t = {row[0]: row[1] for row in entry.timings}
    slow = [v for c, v in t.items() if '"n":20000' in c][0]
    fast = [v for c, v in t.items() if '"n":3}' in c][0]
    # 20000 dependent 32x32 matmul + tanh steps take over 10 ms on any CPU; a timed trace would
    # not. Compared as a difference: on an oversubscribed machine every synchronized run also
    # pays a wake-up latency of a few ms, the same for both candidates (3000 steps, about 2 ms,
    # were within that noise on a loaded 2-core machine).
    assert slow - fast > 1e-3, t


def test_tuner_budget_and_progress(kernel, capsys):
    class Counting(Tuner):
        def time_once(self, compiled, arrays, cfg):
            return 0.001 * cfg.n

    tuner = Counting(warmup=0, iters=3, progress=True)
    result = tuner.tune(kernel, _inv(kernel), [Reps(30), Reps(3)] * 2)
    # duplicates are timed once; every candidate in every round
    assert [t.cfg for t in result.timings] == [Reps(30), Reps(3)]
    assert result.best == Reps(3) and result.timings[1].median_s == pytest.approx(0.003)
    assert "nablax tune repeat_sel@v1" in capsys.readouterr().err
    # a spent budget: the first candidate is always timed, the rest are recorded as not timed
    result = Counting(budget_s=1e-9, progress=False).tune(kernel, _inv(kernel), [Reps(3), Reps(30)])
    assert result.best == Reps(3)
    assert math.isinf(result.timings[1].median_s) and "budget" in result.timings[1].error
    assert capsys.readouterr().err == ""
    with pytest.raises(ValueError, match="iters"):
        Tuner(iters=0)


def test_tuning_keeps_the_heuristic_unless_a_candidate_is_clearly_faster(kernel):
    inv = _inv(kernel)
    close = FakeTuner({Reps(300): 0.98, Reps(3): 1.0, Reps(30): 2.0})  # 2 %: within noise
    assert close.tune(kernel, inv, [Reps(300), Reps(30)], baseline=Reps(3)).best == Reps(3)
    clear = FakeTuner({Reps(300): 0.5, Reps(3): 1.0, Reps(30): 2.0})
    result = clear.tune(kernel, inv, [Reps(300), Reps(30)], baseline=Reps(3))
    assert result.best == Reps(300) and len(result.timings) == 3  # the baseline was timed too


def test_concurrent_misses_of_one_key_tune_once_and_leave_no_lock_behind(kernel, store):
    chain = _chain(store)
    inv = _inv(kernel)
    barrier, got = threading.Barrier(6), []

    def worker():
        barrier.wait()
        got.append(chain.select(inv, kernel))

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(c.source for c in got) == ["autotune"] + ["memory"] * 5
    assert chain.tuner.timed == [Reps(300), Reps(3), Reps(30)]  # timed once, not six times
    assert len(chain._locks) == 0  # the per-key lock lived only while threads used it
    # nor do later keys, each tuned once (three are enough: one lock kept would show here; more
    # only cost XLA compiles)
    for n in range(2, 5):
        chain.select(_inv(kernel, n), kernel)
    assert len(chain._locks) == 0
    assert len(chain.tuner.timed) == 3 + 3 * 3


def test_untunable_keys_are_bounded_and_tried_again_once_dropped(store, monkeypatch):
    import nablax.kernels.selection as selection

    class Broken(Repeat):
        def run(self, x, w, *, cfg):
            raise RuntimeError("never compiles")

        def heuristic_cfg(self, inv):
            return Reps(1)

    k = Broken("broken_sel")
    monkeypatch.setattr(selection, "UNTUNABLE_MAX", 3)
    chain = _chain(store, table={Reps(300): 3.0, Reps(3): 1.0, Reps(30): 2.0, Reps(1): 1.0})
    for n in range(2, 6):  # 4 keys whose every candidate fails: the heuristic is used
        with pytest.warns(RuntimeWarning, match="candidate"):
            assert chain.select(_inv(k, n), k).cfg == Reps(1)
    assert 1 <= len(chain._untunable) <= 3


# --- two processes tuning one call at once -------------------------------------------------------


class _OtherProcessTuner(FakeTuner):
    """Times like FakeTuner, but while it tunes "another process" (a second PersistentCache on
    the same file: its own SQLite connection) stores its result for the same call first."""

    def __init__(self, table, path, key, cfg, source="autotune"):
        super().__init__(table)
        self.path, self.key, self.cfg, self.source = path, key, cfg, source

    def time_once(self, compiled, arrays, cfg):
        if not self.timed:
            with PersistentCache(self.path) as other:
                other.put(*self.key, self.cfg, source=self.source, timings=[(self.cfg, 0.5, None)])
        return super().time_once(compiled, arrays, cfg)


def test_a_call_tuned_by_two_processes_at_once_uses_the_first_stored_config(kernel, store):
    """Autotuned candidates may differ in the last bits of their results: two processes that
    tune one call at once must not each run with their own winner (a resumed training run would
    then differ from the one that never stopped). The later one uses the first one's entry."""
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    table = {Reps(300): 3.0, Reps(3): 1.0, Reps(30): 2.0}
    chain = ConfigSelectorChain(
        ConfigCache(), AutotunePolicy(), _OtherProcessTuner(table, store.path, key, Reps(30)), store
    )
    choice = chain.select(inv, kernel)
    assert chain.tuner.timed == [Reps(300), Reps(3), Reps(30)]  # it did tune (fastest: Reps(3))
    assert (choice.cfg, choice.source) == (Reps(30), "persistent")  # ... but uses the first's
    entry = store.get_entry(*key)
    assert (entry.cfg, entry.source) == (Reps(30), "autotune")  # the first entry is kept whole
    assert [t[1] for t in entry.timings] == [0.5]
    assert chain.select(inv, kernel) == type(choice)(Reps(30), "memory")
    assert _chain(store).select(inv, kernel).cfg == Reps(30)  # and so does every later process


def test_a_heuristic_stored_meanwhile_is_replaced_by_the_tuned_config(kernel, store):
    """Another process without autotuning stores the heuristic's config while this one tunes:
    this one's tuned config replaces it (a heuristic entry never blocks tuning)."""
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    table = {Reps(300): 3.0, Reps(3): 2.0, Reps(30): 1.0}
    tuner = _OtherProcessTuner(table, store.path, key, Reps(3), source="heuristic")
    chain = ConfigSelectorChain(ConfigCache(), AutotunePolicy(min_gain=0), tuner, store)
    choice = chain.select(inv, kernel)
    assert (choice.cfg, choice.source) == (Reps(30), "autotune")
    entry = store.get_entry(*key)
    assert (entry.cfg, entry.source, len(entry.timings)) == (Reps(30), "autotune", 3)


def test_a_stale_entry_is_replaced_after_tuning(kernel, store):
    """An entry whose class this process cannot rebuild is a miss; tuning replaces it (the
    compare-and-set sees the row as it was when the miss began)."""
    inv = _inv(kernel)
    key = (DEV, kernel.versioned_id, inv.call_key)
    store.put(*key, Reps(30))
    with sqlite3.connect(store.path) as raw:
        raw.execute("UPDATE configs SET cfg_json = replace(cfg_json, 'Reps', 'GoneCfg')")
    store.close()
    with pytest.warns(RuntimeWarning, match="GoneCfg"):
        choice = _chain(store).select(inv, kernel)
    assert (choice.cfg, choice.source) == (Reps(3), "autotune")
    assert PersistentCache(store.path).get_entry(*key).cfg == Reps(3)


_RACE = """
import dataclasses, os, sys, time
import jax.numpy as jnp
from nablax.kernels import (AutotunePolicy, ConfigCache, ConfigSelectorChain, Invocation, Kernel,
    PersistentCache, device_fingerprint)

@dataclasses.dataclass(frozen=True)
class RaceCfg:
    n: int

class Race(Kernel):
    def run(self, x, *, cfg):
        return x * cfg.n

    def candidate_cfgs(self, inv):
        return [RaceCfg(1), RaceCfg(2)]

class Picks:  # ejKernel's tuner protocol: picks this process's own candidate
    def autotune(self, make_fn, args, kwargs, candidates):
        open(os.path.join(sys.argv[1], "tuning-" + sys.argv[2]), "w").close()
        while len([f for f in os.listdir(sys.argv[1]) if f.startswith("tuning-")]) < 2:
            time.sleep(0.01)  # both processes are tuning now: neither has stored anything
        if sys.argv[2] == "late":  # stores only once the other process has stored its result
            while PersistentCache(path).created(*key) is None:
                time.sleep(0.01)
        return candidates[int(sys.argv[3])]

k = Race("race")
inv = Invocation(k.versioned_id, (jnp.ones(4),), {})
path = os.path.join(sys.argv[1], "kernels.sqlite")
key = (device_fingerprint(), k.versioned_id, inv.call_key)
chain = ConfigSelectorChain(ConfigCache(), AutotunePolicy(), Picks(), PersistentCache(path))
c = chain.select(inv, k)
print("RESULT", c.cfg.n, c.source)
"""


def test_two_processes_tuning_one_call_at_once_agree(tmp_path):
    """Real processes: both miss, both tune (each picking a different candidate), the one that
    stores second runs with the first one's config."""
    script = tmp_path / "race.py"
    script.write_text(_RACE)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SRC), env.get("PYTHONPATH")]))
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path), name, pick],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for name, pick in (("early", "0"), ("late", "1"))
    ]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-3000:]
        results.append(out.split("RESULT ")[1].strip())
    assert results == ["1 autotune", "1 persistent"]

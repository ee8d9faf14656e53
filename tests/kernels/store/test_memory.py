"""Tests of nablax/kernels/store/memory.py: ``ConfigCache``, the bounded LRU of configs in memory
(kept in a ``nablax._caches.Cache``), and ``MemoryDB``, where a persistent cache that cannot write
its file keeps this process's entries."""

from __future__ import annotations

import dataclasses
import math
import threading
import time

import pytest

from nablax.kernels.cache import CacheEntry, ConfigCache, cfg_to_json
from nablax.kernels.store import schema
from nablax.kernels.store.memory import MemoryDB

DEV, OP = "cpu|test-device", "matmul@v1"


@dataclasses.dataclass(frozen=True)
class Cfg:
    block_m: int = 128
    block_n: int = 64
    scale: float = 0.5
    name: str = "tile"


def test_memory_lru_eviction_order_and_stats():
    cache = ConfigCache(max_entries=3)
    for k in "abc":
        cache.put(DEV, OP, k, Cfg(name=k))
    assert cache.get(DEV, OP, "a") == Cfg(name="a")  # a becomes most recent; b is now oldest
    cache.put(DEV, OP, "d", Cfg(name="d"))
    assert cache.get(DEV, OP, "b") is None
    cache.put(DEV, OP, "e", Cfg(name="e"))  # evicts c
    assert [cache.get(DEV, OP, k) is not None for k in "abcde"] == [True, False, False, True, True]
    assert cache.stats() == {"hits": 4, "misses": 3, "size": 3, "max_entries": 3, "evictions": 2}
    assert len(cache) == 3


def test_memory_put_overwrites_and_keeps_entry_details():
    cache = ConfigCache()
    cache.put(DEV, OP, "k", Cfg(1))
    timings = [(Cfg(2), 0.25, None), (cfg_to_json(Cfg(3)), math.inf, ValueError("boom"))]
    cache.put(DEV, OP, "k", Cfg(2), source="heuristic", timings=timings, signature="f32[2,2]")
    e = cache.get_entry(DEV, OP, "k")
    assert isinstance(e, CacheEntry) and e.cfg == Cfg(2) and len(cache) == 1
    assert (e.source, e.signature, e.package_version) == ("heuristic", "f32[2,2]", "0.1.0")
    assert e.timings[0] == (cfg_to_json(Cfg(2)), 0.25, None)
    assert e.timings[1] == (cfg_to_json(Cfg(3)), math.inf, "ValueError: boom")
    assert abs(e.created - time.time()) < 60
    assert cache.get_entry(DEV, OP, "other") is None
    assert cache.get_entry("gpu|x", OP, "k") is None  # the device is part of the key


def test_memory_generation_bumps_and_clear_resets():
    cache = ConfigCache()
    g0 = cache.generation
    cache.put(DEV, OP, "k", Cfg())
    g1 = cache.generation
    cache.get(DEV, OP, "k")
    assert g1 > g0 and cache.generation == g1  # a get does not bump it
    cache.clear()
    assert cache.generation > g1 and len(cache) == 0
    assert cache.stats() == {"hits": 0, "misses": 0, "size": 0, "max_entries": 4096, "evictions": 0}


def test_memory_argument_errors():
    with pytest.raises(ValueError, match=r"ConfigCache: max_entries .* Fix"):
        ConfigCache(max_entries=0)
    cache = ConfigCache()
    with pytest.raises(TypeError, match=r"ConfigCache.put: argument 'call_key' must be a str"):
        cache.put(DEV, OP, 3, Cfg())
    with pytest.raises(ValueError, match=r"ConfigCache.put: source='tuned'"):
        cache.put(DEV, OP, "k", Cfg(), source="tuned")
    with pytest.raises(TypeError, match="each item of timings"):
        cache.put(DEV, OP, "k", Cfg(), timings=[(Cfg(), 1.0)])


def test_memory_threads_hammering_stay_consistent():
    cache = ConfigCache(max_entries=40)
    n_threads, n_ops, errors, wrong = 8, 2000, [], []
    barrier = threading.Barrier(n_threads)

    def work(t):
        try:
            barrier.wait()
            for i in range(n_ops):
                k = (i * 7 + t) % 64  # overlapping keys, more than fit: evictions happen
                if i % 3 == 0:
                    cache.put(DEV, OP, str(k), Cfg(block_m=k))
                got = cache.get(DEV, OP, str(k))
                if got is not None and got.block_m != k:
                    wrong.append((k, got))
        except Exception as e:  # reported below, with the thread that raised it
            errors.append((t, e))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == [] and wrong == []
    s = cache.stats()
    assert s["hits"] + s["misses"] == n_threads * n_ops
    assert s["size"] == len(cache) == 40
    puts = n_threads * len(range(0, n_ops, 3))
    assert cache.generation == puts and s["evictions"] > 0


def test_config_cache_keeps_its_lru_bound_and_counters():
    cache = ConfigCache(max_entries=2)
    for key in ("a", "b"):
        cache.put(DEV, OP, key, Cfg())
    assert cache.get(DEV, OP, "a") == Cfg()  # "a" is now the most recently used
    cache.put(DEV, OP, "c", Cfg(name="c"))
    assert cache.get_entry(DEV, OP, "b") is None and cache.get_entry(DEV, OP, "a") is not None
    assert cache.stats() == {"hits": 1, "misses": 0, "size": 2, "max_entries": 2, "evictions": 1}


def test_memory_db_has_the_file_schema_and_serializes_threads():
    mem = MemoryDB()
    tables = mem.run(schema.table_names)
    assert schema.TABLES <= tables
    n_threads, n_puts = 4, 50
    sql = schema.SQL_RECORD

    def work(t):
        for i in range(n_puts):
            row = ("op@v1", f"k{i % 5}", "{}", t, t)
            mem.run(lambda conn, row=row: conn.execute(sql, row))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows = mem.run(lambda conn: conn.execute(schema.SQL_RECORDED).fetchall())
    assert sorted((k, c) for _, k, _, c in rows) == [
        (f"k{i}", n_threads * n_puts // 5) for i in range(5)
    ]

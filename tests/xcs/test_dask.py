"""xcs on a Dask cluster: ``xcs.jit`` and ``xcs.vmap`` with ``client.get_executor()`` (a
``LocalCluster`` of 2 worker processes on 127.0.0.1). The engine submits the user's function and
its real arguments (picklable), never a local closure, and submit errors reach the caller."""

from __future__ import annotations

import sys
import time

import pytest

from nablax import xcs

distributed = pytest.importorskip("distributed")
cloudpickle = pytest.importorskip("cloudpickle")
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers cannot import tests/


@xcs.mark_orchestration
def slow_upper(q):
    time.sleep(0.2)
    return q.upper()


@xcs.mark_orchestration
def join_all(parts):
    return "+".join(parts)


@xcs.mark_orchestration
def broken(q):
    raise KeyError(q)


def pipeline(qs):
    parts = [slow_upper(q) for q in qs]
    return join_all(parts)


@pytest.fixture(scope="module")
def executor():
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=4,
        processes=True,
        host="127.0.0.1",
        dashboard_address=None,
    )
    client = distributed.Client(cluster)
    try:
        yield client.get_executor()
    finally:
        client.close()
        cluster.close()


def test_jit_on_dask_equals_plain_python_and_overlaps(executor):
    qs = [f"q{i}" for i in range(8)]
    f = xcs.jit(pipeline, executor=executor)
    f(qs)  # warm the workers (first pickles and imports)
    t = time.perf_counter()
    out = f(qs)
    elapsed = time.perf_counter() - t
    assert out == pipeline(qs)
    assert elapsed < 1.0, (
        f"8 calls of 0.2 s took {elapsed:.2f} s (sequential: 1.6 s)\n{f.last_plan()}"
    )
    assert f.last_plan().edges == tuple((i, 8) for i in range(8))


def test_vmap_on_dask(executor):
    qs = [f"v{i}" for i in range(8)]
    t = time.perf_counter()
    assert xcs.vmap(slow_upper, executor=executor)(qs) == [q.upper() for q in qs]
    assert time.perf_counter() - t < 1.0


def test_errors_on_dask_propagate(executor):
    @xcs.jit(executor=executor)
    def f(q):
        return broken(q)

    with pytest.raises(KeyError, match="zz"):
        f("zz")


def test_an_unpicklable_argument_fails_instead_of_hanging(executor):
    import threading

    @xcs.mark_orchestration
    def takes_lock(lock):
        return "never"

    @xcs.jit(executor=executor)
    def f():
        return takes_lock(threading.Lock())

    t = time.perf_counter()
    with pytest.raises(Exception, match="(?i)pickle|serializ"):
        f()
    assert time.perf_counter() - t < 10.0

"""XLA's CPU pool threads under SCHED_BATCH (core/cpu_threads.py): only those threads, only while
the option is on, never an error where the policy cannot be set."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.core import cpu_threads

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "SCHED_BATCH")),
    reason="Linux scheduling policies",
)


@contextlib.contextmanager
def _option_off():
    """The option off for the whole process (it is process-wide), then exactly as before."""
    value, source = _config._values["batch_xla_threads"], _config._sources["batch_xla_threads"]
    nx.config.update("batch_xla_threads", False)
    try:
        yield
    finally:
        _config._values["batch_xla_threads"], _config._sources["batch_xla_threads"] = value, source


def _policies() -> dict[int, int]:
    return {t: os.sched_getscheduler(t) for t in cpu_threads.pool_threads()}


def _run_new_program(tag: float) -> None:
    # a shape no other call uses: a new structure, so a compile (when the policy is applied)
    n = 1000 + int(tag * 100)
    x = nx.tensor(np.arange(n, dtype=np.float32))
    want = np.sin(np.arange(n, dtype=np.float32) * np.float32(tag)) + np.float32(tag)
    np.testing.assert_allclose(((x * tag).sin() + tag).numpy(), want, rtol=1e-5, atol=1e-5)


@pytest.fixture(autouse=True)
def _default_policy_after():
    yield
    cpu_threads.apply()  # the process-wide default again, whatever a test did


def test_pool_threads_are_batch_after_a_compile_and_normal_when_turned_off():
    _run_new_program(1.25)
    pols = _policies()
    assert pols, "XLA's CPU pool (tf_XLAEigen threads) was not found"
    assert set(pols.values()) == {os.SCHED_BATCH}
    with _option_off():
        assert cpu_threads.apply() == len(pols)
        assert set(_policies().values()) == {os.SCHED_OTHER}
        assert cpu_threads.apply() == 0  # nothing left to put back
        _run_new_program(2.5)  # compiling while off changes nothing
        assert set(_policies().values()) == {os.SCHED_OTHER}
    _run_new_program(3.75)
    assert set(_policies().values()) == {os.SCHED_BATCH}


def test_other_threads_are_never_touched():
    ready, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def user_thread():
        tid.append(threading.get_native_id())
        ready.set()
        stop.wait(30)

    t = threading.Thread(target=user_thread, name="tf_XLAEigen")  # even a look-alike name
    t.start()
    try:
        ready.wait(30)
        _run_new_program(4.5)
        assert cpu_threads.apply() == 0
        assert os.sched_getscheduler(tid[0]) == os.SCHED_OTHER
        main = threading.get_native_id()
        assert os.sched_getscheduler(main) == os.SCHED_OTHER
        # every thread of the process not in XLA's pool kept the normal policy
        others = [int(x) for x in os.listdir("/proc/self/task") if int(x) not in _policies()]
        for other in others:
            try:
                assert os.sched_getscheduler(other) == os.SCHED_OTHER, other
            except ProcessLookupError:  # ended meanwhile
                pass
    finally:
        stop.set()
        t.join()


def test_python_thread_names_do_not_reach_the_os_name():
    # threading.Thread(name=...) is a Python name only: the look-alike above could not be mistaken
    # for a pool thread, because the pool is found by the OS thread name (/proc/.../comm)
    seen: list[bool] = []

    def body():
        seen.append(threading.get_native_id() in cpu_threads.pool_threads())

    t = threading.Thread(target=body, name="tf_XLAEigen")
    t.start()
    t.join()
    assert seen == [False]


def test_a_forbidden_policy_change_is_skipped_quietly(monkeypatch):
    with _option_off():
        cpu_threads.apply()
    calls = []

    def refuse(tid, policy, param):
        calls.append(tid)
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    assert cpu_threads.apply() == 0
    assert calls  # it tried, was refused, and the program still runs
    _run_new_program(5.5)
    assert set(_policies().values()) == {os.SCHED_OTHER}


def test_the_option_reads_from_the_environment_in_a_new_process():
    code = (
        "import os, nablax as nx\n"
        "from nablax.core import cpu_threads\n"
        "(nx.ones(3) + 1).numpy()\n"
        "print(sorted({os.sched_getscheduler(t) for t in cpu_threads.pool_threads()}))\n"
    )
    for value, want in (("0", os.SCHED_OTHER), ("1", os.SCHED_BATCH)):
        env = dict(os.environ, NABLAX_BATCH_XLA_THREADS=value)
        r = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip() == str([want]), (value, r.stdout)

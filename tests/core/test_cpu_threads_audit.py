"""Issue 35 item 19: XLA's pool threads are found by more than their name (a Python thread that
names itself tf_XLAEigen at the OS level is never touched), and the process-wide option
``batch_xla_threads`` cannot be flipped by a thread-local ``nx.config.override``."""

from __future__ import annotations

import ctypes
import os
import sys
import threading

import numpy as np
import pytest

import nablax as nx
from nablax.core import cpu_threads
from nablax.errors import ConfigError

pytestmark = pytest.mark.skipif(
    not (sys.platform.startswith("linux") and hasattr(os, "SCHED_BATCH")),
    reason="Linux scheduling policies",
)
PR_SET_NAME = 15


def _compile_new_program(n: int) -> None:
    x = nx.tensor(np.arange(n, dtype=np.float32))
    np.testing.assert_allclose((x * 3 + 1).numpy(), np.arange(n, dtype=np.float32) * 3 + 1)


def test_a_user_thread_with_the_pool_threads_os_name_is_never_touched():
    ready, stop = threading.Event(), threading.Event()
    info: dict = {}

    def body():
        libc = ctypes.CDLL(None, use_errno=True)
        info["rc"] = libc.prctl(PR_SET_NAME, b"tf_XLAEigen", 0, 0, 0)
        info["tid"] = threading.get_native_id()
        ready.set()
        stop.wait(30)

    t = threading.Thread(target=body)
    t.start()
    try:
        assert ready.wait(30) and info["rc"] == 0
        with open(f"/proc/self/task/{info['tid']}/comm") as f:
            assert f.read().strip() == "tf_XLAEigen"  # the OS name is the pool's
        _compile_new_program(1337)
        cpu_threads.apply()
        assert info["tid"] not in cpu_threads.pool_threads()
        assert os.sched_getscheduler(info["tid"]) == os.SCHED_OTHER
    finally:
        stop.set()
        t.join()
    assert cpu_threads.pool_threads(), "XLA's real pool threads are still found"


def test_override_refuses_the_process_wide_option_and_changes_nothing():
    before = nx.config.batch_xla_threads
    _compile_new_program(1338)
    policies = {t: os.sched_getscheduler(t) for t in cpu_threads.pool_threads()}
    with pytest.raises(ConfigError, match=r"'batch_xla_threads'.*process-wide.*nx\.config\.update"):
        with nx.config.override(batch_xla_threads=not before):
            cpu_threads.apply()
            pytest.fail("the block must not run")
    assert nx.config.batch_xla_threads == before
    assert cpu_threads.apply() == 0
    now = {t: os.sched_getscheduler(t) for t in cpu_threads.pool_threads()}
    assert {t: p for t, p in now.items() if t in policies} == policies

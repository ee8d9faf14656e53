"""Issue 35 (items 7, 8, 11): a failing rank shuts down like Python (files flushed, atexit run)
without hanging on the other ranks; killing the launcher never leaves a rank running; coordinator
addresses are validated in full. Real processes, each with a short timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import nablax as nx

SRC = Path(__file__).resolve().parents[2] / "src"
ENV = {
    **os.environ,
    "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
    "JAX_PLATFORMS": "cpu",
}


def launch(*args, timeout: float = 60, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "nablax.launch", *map(str, args)],
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


# rank 1 writes 100 buffered CSV lines and registers an atexit handler, then fails; rank 0 waits
# for it in a collective (forever, without the launcher)
FAILS_WITH_BUFFERED_FILE = """
import atexit, sys, time
from pathlib import Path
import nablax as nx
import nablax.distributed
nx.distributed.initialize()
out = Path(sys.argv[1])
if nx.distributed.process_index() == 1:
    f = open(out / "rows.csv", "w")  # never flushed or closed by the script
    for i in range(100):
        f.write(f"{i},{i * i}\\n")
    atexit.register(lambda: (out / "atexit.txt").write_text("ran"))
    time.sleep(0.5)
    FAIL
import jax
mesh = nx.DeviceMesh((2,), ("dp",))
g = nx.distributed.global_tensor(nx.ones((1,)).numpy(), mesh, [["dp"]])
jax.jit(lambda a: a.sum())(g.to_jax()).block_until_ready()  # waits for rank 1
time.sleep(60)
"""


@pytest.mark.parametrize(
    "fail, code",
    [('raise RuntimeError("rank 1 fails")', 1), ("sys.exit(3)", 3)],
    ids=["exception", "exit-code"],
)
def test_a_failing_rank_flushes_its_files_and_runs_atexit(tmp_path, fail, code):
    script = tmp_path / "fails.py"
    script.write_text(FAILS_WITH_BUFFERED_FILE.replace("FAIL", fail))
    start = time.monotonic()
    r = launch("--nproc", 2, "--timeout", 40, "--grace", 1, script, tmp_path, timeout=55)
    assert r.returncode == code, r.stdout + r.stderr
    assert time.monotonic() - start < 35, "the failing rank waited for the blocked one"
    assert f"[launcher] rank 1 exited with code {code}" in r.stderr, r.stderr
    rows = (tmp_path / "rows.csv").read_text().splitlines()
    assert rows == [f"{i},{i * i}" for i in range(100)]
    assert (tmp_path / "atexit.txt").read_text() == "ran"


HANGS_AT_EXIT = """
import atexit, time
import nablax as nx
import nablax.distributed
nx.distributed.initialize()
atexit.register(lambda: time.sleep(60))  # a shutdown that never ends
raise RuntimeError("fails")
"""


def test_a_failing_rank_whose_shutdown_hangs_is_ended_after_the_exit_timeout(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text(HANGS_AT_EXIT)
    start = time.monotonic()
    r = launch("--nproc", 1, "--timeout", 40, script, env={"NABLAX_DISTRIBUTED_EXIT_TIMEOUT": "2"})
    assert r.returncode == 1, r.stdout + r.stderr
    assert time.monotonic() - start < 30
    assert "RuntimeError: fails" in r.stderr, r.stderr


SLEEPER = "import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(60)\n"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
@pytest.mark.parametrize("sig", ["SIGKILL", "SIGHUP", "SIGTERM"])
def test_killing_the_launcher_leaves_no_rank_running(tmp_path, sig):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    p = subprocess.Popen(
        [sys.executable, "-m", "nablax.launch", "--nproc", "2", "--grace", "1", str(script)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        deadline = time.monotonic() + 30
        while len(pids) < 2 and time.monotonic() < deadline:
            line = p.stdout.readline()
            if " pid " in line:
                pids.append(int(line.split()[-1]))
        assert len(pids) == 2, pids
        p.send_signal(getattr(signal, sig))
        p.wait(10)
        deadline = time.monotonic() + 5
        while [q for q in pids if alive(q)] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not [q for q in pids if alive(q)], f"ranks left running after {sig}"
        if sig != "SIGKILL":
            assert p.returncode == 128 + getattr(signal, sig), p.returncode
    finally:
        for q in [p.pid, *pids]:
            if alive(q):
                os.kill(q, signal.SIGKILL)
        p.wait(10)


def test_launcher_refuses_a_port_outside_the_tcp_range(tmp_path):
    script = tmp_path / "x.py"
    script.write_text("print('ran')\n")
    r = launch("--nproc", 1, "--port", 70000, script, timeout=30)
    assert r.returncode == 2 and "--port 70000" in r.stderr and "ran" not in r.stdout, r.stderr


@pytest.mark.parametrize(
    "address, says",
    [
        ("127.0.0.1:65536", "not an integer in 1..65535"),
        ("127.0.0.1:99999", "not an integer in 1..65535"),
        ("127.0.0.1:0", "not an integer in 1..65535"),
        ("127.0.0.1:-5", "not an integer in 1..65535"),
        ("::1:1234", "not 'host:port'"),
        ("bad host:1234", "not 'host:port'"),
        (":1234", "not 'host:port'"),
        (1234, "not a string"),
    ],
)
def test_initialize_validates_the_coordinator_address_in_full(address, says):
    nx.ones(1).numpy()  # JAX has started: the old code raised RuntimeError (or aborted before)
    with pytest.raises(ValueError, match=r"coordinator_address=.*" + says.replace(".", r"\.")):
        nx.distributed.initialize(address, 2, 0)
    assert not nx.distributed.is_initialized()


def test_initialize_names_the_variable_when_the_launcher_address_is_bad(monkeypatch):
    nx.ones(1).numpy()
    monkeypatch.setenv("NABLAX_COORDINATOR_ADDRESS", "127.0.0.1:123456")
    monkeypatch.setenv("NABLAX_NUM_PROCESSES", "2")
    monkeypatch.setenv("NABLAX_PROCESS_ID", "0")
    with pytest.raises(ValueError, match="NABLAX_COORDINATOR_ADDRESS='127.0.0.1:123456'"):
        nx.distributed.initialize()


def test_a_bad_port_never_reaches_xla_in_a_fresh_process():
    """Before JAX starts (the case that aborted in C++ with code 134)."""
    code = (
        "import nablax as nx\n"
        "try:\n"
        "    nx.distributed.initialize('127.0.0.1:70000', 2, 0)\n"
        "except ValueError as e:\n"
        "    print('ValueError', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0 and "ValueError" in r.stdout, r.stdout + r.stderr


REPLACED_HOOK = """
import sys, time
import nablax as nx
import nablax.distributed
nx.distributed.initialize()
sys.excepthook = lambda kind, value, tb: print("my hook:", value, file=sys.stderr)
if nx.distributed.process_index() == 1:
    time.sleep(0.5)
    raise RuntimeError("rank 1 fails")
import jax
mesh = nx.DeviceMesh((2,), ("dp",))
g = nx.distributed.global_tensor(nx.ones((1,)).numpy(), mesh, [["dp"]])
jax.jit(lambda a: a.sum())(g.to_jax()).block_until_ready()  # waits for rank 1
time.sleep(60)
"""


def test_a_script_that_replaces_the_excepthook_still_skips_the_barrier(tmp_path):
    script = tmp_path / "hook.py"
    script.write_text(REPLACED_HOOK)
    start = time.monotonic()
    r = launch("--nproc", 2, "--timeout", 40, "--grace", 1, script, timeout=55)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "[1] my hook: rank 1 fails" in r.stderr, r.stderr
    assert time.monotonic() - start < 35, "the failing rank waited at JAX's shutdown barrier"


@pytest.mark.parametrize("address", ["[fe80::1%eth0]:1234", "[::1]:1234", "host.example.:80"])
def test_initialize_accepts_ipv6_with_a_zone_and_a_fully_qualified_name(address):
    nx.ones(1).numpy()  # JAX has started: a valid address gets as far as that check
    with pytest.raises(RuntimeError, match="JAX has already started"):
        nx.distributed.initialize(address, 2, 0)


@pytest.mark.parametrize("timeout", [0, -1, 2.5, "300", True, 2**40])
def test_initialize_validates_its_timeout(timeout):
    nx.ones(1).numpy()
    with pytest.raises(ValueError, match=r"timeout=.* is not a whole number of seconds"):
        nx.distributed.initialize("127.0.0.1:1234", 2, 0, timeout=timeout)


@pytest.mark.skipif(not hasattr(signal, "SIGHUP"), reason="SIGHUP")
def test_a_launcher_started_under_nohup_keeps_ignoring_sighup(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text(SLEEPER)
    starter = (
        "import runpy, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_IGN); "
        "sys.argv = ['nablax.launch', *sys.argv[1:]]; "
        "runpy.run_module('nablax.launch', run_name='__main__')"
    )
    p = subprocess.Popen(
        [sys.executable, "-c", starter, "--nproc", "1", "--grace", "1", str(script)],
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    pids: list[int] = []
    try:
        line = p.stdout.readline()
        pids.append(int(line.split()[-1]))
        p.send_signal(signal.SIGHUP)
        time.sleep(1.0)
        assert p.poll() is None and alive(pids[0]), "SIGHUP stopped a nohup launcher"
        p.send_signal(signal.SIGTERM)
        assert p.wait(15) == 128 + signal.SIGTERM
        time.sleep(0.2)
        assert not alive(pids[0])
    finally:
        for q in [p.pid, *pids]:
            if alive(q):
                os.kill(q, signal.SIGKILL)
        p.wait(10)

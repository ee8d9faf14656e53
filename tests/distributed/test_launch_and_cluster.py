"""More than one process (API.md §11, issue 20): ``nablax.distributed`` and ``python -m
nablax.launch``. Real jobs of 2 processes x 2 virtual CPU devices on 127.0.0.1 (gloo collectives),
each run by the launcher in a child process with a timeout; results are checked against NumPy in
this process. Child processes are checked to be gone afterwards (no orphans)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import nablax as nx

SRC = Path(__file__).resolve().parents[2] / "src"
CASES = Path(__file__).with_name("cluster_cases.py")


def launch(*args, timeout: float = 90) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SRC), os.environ.get("PYTHONPATH")])),
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.run(
        [sys.executable, "-m", "nablax.launch", *map(str, args)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped by its new parent) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def data(shape, seed):  # as cluster_cases.data
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One launcher run of cluster_cases.py on 2 processes x 2 devices: (result, {rank: npz})."""
    out = tmp_path_factory.mktemp("cluster")
    r = launch("--nproc", 2, "--devices-per-proc", 2, "--timeout", 80, CASES, out)
    assert r.returncode == 0, r.stdout + r.stderr
    return r, {k: dict(np.load(out / f"rank{k}.npz")) for k in (0, 1)}


def test_every_check_passes_on_both_ranks_with_prefixed_output(job):
    r, _ = job
    for name in ("cluster", "jit_sum", "data_parallel_step", "tensor_parallel_matmul"):
        for rank in (0, 1):
            assert f"[{rank}] ok {name}\n" in r.stdout, r.stdout + r.stderr


def test_jit_sum_over_a_mesh_spanning_two_processes(job):
    _, res = job
    want = data((8, 3), 0).sum()
    for rank in (0, 1):
        np.testing.assert_allclose(res[rank]["jit_sum"], want, rtol=1e-6)


def test_data_parallel_gradient_step_equals_one_process(job):
    _, res = job
    w1, w2, x, y = (
        data(s, k).astype(np.float64)
        for s, k in (((6, 8), 1), ((8, 2), 2), ((16, 6), 3), ((16, 2), 4))
    )
    h = np.tanh(x @ w1)
    r = h @ w2 - y
    dp = 2 * r / r.size
    g2 = h.T @ dp
    g1 = x.T @ ((dp @ w2.T) * (1 - h**2))
    for rank in (0, 1):
        np.testing.assert_allclose(res[rank]["dp_loss"], (r**2).mean(), rtol=1e-5)
        np.testing.assert_allclose(res[rank]["dp_w1"], w1 - 0.1 * g1, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(res[rank]["dp_w2"], w2 - 0.1 * g2, rtol=1e-5, atol=1e-6)


def test_tensor_parallel_matmul_local_pieces_and_gather(job):
    _, res = job
    want = data((5, 6), 5) @ data((6, 8), 6)
    for rank in (0, 1):
        np.testing.assert_allclose(res[rank]["tp_full"], want, rtol=1e-5, atol=1e-5)
        # columns split over devices 0,1 (process 0) and 2,3 (process 1)
        np.testing.assert_allclose(
            res[rank]["tp_local"], want[:, 4 * rank : 4 * rank + 4], rtol=1e-5, atol=1e-5
        )


def test_reading_a_tensor_on_other_processes_says_how_to_gather_it(job):
    _, res = job
    msg = str(res[0]["tp_numpy_error"])
    assert "nx.distributed.gather" in msg, msg


FAILING = """
import os, subprocess, sys, time
import nablax as nx
import nablax.distributed
nx.distributed.initialize()
rank = nx.distributed.process_index()
print("pid", os.getpid(), flush=True)
if rank == 1:
    time.sleep(1)
    FAIL
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
print("pid", child.pid, flush=True)
import jax
mesh = nx.DeviceMesh((2,), ("dp",))
g = nx.distributed.global_tensor(nx.ones((1,)).numpy(), mesh, [["dp"]])
jax.jit(lambda a: a.sum())(g.to_jax()).block_until_ready()  # waits for rank 1 forever
time.sleep(120)
"""


def _pids(text: str) -> list[int]:
    return [int(line.split()[-1]) for line in text.splitlines() if " pid " in line]


@pytest.mark.parametrize(
    "fail, code, says",
    [
        ('raise RuntimeError("rank 1 fails")', 1, "[1] RuntimeError: rank 1 fails"),
        ('sys.exit("rank 1 exits")', 1, "[1] rank 1 exits"),
        ("sys.exit(3)", 3, "[launcher] rank 1 exited with code 3"),
    ],
    ids=["exception", "exit-message", "exit-code"],
)
def test_a_failing_rank_stops_the_job_and_leaves_no_orphans(tmp_path, fail, code, says):
    """An uncaught exception or a non-zero sys.exit in one rank ends it at once (not after JAX's
    shutdown barrier), while rank 0 waits for it in a collective; the launcher stops rank 0."""
    script = tmp_path / "failing.py"
    script.write_text(FAILING.replace("FAIL", fail))
    start = time.monotonic()
    r = launch("--nproc", 2, "--timeout", 60, "--grace", 2, script, timeout=75)
    assert r.returncode == code, r.stdout + r.stderr
    assert time.monotonic() - start < 50, "the launcher waited for the blocked rank"
    assert f"[launcher] rank 1 exited with code {code}" in r.stderr, r.stderr
    pids = _pids(r.stdout)
    assert says in r.stdout + r.stderr, r.stdout + r.stderr
    assert len(pids) == 3, r.stdout  # both ranks and rank 0's own child
    time.sleep(0.2)
    assert not [p for p in pids if alive(p)], r.stdout


def test_timeout_stops_every_process(tmp_path):
    script = tmp_path / "sleeper.py"
    script.write_text("import os, time\nprint('pid', os.getpid(), flush=True)\ntime.sleep(120)\n")
    start = time.monotonic()
    r = launch("--nproc", 2, "--timeout", 2, "--grace", 1, script, timeout=30)
    assert r.returncode == 124, r.stdout + r.stderr
    assert time.monotonic() - start < 20
    pids = _pids(r.stdout)
    assert len(pids) == 2 and not [p for p in pids if alive(p)], r.stdout


def test_launcher_argument_errors(tmp_path):
    r = launch("--nproc", 0, tmp_path / "x.py", timeout=30)
    assert r.returncode == 2 and "--nproc" in r.stderr
    r = launch("--nproc", 1, tmp_path / "missing.py", timeout=30)
    assert r.returncode == 2 and "no such script" in r.stderr


def test_initialize_checks_its_arguments_and_refuses_after_jax_started():
    init = nx.distributed.initialize
    with pytest.raises(ValueError, match="num_processes, process_id missing"):
        init("127.0.0.1:1234")
    with pytest.raises(ValueError, match="not 'host:port'"):
        init("localhost", 2, 0)
    with pytest.raises(ValueError, match=r"process_id=2 is not in range\(num_processes=2\)"):
        init("127.0.0.1:1234", 2, 2)
    nx.ones(1).numpy()  # JAX has started in this process
    with pytest.raises(RuntimeError, match="JAX has already started.*first thing"):
        init("127.0.0.1:1234", 2, 0)
    assert not nx.distributed.is_initialized()
    assert (nx.distributed.process_index(), nx.distributed.process_count()) == (0, 1)


def test_global_tensor_and_to_local_on_one_process():
    mesh = nx.DeviceMesh((1,), ("dp",))
    a = np.arange(6, dtype=np.float32).reshape(3, 2)
    g = nx.distributed.global_tensor(a, mesh, [["dp"], []])
    assert g.sharding == nx.ShardingSpec(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    np.testing.assert_array_equal((g * 2).numpy(), a * 2)
    np.testing.assert_array_equal(nx.distributed.to_local(g).numpy(), a)
    np.testing.assert_array_equal(nx.distributed.gather(g).numpy(), a)
    with pytest.raises(ValueError, match="spec has 1 entries but the local piece has 2"):
        nx.distributed.global_tensor(a, mesh, [["dp"]])

"""Run a script as several processes on this machine: ``python -m nablax.launch``.

::

    python -m nablax.launch --nproc 2 --devices-per-proc 2 train.py --lr 0.1

starts ``--nproc`` copies of ``train.py`` (with its arguments), each in its own process group,
with the variables :func:`nablax.distributed.initialize` reads when called without arguments:

- ``NABLAX_COORDINATOR_ADDRESS``: ``127.0.0.1:<a free port>`` (process 0 runs the coordinator);
- ``NABLAX_NUM_PROCESSES``: ``--nproc``; ``NABLAX_PROCESS_ID``: 0, 1, ..., ``--nproc`` - 1;
- ``NABLAX_LOCAL_DEVICE_COUNT``: ``--devices-per-proc``, if given (virtual CPU devices per
  process; leave it out on GPU hosts).

Each line a process writes to stdout or stderr is copied to the launcher's, prefixed with
``[rank] ``. Each process runs the script as ``python train.py`` would, except that after
``nx.distributed.initialize()`` a failure (an uncaught exception, ``sys.exit(n)`` with ``n != 0``)
skips JAX's shutdown barrier, where it would wait for the other processes (Python's normal
shutdown still runs: atexit handlers, buffered files flushed). When a process exits with a
non-zero code, the launcher stops the others (SIGTERM to their process groups, then SIGKILL after
``--grace`` seconds) and exits with that code; after ``--timeout`` seconds, or on Ctrl-C, SIGTERM
or SIGHUP, it stops all of them and exits with 124 / 130 / 143 / 129. It exits 0 when every
process does. If the launcher itself is killed (SIGKILL), Linux kills every rank (a parent-death
signal set in each rank before it starts); a rank's own child processes are stopped only by the
launcher's ordinary stop (on a failure, a timeout, Ctrl-C, SIGTERM or SIGHUP). Like ``torchrun --standalone``, for one host.

More than one machine: run one process per host (each sees its own GPUs), with the same script.
Pick host 0's address and a free port as the coordinator, and on host ``i`` of ``n`` either set
``NABLAX_COORDINATOR_ADDRESS=<host0>:<port> NABLAX_NUM_PROCESSES=<n> NABLAX_PROCESS_ID=<i>``
before ``python train.py`` (a scheduler's job script does this; on SLURM, TPU pods and Open MPI,
``nx.distributed.initialize()`` without arguments also detects the cluster itself), or call
``nx.distributed.initialize("<host0>:<port>", n, i)``. The hosts must reach each other on that
port and on the collectives' ports.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from . import _config

_print_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on now (the OS picks it).

    >>> from nablax.launch import free_port
    >>> 1024 <= free_port() <= 65535
    True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _copy(rank: int, pipe: IO[str], to_stderr: bool) -> None:
    """Copy ``pipe`` line by line to our stdout/stderr with a ``[rank] `` prefix."""
    for line in iter(pipe.readline, ""):
        out = sys.stderr if to_stderr else sys.stdout
        with _print_lock:
            out.write(f"[{rank}] {line}" if line.endswith("\n") else f"[{rank}] {line}\n")
            out.flush()
    pipe.close()


def _say(text: str) -> None:
    with _print_lock:
        sys.stderr.write(f"[launcher] {text}\n")
        sys.stderr.flush()


def _signal_group(p: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)  # the child leads its own group (start_new_session)


def _stop(procs: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every process group, SIGKILL what is left after ``grace`` seconds, reap all."""
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    for p in procs:  # also the group's other members (a rank's own children)
        _signal_group(p, signal.SIGKILL)
    for p in procs:
        p.wait()


# What every rank runs (``python -c``: sys.argv[1:] is the script and its arguments): the script as
# ``python script.py`` would (as ``__main__``, its directory first on ``sys.path``), except that
# after a ``sys.exit(n)`` with a non-zero ``n`` that reaches the top, a process that joined a
# cluster skips JAX's shutdown barrier: it would wait there for the other processes, which may be
# waiting for this one in a collective, and the launcher would not see the failure until a
# timeout. Python's normal shutdown still runs (atexit handlers, buffered files flushed).
# Uncaught exceptions take the same path through the hook ``nx.distributed.initialize``
# installs. Plain code, not a nablax import: a rank starts the script without importing nablax
# (and JAX) first.
_RANK_MAIN = """\
import os, runpy, sys
script = sys.argv[1]
sys.argv = sys.argv[1:]
sys.path[0] = os.path.dirname(os.path.abspath(script))
try:
    runpy.run_path(script, run_name="__main__")
except SystemExit as e:
    dist = sys.modules.get("nablax.distributed")
    if e.code not in (None, 0) and dist is not None and dist.is_initialized():
        dist._leave_cluster_at_exit()
    raise
"""


def _parent_death_signal():
    """A ``preexec_fn`` for the ranks (Linux): the kernel sends the rank SIGKILL when the launcher
    dies, even by SIGKILL, so that no rank outlives it; None where ``prctl`` is missing."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    launcher = os.getpid()
    pr_set_pdeathsig = 1

    def preexec() -> None:  # in the child between fork and exec: no imports, no allocations
        prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != launcher:  # the launcher died before prctl: nobody would signal
            os._exit(1)

    return preexec


def _code(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128 + N


def _start(
    args: argparse.Namespace, port: int, procs: list[subprocess.Popen], threads: list
) -> None:
    """Start the processes (appended to ``procs`` at once, so a failure stops those started)."""
    preexec = _parent_death_signal()
    for rank in range(args.nproc):
        extra = {
            "NABLAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
            "NABLAX_NUM_PROCESSES": str(args.nproc),
            "NABLAX_PROCESS_ID": str(rank),
            "PYTHONUNBUFFERED": "1",
        }
        if args.devices_per_proc is not None:
            extra["NABLAX_LOCAL_DEVICE_COUNT"] = str(args.devices_per_proc)
        p = subprocess.Popen(
            [sys.executable, "-c", _RANK_MAIN, args.script, *args.args],
            env=_config.child_environment(extra),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            bufsize=1,
            start_new_session=True,
            preexec_fn=preexec,
        )
        procs.append(p)
        for pipe, err in ((p.stdout, False), (p.stderr, True)):
            t = threading.Thread(target=_copy, args=(rank, pipe, err), daemon=True)
            t.start()
            threads.append(t)


def _watch(procs: list[subprocess.Popen], timeout: float | None) -> int:
    """Wait until every process exits 0 (-> 0), one fails (-> its code) or time is up (-> 124)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        for rank, c in enumerate(codes):
            if c:
                others = sum(x is None for x in codes)
                _say(f"rank {rank} exited with code {c}; stopping the {others} still running")
                return _code(c)
        if all(c == 0 for c in codes):
            return 0
        if deadline is not None and time.monotonic() > deadline:
            _say(f"timeout after {timeout} s; stopping all processes")
            return 124
        time.sleep(0.05)


class _Terminated(Exception):
    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _on_signal(signum, frame) -> None:
    raise _Terminated(signum)


_STOP_SIGNALS = tuple(
    getattr(signal, name) for name in ("SIGTERM", "SIGHUP") if hasattr(signal, name)
)


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m nablax.launch",
        description="Run SCRIPT as NPROC processes on this machine that join one nablax job "
        "(nx.distributed.initialize()). Output lines are prefixed with [rank].",
    )
    ap.add_argument("--nproc", type=int, required=True, help="number of processes")
    ap.add_argument(
        "--devices-per-proc",
        type=int,
        default=None,
        help="virtual CPU devices per process (sets NABLAX_LOCAL_DEVICE_COUNT)",
    )
    ap.add_argument("--timeout", type=float, default=None, help="stop all after S seconds")
    ap.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL")
    ap.add_argument("--port", type=int, default=None, help="coordinator port (default: free one)")
    ap.add_argument("script", help="the Python script every process runs")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="the script's arguments")
    return ap


def main(argv: list[str] | None = None) -> int:
    """Launch the processes ``argv`` describes (see the module docstring); returns the exit code.

    >>> import pathlib, tempfile
    >>> from nablax.launch import main
    >>> script = pathlib.Path(tempfile.mkdtemp()) / "hello.py"
    >>> _ = script.write_text("import os; print('rank', os.environ['NABLAX_PROCESS_ID'])")
    >>> main(["--nproc", "1", str(script)])
    [0] rank 0
    0
    """
    args = _parser().parse_args(argv)
    if args.nproc < 1 or (args.devices_per_proc is not None and args.devices_per_proc < 1):
        _parser().error("--nproc and --devices-per-proc must be at least 1")
    if not os.path.isfile(args.script):
        _parser().error(f"no such script: {args.script}")
    if args.port is not None and not 1 <= args.port <= 65535:
        _parser().error(f"--port {args.port} is not a TCP port: pass one in 1..65535")
    port = args.port if args.port is not None else free_port()
    procs: list[subprocess.Popen] = []
    threads: list[threading.Thread] = []
    main_thread = threading.current_thread() is threading.main_thread()
    # (a signal the launcher was started ignoring, as under nohup, stays ignored)
    stoppers = [s for s in _STOP_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    old = {sig: signal.signal(sig, _on_signal) for sig in stoppers} if main_thread else {}
    try:
        _start(args, port, procs, threads)
        code = _watch(procs, args.timeout)
    except KeyboardInterrupt:
        _say("interrupted; stopping all processes")
        code = 130
    except _Terminated as e:
        _say(f"{signal.Signals(e.signum).name}; stopping all processes")
        code = 128 + e.signum
    finally:
        for sig in old:  # a second signal must not cut the stopping short
            signal.signal(sig, signal.SIG_IGN)
        _stop(procs, args.grace)
        for sig, handler in old.items():
            signal.signal(sig, handler)
    for t in threads:  # the pipes are closed once every process of a group is gone
        t.join(timeout=args.grace)
    return code


if __name__ == "__main__":
    sys.exit(main())

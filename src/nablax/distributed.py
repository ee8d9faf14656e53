"""More than one process (API.md §11): ``nx.distributed``.

Every process of a job runs the same script. Each calls :func:`initialize` first thing, before
any tensor op; afterwards ``nx.devices()`` lists the devices of every process, a
``nx.DeviceMesh`` can span them, and ``Tensor.shard`` and ``nx.shard_map`` work unchanged over
it: XLA's SPMD partitioner compiles one program per process and the processes exchange data
through the collectives of their platform (gloo on CPU hosts, NCCL on GPUs).

- :func:`initialize` joins the cluster (a wrapper of ``jax.distributed.initialize``). Without
  arguments it reads what ``python -m nablax.launch`` set (``NABLAX_COORDINATOR_ADDRESS``,
  ``NABLAX_NUM_PROCESSES``, ``NABLAX_PROCESS_ID``, ``NABLAX_LOCAL_DEVICE_COUNT``).
- :func:`process_index`, :func:`process_count`: this process's rank and the number of processes.
- :func:`global_tensor` builds a tensor over a mesh from each process's own piece of it;
  :func:`to_local` returns this process's piece of a global tensor;
  :func:`gather` copies a global tensor to every process.

A tensor whose data lies partly on other processes cannot be printed or read with ``.numpy()``
here: :func:`gather` it (every process must call ``gather``), or read :func:`to_local`.

>>> import nablax as nx
>>> nx.distributed.process_index(), nx.distributed.process_count()
(0, 1)
"""

from __future__ import annotations

import atexit
import contextlib
import math
import re
import sys
import threading
from typing import Any

import jax
import numpy as np
from jax._src import xla_bridge as _xla_bridge  # whether JAX's backends have started

from . import _config
from .core.build import impl_from_array
from .core.sharding import DeviceMesh, DimSpec, ShardingSpec
from .core.tensor import Tensor

__all__ = [
    "gather",
    "global_tensor",
    "initialize",
    "is_initialized",
    "process_count",
    "process_index",
    "to_local",
]

_lock = threading.Lock()
_joined: dict[str, Any] | None = None  # the arguments of the successful initialize() call
_leaving = False  # this process failed and is shutting down without JAX's barrier
# a host name or IPv4 address (letters, digits, '-', '.', '_'), or an IPv6 address in brackets
_HOST = re.compile(
    r"^(?:[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?|\[[0-9A-Fa-f:.]+(?:%[A-Za-z0-9_.-]+)?\])$"
)
_FIRST_THING = (
    "Fix: call nx.distributed.initialize(...) first thing in the script, right after `import "
    "nablax as nx` and before any tensor op, nx.devices() or jax.devices()"
)


def _bad(what: str, fix: str) -> ValueError:
    return ValueError(f"nx.distributed.initialize: {what}. Fix: {fix}")


def _from_env(name: str, given: Any, env: dict[str, str], parse) -> Any:
    """``given`` if it is not None, else the launcher's variable ``name`` (parsed), else None."""
    if given is not None or name not in env:
        return given
    try:
        return parse(env[name])
    except ValueError:
        raise _bad(
            f"environment variable {name}={env[name]!r} is not valid",
            "unset it, or set it as python -m nablax.launch does",
        ) from None


def _check_address(address: Any, name: str, where: str) -> tuple[str, int]:
    """``(host, port)`` of ``address`` (``'host:port'``, ``'[ipv6]:port'``), or ``ValueError``
    naming the argument: a port outside 1..65535 would otherwise abort the process in XLA's C++
    code, after validation."""
    fix = f"pass {name} as 'host:port' with process 0's host and a free port 1..65535, e.g. '10.0.0.1:12345'"
    if not isinstance(address, str):
        raise ValueError(f"{where}: {name}={address!r} is not a string. Fix: {fix}")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not _HOST.match(host) or (":" in host and host[0] != "["):
        raise ValueError(
            f"{where}: {name}={address!r} is not 'host:port' (an IPv6 host goes in brackets, "
            f"'[::1]:12345'). Fix: {fix}"
        )
    if not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"{where}: {name}={address!r} has port {port!r}, not an integer in 1..65535. Fix: {fix}"
        )
    return host, int(port)


def _arguments(address, num, pid, local) -> tuple[Any, Any, Any, Any]:
    env = _config.launch_environment()
    address_name = "coordinator_address" if address is not None else "NABLAX_COORDINATOR_ADDRESS"
    address = _from_env("NABLAX_COORDINATOR_ADDRESS", address, env, str)
    num = _from_env("NABLAX_NUM_PROCESSES", num, env, int)
    pid = _from_env("NABLAX_PROCESS_ID", pid, env, int)
    local = _from_env("NABLAX_LOCAL_DEVICE_COUNT", local, env, int)
    given = {"coordinator_address": address, "num_processes": num, "process_id": pid}
    missing = [k for k, v in given.items() if v is None]
    if missing and len(missing) < 3:
        raise _bad(
            f"got {', '.join(f'{k}={v!r}' for k, v in given.items())}; "
            f"{', '.join(missing)} missing",
            "pass all three (or none, to auto-detect a SLURM / TPU / MPI cluster, or under "
            "python -m nablax.launch)",
        )
    if address is not None:
        _check_address(address, address_name, "nx.distributed.initialize")
    for name, v, lo in (("num_processes", num, 1), ("local_device_count", local, 1)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < lo):
            raise _bad(f"{name}={v!r} is not an integer >= {lo}", f"pass an integer >= {lo}")
    if pid is not None and (
        isinstance(pid, bool) or not isinstance(pid, int) or not 0 <= pid < num
    ):
        raise _bad(
            f"process_id={pid!r} is not in range(num_processes={num})",
            "give each process its own id 0, 1, ..., num_processes - 1",
        )
    return address, num, pid, local


def initialize(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    local_device_count: int | None = None,
    timeout: int = 300,
) -> None:
    """Join a job of ``num_processes`` processes as process ``process_id``; process 0 runs the
    coordinator at ``coordinator_address`` (``'host:port'``) and every process connects to it.

    Call it once per process, first thing (JAX fixes its devices when it starts). Without
    arguments it uses the variables ``python -m nablax.launch`` sets, and else lets JAX
    auto-detect the cluster (SLURM, TPU pods, Open MPI). It selects the gloo collectives for CPU
    devices (they only affect the CPU platform, so this is harmless on GPU hosts), and with
    ``local_device_count=D`` gives a CPU process ``D`` virtual devices (as
    ``XLA_FLAGS=--xla_force_host_platform_device_count=D`` does). ``timeout`` is how many seconds
    to wait for the other processes to join.

    Afterwards an uncaught exception ends the process with exit code 1 after Python's normal
    shutdown (atexit handlers run, buffered files are flushed) but without JAX's shutdown barrier
    (where it would wait for the other processes, which may be waiting for it), so
    ``nablax.launch`` sees the failure and stops the job. A shutdown that takes longer than the
    option ``distributed_exit_timeout`` (seconds) is cut short with exit code 1.

    Raises ``RuntimeError`` when called twice, or after JAX has started (any tensor op,
    ``nx.devices()``), and ``ValueError`` for bad arguments.

    >>> import nablax as nx
    >>> _ = nx.ones(2).numpy()  # JAX has started: too late to join a cluster
    >>> nx.distributed.initialize("127.0.0.1:12345", 2, 0)
    Traceback (most recent call last):
    ...
    RuntimeError: nx.distributed.initialize: JAX has already started in this process ...
    """
    global _joined
    with _lock:
        if _joined is not None or jax.distributed.is_initialized():
            where = f" (as {_joined})" if _joined else " (by jax.distributed.initialize)"
            raise RuntimeError(
                f"nx.distributed.initialize: this process has already joined a cluster{where}. "
                f"Fix: call it once per process"
            )
        address, num, pid, local = _arguments(
            coordinator_address, num_processes, process_id, local_device_count
        )
        if isinstance(timeout, bool) or not isinstance(timeout, int) or not 1 <= timeout < 2**31:
            raise _bad(
                f"timeout={timeout!r} is not a whole number of seconds in 1..2**31-1",
                "pass e.g. timeout=300 (how long to wait for the other processes to join)",
            )
        if _xla_bridge.backends_are_initialized():
            raise RuntimeError(
                "nx.distributed.initialize: JAX has already started in this process (a tensor "
                "op, nx.devices() or a jax call ran first), so it cannot join a cluster any "
                f"more. {_FIRST_THING}"
            )
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        if local is not None:
            jax.config.update("jax_num_cpu_devices", local)
        try:
            jax.distributed.initialize(address, num, pid, initialization_timeout=timeout)
        except Exception as e:
            raise RuntimeError(
                f"nx.distributed.initialize: could not join the cluster (coordinator_address="
                f"{address!r}, num_processes={num}, process_id={pid}): {type(e).__name__}: {e}. "
                f"Fix: start every process within {timeout} s with the same coordinator address "
                f"and process count, each with its own process_id, and check that process 0's "
                f"host accepts connections on that port"
            ) from e
        _joined = {"coordinator_address": address, "num_processes": num, "process_id": pid}
        sys.excepthook = _fail_without_barrier(sys.excepthook)
        # also when the script replaces sys.excepthook: registered after JAX's own exit handler,
        # this one runs before it (atexit runs last-registered first)
        atexit.register(_leave_cluster_if_failed)


def _fail_without_barrier(hook):
    """``sys.excepthook`` for a process in a cluster: it prints the error, then lets Python shut
    down as usual (atexit handlers run, files are flushed and closed, exit code 1) but without
    JAX's shutdown barrier, where the process would wait (up to 5 minutes) for the other
    processes, which may themselves wait for this one in a collective: a launcher would not see
    the failure. If the shutdown still takes longer than the option ``distributed_exit_timeout``
    (seconds), the process is ended then with code 1, after a dump of its threads' stacks."""

    def excepthook(kind, value, tb):
        hook(kind, value, tb)
        _leave_cluster_at_exit()

    return excepthook


def _leave_cluster_if_failed() -> None:
    """At exit: Python records an uncaught exception in ``sys.last_value`` before the hook runs."""
    if getattr(sys, "last_value", None) is not None and _joined is not None:
        _leave_cluster_at_exit()


def _leave_cluster_at_exit() -> None:
    """Before a failing process shuts down: take JAX's cluster client and service out of JAX's
    hands so that its exit handler (``jax.distributed.shutdown``) does nothing, and keep them
    alive to the end (their destructors would wait at the same barrier); then start a watchdog
    (``faulthandler``'s own thread, which needs no GIL) for the rest of the shutdown."""
    global _leaving
    if _leaving:
        return
    _leaving = True
    import ctypes
    import faulthandler

    from jax._src import distributed as jax_distributed

    state = jax_distributed.global_state
    for attr in ("preemption_sync_manager", "client", "service"):
        obj = getattr(state, attr, None)
        if obj is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))  # never destroyed: no barrier
            setattr(state, attr, None)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):  # (stderr closed: no watchdog, the shutdown goes on)
        faulthandler.dump_traceback_later(
            _config.get("distributed_exit_timeout"), exit=True, file=sys.__stderr__
        )


def is_initialized() -> bool:
    """Whether this process has joined a cluster (by :func:`initialize` or JAX's own).

    >>> import nablax as nx
    >>> nx.distributed.is_initialized()
    False
    """
    return _joined is not None or jax.distributed.is_initialized()


def process_index() -> int:
    """This process's rank: 0 ... ``process_count() - 1`` (0 in a single process).

    >>> import nablax as nx
    >>> nx.distributed.process_index()
    0
    """
    return jax.process_index()


def process_count() -> int:
    """The number of processes in the job (1 in a single process).

    >>> import nablax as nx
    >>> nx.distributed.process_count()
    1
    """
    return jax.process_count()


# ---- global tensors --------------------------------------------------------------------------


def _spec(mesh: DeviceMesh, spec, ndim: int, where: str) -> ShardingSpec:
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"{where}: mesh must be an nx.DeviceMesh, got {type(mesh).__name__}")
    if isinstance(spec, ShardingSpec):
        if spec.mesh != mesh:
            raise ValueError(f"{where}: the ShardingSpec is over {spec.mesh!r}, not {mesh!r}")
        spec = spec.dims
    spec = [s if isinstance(s, DimSpec) else DimSpec(s or ()) for s in spec]
    if len(spec) != ndim:
        raise ValueError(
            f"{where}: spec has {len(spec)} entries but the local piece has {ndim} dimensions. "
            f"Fix: one nx.DimSpec per dimension"
        )
    return ShardingSpec(mesh, spec)


def _blocks(sharding, devices, counts: tuple) -> list[tuple[int, int]]:
    """Per dimension, the (first, number) of the shard positions ``devices`` hold."""
    # with one element per shard, a device's index along a dimension is its shard position
    index = sharding.devices_indices_map(counts)
    out = []
    for d, n in enumerate(counts):
        pos = sorted({index[dev][d].indices(n)[0] for dev in devices})
        if pos != list(range(pos[0], pos[0] + len(pos))):
            raise ValueError(
                f"nx.distributed.global_tensor: this process's devices hold shards {pos} of "
                f"dimension {d}, not a contiguous block. Fix: order the mesh's devices by process "
                f"(nx.devices() does), or shard that dimension over other mesh axes"
            )
        out.append((pos[0], len(pos)))
    return out


def global_tensor(local, mesh: DeviceMesh, spec) -> Tensor:
    """A tensor over ``mesh``, laid out as ``spec`` says, from this process's piece ``local``.

    Every process calls it with its own piece, of the same shape on every process: the block of
    the global tensor that this process's devices hold (along a dimension split over mesh axes
    that span ``k`` of the ``n`` shards, the piece has ``k/n`` of the global length; along a
    replicated dimension it is the whole length). ``spec`` is an ``nx.ShardingSpec`` or one
    ``nx.DimSpec`` (or axis-name list) per dimension. The result is an ordinary tensor for
    ``nx.shard_map``, ops and ``nx.grad``; ``to_local`` gives the piece back.

    >>> import numpy as np, nablax as nx
    >>> mesh = nx.DeviceMesh((1,), ("dp",))
    >>> x = nx.distributed.global_tensor(np.ones((4, 2), np.float32), mesh, [["dp"], []])
    >>> x.shape, x.sharding.dims
    ((4, 2), [DimSpec(['dp']), DimSpec([])])
    """
    where = "nx.distributed.global_tensor"
    a = np.asarray(local.numpy() if isinstance(local, Tensor) else local)
    spec = _spec(mesh, spec, a.ndim, where)
    sharding = spec.named()
    counts = tuple(math.prod(mesh.size(ax) for ax in ds.axes) for ds in spec.dims)
    mine = [d for d in mesh.jax_mesh.devices.flat if d.process_index == jax.process_index()]
    if not mine:
        raise ValueError(f"{where}: {mesh!r} has none of this process's devices")
    blocks = _blocks(sharding, mine, counts)
    global_shape = []
    for d, ((_, k), n) in enumerate(zip(blocks, counts)):
        if a.shape[d] % k:
            raise ValueError(
                f"{where}: dimension {d} of the local piece (shape {a.shape}) is split over {k} "
                f"of this process's shards; {a.shape[d]} is not divisible by {k}"
            )
        global_shape.append(a.shape[d] // k * n)
    global_shape = tuple(global_shape)
    # the piece starts at the first shard this process holds
    offset = [first * (g // n) for (first, _), g, n in zip(blocks, global_shape, counts)]
    arrays = []
    for dev, idx in sharding.addressable_devices_indices_map(global_shape).items():
        local_idx = tuple(
            slice(s.indices(g)[0] - o, s.indices(g)[1] - o)
            for s, g, o in zip(idx, global_shape, offset)
        )
        arrays.append(jax.device_put(a[local_idx], dev))
    arr = jax.make_array_from_single_device_arrays(global_shape, sharding, arrays)
    t = Tensor._wrap(impl_from_array(arr))
    t._impl.sharding = spec
    return t


def to_local(t: Tensor) -> Tensor:
    """This process's piece of ``t``: the block of the global tensor its devices hold, as a
    tensor on this process (the whole value for a tensor on one process). No communication.

    >>> import numpy as np, nablax as nx
    >>> mesh = nx.DeviceMesh((1,), ("dp",))
    >>> x = nx.arange(6.0).reshape(3, 2).shard(mesh, [nx.DimSpec(["dp"]), nx.DimSpec([])])
    >>> nx.distributed.to_local(x).tolist()
    [[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]
    """
    return t.to_local()


def gather(t: Tensor) -> Tensor:
    """The whole value of a global tensor, on every process (a collective: every process must
    call it, with the same tensor). Use it to print or ``.numpy()`` a tensor whose data lies
    partly on other processes. A tensor that is on this process only is returned as it is.

    >>> import nablax as nx
    >>> x = nx.arange(4.0)
    >>> nx.distributed.gather(x).tolist()
    [0.0, 1.0, 2.0, 3.0]
    """
    arr = t.to_jax()
    if arr.is_fully_addressable or arr.is_fully_replicated:
        return t
    from jax.experimental import multihost_utils

    full = multihost_utils.process_allgather(arr, tiled=True)
    return Tensor._wrap(impl_from_array(jax.device_put(np.asarray(full), jax.local_devices()[0])))

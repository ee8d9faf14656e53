"""Every knob of nablax in one place (private: the public face is :data:`nablax.config`).

Each option has a default, an environment variable (``NABLAX_<NAME>``), the values it accepts and a
docstring. The environment is read when nablax is imported and again by ``nx.config.reload()``;
this is the only module that reads ``os.environ``. A value comes from, in order of precedence:

1. ``nx.config.override(name=value)``: a scoped override for a block of code, held in a
   ``contextvars`` variable so threads and async tasks do not see each other's overrides;
2. ``nx.config.update(name, value)``: process-wide, seen by every thread;
3. the environment variable, as read at import or by the last ``reload()``;
4. the default.

Inside nablax, hot paths call :func:`get` (one context-variable read and one or two dict lookups);
values are validated when they are set, never when they are read.

>>> import nablax as nx
>>> with nx.config.override(max_graph_depth=5):
...     nx.config.max_graph_depth
5
"""

from __future__ import annotations

import contextlib
import contextvars
import difflib
import operator
import os
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError, UnknownOptionError


@dataclass(frozen=True)
class Option:
    """One option: ``check`` turns a Python value into the stored value and ``parse`` the text of
    its environment variable; both raise ``ValueError``/``TypeError`` with a short reason."""

    name: str
    default: Any
    accepts: str  # as a Python value
    env_accepts: str  # as the text of the environment variable
    check: Callable[[Any], Any]
    parse: Callable[[str], Any]
    doc: str
    process_wide: bool = False  # set by update() or the variable only: override() refuses it

    @property
    def env(self) -> str:
        """The environment variable, ``NABLAX_<NAME>``."""
        return "NABLAX_" + self.name.upper()


# --- kinds of values ---------------------------------------------------------------------------


_Kind = tuple[str, str, Callable[[Any], Any], Callable[[str], Any]]


def _int_kind(minimum: int) -> _Kind:
    accepts = f"an integer >= {minimum}"

    def check(v: Any) -> int:
        if isinstance(v, bool):
            raise TypeError("a bool is not an integer here")
        try:
            i = operator.index(v)
        except TypeError:
            raise TypeError(f"got {type(v).__name__} {v!r:.60}") from None
        if i < minimum:
            raise ValueError(f"got {i}")
        return i

    def parse(s: str) -> int:
        try:
            i = int(s.strip())
        except ValueError:
            raise ValueError(f"{s!r:.60} is not an integer") from None
        return check(i)

    return accepts, accepts, check, parse


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _bool_kind() -> _Kind:
    env_accepts = ", ".join(f"{t}/{f}" for t, f in zip(_TRUE, _FALSE))

    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise TypeError(f"got {type(v).__name__} {v!r:.60}")
        return v

    def parse(s: str) -> bool:
        t = s.strip().lower()
        if t in _TRUE or t in _FALSE:
            return t in _TRUE
        raise ValueError(f"{s!r:.60} is not a boolean")

    return "True or False", env_accepts, check, parse


def _choice_kind(*choices: str) -> _Kind:
    accepts = "one of " + ", ".join(repr(c) for c in choices)

    def check(v: Any) -> str:
        if not isinstance(v, str):
            raise TypeError(f"got {type(v).__name__} {v!r:.60}")
        if v.strip().lower() not in choices:
            raise ValueError(f"got {v!r:.60}")
        return v.strip().lower()

    return accepts, accepts, check, check


def _folder_kind() -> _Kind:
    accepts = "a folder path (str or os.PathLike), or None for the default"

    def check(v: Any) -> str | None:
        if v is None:
            return None
        if not isinstance(v, (str, os.PathLike)) or not isinstance(os.fspath(v), str):
            raise TypeError(f"got {type(v).__name__} {v!r:.60}")
        if not os.fspath(v):
            raise ValueError("got an empty path")
        return os.fspath(v)

    return accepts, "a folder path", check, check


# --- the options -------------------------------------------------------------------------------

_OPTIONS: dict[str, Option] = {}


def _register(
    name: str, default: Any, kind: _Kind, doc: str, *, process_wide: bool = False
) -> None:
    accepts, env_accepts, check, parse = kind
    _OPTIONS[name] = Option(
        name, default, accepts, env_accepts, check, parse, " ".join(doc.split()), process_wide
    )


_register(
    "max_graph_depth",
    2048,
    _int_kind(1),
    "Depth of a pending (unrealized) graph past which nablax realizes it automatically, so that "
    "loops that never read a value keep bounded memory and never hit recursion limits. The cut "
    "computes only the tensor being built; deeper limits mean fewer, larger programs and more "
    "memory (XLA compiles each cut's program).",
)
_register(
    "max_executables",
    256,
    _int_kind(0),
    "Compiled programs kept in the realization cache (LRU; 0 keeps none); an evicted one's "
    "memory and mappings are released, and the cache evicts more near vm.max_map_count.",
)
_register(
    "recompile_warning",
    8,
    _int_kind(0),
    "nablax warns once per source line (RuntimeWarning) when reads at that line have compiled "
    "more than this many different programs (graph structures), naming the line and what changed "
    "between the last two (shapes, dtypes, static parameters of an op); 0 turns it off.",
)
_register(
    "async_rest_min_nodes",
    16,
    _int_kind(0),
    "When a value is read and other live pending work is connected to it (e.g. a training step's "
    "backward pass and parameter update, when only the loss is read), nablax runs what the value "
    "needs as one program and, if the rest has at least this many nodes, the rest as a second "
    "program dispatched asynchronously, so Python builds the next graph while it runs. Smaller "
    "rests run in the same program as the value. 0 turns the split off.",
)
_register(
    "async_rest_cpu_boundary_mb",
    4,
    _int_kind(0),
    "On the CPU backend, the rest (see async_rest_min_nodes) runs as a second program only when "
    "the values the first program hands it (a step's activations) take at most this many MiB; "
    "larger rests run in the same program as the value. There the second program shares the "
    "cores with the Python thread building the next graph, so it overlaps little, and its "
    "inputs make a round trip through memory: on a 2-core machine a 19 MiB boundary made a "
    "GPT step 15% slower, a 0.5 MiB one made an MLP step 13% faster. Other backends always "
    "split. A value counts by the size its live tensor or its differentiation trace recorded "
    "(a dropped value of untraced code counts as 0).",
)
_register(
    "backward_plans",
    True,
    _bool_kind(),
    "Record the backward pass of each forward-graph structure once and replay it on later calls "
    "(see nablax/core/transforms/plan.py); turn off to run every vjp rule on every call.",
)
_register(
    "batch_xla_threads",
    True,
    _bool_kind(),
    "On Linux, put XLA's CPU pool threads (tf_XLAEigen) under SCHED_BATCH when nablax compiles: "
    "the same CPU share, but a waking pool thread no longer preempts the Python thread building "
    "the next graph (nablax/core/cpu_threads.py). Off: their normal policy back at the next "
    "compile.",
    process_wide=True,
)
_register(
    "retain_host_memory",
    True,
    _bool_kind(),
    "On Linux with glibc, raise malloc's mmap and trim thresholds (256 MiB, 1 GiB) at the first "
    "compile, so buffers a step frees are reused, not unmapped and faulted in again (13 ms of "
    "system time per compiled GPT step on 2 cores; nablax/core/host_memory.py). The resident size "
    "stays at the working set's peak. Off: glibc's defaults back at the next compile.",
    process_wide=True,
)
_register(
    "gc_threshold",
    10000,
    _int_kind(0),
    "At the first compile, raise the young threshold of Python's garbage collector to at least "
    "this (CPython: 700; 2000 from 3.13), so an eager step's graph is freed by reference "
    "counting, not promoted and walked by full collections of the process (20-70 ms each after "
    "importing JAX; nablax/core/gc_threshold.py). A higher one the user set is kept; 0: the old "
    "one comes back.",
    process_wide=True,
)
_register(
    "cache_dir",
    None,
    _folder_kind(),
    "Folder of nablax's persistent kernel database (kernels.sqlite). Default (None): the user "
    "cache dir from platformdirs (e.g. ~/.cache/nablax on Linux).",
)
_register(
    "cache_lock_timeout",
    5,
    _int_kind(0),
    "Seconds nablax waits for the persistent kernel database while another process holds it "
    "locked. Past that, a kernel call keeps its configs in this process's memory (one warning) "
    "and `nablax cache` reports the lock (exit code 2), instead of waiting on.",
)
_register(
    "ops_stamp",
    "hash",
    _choice_kind("hash", "json", "none"),
    "How kernel calls are named in lowered HLO and profiles: 'hash' (op, version and a short hash "
    "of call key and config), 'json' (also the config as JSON in the op metadata) or 'none'.",
)
_register(
    "ops_record",
    False,
    _bool_kind(),
    "Record every kernel invocation (op id, call key, abstract shapes and dtypes only) in the "
    "persistent database, for offline tuning with `nablax tune --recorded`.",
)
_register(
    "autotune",
    True,
    _bool_kind(),
    "Default of AutotunePolicy.allow_autotune for the default kernel executor: whether a cache "
    "miss may time the candidate configs (else the heuristic config is used).",
)
_register(
    "distributed_exit_timeout",
    30,
    _int_kind(1),
    "Seconds a process of a cluster (after nx.distributed.initialize) that fails (an uncaught "
    "exception, or a non-zero sys.exit under python -m nablax.launch) may spend in Python's normal "
    "shutdown (atexit handlers, flushing files; JAX's shutdown barrier is skipped) before it is "
    "ended at once with exit code 1 and a dump of its threads' stacks.",
)
_register(
    "xcs_speculation_window",
    32,
    _int_kind(1),
    "How far xcs.jit may run ahead of plain Python: a call is started only while fewer than this "
    "many earlier calls are still unfinished (the program waits for the oldest otherwise). It "
    "bounds the read-only calls started speculatively that a failure makes useless (they are "
    "cancelled if not yet started); 1 runs the calls one at a time.",
)
_register(
    "compile_retrace_warning",
    8,
    _int_kind(0),
    "nx.compile warns once (RuntimeWarning) when a compiled function has traced again more than "
    "this many times for the same argument shapes because values in its cache key changed "
    "(static_argnums/static_argnames, non-numeric leaves such as strings); 0 turns it off.",
)
_register(
    "matmul_precision",
    "float32",
    _choice_kind("float32", "tensorfloat32", "bfloat16"),
    "Precision of float32 (and complex64) matmuls, einsums, dots and convolutions: 'float32' "
    "computes them in full float32 on every platform (PyTorch's default); 'tensorfloat32' and "
    "'bfloat16' allow the faster TensorFloat-32 / bfloat16 passes of GPUs and TPUs (JAX's own "
    "default is 'bfloat16'). Read when an operation is recorded and part of its program's cache "
    "key; bfloat16 and float16 inputs are unaffected.",
)


# --- the multi-process launcher's variables ----------------------------------------------------
# Not options (nothing to override or describe): `python -m nablax.launch` sets them in each child
# process and `nx.distributed.initialize()` without arguments reads them.

LAUNCH_VARIABLES = (
    "NABLAX_COORDINATOR_ADDRESS",
    "NABLAX_NUM_PROCESSES",
    "NABLAX_PROCESS_ID",
    "NABLAX_LOCAL_DEVICE_COUNT",
)


def launch_environment() -> dict[str, str]:
    """The launcher's variables that are set and not empty, as ``{name: text}``."""
    return {k: os.environ[k].strip() for k in LAUNCH_VARIABLES if os.environ.get(k, "").strip()}


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment with ``extra`` on top, for a child process."""
    return {**os.environ, **extra}


# --- errors ------------------------------------------------------------------------------------


def _unknown(where: str, name: Any) -> UnknownOptionError:
    known = sorted(_OPTIONS)
    close = difflib.get_close_matches(str(name), known, n=3) if isinstance(name, str) else []
    hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
    return UnknownOptionError(
        f"{where}: unknown option {name!r}{hint}. Known options: {', '.join(known)}. "
        f"Fix: use one of those names; print(nx.config) lists them with their values."
    )


def _option(where: str, name: Any) -> Option:
    opt = _OPTIONS.get(name) if isinstance(name, str) else None
    if opt is None:
        raise _unknown(where, name)
    return opt


def _checked(where: str, opt: Option, value: Any) -> Any:
    try:
        return opt.check(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(
            f"{where}: option {opt.name!r} (variable {opt.env}) must be {opt.accepts}; {e}. "
            f"Fix: pass {opt.accepts}, e.g. the default {opt.default!r}."
        ) from None


def _read_env(where: str) -> tuple[dict[str, Any], dict[str, str]]:
    """Values and sources of every option from the environment; every bad variable is named."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    bad = []
    for name, opt in _OPTIONS.items():
        raw = os.environ.get(opt.env)
        if raw is None or not raw.strip():  # an empty variable counts as unset
            values[name], sources[name] = opt.default, "default"
            continue
        try:
            values[name], sources[name] = opt.parse(raw), "env"
        except (TypeError, ValueError) as e:
            bad.append(f"{opt.env}={raw!r:.60} (option {name!r}) must be {opt.env_accepts}: {e}")
    if bad:
        raise ConfigError(
            f"{where}: bad environment variable{'s' * (len(bad) > 1)}: " + "; ".join(bad) + ". "
            f"Fix: set {'them' if len(bad) > 1 else 'it'} to an accepted value, or unset "
            f"{'them' if len(bad) > 1 else 'it'} for the default."
        )
    return values, sources


# --- state and the fast read -------------------------------------------------------------------

_overrides: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nablax_config_overrides", default=None
)
_ov_get = _overrides.get
_lock = threading.Lock()  # update/reload keep _values and _sources consistent
_values, _sources = _read_env("import nablax")


def get(name: str) -> Any:
    """Current value of option ``name``: scoped override, then update/environment/default.

    >>> from nablax import _config
    >>> _config.get("ops_stamp") in ("hash", "json", "none")
    True
    """
    ov = _ov_get()
    if ov is not None and name in ov:
        return ov[name]
    try:
        return _values[name]
    except (KeyError, TypeError):
        raise _unknown("nx.config.get", name) from None


def source(name: str) -> str:
    """Where the current value of ``name`` comes from: 'override', 'update', 'env' or 'default'."""
    opt = _option("nx.config.describe", name)
    ov = _ov_get()
    return "override" if ov is not None and opt.name in ov else _sources[opt.name]


def override(**values: Any) -> contextlib.AbstractContextManager[None]:
    """Set options for a block of code in the current context (thread / task). The values are
    checked by this call, before the block is entered.

    >>> from nablax import _config
    >>> with _config.override(max_graph_depth=5):
    ...     _config.get("max_graph_depth")
    5
    """
    where = "nx.config.override"
    for k in values:
        opt = _option(where, k)
        if opt.process_wide:
            raise ConfigError(
                f"{where}: option {k!r} (variable {opt.env}) is process-wide: it changes "
                f"something every thread shares, so a scoped override of one thread or task "
                f"cannot hold it. Fix: nx.config.update({k!r}, value) (and update it back "
                f"afterwards), or set {opt.env} before importing nablax"
            )
    return _scoped({k: _checked(where, _option(where, k), v) for k, v in values.items()})


@contextlib.contextmanager
def _scoped(checked: dict[str, Any]) -> Iterator[None]:
    token = _overrides.set({**(_ov_get() or {}), **checked})
    try:
        yield
    finally:
        _overrides.reset(token)


def update(name: str, value: Any) -> None:
    """Set option ``name`` for the whole process (every thread), after checking ``value``."""
    opt = _option("nx.config.update", name)
    v = _checked("nx.config.update", opt, value)
    with _lock:
        _values[name] = v
        _sources[name] = "update"


def reload() -> None:
    """Re-read every ``NABLAX_*`` variable; values set by :func:`update` are dropped. Nothing
    changes if a variable is bad (the error names each one)."""
    values, sources = _read_env("nx.config.reload")
    with _lock:
        _values.update(values)
        _sources.update(sources)


def options() -> dict[str, Option]:
    """All registered options (for documentation and the CLI)."""
    return dict(_OPTIONS)


def describe(*names: str) -> str:
    """Text listing each option (all by default): name, value, source, variable, accepted values
    and docstring."""
    opts = [_option("nx.config.describe", n) for n in names] if names else list(_OPTIONS.values())
    lines = []
    for opt in opts:
        lines.append(f"{opt.name} = {get(opt.name)!r}  [{source(opt.name)}]")
        lines.append(f"    accepts {opt.accepts}; default {opt.default!r}")
        lines.append(f"    variable {opt.env}: {opt.env_accepts}")
        doc = opt.doc
        if opt.process_wide:
            doc += (
                " Process-wide: set it with nx.config.update or the variable; nx.config.override "
                "refuses it."
            )
        lines.extend(textwrap.wrap(doc, 96, initial_indent="    ", subsequent_indent="    "))
    return "\n".join(lines)

"""Every knob of nablax in one place.

Each option has a default, an environment variable (``NABLAX_<NAME>``) and a docstring. Values can be
overridden for a block of code with :func:`override`, which is scoped by ``contextvars`` so threads and
async tasks do not see each other's overrides. This is the only module that reads ``os.environ``.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Option:
    name: str
    default: Any
    parse: Callable[[str], Any]
    doc: str


def _parse_bool(s: str) -> bool:
    return s.strip().lower() in ("1", "true", "yes", "on")


_OPTIONS: dict[str, Option] = {}


def _register(name: str, default: Any, parse: Callable[[str], Any], doc: str) -> None:
    _OPTIONS[name] = Option(name, default, parse, doc)


_register(
    "max_graph_depth",
    4096,
    int,
    "Depth of a pending (unrealized) graph past which nablax realizes it automatically, so that "
    "loops that never read a value keep bounded memory and never hit recursion limits.",
)
_register(
    "executable_cache_size",
    4096,
    int,
    "Maximum number of compiled graph structures kept in the realization cache (LRU).",
)
_register(
    "async_rest_min_nodes",
    16,
    int,
    "When a value is read and other live pending work is connected to it (e.g. a training step's "
    "backward pass and parameter update, when only the loss is read), nablax runs what the value "
    "needs as one program and, if the rest has at least this many nodes, the rest as a second "
    "program dispatched asynchronously, so Python builds the next graph while it runs. Smaller "
    "rests run in the same program as the value. 0 turns the split off.",
)
_register(
    "backward_plans",
    True,
    _parse_bool,
    "Record the backward pass of each forward-graph structure once and replay it on later calls "
    "(see nablax/core/transforms/plan.py); turn off to run every vjp rule on every call.",
)


def _parse_stamp(s: str) -> str:
    v = s.strip().lower()
    if v not in ("hash", "json", "none"):
        raise ValueError(f"NABLAX_OPS_STAMP must be hash, json or none, got {s!r}")
    return v


_register(
    "cache_dir",
    None,
    str,
    "Folder of nablax's persistent kernel database (kernels.sqlite). Default: the user cache dir "
    "from platformdirs (e.g. ~/.cache/nablax on Linux).",
)
_register(
    "ops_stamp",
    "hash",
    _parse_stamp,
    "How kernel calls are named in lowered HLO and profiles: 'hash' (op, version and a short hash "
    "of call key and config), 'json' (also the config as JSON in the op metadata) or 'none'.",
)
_register(
    "ops_record",
    False,
    _parse_bool,
    "Record every kernel invocation (op id, call key, abstract shapes and dtypes only) in the "
    "persistent database, for offline tuning with `nablax tune --recorded`.",
)
_register(
    "autotune",
    True,
    _parse_bool,
    "Default of AutotunePolicy.allow_autotune for the default kernel executor: whether a cache "
    "miss may time the candidate configs (else the heuristic config is used).",
)

_overrides: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "nablax_config_overrides", default=None
)
_env_cache: dict[str, Any] = {}


def get(name: str) -> Any:
    """Current value of option ``name``: scoped override, then environment, then default."""
    ov = _overrides.get()
    if ov is not None and name in ov:
        return ov[name]
    if name in _env_cache:
        return _env_cache[name]
    opt = _OPTIONS[name]
    raw = os.environ.get("NABLAX_" + name.upper())
    value = opt.default if raw is None else opt.parse(raw)
    _env_cache[name] = value
    return value


@contextlib.contextmanager
def override(**values: Any) -> Iterator[None]:
    """Temporarily set options for the current context (thread / task).

    >>> from nablax import _config
    >>> with _config.override(max_graph_depth=5):
    ...     _config.get("max_graph_depth")
    5
    """
    for k in values:
        if k not in _OPTIONS:
            raise KeyError(f"nablax config: unknown option {k!r}; known: {sorted(_OPTIONS)}")
    token = _overrides.set({**(_overrides.get() or {}), **values})
    try:
        yield
    finally:
        _overrides.reset(token)


def options() -> dict[str, Option]:
    """All registered options (for documentation and the CLI)."""
    return dict(_OPTIONS)

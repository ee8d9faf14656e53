"""What ``PersistentCache``'s constructor accepts: where the file is (the path, or the option
``cache_dir``), and ejKernel's ``PersistentCache(opname, path, loader, dumper, cfg_type)``."""

from __future__ import annotations

import dataclasses
import os
import re
import warnings
from pathlib import Path
from typing import Any

import platformdirs

from ... import _config

_API = "nablax.kernels.PersistentCache"

# --- where -------------------------------------------------------------------------------------


def default_path() -> Path:
    folder = _config.get("cache_dir") or platformdirs.user_cache_dir("nablax")
    return Path(folder).expanduser() / "kernels.sqlite"


def resolve_path(path: Any) -> Path:
    if path is None:
        return default_path()
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(
            f"{_API}: path must be a str or os.PathLike, got {type(path).__name__} {path!r:.60}. "
            f"Fix: pass a file path such as '~/.cache/nablax/kernels.sqlite', or None."
        )
    if str(path) == ":memory:" or str(path).startswith("file:"):
        raise ValueError(
            f"{_API}: path={str(path)!r} is not a file path; each thread opens its own "
            f"connection, so an in-memory database would not be shared. Fix: use ConfigCache for "
            f"memory, or a file path such as tempfile.mkdtemp() + '/kernels.sqlite'."
        )
    p = Path(path).expanduser()
    if p.is_dir():
        raise ValueError(
            f"{_API}: path={str(path)!r} is a directory. Fix: pass a file path such as "
            f"{str(p / 'kernels.sqlite')!r}, or set NABLAX_CACHE_DIR for the folder."
        )
    return p


# --- ejKernel's constructor arguments ----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Seed:
    path: Any
    opname: str | None
    loader: Any
    dumper: Any
    cfg_types: tuple[type, ...]


_OPNAME = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(@v[0-9]+)?")


def seed_arguments(
    args: tuple, path: Any, opname: Any, loader: Any, dumper: Any, cfg_type: Any, ignored: dict
) -> Seed:
    """Accept ``PersistentCache(path)`` as well as ejKernel's ``PersistentCache(opname,
    path=None, loader=None, dumper=None, cfg_type=None)``, by position or keyword."""
    if len(args) > 5:
        raise TypeError(
            f"{_API}: too many positional arguments. Fix: PersistentCache(path) or ejKernel's "
            f"PersistentCache(opname, path, loader, dumper, cfg_type)."
        )
    given = {"path": path, "opname": opname, "loader": loader, "dumper": dumper,
             "cfg_type": cfg_type}  # fmt: skip
    if len(args) == 1 and path is None and opname is None:
        bare = isinstance(args[0], str) and _OPNAME.fullmatch(args[0])
        # ejKernel's PersistentCache("matmul") names an op; anything else is a path
        names = ("opname",) if bare and not os.path.exists(args[0]) else ("path",)
    else:
        names = ("opname", "path", "loader", "dumper", "cfg_type")
    for name, value in zip(names, args):
        if given[name] is not None:
            raise TypeError(f"{_API}: {name} given twice (by position and by keyword).")
        given[name] = value
    path, opname, loader, dumper, cfg_type = given.values()
    for name, fn in (("loader", loader), ("dumper", dumper)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{_API}: {name} must be callable, got {type(fn).__name__}.")
    if opname is not None and not isinstance(opname, str):
        raise TypeError(f"{_API}: opname must be a str, got {type(opname).__name__}.")
    types = () if cfg_type is None else cfg_type if isinstance(cfg_type, tuple) else (cfg_type,)
    if not all(isinstance(t, type) for t in types):
        raise TypeError(
            f"{_API}: cfg_type must be a class or a tuple of classes, got {cfg_type!r}."
        )
    if ignored:
        warnings.warn(
            f"{_API}: ignoring argument(s) {', '.join(sorted(ignored))}: nablax's SQLite cache "
            f"takes path, opname, loader, dumper, cfg_type, read_only and fallback.",
            RuntimeWarning,
            stacklevel=3,
        )
    return Seed(path, opname, loader, dumper, types)

"""Limits of the host process that nablax's caches must respect (DESIGN.md convention 17:
programs are resources).

Each XLA executable maps its generated code into the process: tens to hundreds of memory
mappings per program. Linux caps a process at ``vm.max_map_count`` mappings (65,530 by default),
and a process past it dies inside LLVM ("Cannot allocate memory", then a segfault) after a few
hundred programs. :func:`maps_pressure` tells the realization cache (core/realize.py) when to
evict more than its count bound asks for. It reads ``/proc``, only on a compile (a miss, which
costs milliseconds anyway); elsewhere (no ``/proc``) it always answers ``False``.
"""

from __future__ import annotations

_MAPS = "/proc/self/maps"
_MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"
PRESSURE_FRACTION = 0.5  # evict while more than this fraction of the allowed mappings is used

_limit: int | None = None


def max_map_count() -> int | None:
    """The kernel's per-process limit of memory mappings, or ``None`` where it is unknown."""
    global _limit
    if _limit is None:
        try:
            with open(_MAX_MAP_COUNT, "rb") as f:
                _limit = int(f.read().strip() or 0)
        except (OSError, ValueError):
            _limit = 0
    return _limit or None


def map_count() -> int | None:
    """How many memory mappings the process holds now, or ``None`` where it is unknown."""
    try:
        with open(_MAPS, "rb") as f:
            return f.read().count(b"\n")
    except OSError:
        return None


def maps_pressure() -> bool:
    """Whether the process uses more than :data:`PRESSURE_FRACTION` of its allowed mappings."""
    limit = max_map_count()
    if limit is None:
        return False
    n = map_count()
    return n is not None and n > PRESSURE_FRACTION * limit

"""What ``nx.compile`` reports: :class:`CacheInfo` (one compiled function's ``f.cache_info()``)
and the ``compile.executables`` entry of ``nx.cache_info()`` (every live compiled function's
executables, summed; ``nx.clear_caches()`` empties them all)."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

from .... import _caches


@dataclass(frozen=True)
class CacheInfo:
    """Counters of one compiled function's cache (``f.cache_info()``).

    ``hits``/``misses``: calls served by a stored signature / that had to trace (one per call).
    ``traces``: runs of the Python function to record it; a ``dynamic_dims`` signature found to
    depend on the sizes costs its abandoned symbolic trace plus one trace per size. ``executables``:
    compiled programs (one per concrete size behind a symbolic trace). ``size``: stored signatures.
    """

    hits: int
    misses: int
    traces: int
    executables: int
    evictions: int
    size: int


LIVE: weakref.WeakSet = weakref.WeakSet()  # every live compiled function (nx.cache_info)


def _executables() -> _caches.CacheStats:
    """The executables of every live compiled function, summed (``nx.cache_info()``)."""
    infos = [f.cache_info() for f in list(LIVE)]
    return _caches.CacheStats(
        "compile.executables",
        sum(i.hits for i in infos),
        sum(i.misses for i in infos),
        sum(i.executables for i in infos),
        None,
        sum(i.evictions for i in infos),
    )


def _clear_all() -> None:
    for f in list(LIVE):
        f.clear_cache()


_caches.register("compile.executables", _executables, _clear_all)

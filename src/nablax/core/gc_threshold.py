"""Python's cyclic garbage collector, tuned for eager graph building (option ``gc_threshold``).

Eager code builds a few Python objects per operation (the node, its output, the reference to it,
the tensor) and keeps them until the value is read. With CPython's default threshold (a young
collection every 700 net new container objects; 2,000 from CPython 3.13), a 2000-op step triggers several young
collections, each promoting the half-built graph to the older generations; every few steps that
makes a *full* collection, which walks every object of the process (about 100,000 after importing
JAX, 20 to 70 ms on the 2-core benchmark machine). Measured on the 4x4 chain of
``bench/bench_eager.py``: a full collection every 16 chains, the mean step 1.7x its median.

When the option ``gc_threshold`` is positive (default 10,000), nablax raises the youngest
generation's threshold to at least that value when it compiles its first program. A step's graph
is then freed by reference counting before the collector runs at all, and garbage cycles are
still collected, after 10,000 net new objects instead of 700 (CPython 3.13 itself raised its
default to 2,000). A threshold the user set higher is kept; 0 puts the threshold nablax
replaced back at the next compile. Process-wide, like ``retain_host_memory``: it applies to
every library of the process (``nx.config.update`` or ``NABLAX_GC_THRESHOLD``;
``nx.config.override`` refuses it).
"""

from __future__ import annotations

import gc
import threading

from .. import _config

_lock = threading.Lock()
# "option": the option value last acted on (None: never); "previous": the threshold tuple nablax
# replaced; "applied": the one it set. A value acted on is not acted on again, so a threshold the
# user sets later with gc.set_threshold stays theirs.
_state: dict = {"option": None, "previous": None, "applied": None}


def apply() -> bool:
    """Bring the collector's young threshold in line with the option ``gc_threshold``; whether
    it changed. Called when nablax compiles a program (cheap when there is nothing to do)."""
    want = int(_config.get("gc_threshold"))
    if want == _state["option"] or (want == 0 and _state["option"] is None):
        return False
    with _lock:
        _state["option"] = want
        current = gc.get_threshold()
        if want > 0:
            if current[0] >= want:
                return False  # the user's threshold (or ours) is already as high
            new = (want, *current[1:])
            if current != _state["applied"]:
                _state["previous"] = current  # what we replace (the user may have changed it)
            gc.set_threshold(*new)
            _state["applied"] = new
            return True
        previous, applied = _state["previous"], _state["applied"]
        _state["previous"] = _state["applied"] = None
        if previous is None or current != applied:
            return False  # never set by nablax, or set again by the user since: theirs stays
        gc.set_threshold(*previous)
        return True

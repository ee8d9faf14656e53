"""One warning per source line that keeps compiling new programs (DESIGN.md convention 17).

Eager code compiles a program per graph *structure*; Python numbers are runtime values
(core/prims/index.py, core/realize.py), so a loop that changes only numbers compiles at most twice.
A loop that changes a shape, a dtype or an op's static parameter every iteration compiles every
iteration, silently slow. :func:`note` is called by the realization cache on every new structure:
it finds the user's line that asked for the value (the first frame outside nablax), counts the
structures compiled there, and past the option ``recompile_warning`` warns once for that line,
naming what changed between its last two programs, as torch's recompilation messages do.
"""

from __future__ import annotations

import os
import sys
import warnings
from types import FrameType

from .. import _caches, _config

_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../nablax

# ((filename, line), primitive names) -> [structures compiled there, last key, warned]
_sites = _caches.Cache("realize.recompile_sites", 1024)
_warned = _caches.Cache("realize.recompile_warned_lines", 1024)  # lines warned about


def _user_site() -> tuple[str, int, int] | None:
    """``(file, line, stack level for warnings.warn from note)`` of the first frame outside
    nablax."""
    f: FrameType | None = sys._getframe(2)
    level = 2
    while f is not None:
        fn = f.f_code.co_filename
        if not fn.startswith(_PKG) and "importlib" not in fn:
            return fn, f.f_lineno, level
        f = f.f_back
        level += 1
    return None


def _short(v, n: int = 80) -> str:
    r = repr(v)
    return r if len(r) <= n else r[: n - 3] + "..."


def _ext(d) -> str:
    if type(d) is tuple:  # a leaf: (shape, dtype)
        return f"array {d[1]}{list(d[0])}"
    if type(d) is int:  # an array the program already reads as leaf d (graph.describe)
        return f"the array of leaf argument {d} again"
    if d == "position":
        return "an index position"
    return f"scalar {d}"


def describe(old, new) -> str:
    """What differs between two realization structure keys ``(steps, ext, outputs, slots)``."""
    so, eo, oo, _ = old
    sn, en, on, _ = new
    if len(so) != len(sn):
        return f"the graph has {len(sn)} nodes instead of {len(so)}"
    for i, (a, b) in enumerate(zip(so, sn)):
        if a[0] is not b[0]:
            return f"node {i} is {b[0].name} instead of {a[0].name}"
        if a[1] != b[1]:
            return (
                f"the static parameters of {a[0].name} (node {i}) changed: {_short(a[1])} -> "
                f"{_short(b[1])}"
            )
        if a[2] != b[2] or a[5] != b[5]:
            return f"the inputs of {a[0].name} (node {i}) are wired differently"
    if len(eo) != len(en):
        return f"the program reads {len(en)} inputs instead of {len(eo)}"
    for i, (a, b) in enumerate(zip(eo, en)):
        if a != b:
            return f"input {i} changed from {_ext(a)} to {_ext(b)}"
    if oo != on:
        return "a different set of live tensors is computed"
    return "the structure key changed"


def note(key) -> None:
    """Count a newly compiled structure at the user's current line; warn once past the limit.

    Structures are counted per line *and* sequence of primitives: the same code compiled again
    for other shapes, dtypes or static parameters. A line that reads many unrelated graphs (a
    logging helper, parametrized tests) compiles each once and is not what the warning is for."""
    limit = _config.get("recompile_warning")
    if not limit:
        return
    found = _user_site()
    if found is None:
        return
    site, level = found[:2], found[2]
    ops = tuple(step[0].name for step in key[0])
    rec = _sites.get((site, ops))
    if rec is None:
        _sites.put((site, ops), [1, key, False])
        return
    rec[0] += 1
    last, rec[1] = rec[1], key
    if rec[0] > limit and not rec[2] and _warned.get(site) is None:
        rec[2] = True
        _warned.put(site, True)
        warnings.warn(
            f"nablax: reads at {site[0]}:{site[1]} have compiled {rec[0]} different programs of "
            f"the same operations; the last one because {describe(last, key)}. Every new graph structure compiles "
            f"again: Python numbers (scalars, indices, slice starts, .at[] positions) are runtime "
            f"values, but shapes, dtypes and ops' static parameters are part of the program. "
            f"Fix: keep them fixed across iterations (pad to a fixed length, write into a "
            f"fixed-size buffer), or raise nx.config option recompile_warning (0 turns this "
            f"warning off).",
            RuntimeWarning,
            stacklevel=level,
        )

"""Host memory that stays with the process between steps (Linux with glibc).

A compiled training step (``nx.compile``, ``jax.jit``) allocates its activations and outputs on
every call and frees them at the end. glibc's ``malloc`` serves blocks above its *mmap threshold*
(128 KiB to 32 MiB, adapting) with fresh ``mmap`` calls and returns the top of its heap to the
kernel past its *trim threshold*, so every step maps new pages and faults them in again: on the
2-core benchmark machine the GPT step of ``bench/bench_gpt.py`` spent 13 ms of system time per
step (page faults) and ran 1.5-2x slower under ``nx.compile`` and ``jax.jit`` alike, while eager
nablax, whose programs are smaller, spent 2 ms.

When the option ``retain_host_memory`` is on (the default), nablax raises both thresholds once,
when it compiles its first program: blocks up to 256 MiB come from the heap and up to 1 GiB of
freed heap stays mapped for the next step (what PyTorch's and JAX's device allocators do for
device memory). The process's resident size then stays at its working set's peak instead of
returning memory between steps. Turning the option off puts glibc's default thresholds back at
the next compile. Elsewhere (no glibc, or ``mallopt`` unavailable) nothing happens. The option is
process-wide (``nx.config.update`` or ``NABLAX_RETAIN_HOST_MEMORY``; ``override`` refuses it).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading

from .. import _config

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
RETAINED = {M_MMAP_THRESHOLD: 256 << 20, M_TRIM_THRESHOLD: 1 << 30}
DEFAULTS = {M_MMAP_THRESHOLD: 128 << 10, M_TRIM_THRESHOLD: 128 << 10}

_lock = threading.Lock()
# "applied": None untouched, True retained, False defaults put back
_state: dict[str, bool | None] = {"applied": None}
_libc: list = []


def _mallopt():
    """glibc's ``mallopt``, or ``None`` where the C library is not glibc."""
    if not _libc:
        fn = None
        try:
            if (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc"):
                lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
                fn = lib.mallopt
                fn.argtypes = (ctypes.c_int, ctypes.c_int)
                fn.restype = ctypes.c_int
        except (AttributeError, OSError, ValueError):
            fn = None
        _libc.append(fn)
    return _libc[0]


def apply() -> bool:
    """Bring glibc's thresholds in line with the option ``retain_host_memory``; whether they
    changed. Called when nablax compiles a program."""
    want = bool(_config.get("retain_host_memory"))
    if _state["applied"] is want or (not want and _state["applied"] is None):
        return False
    with _lock:
        fn = _mallopt()
        if fn is None:
            _state["applied"] = want
            return False
        ok = all(fn(param, value) == 1 for param, value in (RETAINED if want else DEFAULTS).items())
        _state["applied"] = want
        return ok

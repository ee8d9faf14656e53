"""State-change cases for ``test_soundness.py``.

Each case is a ``make(env)`` function returning a :class:`Built`: the user's function ``fn(w,
*args)`` (a scalar of ``w``, shape ``(3,)``), the state changes to apply one after another, and
closed-form NumPy oracles (value, gradient, Hessian) that read the state *as it is now* (or as the
last run of ``fn`` recorded it, for draws and counters). Every ``fn`` first calls ``env.tick()``:
a pure no-op in the harness's first pass, a counter in its second, so one case definition checks
both stale results (of a body a purity guess would skip) and exact side-effect counts.
The cases themselves live in ``soundness_objects.py``, ``soundness_values.py`` and
``soundness_effects.py`` (one module per group of categories); importing them fills ``CASES``,
which maps each case's name to its :class:`Case`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

W_A = np.array([0.5, -1.25, 2.0])
W_B = np.array([1.5, 0.25, -0.75])


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def tick(self) -> None:
        self.n += 1


@dataclass
class Built:
    fn: Callable
    value: Callable[[np.ndarray], float]
    grad: Callable[[np.ndarray], np.ndarray]
    hess: Callable[[np.ndarray], np.ndarray]
    mutations: tuple
    args: Callable[[], tuple] = tuple
    raises: Callable[[], type | None] = lambda: None
    check: Callable[[], None] | None = None  # assertions on side effects after each call


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., Built]
    no_vmap: str | None = None  # why the case cannot run under vmap
    xfail: str | None = None  # a known bug (strict xfail)


def _no_op() -> None:
    pass


class Env:
    """What a case gets: ``monkeypatch``, finalizers that undo global state changes, ``tick`` (the
    first thing every body calls) and ``made`` (transformed calls the harness has made so far).

    With ``counted=False``, ``tick`` is a pure no-op, so the body stays free of side effects (a
    purity guess could skip it: the results must still be right). With ``counted=True`` it counts,
    and ``runs()`` says how often the body ran."""

    def __init__(self, monkeypatch, counted: bool) -> None:
        self.mp = monkeypatch
        self._undo: list = []
        self.made = 0
        self._runs = Counter()
        self.tick = self._runs.tick if counted else _no_op
        self.counted = counted

    def runs(self) -> int | None:
        return self._runs.n if self.counted else None

    def defer(self, fn, *args) -> None:
        self._undo.append((fn, args))

    def close(self) -> None:
        for fn, args in reversed(self._undo):
            fn(*args)


CASES: dict[str, Case] = {}


def case(no_vmap=None, xfail=None):
    def register(make):
        name = make.__name__.removeprefix("case_")
        CASES[name] = Case(name, make, no_vmap, xfail)
        return make

    return register


def quad(fn, mutations, a=lambda: 1.0, m=lambda: 0.0, b=lambda: 0.0, **kw) -> Built:
    """Oracles of ``sum(a * (w - m) ** 2 + b * w)`` with a, m, b read from the current state."""

    def arr(get):
        return np.asarray(get(), dtype=np.float64)

    def value(w):
        return float(np.sum(arr(a) * (w - arr(m)) ** 2 + arr(b) * w))

    def grad(w):
        return 2.0 * arr(a) * (w - arr(m)) + arr(b) + 0.0 * w

    def hess(w):
        return np.diag(2.0 * arr(a) * np.ones_like(w))

    return Built(fn, value, grad, hess, tuple(mutations), **kw)


def _aligned(n: int, offset_bytes: int = 0) -> np.ndarray:
    """A float32 array whose buffer starts ``offset_bytes`` past a 64-byte boundary."""
    buf = np.zeros(n + 32, np.float32)
    start = (-buf.ctypes.data % 64 + offset_bytes) // 4
    out = buf[start : start + n]
    assert out.ctypes.data % 64 == offset_bytes
    return out

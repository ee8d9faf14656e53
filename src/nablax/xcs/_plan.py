"""The record of one ``xcs.jit`` invocation: ``Plan`` (its call graph, ``f.last_plan()``),
``PlanNode`` (one call) and ``Stats`` (``f.stats()``). Made by ``engine.py``."""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass
class PlanNode:
    """One orchestration call of an invocation: times are seconds from the invocation's start.

    ``deps`` are the calls whose results it takes (data flow); ``after`` the calls it had to wait
    for by the sequential rule; ``effects`` whether it has external effects and ``schedule`` how it
    was started and why (``"early: read-only (...)"``, ``"waited: has effects (...)"``, ...)."""

    id: int
    name: str
    deps: tuple[int, ...]
    submitted: float
    start: float | None = None
    end: float | None = None
    error: str | None = None
    effects: bool = False
    after: tuple[int, ...] = ()
    schedule: str = ""
    observed: bool = dataclasses.field(default=False, repr=False)  # its failure reached the code

    def __post_init__(self) -> None:  # the engine's working state, not part of the record
        self._pristine: Any = None  # its result as it returned it, for the calls that take it
        self._consumers: list = []  # the calls that take its result
        self._shared = False  # its result could not be copied: a read waits for _consumers
        self._seen_at: int | None = None  # calls made when the program saw its failure

    @property
    def duration(self) -> float:
        return (self.end - self.start) if self.start is not None and self.end is not None else 0.0

    @property
    def early(self) -> bool:
        """True when it could start before the calls that precede it had finished."""
        return not self.effects and not self.after


@dataclasses.dataclass(frozen=True)
class Plan:
    """The executed call graph of one ``xcs.jit`` invocation (``f.last_plan()``): ``edges`` are
    the data-flow edges ``(from, to)``; each node's ``after`` / ``schedule`` say what else it
    waited for; ``wall_s`` is the invocation's own wall time."""

    nodes: tuple[PlanNode, ...]
    edges: tuple[tuple[int, int], ...]
    wall_s: float

    def __str__(self) -> str:
        lines = [f"xcs plan: {len(self.nodes)} call(s) in {self.wall_s * 1e3:.1f} ms"]
        for n in self.nodes:
            deps = f" after {list(n.deps)}" if n.deps else ""
            span = (
                f"{(n.start or 0) * 1e3:8.1f} -> {(n.end or 0) * 1e3:8.1f} ms"
                if n.start is not None
                else "      (not run)      "
            )
            err = f"  ERROR {n.error}" if n.error else ""
            lines.append(f"  #{n.id:<3} {span}  {n.name}{deps}  [{n.schedule}]{err}")
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Stats:
    """``f.stats()``: calls of the last invocation, their summed time, the wall time, the overlap
    (summed call time / wall time of the calls) and the time saved against running them one
    after another.

    Also a read-only mapping with the seed's keys (its ``f.stats()`` is a dict): ``"optimized"``
    (the calls overlapped enough to pay: overlap > 1.2, the seed's threshold on its speedup
    estimate), ``"status"`` (``"compiled"`` if so, else ``"fallback"``), ``"reason"``
    (``"no_parallelism"``, present only when not optimized) and the five fields by name.

    >>> s = Stats(calls=0, busy_s=0.0, wall_s=0.0, overlap=0.0, saved_s=0.0)
    >>> s["status"], s["optimized"], "reason" in s, s.get("hits", 0), s.calls
    ('fallback', False, True, 0, 0)
    """

    calls: int
    busy_s: float
    wall_s: float
    overlap: float
    saved_s: float

    def keys(self) -> tuple[str, ...]:
        names = tuple(f.name for f in dataclasses.fields(self))
        return ("status", "optimized", *names) + (() if self.overlap > 1.2 else ("reason",))

    def __getitem__(self, key: str) -> Any:
        if key not in self.keys():
            raise KeyError(
                f"xcs.jit(f).stats()[{key!r}]: no such key. Fix: one of {', '.join(self.keys())}"
            )
        seed = {"optimized": self.overlap > 1.2, "reason": "no_parallelism"}
        seed["status"] = "compiled" if seed["optimized"] else "fallback"
        return seed[key] if key in seed else getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self.keys() else default

    def items(self) -> list[tuple[str, Any]]:
        return [(k, self[k]) for k in self.keys()]

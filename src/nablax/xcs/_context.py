"""The per-thread state of ``nablax.xcs`` in one object, :data:`XCS` (as ``core/context.py``'s
``CTX`` is the tensor layer's), and the process-wide state that stays process-wide.

**Per thread** (read and set only through :data:`XCS`):

- ``XCS.engine``: the engine of the ``xcs.jit`` invocation running here, or None. ``jit.py`` sets
  it around an invocation (:meth:`Context.set_engine` / :meth:`Context.reset_engine`); the
  rewritten code's runtime (``engine.Runtime``) forwards calls to it and lazy values
  (``futures.py``) register with it. It is a ``contextvars`` variable, so it also follows
  asyncio tasks, and work that a waiting thread runs for others (``scheduler.py``, in an empty
  ``contextvars.Context``) never sees the invocation of the thread that runs it.
- ``XCS.grad_owner``: the name of the function ``xcs.grad`` is differentiating here, for the
  messages of ``hybrid.py`` (:meth:`Context.owning_grad`); a ``contextvars`` variable too.
- ``XCS.help_depth``: how many pieces of queued work this OS thread is running while it waits
  (``scheduler.py`` stops helping at ``scheduler.HELP_DEPTH``). It counts frames on this
  thread's stack, whatever context the work runs in, so it is a ``threading.local``.

**Process-wide, on purpose:**

- ``scheduler._pools``: the shared thread pools, one per ``max_workers`` value (threads are a
  process resource; every ``xcs.vmap``/``xcs.jit`` without an executor shares them);
- ``scheduler._queue`` and its condition ``scheduler._cond``: the one queue of in-process work,
  which any waiting thread may run; that is what keeps nested maps and jits from deadlocking;
- ``markers.EPOCH``: bumped by every marker, so classifications cached before it are re-checked;
- ``engine.SEQUENTIAL_RULE``: a switch for benchmarks (calls with effects start only after the
  earlier calls succeeded), True as shipped;
- ``engine.RUNTIME`` (stateless: it reads ``XCS.engine``) and ``transforms._HOST``, the runtime
  of hybrids rewritten for ``xcs.grad``, made once;
- the caches, each a registered, bounded ``nablax._caches.Cache`` whose name starts with
  ``xcs.`` (the classifier's answers, parsed sources, argument-snapshot rules, rewritten
  ``xcs.grad`` bodies): ``nx.cache_info()`` lists them and ``nx.clear_caches()`` empties them.

Nothing else in ``xcs`` is module-level mutable state (``tests/xcs/test_xcs_caches.py`` checks).

>>> XCS.engine is None, XCS.grad_owner, XCS.help_depth
(True, '?', 0)
>>> with XCS.owning_grad("loss"):
...     XCS.grad_owner
'loss'
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator
from typing import Any

_ENGINE: contextvars.ContextVar[Any] = contextvars.ContextVar("nablax_xcs_engine", default=None)
_GRAD_OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("xcs_grad_owner", default="?")
_THREAD = threading.local()


class Context:
    """This thread's (and task's) xcs state; see the module docstring. One instance: :data:`XCS`."""

    __slots__ = ()

    @property
    def engine(self) -> Any:
        """The engine of the ``xcs.jit`` invocation running here, or None."""
        return _ENGINE.get()

    def set_engine(self, engine: Any) -> contextvars.Token:
        """Make ``engine`` the running invocation's; give the token to :meth:`reset_engine`."""
        return _ENGINE.set(engine)

    def reset_engine(self, token: contextvars.Token) -> None:
        _ENGINE.reset(token)

    @property
    def grad_owner(self) -> str:
        """The function ``xcs.grad`` is differentiating here (``"?"`` outside one)."""
        return _GRAD_OWNER.get()

    @contextlib.contextmanager
    def owning_grad(self, name: str) -> Iterator[None]:
        """Name the function ``xcs.grad`` differentiates while the block runs."""
        token = _GRAD_OWNER.set(name)
        try:
            yield
        finally:
            _GRAD_OWNER.reset(token)

    @property
    def help_depth(self) -> int:
        """How many pieces of queued work this thread is running while it waits."""
        return getattr(_THREAD, "help_depth", 0)

    @help_depth.setter
    def help_depth(self, depth: int) -> None:
        _THREAD.help_depth = depth


XCS = Context()

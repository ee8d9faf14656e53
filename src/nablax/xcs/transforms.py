"""``xcs.jit``, ``xcs.vmap``, ``xcs.pmap`` and ``xcs.grad``: each routes a function by its
classification and its actual arguments to the engine that suits it.

- tensor code on tensor values goes to nablax (``nx.vmap`` / ``nx.grad``) or JAX (``jax.vmap`` /
  ``jax.grad`` / ``jax.pmap``) when it is JAX-traceable;
- everything else runs concurrently: ``vmap`` maps items over a thread pool sized for I/O, ``jit``
  runs the function with its orchestration calls as futures (``engine.py``).

>>> from nablax import xcs
>>> @xcs.mark_orchestration
... def shout(s):
...     return s.upper()
>>> xcs.vmap(shout)(["a", "b", "c"])
['A', 'B', 'C']
>>> xcs.vmap(lambda prefix, s: prefix + s, in_axes=(None, 0))("> ", ["x", "y"])
['> x', '> y']
"""

from __future__ import annotations

import concurrent.futures as cf
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import XCSError
from . import engine as _engine
from .analysis import classify
from .futures import resolve
from .rewrite import rewrite
from .runtime import has_tensor_values, tensor_kind

DEFAULT_WORKERS = 64  # I/O-bound calls: concurrency is about latency hiding, not CPU count

_pool: cf.ThreadPoolExecutor | None = None
_pools: dict[int, cf.ThreadPoolExecutor] = {}
_pool_lock = threading.Lock()


def _executor(executor: cf.Executor | None, max_workers: int | None) -> cf.Executor:
    """The given executor, else a shared thread pool (one per ``max_workers`` value)."""
    global _pool
    if executor is not None:
        if not isinstance(executor, cf.Executor):
            raise TypeError(
                f"xcs: executor must be a concurrent.futures.Executor, got "
                f"{type(executor).__name__}"
            )
        return executor
    n = DEFAULT_WORKERS if max_workers is None else int(max_workers)
    if n < 1:
        raise ValueError(f"xcs: max_workers must be at least 1, got {max_workers}")
    with _pool_lock:
        pool = _pools.get(n)
        if pool is None:
            pool = _pools[n] = cf.ThreadPoolExecutor(n, thread_name_prefix=f"xcs-{n}")
    return pool


# ---- jit -----------------------------------------------------------------------------------------


class JitFunction:
    """A function run by ``xcs.jit`` (see :func:`jit`)."""

    __xcs_jit__ = True

    def __init__(self, fn: Callable, executor: cf.Executor | None, max_workers: int | None):
        functools.update_wrapper(self, fn)
        self._fn = fn
        self._body = rewrite(fn, _engine.RUNTIME)
        self._executor, self._max_workers = executor, max_workers
        self._last: _engine.Engine | None = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _engine.current() is not None:  # called inside another invocation: join its engine
            return self._body(*args, **kwargs)
        eng = _engine.Engine(_executor(self._executor, self._max_workers), classify)
        token = _engine._current.set(eng)
        try:
            out = resolve(self._body(*args, **kwargs))
            eng.drain()
            return out
        except BaseException:
            eng.drain(raise_errors=False)
            raise
        finally:
            _engine._current.reset(token)
            self._last = eng

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        return self if obj is None else functools.partial(self, obj)

    def last_plan(self) -> _engine.Plan:
        """The call graph of the last invocation: nodes (name, deps, start/end) and edges."""
        if self._last is None:
            raise XCSError(f"xcs.jit: {self.__qualname__} has not been called yet")
        return self._last.plan()

    def stats(self) -> _engine.Stats:
        """Calls, summed call time, wall time, overlap and time saved of the last invocation."""
        if self._last is None:
            raise XCSError(f"xcs.jit: {self.__qualname__} has not been called yet")
        return self._last.stats()


def jit(
    fn: Callable | None = None,
    executor: cf.Executor | None = None,
    max_workers: int | None = None,
):
    """Run ``fn`` with its orchestration calls concurrent by data flow.

    Each call ``fn`` makes to an orchestration function (an LLM, HTTP, file or database call, as
    :func:`classify` decides) is submitted at once and returns a pending value; a call that
    receives pending values (in its arguments, lists, dicts, or strings built with ``+`` or
    f-strings) starts when they are ready, and anything else that needs a value (an ``if``, a
    method, tensor code) waits for it. Every call runs exactly once per invocation, dependent calls
    in order, and the result equals plain sequential Python; orchestration functions get and
    return real values. Calls that do not depend on each other's results may run in any order, so
    side effects that must be ordered (write, then read) belong in one function or in a data
    dependency. ``f.last_plan()`` and ``f.stats()`` describe the last invocation.

    >>> import time
    >>> from nablax import xcs
    >>> @xcs.mark_orchestration
    ... def ask(q):
    ...     time.sleep(0.05)
    ...     return q.upper()
    >>> @xcs.jit
    ... def two(a, b):
    ...     x, y = ask(a), ask(b)          # independent: overlap
    ...     return ask(x + " & " + y)      # waits for both
    >>> two("p", "q")
    'P & Q'
    >>> two.stats().calls, two.last_plan().edges
    (3, ((0, 2), (1, 2)))
    """
    if fn is None:
        return lambda f: jit(f, executor=executor, max_workers=max_workers)
    return JitFunction(fn, executor, max_workers)


# ---- vmap / pmap -----------------------------------------------------------------------------------


def _axes(in_axes: Any, n: int, name: str) -> tuple:
    if in_axes is None or isinstance(in_axes, int):
        return (in_axes,) * n
    if isinstance(in_axes, (tuple, list)) and len(in_axes) == n:
        for a in in_axes:
            if a is not None and not isinstance(a, int):
                raise TypeError(f"xcs.{name}: in_axes entries must be int or None, got {a!r}")
        return tuple(in_axes)
    raise ValueError(
        f"xcs.{name}: in_axes must be an int, None, or a tuple with one entry per positional "
        f"argument ({n}), got {in_axes!r}"
    )


def _is_mapped(value: Any, axis: int | None) -> bool:
    return axis is not None and not isinstance(value, (str, bytes))


def _length(value: Any, axis: int, path: str, name: str) -> int:
    if isinstance(value, dict):
        lengths = {_length(v, axis, f"{path}[{k!r}]", name) for k, v in value.items()}
        if len(lengths) > 1:
            raise ValueError(f"xcs.{name}: the values of {path} have different lengths {lengths}")
        return lengths.pop() if lengths else 0
    shape = getattr(value, "shape", None)
    if shape is not None:
        if len(shape) <= axis:
            raise ValueError(
                f"xcs.{name}: {path} has shape {tuple(shape)}, no axis {axis} to map over. "
                f"Fix: in_axes=None to broadcast it"
            )
        return int(shape[axis])
    try:
        return len(value)
    except TypeError:
        raise TypeError(
            f"xcs.{name}: {path} is a {type(value).__name__}, which has no items to map over. "
            f"Fix: pass a list, or in_axes=None to give every item the same value"
        ) from None


def _item(value: Any, axis: int, i: int) -> Any:
    if isinstance(value, dict):
        return {k: _item(v, axis, i) for k, v in value.items()}
    if getattr(value, "shape", None) is not None:
        idx = (slice(None),) * axis + (i,)
        return value[idx]
    return value[i]


def _items(args: tuple, axes: tuple, name: str) -> tuple[int, list[tuple]]:
    mapped = [(k, a) for k, a in enumerate(args) if _is_mapped(a, axes[k])]
    if not mapped:
        raise ValueError(
            f"xcs.{name}: no argument is mapped (every in_axes entry is None or the argument is a "
            f"str). Fix: give the batched argument an axis, e.g. in_axes=0"
        )
    sizes = {k: _length(args[k], axes[k], f"args[{k}]", name) for k, _ in mapped}
    if len(set(sizes.values())) > 1:
        raise ValueError(
            f"xcs.{name}: mapped arguments have different lengths {sizes} (argument index: "
            f"length). Fix: equal lengths, or in_axes=None for broadcast arguments"
        )
    n = next(iter(sizes.values()))
    items = []
    for i in range(n):
        items.append(tuple(_item(a, axes[k], i) if k in sizes else a for k, a in enumerate(args)))
    return n, items


def _run_items(fn, items, kwargs, executor, return_exceptions: bool, name: str) -> list:
    """Run ``fn(*item, **kwargs)`` for every item concurrently; results in input order.

    The calling thread helps: it runs, in order, every item the pool has not started yet (a
    future it can still cancel), so a nested map whose pool is busy with its parents still
    progresses, and never deadlocks."""
    futures = [executor.submit(fn, *it, **kwargs) for it in items]
    results: list = [None] * len(items)
    try:
        for i, f in enumerate(futures):
            if f.cancel():
                try:
                    results[i] = fn(*items[i], **kwargs)
                except Exception as e:  # noqa: BLE001 - reported below, with the index
                    results[i] = _failed(e, i, name, return_exceptions, futures)
                continue
            try:
                results[i] = f.result()
            except Exception as e:  # noqa: BLE001
                results[i] = _failed(e, i, name, return_exceptions, futures)
    except BaseException:
        for f in futures:
            f.cancel()
        raise
    return results


def _failed(e: Exception, i: int, name: str, return_exceptions: bool, futures) -> Exception:
    if return_exceptions:
        return e
    for f in futures:
        f.cancel()
    e.add_note(f"xcs.{name}: raised by item {i} (the items not yet started were cancelled)")
    e.xcs_index = i  # type: ignore[attr-defined]
    raise e


def _stack(results: list, out_axes: Any) -> Any:
    """Tensor results are stacked along ``out_axes`` (as vmap does); anything else is a list."""
    if results and all(isinstance(r, np.ndarray) for r in results):
        return np.stack(results, axis=out_axes or 0)
    return results


def _map(fn, in_axes, out_axes, max_workers, executor, return_exceptions, name, tensor_map):
    if not callable(fn):
        raise TypeError(f"xcs.{name}: expected a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        axes = _axes(in_axes, len(args), name)
        route = tensor_map(fn, args, kwargs, axes)
        if route is not None:
            return route(*args, **kwargs)
        n, items = _items(args, axes, name)
        if n == 0:
            return []
        ex = _executor(executor, max_workers)
        results = _run_items(fn, items, kwargs, ex, return_exceptions, name)
        return _stack(results, out_axes) if tensor_kind(args) == "numpy" else results

    return mapped


def _tensor_vmap(in_axes, out_axes):
    def route(fn, args, kwargs, axes):
        if not has_tensor_values(args, kwargs) or any(
            isinstance(a, (str, bytes)) and ax is not None for a, ax in zip(args, axes)
        ):
            return None
        c = classify(fn)
        if c.kind != "tensor":
            return None
        kind = tensor_kind(args, kwargs)
        if kind == "nablax":
            import nablax as nx

            return nx.vmap(fn, in_axes=axes, out_axes=out_axes)
        if kind == "jax" and c.jax_traceable:
            import jax

            return jax.vmap(fn, in_axes=axes, out_axes=out_axes)
        return None  # NumPy (or untraceable) tensor code: per item

    return route


def vmap(
    fn: Callable,
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: int = 0,
    max_workers: int | None = None,
    executor: cf.Executor | None = None,
    return_exceptions: bool = False,
) -> Callable:
    """Map ``fn`` over a batch of inputs.

    Tensor functions on tensor values go to ``nx.vmap`` (nablax Tensors) or ``jax.vmap`` (JAX
    arrays, JAX-traceable code). Everything else runs the items concurrently on a thread pool
    sized for I/O (``max_workers``, default 64, or any ``concurrent.futures.Executor``): results in
    input order (a list; NumPy results are stacked), ``in_axes=None`` broadcasts an argument, a
    bare ``str``/``bytes`` is never split (it is broadcast), an empty batch gives ``[]``, nested
    maps never deadlock, and the first error is raised with its item index (items not started are
    cancelled) unless ``return_exceptions=True``, which puts exceptions in the results.
    """
    return _map(
        fn, in_axes, out_axes, max_workers, executor, return_exceptions, "vmap",
        _tensor_vmap(in_axes, out_axes),
    )  # fmt: skip


def _tensor_pmap(in_axes, out_axes):
    vmap_route = _tensor_vmap(in_axes, out_axes)

    def route(fn, args, kwargs, axes):
        inner = vmap_route(fn, args, kwargs, axes)
        if inner is None or tensor_kind(args, kwargs) != "jax":
            return inner
        import jax

        n = {_length(a, ax, "", "pmap") for a, ax in zip(args, axes) if _is_mapped(a, ax)}
        if n == {jax.local_device_count()}:
            return jax.pmap(fn, in_axes=axes, out_axes=out_axes)
        return inner  # batch size != device count: vectorized on one device

    return route


def pmap(
    fn: Callable,
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: int = 0,
    max_workers: int | None = None,
    executor: cf.Executor | None = None,
    return_exceptions: bool = False,
) -> Callable:
    """As :func:`vmap`; tensor code on JAX arrays whose batch equals the local device count runs
    across devices with ``jax.pmap`` (other batch sizes are vectorized with ``jax.vmap``).

    >>> import jax, jax.numpy as jnp
    >>> from nablax import xcs
    >>> n = jax.local_device_count()
    >>> xcs.pmap(lambda x: jnp.sum(x * x))(jnp.ones((n, 3))).tolist() == [3.0] * n
    True
    """
    return _map(
        fn, in_axes, out_axes, max_workers, executor, return_exceptions, "pmap",
        _tensor_pmap(in_axes, out_axes),
    )  # fmt: skip


# ---- grad ------------------------------------------------------------------------------------------


def grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Gradient of ``fn`` by its kind: orchestration only → ``XCSError`` before anything runs;
    tensor → ``nx.grad`` (nablax Tensors) or ``jax.grad`` (JAX arrays); hybrid → ``nx.grad``,
    which differentiates the tensor parts and gives zero gradient through values that came from
    orchestration calls (they are constants to it).

    >>> import jax.numpy as jnp
    >>> from nablax import xcs
    >>> float(xcs.grad(lambda x: jnp.sum(x ** 2))(jnp.array([1.0, 2.0]))[1])
    4.0
    """
    c = classify(fn)
    name = getattr(fn, "__qualname__", repr(fn))
    if c.kind == "orchestration":
        raise XCSError(
            f"xcs.grad: {name} is orchestration code ({'; '.join(c.reasons)}); it has no "
            f"gradient. Fix: differentiate the tensor function it calls, or mark it with "
            f"@xcs.mark_hybrid if it really computes with tensors"
        )
    import nablax as nx

    nx_grad = nx.grad(fn, argnums=argnums, has_aux=has_aux)

    @functools.wraps(fn)
    def g(*args: Any, **kwargs: Any) -> Any:
        kind = tensor_kind(args, kwargs)
        if c.kind == "tensor" and c.jax_traceable and kind == "jax":
            import jax

            return jax.grad(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
        if kind in ("jax", "numpy"):
            return _via_nablax(nx_grad, args, kwargs)
        return nx_grad(*args, **kwargs)

    return g


def _via_nablax(nx_grad: Callable, args: tuple, kwargs: dict) -> Any:
    """Run a nablax gradient on array arguments; return JAX arrays."""
    import jax

    import nablax as nx

    from .runtime import is_tensor_value

    def to_nx(x):
        return nx.asarray(x) if is_tensor_value(x) else x

    def to_jax(x):
        return x.numpy() if isinstance(x, nx.Tensor) else x

    a, k = jax.tree_util.tree_map(to_nx, (args, kwargs), is_leaf=is_tensor_value)
    out = nx_grad(*a, **k)
    return jax.tree_util.tree_map(
        lambda x: jax.numpy.asarray(to_jax(x)), out, is_leaf=lambda x: isinstance(x, nx.Tensor)
    )

"""``xcs.vmap``, ``xcs.pmap`` and ``xcs.grad`` (``xcs.jit`` is in ``jit.py``): each routes a function by its
classification and its actual arguments to the engine that suits it.

- tensor code on tensor values goes to nablax (``nx.vmap`` / ``nx.grad``) or JAX (``jax.vmap`` /
  ``jax.grad`` / ``jax.pmap``), whichever library its source uses;
- everything else runs item by item: ``vmap`` maps items over a thread pool sized for I/O
  (``scheduler.py``) and stacks array results as ``jax.vmap`` would (``stacking.stack_results``).

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

import asyncio
import concurrent.futures as cf
import functools
import inspect
import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

from ..errors import XCSError
from .classify.analysis import analyze_operations, classify
from .hybrid import HostCalls, grad_owner
from .runtime import is_tensor_value, is_tracer, tensor_kind, tensor_leaves, thread_bound
from .scheduler import executor_for, run_items
from .stacking import stack_results


class _BatchSizeError(XCSError, ValueError):
    """Batch sizes that disagree: a ``ValueError`` (as ``jax.vmap`` raises) and an ``XCSError``."""


# ---- vmap / pmap -----------------------------------------------------------------------------------


def _axes(in_axes: Any, n: int, name: str) -> tuple:
    """One axis (int or None) per positional argument; a shorter tuple is padded with None."""
    if in_axes is None or isinstance(in_axes, int):
        return (in_axes,) * n
    if isinstance(in_axes, (tuple, list)) and len(in_axes) <= n:
        for a in in_axes:
            if a is not None and not isinstance(a, int):
                raise TypeError(f"xcs.{name}: in_axes entries must be int or None, got {a!r}")
        return tuple(in_axes) + (None,) * (n - len(in_axes))
    raise ValueError(
        f"xcs.{name}: in_axes must be an int, None, or a tuple with at most one entry per "
        f"positional argument ({n}; missing entries are None), got {in_axes!r}"
    )


def _is_mapped(value: Any, axis: int | None) -> bool:
    return axis is not None and not isinstance(value, (str, bytes))


def _length(value: Any, axis: int, path: str, name: str) -> int:
    if isinstance(value, dict):
        lengths = {_length(v, axis, f"{path}[{k!r}]", name) for k, v in value.items()}
        if len(lengths) > 1:
            raise _BatchSizeError(
                f"xcs.{name}: the values of {path} have different lengths {lengths}"
            )
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


def _batch(args: tuple, axes: tuple, axis_size: int | None, name: str) -> tuple[int, tuple]:
    """The batch size and the indices of the mapped arguments."""
    sizes = {
        k: _length(a, axes[k], f"args[{k}]", name)
        for k, a in enumerate(args)
        if _is_mapped(a, axes[k])
    }
    if len(set(sizes.values())) > 1:
        raise _BatchSizeError(
            f"xcs.{name}: mapped arguments have different lengths {sizes} (argument index: "
            f"length). Fix: equal lengths, or in_axes=None for broadcast arguments"
        )
    if not sizes:
        if axis_size is None:
            raise _BatchSizeError(
                f"xcs.{name}: no argument is mapped (every in_axes entry is None or the argument "
                f"is a str). Fix: give the batched argument an axis, e.g. in_axes=0, or pass "
                f"axis_size=n to call the function n times"
            )
        return axis_size, ()
    n = next(iter(sizes.values()))
    if axis_size is not None and axis_size != n:
        raise _BatchSizeError(
            f"xcs.{name}: axis_size={axis_size}, but the mapped arguments have {n} items "
            f"({sizes}, argument index: length). Fix: drop axis_size, or pass {axis_size} items"
        )
    return n, tuple(sizes)


def _run_here(fn, items, kwargs, return_exceptions: bool, name: str) -> list:
    """Items in order on this thread: traced values (JAX tracers, nablax Tensors a nablax
    transform is recording) belong to the thread that traces them."""
    results: list = []
    for i, item in enumerate(items):
        try:
            results.append(fn(*item, **kwargs))
        except Exception as e:
            if return_exceptions:
                results.append(e)
                continue
            e.add_note(f"xcs.{name}: raised by item {i} (the items after it did not run)")
            e.xcs_index = i  # type: ignore[attr-defined]
            raise
    return results


def _tensor_route(fn, args, kwargs, axes, n, out_axes, axis_name, axis_size, name):
    """``nx.vmap`` / ``jax.vmap`` / ``jax.pmap`` of ``fn`` when it is tensor code on tensor
    values, else None (the items run one by one)."""
    if any(isinstance(a, (str, bytes)) and ax is not None for a, ax in zip(args, axes)):
        return None
    kind = tensor_kind(args, kwargs)
    if kind not in ("nablax", "jax"):
        return None  # no tensors, or NumPy ones (host code runs per item)
    c = classify(fn)
    if kind == "nablax":
        if c.kind != "tensor":
            return None
        if axis_name is not None:
            raise XCSError(
                f"xcs.{name}: axis_name={axis_name!r} names an axis for JAX collectives "
                f"(jax.lax.psum ...), but the arguments are nablax Tensors and nx.vmap has no "
                f"collectives. Fix: drop axis_name, or pass jax arrays (t.to_jax()) to JAX code"
            )
        import nablax as nx

        return nx.vmap(fn, in_axes=axes, out_axes=out_axes, axis_size=axis_size)
    traced = thread_bound(args, kwargs)
    # pure Python on concrete arrays runs per item (any Python works there); on tracers it must
    # be vectorized, since tracers cannot be split into items run elsewhere
    if not ((c.kind == "tensor" and c.jax_traceable) or (c.kind == "pure" and traced)):
        return None
    import jax

    if name == "pmap" and not traced and n == jax.local_device_count():
        return jax.pmap(fn, axis_name=axis_name, in_axes=axes, out_axes=out_axes)
    return jax.vmap(fn, in_axes=axes, out_axes=out_axes, axis_name=axis_name, axis_size=axis_size)


def _pool_size(executor: cf.Executor) -> int | None:
    """How many items may run at once on ``executor``: a thread pool's size (a waiting thread
    that helps run items counts against it too), else no limit of ours."""
    return (
        getattr(executor, "_max_workers", None)
        if isinstance(executor, cf.ThreadPoolExecutor)
        else None
    )


def _awaiting(fn: Callable, name: str) -> Callable:
    """``fn``, or for an ``async def`` function (or one that returns a coroutine) a function that
    runs the coroutine to its end on the thread that runs the item, and returns its value."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        out = fn(*args, **kwargs)
        return _await(out) if inspect.iscoroutine(out) else out

    return run


def _await(coro: Any) -> Any:
    """The value of ``coro``, run in a new event loop (in a new thread when this one has a running
    loop: an item a waiting thread runs while an ``async`` caller waits)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: list = []

    def run() -> None:
        try:
            box.append((True, asyncio.run(coro)))
        except BaseException as e:  # noqa: BLE001 - re-raised in the item's thread
            box.append((False, e))

    t = threading.Thread(target=run, name="xcs-await")
    t.start()
    t.join()
    ok, value = box[0]
    if not ok:
        raise value
    return value


def _map(
    fn, in_axes, out_axes, max_workers, executor, return_exceptions, axis_name, axis_size, name
):
    if not callable(fn):
        raise TypeError(f"xcs.{name}: expected a function, got {type(fn).__name__}")
    if axis_size is not None and (not isinstance(axis_size, int) or axis_size < 0):
        raise ValueError(f"xcs.{name}: axis_size must be an int >= 0, got {axis_size!r}")

    call = _awaiting(fn, name)

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        axes = _axes(in_axes, len(args), name)
        n, mapped_args = _batch(args, axes, axis_size, name)
        route = _tensor_route(fn, args, kwargs, axes, n, out_axes, axis_name, axis_size, name)
        if route is not None:
            return route(*args, **kwargs)
        if n == 0:
            return []
        items = [
            tuple(_item(a, axes[k], i) if k in mapped_args else a for k, a in enumerate(args))
            for i in range(n)
        ]
        if thread_bound(args, kwargs):
            results = _run_here(call, items, kwargs, return_exceptions, name)
        else:
            ex = executor_for(executor, max_workers)
            limit = max_workers if max_workers is not None else _pool_size(ex)
            results = run_items(call, items, kwargs, ex, return_exceptions, name, limit)
        if return_exceptions and any(isinstance(r, BaseException) for r in results):
            return results  # exceptions are not stacked: one entry per item, in order
        return stack_results(results, out_axes, name)

    return mapped


def vmap(
    fn: Callable,
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: Any = 0,
    max_workers: int | None = None,
    executor: cf.Executor | None = None,
    return_exceptions: bool = False,
    *,
    axis_name: str | None = None,
    axis_size: int | None = None,
) -> Callable:
    """Map ``fn`` over a batch of inputs.

    Tensor functions on tensor values go to ``nx.vmap`` (nablax Tensors) or ``jax.vmap`` (JAX
    arrays, JAX-traceable code; ``axis_name`` enables collectives such as ``jax.lax.psum``).
    Everything else runs the items concurrently on a thread pool sized for I/O (``max_workers``,
    default 64, or any ``concurrent.futures.Executor``), or in order on this thread when the
    arguments are being traced (never more than ``max_workers``, or the given thread pool's size,
    at once; an ``async def`` function is awaited, each item on its own event loop): results in
    input order, ``in_axes=None`` broadcasts an argument
    (a shorter ``in_axes`` tuple is padded with None), a bare ``str``/``bytes`` is never split (it
    is broadcast), ``axis_size=n`` calls ``fn`` n times when no argument is mapped, an empty batch
    gives ``[]``, nested maps never deadlock, and the first error is raised with its item index
    (items not started are cancelled) unless ``return_exceptions=True``, which puts exceptions in
    the results.

    Results are put together as ``jax.vmap`` would: array results (NumPy, JAX, nablax) are stacked
    along ``out_axes``, leaf by leaf through tuples and dicts, with non-array leaves in the same
    position collected in a list. Results without arrays: tuples come back position by position
    and dicts of numbers key by key (as the seed does); anything else stays a list in input
    order. ``out_axes=None``: every
    item must give the same result, returned once (else :class:`XCSError`).

    >>> import numpy as np
    >>> from nablax import xcs
    >>> def describe(x):
    ...     return x * 2, f"sum={x.sum():g}"
    >>> doubled, notes = xcs.vmap(describe)(np.arange(4.0).reshape(2, 2))
    >>> doubled.tolist(), notes
    ([[0.0, 2.0], [4.0, 6.0]], ['sum=1', 'sum=5'])
    """
    return _map(
        fn, in_axes, out_axes, max_workers, executor, return_exceptions, axis_name, axis_size,
        "vmap",
    )  # fmt: skip


def pmap(
    fn: Callable,
    in_axes: int | None | Sequence[int | None] = 0,
    out_axes: Any = 0,
    max_workers: int | None = None,
    executor: cf.Executor | None = None,
    return_exceptions: bool = False,
    *,
    axis_name: str | None = None,
    axis_size: int | None = None,
) -> Callable:
    """As :func:`vmap`; tensor code on JAX arrays whose batch equals the local device count runs
    across devices with ``jax.pmap`` (other batch sizes are vectorized with ``jax.vmap``; both
    get ``axis_name``, so collectives such as ``jax.lax.psum`` work either way).

    >>> import jax, jax.numpy as jnp
    >>> from nablax import xcs
    >>> n = jax.local_device_count()
    >>> xcs.pmap(lambda x: jnp.sum(x * x))(jnp.ones((n, 3))).tolist() == [3.0] * n
    True
    >>> total = xcs.pmap(lambda x: jax.lax.psum(x, "i"), axis_name="i")(jnp.arange(float(n)))
    >>> total.tolist() == [n * (n - 1) / 2] * n
    True
    """
    return _map(
        fn, in_axes, out_axes, max_workers, executor, return_exceptions, axis_name, axis_size,
        "pmap",
    )  # fmt: skip


# ---- grad ------------------------------------------------------------------------------------------

_LIBRARY_LABEL = re.compile(r"\((JAX|nablax|NumPy|PyTorch)\)")
_PREFIXES = {"jax": ("jnp.", "jax."), "nablax": ("nx.", "nablax.")}
_HOST: list[HostCalls] = []


def _host_calls() -> HostCalls:
    if not _HOST:
        from .rewrite import rewrite

        _HOST.append(HostCalls(rewrite, classify))
    return _HOST[0]


def _libraries(fn: Any, reasons: tuple[str, ...]) -> dict[str, str]:
    """The tensor libraries ``fn``'s source uses: {"jax"|"nablax"|"numpy"|"torch": evidence}."""
    found: dict[str, str] = {}
    labels = {"JAX": "jax", "nablax": "nablax", "NumPy": "numpy", "PyTorch": "torch"}
    for r in reasons:
        for m in _LIBRARY_LABEL.finditer(r):
            found.setdefault(labels[m.group(1)], r)
    try:
        ops = analyze_operations(fn).tensor_ops
    except Exception:  # noqa: BLE001 - the reasons are enough
        ops = frozenset()
    for op in sorted(ops):
        for lib, prefixes in _PREFIXES.items():
            if op.startswith(prefixes):
                found.setdefault(lib, f"calls {op}")
    return found


def _engine(fn: Any, c: Any, args: tuple, kwargs: dict) -> tuple[str, str]:
    """``("jax" | "nablax", why)``: the library the source computes with, else the arguments'."""
    libs = _libraries(fn, c.reasons)
    kind = tensor_kind(args, kwargs)
    if "jax" in libs and "nablax" not in libs:
        return "jax", f"its source uses JAX ({libs['jax']})"
    if "nablax" in libs and "jax" not in libs:
        return "nablax", f"its source uses nablax ({libs['nablax']})"
    host = {"numpy", "torch"} & libs.keys()
    if host and c.kind == "tensor" and not c.jax_traceable and not libs.keys() & {"jax", "nablax"}:
        lib = sorted(host)[0]
        raise XCSError(
            f"xcs.grad: {_name(fn)} computes with {lib} ({libs[lib]}), host code that neither "
            f"jax.grad nor nx.grad can differentiate. Fix: write it with jax.numpy or nablax ops"
        )
    both = libs.keys() >= {"jax", "nablax"}
    source = "uses both JAX and nablax" if both else "names no JAX or nablax operation"
    if kind == "nablax":
        return "nablax", f"its source {source} and its arguments are nablax Tensors"
    if kind == "numpy" and "jax" not in libs:
        return "nablax", f"its source {source} and its arguments are NumPy arrays"
    return "jax", f"its source {source} and its arguments are JAX arrays or Python numbers"


def _name(fn: Any) -> str:
    return getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)


def _leaf_path(args: tuple, kwargs: dict, test: Callable[[Any], bool]) -> str | None:
    """``args[i]`` / ``kwargs['k']`` of the first argument holding a value ``test`` accepts."""
    named = [(f"args[{i}]", a) for i, a in enumerate(args)]
    named += [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    for path, value in named:
        if any(test(x) for x in tensor_leaves(value, stop=test)):
            return path
    return None


def _jax_grad(fn, c, why: str, argnums, has_aux: bool, args: tuple, kwargs: dict) -> Any:
    import jax

    import nablax as nx
    from nablax.core.tensor import Tensor

    from .runtime import nablax_tracing

    had_nx = tensor_kind(args, kwargs) == "nablax"
    if had_nx and nablax_tracing():
        path = _leaf_path(args, kwargs, lambda v: isinstance(v, Tensor))
        raise XCSError(
            f"xcs.grad: chose jax.grad for {_name(fn)} because {why}, but {path} is a nablax "
            f"Tensor that an enclosing nablax transform (nx.grad, nx.vmap, ...) is recording; "
            f"JAX code would cut it out of that transform. Fix: apply xcs.grad outside the nablax "
            f"transform, or write {_name(fn)} with nablax ops so xcs.grad uses nx.grad"
        )
    a, k = jax.tree_util.tree_map(
        lambda x: x.to_jax() if isinstance(x, Tensor) else x,
        (args, kwargs),
        is_leaf=lambda x: isinstance(x, Tensor),
    )
    body = fn
    if c.kind == "hybrid":
        body = _host_calls().body(fn)
    with grad_owner(_name(fn)):
        try:
            out = jax.grad(body, argnums=argnums, has_aux=has_aux)(*a, **k)
        except Exception as e:
            if not isinstance(e, XCSError):
                e.add_note(f"xcs.grad: differentiated {_name(fn)} with jax.grad because {why}")
            raise
    if not had_nx:
        return out
    grads = out[0] if has_aux else out
    grads = jax.tree_util.tree_map(
        lambda x: nx.asarray(x) if isinstance(x, jax.Array) else x, grads
    )
    return (grads, out[1]) if has_aux else grads


def _nablax_grad(fn, why: str, argnums, has_aux: bool, args: tuple, kwargs: dict) -> Any:
    import jax
    import numpy as np

    import nablax as nx

    path = _leaf_path(args, kwargs, is_tracer)
    if path is not None:
        raise XCSError(
            f"xcs.grad: chose nx.grad for {_name(fn)} because {why}, but {path} is a JAX tracer "
            f"(an enclosing jax.jit, jax.grad or jax.vmap is tracing it), and nablax cannot "
            f"differentiate inside a JAX trace. Fix: apply xcs.grad outside the JAX transform, or "
            f"write {_name(fn)} with jax.numpy so xcs.grad uses jax.grad"
        )
    kind = tensor_kind(args, kwargs)
    if kind in ("jax", "numpy"):
        args, kwargs = jax.tree_util.tree_map(
            lambda x: nx.asarray(x) if is_tensor_value(x) else x,
            (args, kwargs),
            is_leaf=is_tensor_value,
        )
    try:
        out = nx.grad(fn, argnums=argnums, has_aux=has_aux)(*args, **kwargs)
    except Exception as e:
        if not isinstance(e, XCSError):
            e.add_note(f"xcs.grad: differentiated {_name(fn)} with nx.grad because {why}")
        raise
    if kind not in ("jax", "numpy"):
        return out
    back = jax.numpy.asarray if kind == "jax" else np.asarray
    return jax.tree_util.tree_map(
        lambda x: back(x.numpy()) if isinstance(x, nx.Tensor) else x,
        out,
        is_leaf=lambda x: isinstance(x, nx.Tensor),
    )


def grad(fn: Callable, argnums: int | Sequence[int] = 0, has_aux: bool = False) -> Callable:
    """Gradient of ``fn``, by its kind and the library its tensor code uses.

    Each call classifies ``fn`` (cached) before running anything:

    - orchestration only → :class:`XCSError`, and nothing runs;
    - JAX code (its source calls ``jnp``/``jax``) → ``jax.grad``; nablax code → ``nx.grad``;
      neither or both → the arguments decide (nablax Tensors → ``nx.grad``, JAX arrays or Python
      numbers → ``jax.grad``). Concrete arrays of the other library are converted (the gradients
      come back in the arguments' type); a value traced by the other library's transform raises
      :class:`XCSError` naming the chosen engine and why;
    - hybrid → the same engines, and values that came from orchestration calls are constants
      (zero gradient). With ``nx.grad`` tensors are eager, so orchestration calls see real values.
      With ``jax.grad`` the function is rewritten from its source so that each orchestration call,
      f-string, ``str``/``float``/``print`` and ``.item()`` receives the concrete value of a traced
      argument (a constant), never a tracer; the user's own helpers are rewritten likewise. Under
      an enclosing ``jax.jit``/``jax.vmap`` no concrete value exists while tracing: an
      orchestration call that receives a traced value raises :class:`XCSError` saying so. (A
      hybrid without readable source runs unmodified.)

    >>> import jax.numpy as jnp
    >>> from nablax import xcs
    >>> float(xcs.grad(lambda x: jnp.sum(x ** 2))(jnp.array([1.0, 2.0]))[1])
    4.0
    >>> @xcs.mark_orchestration
    ... def rate(prompt):
    ...     return 3.0 if "1.5" in prompt else 0.0
    >>> def scored(x):
    ...     return jnp.sum(x * x) * rate(f"rate {x[0]}")  # rate sees 'rate 1.5', a constant
    >>> float(xcs.grad(scored)(jnp.array([1.5, 2.0]))[0])
    9.0
    """
    if not callable(fn):
        raise TypeError(f"xcs.grad: expected a function, got {type(fn).__name__}")

    @functools.wraps(fn)
    def g(*args: Any, **kwargs: Any) -> Any:
        c = classify(fn)
        if c.kind == "orchestration":
            raise XCSError(
                f"xcs.grad: {_name(fn)} is orchestration code ({'; '.join(c.reasons)}); it has no "
                f"gradient, and nothing was run. Fix: differentiate the tensor function it calls, "
                f"or mark it with @xcs.mark_hybrid if it really computes with tensors"
            )
        engine, why = _engine(fn, c, args, kwargs)
        if engine == "jax":
            return _jax_grad(fn, c, why, argnums, has_aux, args, kwargs)
        return _nablax_grad(fn, why, argnums, has_aux, args, kwargs)

    return g

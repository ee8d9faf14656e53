"""``xcs.vmap``, ``xcs.pmap`` and ``xcs.grad`` (``xcs.jit`` is in ``jit.py``): each routes a function by its
classification and its actual arguments to the engine that suits it.

- tensor code on tensor values goes to nablax (``nx.vmap`` / ``nx.grad``) or JAX (``jax.vmap`` /
  ``jax.grad`` / ``jax.pmap``) when it is JAX-traceable;
- everything else runs concurrently: ``vmap`` maps items over a thread pool sized for I/O
  (``scheduler.py``).

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
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import XCSError
from .analysis import classify
from .runtime import has_tensor_values, tensor_kind
from .scheduler import executor_for, run_items

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
        ex = executor_for(executor, max_workers)
        results = run_items(fn, items, kwargs, ex, return_exceptions, name)
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

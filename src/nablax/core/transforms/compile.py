"""``nx.compile``: trace a function once per signature, then call its XLA executable directly.

On a cache miss the function runs once on *placeholder* tensors (pending tensors whose nodes stand
for the arguments), which records its whole lazy graph; the graph from the placeholders (plus the
arrays it captured) to the outputs is lowered into one ``jax.jit`` program (staging.py, shared with
``nx.shard_map``). On a hit the call goes
straight from the flattened arguments to that program: no graph building, no structure key, no
retracing. Non-tensor outputs (ints, strings, ``None``, containers) are recorded at trace time and
returned as they were.

The cache key is the pytree structure of the arguments, the shape/dtype of every tensor leaf, the
value of every other leaf, and the static arguments' values. A realization inside the traced
function (``.item()``, ``print``, a Python ``if`` on a tensor) is a *graph break*: with
``fullgraph=True`` it raises :class:`~nablax.errors.GraphBreakError` naming the user's line; by
default that signature falls back to plain eager execution with one warning.

``dynamic_dims={arg_index: {dim_index: "name"}}`` traces with *symbolic* sizes for those
dimensions (JAX's shape polymorphism, ``jax.export``): the recorded graph and its program serve
every size, and ``jax.jit`` specializes one executable per concrete size behind it. Arguments
sharing a name must agree in size. A function whose Python code needs a concrete size (``if
x.shape[0] > 2``, ``int(n)``) raises during that trace; it then falls back, with one warning, to a
trace per size.

Composition: a call whose tensor arguments are being differentiated or vmapped (inside ``nx.grad``,
``nx.vmap``, ...) runs the function inline, so the transform sees its ops (``grad(compile(f))``,
``vmap(compile(f))``); ``compile(grad(f))`` and ``compile(vmap(grad(f)))`` trace the transformed
function like any other.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np

from ... import tree as _tree
from ...errors import GraphBreakError
from ..graph import src_node
from ..tensor import Tensor, TensorImpl
from .staging import (
    compile_input_p,  # noqa: F401 - re-exported for core/sharding.py and the tests
    dimension_value,  # noqa: F401 - used by core/tensor.py through this module
    lower,
    make_placeholder,
    trace_graph,
)


@dataclass(frozen=True)
class CacheInfo:
    """Counters of one compiled function's cache (``f.cache_info()``)."""

    hits: int
    misses: int
    traces: int
    executables: int
    evictions: int
    size: int


class _Entry:
    """One traced signature: its program, captured arrays and how to rebuild the outputs."""

    __slots__ = (
        "fn",
        "captured",
        "out_def",
        "out_slots",
        "out_consts",
        "out_avals",
        "eager",
        "fast_key",
        "single",
        "sizes",
    )

    def __init__(self) -> None:
        self.eager = False
        self.fast_key = None
        self.sizes = None  # dynamic_dims: the concrete input shapes seen (one executable each)

    def wrap(self, outs):
        """The function's output pytree from the program's results."""
        if self.sizes is not None:  # symbolic output shapes: take them from the values
            avals = [(tuple(v.shape), np.dtype(v.dtype)) for v in outs]
        else:
            avals = self.out_avals
        if self.single:
            ((shape, dtype),) = avals
            t = object.__new__(Tensor)
            t._impl = TensorImpl(None, outs[0], shape, dtype)
            return t
        vals = list(self.out_consts)
        for slot, v, (shape, dtype) in zip(self.out_slots, outs, avals):
            t = object.__new__(Tensor)
            t._impl = TensorImpl(None, v, shape, dtype)
            vals[slot] = t
        return self.out_def.unflatten(vals)


class Compiled:
    """A function compiled with :func:`compile` (callable like the original)."""

    def __init__(self, f, static_argnums, static_argnames, dynamic_dims, fullgraph, max_size):
        functools.update_wrapper(self, f)
        self._f = f
        self._static_nums = tuple(static_argnums)
        self._static_names = tuple(static_argnames)
        self._fullgraph = fullgraph
        self._max = max_size
        self._dyn = _check_dynamic_dims(dynamic_dims or {})
        self._dyn_fallback = False  # set when f turned out not to be shape-polymorphic
        self._cache: collections.OrderedDict = collections.OrderedDict()
        self._fast: dict = {}  # all-tensor positional signatures -> entry (see __call__)
        self._lock = threading.Lock()  # cache bookkeeping, for calls from several threads
        self._hits = self._misses = self._traces = self._evictions = 0
        try:
            self._sig = inspect.signature(f)
        except (TypeError, ValueError):
            self._sig = None

    # ---- public -------------------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        execs = sum(
            len(e.sizes) if e.sizes is not None else 1 for e in self._cache.values() if not e.eager
        )
        return CacheInfo(
            self._hits, self._misses, self._traces, execs, self._evictions, len(self._cache)
        )

    def clear_cache(self) -> None:
        self._cache.clear()
        self._fast.clear()
        self._hits = self._misses = self._traces = self._evictions = 0

    def __get__(self, obj, objtype=None):  # methods: bind like a function
        return self if obj is None else functools.partial(self, obj)

    # ---- calls --------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if not kwargs and not self._static_nums and not self._dyn:
            # Fast path: positional arguments that are all realized, untransformed tensors.
            key = []
            vals = []
            for a in args:
                if type(a) is not Tensor:
                    break
                i = a._impl
                v = i.value
                if v is None or i.src is not None or i.batch_shape:
                    break
                key.append(i.shape)
                key.append(i.dtype)
                vals.append(v)
            else:
                entry = self._fast.get(tuple(key))
                if entry is not None:
                    self._hits += 1
                    return entry.wrap(entry.fn(*vals, *entry.captured))
        dyn_args, statics = self._split(args, kwargs)
        leaves, treedef = _tree.flatten(dyn_args)
        key_leaves = []
        for k, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                impl = leaf._impl
                if impl.batch_shape or (impl.src is not None and src_node(impl.src).trace):
                    return self._f(*args, **kwargs)  # inside a transform: run inline
                key_leaves.append(("t", impl.shape, impl.dtype))
            elif isinstance(leaf, (jax.Array, np.ndarray)):
                key_leaves.append(("a", tuple(leaf.shape), np.dtype(leaf.dtype)))
            else:
                key_leaves.append(("v", type(leaf), _hashable(leaf, f"argument leaf {k}")))
        dyn = None
        if self._dyn and not self._dyn_fallback:
            dyn = self._bind_dynamic(args, leaves)
            for k, dims in dyn.items():
                kind, shape, dtype = key_leaves[k]
                shape = tuple(("dyn", dims[d]) if d in dims else n for d, n in enumerate(shape))
                key_leaves[k] = (kind, shape, dtype)
        key = (treedef, tuple(key_leaves), statics)
        entry = self._cache.get(key)
        if entry is None:
            self._misses += 1
            entry = self._trace(args, kwargs, leaves, treedef, key, dyn)
            if entry is None:  # not shape-polymorphic: trace this size on its own from now on
                return self(*args, **kwargs)
            if not kwargs and not self._static_nums and not entry.eager:
                if all(type(a) is Tensor for a in args) and len(leaves) == len(args):
                    entry.fast_key = tuple(x for a in args for x in (a.shape, a.dtype))
                    self._fast[entry.fast_key] = entry
        else:
            self._hits += 1
            with self._lock:
                if key in self._cache:
                    self._cache.move_to_end(key)
        if entry.eager:
            return self._f(*args, **kwargs)
        return self._run(entry, leaves)

    def _split(self, args, kwargs):
        """(dynamic part as a pytree, hashable static part)."""
        nums = {i % len(args) if args else i for i in self._static_nums}
        static_pos = tuple((i, _hashable(args[i], f"static argument {i}")) for i in sorted(nums))
        dyn_pos = tuple(a for i, a in enumerate(args) if i not in nums)
        static_kw = tuple(
            sorted(
                (k, _hashable(v, f"static argument {k!r}"))
                for k, v in kwargs.items()
                if k in self._static_names
            )
        )
        dyn_kw = {k: v for k, v in kwargs.items() if k not in self._static_names}
        return (dyn_pos, dyn_kw), (static_pos, static_kw)

    def _run(self, entry: _Entry, leaves):
        arrays = [
            leaf._realized_value() if isinstance(leaf, Tensor) else leaf
            for leaf in leaves
            if isinstance(leaf, (Tensor, jax.Array, np.ndarray))
        ]
        return entry.wrap(entry.fn(*arrays, *entry.captured))

    def _bind_dynamic(self, args, leaves) -> dict:
        """``{leaf index: {dim: name}}`` for this call; sizes sharing a name must agree."""
        nums = {i % len(args) for i in self._static_nums} if args else set()
        leaf_of = {}
        k = 0
        for i, a in enumerate(args):
            if i in nums:
                continue
            leaf_of[i] = k
            k += len(_tree.leaves(a))
        seen: dict = {}
        out: dict = {}
        for i, dims in self._dyn.items():
            a = args[i] if i < len(args) else None
            if not isinstance(a, (Tensor, jax.Array, np.ndarray)):
                raise TypeError(
                    f"nx.compile: dynamic_dims names argument {i} of {self.__qualname__}, which "
                    f"is a {type(a).__name__}; dynamic dimensions belong to tensor arguments"
                )
            for d, name in dims.items():
                if not -len(a.shape) <= d < len(a.shape):
                    raise ValueError(
                        f"nx.compile: dynamic_dims[{i}] names dimension {d}, but args[{i}] has "
                        f"shape {tuple(a.shape)}"
                    )
                size = a.shape[d]
                if name in seen and seen[name][0] != size:
                    j, e, s0 = seen[name][1], seen[name][2], seen[name][0]
                    raise ValueError(
                        f"nx.compile: dynamic dimension {name!r} is {s0} in args[{j}] (dimension "
                        f"{e}) but {size} in args[{i}] (dimension {d}); dimensions sharing a name "
                        f"must have the same size"
                    )
                seen[name] = (size, i, d)
                out.setdefault(leaf_of[i], {})[d % len(a.shape)] = name
        return out

    def _trace(self, args, kwargs, leaves, treedef, key, dyn=None) -> _Entry | None:
        self._traces += 1
        entry = _Entry()
        placeholders = []
        new_leaves = []
        syms = _symbols(dyn) if dyn else {}
        for k, leaf in enumerate(leaves):
            if isinstance(leaf, (Tensor, jax.Array, np.ndarray)):
                t = leaf if isinstance(leaf, Tensor) else Tensor(leaf)
                node, ph = make_placeholder(t, len(placeholders))
                if dyn and k in dyn:  # symbolic sizes: one trace serves every size
                    shape = tuple(
                        syms[dyn[k][d]] if d in dyn[k] else n for d, n in enumerate(t.shape)
                    )
                    node.params = (shape,) + node.params[1:]
                    ph._impl.shape = shape
                placeholders.append(node)
                new_leaves.append(ph)
            else:
                new_leaves.append(leaf)
        dyn_pos, dyn_kw = _tree.unflatten(treedef, new_leaves)
        call_args, call_kw = self._merge(args, kwargs, dyn_pos, dyn_kw)
        try:
            out = trace_graph(lambda *a: self._f(*a, **call_kw), call_args, placeholders)
        except _SYMBOLIC_ERRORS as e:
            if not dyn:
                raise
            warnings.warn(
                f"nx.compile({self.__qualname__}): dynamic_dims needs code that works for any "
                f"size, and this function does not ({type(e).__name__}: {str(e)[:200]}). Each "
                f"size is traced on its own from now on.",
                stacklevel=3,
            )
            self._dyn_fallback = True
            return None
        except GraphBreakError as e:
            if self._fullgraph:
                raise
            warnings.warn(
                f"nx.compile({self.__qualname__}): {e} This call signature runs eagerly from "
                f"now on.",
                stacklevel=3,
            )
            entry.eager = True
            self._store(key, entry)
            return entry
        out_leaves, out_def = _tree.flatten(out)
        entry.out_def = out_def
        entry.out_consts = [None if isinstance(o, Tensor) else o for o in out_leaves]
        entry.out_slots = [k for k, o in enumerate(out_leaves) if isinstance(o, Tensor)]
        entry.out_avals = [(out_leaves[k].shape, out_leaves[k].dtype) for k in entry.out_slots]
        entry.single = entry.out_slots == [0] and out_def.num_nodes == 1
        program, entry.captured = lower(
            [out_leaves[k]._impl for k in entry.out_slots], placeholders
        )
        if dyn:  # exported once with symbolic shapes; jit specializes it per concrete size
            specs = [jax.ShapeDtypeStruct(n.params[0], n.params[1]) for n in placeholders]
            specs += [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in entry.captured]
            exported = jax.export.export(jax.jit(program))(*specs)
            entry.fn = _SizedCall(jax.jit(exported.call), entry)
            entry.sizes = set()
        else:
            entry.fn = jax.jit(program)
        self._store(key, entry)
        return entry

    def _merge(self, args, kwargs, dyn_pos, dyn_kw):
        nums = {i % len(args) if args else i for i in self._static_nums}
        it = iter(dyn_pos)
        call_args = [args[i] if i in nums else next(it) for i in range(len(args))]
        call_kw = {k: (kwargs[k] if k in self._static_names else dyn_kw[k]) for k in kwargs}
        return call_args, call_kw

    def _store(self, key, entry) -> None:
        with self._lock:
            self._cache[key] = entry
            while len(self._cache) > self._max:
                _, old = self._cache.popitem(last=False)
                if old.fast_key is not None:
                    self._fast.pop(old.fast_key, None)
                self._evictions += 1


class _SizedCall:
    """The jitted call of an exported (shape-polymorphic) program; records each concrete size."""

    __slots__ = ("fn", "entry")

    def __init__(self, fn, entry) -> None:
        self.fn, self.entry = fn, entry

    def __call__(self, *arrays):
        self.entry.sizes.add(tuple(tuple(a.shape) for a in arrays))
        return self.fn(*arrays)


def _symbolic_errors() -> tuple:
    from jax.export import is_symbolic_dim  # noqa: F401 - make sure the module is loaded

    try:
        from jax._src.export.shape_poly import InconclusiveDimensionOperation
    except ImportError:  # pragma: no cover - older/newer JAX layouts
        InconclusiveDimensionOperation = ValueError  # noqa: N806
    from ...errors import ShapeError

    return (InconclusiveDimensionOperation, TypeError, ShapeError, ValueError, IndexError)


_SYMBOLIC_ERRORS = _symbolic_errors()


def _check_dynamic_dims(dd) -> dict:
    if not isinstance(dd, dict) or not all(
        isinstance(i, int)
        and isinstance(dims, dict)
        and all(isinstance(d, int) and isinstance(n, str) for d, n in dims.items())
        for i, dims in dd.items()
    ):
        raise TypeError(
            f"nx.compile: dynamic_dims must look like {{arg_index: {{dim_index: 'name'}}}}, got "
            f"{dd!r}"
        )
    return dd


def _symbols(dyn: dict) -> dict:
    """One symbolic size per name, in one scope (jax.export shape polymorphism)."""
    names = sorted({n for dims in dyn.values() for n in dims.values()})
    return dict(zip(names, jax.export.symbolic_shape(",".join(names))))


def _hashable(v, what: str):
    try:
        hash(v)
    except TypeError:
        raise TypeError(
            f"nx.compile: {what} is a {type(v).__name__}, which is not hashable, so it cannot be "
            f"part of the cache key. Fix: pass a tuple instead of a list, or make it a tensor"
        ) from None
    return v


def compile(
    f: Callable | None = None,
    *,
    static_argnums=(),
    static_argnames=(),
    dynamic_dims=None,
    fullgraph: bool = False,
    max_cache_size: int = 64,
) -> Any:
    """Compile ``f``: trace it once per argument signature, then run its cached XLA executable.

    Usable bare (``@nx.compile``) or with arguments (``@nx.compile(static_argnums=(1,))``).

    >>> import nablax as nx
    >>> @nx.compile
    ... def step(w, x):
    ...     return w - 0.5 * (x @ w), "ok"
    >>> w, msg = step(nx.ones((2, 2)), nx.ones((2, 2)))
    >>> msg, w.tolist(), step(w, nx.ones((2, 2)))[1]
    ('ok', [[0.0, 0.0], [0.0, 0.0]], 'ok')
    >>> step.cache_info().traces, step.cache_info().hits
    (1, 1)
    """
    if isinstance(static_argnums, int):
        static_argnums = (static_argnums,)
    if isinstance(static_argnames, str):
        static_argnames = (static_argnames,)

    def make(fn):
        return Compiled(
            fn, static_argnums, static_argnames, dynamic_dims, fullgraph, max_cache_size
        )

    return make if f is None else make(f)

"""``nx.compile``: trace a function once per signature, then call its XLA executable directly.

On a cache miss the function runs once on *placeholder* tensors (pending tensors whose nodes stand
for the arguments), which records its whole lazy graph; the graph from the placeholders (plus the
arrays it captured) to the outputs is lowered into one ``jax.jit`` program (staging.py, shared with
``nx.shard_map``). On a hit the call goes
straight from the flattened arguments to that program: no graph building, no structure key, no
retracing. Non-tensor outputs (ints, strings, ``None``, containers) are recorded at trace time and
returned as they were.

The cache key is the pytree structure of the arguments, the shape/dtype of every tensor leaf, the
kind (never the value) of every Python or NumPy number leaf, the value of every other leaf, and
the static arguments' values. Python numbers are traced as weakly typed 0-d values, like
``jax.jit`` (scalars.py): a step counter does not retrace, ``if step > 10:`` raises
:class:`~nablax.errors.ConcretizationError` naming ``static_argnums`` / ``static_argnames``, which
keep an argument a Python value (one trace per value; ``static_argnames`` also covers the same
parameters passed by position, and ``static_argnums`` the same passed by keyword, as in
``jax.jit``). Traces caused by changing values in the key are counted, with one warning past the
nablax option ``compile_retrace_warning``. A realization inside the traced
function (``.item()``, ``print``, a Python ``if`` on a tensor) is a *graph break*: with
``fullgraph=True`` it raises :class:`~nablax.errors.GraphBreakError` naming the user's line; by
default that signature falls back to plain eager execution with one warning.

``dynamic_dims={arg_index: {dim_index: "name"}}`` traces with *symbolic* sizes for those
dimensions (JAX's shape polymorphism, ``jax.export``): the recorded graph and its program serve
every size, and ``jax.jit`` specializes one executable per concrete size behind it. Arguments
sharing a name must agree in size (they are one symbol). Inside the function, ``x.shape`` holds a
:class:`~nablax.core.transforms.sizes.Size` for each such dimension, and the trace must never bake
in a Python decision that holds only for some sizes. So (sizes.py):

- arithmetic that stays an integer size (``n * 2``, ``n - 1``, ``n // 2``, ``n % 2``,
  ``math.prod(x.shape)``) gives sizes, usable in shapes (``x.reshape(n // 2, -1)``,
  ``nx.zeros((n, 3))``) and as tensor values (``x.sum() / n``, ``x * n``: ``dimension_value`` nodes);
- a decision whose answer JAX proves for *every* size (sizes are >= 1) is answered: ``n >= 1``,
  ``n > 0``, ``bool(n)``, ``n != 0``, ``n == n``, ``2 * n == n + n``, ``max(n, 1)``, and
  ``x.shape[0] == y.shape[0]`` for two dimensions sharing a name;
- any other decision in the user's code (``==``, ``!=``, ``<``, ``<=``, ``>``, ``>=`` that depend
  on the size, ``bool(n % 2)``, ``int(n)``, ``float(n)``, ``n / 2``, ``hash(n)`` and dict/set
  lookups, ``range(n)``, ``len(x)``, indexing a list, ``min``/``max``, ``math`` functions,
  ``n in (2, 4)``, ``x.shape == (4, 3)``, and the text of a size: ``str(n)``, ``repr(n)``,
  ``f"{n}"``, ``"%s" % n``, ``str(x.shape)``, which would be the symbol's name ``"n"`` for every
  size) is recorded and raises ``SizeDependentError``. The call
  then traces that signature for its concrete size, with one warning naming the line, and so does
  every later size of that signature (one trace and one executable per size). A decision the
  function catches is still recorded.

Sizes of 0 (outside ``jax.export``'s range) are traced on their own. Sizes returned as Python
values (``return y, x.shape[0]``) are computed from each call's sizes. nablax's own messages,
JAX, ``logging`` and debuggers show a size as its symbol's name without a decision
(``print(x.shape)`` is a decision: each size's trace prints its own shape). A size is not an ``int``:
``isinstance(n, int)`` is ``False`` (as for JAX's symbolic dimensions, which a Size must subclass
and an ``int`` cannot), so code that checks for an int and raises otherwise (``json.dumps(n)``)
traces per size, and code that quietly takes another path for a non-int takes it for every size.
``nx.arange(n)`` (and ``arange(k, n, step)``, ``n // 2``, ``n - 1``...) serves every size; an
``arange`` whose values could leave int32 for some sizes traces per size. nablax's own shape rules
and JAX keep JAX's semantics, which choose what is right for every size.

Composition: a call whose tensor arguments are being differentiated or vmapped (inside ``nx.grad``,
``nx.vmap``, ...), or are pending inside another trace (a compiled function called by a function
being compiled), runs the function inline, so the transform or the outer trace sees its ops
(``grad(compile(f))``, ``vmap(compile(f))``, ``compile(... compile(g) ...)``); ``compile(grad(f))``
and ``compile(vmap(grad(f)))`` trace the transformed function like any other.
"""

from __future__ import annotations

import functools
import inspect
import threading
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from .... import _caches, _config
from .... import tree as _tree
from ....errors import GraphBreakError
from ... import cpu_threads, dtypes, gc_threshold, host_memory
from ...context import CTX
from ...host import host_array
from ...realize import realize_impls
from ...tensor import Tensor
from ..sizes import (
    SYMBOLIC_ERRORS,
    Guard,
    SizedCall,
    check_dynamic_dims,
    evaluate,
    guarded,
    is_symbolic,
    plain_tree,
    symbols,
)
from ..staging import (
    lower,
    make_placeholder,
    trace_graph,
)
from .checks import (
    callable_name,
    check_static_argnums,
    check_static_positions,
    eager_fallback_message,
)
from .entry import PY_NUMBERS, Entry, fast_signature
from .info import LIVE, CacheInfo
from .scalars import (
    RetraceWatch,
    ScalarArg,
    is_traced_number,
    leaf_label,
    scalar_key,
    scalar_placeholder,
    static_both_ways,
    strong_arguments,
)

# bound of a compiled function's own memos (static positions per argument count, signatures
# found size-dependent): emptied when full, as a dropped entry is only computed again
_MEMO_MAX = 256


class Compiled:
    """A function compiled with :func:`compile` (callable like the original)."""

    __qualname__: str  # the wrapped function's (functools.update_wrapper)

    def __init__(self, f, static_argnums, static_argnames, dynamic_dims, fullgraph, max_size):
        functools.update_wrapper(self, f)
        if "__qualname__" not in self.__dict__:  # a functools.partial, an object with __call__
            self.__qualname__ = callable_name(f)
        self._f = f
        try:
            self._sig = inspect.signature(f)
        except (TypeError, ValueError):
            self._sig = None
        check_static_argnums(self.__qualname__, self._sig, tuple(static_argnums))
        self._static_nums, self._static_names = static_both_ways(
            self._sig, tuple(static_argnums), tuple(static_argnames)
        )
        self._static_at: dict = {}  # number of positional arguments -> static positions
        self._fullgraph = fullgraph
        self._dyn = check_dynamic_dims(dynamic_dims or {})
        self._per_size: set = set()  # symbolic signatures whose code turned out size-dependent
        self._fast: dict = {}  # all-tensor positional signatures -> entry (see __call__)
        fast = self._fast  # (the eviction hook holds the dict, not self: no reference cycle)
        # signature -> Entry, LRU; reported and cleared through info.LIVE
        self._cache = _caches.Cache(
            f"compile[{self.__qualname__}]",
            max_size,
            register=False,
            on_evict=lambda _, old: fast.pop(old.fast_key, None),
        )
        self._lock = threading.Lock()  # clear_cache: the cache and its companions together
        self._hits = self._misses = self._traces = 0
        self._watch = RetraceWatch(self.__qualname__, self._sig)
        LIVE.add(self)

    # ---- public -------------------------------------------------------------------------------
    def cache_info(self) -> CacheInfo:
        entries = self._cache.values()  # a snapshot (nx.cache_info() may ask from another thread)
        execs = sum(len(e.sizes) if e.sizes is not None else 1 for e in entries if not e.eager)
        return CacheInfo(
            self._hits, self._misses, self._traces, execs, self._cache.evictions, len(entries)
        )

    def clear_cache(self) -> None:
        with self._lock:
            self._clear_cache()

    def _clear_cache(self) -> None:
        self._cache.clear()  # its eviction counter too
        self._fast.clear()
        self._per_size.clear()
        self._static_at.clear()
        self._watch.clear()
        self._hits = self._misses = self._traces = 0

    def __get__(self, obj, objtype=None):  # methods: bind like a function
        return self if obj is None else functools.partial(self, obj)

    # ---- calls --------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        # nx.autocast changes the ops a trace records: it is part of the key (and calls under
        # it skip the fast path, whose key is the arguments alone)
        autocast = CTX.autocast
        # so does nx.config matmul_precision (a parameter of every product it records): in the
        # key, and in the fast path's
        precision = _config.get("matmul_precision")
        fast = not kwargs and not self._static_nums and not self._dyn and autocast is None
        if (
            fast
        ):  # all arguments realized tensors / Python numbers (also inside lists, tuples, dicts)
            sig = fast_signature(args)
            if sig is not None:
                entry = self._fast.get((sig[0], precision))
                if entry is not None:
                    self._hits += 1
                    return entry.wrap(entry.fn(*sig[1], *entry.captured))
        dyn_args, statics = self._split(args, kwargs)
        leaves, treedef = _tree.flatten(dyn_args)
        key_leaves = []
        for k, leaf in enumerate(leaves):
            if isinstance(leaf, Tensor):
                impl = leaf._impl
                if impl.batch_shape or (
                    impl.src is not None and (impl.src[0].trace or CTX.tracing_depth)
                ):  # inside a transform, or in a function being traced: run inline
                    return self._f(*args, **kwargs)
                key_leaves.append(("t", impl.shape, impl.dtype))
            elif isinstance(leaf, (jax.Array, np.ndarray)):
                key_leaves.append(("a", tuple(leaf.shape), np.dtype(leaf.dtype)))
            elif is_traced_number(leaf):  # traced: its kind is in the key, never its value
                key_leaves.append(
                    scalar_key(leaf, lambda k=k: self._leaf_label(len(args), dyn_args, k))
                )
            else:
                key_leaves.append(("v", type(leaf), _hashable(leaf, f"argument leaf {k}")))
        if autocast is not None:
            key_leaves.append(("nx.autocast", autocast))  # after the leaves: indices unchanged
        key_leaves.append(("matmul_precision", precision))
        key = (treedef, tuple(key_leaves), statics)
        dyn = env = None
        if self._dyn:
            dyn, env = self._bind_dynamic(args, leaves)
            sym_leaves = list(key_leaves)
            for k, dims in dyn.items():
                kind, shape, dtype = sym_leaves[k]
                shape = tuple(("dyn", dims[d]) if d in dims else n for d, n in enumerate(shape))
                sym_leaves[k] = (kind, shape, dtype)
            sym_key = (treedef, tuple(sym_leaves), statics)
            # jax.export sizes are >= 1; a signature found size-dependent is traced per size
            if min(env.values(), default=1) >= 1 and sym_key not in self._per_size:
                key = sym_key
            else:
                dyn = None
        entry = self._cache.get(key)  # a hit becomes the most recently used
        if entry is None:
            self._misses += 1
            self._watch.note_key(
                treedef, key_leaves, statics, lambda k: self._leaf_label(len(args), dyn_args, k)
            )
            entry = self._trace(args, kwargs, leaves, treedef, key, dyn, env)
            if entry is None:  # not shape-polymorphic: this size (and each later one) on its own
                if len(self._per_size) >= _MEMO_MAX:  # a dropped signature is found again
                    self._per_size.clear()
                self._per_size.add(key)
                key = (treedef, tuple(key_leaves), statics)
                entry = self._cache.get(key) or self._trace(args, kwargs, leaves, treedef, key)
        else:
            self._hits += 1
        if fast and entry.fast_key is None and not entry.eager:
            sig = fast_signature(args)
            if sig is not None:  # later calls with this signature take the fast path
                entry.fast_key = (sig[0], precision)
                self._fast[entry.fast_key] = entry
        if entry.eager:
            return self._f(*args, **kwargs)
        return self._run(entry, leaves, env)

    def _split(self, args, kwargs):
        """(dynamic part as a pytree, hashable static part)."""
        nums = self._static_positions(len(args))
        if len(self._static_nums) != len(nums) and self._sig is None:
            check_static_positions(self.__qualname__, self._static_nums, len(args), kwargs)
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

    def _static_positions(self, n: int) -> frozenset:
        """The static positions among ``n`` positional arguments (negative numbers count from the
        end; numbers past ``n`` name parameters passed by keyword: scalars.static_both_ways)."""
        got = self._static_at.get(n)
        if got is None:
            got = frozenset(i % n for i in self._static_nums if -n <= i < n)
            if len(self._static_at) >= _MEMO_MAX:  # a memo: dropping it costs a recomputation
                self._static_at.clear()
            self._static_at[n] = got
        return got

    def _leaf_label(self, n_args: int, dyn_args, k: int, fix: bool = False):
        return leaf_label(self._sig, self._static_positions(n_args), n_args, dyn_args, k, fix)

    def _run(self, entry: Entry, leaves, env=None):
        pending = [
            t._impl
            for t in leaves
            if isinstance(t, Tensor) and t._impl.value is None and not t._impl.batch_shape
        ]
        if len(pending) > 1:  # lazy arguments: one program computes them all, not one each
            realize_impls(pending)
        arrays = [
            leaf._realized_value()
            if isinstance(leaf, Tensor)
            else _numpy_arg(leaf)
            if isinstance(leaf, np.ndarray)
            else leaf
            for leaf in leaves
            if isinstance(leaf, (Tensor, jax.Array, np.ndarray)) or is_traced_number(leaf)
        ]
        return entry.wrap(entry.fn(*arrays, *entry.captured), env)

    def _bind_dynamic(self, args, leaves) -> tuple[dict, dict]:
        """``({leaf index: {dim: name}}, {name: size})`` for this call; sizes sharing a name must
        agree."""
        nums = self._static_positions(len(args))
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
        return out, {name: v[0] for name, v in seen.items()}

    def _trace(self, args, kwargs, leaves, treedef, key, dyn=None, env=None) -> Entry | None:
        """Trace ``f`` for one signature and store its entry. With ``dyn`` (symbolic sizes),
        ``None`` when the code turned out to depend on the sizes: the caller traces per size."""
        self._traces += 1
        guard = Guard() if dyn else None
        placeholders, call_args, call_kw = self._placeholders(
            args, kwargs, leaves, treedef, dyn, guard
        )
        try:
            out = trace_graph(lambda *a: self._f(*a, **call_kw), call_args, placeholders)
        except GraphBreakError as e:
            if guard is not None and guard.first:  # a size decision came first: per size
                self._not_polymorphic(guard, e)
                return None
            if self._fullgraph:
                raise
            warnings.warn(
                f"nx.compile({self.__qualname__}): {eager_fallback_message(e)} This call "
                f"signature runs eagerly from now on (fullgraph=True makes this an error).",
                stacklevel=3,
            )
            entry = Entry()
            entry.eager = True
            self._store(key, entry)
            return entry
        except Exception as e:
            if guard is None or not (guard.first or isinstance(e, SYMBOLIC_ERRORS)):
                raise
            self._not_polymorphic(guard, e)
            return None
        finally:
            if guard is not None:
                guard.active = False  # sizes kept past the trace are stale
        if guard is not None and guard.first:  # the function caught SizeDependentError
            self._not_polymorphic(guard, None)
            return None
        try:
            entry = self._build(out, placeholders, dyn, env)
        except Exception as e:  # e.g. an op JAX cannot export shape-polymorphically
            if guard is None:
                raise
            self._not_polymorphic(guard, e)
            return None
        self._store(key, entry)
        return entry

    def _placeholders(self, args, kwargs, leaves, treedef, dyn, guard):
        """Placeholder tensors for the tensor leaves (symbolic sizes where ``dyn`` says), and the
        arguments to call ``f`` with."""
        placeholders = []
        new_leaves = []
        syms = {n: guarded(d, guard) for n, d in symbols(dyn).items()} if dyn else {}
        dyn_args = None
        for k, leaf in enumerate(leaves):
            if type(leaf) in PY_NUMBERS:  # a weakly typed traced scalar (scalars.py)
                if dyn_args is None:
                    dyn_args = _tree.unflatten(treedef, leaves)
                label, fix = self._leaf_label(len(args), dyn_args, k, fix=True)
                origin = ScalarArg(self.__qualname__, label, type(leaf), fix)
                node, ph = scalar_placeholder(leaf, len(placeholders), origin)
                placeholders.append(node)
                new_leaves.append(ph)
            elif isinstance(leaf, (Tensor, jax.Array, np.ndarray, np.number, np.bool_)):
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
        return placeholders, call_args, call_kw

    def _build(self, out, placeholders, dyn, env) -> Entry:
        """The entry (program, captured arrays, output layout) for a finished trace."""
        entry = Entry()
        out_leaves, out_def = _tree.flatten(out)
        entry.out_def = out_def
        entry.out_consts = [None if isinstance(o, Tensor) else o for o in out_leaves]
        entry.out_slots = [k for k, o in enumerate(out_leaves) if isinstance(o, Tensor)]
        entry.out_avals = [(out_leaves[k].shape, out_leaves[k].dtype) for k in entry.out_slots]
        entry.single = entry.out_slots == [0] and out_def.num_nodes == 1
        # sizes returned as Python values: computed from each call's sizes
        entry.out_sizes = [(k, o) for k, o in enumerate(out_leaves) if is_symbolic(o)]
        for _, d in entry.out_sizes:
            evaluate(d, env)  # fails here (not at a later call) where it cannot be computed
        program, entry.captured = lower(
            [out_leaves[k]._impl for k in entry.out_slots], placeholders
        )
        # Python numbers reach the program weakly typed: made strong as the graph recorded them
        scalar_args = CTX.scalar_args
        program = strong_arguments(
            program, {k: n.params[1] for k, n in enumerate(placeholders) if n in scalar_args}
        )
        cpu_threads.apply()  # see core/cpu_threads.py
        host_memory.apply()  # see core/host_memory.py
        gc_threshold.apply()  # see core/gc_threshold.py
        if dyn:  # exported once with symbolic shapes; jit specializes it per concrete size
            specs = [
                jax.ShapeDtypeStruct(plain_tree(n.params[0]), n.params[1]) for n in placeholders
            ]
            specs += [jax.ShapeDtypeStruct(c.shape, c.dtype) for c in entry.captured]
            exported = jax.export.export(jax.jit(program))(*specs)
            entry.fn = SizedCall(jax.jit(exported.call), entry)
            entry.sizes = set()
        else:
            entry.fn = jax.jit(program)
        return entry

    def _not_polymorphic(self, guard, error) -> None:
        why = guard.first or f"{type(error).__name__}: {str(error)[:200]}"
        warnings.warn(
            f"nx.compile({self.__qualname__}): dynamic_dims needs code that works for every size, "
            f"and this function does not: {why}. Each size is traced on its own from now on "
            f"(for this call signature).",
            stacklevel=4,
        )
        return None

    def _merge(self, args, kwargs, dyn_pos, dyn_kw):
        nums = self._static_positions(len(args))
        it = iter(dyn_pos)
        call_args = [args[i] if i in nums else next(it) for i in range(len(args))]
        call_kw = {k: (kwargs[k] if k in self._static_names else dyn_kw[k]) for k in kwargs}
        return call_args, call_kw

    def _store(self, key, entry) -> None:
        self._cache.put(key, entry)  # evicting the least recently used over max_cache_size


def _numpy_arg(a: np.ndarray):
    """A NumPy argument as ``nx.tensor`` converts it (core/host.py): big-endian data to native byte
    order (jax.jit raises a TypeError), an int64 beyond int32 an ``OverflowError`` naming
    ``nx.compile`` (jax.jit wraps it). Arrays already in a canonical native dtype pass as they
    are."""
    dt = a.dtype
    if dt.isnative and dtypes.canonicalize(dt) == dt:
        return a
    return host_array(a, None, "compile")


def _hashable(v, what: str):
    """``v``'s part of the cache key: its type and value (``1``, ``1.0`` and ``True`` are equal
    and hash alike, but trace differently: three signatures, as in ``jax.jit``), recursively
    through tuples."""
    try:
        hash(v)
    except TypeError:
        raise TypeError(
            f"nx.compile: {what} is a {type(v).__name__}, which is not hashable, so it cannot be "
            f"part of the cache key. Fix: pass a tuple instead of a list, or make it a tensor"
        ) from None
    return _typed(v)


def _typed(v):
    t = type(v)
    if t is tuple:
        return (t, tuple(_typed(e) for e in v))
    if t is float and v != v:  # NaN: equal to itself as a static value
        return (t, "nan")
    return (t, v)


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
    ``dynamic_dims={arg_index: {dim_index: "name"}}`` traces once for every size of those
    dimensions; a Python decision on such a size must hold for every size, otherwise that
    signature is traced once per size, with one warning (see the module documentation).

    >>> import nablax as nx
    >>> @nx.compile
    ... def step(w, x):
    ...     return w - 0.5 * (x @ w), "ok"
    >>> w, msg = step(nx.ones((2, 2)), nx.ones((2, 2)))
    >>> msg, w.tolist(), step(w, nx.ones((2, 2)))[1]
    ('ok', [[0.0, 0.0], [0.0, 0.0]], 'ok')
    >>> step.cache_info().traces, step.cache_info().hits
    (1, 1)

    One trace for every size of a dynamic dimension; a size can be a value:

    >>> @nx.compile(dynamic_dims={0: {0: "n"}})
    ... def mean_rows(x):
    ...     return x.sum(axis=0) / x.shape[0], x.shape[0]
    >>> [(m.tolist(), n) for m, n in (mean_rows(nx.ones((k, 2))) for k in (1, 4, 7))]
    [([1.0, 1.0], 1), ([1.0, 1.0], 4), ([1.0, 1.0], 7)]
    >>> mean_rows.cache_info().traces, mean_rows.cache_info().executables
    (1, 3)

    A decision that depends on the size is never baked in: that signature traces per size.

    >>> import warnings
    >>> @nx.compile(dynamic_dims={0: {0: "n"}})
    ... def pairs(x):
    ...     return x.reshape(-1, 2) if x.shape[0] % 2 == 0 else x
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     [pairs(nx.ones(k)).shape for k in (4, 3, 6)]
    [(2, 2), (3,), (3, 2)]
    >>> len(caught), pairs.cache_info().traces  # the abandoned symbolic trace + one per size
    (1, 4)
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

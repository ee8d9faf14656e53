"""Realization: lower a pending subgraph to one ``jax.jit`` program, cached by graph structure.

``realize_impls(impls)`` collects the pending nodes behind ``impls`` (see :func:`graph.toposort`),
numbers every value they use, and builds a *structure key*: primitives, static parameters, wiring,
leaf shapes/dtypes, constant dtypes and which outputs are wanted — never values. Programs are cached
by that key (LRU), so an eager loop that builds the same graph every iteration compiles once; Python
scalars travel as runtime arguments (grouped in one array per dtype), so changing a learning rate does
not recompile either.

Outputs of the program are the requested tensors plus every intermediate in the subgraph whose
``TensorImpl`` the user still holds (weakly referenced by its node), so those are never recomputed.

Live pending tensors *connected* to the requested ones (sharing a node or a leaf: the new
parameters of a training step whose loss is read) are computed in the same realization, so an
eager step never leaves work behind. When that rest is large (``async_rest_min_nodes``), it runs as
a second program fed by the first one's boundary values and is not waited for: JAX dispatches it
asynchronously, so ``loss.item()`` returns as soon as the loss is known and Python builds the next
step while the backward pass runs. Reading a tensor of the rest waits for it as usual. On the CPU
backend the rest runs apart only while the values it reads from the first program fit in
``async_rest_cpu_boundary_mb``: there the second program shares the cores with Python, so the
overlap is small, and a large boundary's round trip through memory costs more than it saves.
"""

from __future__ import annotations

import itertools
import math
import operator
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import jax
import numpy as np

from .. import _caches, _config
from ..errors import ConcretizationError
from . import cpu_threads, gc_threshold, graph, host_limits, host_memory, recompiles
from .connected import connected
from .context import CTX
from .graph import (
    POSITION,
    Literal,
    Var,
    collect,
    describe,
    encode,
    encode_key,
    flat_key,
    gc_paused,
    new_literal,
    new_var,
    run_steps,
)


@dataclass(frozen=True)
class CacheInfo:
    """Counters of the realization cache (``nx.cache_info()``)."""

    compiles: int
    hits: int
    executables: int
    realizations: int
    evictions: int


class _State:
    """Process-wide (core/context.py, "Process-wide state"): the programs by graph structure (an
    LRU :class:`~nablax._caches.Cache` bounded by the option ``max_executables``, registered below
    with this module's own counters), the counters and the realization lock."""

    def __init__(self) -> None:
        self.cache = _caches.Cache(
            "realize.executables", lambda: _config.get("max_executables"), register=False
        )
        self.compiles = 0
        self.hits = 0
        self.realizations = 0
        self.lock = threading.RLock()


_S = _State()


def cache_info() -> CacheInfo:
    """Counters of the realization cache.

    >>> import nablax as nx
    >>> nx.clear_caches()
    >>> for _ in range(3):
    ...     y = (nx.ones(4) * 2 + 1).sum().item()
    >>> info = nx.cache_info()
    >>> (info.compiles, info.hits)
    (1, 2)
    """
    return CacheInfo(_S.compiles, _S.hits, len(_S.cache), _S.realizations, _S.cache.evictions)


def clear_cache() -> None:
    """Drop every cached executable and reset the counters."""
    with _S.lock:
        _S.cache.clear()  # its eviction counter too
        _S.compiles = _S.hits = _S.realizations = 0


def _stats() -> _caches.CacheStats:
    """The realization cache in ``nx.cache_info()``'s terms (a miss is an XLA compilation)."""
    return _caches.CacheStats(
        "realize.executables",
        _S.hits,
        _S.compiles,
        len(_S.cache),
        _S.cache.maxsize,
        _S.cache.evictions,
    )


_caches.register("realize.executables", _stats, clear_cache)


def epoch() -> int:
    """Number of programs this thread has run; a change means it realized some value."""
    return CTX.epoch


def realize_impls(impls, cut: bool = False) -> None:
    """Compute every pending impl in ``impls`` (and live intermediates) with one program.

    ``cut``: an automatic cut of a deep pending graph (``max_graph_depth``), not a value the user
    asked for: the program computes ``impls`` only. Other live tensors of the graph (in a loop
    ``x = x * a + b``, the previous ``x`` and ``x * a``, alive while the new node is built) stay
    pending: made outputs of one fused program, each would make XLA duplicate the whole
    element-wise chain above it into its own fusion (a 2000-op chain cut once ran 2.6x slower).
    A pending tensor the user still holds is computed, from its own graph, when it is read.
    """
    roots = []
    seen = set()
    for impl in impls:
        if impl.value is None:
            node = impl.src[0]
            if node not in seen:
                seen.add(node)
                roots.append(node)
    if not roots:
        return
    with gc_paused(), _S.lock:  # see graph.gc_paused
        _realize(roots, {id(i) for i in impls} if cut else None)


class _Entry:
    """Executables of one graph structure.

    The first program of a structure bakes its Python scalars in as literals (what ``jax.jit`` of a
    closure would do: fastest to compile and run). If the structure comes back with different scalar
    values, a second program that takes the scalars as arguments is compiled and used from then on,
    so a loop whose scalars change (a learning-rate schedule, a counter) compiles at most twice.
    (Taking the scalars as arguments from the start was measured slower: a program reads each
    scalar with its own slice, and 1000+ slices double XLA's compile time of a large graph.)
    """

    __slots__ = ("baked_fn", "baked_bytes", "param_fn")

    def __init__(self) -> None:
        self.baked_fn: Callable | None = None
        self.baked_bytes: list[bytes] | None = None
        self.param_fn: Callable | None = None


def _realize(roots, only=None) -> None:
    seen = _collect(roots, {})
    if CTX.tracing_depth and _tracing_check is not None:
        _tracing_check(seen)
    if only is not None:  # an automatic cut: these outputs only (see realize_impls)
        _run(seen, (), only)
        return
    extra = connected(seen)
    if extra:
        n_first = len(seen)
        both = _collect(extra, dict(seen))
        min_rest = _config.get("async_rest_min_nodes")
        if min_rest and len(both) - n_first >= min_rest:
            # The value first, then the rest, dispatched without waiting (JAX runs it
            # asynchronously): reading a loss returns before the backward pass and update finish.
            rest = dict.fromkeys(itertools.islice(both, n_first, None))
            if _split_pays(rest, seen):
                _run(seen, _boundary(rest, seen))
                _run(rest, ())
                return
        seen = both
    _run(seen, ())


def _split_pays(rest: dict, first: dict) -> bool:
    """Whether the rest runs as a second program: always, but on the CPU backend, where it
    shares the cores with Python and its inputs round-trip through memory, only while the values
    it reads from the first program fit in ``async_rest_cpu_boundary_mb`` (a deterministic
    choice: the same graph structure always runs the same way)."""
    if jax.default_backend() != "cpu":
        return True
    budget = _config.get("async_rest_cpu_boundary_mb") * 2**20
    total = 0
    counted: set = set()
    for node in rest:
        for inp in node.inputs:
            if type(inp) is Var and inp[0] in first and inp not in counted:
                counted.add(inp)
                total += _value_bytes(inp[0], inp[1])
                if total > budget:
                    return False
    return True


def _value_bytes(node, j: int) -> int:
    """Bytes of output ``j`` of the pending ``node`` (batch axes included), as its live tensor
    or its differentiation trace recorded them (a training step's forward values); 0 where
    neither did (re-running shape rules over the graph for a dropped, untraced value could cost
    more than the program: such a value does not count against the limit)."""
    impl = node.outs[j]()
    if impl is not None:
        shape, dtype, batch = impl.shape, impl.dtype, impl.batch_shape
    else:
        avals = getattr(node, "avals", None)  # set on traced nodes
        if not avals:
            return 0
        shape, dtype = avals[j]
        batch = node.bdims[1] if node.bdims is not None else ()
    return math.prod(batch) * math.prod(shape) * getattr(dtype, "itemsize", 4)


def _boundary(rest: dict, first: dict) -> list:
    """Nodes of ``first`` that nodes of ``rest`` read (outputs of the first program)."""
    out: dict = {}
    for node in rest:
        for inp in node.inputs:
            if type(inp) is Var and inp[0] in first:
                out[inp[0]] = None
    return list(out)


def _run(seen: dict, boundary, only=None) -> None:
    node_pos, key, args, consts, out_impls = _structure(seen, boundary, only)
    entry = _S.cache.get(key)  # marks it most recently used
    if entry is None:
        recompiles.note(key.with_parts(seen))
        entry = _Entry()
        entry.baked_fn = _compile(key, consts)
        entry.baked_bytes = [c.tobytes() for c in consts]
        _S.cache.put(key, entry)  # stored once made: a failed _compile leaves no empty entry
        _evict()
        fn = None
    else:
        fn = entry.param_fn
        if fn is not None:
            _S.hits += 1
        elif all(c.tobytes() == b for c, b in zip(consts, entry.baked_bytes or ())):
            _S.hits += 1
        else:
            fn = entry.param_fn = _compile(key.with_parts(seen), None)
            entry.baked_fn = entry.baked_bytes = None
    # the baked program takes only the arrays (its scalars are literals)
    results = entry.baked_fn(args) if fn is None else fn(args, consts)
    _S.realizations += 1
    CTX.epoch += 1
    _store(out_impls, results)


_seq = operator.attrgetter("seq")


_collect = collect  # graph.collect: compiled (core/_graphc.c) when built


class StructureKey:
    """A structure key ``(steps, ext_desc, out_codes, n_slots)`` that hashes its contents once:
    a long eager chain's key holds thousands of steps, and the program cache looks it up,
    inserts it and reorders it.

    With the compiled graph walks, equality and the hash go through the steps' flat form
    (:func:`graph.flat_key`), written straight from the nodes by :func:`graph.encode_key`: a
    cache hit compares one contiguous array with the stored key instead of walking its nested
    tuples (which have left the processor's caches by the time a training step reads its loss),
    and never makes the step tuples at all. ``parts`` (the nested key, iterable and indexable as
    that tuple) is then made only when a program is compiled (:meth:`with_parts`)."""

    __slots__ = ("parts", "rest", "flat", "hash")

    def __init__(self, parts: tuple, steps_key: tuple | None = None) -> None:
        """``parts``: the nested key; or, with ``steps_key`` (``encode_key``'s ``(flat, hash)``
        of the steps), its last three parts ``(ext_desc, out_codes, n_slots)``."""
        self.parts: tuple | None
        if steps_key is None:
            steps, rest = parts[0], tuple(parts[1:])
            steps_key = flat_key(steps) if _FLAT else (steps, hash(steps))
            self.parts = parts
        else:
            rest, self.parts = parts, None
        rest_flat, rest_hash = flat_key(rest) if _FLAT else (rest, hash(rest))
        self.rest = rest
        self.flat = (steps_key[0], rest_flat)
        self.hash = hash((steps_key[1], rest_hash))

    def with_parts(self, seen) -> StructureKey:
        """This key, with ``parts`` made from the collected nodes ``seen`` it was built from."""
        if self.parts is None:
            steps, _, _ = encode(sorted(seen, key=_seq), {})
            self.parts = (tuple(steps), *self.rest)
        return self

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return type(other) is StructureKey and self.hash == other.hash and self.flat == other.flat

    def __iter__(self):
        return iter(self._parts())

    def __getitem__(self, i):
        return self._parts()[i]

    def __len__(self) -> int:
        return 4

    def _parts(self) -> tuple:
        if self.parts is None:
            raise RuntimeError(
                "nablax internal error: a realization StructureKey made by encode_key was read "
                "before with_parts(seen) gave it its steps"
            )
        return self.parts


_FLAT = graph.COMPILED  # pure Python: flattening would cost more than the compare saves


def _structure(seen: dict, boundary=(), only=None):
    """Encode the collected nodes in creation order (topological, and canonical: the same program
    gets the same key however its nodes were found) with :func:`graph.encode` (compiled:
    :func:`graph.encode_key`, the steps' flat key only), and build the structure key plus the
    runtime arguments.

    External values are the leaf arrays and the Python scalars (grouped in one array per dtype);
    the key holds their shapes and dtypes, never their values."""
    node_pos: dict = {}  # node -> slot of its first output
    if _FLAT:
        steps_key, n, ext = encode_key(sorted(seen, key=_seq), node_pos)
    else:
        steps, n, ext = encode(sorted(seen, key=_seq), node_pos)
    ext_desc, leaves, const_groups, positions = describe(ext, POSITION)
    out_impls: list = []
    out_codes: list = []
    for node, base in node_pos.items():
        outs = node.outs
        if len(outs) == 1:
            impl = outs[0]()
            if impl is not None and impl.value is None and (only is None or id(impl) in only):
                out_impls.append(impl)
                out_codes.append(base)
        else:
            for j, wr in enumerate(outs):
                impl = wr()
                if impl is not None and impl.value is None and (only is None or id(impl) in only):
                    out_impls.append(impl)
                    out_codes.append(base + j)
    for node in sorted(boundary, key=_seq):  # values a later program reads: kept on the node
        base = node_pos[node]
        for j in range(len(node.outs)):
            out_impls.append(new_var(Var, (node, j)))
            out_codes.append(base + j)
    group_dtypes = tuple(const_groups)
    consts = tuple(np.asarray(const_groups[d], dtype=d) for d in group_dtypes)
    rest = (tuple(ext_desc), tuple(out_codes), n)
    if _FLAT:
        key = StructureKey(rest, steps_key)
    else:
        key = StructureKey((tuple(steps), *rest))
    pos = np.asarray(positions, dtype=np.int32) if positions else None
    return node_pos, key, (leaves, pos), consts, out_impls


def _compile(key, baked_consts):
    """A jitted program for structure ``key``: ``fn((leaves, positions), consts)``, or ``fn((leaves, positions))`` with the
    scalars as literals when ``baked_consts`` is given."""
    steps, ext_desc, out_codes, n_slots = key
    group_index: dict = {}
    group_size: list = []
    plan = []  # per external: (True, leaf index) or (False, (group, index in group))
    n_leaves = 0
    n_pos = 0
    for desc in ext_desc:
        if type(desc) is tuple:  # a leaf's (shape, dtype)
            plan.append((True, n_leaves))
            n_leaves += 1
        elif type(desc) is int:  # the array of leaf ``desc`` again (graph.describe)
            plan.append((True, desc))
        elif desc == "position":  # an index position: the next runtime position
            plan.append((None, n_pos))
            n_pos += 1
        else:  # a scalar's dtype: the next value of that dtype's group
            g = group_index.setdefault(desc, len(group_index))
            if g == len(group_size):
                group_size.append(0)
            plan.append((False, (g, group_size[g])))
            group_size[g] += 1

    def program(args, consts):
        leaves, positions = args
        ext = []
        for is_leaf, where in plan:
            if is_leaf:
                ext.append(leaves[where])
            elif is_leaf is None:
                ext.append(positions[where])
            elif baked_consts is not None:  # numpy 0-d values: literals of the program
                ext.append(baked_consts[where[0]][where[1]])
            else:
                ext.append(consts[where[0]][where[1]])
        env = run_steps(steps, [None] * n_slots, ext)
        return [env[c] for c in out_codes]

    _S.compiles += 1
    cpu_threads.apply()
    host_memory.apply()
    gc_threshold.apply()
    if baked_consts is None:
        return jax.jit(program)
    # the scalars are literals: the program takes only the arrays and positions (passing the
    # unused scalar arrays would still cost a host-to-device transfer per call)
    return jax.jit(lambda args: program(args, None))


def _evict() -> None:
    """Keep at most ``max_executables`` programs, and fewer when the process nears its limit of
    memory mappings: each XLA executable holds tens to hundreds of mappings (its code), released
    when the jitted function is dropped, and a process past ``vm.max_map_count`` dies in LLVM
    ("Cannot allocate memory", then a segfault) after a few hundred programs."""
    # (the bound itself is kept by _S.cache.put)
    for _ in range(8):  # each round drops a quarter of the cache, oldest first
        if len(_S.cache) <= 4 or not host_limits.maps_pressure():
            break
        _S.cache.evict(len(_S.cache) // 4)


def _store(out_impls, results) -> None:
    multi: dict = {}  # nodes with several outputs (or boundary values), checked once at the end
    for impl, val in zip(out_impls, results):
        if type(impl) is Var:  # a boundary value with no tensor
            node, j = impl
            if node.values is None:
                node.values = [None] * len(node.outs)
            node.values[j] = val
            multi[node] = None
            continue
        node, j = impl.src
        impl.value = val
        lit = impl.lit = new_literal(Literal)  # Literal(val, impl.dtype), without __init__
        lit.value = val
        lit.dtype = impl.dtype
        lit.weak = False
        if len(node.outs) == 1:
            node.values = [val]
            if node.trace is None or not node.trace.alive():
                node.inputs = None  # its only output is computed: free the upstream graph
                impl.src = None
            else:  # a live differentiation trace may still walk this node (see graph.Trace)
                node.trace.kept.append(weakref.ref(node))
        else:
            if node.values is None:
                node.values = [None] * len(node.outs)
            node.values[j] = val
            multi[node] = None
            if node.trace is None or not node.trace.alive():
                impl.src = None
    for node in multi:
        if all(v is not None for v in node.values):
            if node.trace is None or not node.trace.alive():
                node.inputs = None
            else:
                node.trace.kept.append(weakref.ref(node))


# set by transforms/staging.py: raises on a placeholder in a program
_tracing_check: Callable[..., None] | None = None


def tracing_guard(what: str) -> None:
    """Raise if ``what`` is used while a whole-graph trace (``nx.compile``) is being recorded."""
    if CTX.tracing_depth:
        raise ConcretizationError(
            f"{what} cannot be used inside nx.compile: the compiled program would replay the "
            f"same numbers on every call. Fix: pass an explicit key argument "
            f"(nx.random.key / nx.random.split) to the compiled function"
        )

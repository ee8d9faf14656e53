"""The lazy graph IR: nodes, and the two kinds of node input, ``Var`` and ``Literal``.

A :class:`Node` is one call of a primitive. Its ``inputs`` are each one of exactly two types:

- a :class:`Var`: output ``index`` of another node (pending, or already computed and kept in
  ``node.values``); a ``(node, index)`` pair with a name, so ``m, j = var`` unpacks it and two
  ``Var`` objects naming the same output are equal and hash alike;
- a :class:`Literal`: a value known when the node is built: a realized ``jax.Array`` (a *leaf* of
  any program that uses it) or a Python scalar (weakly typed, materialized in ``dtype``).

A pending ``TensorImpl`` (core/build.py) names its node output with a ``Var`` (``impl.src``); a
realized one keeps its ``Literal`` (``impl.lit``), so using it as an input allocates nothing. Every
node is made by ``core/build.py``'s ``bind`` family, and every consumer of the graph (realization, backward plans,
``nx.compile`` staging, ``nx.shard_map`` bodies) numbers it with :func:`encode`.

Nodes point at their producers, never at the ``TensorImpl`` objects of their inputs, and hold only
weak references to their own outputs. So a tensor object the user dropped really is gone, and at
realization the weak references tell which intermediates the user still holds: those are produced by
the same program. After realization a node keeps its output values and drops its inputs, so upstream
memory is freed.
"""

from __future__ import annotations

import gc
import itertools
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

SCALAR_TYPES = frozenset((bool, int, float, complex))


class Var(tuple):
    """Output ``index`` of ``node``: a node input (or ``TensorImpl.src``) computed by the graph.

    A tuple ``(node, index)`` (``node, index = var``), so that unpacking, hashing and equality are
    as fast as a tuple's and any two ``Var`` objects for the same output are interchangeable."""

    __slots__ = ()

    @property
    def node(self) -> Node:
        return self[0]

    def __repr__(self) -> str:
        return f"Var({self[0].prim.name}#{self[0].seq}, {self[1]})"


new_var = tuple.__new__  # new_var(Var, (node, index)): the fast constructor (no __init__ call)


class Literal:
    """A node input known when the node is built: a realized ``jax.Array``, or a Python scalar
    materialized in ``dtype``.

    ``weak``: a weakly typed Python scalar of an element-wise op (``x * 1.5``): derivative rules
    see the scalar itself, as JAX's do. Other scalars (``nx.where(c, 0.0, x)``, ``nx.full``) are
    constants of their dtype, seen by rules as 0-d tensors. ``weak == POSITION``: an index
    position (``x[i]``, a slice start, an ``.at[]`` position; core/prims/index_dynamic.py), seen by
    rules as the Python int, which realization always passes as a runtime argument (never baked
    into a program: a decode loop's positions change every step)."""

    __slots__ = ("value", "dtype", "weak")

    weak: int  # False, True or POSITION

    def __init__(self, value: Any, dtype, weak: int = False) -> None:
        self.value = value
        self.dtype = dtype
        self.weak = weak

    @property
    def shape(self) -> tuple:
        return tuple(getattr(self.value, "shape", ()))

    @property
    def is_scalar(self) -> bool:
        """A Python scalar (it travels as a runtime scalar argument), not an array (a leaf)."""
        return type(self.value) in SCALAR_TYPES

    def __repr__(self) -> str:
        v = self.value
        shown = repr(v) if type(v) in SCALAR_TYPES else f"array{tuple(v.shape)}"
        return f"Literal({shown}, {self.dtype})"


new_literal = object.__new__
POSITION = 2  # Literal.weak of an index position (truthy: rules see the int itself)


def scalar_literal(value: Any, dtype) -> Literal:
    """``Literal(value, dtype, weak=True)``: the Python scalar of an element-wise op, made without
    an ``__init__`` call (the hottest path of eager code)."""
    lit = new_literal(Literal)
    lit.value = value
    lit.dtype = dtype
    lit.weak = True
    return lit


class Trace:
    """One differentiation scope (a ``grad``/``vjp``/``jvp`` call, or the ``requires_grad`` leaves).

    Nodes built from a traced input remember the deepest trace they depend on (``Node.trace``).
    While that trace, or one enclosing it, is alive, a realized node keeps its inputs (the backward
    pass walks them) and its tensors keep pointing at it; afterwards the node behaves like plain
    eager code and frees its inputs when realized. ``owner``: optional weak reference whose death
    ends the trace (``vjp`` keeps its trace alive as long as the returned ``f_vjp`` exists).
    """

    __slots__ = ("level", "parent", "active", "owner", "keep_alive", "kept", "__weakref__")

    level: int
    parent: Trace | None
    active: bool
    owner: Callable[[], Any] | None
    keep_alive: Callable[[], bool] | None
    kept: list[Any]

    def __init__(self, parent: Trace | None) -> None:
        self.parent = parent
        self.level = 0 if parent is None else parent.level + 1
        self.active = True
        self.owner = None
        self.keep_alive = None  # callable -> bool, for the requires_grad root
        self.kept = []  # weak refs to nodes realized while this trace needed their inputs

    def alive(self) -> bool:
        t: Trace | None = self
        while t is not None:
            if t.keep_alive is not None:
                if t.keep_alive():
                    return True
            elif t.active and (t.owner is None or t.owner() is not None):
                return True
            t = t.parent
        return False


def end_trace(trace: Trace) -> None:
    """The trace is over: nodes it kept go to a still-live enclosing trace, or are released like
    eager code (inputs dropped, tensors no longer pointing at their node)."""
    trace.active = False
    kept, trace.kept = trace.kept, []
    last: Any = _NO_TRACE  # the previous node's trace, and its heir: most nodes share one
    heir = None
    for wr in kept:
        node = wr()
        if node is None:
            continue
        t = node.trace
        if t is not last:
            last = heir = t
            while heir is not None and not _self_alive(heir):
                heir = heir.parent
        if heir is not None:
            heir.kept.append(wr)
        else:
            release(node)


_NO_TRACE: Any = object()


def _self_alive(t: Trace) -> bool:
    if t.keep_alive is not None:
        return t.keep_alive()
    return t.active and (t.owner is None or t.owner() is not None)


def release(node: Node) -> None:
    """Turn a realized node kept for a trace back into an ordinary realized node."""
    vals = node.values
    if vals is None:
        return
    for v in vals:  # (a loop: no generator frame; ``None in vals`` would compare arrays)
        if v is None:
            return
    node.inputs = None
    for wr in node.outs:
        impl = wr()
        if impl is not None and impl.value is not None:
            impl.src = None


def deeper(a: Trace | None, b: Trace | None) -> Trace | None:
    """The trace of a node with inputs traced by ``a`` and ``b`` (the more deeply nested one)."""
    if a is None:
        return b
    if b is None or a.level >= b.level:
        return a
    return b


_next_seq = itertools.count().__next__


def seq_of(node: Node) -> float:
    return node.seq


class Node:
    """One primitive application in the lazy graph; made only by ``core/build.py``'s ``bind`` family.

    - ``inputs``: a ``Var`` or ``Literal`` per operand; ``None`` once all outputs are computed
      (and no live trace needs them);
    - ``values``: the output values once computed (``None`` entries: not computed);
    - ``outs``: weak references to the output ``TensorImpl`` objects;
    - ``seq``: creation order. A node is created after its inputs, so sorting by ``seq`` is a
      topological order, and a canonical one (the same program always gets the same order, however
      its nodes are found), which keeps realization keys stable;
    - ``trace``: the deepest ``Trace`` the node depends on, or ``None`` (see ``Trace``);
    - ``bdims``: ``(batch dims of each input, output batch shape)`` when an input is vmap-batched;
    - ``avals``: output ``(shape, dtype)`` pairs, set only on traced nodes (for the transforms).
    """

    __slots__ = (
        "prim",
        "params",
        "inputs",
        "values",
        "outs",
        "depth",
        "seq",
        "trace",
        "avals",
        "bdims",
        "__weakref__",
    )

    prim: Any
    params: tuple[Any, ...]
    inputs: tuple[Var | Literal, ...] | None
    values: list[Any] | None
    outs: tuple[Any, ...]
    depth: int
    seq: float  # an int (creation order); nx.shard_map staging renumbers some in between
    trace: Trace | None
    avals: tuple[Any, ...]
    bdims: Any

    def __repr__(self) -> str:
        return f"Node({self.prim.name}, params={self.params})"


def toposort(roots: list[Node]) -> list[Node]:
    """Pending nodes reachable from ``roots``, producers before consumers (iterative, no recursion).

    Realization uses :func:`collect`, which keeps discovery order; transforms and tests use this.
    """
    seen: dict = dict.fromkeys(roots)
    stack = list(roots)
    while stack:
        for inp in stack.pop().inputs or ():
            if type(inp) is Var:
                m, j = inp
                if m not in seen and (m.values is None or m.values[j] is None):
                    seen[m] = None
                    stack.append(m)
    return sorted(seen, key=seq_of)  # created after every input: topological


def _encode_py(order, slot: dict, base: int = 0):
    """Number the values of the nodes ``order`` (producers before consumers) for a program.

    The one encoding of the graph IR, shared by realization (core/realize.py), backward plans
    (transforms/plan.py), ``nx.compile`` staging (transforms/staging.py) and ``nx.shard_map``
    bodies (transforms/subprogram.py). Each node's outputs get consecutive slots from ``base`` on
    (``slot[node]`` is its first; ``slot`` may already hold nodes the caller numbered, such as the
    inputs of a body), and each input becomes an int code:

    - ``>= 0``: the slot of a ``Var`` whose node is numbered;
    - ``~i`` (``< 0``): external value ``ext[i]``: a ``Literal``, or a ``Var`` of a node outside
      ``order`` (computed earlier, or an argument placeholder). One entry per distinct ``Var`` and
      per distinct array; one per occurrence for scalars. The caller decides what each becomes
      (a leaf argument, a runtime scalar, a literal baked into the program, ...).

    Returns ``(steps, next free slot, ext)``; a step is ``(prim, params, codes, first slot, output
    count, batch dims of the inputs or None)``: hashable, so a tuple of steps (with a description
    of ``ext``) is a structure key, and :func:`run_steps` lowers it.
    """
    steps: list = []
    ext: list = []
    ext_index: dict = {}  # Var, or id(array) -> index in ext
    append_step = steps.append
    add_ext = ext.append
    get_slot = slot.get
    scalar_types = SCALAR_TYPES
    for node in order:
        codes: list = []
        add = codes.append
        for inp in node.inputs:
            if type(inp) is Var:
                b = get_slot(inp[0])
                if b is not None:
                    add(b + inp[1])
                    continue
                key: Any = inp
            else:
                v = inp.value
                if type(v) in scalar_types:
                    add(~len(ext))
                    add_ext(inp)
                    continue
                key = id(v)
            i = ext_index.get(key)
            if i is None:
                i = ext_index[key] = len(ext)
                add_ext(inp)
            add(~i)
        slot[node] = base
        nout = len(node.outs)
        bd = node.bdims
        append_step((node.prim, node.params, tuple(codes), base, nout, bd and bd[0]))
        base += nout
    return steps, base, ext


def _encode_key_py(order, slot: dict, base: int = 0):
    """:func:`encode`, with the steps given as the flat key of ``tuple(steps)``:
    ``((flat, hash), next free slot, ext)`` (see :func:`_flat_key_py`).

    A program cache keyed by the steps needs only their flat key when it hits; the compiled
    version writes it without making the step tuples (encode the nodes again for the steps on a
    miss)."""
    steps, base, ext = _encode_py(order, slot, base)
    return _flat_key_py(tuple(steps)), base, ext


def _collect_py(roots, seen: dict) -> dict:
    """Add the pending nodes behind ``roots`` to ``seen`` (insertion-ordered, deterministic;
    iterative, so no recursion limit) and return it. Realization's graph walk (core/realize.py)."""
    stack = []
    for r in roots:
        if r not in seen:
            seen[r] = None
            stack.append(r)
    while stack:
        for inp in stack.pop().inputs:
            if type(inp) is Var:
                m = inp[0]
                if m not in seen:
                    vals = m.values
                    if vals is None or vals[inp[1]] is None:
                        seen[m] = None
                        stack.append(m)
    return seen


def _describe_py(ext, position) -> tuple[list, list, dict, list]:
    """Describe a program's external values (``ext`` from :func:`encode`) for realization
    (core/realize.py): ``(ext_desc, leaves, const_groups, positions)``.

    Per external value, ``ext_desc`` gets a leaf array's ``(shape, dtype)`` (the array goes to
    ``leaves``; a ``Var`` names an array an earlier program computed), for an array already in
    ``leaves`` its index there (an int: the program takes each array once, though the graph may
    read it both as a ``Literal`` and as an earlier program's ``Var``, as a training step reads
    a parameter through its marker and in the optimizer: 30 arguments fewer in a GPT-small
    step), an index position's ``"position"`` (its int goes to
    ``positions``: ``position`` is ``POSITION``), or a Python scalar's dtype (its value goes to
    ``const_groups[dtype]``, in order). The structure key holds ``ext_desc``, never the
    values."""
    leaves: list = []
    first: dict = {}  # id(array) -> its index in leaves (the arrays stay alive in ext)
    ext_desc: list = []
    add_desc = ext_desc.append
    const_groups: dict = {}
    positions: list = []
    scalar_types = SCALAR_TYPES
    for inp in ext:
        if type(inp) is Var:
            m, j = inp
            arr = m.values[j]
        else:
            arr = inp.value
            if type(arr) in scalar_types:
                if inp.weak == position:
                    add_desc("position")
                    positions.append(arr)
                    continue
                dt = inp.dtype
                add_desc(dt)
                group = const_groups.get(dt)
                if group is None:
                    const_groups[dt] = [arr]
                else:
                    group.append(arr)
                continue
        k = first.get(id(arr))
        if k is not None:
            add_desc(k)
            continue
        first[id(arr)] = len(leaves)
        add_desc((arr.shape, arr.dtype))
        leaves.append(arr)
    return ext_desc, leaves, const_groups, positions


class _TupleMark:
    """A marker :func:`flat_key` puts where a tuple starts: equal to itself only."""

    __slots__ = ("length",)

    def __init__(self, length: int | None) -> None:
        self.length = length

    def __repr__(self) -> str:
        return f"<tuple of {self.length}>" if self.length is not None else "<tuple of n>"


#: ``MARKS[n]`` starts a tuple of length ``n`` in a flat key; ``MARKS[-1]`` followed by the length
#: starts a longer one.
MARKS: tuple = tuple(_TupleMark(n) for n in range(16)) + (_TupleMark(None),)

_W = sys.hash_info.width
_MASK = (1 << _W) - 1
if _W > 32:
    _P1, _P2, _P5, _ROT = 11400714785074694791, 14029467366897019727, 2870177450012600261, 31
else:
    _P1, _P2, _P5, _ROT = 2654435761, 2246822519, 374761393, 13


def _flat_key_py(key, marks: tuple = MARKS) -> tuple[tuple, int]:
    """``(flat, hash)``: ``key`` written as one flat tuple, each exact tuple of length ``n`` as
    ``marks[n]`` followed by its items (``marks[-1]``, then ``n``, for ``n >= len(marks) - 1``),
    recursively; other objects kept as they are. ``hash`` mixes the items' hashes (a mark's
    index, plus a constant, for a mark) as CPython's tuple hash does: equal keys have equal
    hashes (``1``, ``1.0`` and ``True`` too), and an unhashable item raises ``TypeError``.

    The encoding is self-delimiting and a mark equals only itself, so two keys are equal exactly
    when their flat tuples are: a cache of long nested structure keys (backward plans) can store
    the flat one (:class:`FlatKey`). Comparing flat keys reads one contiguous array where nested
    ones chase every tuple of the stored key, memory the processor's caches no longer hold once
    a training step has run in between. (The compiled version also makes equal ints of a small
    range one object, so they compare without being read.)

    >>> flat, _ = _flat_key_py(((1, 2), "a", ()), ("T0", "T1", "T2", "T*"))
    >>> flat
    ('T*', 3, 'T2', 1, 2, 'a', 'T0')
    """
    m = len(marks) - 1
    out: list = []
    lanes: list = []  # what the hash reads of each item
    stack = [key]
    while stack:
        x = stack.pop()
        if type(x) is tuple:
            n = len(x)
            k = n if n < m else m
            out.append(marks[k])
            lanes.append(_MARK_LANE + k)
            if n >= m:
                out.append(n)
                lanes.append(hash(n))
            stack.extend(reversed(x))
        else:
            out.append(x)
            lanes.append(hash(x))
    acc = _P5
    for lane in lanes:
        acc = (acc + (lane & _MASK) * _P2) & _MASK
        acc = ((acc << _ROT) | (acc >> (_W - _ROT))) & _MASK
        acc = (acc * _P1) & _MASK
    acc = (acc + (len(out) ^ (_P5 ^ 3527539))) & _MASK
    if acc == _MASK:
        acc = 1546275796
    return tuple(out), acc - (1 << _W) if acc >= 1 << (_W - 1) else acc


_MARK_LANE = 1000003  # a mark's lane in the hash: this plus its index in marks


class FlatKey:
    """A cache key made of a structure key's flat tuple and its hash (see :func:`flat_key`).

    ``FlatKey(rest, steps_key)``: the key of ``(steps, rest)`` where ``steps_key`` is the
    ``(flat, hash)`` of the steps that :func:`encode_key` wrote (a cache must build all its keys
    the same way: this one never equals ``FlatKey((steps, rest))``)."""

    __slots__ = ("flat", "hash")

    def __init__(self, key, steps_key: tuple | None = None) -> None:
        if steps_key is None:
            self.flat, self.hash = flat_key(key)
        else:
            flat, h = flat_key(key)
            self.flat = (steps_key[0], flat)
            self.hash = hash((steps_key[1], h))

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return type(other) is FlatKey and self.hash == other.hash and self.flat == other.flat

    def __repr__(self) -> str:
        return f"FlatKey({len(self.flat)} items)"


def _load_compiled():
    """The optional C extension's module (core/_graphc.c), or None.

    ``pip install`` builds it where a C compiler is present. It is not used when the environment
    sets ``NABLAX_PURE_PYTHON=1``, or when its ``VERSION`` is not the one this file expects (a
    build left over from an older source checkout: rerun ``pip install -e .``)."""
    if os.environ.get("NABLAX_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from . import _graphc
    except ImportError:
        return None
    if getattr(_graphc, "VERSION", None) != _COMPILED_VERSION:
        warnings.warn(
            f"nablax: ignoring the compiled graph walks in {_graphc.__file__}: they are version "
            f"{getattr(_graphc, 'VERSION', None)}, this source expects {_COMPILED_VERSION}. "
            f"Fix: rebuild them with `pip install -e .` (nablax runs its pure-Python versions "
            f"meanwhile)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    _graphc.setup(Var, Node, Literal)
    return _graphc


_COMPILED_VERSION = 12
_compiled = _load_compiled()

#: Whether the graph walks below run compiled (core/_graphc.c) or in pure Python.
COMPILED: bool = _compiled is not None

if _compiled is not None:
    encode = _compiled.encode
    collect = _compiled.collect
    describe = _compiled.describe
else:
    encode = _encode_py
    collect = _collect_py
    describe = _describe_py


def encode_key(order, slot: dict, base: int = 0):
    """:func:`_encode_key_py` (compiled when the extension is built): :func:`encode` with the
    steps as the ``(flat, hash)`` of ``tuple(steps)``."""
    if _compiled is not None:
        return _compiled.encode_key(order, slot, MARKS, base)
    return _encode_key_py(order, slot, base)


def flat_key(key) -> tuple[tuple, int]:
    """:func:`_flat_key_py` of ``key`` with :data:`MARKS` (compiled when the extension is
    built)."""
    if _compiled is not None:
        return _compiled.flat_key(key, MARKS)
    return _flat_key_py(key)


def run_steps(steps, env: list, ext) -> list:
    """Lower ``steps`` (from :func:`encode`) inside a traced JAX function. ``env`` has a value per
    slot (inputs filled in) and receives the outputs; ``ext[i]`` is the value of code ``~i``. A
    step with batched inputs lowers through its primitive's batching rule."""
    for prim, params, codes, base, nout, bds in steps:
        args = [env[c] if c >= 0 else ext[~c] for c in codes]
        r = prim.lower(params, *args) if bds is None else prim.rule("batch")(params, bds, *args)
        if prim.multiple_results:
            env[base : base + nout] = list(r)
        else:
            env[base] = r
    return env


class gc_paused:
    """Pause Python's cyclic garbage collector for a block, restoring the caller's setting.

    Graph walks (realization, the backward pass) allocate many short-lived objects but create no
    reference cycles (the graph is a DAG; traces hold only weak references). Letting those
    allocations trigger collections would rescan the whole live graph over and over; reference
    counting still frees everything as usual.
    """

    __slots__ = ("_was",)

    def __enter__(self) -> None:
        self._was = gc.isenabled()
        gc.disable()

    def __exit__(self, *exc) -> None:
        if self._was:
            gc.enable()

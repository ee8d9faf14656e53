"""Backward-pass plans: replaying the reverse pass of a forward graph seen before.

A training loop calls ``nx.grad`` on the same function every step, and each step builds a forward
graph of the same *structure* (same primitives, parameters, wiring, shapes, dtypes and Python
scalars; other arrays). Applying every primitive's ``vjp`` rule again would build the same backward
nodes again, at a few microseconds of Python per rule call. So the first reverse pass over a
structure is *recorded*: the nodes it created, with their parameters and wiring expressed as slots
("output 2 of forward node 7", "the leaf array read by the marker of argument 0", "backward node
12"). Later passes over the same structure *replay* the recording: they create the same nodes
directly, without running the rules, shape checks or dtype promotion again.

The structure key (:func:`signature`) covers everything a rule can see: primitives, static
parameters, how nodes are wired, leaf shapes/dtypes, Python scalar values (rules may fold them into
the nodes they build, e.g. ``x ** 3`` -> ``3 * x ** 2``), which forward nodes already hold values,
which inputs are differentiated and the cotangent seeds. Anything the recording cannot express in
slots makes the structure *unplannable*, and the rules run every time, as they would without this
module: a rule that reads an array created outside the forward graph, nodes owned by another
transform's trace (nested transforms), or an output that is not a freshly built node.

Replay builds exactly the nodes the rules would have built, so the values, the realization cache
key and the memory behaviour are identical; ``tests/core/test_autodiff.py`` checks replayed
gradients against recorded ones for every primitive.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from ... import _caches, _config
from ..build import bind_refs
from ..graph import SCALAR_TYPES, FlatKey, Var, _compiled, encode, encode_key, new_var, seq_of
from ..realize import realize_impls
from ..tensor import Tensor
from .trace import Opaque, node_avals

_MAX_PLANS = 256


class _State:
    def __init__(self) -> None:
        self.plans = _caches.Cache("autodiff.plans", lambda: _MAX_PLANS, register=False)
        self.hits = 0
        self.recordings = 0
        self.lock = threading.Lock()  # the LRU is shared by every thread's transforms


_S = _State()
_UNPLANNABLE = object()


def plan_info() -> tuple[int, int, int]:
    """(plans stored, replays, recordings) — for tests and benchmarks."""
    return len(_S.plans), _S.hits, _S.recordings


def clear_plans() -> None:
    with _S.lock:
        _S.plans.clear()
        _S.hits = _S.recordings = 0


_caches.register("autodiff.plans", _S.plans.info, clear_plans)


def _scalar_code(v):
    t = type(v)
    if t is float:
        return (t, v.hex())  # tells 0.0 from -0.0, and NaN equals NaN
    if t is complex:
        return (t, v.real.hex(), v.imag.hex())
    return (t, v)


class Frame:
    """The values one forward graph gives a plan: ``env[slot]`` is the ``Var`` of a forward node
    output (replay appends the backward nodes' ones), ``ext[i]`` (code ``~i``) a value from outside
    the forward graph: a leaf ``Literal``, a ``Var`` of an untraced node, a scalar ``Literal``."""

    __slots__ = ("env", "pos", "ext", "ext_index", "trace")

    def __init__(self, trace) -> None:
        self.env: list = []
        self.pos: dict = {}  # forward node -> slot of its first output
        self.ext: list = []
        self.ext_index: dict = {}  # Var, or id(array) -> external index
        self.trace = trace


def _scan_py(order, markers, trace, opaque):
    """``(env, flags)`` of the forward graph ``order`` for :func:`signature`: the ``Var`` of each
    node output in slot order, and per node whether it is computed and whether it is a marker;
    ``None`` when the graph cannot be planned (a node of another trace, or one whose last param
    is an ``opaque`` object: a user-defined rule, custom_vjp's bwd, runs on every pass).

    ``_scan`` is this function, or its compiled equivalent (core/_graphc.c's ``plan_scan``) when
    the optional extension is built."""
    env: list = []
    add = env.append
    flags = []
    for n in order:
        if n.trace is not trace:
            return None
        p = n.params
        if p and type(p[-1]) is opaque:
            return None
        k = len(n.outs)
        if k == 1:
            add(new_var(Var, (n, 0)))
        else:
            env.extend([new_var(Var, (n, j)) for j in range(k)])
        flags.append((n.values is not None, n in markers))
    return env, tuple(flags)


_scan = _scan_py if _compiled is None else _compiled.plan_scan


def _ext_descs_py(ext, ext_index: dict, var_desc, scalar_code):
    """The structure key's descriptor of each external value ``ext`` of a forward graph, filling
    ``ext_index`` (``Var``, or ``id(array)`` -> index): ``var_desc(var)`` for a ``Var`` (None: the
    graph cannot be planned, and then this returns None), ``("s", dtype, weak,
    scalar_code(value))`` for a scalar literal (its value is part of the key: rules may fold it
    in), ``("a", shape, dtype)`` for an array literal.

    ``_ext_descs`` is this function, or its compiled equivalent (core/_graphc.c's
    ``plan_ext``) when the optional extension is built."""
    descs = []
    for i, inp in enumerate(ext):
        if type(inp) is Var:
            d = var_desc(inp)
            if d is None:
                return None
            ext_index[inp] = i
            descs.append(d)
            continue
        v = inp.value
        if type(v) in SCALAR_TYPES:
            descs.append(("s", inp.dtype, inp.weak, scalar_code(v)))
        else:
            ext_index[id(v)] = i
            descs.append(("a", tuple(v.shape), inp.dtype))
    return descs


_ext_descs = _ext_descs_py if _compiled is None else _compiled.plan_ext


def signature(order, markers, seeds, trace, depth: int = 0):
    """``(key, frame)`` of the forward graph ``order`` (collected, topologically sorted) for a
    reverse pass from ``seeds`` to ``markers``; ``(None, None)`` when it cannot be planned."""
    scanned = _scan(order, markers, trace, Opaque)
    if scanned is None:
        return None, None
    fr = Frame(trace)
    fr.env, flags = scanned
    if _compiled is not None:  # the steps' flat key only (see _make_key)
        steps_key, _, fr.ext = encode_key(order, fr.pos)
    else:
        steps, _, fr.ext = encode(order, fr.pos)
    memo: dict = {}

    def var_desc(inp):
        m, j = inp
        if m.trace is not None:
            return None
        bshape = m.bdims[1] if m.bdims is not None else ()
        return ("x", node_avals(m, memo)[j], bshape, m.values is not None)

    ext_desc = _ext_descs(fr.ext, fr.ext_index, var_desc, _scalar_code)
    if ext_desc is None:
        return None, None
    seed_codes: list[tuple[Any, ...] | None] = []
    for t, ct in seeds:
        src = t._impl.src
        if src is None or ct is None:
            seed_codes.append(None)
            continue
        m, j = src
        b = fr.pos.get(m)
        if b is None:
            return None, None
        cimpl = ct._impl
        cref = cimpl.src
        if cref is not None and cref[0].trace is not None:
            return None, None
        key = cref if cref is not None else id(cimpl.value)
        s = fr.ext_index.get(key)
        if s is None:
            s = fr.ext_index[key] = len(fr.ext)
            fr.ext.append(cref if cref is not None else cimpl.lit)
        seed_codes.append((b + j, ~s, cimpl.shape, cimpl.dtype, cimpl.batch_shape))
    marker_slots = tuple(map(fr.pos.get, markers, itertools.repeat(-1, len(markers))))
    rest = ((flags, tuple(ext_desc)), marker_slots, tuple(seed_codes), depth)
    # hashed once: the plan cache hashes it on lookup and again when the pass is recorded
    if _compiled is not None:  # _make_key is FlatKey
        return FlatKey(rest, steps_key), fr
    return _make_key((tuple(steps), *rest)), fr


# Compiled: the key flattened (graph.FlatKey), the steps written flat straight from the nodes
# (graph.encode_key), so that a lookup compares contiguous arrays with the stored key instead of
# walking its hundreds of nested tuples (in a training step the stored key has left the
# processor's caches: about 4x faster there), and no step tuple is made. Pure Python keeps the
# nested key: flattening it there would cost more than it saves.
_make_key = FlatKey if _compiled is not None else _caches.HashedTuple


def lookup(key):
    """The plan recorded for ``key``; ``_UNPLANNABLE`` if recording failed; ``None`` if unseen."""
    with _S.lock:
        return _S.plans.get(key)


def is_plan(plan) -> bool:
    return plan is not None and plan is not _UNPLANNABLE


class Plan:
    """Recorded backward nodes plus where the per-marker cotangents are."""

    __slots__ = ("nodes", "literals", "outputs")

    def __init__(self, nodes, literals, outputs) -> None:
        # (prim, params, codes, first slot, traced, avals, bdims, wanted outputs) per node: the
        # encode step's parts, whether the node belongs to the trace, its output avals, its batch
        # layout, and the indices of its outputs that are cotangents (usually none). A code ~i
        # with i >= len(frame.ext) is literals[i - len(frame.ext)], a scalar a rule put in a node
        self.nodes = nodes
        self.literals = literals
        self.outputs = outputs  # (marker index, slot, shape, dtype, batch_shape)


def record(key, frame: Frame, markers, result: dict) -> None:
    """Record the nodes the reverse pass built (reachable from ``result``'s cotangents)."""
    plan = _record(frame, markers, result)
    with _S.lock:
        _S.recordings += 1
        _S.plans.put(key, plan if plan is not None else _UNPLANNABLE)


def _record(fr: Frame, markers, result: dict):
    trace = fr.trace
    new: dict = {}
    stack = []
    for ct in result.values():
        src = ct._impl.src
        if src is None:
            return None
        m = src[0]
        if m in fr.pos or src in fr.ext_index:
            return None  # a forward value or a seed itself: nothing was built
        if m in new:
            continue
        new[m] = None
        stack.append(m)
    while stack:
        n = stack.pop()
        if n.values is not None or (n.trace is not None and n.trace is not trace):
            return None
        assert n.inputs is not None  # a pending node
        for inp in n.inputs:
            if type(inp) is Var:
                m = inp[0]
                if m in fr.pos or inp in fr.ext_index or m in new:
                    continue
                new[m] = None
                stack.append(m)
    order = sorted(new, key=seq_of)  # created after its inputs: topological
    slot = dict(fr.pos)
    steps, _, ext = encode(order, slot, len(fr.env))
    # the backward nodes' external inputs: the frame's values, or scalars the rules made
    n_ext = len(fr.ext)
    to_frame = []
    literals: list = []
    for inp in ext:
        if type(inp) is Var:
            to_frame.append(fr.ext_index[inp])
        elif type(inp.value) in SCALAR_TYPES:
            to_frame.append(n_ext + len(literals))
            literals.append(inp)
        else:
            i = fr.ext_index.get(id(inp.value))
            if i is None:
                return None  # an array the forward graph does not read
            to_frame.append(i)
    steps = [
        (p, q, tuple(c if c >= 0 else ~to_frame[~c] for c in codes), b, k, d)
        for p, q, codes, b, k, d in steps
    ]
    outputs = []
    wanted: dict = {}  # backward node -> indices of its outputs that are cotangents
    for i, m in enumerate(markers):
        ct = result.get(m)
        if ct is None:
            continue
        impl = ct._impl
        n, j = impl.src
        outputs.append((i, slot[n] + j, impl.shape, impl.dtype, impl.batch_shape))
        wanted.setdefault(n, []).append(j)
    memo: dict = {}
    nodes = []
    for n, (prim, params, codes, base, _, _) in zip(order, steps):
        traced = trace is not None and n.trace is trace
        keep = tuple(sorted(set(wanted.get(n, ()))))
        nodes.append((prim, params, codes, base, traced, tuple(node_avals(n, memo)), n.bdims, keep))
    return Plan(tuple(nodes), tuple(literals), tuple(outputs))


def _replay_nodes_py(nodes, env: list, ext: list, trace, made: dict) -> None:
    """Build a plan's recorded nodes: each node's inputs from ``env`` (slot codes) and ``ext``
    (``~i`` codes), its outputs appended to ``env``, the cotangent outputs put in ``made``
    (slot -> impl). ``_replay_nodes`` is this function, or its compiled equivalent
    (core/_graphc.c's ``replay``) when the optional extension is built."""
    add = env.append
    for prim, params, codes, base, traced, avals, bdims, keep in nodes:
        refs = tuple([env[c] if c >= 0 else ext[~c] for c in codes])
        impls = bind_refs(prim, params, refs, avals, trace if traced else None, bdims)
        if len(impls) == 1:
            add(impls[0].src)
        else:
            env.extend([impl.src for impl in impls])
        for j in keep:
            made[base + j] = impls[j]


_replay_nodes = _replay_nodes_py if _compiled is None else _compiled.replay


def replay(plan: Plan, frame: Frame, markers) -> dict:
    """Build the recorded backward nodes on ``frame`` (with :func:`build.bind_refs`: the nodes
    the rules made, their metadata recorded); ``{marker: cotangent tensor}``."""
    _S.hits += 1
    made: dict = {}  # slot -> output impl (the cotangents, kept alive)
    _replay_nodes(plan.nodes, frame.env, frame.ext + list(plan.literals), frame.trace, made)
    # every recorded node leads to a cotangent (_record walks back from them), so the deepest
    # node is a cotangent's
    max_depth = max((impl.src[0].depth for impl in made.values()), default=0)
    marker_list = list(markers)
    result = {}
    for i, slot, shape, dtype, bd in plan.outputs:
        impl = made[slot]
        impl.shape, impl.dtype, impl.batch_shape = shape, dtype, bd
        result[marker_list[i]] = Tensor._wrap(impl)
    if max_depth > _config.get("max_graph_depth"):
        realize_impls(list(made.values()))
    return result

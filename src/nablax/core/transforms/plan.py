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

import threading
import weakref
from typing import Any

from ... import _caches, _config
from ..build import TensorImpl
from ..context import note_pending
from ..graph import SCALAR_TYPES, Const, Node, seq_of, split_ref
from ..realize import realize_impls
from ..tensor import Tensor
from .trace import Opaque, input_aval

_MAX_PLANS = 256


class _State:
    def __init__(self) -> None:
        self.plans = _caches.Cache("autodiff.plans", lambda: _MAX_PLANS, register=False)
        self.hits = 0
        self.recordings = 0
        self.lock = threading.Lock()  # the LRU is shared by every thread's transforms


_S = _State()
_UNPLANNABLE = object()


def _dead_ref() -> weakref.ref:
    class _Gone:
        pass

    return weakref.ref(_Gone())  # its referent is collected at once: a weakref that yields None


_DEAD = _dead_ref()


def plan_info() -> tuple[int, int, int]:
    """(plans stored, replays, recordings) — for tests and benchmarks."""
    return len(_S.plans), _S.hits, _S.recordings


def clear_plans() -> None:
    with _S.lock:
        _S.plans.clear()
        _S.hits = _S.recordings = 0


_caches.register("autodiff.plans", _S.plans.info, clear_plans)


class _Lit:
    """A literal node input of a recorded node (a Python scalar or a ``Const``)."""

    __slots__ = ("v",)

    def __init__(self, v) -> None:
        self.v = v


def _scalar_code(v):
    t = type(v)
    if t is float:
        return (t, v.hex())  # tells 0.0 from -0.0, and NaN equals NaN
    if t is complex:
        return (t, v.real.hex(), v.imag.hex())
    return (t, v)


class Frame:
    """The slots of one forward graph: ``env[slot]`` is a node-input reference (a ``Node``,
    ``(node, index)`` or a leaf array), ``depths[slot]`` its depth."""

    __slots__ = ("env", "depths", "pos", "ext_nodes", "ext_ids", "trace")

    def __init__(self, trace) -> None:
        self.env: list = []
        self.depths: list = []
        self.pos: dict = {}  # forward node -> slot of its first output
        self.ext_nodes: dict = {}  # (node, index) outside the forward graph -> slot
        self.ext_ids: dict = {}  # id(leaf array) -> slot
        self.trace = trace


def signature(order, markers, seeds, trace, depth: int = 0):
    """``(key, frame)`` of the forward graph ``order`` (collected, topologically sorted) for a
    reverse pass from ``seeds`` to ``markers``; ``(None, None)`` when it cannot be planned."""
    fr = Frame(trace)
    env, depths, pos = fr.env, fr.depths, fr.pos
    memo: dict = {}
    parts: list[tuple[Any, ...]] = []
    for n in order:
        if n.trace is not trace:
            return None, None
        if n.params and type(n.params[-1]) is Opaque:
            return None, None  # a user-defined rule (custom_vjp's bwd) runs on every pass
        codes = []
        for k, inp in enumerate(n.inputs):
            t = type(inp)
            if t is Node or t is tuple:
                m, j = (inp, 0) if t is Node else inp
                b = pos.get(m)
                if b is not None:
                    codes.append(b + j)
                    continue
                s = fr.ext_nodes.get((m, j))
                if s is None:
                    if m.trace is not None:
                        return None, None
                    s = fr.ext_nodes[(m, j)] = len(env)
                    env.append(inp)
                    depths.append(m.depth)
                    bshape = m.bdims[1] if m.bdims is not None else ()
                    parts.append(("x", input_aval(inp, n, memo, k), bshape, m.values is not None))
                codes.append(s)
            elif t in SCALAR_TYPES:
                codes.append(_scalar_code(inp))
            elif t is Const:
                codes.append(("c", inp.dtype, _scalar_code(inp.value)))
            else:
                s = fr.ext_ids.get(id(inp))
                if s is None:
                    s = fr.ext_ids[id(inp)] = len(env)
                    env.append(inp)
                    depths.append(0)
                    parts.append(("a", tuple(inp.shape), inp.dtype))
                codes.append(s)
        pos[n] = len(env)
        nout = len(n.outs)
        if n.prim.multiple_results:
            env.extend((n, j) for j in range(nout))
        else:
            env.append(n)
        depths.extend([n.depth] * nout)
        parts.append(
            (n.prim, n.params, tuple(codes), n.bdims, nout, n.values is not None, n in markers)
        )
    marker_slots = tuple(pos.get(m, -1) for m in markers)
    seed_codes: list[tuple[Any, ...] | None] = []
    for t, ct in seeds:
        src = t._impl.src
        if src is None or ct is None:
            seed_codes.append(None)
            continue
        m, j = (src, 0) if type(src) is Node else src
        b = pos.get(m)
        if b is None:
            return None, None
        cimpl = ct._impl
        cref = cimpl.src if cimpl.src is not None else cimpl.value
        cr = split_ref(cref)
        if cr is not None:
            cm = cr[0]
            if cm.trace is not None:
                return None, None
            key = (cm, cr[1])
            s = fr.ext_nodes.get(key)
            if s is None:
                s = fr.ext_nodes[key] = len(env)
                env.append(cref)
                depths.append(cm.depth)
        else:
            s = fr.ext_ids.get(id(cref))
            if s is None:
                s = fr.ext_ids[id(cref)] = len(env)
                env.append(cref)
                depths.append(0)
        seed_codes.append((b + j, s, cimpl.shape, cimpl.dtype, cimpl.batch_shape))
    return (tuple(parts), marker_slots, tuple(seed_codes), depth), fr


def lookup(key):
    """The plan recorded for ``key``; ``_UNPLANNABLE`` if recording failed; ``None`` if unseen."""
    with _S.lock:
        return _S.plans.get(key)


def is_plan(plan) -> bool:
    return plan is not None and plan is not _UNPLANNABLE


class Plan:
    """Recorded backward nodes plus where the per-marker cotangents are."""

    __slots__ = ("nodes", "outputs")

    def __init__(self, nodes, outputs) -> None:
        self.nodes = nodes  # encode_node tuples
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
        m, j = (src, 0) if type(src) is Node else src
        if m in fr.pos or (m, j) in fr.ext_nodes:
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
            t = type(inp)
            if t is Node or t is tuple:
                m, j = (inp, 0) if t is Node else inp
                if m in fr.pos or (m, j) in fr.ext_nodes or m in new:
                    continue
                new[m] = None
                stack.append(m)
    slot_of: dict = {}
    n_slots = len(fr.env)
    nodes = []
    for n in sorted(new, key=seq_of):  # created after its inputs: topological
        codes = []
        for inp in n.inputs:
            t = type(inp)
            if t is Node or t is tuple:
                m, j = (inp, 0) if t is Node else inp
                b = fr.pos.get(m)
                if b is None:
                    b = slot_of.get(m)
                if b is not None:
                    codes.append(b + j)
                else:
                    codes.append(fr.ext_nodes[(m, j)])
            elif t in SCALAR_TYPES or t is Const:
                codes.append(_Lit(inp))
            else:
                s = fr.ext_ids.get(id(inp))
                if s is None:
                    return None  # an array the forward graph does not read
                codes.append(s)
        slot_of[n] = n_slots
        n_slots += len(n.outs)
        nodes.append(encode_node(n, codes, trace))
    outputs = []
    for i, m in enumerate(markers):
        ct = result.get(m)
        if ct is None:
            continue
        impl = ct._impl
        src = impl.src
        n, j = (src, 0) if type(src) is Node else src
        outputs.append((i, slot_of[n] + j, impl.shape, impl.dtype, impl.batch_shape))
    return Plan(tuple(nodes), tuple(outputs))


def encode_node(n: Node, codes: list, trace) -> tuple:
    """A recorded node: ``codes`` holds an int slot or a :class:`_Lit` per input; ``trace``: the
    trace the replayed node joins when ``n`` belongs to it (``None``: never traced)."""
    traced = trace is not None and n.trace is trace
    int_codes = tuple(c for c in codes if type(c) is int)
    return (
        n.prim,
        n.params,
        tuple(codes),
        int_codes,
        len(n.outs),
        n.prim.multiple_results,
        traced,
        n.avals if traced else None,
        n.bdims,
        len(int_codes) != len(codes),  # has literal inputs
    )


def build_nodes(nodes, env: list, depths: list, trace, built: dict | None = None) -> int:
    """Create the recorded ``nodes`` (from :func:`encode_node`) in order, appending their output
    references to ``env`` and depths to ``depths`` (and each node to ``built``); returns the
    largest depth. Outputs start with dead weak references: see :func:`bind_output`."""
    dead = _DEAD
    get = env.__getitem__
    dget = depths.__getitem__
    max_depth = 0
    for prim, params, codes, int_codes, nout, multi, traced, avals, bdims, lits in nodes:
        if lits:
            refs = tuple([get(c) if type(c) is int else c.v for c in codes])
        else:
            refs = tuple(map(get, codes))
        if len(int_codes) == 1:
            d = dget(int_codes[0]) + 1
        else:
            d = max(map(dget, int_codes), default=0) + 1
        node = Node(prim, params, refs, d, trace if traced else None)
        if traced:
            node.avals = avals
        if bdims is not None:
            node.bdims = bdims
        if built is not None:
            built[node] = None
        if nout == 1:
            node.outs = (dead,)
            env.append((node, 0) if multi else node)
            depths.append(d)
        else:
            node.outs = (dead,) * nout
            env.extend((node, j) for j in range(nout))
            depths.extend([d] * nout)
        if d > max_depth:
            max_depth = d
    return max_depth


def bind_output(ref, shape, dtype, batch_shape=()) -> TensorImpl:
    """A pending tensor for the node output ``ref`` built by :func:`build_nodes`."""
    impl = TensorImpl(ref, None, shape, dtype, batch_shape)
    node, j = (ref, 0) if type(ref) is Node else ref
    outs = list(node.outs)
    outs[j] = weakref.ref(impl)
    node.outs = tuple(outs)
    return impl


def replay(plan: Plan, frame: Frame, markers) -> dict:
    """Build the recorded backward nodes on ``frame``; ``{marker: cotangent tensor}``."""
    _S.hits += 1
    env = frame.env
    max_depth = build_nodes(plan.nodes, env, frame.depths, frame.trace)
    marker_list = list(markers)
    result = {}
    made: dict = {}
    for i, slot, shape, dtype, bd in plan.outputs:
        impl = made.get(slot)
        if impl is None:
            ref = env[slot]
            impl = made[slot] = bind_output(ref, shape, dtype, bd)
            note_pending(src_out(ref))
        result[marker_list[i]] = Tensor._wrap(impl)
    if max_depth > _config.get("max_graph_depth"):
        realize_impls(list(made.values()))
    return result


def src_out(ref) -> weakref.ref:
    """The weak reference to the tensor of node output ``ref``."""
    return ref.outs[0] if type(ref) is Node else ref[0].outs[ref[1]]

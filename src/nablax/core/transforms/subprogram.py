"""Staging a sub-program into one graph node: the machinery of ``nx.shard_map``'s node.

Code runs on *placeholders* (behind markers of a private differentiation trace, so derivative
passes can walk what it built later); :meth:`Stage.finish` cuts the sub-graph that depends on
them out of the lazy graph, turns every outside value it reads into one more input (closure
conversion: the transforms around the node then see those values), and encodes it as a
:class:`Body`: hashable by structure, with :meth:`Body.run` as its lowering. Derivative rules stage
new bodies on the same placeholders (:meth:`Stage.reuse`), so a backward body recomputes the
forward values it needs from the node's inputs.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ..build import bind_known
from ..graph import (
    SCALAR_TYPES,
    Literal,
    Node,
    Var,
    _next_seq,
    encode,
    end_trace,
    run_steps,
    seq_of,
)
from ..prims._batch import to_full_batch
from ..sharding import DeviceMesh, ShardingSpec, named_layout, propagate
from ..tensor import Tensor
from .staging import _Tracing, compile_input_p, forget_traced
from .trace import mark, marker_of, node_avals, open_trace


class _In:
    """A tensor input of a body: its placeholder node, the marker node the function sees (where
    derivative passes stop), its physical batch shape, its logical spec (None: unconstrained)
    and, while staging, the captured array it stands for (where the plan starts from)."""

    __slots__ = ("ph", "marker", "bshape", "spec", "hint")

    def __init__(self, ph: Node, marker: Node, bshape: tuple, spec) -> None:
        self.ph, self.marker, self.bshape, self.spec = ph, marker, bshape, spec
        self.hint = None

    @property
    def aval(self) -> tuple:
        return self.ph.params[0], self.ph.params[1]


class Body:
    """A staged sub-program (the parameter of a ``shard_map_call`` node). Equal bodies have the
    same structure, so they lower to the same program; each keeps its own sub-graph for the
    derivative rules."""

    __slots__ = (
        "key",
        "_hash",
        "mesh",
        "ins",
        "outs",
        "out_avals",
        "out_bshape",
        "lits",
        "plan",
        "in_sh",
        "out_sh",
        "steps",
        "n_slots",
        "out_codes",
        "out_bds",
    )

    key: tuple[Any, ...]  # the structure: equal keys lower to the same program
    _hash: int
    mesh: DeviceMesh
    ins: list[_In]
    outs: list[Var]  # the sub-graph's outputs
    out_avals: tuple[tuple[Any, Any], ...]  # logical (shape, dtype) per output
    out_bshape: tuple[Any, ...]  # the batch shape of the node's outputs
    lits: list[tuple[Any, np.dtype]]  # (value, dtype) of each scalar input, after the tensors
    plan: list[ShardingSpec | None]  # logical spec per output (None: unconstrained)
    in_sh: tuple[Any, ...]  # NamedSharding (or None) per tensor input
    out_sh: tuple[Any, ...]  # NamedSharding (or None) per output
    steps: tuple[tuple[Any, ...], ...]  # graph.encode's steps (scalar inputs: codes ~i, lits[i])
    n_slots: int
    out_codes: tuple[int, ...]
    out_bds: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        return other is self or (
            type(other) is Body and other._hash == self._hash and other.key == self.key
        )

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"Body(<{len(self.steps)} ops>, {self.mesh!r})"

    def layouts(self) -> tuple:
        return tuple(
            s.layout() if s is not None else ((),) * len(shape)
            for s, (shape, _) in zip(self.plan, self.out_avals)
        )

    def run(self, xs):
        """The lowering: constrained inputs -> the sub-graph's lowerings -> constrained outputs."""
        n_in = len(self.ins)
        env = [None] * self.n_slots
        for k, (v, s) in enumerate(zip(xs, self.in_sh)):
            env[k] = v if s is None else jax.lax.with_sharding_constraint(v, s)
        run_steps(self.steps, env, xs[n_in:])
        outs = []
        for c, b, s in zip(self.out_codes, self.out_bds, self.out_sh):
            v = to_full_batch(env[c], b, self.out_bshape)
            outs.append(v if s is None else jax.lax.with_sharding_constraint(v, s))
        return tuple(outs)


# ---- staging a body --------------------------------------------------------------------------


class Stage:
    """Context of one body being staged: placeholders, their markers, the private trace."""

    def __init__(self) -> None:
        self.ins: list = []
        self.captured: list = []  # node inputs (outside refs) of the captured tensors

    def __enter__(self) -> Stage:
        self._tracing = _Tracing()
        self._tracing.__enter__()
        self._open = open_trace()
        self.trace = self._open.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._open.__exit__(*exc)
        end_trace(self.trace)
        self._tracing.__exit__(*exc)
        forget_traced([i.ph for i in self.ins])  # never part of an eager program

    def add(self, shape: tuple, dtype, bshape: tuple, spec) -> Tensor:
        """A new input: the marked placeholder tensor the staged code sees."""
        bdims = ((), bshape) if bshape else None
        params = (shape, dtype, len(self.ins))
        (impl,) = bind_known(compile_input_p, (), params, ((shape, dtype),), bdims=bdims)
        m = mark(Tensor._wrap(impl), self.trace)
        self.ins.append(_In(impl.src[0], marker_of(m), bshape, spec))
        return m

    def reuse(self, ins) -> None:
        """The inputs of a body whose sub-graph this one builds on (derivative bodies)."""
        self.ins.extend(ins)

    def finish(self, outs: list, mesh: DeviceMesh, out_specs) -> Body:
        """The body computing ``outs`` from the inputs; ``out_specs``: one logical spec (or
        None: unconstrained) per output, or None to infer the plan."""
        lo = min(i.ph.seq for i in self.ins) if self.ins else _next_seq()
        roots = [t._impl.src[0] for t in outs if t._impl.src is not None]
        dep, order = _dependent(roots, [i.ph for i in self.ins], lo)
        capture = _Captures(self, dep, lo)
        out_refs = []
        for t in outs:
            impl = t._impl
            r = impl.src
            if r is not None and dep.get(r[0]):
                out_refs.append(r)
            else:  # not computed from the inputs: passed in (and out) as an input
                nb = len(impl.batch_shape)
                m = capture(impl.ref, impl.shape, impl.dtype, impl.batch_shape, nb)
                out_refs.append(Var((m, 0)))
        for n in order:
            if any(type(i) is not Var or not dep[i[0]] for i in n.inputs):
                n.inputs = tuple(capture.convert(n, k, i) for k, i in enumerate(n.inputs))
        order = sorted(order + capture.markers(), key=seq_of)
        return _make_body(self.ins, order, out_refs, outs, mesh, out_specs)


def _dependent(roots, phs, lo) -> tuple[dict, list]:
    """``({node: depends on a placeholder}, dependent nodes in creation order)``; nodes created
    before the first placeholder cannot depend on it and are not walked past."""
    dep: dict = dict.fromkeys(phs, True)
    order = []
    stack = list(roots)
    while stack:
        n = stack[-1]
        if n in dep:
            stack.pop()
            continue
        if n.seq < lo or n.inputs is None or n.values is not None:
            dep[n] = False
            stack.pop()
            continue
        todo = [i[0] for i in n.inputs if type(i) is Var and i[0] not in dep]
        if todo:
            stack.extend(todo)
            continue
        d = any(dep[i[0]] for i in n.inputs if type(i) is Var)
        dep[n] = d
        if d:
            order.append(n)
        stack.pop()
    return dep, sorted(order, key=seq_of)


class _Captures:
    """Closure conversion: each outside value the sub-graph reads becomes a new input."""

    def __init__(self, stage: Stage, dep: dict, lo) -> None:
        self.stage, self.dep, self.lo = stage, dep, lo
        self.by_key: dict = {}
        self.made: list = []
        self.memo: dict = {}

    def __call__(self, ref, shape, dtype, bshape, nb) -> Node:
        """The marker node of the new input standing for ``ref`` (a ``Var`` or an array
        ``Literal``; one input per distinct value)."""
        key = ref if type(ref) is Var else (id(ref.value), nb)
        marker = self.by_key.get(key)
        if marker is None:
            m = self.stage.add(shape, dtype, bshape, None)
            marker = self.by_key[key] = marker_of(m)
            self.made.append(self.stage.ins[-1])
            if type(ref) is Literal:
                self.made[-1].hint = ref.value
            self.stage.captured.append(ref)
        return marker

    def convert(self, n: Node, k: int, inp):
        """Input ``k`` of ``n`` in the body: itself if computed in the body or a scalar, else
        (the output of) a new input's marker."""
        if type(inp) is Var:
            m, j = inp
            if self.dep[m]:
                return inp
            shape, dtype = node_avals(m, self.memo)[j]
            bshape = m.bdims[1] if m.bdims is not None else ()
            return Var((self(inp, shape, dtype, bshape, len(bshape)), 0))
        v = inp.value
        if type(v) in SCALAR_TYPES:
            return inp
        nb = n.bdims[0][k] if n.bdims is not None else 0
        shape = tuple(v.shape)
        return Var((self(inp, shape[nb:], np.dtype(v.dtype), shape[:nb], nb), 0))

    def markers(self) -> list:
        """The new markers, renumbered to come before every node of the sub-graph (their
        consumers), keeping the creation order topological."""
        n = len(self.made)
        for k, i in enumerate(self.made):
            i.ph.seq = self.lo - 1 + (2 * k + 1) / (2 * n + 2)
            i.marker.seq = self.lo - 1 + (2 * k + 2) / (2 * n + 2)
        return [i.marker for i in self.made]


def common_batch(shapes) -> tuple:
    """The batch shape of values with batch shapes ``shapes`` (aligned at the front; a size-1
    axis stretches)."""
    out: list = []
    for b in shapes:
        for k, d in enumerate(b):
            if k == len(out):
                out.append(d)
            elif out[k] == 1:
                out[k] = d
    return tuple(out)


def _make_body(ins, order, out_refs, outs, mesh, out_specs) -> Body:
    b = object.__new__(Body)
    b.mesh, b.ins = mesh, list(ins)
    b.outs = out_refs
    b.out_avals = tuple((t.shape, t.dtype) for t in outs)
    bshapes = [t._impl.batch_shape for t in outs]
    b.out_bshape = common_batch(bshapes)
    b.out_bds = tuple(len(s) for s in bshapes)
    slot = {i.ph: k for k, i in enumerate(b.ins)}
    steps, n, ext = encode(order, slot, len(b.ins))
    # every outside value is an input by now (closure conversion): only scalars are external
    assert all(type(i) is Literal and type(i.value) in SCALAR_TYPES for i in ext), ext
    b.steps, b.n_slots = tuple(steps), n
    b.lits = [(i.value, np.dtype(i.dtype)) for i in ext]
    b.out_codes = tuple(slot[m] + j for m, j in out_refs)
    if out_specs is None:
        given = {i.ph: _input_layout(i, mesh) for i in b.ins}
        b.plan = [
            ShardingSpec.from_layout(mesh, lay) for lay in propagate(order, out_refs, mesh, given)
        ]
    else:
        b.plan = list(out_specs)
    for i in b.ins:
        i.hint = None  # the captured array is a node input; the body does not keep it
    b.in_sh = tuple(i.spec.named(len(i.bshape)) if i.spec is not None else None for i in b.ins)
    nb = len(b.out_bshape)
    b.out_sh = tuple(s.named(nb) if s is not None else None for s in b.plan)
    b.key = (
        b.steps,
        tuple((i.aval, i.bshape) for i in b.ins),
        tuple(d for _, d in b.lits),
        b.out_codes,
        b.out_bds,
        b.out_bshape,
        b.in_sh,
        b.out_sh,
    )
    b._hash = hash(b.key)
    return b


def _input_layout(i: _In, mesh) -> tuple:
    if i.spec is not None:
        return i.spec.layout()
    rank = len(i.aval[0])
    if i.hint is not None:  # a captured array laid out over the mesh keeps its layout
        lay = named_layout(i.hint, mesh, rank, len(i.bshape))
        if lay is not None:
            return lay
    return ((),) * rank

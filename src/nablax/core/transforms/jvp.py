"""Forward mode: ``nx.jvp`` and ``nx.jacfwd``.

The forward pass walks the traced nodes between the transform's markers and the outputs in
topological order and applies each primitive's ``jvp`` rule (lazy nablax ops, so tangents can be
differentiated again: ``jvp(grad(f))`` gives Hessian-vector products).
"""

from __future__ import annotations

from collections.abc import Callable

from ... import tree as _tree
from ..context import CTX
from ..graph import end_trace, gc_paused
from ..ops.creation import zeros_like
from ..tensor import Tensor
from .trace import (
    LazyOutputs,
    collect,
    depends,
    is_float,
    mark,
    marker_of,
    open_trace,
    ref_key,
    tensor_of,
)
from .vjp import _fname, _out_tensors, _split_aux, check_readable


def forward_pass(outputs, tangents: dict) -> list:
    """Tangents of ``outputs`` (tensors) given ``{marker_node: tangent}``; None where zero."""
    roots = [t._impl.src[0] for t in outputs if t._impl.src is not None]
    markers = set(tangents)
    order = collect(roots, markers)
    dep = depends(order, markers)
    tan: dict = {(m, 0): t for m, t in tangents.items()}
    memo: dict = {}
    # rules compute in their forward node's dtypes, never under nx.autocast (core/autocast.py)
    saved_autocast, CTX.autocast = CTX.autocast, None
    try:
        _run_jvp_rules(order, dep, markers, tan, memo)
    finally:
        CTX.autocast = saved_autocast
    result = []
    for t in outputs:
        src = t._impl.src
        result.append(None if src is None else tan.get(src))
    return result


def _run_jvp_rules(order, dep, markers, tan: dict, memo: dict) -> None:
    for n in order:
        if n not in dep or n in markers:
            continue
        refs = n.inputs
        assert refs is not None  # traced nodes keep their inputs while their trace is alive
        tins = [tan.get(ref_key(inp)) if ref_key(inp) is not None else None for inp in refs]
        if all(t is None for t in tins):
            continue
        ins = [tensor_of(inp, n, memo, k) for k, inp in enumerate(refs)]
        touts = n.prim.rule("jvp")(n.params, tins, ins, LazyOutputs(n, memo))
        for j, t in enumerate(touts):
            if t is not None:
                tan[(n, j)] = t


def jvp(f: Callable, primals, tangents, has_aux: bool = False):
    """``(f(*primals), J·tangents)``, as ``jax.jvp`` (``primals``/``tangents``: same structure).

    With ``has_aux=True``, ``f`` returns ``(output, aux)`` and the result is
    ``(output, tangent_out, aux)``; ``aux`` is returned as it is, not differentiated.

    >>> import nablax as nx
    >>> out, t = nx.jvp(lambda x: x ** 2, (nx.tensor(3.0),), (nx.tensor(1.0),))
    >>> out.item(), t.item()
    (9.0, 6.0)
    >>> out, t, aux = nx.jvp(lambda x: (x ** 2, {"x": x}), (nx.tensor(3.0),), (nx.tensor(1.0),),
    ...                      has_aux=True)
    >>> t.item(), aux["x"].item()
    (6.0, 3.0)
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError(
            "nx.jvp: primals and tangents must be tuples (one entry per positional argument), "
            f"got {type(primals).__name__} and {type(tangents).__name__}"
        )
    if len(primals) != len(tangents):
        raise ValueError(
            f"nx.jvp: {len(primals)} primal(s) but {len(tangents)} tangent(s) for {_fname(f)}"
        )
    p_leaves, p_def = _tree.flatten(tuple(primals))
    t_leaves, t_def = _tree.flatten(tuple(tangents))
    if p_def != t_def:
        raise ValueError(
            f"nx.jvp: tangents have structure {t_def}, primals have {p_def} ({_fname(f)})"
        )
    paths = [p for p, _ in _tree.leaves_with_path(tuple(primals), prefix="primals")]
    with gc_paused(), open_trace() as trace:
        try:
            marked, tmap = [], {}
            for path, p, t in zip(paths, p_leaves, t_leaves):
                p = p if isinstance(p, Tensor) else Tensor(p)
                t = t if isinstance(t, Tensor) else Tensor(t, p.dtype)
                if t.shape != p.shape:
                    raise ValueError(
                        f"nx.jvp: tangent for {path} has shape {t.shape}, primal has {p.shape}"
                    )
                if not is_float(p.dtype):
                    marked.append(p)  # integer primals have no tangent
                    continue
                if t.dtype != p.dtype:
                    raise TypeError(
                        f"nx.jvp: tangent for {path} has dtype {t.dtype}, primal has {p.dtype}"
                    )
                m = mark(p, trace)
                tmap[marker_of(m)] = t
                marked.append(m)
            out, aux = _split_aux("jvp", f, f(*_tree.unflatten(p_def, marked)), has_aux)
            leaves, treedef = _out_tensors("jvp", f, out)
            touts = forward_pass(leaves, tmap)
        finally:
            end_trace(trace)
    t_out = [
        zeros_like(o) if t is None else check_readable("jvp", f, f"the tangent of output {i}", t)
        for i, (o, t) in enumerate(zip(leaves, touts))
    ]
    t_out = _tree.unflatten(treedef, t_out)
    return (out, t_out, aux) if has_aux else (out, t_out)

"""Control flow: ``nx.cond``, ``nx.switch``, ``nx.while_loop``, ``nx.fori_loop`` and ``nx.scan``.

Same signatures and semantics as ``jax.lax``. Each call records ONE graph node, whatever its trip
count: the branches and bodies run once per call (eager means eager) on logical placeholders and
are staged into sub-graphs (core/transforms/cf_stage.py); the node lowers to the matching
``jax.lax`` primitive. Outside tensors a body reads become inputs of the node, so gradients reach
them. Every transform sees an ordinary primitive:

- **vmap**: ``jax.vmap`` of the lowering, so a batched predicate turns ``cond`` into a select of
  both branches and ``while_loop`` runs until every example is done, as in JAX;
- **grad / vjp / jvp**: JAX's derivatives of the lowering (``prims._rules.derived_from_jax``),
  whose nodes have the same rules again, so any order works. ``while_loop`` is forward-mode only,
  as in JAX: its reverse mode raises an error naming ``fori_loop`` and ``scan``;
- **compile**: the node is recorded like any other, so both branches are traced once and compiled
  into one program; **shard_map**: the node is replicated within the mapped function.

>>> import nablax as nx
>>> nx.cond(nx.tensor(2.0) > 1, lambda x: x * 10, lambda x: x, nx.tensor(3.0)).item()
30.0
>>> carry, ys = nx.scan(lambda c, x: (c + x, c * x), 0.0, nx.arange(1.0, 4.0))
>>> carry.item(), ys.tolist()
(6.0, [0.0, 2.0, 9.0])
>>> nx.while_loop(lambda i: i < 10, lambda i: i * 2, 1).item()
16
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import tree as _tree
from ..graph import Literal
from ..primitive import primitive
from ..prims._rules import derived_from_jax, is_float_tensor
from ..tensor import Tensor
from .cf_residuals import Residuals, residuals_for, vjp_from_residuals, with_residuals
from .cf_stage import Staged, add_node, as_tensor, fname, needs_residuals, stage
from .subprogram import Body

# ---- the primitives ----------------------------------------------------------------------------


def _custom_inside(bodies) -> str | None:
    """The name of a custom_vjp function staged in ``bodies`` (nested bodies included), if any:
    JAX's derivative of the lowering would not call its ``bwd``."""
    for b in bodies:
        for step in b.steps:
            if step[0].name == "custom_vjp_call":
                return fname(step[1][2].obj.fn.fun)
            found = _custom_inside(_bodies(step[1]))
            if found:
                return found
    return None


def _bodies(params) -> list:
    return [p for p in params if isinstance(p, Body)] + [
        q for p in params if isinstance(p, tuple) for q in p if isinstance(q, Body)
    ]


def _rules(kind: str, reverse: bool = True):
    """JAX-derived rules, after the checks that make them sound for ``kind``."""

    def factory(prim) -> dict:
        base = derived_from_jax(prim)

        def check(params, mode):
            name = _custom_inside(_bodies(params))
            if name is not None:
                raise NotImplementedError(
                    f"nx.{kind}: differentiating through the custom_vjp function {name} inside "
                    f"nx.{kind} is not supported yet (its bwd would not be used). Fix: call it "
                    f"outside the {kind}, or differentiate the plain function"
                )

        def vjp(params, cts, primals, outs):
            if any(c is not None for c in cts) and any(is_float_tensor(p) for p in primals):
                if not reverse:
                    raise ValueError(
                        "nx.while_loop: reverse-mode differentiation (nx.grad, nx.vjp, "
                        "backward()) does not work through nx.while_loop, whose trip count is "
                        "only known at run time (as in JAX). Fix: use nx.fori_loop with "
                        "Python-int bounds or nx.scan with a fixed length, or forward mode "
                        "(nx.jvp, nx.jacfwd)"
                    )
                check(params, "vjp")
            if isinstance(params[-1], Residuals):  # built with its residuals
                got = vjp_from_residuals(params, cts, primals, outs)
                if got is not None:
                    return got
            return base["vjp"](params, cts, primals, outs)

        def jvp(params, tangents, primals, outs):
            if any(t is not None for t in tangents):
                check(params, "jvp")
            return base["jvp"](params, tangents, primals, outs)

        return {"vjp": vjp, "jvp": jvp, "batch": base["batch"], "shard": base["shard"]}

    return factory


def _split(xs, counts):
    out, k = [], 0
    for n in counts:
        out.append(tuple(xs[k : k + n]))
        k += n
    return out


def _control_node(prim, base: tuple, refs, bshapes, in_avals, out_avals) -> list:
    """Add a scan/cond node (``base`` parameters); under a differentiation trace it also
    outputs the residuals its backward pass needs (cf_residuals.py), which are not returned."""
    res = None
    if needs_residuals(refs):
        constant = [type(r) is Literal and r.is_scalar for r in refs]
        res = residuals_for(prim, base + (None,), in_avals, constant)
    avals = list(out_avals) + (list(res.avals) if res is not None else [])
    return add_node(prim, base + (res,), refs, bshapes, avals)[: len(out_avals)]


def _res_avals(params) -> tuple:
    return params[-1].avals if params[-1] is not None else ()


def _cond_lower(params, index, *xs):
    bodies, counts = params[:2]
    segs = _split(xs, counts)
    if index.dtype == jnp.bool_:
        index = index.astype(jnp.int32)
    branches = [(lambda s, b=b, k=k: tuple(b.run(s[k]))) for k, b in enumerate(bodies)]
    return tuple(lax.switch(index, branches, segs))


cond_p = primitive(
    "cond",
    lambda params, *avals: tuple(params[0][0].out_avals) + _res_avals(params),
    with_residuals(_cond_lower),
    rules=_rules("cond"),
    multiple_results=True,
    doc="One nx.cond / nx.switch call: the index, then each branch's inputs (lax.switch); "
    "under a differentiation trace, residual outputs follow.",
)


def _while_lower(params, *xs):
    cb, bb, nc, ncc = params
    cc, bc = tuple(xs[nc : nc + ncc]), tuple(xs[nc + ncc :])
    return tuple(
        lax.while_loop(lambda c: cb.run(c + cc)[0], lambda c: tuple(bb.run(c + bc)), tuple(xs[:nc]))
    )


while_p = primitive(
    "while_loop",
    lambda params, *avals: tuple(avals[: params[2]]),
    _while_lower,
    rules=_rules("while_loop", reverse=False),
    multiple_results=True,
    doc="One nx.while_loop call: the carry, then cond_fun's and body_fun's inputs.",
)


def _scan_abstract(params, *avals):
    b, nc, _, length = params[:4]
    ys = tuple(((length,) + tuple(s), d) for s, d in b.out_avals[nc:])
    return tuple(b.out_avals[:nc]) + ys + _res_avals(params)


def _scan_lower(params, *xs):
    b, nc, nxs, length, reverse, unroll = params[:6]
    consts = tuple(xs[nc + nxs :])

    def step(c, x):
        out = b.run(c + x + consts)
        return tuple(out[:nc]), tuple(out[nc:])

    c, ys = lax.scan(step, tuple(xs[:nc]), tuple(xs[nc : nc + nxs]), length, reverse, unroll)
    return tuple(c) + tuple(ys)


scan_p = primitive(
    "scan",
    _scan_abstract,
    with_residuals(_scan_lower),
    rules=_rules("scan"),
    multiple_results=True,
    doc="One nx.scan / nx.fori_loop call: the carry, the scanned xs, then the body's inputs; "
    "under a differentiation trace, residual outputs follow.",
)


def _checkpoint_lower(params, *xs):
    body, prevent_cse = params
    return tuple(jax.checkpoint(lambda *a: tuple(body.run(a)), prevent_cse=prevent_cse)(*xs))


checkpoint_p = primitive(
    "checkpoint",
    lambda params, *avals: tuple(params[0].out_avals),
    _checkpoint_lower,
    rules=_rules("checkpoint"),
    multiple_results=True,
    doc="One call of an nx.checkpoint function (checkpoint.py): its body, recomputed in the "
    "backward pass (jax.checkpoint).",
)


# ---- checks with clear errors --------------------------------------------------------------------


def _out_paths(out_def, prefix: str) -> list[str]:
    n = out_def.num_leaves
    return [p for p, _ in _tree.leaves_with_path(_tree.unflatten(out_def, list(range(n))), prefix)]


def _fmt(aval) -> str:
    shape, dtype = aval
    return f"{np.dtype(dtype).name}{list(shape)}"


def _check_carry(what: str, f, got_def, got_avals, want_def, want_avals, prefix: str) -> None:
    if got_def != want_def:
        raise TypeError(
            f"nx.{what}: {fname(f)} must return a carry with the structure of the initial "
            f"value; it returned {got_def}, the initial value is {want_def}. Fix: return the "
            f"same pytree (same containers and keys) every iteration"
        )
    for path, g, w in zip(_out_paths(want_def, prefix), got_avals, want_avals):
        if (tuple(g[0]), np.dtype(g[1])) != (tuple(w[0]), np.dtype(w[1])):
            raise TypeError(
                f"nx.{what}: {fname(f)} changes the carry {path} from {_fmt(w)} (its initial "
                f"value) to {_fmt(g)}. The shape and dtype of a carry must not change between "
                f"iterations. Fix: keep it {_fmt(w)} (e.g. .astype(...) or an initial value of "
                f"the right dtype/shape)"
            )


def _leaves(tree, what: str, prefix: str) -> tuple[list[Tensor], object]:
    flat, treedef = _tree.flatten(tree)
    paths = [p for p, _ in _tree.leaves_with_path(tree, prefix)]
    return [as_tensor(v, what, p) for p, v in zip(paths, flat)], treedef


def _scalar_index(x, what: str, arg: str, want_bool: bool) -> Tensor:
    t = as_tensor(x, what, arg)
    if t.shape != ():
        raise TypeError(
            f"nx.{what}: {arg} must be a scalar, got shape {list(t.shape)}. Fix: reduce it "
            f"(.any(), .all(), [i]) or use nx.where for element-wise choices"
        )
    kind = t.dtype.kind
    if want_bool:
        if kind == "b":
            return t
        if kind in "iuf":
            return t != 0
    elif kind in "iu":
        return t.astype(np.int32) if t.dtype != np.int32 else t
    need = "a boolean (or number)" if want_bool else "an integer"
    raise TypeError(f"nx.{what}: {arg} must be {need} scalar, got {t.dtype}")


# ---- cond / switch ---------------------------------------------------------------------------


def _branches(index: Tensor, fns: Sequence[Callable], labels, operands, what: str):
    ops, in_def = _leaves(tuple(operands), what, "operands")
    staged: list[Staged] = [
        stage(fn, ops, lambda phs: _tree.unflatten(in_def, phs), what) for fn in fns
    ]
    first = staged[0]
    for lab, fn, s in zip(labels[1:], fns[1:], staged[1:]):
        if s.out_def != first.out_def:
            raise TypeError(
                f"nx.{what}: the branches return different structures: {labels[0]} "
                f"({fname(fns[0])}) returns {first.out_def}, {lab} ({fname(fn)}) returns "
                f"{s.out_def}. Fix: return the same pytree from every branch"
            )
        for path, a, b in zip(_out_paths(first.out_def, "output"), first.out_avals, s.out_avals):
            if (tuple(a[0]), np.dtype(a[1])) != (tuple(b[0]), np.dtype(b[1])):
                raise TypeError(
                    f"nx.{what}: the branches return different types for {path}: {labels[0]} "
                    f"({fname(fns[0])}) returns {_fmt(a)}, {lab} ({fname(fn)}) returns {_fmt(b)}. "
                    f"Fix: make every branch return the same shapes and dtypes"
                )
    refs, bshapes, counts = [index._impl.ref], [index._impl.batch_shape], []
    in_avals = [(index.shape, index.dtype)]
    for s in staged:
        r, rb = s.inputs()
        refs += r
        bshapes += rb
        counts.append(len(r))
        in_avals += s.in_avals()
    base = (tuple(s.body for s in staged), tuple(counts))
    outs = _control_node(cond_p, base, refs, bshapes, in_avals, first.out_avals)
    return _tree.unflatten(first.out_def, outs)


def cond(pred, true_fun: Callable, false_fun: Callable, *operands):
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, as ``jax.lax.cond``.

    Both branches are traced (once per call) and must return the same structure, shapes and
    dtypes. Under ``nx.vmap`` with a per-example ``pred``, both run and the results are selected.

    >>> import nablax as nx
    >>> f = lambda x: nx.cond(x.sum() > 0, lambda v: v * 2, lambda v: -v, x)
    >>> f(nx.tensor([1.0, 2.0])).tolist(), nx.grad(lambda x: f(x).sum())(nx.ones(2)).tolist()
    ([2.0, 4.0], [2.0, 2.0])
    """
    p = _scalar_index(pred, "cond", "pred", want_bool=True)
    return _branches(p, (false_fun, true_fun), ("false_fun", "true_fun"), operands, "cond")


def switch(index, branches: Sequence[Callable], *operands):
    """``branches[index](*operands)``, as ``jax.lax.switch`` (``index`` is clamped to the
    valid range).

    >>> import nablax as nx
    >>> fs = [lambda x: x + 1, lambda x: x * 10, lambda x: -x]
    >>> [nx.switch(i, fs, nx.tensor(2.0)).item() for i in (0, 1, 2, 7)]
    [3.0, 20.0, -2.0, -2.0]
    """
    branches = list(branches)
    if not branches or not all(callable(b) for b in branches):
        raise TypeError(
            "nx.switch: branches must be a non-empty sequence of functions, got "
            f"{[type(b).__name__ for b in branches]}"
        )
    idx = _scalar_index(index, "switch", "index", want_bool=False)
    if len(branches) == 1:
        idx = idx * 0
    labels = tuple(f"branches[{k}]" for k in range(len(branches)))
    return _branches(idx, branches, labels, operands, "switch")


# ---- while_loop / fori_loop / scan ---------------------------------------------------------------


def _carry_prepare(what, f, init_def, init_avals, prefix):
    def prepare(out):
        leaves, out_def = _leaves(out, what, f"the result of {fname(f)}")
        _check_carry(
            what, f, out_def, [(t.shape, t.dtype) for t in leaves], init_def, init_avals, prefix
        )
        return leaves, out_def

    return prepare


def while_loop(cond_fun: Callable, body_fun: Callable, init_val):
    """Repeat ``val = body_fun(val)`` while ``cond_fun(val)``, as ``jax.lax.while_loop``.

    Forward mode (``nx.jvp``) and ``nx.vmap`` (per-example trip counts) go through it; reverse
    mode does not, as in JAX: use ``nx.fori_loop`` with Python-int bounds or ``nx.scan``.

    >>> import nablax as nx
    >>> # Newton's method for sqrt(2)
    >>> x = nx.while_loop(lambda x: abs(x * x - 2) > 1e-6, lambda x: (x + 2 / x) / 2, 1.0)
    >>> round(x.item(), 6)
    1.414214
    """
    init, init_def = _leaves(init_val, "while_loop", "init_val")
    avals = [(t.shape, t.dtype) for t in init]

    def make(phs):
        return (_tree.unflatten(init_def, phs),)

    def pred(out):
        p = as_tensor(out, "while_loop", f"the result of cond_fun {fname(cond_fun)}")
        if p.shape != () or p.dtype != np.bool_:
            raise TypeError(
                f"nx.while_loop: cond_fun {fname(cond_fun)} must return a boolean scalar, got "
                f"{_fmt((p.shape, p.dtype))}. Fix: reduce it (.any() / .all()) or compare"
            )
        return [p], _tree.structure(0)

    cs = stage(cond_fun, init, make, "while_loop", prepare=pred)
    prep = _carry_prepare("while_loop", body_fun, init_def, avals, "carry")
    bs = stage(body_fun, init, make, "while_loop", prepare=prep)
    nc = len(init)
    c_refs, c_b = cs.inputs()
    b_refs, b_b = bs.inputs()
    refs = bs.refs[:nc] + c_refs[nc:] + b_refs[nc:]
    bshapes = bs.bshapes[:nc] + c_b[nc:] + b_b[nc:]
    params = (cs.body, bs.body, nc, len(c_refs) - nc)
    outs = add_node(while_p, params, refs, bshapes, avals)
    return _tree.unflatten(init_def, outs)


def _static_int(x):
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, np.integer)):
        return int(x)
    return None


def fori_loop(lower, upper, body_fun: Callable, init_val, *, unroll: int | bool = 1):
    """``val = body_fun(i, val)`` for ``i`` in ``range(lower, upper)``, as ``jax.lax.fori_loop``.

    With Python-int bounds it is an ``nx.scan`` (reverse-differentiable); with tensor bounds an
    ``nx.while_loop`` (forward mode only).

    >>> import nablax as nx
    >>> nx.fori_loop(0, 5, lambda i, acc: acc + i * i, 0).item()
    30
    """
    lo, hi = _static_int(lower), _static_int(upper)
    if lo is not None and hi is not None:

        def step(carry, _):
            i, x = carry
            return (i + 1, body_fun(i, x)), None

        start = Tensor(np.int32(lo))
        (_, out), _ = _scan(
            step, (start, init_val), None, max(hi - lo, 0), False, unroll, "fori_loop", body_fun
        )
        return out
    lo_t = _scalar_index(lower, "fori_loop", "lower", want_bool=False)
    hi_t = _scalar_index(upper, "fori_loop", "upper", want_bool=False)

    def c(carry):
        return carry[0] < carry[1]

    def b(carry):
        i, n, x = carry
        return i + 1, n, body_fun(i, x)

    return while_loop(c, b, (lo_t, hi_t, init_val))[2]


def scan(f: Callable, init, xs=None, length: int | None = None, reverse: bool = False, unroll=1):
    """Loop ``carry, y = f(carry, x)`` over the leading axis of ``xs``, as ``jax.lax.scan``.

    Returns ``(final carry, ys)`` with the ``y``'s stacked. ``xs``, the carry and ``y`` may be
    pytrees; ``xs=None`` with ``length=`` loops without inputs; ``reverse=True`` runs from the
    end; ``unroll`` unrolls that many steps per loop iteration. One graph node, whatever the
    length, differentiable in both modes.

    >>> import nablax as nx
    >>> def rnn(h, x):
    ...     h = nx.tanh(h * 0.5 + x)
    ...     return h, h.sum()
    >>> h, ys = nx.scan(rnn, nx.zeros(3), nx.ones((4, 3)))
    >>> ys.shape, nx.grad(lambda xs: nx.scan(rnn, nx.zeros(3), xs)[1].sum())(nx.ones((4, 3))).shape
    ((4,), (4, 3))
    """
    return _scan(f, init, xs, length, reverse, unroll, "scan", f)


def _scan(f, init, xs, length, reverse, unroll, what: str, user):
    init_t, init_def = _leaves(init, what, "init")
    xs_t, xs_def = _leaves(xs, what, "xs")
    lengths = []
    for path, t in zip(_out_paths(xs_def, "xs"), xs_t):
        if t.ndim == 0:
            raise ValueError(
                f"nx.{what}: {path} is a scalar; every leaf of xs needs a leading axis to scan over"
            )
        lengths.append((path, t.shape[0]))
    if length is not None:
        length = operator.index(length)
        if length < 0:
            raise ValueError(f"nx.{what}: length must be >= 0, got {length}")
    sizes = {n for _, n in lengths}
    if len(sizes) > 1 or (length is not None and sizes and sizes != {length}):
        got = ", ".join(f"{p}: {n}" for p, n in lengths)
        given = f" and length={length}" if length is not None else ""
        raise ValueError(
            f"nx.{what}: the leading axes of xs must all equal the scan length; got {got}{given}"
        )
    if length is None:
        if not sizes:
            raise ValueError(f"nx.{what}: give xs or length= (with xs=None there is no length)")
        length = sizes.pop()
    if isinstance(unroll, bool):
        unroll = max(length, 1) if unroll else 1
    unroll = operator.index(unroll)
    if unroll < 1:
        raise ValueError(f"nx.{what}: unroll must be >= 1 (or a bool), got {unroll}")
    nc = len(init_t)
    c_avals = [(t.shape, t.dtype) for t in init_t]
    x_avals = [(t.shape[1:], t.dtype) for t in xs_t]
    y_def_box: list = []

    def make(phs):
        return _tree.unflatten(init_def, phs[:nc]), _tree.unflatten(xs_def, phs[nc:])

    def prepare(out):
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(
                f"nx.{what}: {fname(user)} must return a pair (carry, y), got {type(out).__name__}"
            )
        c, y = out
        c_leaves, c_def = _leaves(c, what, f"the carry returned by {fname(user)}")
        _check_carry(
            what, user, c_def, [(t.shape, t.dtype) for t in c_leaves], init_def, c_avals, "carry"
        )
        y_leaves, y_def = _leaves(y, what, f"the y returned by {fname(user)}")
        y_def_box[:] = [y_def]
        return c_leaves + y_leaves, _tree.structure(0)

    s = stage(f, init_t + xs_t, make, what, prepare=prepare, avals=c_avals + x_avals)
    refs, bshapes = s.inputs()
    base = (s.body, nc, len(xs_t), length, bool(reverse), unroll)
    in_avals = [(t.shape, t.dtype) for t in init_t + xs_t] + s.in_avals()[nc + len(xs_t) :]
    outs = _control_node(scan_p, base, refs, bshapes, in_avals, _scan_abstract(base + (None,)))
    carry = _tree.unflatten(init_def, outs[:nc])
    return carry, _tree.unflatten(y_def_box[0], outs[nc:])

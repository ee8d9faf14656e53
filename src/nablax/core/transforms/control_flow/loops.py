"""``nx.while_loop``, ``nx.fori_loop`` and ``nx.scan``: one ``while_loop`` or ``scan`` node whose body
is staged once per call."""

from __future__ import annotations

import operator
from collections.abc import Callable

import numpy as np

from .... import tree as _tree
from ...tensor import Tensor
from .checks import check_carry, fmt_aval, out_paths, scalar_index, tensor_leaves
from .primitives import control_node, scan_abstract, scan_p, while_p
from .stage import add_node, as_tensor, fname, stage

# ---- while_loop / fori_loop / scan ---------------------------------------------------------------


def _carry_prepare(what, f, init_def, init_avals, prefix):
    def prepare(out):
        leaves, out_def = tensor_leaves(out, what, f"the result of {fname(f)}")
        check_carry(
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
    init, init_def = tensor_leaves(init_val, "while_loop", "init_val")
    avals = [(t.shape, t.dtype) for t in init]

    def make(phs):
        return (_tree.unflatten(init_def, phs),)

    def pred(out):
        p = as_tensor(out, "while_loop", f"the result of cond_fun {fname(cond_fun)}")
        if p.shape != () or p.dtype != np.bool_:
            raise TypeError(
                f"nx.while_loop: cond_fun {fname(cond_fun)} must return a boolean scalar, got "
                f"{fmt_aval((p.shape, p.dtype))}. Fix: reduce it (.any() / .all()) or compare"
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
    lo_t = scalar_index(lower, "fori_loop", "lower", want_bool=False)
    hi_t = scalar_index(upper, "fori_loop", "upper", want_bool=False)

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
    init_t, init_def = tensor_leaves(init, what, "init")
    xs_t, xs_def = tensor_leaves(xs, what, "xs")
    lengths = []
    for path, t in zip(out_paths(xs_def, "xs"), xs_t):
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
        c_leaves, c_def = tensor_leaves(c, what, f"the carry returned by {fname(user)}")
        check_carry(
            what, user, c_def, [(t.shape, t.dtype) for t in c_leaves], init_def, c_avals, "carry"
        )
        y_leaves, y_def = tensor_leaves(y, what, f"the y returned by {fname(user)}")
        y_def_box[:] = [y_def]
        return c_leaves + y_leaves, _tree.structure(0)

    s = stage(f, init_t + xs_t, make, what, prepare=prepare, avals=c_avals + x_avals)
    refs, bshapes = s.inputs()
    base = (s.body, nc, len(xs_t), length, bool(reverse), unroll)
    in_avals = [(t.shape, t.dtype) for t in init_t + xs_t] + s.in_avals()[nc + len(xs_t) :]
    outs = control_node(scan_p, base, refs, bshapes, in_avals, scan_abstract(base + (None,)))
    carry = _tree.unflatten(init_def, outs[:nc])
    return carry, _tree.unflatten(y_def_box[0], outs[nc:])

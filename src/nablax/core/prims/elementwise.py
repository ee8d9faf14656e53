"""Elementwise primitives: unary math, binary arithmetic/comparison/bitwise, select, convert.

Elementwise primitives broadcast implicitly (NumPy rules) and carry the dtype they compute in as
their only parameter, so mixed-dtype inputs and weakly typed Python scalars need no extra nodes.
Building these ops is the hot path of eager code, so :func:`_binary` is written for speed: one
``Node``, one ``TensorImpl`` and one ``Tensor`` per op, with cached dtype and shape decisions.

Functions take NumPy's names; ``asin acos atan asinh acosh atanh`` (Nabla's and PyTorch's
spellings) are the same functions as ``arcsin`` & co. Values are bit for bit ``jax.numpy``'s:

>>> import nablax as nx
>>> nx.arcsin(nx.tensor([0.0, 1.0])).tolist(), nx.asin is nx.arcsin
([0.0, 1.5707963705062866], True)
>>> nx.cosh(nx.tensor(0.0)).item(), nx.tensor([2.0, 4.0]).reciprocal().tolist()
(1.0, [0.5, 0.25])
"""

from __future__ import annotations

import math
import weakref

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _config
from ...errors import DTypeError, op_error
from .. import dtypes
from ..build import TensorImpl, batch_info, bind
from ..context import CTX, note_pending
from ..dtypes import bool_, promote, promote_scalar
from ..graph import Const, Node, deeper
from ..primitive import primitive
from ..realize import realize_impls
from ..tensor import Tensor, to_impl
from ._util import broadcast_shapes
from .elementwise_table import BINARY, KINDS, UNARY

_wref = weakref.ref
_SCALARS = {bool, int, float, complex}
_cfg_get = _config.get
_new_tensor = object.__new__

_kind_cache: dict[tuple, tuple] = {}


def _resolve(op: str, kind: str, d) -> tuple:
    try:
        return _kind_cache[(op, d)]
    except KeyError:
        r = KINDS[kind](op, d)
        r = ((r[0],), r[1])  # params tuple, output dtype
        _kind_cache[(op, d)] = r
        return r


def _elementwise_aval(op, kind):
    def abstract_eval(params, *avals):
        shape = broadcast_shapes(op, *[a[0] for a in avals])
        d = avals[0][1]
        for a in avals[1:]:
            d = promote(d, a[1])
        return ((shape, _resolve(op, kind, d)[1]),)

    return abstract_eval


# ---- primitive tables ------------------------------------------------------------------------


def _cast_lower(fn):
    def lower(params, *xs):
        dt = params[0]
        return fn(*[x if x.dtype == dt else x.astype(dt) for x in xs])

    return lower


PRIMS = {}
for _name, (_kind, _fn) in {**UNARY, **BINARY}.items():
    PRIMS[_name] = primitive(_name, _elementwise_aval(_name, _kind), _cast_lower(_fn))


def _select_aval(params, c, x, y):
    shape = broadcast_shapes("where", c[0], x[0], y[0])
    return ((shape, params[0]),)


def _select_lower(params, c, x, y):
    dt = params[0]
    return jnp.where(c.astype(bool), x.astype(dt), y.astype(dt))


select = primitive("select", _select_aval, _select_lower)


def _convert_aval(params, x):
    return ((x[0], params[0]),)


def _convert_lower(params, x):
    return lax.convert_element_type(x, params[0])


convert = primitive("convert_element_type", _convert_aval, _convert_lower)

# ---- builders --------------------------------------------------------------------------------


def _check_int(op: str, v: int, dtype) -> None:
    """A Python int must fit the integer dtype it is materialized in (JAX raises the same)."""
    if dtypes.is_integer(dtype) or dtype == bool_:
        info = np.iinfo(dtype) if dtype != bool_ else None
        if info is None or not info.min <= v <= info.max:
            raise op_error(
                OverflowError,
                op,
                f"Python int {v} does not fit dtype {dtype}",
                "cast the tensor to a wider or float dtype first",
            )


def _operand(x, op: str) -> TensorImpl:
    return to_impl(x, op=op)  # its errors name ``op`` (TypeError, OverflowError, ...)


def _finish(prim, params, inputs, depth, shape, out_dt, bdims, trace) -> Tensor:
    """The node and output of an element-wise op; ``bdims`` as ``Node.bdims`` (None: unbatched)."""
    node = Node(prim, params, inputs, depth, trace)
    if trace is not None:
        node.avals = ((shape, out_dt),)
    if bdims is not None:
        node.bdims = bdims
        out = TensorImpl(node, None, shape, out_dt, bdims[1])
    else:
        out = TensorImpl(node, None, shape, out_dt)
    wr = _wref(out)
    node.outs = (wr,)
    pending = CTX.pending
    if len(pending) < 4096:  # inlined fast path of note_pending
        pending.append(wr)
    else:
        note_pending(wr)
    if not depth & 63 and depth > _cfg_get("max_graph_depth"):  # checked every 64 levels: cheap
        realize_impls([out])
    t = object.__new__(Tensor)
    t._impl = out
    return t


def _binary(name: str, a, b) -> Tensor:
    """Build ``name(a, b)`` for a tensor and a tensor/scalar/array-like, in either order."""
    prim = PRIMS[name]
    ta = type(a)
    tb = type(b)
    if ta is Tensor and tb in _SCALARS:
        ti, s, first = a._impl, b, False
    elif tb is Tensor and ta in _SCALARS:
        ti, s, first = b._impl, a, True
    else:
        # a weakly typed traced scalar (a Python number argument under nx.compile) promotes itself
        if ta is not Tensor and hasattr(ta, "_weak_binary"):
            return ta._weak_binary(name, a, b)
        if tb is not Tensor and hasattr(tb, "_weak_binary"):
            return tb._weak_binary(name, a, b)
        ai = a._impl if ta is Tensor else _operand(a, name)
        bi = b._impl if tb is Tensor else _operand(b, name)
        return _binary_tt(name, prim, ai, bi)
    params, out_dt = _resolve(name, BINARY[name][0], promote_scalar(ti.dtype, type(s)))
    if type(s) is int and not -2147483648 <= s <= 2147483647:
        _check_int(name, s, params[0])
    if name == "power" and not first and type(s) is int and s < 0 and dtypes.is_integer(params[0]):
        raise op_error(
            DTypeError,
            "power",
            f"integers cannot be raised to negative integer powers ({s})",
            "use a float base, e.g. x.astype(nx.float32) ** -1",
        )
    c = s  # bare scalar input: materialized in dtype params[0] (see graph.py)
    ref = ti.src
    if ref is None:
        ref, depth, trace = ti.value, 1, None
    else:
        n = ref if type(ref) is Node else ref[0]
        depth, trace = n.depth + 1, n.trace
    inputs = (c, ref) if first else (ref, c)
    b = ti.batch_shape
    bdims = None if not b else (((0, len(b)) if first else (len(b), 0)), b)
    return _finish(prim, params, inputs, depth, ti.shape, out_dt, bdims, trace)


def _binary_tt(name, prim, ai: TensorImpl, bi: TensorImpl) -> Tensor:
    params, out_dt = _resolve(name, BINARY[name][0], promote(ai.dtype, bi.dtype))
    sa, sb = ai.shape, bi.shape
    shape = sa if sa == sb else broadcast_shapes(name, sa, sb)
    depth = 0
    trace = None
    ra = ai.src
    if ra is None:
        ra = ai.value
    else:
        n = ra if type(ra) is Node else ra[0]
        depth, trace = n.depth, n.trace
    rb = bi.src
    if rb is None:
        rb = bi.value
    else:
        n = rb if type(rb) is Node else rb[0]
        if n.depth > depth:
            depth = n.depth
        if n.trace is not None:
            trace = deeper(trace, n.trace)
    bdims = batch_info(name, (ai, bi)) if ai.batch_shape or bi.batch_shape else None
    return _finish(prim, params, (ra, rb), depth + 1, shape, out_dt, bdims, trace)


def _unary(name: str, x) -> Tensor:
    prim = PRIMS[name]
    xi = x._impl if type(x) is Tensor else _operand(x, name)
    params, out_dt = _resolve(name, UNARY[name][0], xi.dtype)
    ref = xi.src
    if ref is None:
        ref, depth, trace = xi.value, 1, None
    else:
        n = ref if type(ref) is Node else ref[0]
        depth, trace = n.depth + 1, n.trace
    b = xi.batch_shape
    return _finish(
        prim, params, (ref,), depth, xi.shape, out_dt, ((len(b),), b) if b else None, trace
    )


def _make_unary(name):
    def f(x):
        return _unary(name, x)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}`` (as ``jax.numpy.{name}``); lazy, returns a new Tensor."
    return f


def _make_binary(name):
    # Specialized per op: the tensor-with-Python-scalar case (``x * 1.5``) is the hottest path of
    # eager code, so it is inlined here with a per-op cache of dtype decisions.
    prim = PRIMS[name]
    kind = BINARY[name][0]
    scalar_cache: dict = {}
    check_neg = name == "power"  # negative integer exponents are checked on the general path

    def scalar_rule(d, st):
        r = scalar_cache.get((d, st))
        if r is None:
            r = scalar_cache[(d, st)] = _resolve(name, kind, promote_scalar(d, st))
        return r

    def f(x1, x2):
        if (
            type(x1) is Tensor
            and type(x2) in _SCALARS
            and not (check_neg and type(x2) is int and x2 < 0)
        ):
            ti = x1._impl
            r = scalar_cache.get((ti.dtype, type(x2)))
            params, out_dt = r if r is not None else scalar_rule(ti.dtype, type(x2))
            if type(x2) is int and not -2147483648 <= x2 <= 2147483647:
                _check_int(name, x2, params[0])
            ref = ti.src
            if ref is None:
                ref, depth, trace = ti.value, 1, None
            else:
                n = ref if type(ref) is Node else ref[0]
                depth, trace = n.depth + 1, n.trace
            # _finish, inlined; the bare scalar is materialized in dtype params[0] (see graph.py)
            node = Node(prim, params, (ref, x2), depth, trace)
            if trace is not None:
                node.avals = ((ti.shape, out_dt),)
            b = ti.batch_shape
            if b:
                node.bdims = ((len(b), 0), b)
            out = TensorImpl(node, None, ti.shape, out_dt, b)
            wr = _wref(out)
            node.outs = (wr,)
            pending = CTX.pending
            if len(pending) < 4096:
                pending.append(wr)
            else:
                note_pending(wr)
            if not depth & 63 and depth > _cfg_get("max_graph_depth"):
                realize_impls([out])
            t = _new_tensor(Tensor)
            t._impl = out
            return t
        return _binary(name, x1, x2)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = (
        f"Element-wise ``{name}`` with NumPy broadcasting and JAX type promotion (Python scalars "
        f"are weakly typed)."
    )
    return f


_fns = {n: _make_unary(n) for n in UNARY}
_fns.update({n: _make_binary(n) for n in BINARY})
negative = _fns["negative"]
abs = _fns["abs"]  # noqa: A001 - NumPy name
sign = _fns["sign"]
exp = _fns["exp"]
log = _fns["log"]
log1p = _fns["log1p"]
log2 = _fns["log2"]
log10 = _fns["log10"]
expm1 = _fns["expm1"]
sqrt = _fns["sqrt"]
rsqrt = _fns["rsqrt"]
sin = _fns["sin"]
cos = _fns["cos"]
tan = _fns["tan"]
tanh = _fns["tanh"]
arcsin = _fns["arcsin"]
arccos = _fns["arccos"]
arctan = _fns["arctan"]
sinh = _fns["sinh"]
cosh = _fns["cosh"]
arcsinh = _fns["arcsinh"]
arccosh = _fns["arccosh"]
arctanh = _fns["arctanh"]
sigmoid = _fns["sigmoid"]
erf = _fns["erf"]
floor = _fns["floor"]
ceil = _fns["ceil"]
isnan = _fns["isnan"]
isinf = _fns["isinf"]
isfinite = _fns["isfinite"]
invert = _fns["invert"]
add = _fns["add"]
subtract = _fns["subtract"]
multiply = _fns["multiply"]
divide = _fns["divide"]
floor_divide = _fns["floor_divide"]
mod = _fns["mod"]
power = _fns["power"]
maximum = _fns["maximum"]
minimum = _fns["minimum"]
arctan2 = _fns["arctan2"]
equal = _fns["equal"]
not_equal = _fns["not_equal"]
less = _fns["less"]
less_equal = _fns["less_equal"]
greater = _fns["greater"]
greater_equal = _fns["greater_equal"]
bitwise_and = _fns["bitwise_and"]
bitwise_or = _fns["bitwise_or"]
bitwise_xor = _fns["bitwise_xor"]
true_divide = divide
remainder = mod
# Nabla's and PyTorch's spellings: the same function objects
asin, acos, atan, asinh, acosh, atanh = arcsin, arccos, arctan, arcsinh, arccosh, arctanh


def round(x, decimals: int = 0) -> Tensor:  # noqa: A001 - NumPy name
    """Round half to even, as ``numpy.round``; ``decimals`` may be non-zero for float tensors."""
    if decimals == 0:
        return _unary("round", x)
    scale = 10.0**decimals
    return _unary("round", x * scale) / scale


def square(x) -> Tensor:
    """``x * x``."""
    return multiply(x, x)


# Composites: jnp computes these with the same operations (the same bits in every dtype, complex
# included), so they need no primitive of their own and every transform comes for free. (log2 and
# log10 are primitives: as composites, complex zeros and infinities gave nan parts.)
_LN2 = math.log(2)  # the constant XLA's exp2 multiplies by, rounded to the input's dtype


def _tensor(x, op: str) -> Tensor:
    return x if type(x) is Tensor else Tensor._wrap(_operand(x, op))


def exp2(x) -> Tensor:
    """``2 ** x``, as ``jax.numpy.exp2`` (which XLA computes as ``exp(x * log(2))``, as here).

    >>> import nablax as nx
    >>> nx.exp2(nx.tensor([-1, 0, 3])).tolist()
    [0.5, 1.0, 8.0]
    """
    return exp(multiply(_tensor(x, "exp2"), _LN2))


def reciprocal(x) -> Tensor:
    """``1 / x``, as ``jax.numpy.reciprocal`` and ``torch.reciprocal``: ints and bools give float32
    (``numpy.reciprocal`` keeps integers), ``1 / 0`` is inf.

    >>> import nablax as nx
    >>> nx.reciprocal(nx.tensor([2, 0])).tolist()
    [0.5, inf]
    """
    return divide(1.0, _tensor(x, "reciprocal"))


def trunc(x) -> Tensor:
    """Round towards zero, as ``jax.numpy.trunc``; integer and bool tensors come back unchanged.

    >>> import nablax as nx
    >>> nx.trunc(nx.tensor([-1.7, 2.5])).tolist()
    [-1.0, 2.0]
    """
    t = _tensor(x, "trunc")
    if dtypes.is_complex(t.dtype):
        raise op_error(DTypeError, "trunc", f"not defined for complex dtype {t.dtype}")
    if not dtypes.is_inexact(t.dtype):
        return t
    return where(less(t, 0), ceil(t), floor(t))


def astype(x, dtype) -> Tensor:
    """Cast to ``dtype`` (a no-op node is not created when the dtype already matches)."""
    xi = x._impl if type(x) is Tensor else _operand(x, "astype")
    dt = dtypes.canonicalize(dtype)
    if dt == xi.dtype:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return Tensor._wrap(bind(convert, [xi], (dt,))[0])


def where(condition, x=None, y=None) -> Tensor:
    """Choose ``x`` where ``condition`` is true, else ``y`` (both broadcast; scalars weakly typed).

    The one-argument form (indices of true elements) depends on data and is not supported; use
    ``nx.argwhere``-style masks via boolean indexing instead.

    >>> import nablax as nx
    >>> nx.where(nx.arange(4) > 1, 1.0, 0.0).tolist()
    [0.0, 0.0, 1.0, 1.0]
    """
    if x is None or y is None:
        raise op_error(
            TypeError, "where", "needs three arguments (condition, x, y)", "use x[mask] for indices"
        )
    ci = _operand(condition, "where")
    xs, ys = type(x) in _SCALARS, type(y) in _SCALARS
    xi: TensorImpl | Const
    yi: TensorImpl | Const
    if xs and ys:  # two weakly typed scalars: no device array needed to find the dtype
        dt = promote(dtypes.scalar_dtype(x), dtypes.scalar_dtype(y))
        yi = Const(y, dt)
        xi = Const(x, dt)
    elif xs:
        yi = _operand(y, "where")
        dt = promote_scalar(yi.dtype, type(x))
        xi = Const(x, dt)
    elif ys:
        xi = _operand(x, "where")
        dt = promote_scalar(xi.dtype, type(y))
        yi = Const(y, dt)
    else:
        xi, yi = _operand(x, "where"), _operand(y, "where")
        dt = promote(xi.dtype, yi.dtype)
    return Tensor._wrap(bind(select, [ci, xi, yi], (dt,))[0])


def clip(x, min=None, max=None) -> Tensor:  # noqa: A002 - NumPy names
    """Limit values to ``[min, max]`` (either may be ``None``), as ``numpy.clip``."""
    out = x if type(x) is Tensor else Tensor._wrap(_operand(x, "clip"))
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return out


def logical_not(x) -> Tensor:
    return invert(astype(x, bool_))


def logical_and(x1, x2) -> Tensor:
    return bitwise_and(astype(x1, bool_), astype(x2, bool_))


def logical_or(x1, x2) -> Tensor:
    return bitwise_or(astype(x1, bool_), astype(x2, bool_))


def logical_xor(x1, x2) -> Tensor:
    return bitwise_xor(astype(x1, bool_), astype(x2, bool_))


def stop_gradient(x) -> Tensor:
    """Identity whose gradient is zero (see ``nx.grad``)."""
    xi = x._impl if type(x) is Tensor else _operand(x, "stop_gradient")
    out = bind(_stop_gradient, [xi])[0]
    out.src.trace = None  # constant for every transform: never walked, freed like eager code
    return Tensor._wrap(out)


_stop_gradient = primitive(
    "stop_gradient", lambda params, x: (x,), lambda params, x: lax.stop_gradient(x)
)


# Tensor methods named as the functions (PyTorch's tensors have all of these)
_METHODS = (
    "exp log log1p expm1 sqrt rsqrt sin cos tan tanh sigmoid erf floor ceil sign isnan isinf "
    "isfinite arcsin arccos arctan sinh cosh arcsinh arccosh arctanh asin acos atan asinh acosh "
    "atanh trunc log2 log10 exp2 reciprocal"
).split()


# Derivative, batching and sharding rules: elementwise_rules.py (imported by ops/__init__.py).

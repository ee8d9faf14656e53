"""Elementwise primitives: unary math, binary arithmetic/comparison/bitwise, select, convert.

Elementwise primitives broadcast implicitly (NumPy rules) and carry the dtype they compute in as
their only parameter, so mixed-dtype inputs and weakly typed Python scalars need no extra nodes.
Building these ops is the hot path of eager code, so :func:`_binary` is written for speed: one
``Node``, one ``TensorImpl`` and one ``Tensor`` per op, with cached dtype and shape decisions.
"""

from __future__ import annotations

import weakref

import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _config
from ...errors import DTypeError, op_error
from .. import dtypes
from ..context import CTX, note_pending
from ..dtypes import bool_, promote, promote_scalar
from ..graph import Const, Node, deeper
from ..primitive import primitive
from ..tensor import Tensor, TensorImpl, batch_info, to_impl
from ._util import broadcast_shapes

_wref = weakref.ref
_SCALARS = {bool, int, float, complex}
_cfg_get = _config.get
_new_tensor = object.__new__

# ---- dtype policies --------------------------------------------------------------------------
# kind -> (computation dtype, output dtype) given the promoted input dtype.


def _kind_arith(op, d):
    if d == bool_ and op in ("subtract", "power", "negative", "floor_divide", "mod", "sign"):
        raise op_error(
            DTypeError, op, "not supported for bool tensors", "cast with .astype(nx.int32)"
        )
    return d, d


def _kind_float(op, d):
    f = dtypes.to_float(d)
    return f, f


def _kind_compare(op, d):
    return d, bool_


def _kind_bitwise(op, d):
    if not (d == bool_ or dtypes.is_integer(d)):
        raise op_error(
            DTypeError, op, f"needs integer or bool tensors, got {d}", "use logical_* for masks"
        )
    return d, d


def _kind_predicate(op, d):
    return d, bool_


def _kind_real(op, d):
    if dtypes.is_complex(d):
        raise op_error(DTypeError, op, f"not defined for complex dtype {d}")
    if d == bool_ and op == "round":
        raise op_error(DTypeError, op, "not defined for bool tensors", "cast with .astype(...)")
    return d, d


_KINDS = {
    "arith": _kind_arith,
    "float": _kind_float,
    "compare": _kind_compare,
    "bitwise": _kind_bitwise,
    "predicate": _kind_predicate,
    "real": _kind_real,
}
_kind_cache: dict[tuple, tuple] = {}


def _resolve(op: str, kind: str, d) -> tuple:
    try:
        return _kind_cache[(op, d)]
    except KeyError:
        r = _KINDS[kind](op, d)
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


UNARY = {
    # name: (kind, jax function)
    "negative": ("arith", jnp.negative),
    "abs": ("real", jnp.abs),
    "sign": ("arith", jnp.sign),
    "exp": ("float", jnp.exp),
    "log": ("float", jnp.log),
    "log1p": ("float", jnp.log1p),
    "expm1": ("float", jnp.expm1),
    "sqrt": ("float", jnp.sqrt),
    "rsqrt": ("float", lax.rsqrt),
    "sin": ("float", jnp.sin),
    "cos": ("float", jnp.cos),
    "tan": ("float", jnp.tan),
    "tanh": ("float", jnp.tanh),
    "sigmoid": ("float", lax.logistic),
    "erf": ("float", lax.erf),
    "floor": ("real", jnp.floor),
    "ceil": ("real", jnp.ceil),
    "round": ("real", jnp.round),
    "isnan": ("predicate", jnp.isnan),
    "isinf": ("predicate", jnp.isinf),
    "isfinite": ("predicate", jnp.isfinite),
    "invert": ("bitwise", jnp.invert),
}

BINARY = {
    "add": ("arith", jnp.add),
    "subtract": ("arith", jnp.subtract),
    "multiply": ("arith", jnp.multiply),
    "divide": ("float", jnp.true_divide),
    "floor_divide": ("arith", jnp.floor_divide),
    "mod": ("arith", jnp.remainder),
    "power": ("arith", jnp.power),
    "maximum": ("arith", jnp.maximum),
    "minimum": ("arith", jnp.minimum),
    "arctan2": ("float", jnp.arctan2),
    "equal": ("compare", jnp.equal),
    "not_equal": ("compare", jnp.not_equal),
    "less": ("compare", jnp.less),
    "less_equal": ("compare", jnp.less_equal),
    "greater": ("compare", jnp.greater),
    "greater_equal": ("compare", jnp.greater_equal),
    "bitwise_and": ("bitwise", jnp.bitwise_and),
    "bitwise_or": ("bitwise", jnp.bitwise_or),
    "bitwise_xor": ("bitwise", jnp.bitwise_xor),
}

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
        from ..realize import realize_impls

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
                from ..realize import realize_impls

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
expm1 = _fns["expm1"]
sqrt = _fns["sqrt"]
rsqrt = _fns["rsqrt"]
sin = _fns["sin"]
cos = _fns["cos"]
tan = _fns["tan"]
tanh = _fns["tanh"]
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


def round(x, decimals: int = 0) -> Tensor:  # noqa: A001 - NumPy name
    """Round half to even, as ``numpy.round``; ``decimals`` may be non-zero for float tensors."""
    if decimals == 0:
        return _unary("round", x)
    scale = 10.0**decimals
    return _unary("round", x * scale) / scale


def square(x) -> Tensor:
    """``x * x``."""
    return multiply(x, x)


def astype(x, dtype) -> Tensor:
    """Cast to ``dtype`` (a no-op node is not created when the dtype already matches)."""
    xi = x._impl if type(x) is Tensor else _operand(x, "astype")
    dt = dtypes.canonicalize(dtype)
    if dt == xi.dtype:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    from ..tensor import bind

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
    from ..tensor import bind

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
    from ..tensor import bind

    out = bind(_stop_gradient, [xi])[0]
    out.src.trace = None  # constant for every transform: never walked, freed like eager code
    return Tensor._wrap(out)


_stop_gradient = primitive(
    "stop_gradient", lambda params, x: (x,), lambda params, x: lax.stop_gradient(x)
)


def _install_methods() -> None:
    T = Tensor
    T.__add__ = add
    T.__radd__ = lambda a, b: _binary("add", b, a)
    T.__sub__ = subtract
    T.__rsub__ = lambda a, b: _binary("subtract", b, a)
    T.__mul__ = multiply
    T.__rmul__ = lambda a, b: _binary("multiply", b, a)
    T.__truediv__ = divide
    T.__rtruediv__ = lambda a, b: _binary("divide", b, a)
    T.__floordiv__ = floor_divide
    T.__rfloordiv__ = lambda a, b: _binary("floor_divide", b, a)
    T.__mod__ = mod
    T.__rmod__ = lambda a, b: _binary("mod", b, a)
    T.__pow__ = power
    T.__rpow__ = lambda a, b: _binary("power", b, a)
    T.__neg__ = negative
    T.__pos__ = lambda a: a
    T.__abs__ = abs
    T.__invert__ = invert
    T.__and__ = bitwise_and
    T.__rand__ = lambda a, b: _binary("bitwise_and", b, a)
    T.__or__ = bitwise_or
    T.__ror__ = lambda a, b: _binary("bitwise_or", b, a)
    T.__xor__ = bitwise_xor
    T.__rxor__ = lambda a, b: _binary("bitwise_xor", b, a)
    T.__eq__ = equal
    T.__ne__ = not_equal
    T.__lt__ = less
    T.__le__ = less_equal
    T.__gt__ = greater
    T.__ge__ = greater_equal
    for n in (
        "exp",
        "log",
        "log1p",
        "expm1",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "tan",
        "tanh",
        "sigmoid",
        "erf",
        "floor",
        "ceil",
        "sign",
        "isnan",
        "isinf",
        "isfinite",
    ):
        setattr(T, n, _fns[n])
    T.abs = abs
    T.round = round
    T.square = square
    T.astype = astype
    T.clip = clip
    T.maximum = maximum
    T.minimum = minimum


_install_methods()
np_dtype = np.dtype  # re-export for typing in other families


# Derivative rules live in elementwise_rules.py (this file would pass ~600 lines with them).
from . import elementwise_rules  # noqa: E402,F401  (installs jvp/vjp on the primitives above)

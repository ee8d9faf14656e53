"""The builders of the element-wise primitives: the functions (``exp(x)``, ``add(x1, x2)``, ...)
that check their operands and bind one node (table.py makes one per row of the table).

Building these ops is the hot path of eager code, so the builders are written for speed: cached
dtype decisions (dtype_rules.py), and the tensor-with-Python-scalar case specialized per op: a
Python scalar becomes a ``Literal`` in the computation dtype, shared between nodes of one op.
"""

from __future__ import annotations

from collections.abc import Callable

from .... import _caches
from ....errors import DTypeError, op_error
from ... import dtypes, graph
from ...build import TensorImpl, bind_pair, bind_scalar, bind_unary
from ...dtypes import promote, promote_scalar
from ...graph import Literal, new_literal, scalar_literal
from ...tensor import Tensor, to_impl
from .._util import broadcast_shapes
from .dtype_rules import resolve, weak_int

_SCALARS = {bool, int, float, complex}
_new_tensor = object.__new__
_new_literal = new_literal


def _scalar_tensor_py(
    prim, params: tuple, x: TensorImpl, lit: Literal, first: bool, dtype
) -> Tensor:
    """The tensor of :func:`~nablax.core.build.bind_scalar`'s node: ``prim`` on ``x`` and the
    scalar ``lit``."""
    t = _new_tensor(Tensor)
    t._impl = bind_scalar(prim, params, x, lit, first, dtype)
    return t


def _unary_tensor_py(prim, params: tuple, x: TensorImpl, shape: tuple, dtype) -> Tensor:
    """The tensor of :func:`~nablax.core.build.bind_unary`'s node."""
    t = _new_tensor(Tensor)
    t._impl = bind_unary(prim, params, x, shape, dtype)
    return t


def _pair_tensor_py(
    prim, params: tuple, a: TensorImpl, b: TensorImpl, shape: tuple, dtype
) -> Tensor:
    """The tensor of :func:`~nablax.core.build.bind_pair`'s node."""
    t = _new_tensor(Tensor)
    t._impl = bind_pair(prim, params, a, b, shape, dtype)
    return t


# Compiled (core/_graphc.c): the node and its tensor made in one call, no Python frame between
# the builder and the node (the compiled pair_tensor answers NotImplemented where bind_pair needs
# Python: batched inputs, or inputs of two different traces)
if graph._compiled is not None:
    scalar_tensor = graph._compiled.scalar_tensor
    unary_tensor = graph._compiled.unary_tensor
    pair_tensor = graph._compiled.pair_tensor
else:
    scalar_tensor, unary_tensor, pair_tensor = (
        _scalar_tensor_py,
        _unary_tensor_py,
        _pair_tensor_py,
    )


def _operand(x, op: str) -> TensorImpl:
    return to_impl(x, op=op)  # its errors name ``op`` (TypeError, OverflowError, ...)


def _binary(name: str, prim, kind: str, a, b) -> Tensor:
    """Build ``name(a, b)`` for a tensor and a tensor/scalar/array-like, in either order."""
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
        return _binary_tt(name, prim, kind, ai, bi)
    params, out_dt = resolve(name, kind, promote_scalar(ti.dtype, type(s)))
    if name == "power" and not first and type(s) is int and dtypes.is_integer(params[0]):
        if s < 0:
            raise op_error(
                DTypeError,
                "power",
                f"integers cannot be raised to negative integer powers ({s})",
                "use a float base, e.g. x.astype(nx.float32) ** -1",
            )
        if weak_int(name, s, params[0]) != s:
            # JAX raises to a Python int exponent exactly (lax.integer_pow), it does not wrap
            # it: x**s in int32 (which wraps modulo 2**32) keeps x**s modulo 2**bits
            wide = Tensor._wrap(ti).astype(dtypes.int32)
            return (wide**s).astype(params[0])
    if type(s) is int:
        s = weak_int(name, s, params[0])
    return scalar_tensor(prim, params, ti, scalar_literal(s, params[0]), first, out_dt)


def _binary_tt(name, prim, kind: str, ai: TensorImpl, bi: TensorImpl) -> Tensor:
    params, out_dt = resolve(name, kind, promote(ai.dtype, bi.dtype))
    sa, sb = ai.shape, bi.shape
    shape = sa if sa == sb else broadcast_shapes(name, sa, sb)
    t = pair_tensor(prim, params, ai, bi, shape, out_dt)
    return t if t is not NotImplemented else _pair_tensor_py(prim, params, ai, bi, shape, out_dt)


def _unary(name: str, prim, kind: str, x) -> Tensor:
    xi = x._impl if type(x) is Tensor else _operand(x, name)
    params, out_dt = resolve(name, kind, xi.dtype)
    return unary_tensor(prim, params, xi, xi.shape, out_dt)


def make_unary(name: str, prim, kind: str) -> Callable[..., Tensor]:
    """The builder ``f(x)`` of the unary element-wise primitive ``prim``."""

    def f(x):
        return _unary(name, prim, kind, x)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = f"Element-wise ``{name}`` (as ``jax.numpy.{name}``); lazy, returns a new Tensor."
    return f


_SCALAR_RULES: list[_caches.DictCache] = []  # every binary op's scalar cache (make_binary)


def _scalar_rules_info() -> _caches.CacheStats:
    caches = list(_SCALAR_RULES)
    return _caches.CacheStats(
        "ops.scalar_rules",
        None,
        None,
        sum(len(c) for c in caches),
        sum(c.maxsize for c in caches),
        sum(c.evictions for c in caches),
    )


def _clear_scalar_rules() -> None:
    for c in list(_SCALAR_RULES):
        c.clear()


_caches.register("ops.scalar_rules", _scalar_rules_info, _clear_scalar_rules)


def make_binary(name: str, prim, kind: str) -> Callable[..., Tensor]:
    """The builder ``f(x1, x2)`` of the binary element-wise primitive ``prim``.

    Specialized per op: the tensor-with-Python-scalar case (``x * 1.5``) is the hottest path of
    eager code, so it is written out here with a per-op cache of dtype decisions and of the scalar
    ``Literal`` (a loop multiplies by the same 1.5 every step; literals are never mutated, so nodes
    share them). Only exact matches share: equal nonzero floats and ints have the same bits; zeros
    (0.0 vs -0.0), NaNs and complex numbers (signed zero parts) always get a new literal.

    The cache is this op's :class:`~nablax._caches.DictCache`: ``(dtype, scalar type) -> (params,
    output dtype, {scalar: Literal} or None)``, at most 64 literals per entry; all ops' caches are
    one entry of ``nx.cache_info()`` (``ops.scalar_rules``), and ``nx.clear_caches()`` empties
    them in place (the closure keeps its dict)."""
    cache = _caches.DictCache(f"ops.scalar_rules.{name}", 256, register=False)
    _SCALAR_RULES.append(cache)
    scalar_cache = cache.data
    # negative integer exponents are checked on the general path, and there an int exponent too
    # large for an int8 tensor is applied exactly, not wrapped
    check_neg = name == "power"

    def scalar_rule(d, st):
        r = scalar_cache.get((d, st))
        if r is None:
            params, out_dt = resolve(name, kind, promote_scalar(d, st))
            r = cache.put((d, st), (params, out_dt, {} if st is not complex else None))
        return r

    def f(x1, x2):
        if (
            type(x1) is Tensor
            and type(x2) in _SCALARS
            and not (check_neg and type(x2) is int and not 0 <= x2 <= 127)
        ):
            ti = x1._impl
            r = scalar_cache.get((ti.dtype, type(x2)))
            params, out_dt, lits = r if r is not None else scalar_rule(ti.dtype, type(x2))
            lit = lits.get(x2) if x2 and lits is not None else None
            if lit is None:
                lit = _new_literal(Literal)  # graph.scalar_literal, inlined
                lit.value = weak_int(name, x2, params[0]) if type(x2) is int else x2
                lit.dtype = params[0]
                lit.weak = True
                if x2 and x2 == x2 and lits is not None and len(lits) < 64:
                    lits[x2] = lit
            return scalar_tensor(prim, params, ti, lit, False, out_dt)
        return _binary(name, prim, kind, x1, x2)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = (
        f"Element-wise ``{name}`` with NumPy broadcasting and JAX type promotion (Python scalars "
        f"are weakly typed)."
    )
    return f

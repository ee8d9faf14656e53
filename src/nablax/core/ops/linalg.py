"""Linear algebra: the ``einsum`` primitive and the composites built on it (``matmul``, ``dot``,
``outer``, ``tensordot``-style contractions).

``einsum`` is bilinear, so its derivative and transpose rules are einsums again; NumPy's ``matmul``
broadcasting and 1-D promotion rules are expressed as einsum specs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ...errors import DTypeError, ShapeError, op_error
from .. import dtypes
from ..primitive import primitive
from ..tensor import Tensor, bind, to_impl
from ._util import broadcast_shapes

_shape_cache: dict = {}


def _einsum_aval(params, *avals):
    spec, dt = params
    key = (spec, dt, tuple(a[0] for a in avals))
    r = _shape_cache.get(key)
    if r is None:
        structs = [jax.ShapeDtypeStruct(a[0], dt) for a in avals]
        try:
            out = jax.eval_shape(lambda *xs: jnp.einsum(spec, *xs), *structs)
        except Exception as e:  # noqa: BLE001 - re-raised with shapes
            shapes = ", ".join(str(a[0]) for a in avals)
            raise op_error(
                ShapeError, "einsum", f"{spec!r} does not fit shapes {shapes}: {e}"
            ) from None
        r = ((tuple(out.shape), dt),)
        if len(_shape_cache) < 4096:
            _shape_cache[key] = r
    return r


def _einsum_lower(params, *xs):
    spec, dt = params
    return jnp.einsum(spec, *[x.astype(dt) for x in xs], preferred_element_type=dt)


einsum_p = primitive("einsum", _einsum_aval, _einsum_lower)


def _operands(op, xs):
    impls = [x._impl if isinstance(x, Tensor) else to_impl(x) for x in xs]
    dt = impls[0].dtype
    for i in impls[1:]:
        dt = dtypes.promote(dt, i.dtype)
    if dt == dtypes.bool_:
        raise op_error(
            DTypeError, op, "bool operands are not supported", "cast to int32 or float32"
        )
    return impls, dt


def einsum(subscripts: str, *operands) -> Tensor:
    """Einstein summation, as ``numpy.einsum`` (explicit or implicit output, ``...`` broadcasting).

    >>> import nablax as nx
    >>> a = nx.arange(6.).reshape(2, 3)
    >>> nx.einsum("ij,kj->ik", a, a).tolist()
    [[5.0, 14.0], [14.0, 50.0]]
    """
    impls, dt = _operands("einsum", operands)
    spec = subscripts.replace(" ", "")
    return Tensor._wrap(bind(einsum_p, impls, (spec, dt))[0])


def matmul(a, b) -> Tensor:
    """Matrix product with NumPy's rules (1-D operands promoted, batch axes broadcast).

    >>> import nablax as nx
    >>> (nx.ones((2, 3)) @ nx.ones(3)).tolist()
    [3.0, 3.0]
    """
    (ai, bi), dt = _operands("matmul", (a, b))
    sa, sb = ai.shape, bi.shape
    if not sa or not sb:
        raise op_error(
            ShapeError,
            "matmul",
            f"operands must be at least 1-D, got {sa} and {sb}",
            "use multiply",
        )
    ka = sa[-1]
    kb = sb[0] if len(sb) == 1 else sb[-2]
    if ka != kb:
        raise op_error(
            ShapeError,
            "matmul",
            f"contraction dimensions differ: a{list(sa)} has {ka} columns, b{list(sb)} has {kb} rows",
            "transpose or reshape one operand so a.shape[-1] == b.shape[-2]",
        )
    if len(sa) > 2 and len(sb) > 2:
        broadcast_shapes("matmul (batch axes)", sa[:-2], sb[:-2])
    if len(sa) == 1 and len(sb) == 1:
        spec = "i,i->"
    elif len(sa) == 1:
        spec = "j,...jk->...k"
    elif len(sb) == 1:
        spec = "...ij,j->...i"
    else:
        spec = "...ij,...jk->...ik"
    return Tensor._wrap(bind(einsum_p, [ai, bi], (spec, dt))[0])


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def dot(a, b) -> Tensor:
    """``numpy.dot``: sum over the last axis of ``a`` and the second-to-last of ``b``."""
    (ai, bi), dt = _operands("dot", (a, b))
    na, nb = len(ai.shape), len(bi.shape)
    if na == 0 or nb == 0:
        from .elementwise import multiply

        return multiply(Tensor._wrap(ai), Tensor._wrap(bi))
    kb = 0 if nb == 1 else nb - 2
    if ai.shape[-1] != bi.shape[kb]:
        raise op_error(
            ShapeError,
            "dot",
            f"shapes {ai.shape} and {bi.shape} not aligned: {ai.shape[-1]} (dim {na - 1}) != "
            f"{bi.shape[kb]} (dim {kb})",
        )
    la = _LETTERS[:na]
    lb = list(_LETTERS[na : na + nb])
    lb[kb] = la[-1]
    lb = "".join(lb)
    out = la[:-1] + lb.replace(la[-1], "")
    return Tensor._wrap(bind(einsum_p, [ai, bi], (f"{la},{lb}->{out}", dt))[0])


def outer(a, b) -> Tensor:
    """Outer product of the flattened inputs."""
    from .shape import reshape

    ta = a if isinstance(a, Tensor) else Tensor._wrap(to_impl(a))
    tb = b if isinstance(b, Tensor) else Tensor._wrap(to_impl(b))
    return reshape(ta, (-1, 1)) * reshape(tb, (1, -1))


def _install_methods() -> None:
    Tensor.__matmul__ = matmul
    Tensor.__rmatmul__ = lambda a, b: matmul(b, a)
    Tensor.matmul = matmul
    Tensor.dot = dot


_install_methods()


def _install_rules() -> None:
    from ._rules import derive_from_jax

    derive_from_jax(einsum_p)


_install_rules()

"""Linear algebra: the ``einsum`` primitive, with all its rules, and its builders (``einsum``,
``matmul``, ``dot``); ``outer`` and other products written with them are in core/ops/linalg.py.

``einsum`` is bilinear, so its derivative and transpose rules are einsums again; NumPy's ``matmul``
broadcasting and 1-D promotion rules are expressed as einsum specs.

Parameters: ``(spec, dtype, precision)``. ``precision`` is ``nx.config`` option
``matmul_precision`` (``"float32"``, ``"tensorfloat32"`` or ``"bfloat16"``) read when the node is
built, for float32 and complex64 products, else None (narrower and wider dtypes are unaffected).
Being a parameter, it is part of every structure key: a program built under one precision is never
reused under another, and derivatives inherit the precision of their forward node.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _caches, _config
from ...errors import DTypeError, ShapeError, op_error
from .. import dtypes
from ..build import TensorImpl, bind
from ..graph import Var
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _autocast, _shard
from ._batch import _batch_shape, to_full_batch
from ._rules import cast_like, derived_from_jax, is_float_tensor
from ._util import broadcast_shapes, is_concrete
from .elementwise import multiply
from .shape import broadcast_in_dim_p, transpose_p

_shape_cache = _caches.Cache("ops.einsum_shapes", 4096)


# nx.config matmul_precision -> lax precision (JAX's own names: "bfloat16" is XLA's default,
# TensorFloat-32 on NVIDIA GPUs and one bfloat16 pass on TPUs).
LAX_PRECISION = {
    "float32": lax.Precision.HIGHEST,
    "tensorfloat32": lax.Precision.HIGH,
    "bfloat16": lax.Precision.DEFAULT,
}
_PRECISION_DTYPES = frozenset({np.dtype(np.float32), np.dtype(np.complex64)})


def matmul_precision(dt) -> str | None:
    """The ``precision`` parameter of a product computed in dtype ``dt``: the ``matmul_precision``
    option for float32/complex64, None for other dtypes (bfloat16/float16 products are unaffected).

    >>> import numpy as np
    >>> matmul_precision(np.float32), matmul_precision(np.float16)
    ('float32', None)
    """
    return _config.get("matmul_precision") if np.dtype(dt) in _PRECISION_DTYPES else None


def lax_precision(name: str | None):
    """The ``precision=`` argument of ``jnp.einsum`` / ``lax.conv_general_dilated`` for a
    ``precision`` parameter (None: XLA's default)."""
    return None if name is None else LAX_PRECISION[name]


def _einsum_aval(params, *avals):
    spec, dt = params[0], params[1]
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
        if is_concrete(key):
            _shape_cache.put(key, r)
    return r


def _einsum_lower(params, *xs):
    spec, dt, prec = params
    return jnp.einsum(
        spec, *[x.astype(dt) for x in xs], preferred_element_type=dt, precision=lax_precision(prec)
    )


# ---- derivative rules ------------------------------------------------------------------------
# einsum is multilinear: the tangent is a sum of einsums with one operand replaced by its tangent,
# and the cotangent of operand i is an einsum of the output cotangent with the other operands. To
# write that einsum, the spec is made explicit and free of ``...``: the broadcast batch axes get
# letters of their own, and an axis of size 1 that broadcasts against a larger one gets a fresh
# letter (it is then summed over, which changes nothing in the forward pass and sums the
# cotangent as broadcasting requires).

_LABELS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_parse_cache = _caches.Cache("ops.einsum_specs", 4096)


def _explicit(spec: str, shapes) -> tuple | None:
    """``(operand labels, output labels)`` for ``spec`` on ``shapes``, or None when an operand
    repeats a label (a diagonal) or labels run out."""

    def parse():
        try:
            return _explicit_uncached(spec, shapes)
        except StopIteration:
            return None

    return _parse_cache.get_or_make((spec, shapes), parse)


def _explicit_uncached(spec: str, shapes) -> tuple | None:
    ins, out = spec.split("->") if "->" in spec else (spec, None)
    terms_in = ins.split(",")
    if out is None:  # implicit output: broadcast axes, then labels used once, sorted
        letters = [c for t in terms_in for c in t.replace("...", "")]
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        out = ("..." if "..." in ins else "") + "".join(once)
    free = iter(c for c in _LABELS if c not in spec)
    n_ell = [len(s) - len(t) + 3 if "..." in t else 0 for t, s in zip(terms_in, shapes)]
    batch = [next(free) for _ in range(max(n_ell, default=0))]
    terms = []
    for t, ne in zip(terms_in, n_ell):
        pre, _, post = t.partition("...")
        terms.append(list(pre) + (batch[len(batch) - ne :] if ne else []) + list(post))
    size: dict = {}
    for labels, shape in zip(terms, shapes):
        if len(set(labels)) != len(labels):
            return None
        for c, d in zip(labels, shape):
            if d != 1:
                size[c] = d
    for labels, shape in zip(terms, shapes):
        for k, (c, d) in enumerate(zip(labels, shape)):
            if d == 1 and size.get(c, 1) != 1:
                labels[k] = next(free)
    pre, _, post = out.partition("...")
    out_labels = list(pre) + (batch if "..." in out else []) + list(post)
    return terms, out_labels


def _einsum_jvp(params, tangents, primals, outs):
    if not is_float_tensor(outs[0]):
        return [None]
    acc = None
    for i, t in enumerate(tangents):
        if t is None or not is_float_tensor(primals[i]):
            continue
        ops = [x._impl for x in primals]
        ops[i] = t._impl
        term = Tensor._wrap(bind(einsum_p, ops, params)[0])
        acc = term if acc is None else acc + term
    return [acc]


def _derived_vjp(params, cts, primals, outs):
    """JAX's derivative of the lowering, for the specs the native rule does not cover (an operand
    that repeats a label: diagonals, traces)."""
    return derived_from_jax(einsum_p)["vjp"](params, cts, primals, outs)


def _einsum_vjp(params, cts, primals, outs):
    ct = cts[0]
    if ct is None or not is_float_tensor(outs[0]):
        return [None] * len(primals)
    parsed = _explicit(params[0], tuple(x.shape for x in primals))
    if parsed is None:
        return _derived_vjp(params, cts, primals, outs)
    terms, out_labels = parsed
    res = []
    for i, x in enumerate(primals):
        if not is_float_tensor(x):
            res.append(None)
            continue
        others = [j for j in range(len(primals)) if j != i]
        present = set(out_labels).union(*(terms[j] for j in others))
        kept = [c for c in terms[i] if c in present]
        spec = ",".join(["".join(out_labels)] + ["".join(terms[j]) for j in others])
        impls = [cast_like(ct, outs[0])._impl] + [primals[j]._impl for j in others]
        g_params = (f"{spec}->{''.join(kept)}", params[1], params[2])
        g = Tensor._wrap(bind(einsum_p, impls, g_params)[0])
        if len(kept) != len(terms[i]):  # labels summed only in this operand: broadcast back
            dims = tuple(k for k, c in enumerate(terms[i]) if c in present)
            g = Tensor._wrap(bind(broadcast_in_dim_p, [g._impl], (x.shape, dims))[0])
        res.append(cast_like(g, x))
    return res


# ---- batching rule (see _batch.py): one more einsum letter per batch axis ---------------------


def _einsum_batch(params, bds, *xs):
    spec, dt, prec = params
    ins, out = spec.split("->")
    free = [c for c in "ABCDEFGHIJKLMNOPQRSTUVWXYZ" if c not in spec]
    bshape = _batch_shape(xs, bds)
    letters = "".join(free[: len(bshape)])
    terms, args = [], []
    for term, x, b in zip(ins.split(","), xs, bds):
        if b:
            x = to_full_batch(x, b, bshape[:b])  # size-1 batch axes cannot share a letter
        terms.append(letters[:b] + term)
        args.append(x.astype(dt))
    full = ",".join(terms) + "->" + letters + out
    return jnp.einsum(full, *args, preferred_element_type=dt, precision=lax_precision(prec))


einsum_p = primitive(
    "einsum",
    _einsum_aval,
    _einsum_lower,
    jvp=_einsum_jvp,
    vjp=_einsum_vjp,
    batch=_einsum_batch,
    shard=_shard.einsum,
)


# ---- builders --------------------------------------------------------------------------------


def _operands(op, xs):
    impls = [x._impl if isinstance(x, Tensor) else to_impl(x) for x in xs]
    dt = impls[0].dtype
    for i in impls[1:]:
        dt = dtypes.promote(dt, i.dtype)
    if dt == dtypes.bool_:
        raise op_error(
            DTypeError, op, "bool operands are not supported", "cast to int32 or float32"
        )
    return impls, _autocast.compute_dtype("matmul", dt)  # nx.autocast: the einsum's dtype


def einsum(subscripts: str, *operands) -> Tensor:
    """Einstein summation, as ``numpy.einsum`` (explicit or implicit output, ``...`` broadcasting).

    >>> import nablax as nx
    >>> a = nx.arange(6.).reshape(2, 3)
    >>> nx.einsum("ij,kj->ik", a, a).tolist()
    [[5.0, 14.0], [14.0, 50.0]]
    """
    impls, dt = _operands("einsum", operands)
    spec = subscripts.replace(" ", "")
    return Tensor._wrap(bind(einsum_p, impls, (spec, dt, matmul_precision(dt)))[0])


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
    folded = _fold_transposes(ai, bi, len(sa), len(sb), dt)
    if folded is not None:
        return folded
    if len(sa) == 1 and len(sb) == 1:
        spec = "i,i->"
    elif len(sa) == 1:
        spec = "j,...jk->...k"
    elif len(sb) == 1:
        spec = "...ij,j->...i"
    else:
        spec = "...ij,...jk->...ik"
    return Tensor._wrap(bind(einsum_p, [ai, bi], (spec, dt, matmul_precision(dt)))[0])


def _untransposed(impl) -> TensorImpl | None:
    """The 2-D tensor that ``impl`` is the pending, unsharded ``.T`` of, while that tensor is alive;
    else None."""
    src = impl.src
    if src is None or impl.sharding is not None:
        return None
    node = src[0]
    if node.prim is not transpose_p or node.params[0] != (1, 0) or node.bdims is not None:
        return None
    inp = node.inputs[0] if node.inputs else None
    if type(inp) is not Var:
        return None
    ref = inp[0].outs[inp[1]]
    x = ref() if ref is not None else None
    return x if x is not None and x.src is not None and x.src == inp else None


def _fold_transposes(ai, bi, na: int, nb: int, dt) -> Tensor | None:
    """``a @ w.T`` (and ``w.T @ b`` of 2-D ``b``) as one einsum on ``w`` itself, so the gradient
    of ``w`` is an einsum in ``w``'s own axis order. Through the transpose node, it would be
    computed transposed and then copied into ``w``'s order by XLA on every step (measured: the
    copies doubled a data-parallel MLP step on 4 CPU devices). Only for a transpose whose input is
    still a node output (a tensor being differentiated or traced); a realized tensor's ``.T`` is
    folded into the dot by XLA itself."""
    wb = _untransposed(bi) if nb == 2 else None
    wa = _untransposed(ai) if na == 2 and nb == 2 else None
    if wa is None and wb is None:
        return None
    if wa is not None:
        spec = "ji,kj->ik" if wb is not None else "ji,jk->ik"
    else:
        spec = "...j,kj->...k"
    ops = [ai if wa is None else wa, bi if wb is None else wb]
    return Tensor._wrap(bind(einsum_p, ops, (spec, dt, matmul_precision(dt)))[0])


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def dot(a, b) -> Tensor:
    """``numpy.dot``: sum over the last axis of ``a`` and the second-to-last of ``b``."""
    (ai, bi), dt = _operands("dot", (a, b))
    na, nb = len(ai.shape), len(bi.shape)
    if na == 0 or nb == 0:
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
    letters = list(_LETTERS[na : na + nb])
    letters[kb] = la[-1]
    lb = "".join(letters)
    out = la[:-1] + lb.replace(la[-1], "")
    params = (f"{la},{lb}->{out}", dt, matmul_precision(dt))
    return Tensor._wrap(bind(einsum_p, [ai, bi], params)[0])

"""Shape primitives (reshape, transpose, broadcast_in_dim, concatenate, slice, pad, rev, split),
each one record with all of its rules, and the builders that bind them (``reshape``,
``transpose``, ``moveaxis``, ``broadcast_to``, ``expand_dims``, ``concatenate``, ``split``,
``unbind``, ``pad``, ``flip``). The NumPy-style composites over them (``squeeze``, ``stack``,
``tile``, ``repeat``, ``chunk``, ...) are in core/ops/shape.py.

All of these primitives are linear in their tensor input(s): the jvp applies the primitive to the
tangent, the vjp applies its transpose, both built from shape primitives so any order works. The
one sum a transpose needs (of ``broadcast_in_dim``) is ``Tensor.sum``, bound late, since the
reduce family sits above this one.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np
from jax import lax

from ... import _caches
from ...errors import ShapeError, op_error
from ..build import TensorImpl, bind, bind_known
from ..dtypes import promote
from ..graph import Literal
from ..host import exact_scalar
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _shard
from ._batch import _batch_shape, shift, to_full_batch, unary_rule
from ._rules import cast_like, is_float_tensor, linear
from ._util import as_dim, norm_axes, norm_axis, norm_shape
from .elementwise import astype
from .elementwise.builders import unary_tensor


def _impl(x, op: str) -> TensorImpl:
    return x._impl if type(x) is Tensor else to_impl(x, op=op)


def _ints(op: str, what: str, values) -> tuple:
    """A sequence (or one) of Python ints, else a ``TypeError`` naming ``op`` and ``what``."""
    seq = values if isinstance(values, (tuple, list, np.ndarray)) else (values,)
    try:
        return tuple(operator.index(v) for v in seq)
    except TypeError:
        raise op_error(TypeError, op, f"{what} must be ints, got {values!r}") from None


def _wrap1(prim, inputs, params) -> Tensor:
    return Tensor._wrap(bind(prim, inputs, params)[0])


def _bind1(prim, xs, params) -> Tensor:
    return Tensor._wrap(bind(prim, [x._impl for x in xs], params)[0])


def _lead(b: int) -> tuple:
    return tuple(range(b))


# ---- reshape, transpose, broadcast_in_dim ---------------------------------------------------


def _reshape_t(params, ct, x):
    return _bind1(reshape_p, [cast_like(ct, x)], (x.shape,))


reshape_p = primitive(
    "reshape",
    lambda params, x: ((params[0], x[1]),),
    lambda params, x: lax.reshape(x, params[0]),
    rules=linear(_reshape_t),
    batch=unary_rule(lambda p, b, x: lax.reshape(x, tuple(x.shape[:b]) + p[0])),
    shard=_shard.reshape,
)


def _transpose_t(params, ct, x):
    inverse = tuple(int(i) for i in np.argsort(params[0]))
    return _bind1(transpose_p, [cast_like(ct, x)], (inverse,))


transpose_p = primitive(
    "transpose",
    lambda params, x: ((tuple(x[0][p] for p in params[0]), x[1]),),
    lambda params, x: lax.transpose(x, params[0]),
    rules=linear(_transpose_t),
    batch=unary_rule(lambda p, b, x: lax.transpose(x, _lead(b) + shift(p[0], b))),
    shard=_shard.transpose,
)


def _broadcast_in_dim_t(params, ct, x):
    ct = cast_like(ct, x)
    shape, dims = params
    stretched = {d for i, d in enumerate(dims) if x.shape[i] == 1 and shape[d] != 1}
    axes = tuple(a for a in range(len(shape)) if a not in dims or a in stretched)
    if axes:
        ct = ct.sum(axis=axes)  # one reduce_sum node (the reduce family sits above this one)
    return ct if ct.shape == x.shape else _bind1(reshape_p, [ct], (x.shape,))


broadcast_in_dim_p = primitive(
    "broadcast_in_dim",
    lambda params, x: ((params[0], x[1]),),
    lambda params, x: lax.broadcast_in_dim(x, params[0], params[1]),
    rules=linear(_broadcast_in_dim_t),
    batch=unary_rule(
        lambda p, b, x: lax.broadcast_in_dim(
            x, tuple(x.shape[:b]) + p[0], _lead(b) + shift(p[1], b)
        )
    ),
    shard=_shard.broadcast_in_dim,
)


def _filled(shape: tuple, value, dtype) -> Tensor:
    """A lazy tensor of ``shape`` filled with the scalar ``value`` (already exact in ``dtype``):
    a broadcast of a constant, which XLA fuses into its consumers."""
    return Tensor._wrap(bind(broadcast_in_dim_p, [Literal(value, dtype)], (shape, ()))[0])


# ---- slice, pad, rev ---------------------------------------------------------------------------


def _slice_aval(params, x):
    starts, limits, strides = params
    shape = tuple(max(0, -(-(lim - s) // st)) for s, lim, st in zip(starts, limits, strides))
    return ((shape, x[1]),)


def _slice_t(params, ct, x):
    ct = cast_like(ct, x)
    starts, _, strides = params
    out = ct.shape
    if 0 in out:
        return _filled(x.shape, 0, x.dtype)
    spans = tuple((n - 1) * s + 1 for n, s in zip(out, strides))  # extent covered in x
    strided = {a for a, (n, s) in enumerate(zip(out, strides)) if s != 1 and n > 1}
    if strided:  # dilate: s-1 zeros after each element (a new axis padded, then merged)
        spread, widths = [], []
        for a, n in enumerate(out):
            spread.append(n)
            widths.append((0, 0))
            if a in strided:
                spread.append(1)
                widths.append((0, strides[a] - 1))
        ct = _bind1(reshape_p, [ct], (tuple(spread),))
        ct = _bind1(pad_p, [ct], (tuple(widths), 0))
        dilated = tuple(n * strides[a] if a in strided else n for a, n in enumerate(out))
        ct = _bind1(reshape_p, [ct], (dilated,))
        if dilated != spans:
            ct = _bind1(slice_p, [ct], ((0,) * len(out), spans, (1,) * len(out)))
    widths = tuple((st, d - st - sp) for st, d, sp in zip(starts, x.shape, spans))
    return _bind1(pad_p, [ct], (widths, 0))


slice_p = primitive(
    "slice",
    _slice_aval,
    lambda params, x: lax.slice(x, params[0], params[1], params[2]),
    rules=linear(_slice_t),
    batch=unary_rule(
        lambda p, b, x: lax.slice(x, (0,) * b + p[0], tuple(x.shape[:b]) + p[1], (1,) * b + p[2])
    ),
    shard=_shard.unchanged_dims,
)


def _pad_aval(params, x):
    widths = params[0]
    return ((tuple(d + lo + hi for d, (lo, hi) in zip(x[0], widths)), x[1]),)


def _pad_lower(params, x):
    widths, value = params
    return lax.pad(x, np.array(value, dtype=x.dtype), [(lo, hi, 0) for lo, hi in widths])


def _pad_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(outs[0]):
        return [None]
    return [_bind1(pad_p, [t], (params[0], 0))]


def _pad_vjp(params, cts, primals, outs):
    ct, x = cts[0], primals[0]
    if ct is None or not is_float_tensor(x):
        return [None]
    widths = params[0]
    starts = tuple(lo for lo, _ in widths)
    limits = tuple(lo + d for (lo, _), d in zip(widths, x.shape))
    return [cast_like(_bind1(slice_p, [ct], (starts, limits, (1,) * len(starts))), x)]


pad_p = primitive(
    "pad",
    _pad_aval,
    _pad_lower,
    jvp=_pad_jvp,
    vjp=_pad_vjp,
    batch=unary_rule(lambda p, b, x: _pad_lower((((0, 0),) * b + p[0], p[1]), x)),
    shard=_shard.unchanged_dims,
)


def _rev_t(params, ct, x):
    return _bind1(rev_p, [cast_like(ct, x)], params)


rev_p = primitive(
    "rev",
    lambda params, x: (x,),
    lambda params, x: lax.rev(x, params[0]),
    rules=linear(_rev_t),
    batch=unary_rule(lambda p, b, x: lax.rev(x, shift(p[0], b))),
    shard=_shard.replicate_dims(lambda params, avals: params[0]),
)

# ---- concatenate, split (each other's transpose) ----------------------------------------------


def _concat_aval(params, *avals):
    axis = params[0]
    shape = list(avals[0][0])
    shape[axis] = sum(a[0][axis] for a in avals)
    return ((tuple(shape), params[1]),)


def _concatenate_jvp(params, tangents, primals, outs):
    if all(t is None for t in tangents) or not is_float_tensor(outs[0]):
        return [None]
    dt = params[1]
    ts = [t if t is not None else _filled(x.shape, 0, dt) for t, x in zip(tangents, primals)]
    return [_bind1(concatenate_p, ts, params)]


def _concatenate_vjp(params, cts, primals, outs):
    ct = cts[0]
    if ct is None or not is_float_tensor(outs[0]):
        return [None] * len(primals)
    axis = params[0]
    sizes = tuple(x.shape[axis] for x in primals)
    parts = bind(split_p, [ct._impl], (sizes, axis))
    return [
        cast_like(Tensor._wrap(p), x) if is_float_tensor(x) else None
        for p, x in zip(parts, primals)
    ]


def _concatenate_batch(params, bds, *xs):
    bshape = _batch_shape(xs, bds)
    full = [to_full_batch(x, b, bshape).astype(params[1]) for x, b in zip(xs, bds)]
    return lax.concatenate(full, params[0] + len(bshape))


concatenate_p = primitive(
    "concatenate",
    _concat_aval,
    lambda params, *xs: lax.concatenate([x.astype(params[1]) for x in xs], params[0]),
    jvp=_concatenate_jvp,
    vjp=_concatenate_vjp,
    batch=_concatenate_batch,
    shard=_shard.concatenate,
)


def _split_aval(params, x):
    sizes, axis = params
    outs = []
    for s in sizes:
        shape = list(x[0])
        shape[axis] = s
        outs.append((tuple(shape), x[1]))
    return tuple(outs)


def _split_lower(params, x):
    sizes, axis = params
    return tuple(lax.split(x, sizes, axis))


def _split_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(primals[0]):
        return [None] * len(outs)
    return [Tensor._wrap(o) for o in bind(split_p, [t._impl], params)]


def _split_vjp(params, cts, primals, outs):
    x = primals[0]
    if all(c is None for c in cts) or not is_float_tensor(x):
        return [None]
    parts = [
        cast_like(c, x) if c is not None else _filled(o.shape, 0, x.dtype)
        for c, o in zip(cts, outs)
    ]
    if len(parts) == 1:
        return parts
    return [_bind1(concatenate_p, parts, (params[1], x.dtype))]


split_p = primitive(
    "split",
    _split_aval,
    _split_lower,
    multiple_results=True,
    jvp=_split_jvp,
    vjp=_split_vjp,
    batch=unary_rule(lambda p, b, x: tuple(lax.split(x, p[0], p[1] + b))),
    shard=_shard.replicate_dims(lambda params, avals: (params[1],)),
)

# ---- builders ----------------------------------------------------------------------------------


def reshape(x, *shape) -> Tensor:
    """Reshape to ``shape`` (one ``-1`` is inferred), as ``numpy.reshape``.

    >>> import nablax as nx
    >>> nx.arange(6).reshape(2, -1).shape
    (2, 3)
    """
    return _reshape(x, shape, "reshape")


def _reshape(x, shape: tuple, op: str) -> Tensor:
    xi = _impl(x, op)
    if len(shape) == 1 and not isinstance(shape[0], int):
        shape = tuple(shape[0])
    # the memo takes plain ints only (2.0 == 2, and a float size must still raise)
    key = (xi.shape, shape) if set(map(type, shape)) == _INT_ONLY else None
    out = None if key is None else _RESHAPES.data.get(key)
    if out is not None:  # this request on this shape was checked and resolved before
        if out == xi.shape:
            return x if type(x) is Tensor else Tensor._wrap(xi)
        return unary_tensor(reshape_p, (out,), xi, out, xi.dtype)
    try:
        shape = tuple([d if type(d) is int else as_dim(d) for d in shape])
    except (TypeError, ValueError):
        raise op_error(TypeError, op, f"shape must be ints, got {shape!r}") from None
    if shape == xi.shape:  # already that shape (every size checked as an int above)
        return x if type(x) is Tensor else Tensor._wrap(xi)
    size = math.prod(xi.shape)
    if shape.count(-1) > 1:
        raise op_error(ShapeError, op, f"only one -1 allowed in shape {shape}")
    if -1 in shape:
        known = math.prod(d for d in shape if d != -1)
        if known == 0 or size % known:
            raise op_error(ShapeError, op, f"cannot reshape {xi.shape} into {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    if math.prod(shape) != size or any(d < 0 for d in shape):
        raise op_error(
            ShapeError,
            op,
            f"cannot reshape a tensor of shape {xi.shape} ({size} elements) into {shape}",
            "the product of the new shape must equal the number of elements",
        )
    if key is not None and set(map(type, xi.shape)) <= _INT_ONLY:
        _RESHAPES.put(key, shape)
    if shape == xi.shape:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    # the output aval is known (reshape_p's rule would give (shape, dtype)): the fast entry
    return unary_tensor(reshape_p, (shape,), xi, shape, xi.dtype)


# (input shape, requested shape) -> output shape of a checked reshape (few per model; bounded)
_RESHAPES = _caches.DictCache("ops.reshape_shapes", 1024)


def transpose(x, axes: Sequence[int] | None = None) -> Tensor:
    """Permute axes (reverse them when ``axes`` is None), as ``numpy.transpose``."""
    return _transpose(x, axes, "transpose")


def _transpose(x, axes, op: str) -> Tensor:
    xi = _impl(x, op)
    nd = len(xi.shape)
    if axes is None:
        perm = tuple(range(nd))[::-1]
    elif type(axes) is tuple and (nd, axes) in _PERMS.data and set(map(type, axes)) == _INT_ONLY:
        perm = axes  # plain ints (floats and bools compare equal: hence the type check) seen
    else:
        perm = tuple(norm_axis(op, a, xi.shape) for a in _ints(op, "axes", axes))
        if sorted(perm) != list(range(nd)):
            raise op_error(ShapeError, op, f"axes {tuple(axes)} is not a permutation of {nd} axes")
    if perm is not axes and type(axes) is tuple and axes == perm:
        if set(map(type, axes)) == _INT_ONLY:  # checked plain ints: memoized
            _PERMS.put((nd, perm), True)
    if perm == tuple(range(nd)):
        return x if type(x) is Tensor else Tensor._wrap(xi)
    shape = xi.shape  # the output aval as transpose_p's rule gives it, through the fast entry
    return unary_tensor(transpose_p, (perm,), xi, tuple([shape[p] for p in perm]), xi.dtype)


# (rank, axes) -> True for tuples of plain non-negative ints already checked to be a permutation
# of that rank (attention's head transposes repeat a handful every step; bounded). A lookup also
# checks the element types: ``(0.0, 1.0) == (0, 1)``, and a float axis must still raise.
_PERMS = _caches.DictCache("ops.transpose_perms", 1024)
_INT_ONLY = frozenset((int,))


def moveaxis(x, source, destination) -> Tensor:
    xi = _impl(x, "moveaxis")
    nd = len(xi.shape)
    src = list(_ints("moveaxis", "source", source))
    dst = list(_ints("moveaxis", "destination", destination))
    if len(src) != len(dst):
        raise op_error(ShapeError, "moveaxis", "source and destination need the same length")
    src = [norm_axis("moveaxis", a, nd, "source") for a in src]
    dst = [norm_axis("moveaxis", a, nd, "destination") for a in dst]
    for name, axes in (("source", src), ("destination", dst)):
        if len(set(axes)) != len(axes):
            raise op_error(ShapeError, "moveaxis", f"repeated axis in {name}={axes}")
    order = [a for a in range(nd) if a not in src]
    for d, s in sorted(zip(dst, src)):
        order.insert(d, s)
    return transpose(x, order)


def broadcast_to(x, shape) -> Tensor:
    """Broadcast to ``shape`` with NumPy rules."""
    return _broadcast_to(x, shape, "broadcast_to")


def _broadcast_to(x, shape, op: str) -> Tensor:
    xi = _impl(x, op)
    shape = norm_shape(op, shape)
    nd, xs = len(shape), xi.shape
    if len(xs) > nd or any(d != 1 and d != s for d, s in zip(xs, shape[nd - len(xs) :])):
        raise op_error(ShapeError, op, f"cannot broadcast shape {xs} to {shape}")
    if xs == shape:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    dims = tuple(range(nd - len(xs), nd))  # size-1 operand axes broadcast in lax
    return _wrap1(broadcast_in_dim_p, [xi], (shape, dims))


def expand_dims(x, axis) -> Tensor:
    """Insert axes of size 1 at ``axis`` (int or tuple), as ``numpy.expand_dims``."""
    return _expand_dims(x, axis, "expand_dims")


def _expand_dims(x, axis, op: str) -> Tensor:
    xi = _impl(x, op)
    given = _ints(op, "axis", axis)
    nd = len(xi.shape) + len(given)
    axes = sorted(norm_axis(op, a, nd) for a in given)
    if len(set(axes)) != len(axes):
        raise op_error(ShapeError, op, f"repeated axis in axis={axis}")
    shape = list(xi.shape)
    for a in axes:
        shape.insert(a, 1)
    return reshape(Tensor._wrap(xi), tuple(shape))


def _result_dtype(impls):
    d = impls[0].dtype
    for i in impls[1:]:
        d = promote(d, i.dtype)
    return d


def concatenate(tensors, axis: int | None = 0) -> Tensor:
    """Join tensors along an existing axis (``axis=None`` flattens first)."""
    impls = [_impl(t, "concatenate") for t in tensors]
    if not impls:
        raise op_error(ValueError, "concatenate", "needs at least one tensor")
    if axis is None:
        impls = [reshape(Tensor._wrap(i), -1)._impl for i in impls]
        axis = 0
    nd = len(impls[0].shape)
    if nd == 0:
        raise op_error(ShapeError, "concatenate", "zero-dimensional tensors cannot be concatenated")
    ax = norm_axis("concatenate", axis, nd)
    for k, i in enumerate(impls):
        if len(i.shape) != nd or any(
            a != b for j, (a, b) in enumerate(zip(i.shape, impls[0].shape)) if j != ax
        ):
            raise op_error(
                ShapeError,
                "concatenate",
                f"tensors[{k}] has shape {i.shape}, incompatible with tensors[0] {impls[0].shape} "
                f"(all dimensions except axis {ax} must match)",
            )
    dt = _result_dtype(impls)
    if len(impls) == 1:
        return astype(Tensor._wrap(impls[0]), dt)
    return _wrap1(concatenate_p, impls, (ax, dt))


def _slice(x: Tensor, starts, limits, strides) -> Tensor:
    xi = x._impl
    if all(s == 0 for s in starts) and tuple(limits) == xi.shape and all(s == 1 for s in strides):
        return x
    return _wrap1(slice_p, [xi], (tuple(starts), tuple(limits), tuple(strides)))


def split(x, indices_or_sections, axis: int = 0) -> list[Tensor]:
    """Split into equal sections (int) or at the given indices, as ``numpy.split``.

    All parts come from one multi-output node.

    >>> import nablax as nx
    >>> [p.tolist() for p in nx.split(nx.arange(6), [2, 3])]
    [[0, 1], [2], [3, 4, 5]]
    """
    return _split(x, indices_or_sections, axis, "split")


def _split(x, indices_or_sections, axis: int, op: str) -> list[Tensor]:
    xi = _impl(x, op)
    ax = norm_axis(op, axis, xi.shape)
    n = xi.shape[ax]
    sections = indices_or_sections
    if isinstance(sections, Tensor):
        sections = sections.numpy()
    if type(sections) is int or np.ndim(sections) == 0:  # np.ndim of an int costs microseconds
        (k,) = (sections,) if type(sections) is int else _ints(op, "indices_or_sections", sections)
        if k <= 0 or n % k:
            raise op_error(
                ShapeError, op, f"cannot split axis {ax} of size {n} into {k} equal sections",
                "pass a list of split indices, or use nx.chunk for unequal sections",
            )  # fmt: skip
        sizes = (n // k,) * k
    else:
        idx = [min(max(i if i >= 0 else n + i, 0), n) for i in _ints(op, "indices", sections)]
        bounds = [0, *idx, n]
        sizes = tuple(max(b - a, 0) for a, b in zip(bounds[:-1], bounds[1:]))
        if sum(sizes) != n:  # decreasing indices: fall back to independent slices (NumPy semantics)
            t = Tensor._wrap(xi)
            outs = []
            for a, b in zip(bounds[:-1], bounds[1:]):
                lim = list(xi.shape)
                st = [0] * len(xi.shape)
                st[ax], lim[ax] = a, max(a, b)
                outs.append(_slice(t, st, lim, [1] * len(xi.shape)))
            return outs
    avals = tuple([((*xi.shape[:ax], s, *xi.shape[ax + 1 :]), xi.dtype) for s in sizes])  # known
    return [Tensor._wrap(i) for i in bind_known(split_p, [xi], (sizes, ax), avals)]


def unbind(x, axis: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``x`` along ``axis``, with that axis removed (PyTorch ``unbind``).

    All slices come from one multi-output node (``split``), so they are built and differentiated
    together.

    >>> import nablax as nx
    >>> a, b = nx.unbind(nx.arange(6).reshape(2, 3))
    >>> a.tolist(), b.tolist()
    ([0, 1, 2], [3, 4, 5])
    >>> [t.tolist() for t in nx.arange(6).reshape(2, 3).unbind(1)]
    [[0, 3], [1, 4], [2, 5]]
    """
    xi = _impl(x, "unbind")
    ax = norm_axis("unbind", axis, xi.shape)
    n = xi.shape[ax]
    if type(n) is not int:
        raise op_error(
            ShapeError,
            "unbind",
            f"axis {ax} has a dynamic size ({n}): the number of results must be known",
            "mark another dimension dynamic, or index the tensor instead",
        )
    shape = xi.shape[:ax] + xi.shape[ax + 1 :]
    if n == 0:
        return ()
    parts = bind(split_p, [xi], ((1,) * n, ax)) if n > 1 else [xi]
    return tuple(_wrap1(reshape_p, [p], (shape,)) for p in parts)


def pad(x, pad_width, mode: str = "constant", constant_values=0) -> Tensor:
    """Pad with a constant, as ``numpy.pad`` (``pad_width``: int, (before, after), or per axis)."""
    xi = _impl(x, "pad")
    if mode != "constant":
        raise NotImplementedError(f"nx.pad: mode={mode!r} is not implemented; only 'constant'")
    nd = len(xi.shape)
    try:
        pw = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (nd, 2))
    except (TypeError, ValueError):
        raise op_error(
            ShapeError, "pad", f"pad_width {pad_width!r} does not fit a tensor of rank {nd}"
        ) from None
    if (pw < 0).any():
        raise op_error(ValueError, "pad", f"negative pad widths {pad_width!r}")
    widths = tuple((int(a), int(b)) for a, b in pw)
    value = exact_scalar(constant_values, xi.dtype, "pad")  # checked now, not at realization
    return _wrap1(pad_p, [xi], (widths, value))


def flip(x, axis=None) -> Tensor:
    """Reverse the order of elements along ``axis`` (all axes when None)."""
    xi = _impl(x, "flip")
    axes = norm_axes("flip", axis, xi.shape)
    if not axes:
        return x if type(x) is Tensor else Tensor._wrap(xi)
    return _wrap1(rev_p, [xi], (axes,))

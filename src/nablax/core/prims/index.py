"""Indexing primitives: ``gather`` (``x[idx]``) and ``scatter`` (``x.at[idx].set/add``,
``x[idx] = v``), with every rule of each, and their builders.

Every index expression becomes one ``gather`` (read) or ``scatter`` (update) node whose static
parameter is the *index structure* (ints, slices, ``None``, ``...`` and placeholders for integer
index tensors, which are node inputs). Semantics are NumPy's, computed with NumPy itself on a
zero-strided dummy array, so shapes and errors match NumPy exactly and are raised when the op is
built. Integer index tensors whose values are unknown follow ``x[idx]`` in JAX: a negative index
counts from the end once, then out-of-range reads clamp to the nearest element (and get no
gradient) and out-of-range updates are dropped; concrete NumPy/list indices are bounds-checked like
NumPy. :func:`gather_filled` is the filling read of ``take`` / ``take_along_axis``
(core/ops/index.py), which follow ``jnp.take``'s ``mode=`` instead.

Python integers are runtime values, not program identity (DESIGN.md convention 16): an integer
index ``x[i]`` and the start of a slice ``x[i:i + 4]`` on an axis of known size are bounds-checked
and normalized when the op is built, then travel as 0-d int32 ``Literal`` inputs of the node
(``("I",)`` and ``("S", length, step)`` in the structure), so a loop over positions builds one graph
structure (at most two programs, as for Python scalars: core/realize.py). A slice's *length* stays
in the structure: it is a shape. The lowering cuts a ``lax.dynamic_slice`` window at those
positions and indexes the window statically; updates write the window back with
``lax.dynamic_update_slice``.

Boolean masks depend on data: the mask is realized and turned into integer indices (eager code
only).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ... import _caches
from ...errors import ShapeError, op_error
from .. import dtypes
from ..build import TensorImpl, bind, impl_from_array
from ..host import exact_scalar
from ..primitive import primitive
from ..tensor import Tensor, to_impl
from . import _shard
from ._batch import batched_by_vmap
from ._rules import cast_like, is_float_tensor, unbroadcast
from ._util import broadcast_shapes, is_concrete
from .creation import iota, zeros
from .elementwise import equal, logical_and, where
from .index_dynamic import INT32 as _INT32
from .index_dynamic import T as _T
from .index_dynamic import axes_of as _axes_of
from .index_dynamic import dynamic as _dynamic
from .index_dynamic import position
from .index_dynamic import windows as _windows
from .shape import pad, reshape


def _dummy(shape) -> np.ndarray:
    return np.broadcast_to(np.int8(0), shape)


def _rebuild(structure, idx_values):
    """The index tuple of ``structure`` with ``idx_values`` for its input-carrying items (index
    tensors, dynamic ints and dynamic slice starts, in order). Dynamic ints and starts are used as
    they are (0-d integer arrays: same result shape as ints, see :func:`_gather_shape_uncached`);
    the lowering first turns them static with :func:`_windows`."""
    it = iter(idx_values)
    out = []
    for item in structure:
        if item is _T or item == _T or item[0] == "I":
            out.append(next(it))
        elif item[0] == "S":  # a dynamic start: for shape rules, any start of the same length
            next(it)
            _, length, step = item
            out.append(slice(0, (length - 1) * abs(step) + 1, abs(step)))
        elif item[0] == "i":
            out.append(item[1])
        elif item[0] == "s":
            out.append(slice(item[1], item[2], item[3]))
        elif item[0] == "n":
            out.append(None)
        elif item[0] == "b":
            out.append(item[1])
        else:
            out.append(Ellipsis)
    return tuple(out)


_shape_cache = _caches.Cache("ops.getitem_shapes", 4096)


def _gather_shape(x_shape, structure, idx_avals) -> tuple:
    key = (x_shape, structure, tuple(idx_avals))
    r = _shape_cache.get(key)
    if r is None:
        r = _gather_shape_uncached(x_shape, structure, idx_avals)
        if is_concrete(key):
            _shape_cache.put(key, r)
    return r


def _gather_shape_uncached(x_shape, structure, idx_avals) -> tuple:
    if not all(type(d) is int for s in (x_shape, *(a[0] for a in idx_avals)) for d in s):
        return _symbolic_gather_shape(x_shape, structure, idx_avals)
    dummies = [np.zeros(s, dtype=np.intp) for s, _ in idx_avals]
    try:
        return _dummy(x_shape)[_rebuild(structure, dummies)].shape
    except IndexError as e:
        raise op_error(IndexError, "getitem", f"{e} (tensor shape {x_shape})") from None


def _symbolic_gather_shape(x_shape, structure, idx_avals) -> tuple:
    """Result shape when a size is symbolic (``nx.compile`` with ``dynamic_dims``): JAX's own
    shape rule on abstract values (no NumPy stand-ins)."""
    structs = [jax.ShapeDtypeStruct(s, np.int32) for s, _ in idx_avals]
    out = jax.eval_shape(
        lambda a, *ix: a[_rebuild(structure, ix)], jax.ShapeDtypeStruct(x_shape, np.int8), *structs
    )
    return tuple(out.shape)


def _gather_aval(params, x, *idx):
    return ((_gather_shape(x[0], params[0], idx), x[1]),)


def _gather_lower(params, x, *idx):
    structure = params[0]
    win = _windows(structure, x, idx)
    if win is not None:
        starts, sizes, structure, idx = win
        x = jax.lax.dynamic_slice(x, starts, sizes)
    if len(params) == 1:  # ``x[idx]``: out-of-range reads clamp (JAX indexing)
        return x[_rebuild(structure, idx)]
    # ``(structure, fill)``: out-of-range reads give the fill value (see :func:`fill_code`)
    return x.at[_rebuild(structure, idx)].get(mode="fill", fill_value=fill_value(params[1]))


def fill_code(v):
    """A fill value as a gather parameter: ``None`` (JAX's default fill: NaN, the most negative
    int, the largest unsigned, True) or a hashable exact code (floats by their hex form, so
    ``-0.0`` and ``0.0`` are different programs and NaN equals NaN)."""
    if v is None:
        return None
    if isinstance(v, float):
        return ("f", v.hex())
    if isinstance(v, complex):
        return ("c", v.real.hex(), v.imag.hex())
    return ("x", v)


def fill_value(code):
    """The Python value of :func:`fill_code`'s ``code``."""
    if code is None:
        return None
    if code[0] == "f":
        return float.fromhex(code[1])
    if code[0] == "c":
        return complex(float.fromhex(code[1]), float.fromhex(code[2]))
    return code[1]


# ---- gather; derivative rules (signatures: _rules.py) ----------------------------------------
# gather and scatter are linear in the gathered tensor / the updated tensor and the updates; their
# rules are gathers and scatters with the same index structure and the same index tensors. Both
# batch through jax.vmap of their lowering (batched_by_vmap).


def _idx_ref(i):
    """An index operand for a rule's gather/scatter: a Tensor's impl, or a dynamic int or start
    (rules see those as the Python int itself, see :func:`_dynamic`) as its ``Literal`` again."""
    return i._impl if isinstance(i, Tensor) else position(i)


def _gather(x: Tensor, structure, idx, params=None) -> Tensor:
    params = (structure,) if params is None else params
    return Tensor._wrap(bind(gather_p, [x._impl, *(_idx_ref(i) for i in idx)], params)[0])


def _scatter(x: Tensor, v: Tensor, structure, idx, mode: str) -> Tensor:
    impls = [x._impl, v._impl, *(_idx_ref(i) for i in idx)]
    return Tensor._wrap(bind(scatter_p, impls, (structure, mode))[0])


def _zeros(shape, dtype) -> Tensor:
    return zeros(shape, dtype)


def _gather_jvp(params, tangents, primals, outs):
    t = tangents[0]
    if t is None or not is_float_tensor(outs[0]):
        return [None]
    # a filling gather's tangent is 0 where it filled (the fill value is a constant)
    tp = params if len(params) == 1 else (params[0], fill_code(0))
    return [_gather(cast_like(t, outs[0]), params[0], primals[1:], tp)]


def _gather_vjp(params, cts, primals, outs):
    ct, x, idx = cts[0], primals[0], primals[1:]
    res = [None] * len(primals)
    if ct is not None and is_float_tensor(x):
        res[0] = _scatter(_zeros(x.shape, x.dtype), cast_like(ct, x), params[0], idx, "add")
    return res


def _gather_shard(params, in_layouts, in_avals, out_avals):
    """Basic indexing (ints, slices, ``None``, ``...``): a fully sliced dimension keeps its axes,
    a partly sliced one is replicated, an integer index removes it. Array indices: replicated."""
    structure = params[0]
    lay, (in_shape, _) = in_layouts[0], in_avals[0]
    if any(s == _T or s[0] not in "isneIS" for s in structure):
        return _shard.replicated(params, in_layouts, in_avals, out_avals)
    n_ell = len(in_shape) - sum(1 for s in structure if s[0] in "isIS")
    out, d = [], 0
    for s in structure:
        if s[0] == "n":
            out.append(())
        elif s[0] == "e":
            out.extend(lay[d : d + n_ell])
            d += n_ell
        elif s[0] in "iI":
            d += 1
        else:
            out.append(lay[d] if s[0] == "s" and s[1:] == (None, None, None) else ())
            d += 1
    out.extend(lay[d:])
    return (tuple(out),)


gather_p = primitive(
    "gather",
    _gather_aval,
    _gather_lower,
    jvp=_gather_jvp,
    vjp=_gather_vjp,
    shard=_gather_shard,
    rules=batched_by_vmap,
    doc="x[index] (params: (structure,)); with (structure, fill), out-of-range reads give fill.",
)


# ---- scatter ---------------------------------------------------------------------------------


def _scatter_aval(params, x, v, *idx):
    return (x,)


def _scatter_lower(params, x, v, *idx):
    structure, mode = params
    v = v.astype(x.dtype)
    win = _windows(structure, x, idx)
    if win is None:
        ref = x.at[_rebuild(structure, idx)]
        return ref.set(v) if mode == "set" else ref.add(v)
    starts, sizes, structure, idx = win
    ref = jax.lax.dynamic_slice(x, starts, sizes).at[_rebuild(structure, idx)]
    return jax.lax.dynamic_update_slice(x, ref.set(v) if mode == "set" else ref.add(v), starts)


def _scatter_jvp(params, tangents, primals, outs):
    x, v, idx = primals[0], primals[1], primals[2:]
    tx, tv = tangents[0], tangents[1] if is_float_tensor(v) else None
    if not is_float_tensor(outs[0]) or (tx is None and tv is None):
        return [None]
    structure, mode = params
    if tx is None:
        tx = _zeros(x.shape, x.dtype)
    if tv is None:
        return [tx if mode == "add" else _scatter(tx, _zeros((), x.dtype), structure, idx, mode)]
    return [_scatter(cast_like(tx, x), cast_like(tv, x), structure, idx, mode)]


def _scatter_vjp(params, cts, primals, outs):
    ct, x, v, idx = cts[0], primals[0], primals[1], primals[2:]
    res = [None] * len(primals)
    if ct is None or not is_float_tensor(outs[0]):
        return res
    structure, mode = params
    ct = cast_like(ct, x)
    if mode == "add":
        res[0] = ct
    else:  # positions that were overwritten do not depend on x
        res[0] = _scatter(ct, _zeros((), ct.dtype), structure, idx, "set")
    if is_float_tensor(v):
        if not any(s == _T for s in structure):  # basic: positions distinct and in range
            g = _gather(ct, structure, idx)
        elif mode == "add":
            g = _gather_or_zero(ct, structure, idx)
        else:
            g = _gather_winners(ct, x.shape, structure, idx)
        res[1] = cast_like(unbroadcast(g, v.shape), v)
    return res


def _gather_or_zero(ct: Tensor, structure, idx) -> Tensor:
    """``ct[index]`` with zeros where an index is out of range (the updates a scatter dropped):
    each axis indexed by a tensor gets one zero slot at its end, and out-of-range indices point
    there (dynamic ints and starts were checked when the op was built: they pass unchanged)."""
    axes = [a for s, a in zip(structure, _axes_of(structure, ct.ndim)) if s == _T or s[0] in "IS"]
    kinds = [s for s in structure if s == _T or s[0] in "IS"]
    widths = [(0, 0)] * ct.ndim
    new_idx = []
    for t, a, s in zip(idx, axes, kinds):
        if s != _T:
            new_idx.append(t)
            continue
        n = ct.shape[a]
        widths[a] = (0, 1)
        if t.dtype.kind == "u":
            new_idx.append(where(t < n, t, n))
        else:
            ok = logical_and(t >= -n, t < n)
            new_idx.append(where(ok, where(t < 0, t + n, t), n))
    return _gather(pad(ct, widths), structure, new_idx)


def _gather_winners(ct: Tensor, shape, structure, idx) -> Tensor:
    """``ct[index]`` where each update wrote the value that stayed, else zero (as JAX: with
    duplicate indices one update wins; out-of-range updates are dropped). Each update element gets
    an id; the ids are scattered like the updates and read back."""
    # dynamic ints and starts reach rules as Python ints: 0-d int32 operands
    avals = [((), _INT32) if isinstance(i, int) else (i.shape, i.dtype) for i in idx]
    target = _gather_shape(shape, structure, avals)
    count = int(np.prod(target, dtype=np.int64))
    ids = reshape(iota(dtypes.int32, (count,), 0) + 1, target)
    written = _scatter(_zeros(shape, dtypes.int32), ids, structure, idx, "set")
    won = equal(_gather(written, structure, idx), ids)
    return where(won, _gather(ct, structure, idx), 0.0)


scatter_p = primitive(
    "scatter",
    _scatter_aval,
    _scatter_lower,
    jvp=_scatter_jvp,
    vjp=_scatter_vjp,
    shard=_shard.same_as_input,  # the output is the operand, updated: its layout
    rules=batched_by_vmap,
)


# ---- index parsing ---------------------------------------------------------------------------


def _as_int(v, what: str) -> int | None:
    if v is None:
        return None
    if isinstance(v, Tensor):
        return int(v)
    try:
        return int(np.asarray(v).__index__()) if not isinstance(v, int) else v
    except TypeError:
        raise IndexError(f"nx.getitem: {what} must be an int or None, got {v!r}") from None


def _parse(x: TensorImpl, idx):
    """Index expression -> (structure, index impls, NumPy stand-in index or None).

    The stand-in is the same index with NumPy values (masks as masks, concrete integer arrays as
    themselves, pending index tensors as zeros); it is returned only when NumPy must validate it
    (mask lengths, bounds of concrete indices).
    """
    if not isinstance(idx, tuple):
        idx = (idx,)
    structure: list = []
    tensors: list[TensorImpl] = []
    raw: list = []
    check = False
    for item in idx:
        if item is None:
            structure.append(("n",))
            raw.append(None)
        elif item is Ellipsis:
            structure.append(("e",))
            raw.append(Ellipsis)
        elif isinstance(item, slice):
            sl = (
                "s",
                _as_int(item.start, "slice start"),
                _as_int(item.stop, "slice stop"),
                _as_int(item.step, "slice step"),
            )
            structure.append(sl)
            raw.append(slice(sl[1], sl[2], sl[3]))
        elif isinstance(item, (bool, np.bool_)):
            structure.append(("b", bool(item)))  # NumPy: a new axis of length 1 (True) or 0
            raw.append(bool(item))
        elif isinstance(item, (int, np.integer)):
            structure.append(("i", int(item)))
            raw.append(int(item))
        elif isinstance(item, Tensor):
            if item.dtype == dtypes.bool_:
                check |= _add_mask(item.numpy(), structure, tensors, raw)  # realizes: shape is data
            elif dtypes.is_integer(item.dtype):
                structure.append(_T)
                tensors.append(item._impl)
                symbolic = not all(type(d) is int for d in item.shape)  # dynamic_dims
                raw.append(None if symbolic else _Zeros(item.shape))  # made only if checked
            else:
                raise IndexError(
                    f"nx.getitem: index tensors must be integer or bool, got {item.dtype}"
                )
        else:
            arr = np.asarray(item)
            if arr.dtype == np.bool_:
                check |= _add_mask(arr, structure, tensors, raw)
            elif arr.dtype.kind in "iu" or (arr.size == 0 and arr.dtype.kind in "fO"):
                arr = arr.astype(np.int32)
                structure.append(_T)
                tensors.append(impl_from_array(_device(arr)))
                raw.append(arr)
                check = True
            else:
                raise IndexError(
                    f"nx.getitem: only integers, slices, None, ..., and integer or boolean "
                    f"arrays are valid indices, got {type(item).__name__} {item!r}"[:200]
                )
    structure, tensors = _dynamic(x.shape, structure, tensors)
    if not check:
        return tuple(structure), tensors, None
    stand_in = tuple(np.zeros(r.shape, np.intp) if type(r) is _Zeros else r for r in raw)
    return tuple(structure), tensors, stand_in


class _Zeros:
    """Stand-in of a pending integer index tensor of known shape: zeros of that shape, made
    only when NumPy must validate the index (most indexing with a tensor needs no check)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape


def _device(arr):
    return jnp.asarray(arr)


def _add_mask(mask: np.ndarray, structure, tensors, raw) -> bool:
    if mask.ndim == 0:
        structure.append(("b", bool(mask)))
        raw.append(bool(mask))
        return False
    for a in np.nonzero(mask):
        structure.append(_T)
        tensors.append(impl_from_array(_device(a.astype(np.int32))))
    raw.append(mask)  # NumPy checks the mask's shape against the axes it covers
    return True


def _check(x: TensorImpl, raw, op: str) -> None:
    if raw is None:
        return
    try:
        _dummy(x.shape)[raw]
    except IndexError as e:
        raise op_error(IndexError, op, f"{e} (tensor shape {x.shape})") from None


def getitem(x, idx) -> Tensor:
    """``x[idx]`` with NumPy semantics (basic and advanced indexing, boolean masks).

    Out-of-range indices: concrete ones (ints, lists, NumPy arrays) raise ``IndexError`` when the
    op is built, as NumPy; integer index tensors behave as in JAX (``-1`` is the last element,
    other out-of-range reads clamp and pass no gradient back). Use :func:`take` with ``mode=``
    to choose what out-of-range indices give.

    >>> import nablax as nx
    >>> x = nx.arange(12).reshape(3, 4)
    >>> x[1:, [0, 3]].tolist()
    [[4, 7], [8, 11]]
    >>> x[x % 5 == 0].tolist()
    [0, 5, 10]
    """
    xi = x._impl if isinstance(x, Tensor) else to_impl(x, op="getitem")
    structure, tensors, raw = _parse(xi, idx)
    _check(xi, raw, "getitem")
    if all(s == ("s", None, None, None) for s in structure) or structure == (("e",),):
        return Tensor._wrap(xi)
    return Tensor._wrap(bind(gather_p, [xi, *tensors], (structure,))[0])


def _update(x, idx, v, mode: str) -> Tensor:
    xi = x._impl if isinstance(x, Tensor) else to_impl(x, op=f"at[].{mode}")
    structure, tensors, raw = _parse(xi, idx)
    _check(xi, raw, f"at[].{mode}")
    target = _gather_shape(xi.shape, structure, [(t.shape, t.dtype) for t in tensors])
    vi = v._impl if isinstance(v, Tensor) else to_impl(v, xi.dtype, f"at[].{mode}")
    try:
        if broadcast_shapes("at[].set", vi.shape, target) != target:
            raise ShapeError
    except ShapeError:
        raise op_error(
            ShapeError,
            f"at[].{mode}",
            f"value of shape {vi.shape} cannot be broadcast to the indexed shape {target}",
        ) from None
    return Tensor._wrap(bind(scatter_p, [xi, vi, *tensors], (structure, mode))[0])


class _IndexUpdateRef:
    __slots__ = ("_x", "_idx")

    def __init__(self, x, idx) -> None:
        self._x = x
        self._idx = idx

    def set(self, values) -> Tensor:
        """A new tensor equal to ``x`` with ``x[idx]`` replaced by ``values``."""
        return _update(self._x, self._idx, values, "set")

    def add(self, values) -> Tensor:
        """A new tensor with ``values`` added at ``idx`` (duplicate indices accumulate)."""
        return _update(self._x, self._idx, values, "add")

    def get(self) -> Tensor:
        return getitem(self._x, self._idx)


class _IndexUpdateHelper:
    """``x.at[idx]``: functional updates, as ``jax.Array.at``."""

    __slots__ = ("_x",)

    def __init__(self, x) -> None:
        self._x = x

    def __getitem__(self, idx) -> _IndexUpdateRef:
        return _IndexUpdateRef(self._x, idx)


def _setitem(self: Tensor, idx, value) -> None:
    # Rebind this tensor object to the updated value; tensors computed from it earlier keep theirs.
    self._impl = _update(self, idx, value, "set")._impl


def gather_filled(op: str, t: Tensor, index: tuple, fill) -> Tensor:
    """``t[index]`` where index tensors out of range (after wrapping negative ones once) read
    ``fill`` (``None``: JAX's default fill, see :func:`fill_code`): one ``gather`` node."""
    if fill is not None:
        fill = exact_scalar(fill, t.dtype, op)
        if t.dtype == dtypes.bool_:
            fill = bool(fill)
        elif dtypes.is_inexact(t.dtype) and fill != fill:
            fill = None  # NaN: the default fill of inexact dtypes
    structure, tensors, _ = _parse(t._impl, index)
    return Tensor._wrap(bind(gather_p, [t._impl, *tensors], (structure, fill_code(fill)))[0])

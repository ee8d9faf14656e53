"""``Tensor``, the user's object: every public method and attribute, declared here.

A ``Tensor`` is a thin facade over a ``TensorImpl`` (core/build.py: a pending node output or a
realized ``jax.Array``), so that ``x[i] = v`` can rebind ``x`` to a new impl while tensors computed
from ``x`` earlier keep the old one.

The methods are thin delegations to the op families (core/ops/*.py) and the autodiff transform
(core/transforms/vjp.py). Those sit above this module and import it, so this module reaches them
through module references that core/hooks.py binds once, when ``nablax.core.ops`` is imported
(no import of a module above this one, not even under ``TYPE_CHECKING``). Also here:
:func:`to_impl` (anything array-like as an impl); ``nx.realize`` is in core/realize_api.py.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from ..errors import ConcretizationError
from . import dtypes
from .build import TensorImpl, impl_from_array, value_impl
from .context import CTX
from .graph import _compiled
from .mesh import DeviceMesh
from .realize import realize_impls

# The modules the methods delegate to: they are built on Tensor and import this module, so
# core/hooks.py binds them when nablax.core.ops is imported (late binding 1 there).
_elementwise: Any = None
_index: Any = None
_linalg: Any = None
_masks: Any = None
_nn: Any = None
_reduce: Any = None
_shape: Any = None
_sharding: Any = None
_autodiff: Any = None


def to_impl(x: Any, dtype=None, op: str = "tensor") -> TensorImpl:
    """Any array-like (Tensor, jax/NumPy array, nested lists, scalars) as a ``TensorImpl``;
    ``op`` names the public function in error messages. A Tensor or ``jax.Array`` is shared (cast
    on the device if ``dtype`` differs); host data is copied and converted exactly (core/host.py).
    """
    if type(x) is Tensor and dtype is None:
        return x._impl
    if isinstance(x, Tensor):
        return _cast(x._impl, dtype)
    return value_impl(x, dtype, op)


def _cast(impl: TensorImpl, dtype) -> TensorImpl:
    if dtype is None or impl.dtype == dtypes.canonicalize(dtype):
        return impl
    return Tensor._wrap(impl).astype(dtype)._impl  # the method core/ops/elementwise.py installs


def _batched_read(t, what: str):
    raise ConcretizationError(
        f"nx.vmap: cannot {what} a tensor inside a vmapped function: it has a different value "
        f"for each example (per-example shape {t.shape}, batch {t._impl.batch_shape}). Fix: use "
        f"nx.where(cond, a, b) or nx.cond to choose per example instead of a Python if, "
        f"nx.while_loop instead of a Python while, and read values "
        f"after nx.vmap returns"
    )


def _unary_method(name: str) -> Callable[[Tensor], Tensor]:
    """``Tensor.<name>()``: the element-wise function ``nx.<name>`` of core/ops/elementwise.py."""

    def method(self: Tensor) -> Tensor:
        return getattr(_elementwise, name)(self)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = f"Element-wise ``nx.{name}(x)`` (core/ops/elementwise.py)."
    return method


class Tensor:
    """A lazy-eager n-dimensional array.

    Operations record a graph; values are computed (one XLA program for all pending work) when one
    is needed: ``numpy()``, ``item()``, ``print``, ``bool()``, ``float()``, iteration, or
    ``nx.realize``.

    >>> import nablax as nx
    >>> x = nx.tensor([[1., 2.], [3., 4.]])
    >>> y = x @ x.T + 1
    >>> y.is_realized
    False
    >>> y.tolist()
    [[6.0, 12.0], [12.0, 26.0]]
    """

    __slots__ = ("_impl", "_grad", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer to our reflected operators (np_array + tensor)
    __array_priority__ = 1000

    def __init__(self, data: Any, dtype=None) -> None:
        self._impl = to_impl(data, dtype)

    @classmethod
    def _wrap_py(cls, impl: TensorImpl) -> Tensor:
        """A new tensor of ``impl`` (no ``__init__``). ``_wrap`` is this classmethod, or its
        compiled equivalent (core/_graphc.c's ``wrap``) when the optional extension is built:
        ops wrap every output they build."""
        t = object.__new__(cls)
        t._impl = impl
        return t

    _wrap = _wrap_py

    # ---- attributes -------------------------------------------------------------------------
    # read on every op built: C getters (operator.attrgetter), no Python frame per access
    shape: tuple = property(  # type: ignore[assignment]
        operator.attrgetter("_impl.shape"), doc="The logical shape, a tuple of ints."
    )
    dtype: np.dtype = property(  # type: ignore[assignment]
        operator.attrgetter("_impl.dtype"), doc="The element type, a NumPy dtype."
    )

    @property
    def ndim(self) -> int:
        return len(self._impl.shape)

    @property
    def size(self) -> int:
        return int(math.prod(self._impl.shape))  # exact Python ints (np.prod: 3 us an item())

    @property
    def sharding(self):
        """The ``ShardingSpec`` of this tensor, or ``None`` (see core/sharding.py)."""
        s = self._impl.sharding
        if s is None:  # computed only when read: nothing extra on the op-building path
            return _sharding_of(self._impl)
        return s

    @property
    def is_realized(self) -> bool:
        return self._impl.value is not None

    # ---- realization ------------------------------------------------------------------------
    def _realized_value(self) -> jax.Array:
        impl = self._impl
        if impl.batch_shape:
            _batched_read(self, "read the value of")
        if impl.value is None:
            realize_impls([impl])
        return impl.value

    def to_jax(self) -> jax.Array:
        """The value as a ``jax.Array`` (realizes)."""
        return self._realized_value()

    def block_until_ready(self) -> Tensor:
        """Realize this tensor and wait until its value is computed; returns ``self``.

        Programs run asynchronously (reading a value waits only for that value), so timing code
        should call this, like ``jax.Array.block_until_ready``.
        """
        self._realized_value().block_until_ready()
        return self

    def numpy(self) -> np.ndarray:
        """The value as a NumPy array (realizes)."""
        return np.asarray(_sharding._host_readable(self._realized_value(), "Tensor.numpy"))

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        a = np.asarray(_sharding._host_readable(self._realized_value(), "Tensor.__array__"))
        return a if dtype is None else a.astype(dtype)

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(
                f"Tensor.item: only a tensor with exactly one element can become a Python scalar, "
                f"got shape {self.shape}. Fix: index it first, e.g. x[0].item()"
            )
        return self.numpy().item()

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def _scalar(self, kind: str):
        if self.size != 1:
            raise TypeError(
                f"{kind}(Tensor): only one-element tensors can be converted to Python scalars, "
                f"got shape {self.shape}"
            )
        return self.numpy().reshape(())[()]

    def __float__(self) -> float:
        return float(self._scalar("float"))

    def __int__(self) -> int:
        return int(self._scalar("int"))

    def __complex__(self) -> complex:
        return complex(self._scalar("complex"))

    def __index__(self) -> int:
        if not dtypes.is_integer(self.dtype) or self.ndim:
            raise TypeError(
                f"only 0-d integer tensors can be used as an index, got {self.dtype}{list(self.shape)}"
            )
        return int(self.numpy())

    def __bool__(self) -> bool:
        if self._impl.batch_shape:
            _batched_read(self, "take the truth value (Python if/while/and/or) of")
        if self.size != 1:
            raise ValueError(
                f"The truth value of a tensor with shape {self.shape} is ambiguous. "
                f"Fix: use x.any() / x.all(), or nx.where for element-wise choices"
            )
        return bool(self._scalar("bool"))

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d tensor")
        impl, src = self._impl, self._impl.src
        if impl.batch_shape or CTX.tracing_depth or (src is not None and src[0].trace):
            # traced (compile, vmap, grad): index lazily, so ``k1, k2 = nx.random.split(k)`` and
            # ``zip(layers, keys)`` are no graph break and keep gradients
            return (self[i] for i in range(self.shape[0]))
        v = self._realized_value()
        return (Tensor._wrap(impl_from_array(v[i])) for i in range(self.shape[0]))

    def __repr__(self) -> str:
        if self._impl.batch_shape:
            return (
                f"tensor(<batched by nx.vmap: {self._impl.batch_shape} examples>, "
                f"shape={self.shape}, dtype={self.dtype})"
            )
        a = self.numpy()
        body = np.array2string(a, separator=", ", prefix="tensor(")
        return f"tensor({body}, dtype={self.dtype})"

    def __str__(self) -> str:
        return str(self.numpy())

    __hash__ = object.__hash__

    def __reduce__(self):
        return (Tensor, (self.numpy(),))

    # ---- Arithmetic, bitwise and comparison operators (core/ops/elementwise.py; Python scalars are weakly
    # typed; ``==`` compares element-wise, so ``__hash__`` is identity, declared above) ----

    def __add__(self, other) -> Tensor:
        return _elementwise.add(self, other)

    __radd__ = __add__  # commutative: x + y == y + x exactly, in value and dtype

    def __sub__(self, other) -> Tensor:
        return _elementwise.subtract(self, other)

    def __rsub__(self, other) -> Tensor:
        return _elementwise.subtract(other, self)

    def __mul__(self, other) -> Tensor:
        return _elementwise.multiply(self, other)

    __rmul__ = __mul__  # commutative: x + y == y + x exactly, in value and dtype

    def __truediv__(self, other) -> Tensor:
        return _elementwise.divide(self, other)

    def __rtruediv__(self, other) -> Tensor:
        return _elementwise.divide(other, self)

    def __floordiv__(self, other) -> Tensor:
        return _elementwise.floor_divide(self, other)

    def __rfloordiv__(self, other) -> Tensor:
        return _elementwise.floor_divide(other, self)

    def __mod__(self, other) -> Tensor:
        return _elementwise.mod(self, other)

    def __rmod__(self, other) -> Tensor:
        return _elementwise.mod(other, self)

    def __pow__(self, other) -> Tensor:
        return _elementwise.power(self, other)

    def __rpow__(self, other) -> Tensor:
        return _elementwise.power(other, self)

    def __matmul__(self, b) -> Tensor:
        return _linalg.matmul(self, b)

    matmul = __matmul__

    def __rmatmul__(self, other) -> Tensor:
        return _linalg.matmul(other, self)

    def __neg__(self) -> Tensor:
        return _elementwise.negative(self)

    def __pos__(self) -> Tensor:
        return self

    def __invert__(self) -> Tensor:
        return _elementwise.invert(self)

    def __and__(self, other) -> Tensor:
        return _elementwise.bitwise_and(self, other)

    __rand__ = __and__  # commutative: x + y == y + x exactly, in value and dtype

    def __or__(self, other) -> Tensor:
        return _elementwise.bitwise_or(self, other)

    __ror__ = __or__  # commutative: x + y == y + x exactly, in value and dtype

    def __xor__(self, other) -> Tensor:
        return _elementwise.bitwise_xor(self, other)

    __rxor__ = __xor__  # commutative: x + y == y + x exactly, in value and dtype

    def __eq__(self, other) -> Tensor:  # type: ignore[override]  # elementwise, as NumPy
        return _elementwise.equal(self, other)

    def __ne__(self, other) -> Tensor:  # type: ignore[override]  # elementwise, as NumPy
        return _elementwise.not_equal(self, other)

    def __lt__(self, other) -> Tensor:
        return _elementwise.less(self, other)

    def __le__(self, other) -> Tensor:
        return _elementwise.less_equal(self, other)

    def __gt__(self, other) -> Tensor:
        return _elementwise.greater(self, other)

    def __ge__(self, other) -> Tensor:
        return _elementwise.greater_equal(self, other)

    # ---- Element-wise functions (core/ops/elementwise.py) ----

    exp = _unary_method("exp")
    log = _unary_method("log")
    log1p = _unary_method("log1p")
    expm1 = _unary_method("expm1")
    sqrt = _unary_method("sqrt")
    rsqrt = _unary_method("rsqrt")
    sin = _unary_method("sin")
    cos = _unary_method("cos")
    tan = _unary_method("tan")
    tanh = _unary_method("tanh")
    sigmoid = _unary_method("sigmoid")
    erf = _unary_method("erf")
    floor = _unary_method("floor")
    ceil = _unary_method("ceil")
    sign = _unary_method("sign")
    isnan = _unary_method("isnan")
    isinf = _unary_method("isinf")
    isfinite = _unary_method("isfinite")
    arcsin = _unary_method("arcsin")
    arccos = _unary_method("arccos")
    arctan = _unary_method("arctan")
    sinh = _unary_method("sinh")
    cosh = _unary_method("cosh")
    arcsinh = _unary_method("arcsinh")
    arccosh = _unary_method("arccosh")
    arctanh = _unary_method("arctanh")
    trunc = _unary_method("trunc")
    log2 = _unary_method("log2")
    log10 = _unary_method("log10")
    exp2 = _unary_method("exp2")
    reciprocal = _unary_method("reciprocal")
    abs = _unary_method("abs")
    square = _unary_method("square")

    asin, acos, atan = arcsin, arccos, arctan  # the Array API's names
    asinh, acosh, atanh = arcsinh, arccosh, arctanh
    __abs__ = abs

    def round(self, decimals: int = 0) -> Tensor:
        return _elementwise.round(self, decimals)

    def astype(self, dtype) -> Tensor:
        return _elementwise.astype(self, dtype)

    def clip(self, min=None, max=None) -> Tensor:
        return _elementwise.clip(self, min, max)

    def maximum(self, other) -> Tensor:
        return _elementwise.maximum(self, other)

    def minimum(self, other) -> Tensor:
        return _elementwise.minimum(self, other)

    # ---- Shapes (core/ops/shape.py) ----

    def transpose(self, *axes) -> Tensor:
        """``x.transpose()``, ``x.transpose(1, 0, 2)`` or ``x.transpose((1, 0, 2))``."""
        one = len(axes) == 1 and not isinstance(axes[0], int)
        return _shape.transpose(self, axes[0] if one else (axes or None))

    @property
    def T(self) -> Tensor:  # noqa: N802 - NumPy's name
        return _shape.transpose(self)

    def reshape(self, *shape) -> Tensor:
        return _shape.reshape(self, *shape)

    def permute(self, *dims) -> Tensor:
        return _shape.permute(self, *dims)

    def swapaxes(self, axis1: int, axis2: int) -> Tensor:
        return _shape.swapaxes(self, axis1, axis2)

    def squeeze(self, axis=None) -> Tensor:
        return _shape.squeeze(self, axis)

    def unsqueeze(self, dim: int) -> Tensor:
        return _shape.unsqueeze(self, dim)

    def ravel(self) -> Tensor:
        return _shape.ravel(self)

    flatten = ravel

    def broadcast_to(self, shape) -> Tensor:
        return _shape.broadcast_to(self, shape)

    def flip(self, axis=None) -> Tensor:
        return _shape.flip(self, axis)

    def repeat(self, repeats, axis: int | None = None) -> Tensor:
        return _shape.repeat(self, repeats, axis)

    def unbind(self, axis: int = 0) -> tuple[Tensor, ...]:
        return _shape.unbind(self, axis)

    # ---- Reductions, scans and sorting (core/ops/reduce.py) ----

    def sum(self, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
        return _reduce.sum(self, axis, keepdims, dtype)

    def prod(self, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
        return _reduce.prod(self, axis, keepdims, dtype)

    def max(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.max(self, axis, keepdims)

    def min(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.min(self, axis, keepdims)

    def all(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.all(self, axis, keepdims)

    def any(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.any(self, axis, keepdims)

    def mean(self, axis=None, keepdims: bool = False, dtype=None) -> Tensor:
        return _reduce.mean(self, axis, keepdims, dtype)

    def var(self, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
        return _reduce.var(self, axis, keepdims, ddof)

    def std(self, axis=None, keepdims: bool = False, ddof: int = 0) -> Tensor:
        return _reduce.std(self, axis, keepdims, ddof)

    def argmax(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.argmax(self, axis, keepdims)

    def argmin(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.argmin(self, axis, keepdims)

    def cumsum(self, axis=None, dtype=None) -> Tensor:
        return _reduce.cumsum(self, axis, dtype)

    def sort(self, axis: int | None = -1) -> Tensor:
        return _reduce.sort(self, axis)

    def argsort(self, axis: int | None = -1) -> Tensor:
        return _reduce.argsort(self, axis)

    def logsumexp(self, axis=None, keepdims: bool = False) -> Tensor:
        return _reduce.logsumexp(self, axis, keepdims)

    def topk(self, k: int, axis: int = -1) -> tuple[Tensor, Tensor]:
        return _reduce.topk(self, k, axis)

    # ---- Indexing and updates (core/ops/index.py) ----

    def __getitem__(self, idx) -> Tensor:
        return _index.getitem(self, idx)

    def __setitem__(self, idx, value) -> None:
        """``x[idx] = v``: rebinds ``x`` to the updated tensor (tensors made from ``x`` before keep
        the old values)."""
        _index._setitem(self, idx, value)

    @property
    def at(self) -> Any:
        """JAX-style functional updates: ``x.at[idx].set(v)`` / ``.add(v)`` / ``.multiply(v)`` /
        ``.min(v)`` / ``.max(v)`` / ``.get()``."""
        return _index._IndexUpdateHelper(self)

    def take(
        self, indices, axis: int | None = None, mode: str | None = None, fill_value=None
    ) -> Tensor:
        return _index.take(self, indices, axis, mode, fill_value)

    # ---- Linear algebra (core/ops/linalg.py) ----

    def dot(self, b) -> Tensor:
        return _linalg.dot(self, b)

    # ---- Masking (core/ops/masks.py) ----

    def triu(self, k: int = 0) -> Tensor:
        return _masks.triu(self, k)

    def tril(self, k: int = 0) -> Tensor:
        return _masks.tril(self, k)

    def masked_fill(self, mask, value) -> Tensor:
        return _masks.masked_fill(self, mask, value)

    # ---- Neural-network functions (core/ops/nn.py) ----

    def relu(self) -> Tensor:
        return _nn.relu(self)

    def softmax(self, axis=-1) -> Tensor:
        return _nn.softmax(self, axis)

    def log_softmax(self, axis=-1) -> Tensor:
        return _nn.log_softmax(self, axis)

    # ---- PyTorch-style autograd (core/transforms/vjp.py) ----

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        return _autodiff.requires_grad_(self, requires_grad)

    @property
    def requires_grad(self) -> bool:
        return self in _autodiff.LEAVES

    def backward(self, gradient=None) -> None:
        _autodiff._backward(self, gradient)

    @property
    def grad(self) -> Tensor | None:
        """Accumulated gradient (PyTorch style), set by ``backward()``; assignable."""
        return getattr(self, "_grad", None)

    @grad.setter
    def grad(self, value) -> None:
        self._grad = value

    # ---- Sharding (core/sharding.py) ----

    def shard(self, mesh: DeviceMesh, dim_specs) -> Tensor:
        return _sharding._shard(self, mesh, dim_specs)

    def to_local(self) -> Tensor:
        """This process's piece of a tensor sharded over several processes' devices (the whole
        value for a tensor on this process only); no communication."""
        return _sharding._to_local(self)


if _compiled is not None:  # the optional extension (core/_graphc.c): Tensor._wrap compiled
    _compiled.setup_tensor(Tensor)
    Tensor._wrap = classmethod(_compiled.wrap)  # type: ignore[assignment]


def _no_sharding_rules(impl):
    raise AssertionError("nablax: core/sharding.py was not imported")  # nablax/__init__ imports it


# ``Tensor.sharding`` of a tensor without an explicit spec: layouts propagated through the ops'
# sharding rules. core/sharding.py, a layer above this module, sets it through core/hooks.py
# (late binding 2 there) when it is imported.
_sharding_of = _no_sharding_rules

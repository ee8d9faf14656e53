"""Symbolic sizes as the user's code sees them under ``nx.compile(dynamic_dims=...)``.

A shape-polymorphic trace runs the user's Python once for every size, so a Python *decision* on
a size (``if n % 2 == 0``, ``range(n)``, ``int(n)``, ``n in (2, 4)``, a dict keyed by ``n``) must
come out the same for every size, or the program is wrong for some sizes. JAX's symbolic
dimensions (``jax.export``) decide ``<``, ``<=``, ``>``, ``>=`` soundly (from bounds; every size is
at least 1) or raise ``InconclusiveDimensionOperation``, but answer ``==`` and ``!=``
structurally: ``n % 2 == 0`` and ``n == 1`` are ``False`` for every ``n``, and ``bool(n % 2)`` is
always ``True``.

:class:`Size` is a JAX symbolic dimension (a subclass, so ops, shape rules and JAX accept it
unchanged) tied to its trace's :class:`Guard`. A decision taken on it by code outside
``nablax.core`` and JAX (the user's function, NumPy called from it, ``nablax.nn``...) is answered
only when JAX proves the answer for every size (``n >= 1``, ``n == n``, ``n != 0``, ``bool(n)``,
``max(n, 1)``, ``2 * n == n + n``); any other is recorded on the guard and raises
:class:`SizeDependentError` (recorded even when the code catches it), and ``nx.compile`` then
traces that signature once per size. Arithmetic that stays an integer size (``n * 2``, ``n - 1``,
``n // 2``, ``n % 2``, ``divmod``, ``n ** 2``) gives new guarded sizes; arithmetic whose Python
result would be a number depending on the size (``n / 2``, ``n * 0.5``, ``2 ** n``,
``float(n)``) is a decision. The text of a size (``str(n)``, ``repr(n)``, ``f"{n}"``,
``"%s" % n``, ``str(x.shape)``, ``print(x.shape)``, ``pickle.dumps(n)``) is a decision too: it
would be the symbol's name (``"n"``) for every size; nablax's own messages, JAX, ``logging`` and
debuggers get that name (:func:`show`) without one, and so does a size kept past its trace. Code inside ``nablax.core`` and JAX (found by the calling
module) keeps JAX's semantics: its shape rules make choices that are right for every size ("not
provably 1, so not broadcast"). A Size is not an ``int`` (``isinstance(n, int)`` is ``False``, as
for JAX's symbolic dimensions: it cannot subclass both); code that needs an int for it (``json``,
``isinstance`` checks that raise) fails and ``nx.compile`` traces per size.

>>> import nablax as nx
>>> seen = []
>>> @nx.compile(dynamic_dims={0: {0: "n"}})
... def f(x):
...     n = x.shape[0]
...     seen.append((type(n).__name__, isinstance(n, int), n >= 1, n == n, 2 * n == n + n))
...     return x.reshape(1, n * 2)
>>> [f(nx.ones((k, 2))).shape for k in (3, 4)], seen
([(1, 6), (1, 8)], [('Size', False, True, True, True)])
"""

from __future__ import annotations

import linecache
import math
import numbers
import sys
from types import FrameType
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from ...errors import ShapeError
from ..tensor import Tensor

if TYPE_CHECKING:
    from jax._src.export.shape_poly import _DimExpr
else:
    _DimExpr = type(jax.export.symbolic_shape("n")[0])
try:
    from jax._src.export.shape_poly import InconclusiveDimensionOperation as _Inconclusive
except ImportError:  # pragma: no cover - another JAX layout
    _Inconclusive = ValueError  # type: ignore[assignment,misc]


class SizeDependentError(_Inconclusive):
    """A Python decision on a symbolic size whose outcome depends on the size."""


def _kind(frame) -> int:
    """0: nablax.core (and its caches) or JAX code (JAX's semantics); 1: NumPy (look at its caller); 2: user."""
    name = frame.f_globals.get("__name__")
    name = name if isinstance(name, str) else ""
    top = name.partition(".")[0]
    if top == "numpy":
        return 1
    if frame.f_code.co_filename.startswith("<doctest"):  # doctests run in a module's namespace
        return 2
    if top in ("jax", "jaxlib") or name == "nablax.core" or name.startswith("nablax.core."):
        return 0
    if name == "nablax._caches":  # the caches nablax.core keys by shapes
        return 0
    return 2


# modules whose text of a size is a message, never a value: nablax's own errors and warnings,
# JAX's, log records, and debuggers / tracebacks showing a variable
_MESSAGE_MODULES = frozenset(
    {
        "nablax",
        "jax",
        "jaxlib",
        "logging",
        "pdb",
        "bdb",
        "traceback",
        "pydevd",
        "_pydevd_bundle",
        "_pydev_bundle",
        "debugpy",
        "IPython",
    }
)


def _text_frame(depth: int):
    """The user frame that asked for a size's text, or None for a message (see _MESSAGE_MODULES)."""
    f: FrameType | None = sys._getframe(depth + 1)
    while f is not None:
        if f.f_code.co_filename.startswith("<doctest"):
            return f
        name = f.f_globals.get("__name__")
        top = name.partition(".")[0] if isinstance(name, str) else ""
        if top != "numpy":
            return None if top in _MESSAGE_MODULES else f
        f = f.f_back
    return None


def show(d) -> str:
    """The text of a size for nablax's own messages (``"n"``, ``"2*n"``); never a decision."""
    return _DimExpr.__str__(d._plain) if type(d) is Size else str(d)


def _user_frame(depth: int):
    """The frame whose code took the decision (skipping NumPy), or None for nablax.core/JAX."""
    f: FrameType | None = sys._getframe(depth + 1)
    while f is not None:
        k = _kind(f)
        if k != 1:
            return f if k == 2 else None
        f = f.f_back
    return None


class Guard:
    """One trace's record of the size-dependent decisions its Python code took."""

    __slots__ = ("first", "active")

    def __init__(self) -> None:
        self.first: str | None = None  # the first decision, with the user's line
        self.active = True  # False once the trace is over

    def fail(self, what: str, frame):
        where = "<unknown>"
        if frame is not None:
            fn, line = frame.f_code.co_filename, frame.f_lineno
            where = f"{fn}:{line} ({linecache.getline(fn, line).strip()})"
        if not self.active:
            raise ValueError(
                f"nx.compile: `{what}` at {where} uses a symbolic size from a trace that is over "
                f"(a size kept from inside a function compiled with dynamic_dims). Fix: read sizes "
                f"from the tensors' shapes where you need them"
            )
        msg = f"`{what}` at {where} depends on the size of a dynamic dimension"
        if self.first is None:
            self.first = msg
        raise SizeDependentError(
            f"nx.compile: {msg}; this signature is traced once per size instead. To keep one "
            f"trace, compute with the size as a tensor: nx.where(nx.asarray(n) % 2 == 0, a, b)"
        )


def guarded(d, guard: Guard):
    """``d`` as a :class:`Size` watched by ``guard`` (ints and sizes are returned as they are)."""
    if type(d) is not _DimExpr:
        return int(d) if isinstance(d, np.integer) else d
    s = object.__new__(Size)
    for slot in _DimExpr.__slots__:  # the same expression (JAX reads these fields directly)
        setattr(s, slot, getattr(d, slot))
    s._plain, s._guard = d, guard
    return s


def plain(d):
    """JAX's own symbolic dimension behind a :class:`Size` (anything else unchanged)."""
    return d._plain if type(d) is Size else d


def plain_tree(v):
    """``v`` (nested tuples/lists of sizes, e.g. node parameters) with every Size made plain."""
    if type(v) is Size:
        return v._plain
    if type(v) in (tuple, list) and any(type(x) in (Size, tuple, list) for x in v):
        return type(v)(plain_tree(x) for x in v)
    return v


_NUMBER = object()  # an operand that is a number or array but not an integer


def _operand(x, floats: bool):
    """``x`` as an int or plain symbolic size; ``NotImplemented`` for tensors and non-numbers;
    ``_NUMBER`` for numbers an integer result can't come from (floats unless ``floats`` and
    integral, arrays)."""
    t = type(x)
    if t is Size:
        return x._plain
    if t is int or t is _DimExpr or t is bool:
        return x
    if isinstance(x, Tensor):
        return NotImplemented
    if isinstance(x, (int, np.integer)):
        return int(x)
    if floats and isinstance(x, (float, np.floating)) and math.isfinite(x) and x == int(x):
        return int(x)
    if isinstance(x, (numbers.Number, np.ndarray, jax.Array)) or hasattr(x, "__jax_array__"):
        return _NUMBER
    return NotImplemented


def _wrap(r, guard: Guard):
    if type(r) is tuple:
        return tuple(guarded(x, guard) for x in r)
    return guarded(r, guard)


def _decide_ge(a, b):
    """``a >= b`` for every size: True, False, or None when it depends on the size."""
    try:
        return bool(a >= b)
    except _Inconclusive:
        return None


def decide_ge(a, b):
    """``a >= b`` for every size (sizes or ints): True, False, or None when it depends on it."""
    return _decide_ge(plain(a), plain(b))


def _decide_eq(a, b):
    d = a - b
    if type(d) is not _DimExpr:
        return d == 0
    if _decide_ge(d, 1) or _decide_ge(-1, d):
        return False
    return None


_SYMBOLS = {
    "__add__": "+",
    "__sub__": "-",
    "__mul__": "*",
    "__floordiv__": "//",
    "__mod__": "%",
    "__pow__": "**",
    "__truediv__": "/",
    "__divmod__": "divmod",
    "__and__": "&",
    "__or__": "|",
    "__xor__": "^",
    "__lshift__": "<<",
    "__rshift__": ">>",
}


def _show(self, name: str, other) -> str:
    sym = _SYMBOLS.get(name.replace("__r", "__", 1), name)
    if name.startswith("__r") and name != "__rshift__":
        return f"{other!r} {sym} {self}"
    return f"{self} {sym} {other!r}"


def _arith(name: str, int_only: bool = True):
    """A binary operator: a guarded size for integer operands; a decision for other numbers."""
    base = getattr(_DimExpr, name, None)

    def method(self, other):
        o = _operand(other, floats=False)
        if o is NotImplemented:
            return NotImplemented
        if o is _NUMBER or not int_only or base is None:
            f = _user_frame(1)
            if f is not None:
                self._guard.fail(_show(self, name, other), f)
            return NotImplemented if base is None else base(self._plain, other)
        return _wrap(base(self._plain, o), self._guard)

    method.__name__ = name
    return method


def _compare(op: str):
    base = getattr(_DimExpr, op)

    def method(self, other):
        f = _user_frame(1)
        if f is None:  # nablax.core / JAX: JAX's semantics
            return base(self._plain, plain(other))
        o = _operand(other, floats=True)
        if o is NotImplemented:
            return NotImplemented
        a = self._plain
        if o is _NUMBER:
            r = None
        elif op in ("__eq__", "__ne__"):
            r = _decide_eq(a, o)
            r = r if r is None or op == "__eq__" else not r
        elif op == "__ge__":
            r = _decide_ge(a, o)
        elif op == "__le__":
            r = _decide_ge(o, a)
        elif op == "__gt__":
            r = _decide_ge(a, o + 1)
        else:
            r = _decide_ge(o, a + 1)
        if r is None:
            sym = {"__eq__": "==", "__ne__": "!=", "__ge__": ">=", "__le__": "<=", "__gt__": ">"}
            self._guard.fail(f"{self} {sym.get(op, '<')} {other!r}", f)
        return r

    method.__name__ = op
    return method


def _needs_value(what: str, internal):
    """A conversion that needs the concrete size: a decision in user code; JAX's error (or
    ``internal``'s result) in nablax.core / JAX."""

    def method(self, *a):
        f = _user_frame(1)
        if f is not None:
            self._guard.fail(what.format(self), f)
        return internal(self, *a)

    return method


def _type_error(msg):
    def internal(self, *a):
        raise TypeError(msg)

    return internal


_INT_ATTRS = frozenset(a for a in dir(int) if not a.startswith("_"))


class Size(_DimExpr):
    """A symbolic dimension size inside ``nx.compile(dynamic_dims=...)`` (see the module doc).

    Behaves as the ``jax.export`` symbolic dimension it wraps for ops and shape rules; in the
    user's code, a decision on it is answered only when it holds for every size.
    """

    __slots__ = ("_plain", "_guard")

    _plain: Any  # JAX's own symbolic dimension (see :func:`guarded`)
    _guard: Guard

    def __pow__(self, power, modulo=None):
        o = _operand(power, floats=False)
        if o is NotImplemented:
            return NotImplemented
        if modulo is None and type(o) is int and o >= 0:
            return _wrap(self._plain**o, self._guard)
        f = _user_frame(1)
        if f is not None:
            self._guard.fail(f"{self} ** {power!r}", f)
        return self._plain.__pow__(plain(power), modulo)

    def __neg__(self):
        return _wrap(-self._plain, self._guard)

    def __pos__(self):
        return self

    def __abs__(self):
        f = _user_frame(1)
        if f is None:
            raise TypeError(f"bad operand type for abs(): '{type(self._plain).__name__}'")
        if _decide_ge(self._plain, 0):
            return self
        if _decide_ge(0, self._plain):
            return -self
        self._guard.fail(f"abs({self})", f)

    def __round__(self, ndigits=None):
        if ndigits is None or ndigits >= 0:
            return self  # an integer rounds to itself
        f = _user_frame(1)
        if f is not None:
            self._guard.fail(f"round({self}, {ndigits})", f)
        raise TypeError(f"round() of a symbolic size to {ndigits} digits")

    def __trunc__(self):
        return self

    __floor__ = __ceil__ = __trunc__

    def __bool__(self):
        f = _user_frame(1)
        if f is None:
            return True  # JAX's (plain object) truth value
        r = _decide_eq(self._plain, 0)
        if r is None:
            self._guard.fail(f"bool({self})", f)
        return not r

    def __hash__(self):
        f = _user_frame(1)
        if f is not None:
            self._guard.fail(f"hash({self}) (a size as a dict key or set member)", f)
        return hash(self._plain)

    __int__ = _needs_value("int({})", lambda s: int(s._plain))
    __index__ = _needs_value(
        "using {} as an integer (range, list index, int())",
        _type_error("'_DimExpr' object cannot be interpreted as an integer"),
    )
    __float__ = _needs_value("float({})", _type_error("float() of a symbolic size"))
    __complex__ = _needs_value("complex({})", _type_error("complex() of a symbolic size"))
    __invert__ = _needs_value("~{}", _type_error("bad operand type for unary ~"))

    # The text of a size ("n") is the same for every size: in the user's code it is a decision
    # (a string such as f"{n}" would hold the first size's text for every size). nablax's own
    # messages, JAX and debuggers get the symbol's text (see _text_frame), and so does a size
    # kept past its trace (it no longer stands for any call's size).
    def _text(self, what: str) -> str:
        if self._guard.active:
            f = _text_frame(2)
            if f is not None:
                self._guard.fail(what.format(show(self)), f)
        return show(self)

    def __str__(self) -> str:
        return self._text("str({})")

    def __repr__(self) -> str:
        return self._text("repr({}) (also str() of a shape tuple)")

    def __format__(self, spec: str) -> str:
        if not spec:
            return self._text("format({}) (an f-string or str.format)")
        f = _text_frame(1) if self._guard.active else _user_frame(1)
        if f is not None:
            self._guard.fail(f"format({show(self)}, {spec!r})", f)
        try:  # a message: the symbol's text, aligned or padded as a string ("{n:>6}")
            return format(show(self), spec)
        except ValueError:
            raise TypeError(
                f"unsupported format string passed to a symbolic size: {spec!r}"
            ) from None

    def __getattr__(self, name: str):
        if name in _INT_ATTRS:  # int methods (bit_length, to_bytes, ...): need the value
            f = _user_frame(1)
            if f is not None:
                self._guard.fail(f"{self}.{name}", f)
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}")

    def __reduce_ex__(self, protocol):  # pickle: the bytes would be the same for every size
        f = _user_frame(1)
        if f is not None:
            self._guard.fail(f"pickle.dumps({show(self)})", f)
        return self._plain.__reduce_ex__(protocol)

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    # JAX's own helpers (core.max_dim / min_dim): results stay guarded
    def max(self, other):
        return _wrap(self._plain.max(plain(other)), self._guard)

    def min(self, other):
        return _wrap(self._plain.min(plain(other)), self._guard)

    def rmax(self, other):
        return _wrap(self._plain.rmax(plain(other)), self._guard)

    def rmin(self, other):
        return _wrap(self._plain.rmin(plain(other)), self._guard)


for _n in ("add", "sub", "mul", "floordiv", "mod", "divmod"):
    setattr(Size, f"__{_n}__", _arith(f"__{_n}__"))
    setattr(Size, f"__r{_n}__", _arith(f"__r{_n}__"))
for _n in ("truediv", "rtruediv", "rpow"):
    setattr(Size, f"__{_n}__", _arith(f"__{_n}__", int_only=False))
for _n in ("and", "or", "xor", "lshift", "rshift"):
    setattr(Size, f"__{_n}__", _arith(f"__{_n}__", int_only=False))
    setattr(Size, f"__r{_n}__", _arith(f"__r{_n}__", int_only=False))
for _n in ("eq", "ne", "lt", "le", "gt", "ge"):
    setattr(Size, f"__{_n}__", _compare(f"__{_n}__"))
del _n


def size_dependent(op: str, what: str, *values) -> None:
    """Raise for an op of nablax.core that needs the concrete value of a size among ``values``:
    for a :class:`Size`, a size-dependent decision of the user's line that called the op
    (:class:`SizeDependentError`; ``nx.compile`` then traces per size)."""
    for v in values:
        if type(v) is Size:
            f: FrameType | None = sys._getframe(1)
            while f is not None and _kind(f) != 2:
                f = f.f_back
            v._guard.fail(f"nx.{op}({what})", f)
    raise TypeError(f"nx.{op}: {what} needs a concrete size, got the symbolic size(s) {values!r}")


def bounded_by_sizes(d, margin: int) -> bool:
    """Whether ``|d| <= (sum of the sizes d is made of) + margin`` for every size (JAX proves
    it from the expression: ``n - 1``, ``n // 2``, ``n + m`` are; ``1000 * n``, ``n * n`` are
    not). Lets an op check a value range once for every size."""
    p = plain(d)
    if type(p) is not _DimExpr:
        return abs(int(p)) <= margin
    try:
        names = sorted(p._get_vars())
        total = sum(jax.export.symbolic_shape(v, scope=p.scope)[0] for v in names) + margin
        return bool(total >= p) and bool(total >= -p)
    except (_Inconclusive, AttributeError, TypeError, ValueError):  # unknown: not proven
        return False


def evaluate(d, env: dict) -> int:
    """The value of the symbolic size ``d`` for the dimension sizes ``env`` (name -> int)."""
    return int(plain(d)._evaluate(env))


def is_symbolic(v) -> bool:
    """Whether ``v`` is a symbolic size (a :class:`Size` or JAX's own)."""
    return isinstance(v, _DimExpr)


# ---- compile(dynamic_dims=...) helpers (used by compile.py) -------------------------------


class SizedCall:
    """The jitted call of an exported (shape-polymorphic) program; records each concrete size."""

    __slots__ = ("fn", "entry")

    def __init__(self, fn, entry) -> None:
        self.fn, self.entry = fn, entry

    def __call__(self, *arrays):
        self.entry.sizes.add(tuple(tuple(np.shape(a)) for a in arrays))
        return self.fn(*arrays)


def _symbolic_errors() -> tuple:
    from jax.export import is_symbolic_dim  # noqa: F401 - make sure the module is loaded

    return (_Inconclusive, TypeError, ShapeError, ValueError, IndexError)


SYMBOLIC_ERRORS = _symbolic_errors()


def check_dynamic_dims(dd) -> dict:
    if not isinstance(dd, dict) or not all(
        isinstance(i, int)
        and isinstance(dims, dict)
        and all(isinstance(d, int) and isinstance(n, str) for d, n in dims.items())
        for i, dims in dd.items()
    ):
        raise TypeError(
            f"nx.compile: dynamic_dims must look like {{arg_index: {{dim_index: 'name'}}}}, got "
            f"{dd!r}"
        )
    return dd


def symbols(dyn: dict) -> dict:
    """One symbolic size per name, in one scope (jax.export shape polymorphism)."""
    names = sorted({n for dims in dyn.values() for n in dims.values()})
    return dict(zip(names, jax.export.symbolic_shape(",".join(names))))

"""Python numbers passed to a function under ``nx.compile``: traced, weakly typed 0-d values.

As ``jax.jit`` does, ``nx.compile`` keeps the *values* of Python ``int``, ``float``, ``complex`` and
``bool`` arguments (positional, keyword, or inside pytrees) out of its cache key: each one is an
argument of the compiled program, a 0-d ``int32`` / ``float32`` / ``complex64`` / ``bool`` value, so a
step counter or a learning rate that changes on every call reuses one trace and one executable.
NumPy scalars are arrays to JAX: they are traced like 0-d arrays of their (canonical) dtype.
Arguments named in ``static_argnums`` / ``static_argnames`` stay Python values, one trace per value.

Inside the traced function such an argument is a :class:`TracedScalar`: a 0-d tensor that keeps
the *weak typing* of Python numbers under the operators and nablax's binary element-wise functions
(``nx.add``, ``nx.maximum``, ``nx.clip``, ...), with JAX's rules, so the compiled function computes
in the dtypes of the same code run eagerly (where the arguments are Python literals):
``float16_x * lr`` stays float16, ``int8_x + step`` stays int8, ``step + 1`` and ``step * 0.5`` are
traced scalars again (weakly typed int and float), ``int_x * lr`` is float32. A result with a
tensor operand is an ordinary (strongly typed) tensor, as with a Python literal. Other functions
(``nx.exp(step)``, ``nx.where``) see a strongly typed 0-d tensor of the dtype above.

A traced scalar has no Python value while the function is traced: ``if step > 10:``, ``int(step)``,
``range(step)``, a shape such as ``nx.zeros(n)``, or ``.item()`` raise
:class:`~nablax.errors.ConcretizationError` naming the argument, the line and the fix: mark it
static (``static_argnums`` / ``static_argnames``: one trace per value), or keep the decision lazy
(``nx.where``). Values that stay in the key (static arguments, and leaves that are not numbers, such
as strings) are watched by :class:`RetraceWatch`, which warns once when they have made one compiled
function trace again more than ``compile_retrace_warning`` times (a nablax option).
"""

from __future__ import annotations

import inspect
import warnings
from types import SimpleNamespace

import jax
import numpy as np

from .... import _caches, _config
from .... import tree as _tree
from ....errors import ConcretizationError, op_error
from ... import dtypes
from ...context import CTX
from ...ops import elementwise as _ew
from ...tensor import Tensor, to_impl
from ..staging import _user_frame, make_placeholder

# The Python number types nx.compile traces, in JAX's weak-type order (a join takes the larger),
# and the dtype each is traced in.
_ORDER = {bool: 0, int: 1, float: 2, complex: 3}
_DTYPE = {
    bool: dtypes.bool_,
    int: dtypes.int32,
    float: dtypes.float32,
    complex: dtypes.complex64,
}
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1


def is_traced_number(leaf) -> bool:
    """Whether ``nx.compile`` traces this argument leaf as a 0-d value (Python or NumPy number)."""
    return type(leaf) in _ORDER or isinstance(leaf, (np.number, np.bool_))


def scalar_key(leaf, where) -> tuple:
    """The cache-key entry of a traced number: its kind and dtype, never its value. ``where()``
    names the argument for the error when a Python int does not fit int32."""
    t = type(leaf)
    if t in _ORDER:
        if t is int and not _I32_MIN <= leaf <= _I32_MAX:
            raise overflow_error(leaf, where())
        return ("s", t)
    return ("a", (), dtypes.canonicalize(leaf.dtype))


def overflow_error(value: int, where: str) -> Exception:
    return op_error(
        OverflowError,
        "compile",
        f"the Python int {value} passed as {where} does not fit int32, the dtype nx.compile "
        f"traces Python ints in (as jax.jit does)",
        "pass it as a float, or mark the argument static (static_argnums / static_argnames) so "
        "it stays a Python int",
    )


class ScalarArg:
    """Where a traced Python number came from, for error messages: the compiled function, the
    argument (``'step' (args[1])``) and the static_argnums / static_argnames that would fix it."""

    __slots__ = ("fn", "label", "kind", "fix")

    def __init__(self, fn: str, label: str, kind: type, fix: str) -> None:
        self.fn, self.label, self.kind, self.fix = fn, label, kind, fix

    def error(self, what: str, origins=None) -> ConcretizationError:
        others = [o for o in origins or () if o is not self]
        also = "".join(f", {o.label}" for o in others)
        return ConcretizationError(
            f"nx.compile({self.fn}): cannot {what} the traced Python {self.kind.__name__} argument "
            f"{self.label}{also} (or a value computed from it) at {_user_frame()}. nx.compile "
            f"traces Python int/float/bool arguments as values, like jax.jit, so they have no "
            f"concrete value while {self.fn} is traced. Fix: mark it static with {self.fix}, "
            f"which traces and compiles once per value, or keep the decision in the graph "
            f"(nx.cond / nx.where(cond, a, b) instead of a Python if, nx.while_loop instead of a "
            f"Python while; sizes from tensors' shapes)"
        )


def scalar_placeholder(leaf, k: int, origin: ScalarArg) -> tuple:
    """``(node, TracedScalar)`` standing for the Python number ``leaf``, program argument ``k``."""
    dt = _DTYPE[type(leaf)]
    node, ph = make_placeholder(SimpleNamespace(shape=(), dtype=dt), k)
    CTX.scalar_args[node] = origin  # this thread's trace (core/context.py)
    return node, _traced(ph._impl, type(leaf), (origin,))


def strong_arguments(program, slots: dict):
    """``program`` whose arguments ``slots`` (``{index: dtype}``, Python numbers handed to jit as
    weakly typed values) are made strongly typed first, as the nablax graph recorded them."""
    if not slots:
        return program
    convert = jax.lax.convert_element_type

    def strong(*flat):
        flat = list(flat)
        for k, dt in slots.items():
            flat[k] = convert(flat[k], dt)
        return program(*flat)

    return strong


_BY_POSITION = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def static_both_ways(sig, nums: tuple, names: tuple) -> tuple[tuple, tuple]:
    """``static_argnums`` and ``static_argnames`` completed from the signature, as ``jax.jit``
    does: a static parameter is static whether it is passed by position or by keyword."""
    if sig is None:
        return nums, names
    params = list(sig.parameters.values())
    nums = nums + tuple(
        i
        for i, p in enumerate(params)
        if p.name in names and p.kind in _BY_POSITION and i not in nums
    )
    names = names + tuple(
        params[i].name
        for i in nums
        if 0 <= i < len(params)
        and params[i].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        and params[i].name not in names
    )
    return nums, names


def leaf_label(sig, statics, n_args: int, dyn_args, k: int, fix: bool = False):
    """How messages name leaf ``k`` of a call's dynamic arguments ``(positional, keywords)``
    (``statics``: the static positions among ``n_args``): ``'step' (args[1])``, ``args[0]['lr']``,
    ``'lr' (a keyword argument)``; with ``fix``, also the static_argnums / static_argnames that
    would keep it a Python value."""
    path = jax.tree_util.tree_flatten_with_path(dyn_args)[0][k][0]
    rest = _tree.keystr(path[2:])
    if path[0].idx == 1:  # a keyword argument
        name = path[1].key
        label = f"{name!r} (a keyword argument{', at ' + rest if rest else ''})"
        return (label, f"static_argnames=({name!r},)") if fix else label
    pos = [i for i in range(n_args) if i not in statics][path[1].idx]
    params = list(sig.parameters.values()) if sig is not None else []
    named = pos < len(params) and params[pos].kind in _BY_POSITION
    label = f"args[{pos}]{rest}"
    if named and not rest:
        label = f"{params[pos].name!r} ({label})"
    if not fix:
        return label
    how = f"static_argnums=({pos},)"
    if named and params[pos].kind is not inspect.Parameter.POSITIONAL_ONLY:
        how += f" or static_argnames=({params[pos].name!r},)"
    if rest:
        how = f"{how} on the whole argument {pos}, whose value must then be hashable"
    return label, how


# ---- the traced scalar ---------------------------------------------------------------------------


def _traced(impl, kind: type, origins: tuple) -> TracedScalar:
    t = object.__new__(TracedScalar)
    t._impl, t._kind, t._origins = impl, kind, origins
    return t


def _kind_of(dt: np.dtype) -> type:
    """The Python number type a weakly typed value of dtype ``dt`` stands for."""
    if dt == dtypes.bool_:
        return bool
    if dtypes.is_integer(dt):
        return int
    return complex if dtypes.is_complex(dt) else float


def _plain(x) -> Tensor:
    return Tensor._wrap(x._impl)


def _merge(a, b) -> tuple:
    oa = a._origins if type(a) is TracedScalar else ()
    ob = b._origins if type(b) is TracedScalar else ()
    return oa + tuple(o for o in ob if o not in oa)


def weak_binary(name: str, a, b):
    """``name(a, b)`` (a binary element-wise function of ops/elementwise.py) where ``a`` or ``b``
    is a :class:`TracedScalar`, with JAX's weak-type promotion. Two weakly typed operands (traced
    scalars or Python numbers) give a traced scalar of their join; with a strongly typed operand
    the traced scalar takes that operand's promoted dtype, as a Python number would."""
    fn = getattr(_ew, name)
    ka = a._kind if type(a) is TracedScalar else (type(a) if type(a) in _ORDER else None)
    kb = b._kind if type(b) is TracedScalar else (type(b) if type(b) in _ORDER else None)
    if ka is not None and kb is not None:  # both weak: computed in the dtype of their join
        dt = _DTYPE[ka if _ORDER[ka] >= _ORDER[kb] else kb]
        pa = _plain(a).astype(dt) if type(a) is TracedScalar else a
        pb = _plain(b).astype(dt) if type(b) is TracedScalar else b
        out = fn(pa, pb)
        return _traced(out._impl, _kind_of(out.dtype), _merge(a, b))
    if ka is not None:
        strong = b if isinstance(b, Tensor) else Tensor._wrap(to_impl(b, op=name))
        return fn(_plain(a).astype(dtypes.promote_scalar(strong.dtype, ka)), strong)
    assert kb is not None  # a or b is a TracedScalar
    strong = a if isinstance(a, Tensor) else Tensor._wrap(to_impl(a, op=name))
    dt = dtypes.promote_scalar(strong.dtype, kb)
    if name == "power" and kb is int and dt.kind in "iu" and dt.itemsize < 4:
        # an int exponent is not wrapped into int8/int16 (as eager ``int8_tensor ** 300``, and
        # jnp.power with a concrete exponent): raised in int32, then wrapped to the dtype
        return fn(strong.astype(dtypes.int32), _plain(b).astype(dtypes.int32)).astype(dt)
    return fn(strong, _plain(b).astype(dt))


class TracedScalar(Tensor):
    """A Python number argument of a function being traced by ``nx.compile``: a 0-d tensor that
    is weakly typed under operators and binary element-wise functions (see the module
    documentation), and has no Python value until the compiled function runs.

    >>> import nablax as nx
    >>> @nx.compile
    ... def f(x, lr):
    ...     print(type(lr).__name__, lr.dtype)  # runs only while tracing
    ...     return x - lr * x
    >>> x = nx.ones(2, dtype=nx.float16)
    >>> ys = [f(x, lr) for lr in (0.1, 0.2, 0.5)]
    TracedScalar float32
    >>> ys[-1].dtype, ys[-1].tolist(), f.cache_info().traces
    (dtype('float16'), [0.5, 0.5], 1)
    """

    __slots__ = ("_kind", "_origins")
    __hash__ = Tensor.__hash__

    _kind: type  # the Python number type it stands for
    _origins: tuple[ScalarArg, ...]  # the arguments it was computed from

    # nablax's binary element-wise functions hand operands of this type here (ops/elementwise.py)
    _weak_binary = staticmethod(weak_binary)

    def _concrete(self, what: str) -> ConcretizationError:
        return self._origins[0].error(what, self._origins)

    def __repr__(self) -> str:
        src = ", ".join(o.label for o in self._origins)
        return f"TracedScalar({self._kind.__name__}, dtype={self.dtype}, weakly typed, from {src})"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        if spec:
            raise self._concrete(f"format ({spec!r})")
        return repr(self)

    def __bool__(self) -> bool:
        raise self._concrete("take the truth value (Python if/while/and/or/not) of")

    def __int__(self) -> int:
        raise self._concrete("convert to int")

    def __float__(self) -> float:
        raise self._concrete("convert to float")

    def __complex__(self) -> complex:
        raise self._concrete("convert to complex")

    def __index__(self) -> int:
        raise self._concrete("use as a Python integer (a size, an index, range())")

    def __iter__(self):
        raise self._concrete("use as a shape or iterate over")

    def _realized_value(self):
        raise self._concrete("read the value of")

    def item(self):
        raise self._concrete("read .item() of")

    def tolist(self):
        raise self._concrete("read .tolist() of")

    def numpy(self):
        raise self._concrete("read .numpy() of")

    def __array__(self, dtype=None, copy=None):
        raise self._concrete("make a NumPy array of")

    def __neg__(self):
        out = -_plain(self)
        return _traced(out._impl, _kind_of(out.dtype), self._origins)

    def __pos__(self):
        return self

    def __abs__(self):
        out = abs(_plain(self))
        return _traced(out._impl, _kind_of(out.dtype), self._origins)

    def __invert__(self):
        out = ~_plain(self)
        return _traced(out._impl, _kind_of(out.dtype), self._origins)

    def __round__(self, ndigits=None):  # as JAX's tracers: a rounded value, not a Python int
        out = _plain(self).round(ndigits or 0)
        return _traced(out._impl, _kind_of(out.dtype), self._origins)


def _install_operators() -> None:
    # Operators go through weak_binary directly: ``x + step`` calls step.__radd__ first (Python
    # tries a subclass's reflected method first), so every operator form is covered.
    arith = {
        "add": "add",
        "sub": "subtract",
        "mul": "multiply",
        "truediv": "divide",
        "floordiv": "floor_divide",
        "mod": "mod",
        "pow": "power",
        "and": "bitwise_and",
        "or": "bitwise_or",
        "xor": "bitwise_xor",
    }
    for dunder, op in arith.items():
        setattr(TracedScalar, f"__{dunder}__", lambda a, b, op=op: weak_binary(op, a, b))
        setattr(TracedScalar, f"__r{dunder}__", lambda a, b, op=op: weak_binary(op, b, a))
    compare = {
        "eq": "equal",
        "ne": "not_equal",
        "lt": "less",
        "le": "less_equal",
        "gt": "greater",
        "ge": "greater_equal",
    }
    for dunder, op in compare.items():
        setattr(TracedScalar, f"__{dunder}__", lambda a, b, op=op: weak_binary(op, a, b))


_install_operators()


# ---- retraces caused by values in the key --------------------------------------------------------


class RetraceWatch:
    """Counts the traces of one compiled function that happened only because values in its cache
    key changed (static arguments, leaves that are not tensors or numbers), for one shape/dtype
    signature; warns once (``RuntimeWarning``) when there are more than the ``nablax`` option
    ``compile_retrace_warning`` of them, naming the arguments whose values changed."""

    _KEEP = 256  # signatures remembered (bounded, like the cache itself)

    def __init__(self, fn: str, sig=None) -> None:
        self.fn, self.sig = fn, sig
        # signature -> the values of its last trace (LRU; cleared with the compiled function's
        # cache, through info.LIVE)
        self.last = _caches.Cache(f"compile.retraces[{fn}]", self._KEEP, register=False)
        self.count = 0
        self.changed: dict = {}  # label -> a few of the values seen
        self.warned = False

    def clear(self) -> None:
        self.last.clear()
        self.changed.clear()
        self.count = 0
        self.warned = False

    def note_key(self, treedef, key_leaves, statics, label_of) -> None:
        """A trace for this cache key (``nx.compile``'s: tree structure, one entry per leaf with a
        value for ``"v"`` leaves, static arguments); ``label_of(k)`` names leaf ``k``."""
        static_pos, static_kw = statics
        value_leaves = [k for k, e in enumerate(key_leaves) if e[0] == "v"]
        values = tuple(key_leaves[k][2] for k in value_leaves)
        values += tuple(v for _, v in static_pos) + tuple(v for _, v in static_kw)
        if not values:
            return
        signature = (
            treedef,
            tuple(e if e[0] != "v" else ("v", e[1]) for e in key_leaves),
            tuple(i for i, _ in static_pos),
            tuple(n for n, _ in static_kw),
        )

        def labels():
            names = [label_of(k) for k in value_leaves]
            params = list(self.sig.parameters) if self.sig is not None else []
            for i, _ in static_pos:
                name = f" ({params[i]!r})" if i < len(params) else ""
                names.append(f"static argument {i}{name}")
            return names + [f"static argument {n!r}" for n, _ in static_kw]

        self.note(signature, values, labels)

    def note(self, signature, values: tuple, labels) -> None:
        """A trace of ``signature`` (the key without values) with these ``values``; ``labels()``
        names each value's argument (computed only when something changed)."""
        prev = self.last.peek(signature)
        self.last.put(signature, values)  # the most recent, dropping the oldest over _KEEP
        if prev is None:
            return
        changed = [k for k, (p, v) in enumerate(zip(prev, values)) if not _same(p, v)]
        if not changed:
            return  # the same values traced again: the entry had been evicted
        self.count += 1
        names = labels()
        for k in changed:
            seen = self.changed.setdefault(names[k], [])
            for v in (prev[k], values[k]):
                if len(seen) < 4 and not any(_same(v, s) for s in seen):
                    seen.append(v)
        limit = _config.get("compile_retrace_warning")
        if limit and self.count > limit and not self.warned:
            self.warned = True
            warnings.warn(self._message(), RuntimeWarning, stacklevel=4)

    def _message(self) -> str:
        what = "; ".join(
            f"{label} (values {', '.join(repr(v)[:30] for v in seen)}, ...)"
            for label, seen in self.changed.items()
        )
        return (
            f"nx.compile({self.fn}): traced and compiled {self.count} more times for the same "
            f"argument shapes and dtypes because these values, which are part of the cache key, "
            f"changed: {what}. Each new value costs a trace and an XLA compilation (and evicts "
            f"older executables past max_cache_size). Fix: do not mark numbers static "
            f"(static_argnums / static_argnames): Python int/float/bool arguments are traced as "
            f"values, like jax.jit; pass other changing values as tensors (nx.asarray); keep "
            f"them static only if the function needs them as Python values (shapes, Python if). "
            f"(nablax option compile_retrace_warning={_config.get('compile_retrace_warning')}; 0 "
            f"turns this warning off.)"
        )


def _same(a, b) -> bool:
    if a is b:
        return True
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # values whose == is not a plain bool
        return False

"""The table of public tensor ops that the core tests are generated from (DESIGN.md, convention 3).

One :class:`OpSpec` per public op of API.md §1 (functions, creation ops, operators, methods,
indexing, random). Each names the nablax callable, a reference (``jax.numpy`` / ``jax.nn`` /
``jax.random``, whose result dtype is the dtype nablax must produce), optionally a NumPy reference
for values, input generators, the dtypes it supports, and the primitives it exercises.

Arguments in a :class:`Case`: ``np.ndarray`` values become ``nx.tensor`` for nablax and
``jnp.asarray`` for the reference (``to_nx`` / ``to_jnp``); a :class:`Static` wrapper passes its
value unchanged to both (NumPy arrays as left operands, concrete index arrays, Python data).
Python scalars are passed as they are (weakly typed on both sides).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
import nablax.kernels  # noqa: F401 - registers the kernel_call primitive

F32 = np.dtype("float32")
F16 = np.dtype("float16")
BF16 = np.dtype(jnp.bfloat16)
I32 = np.dtype("int32")
BOOL = np.dtype("bool")
U32 = np.dtype("uint32")

FLOATS = (F32, F16, BF16)
NUMERIC = (F32, I32, F16, BF16)
ALL = (F32, I32, BOOL, F16, BF16)
INTLIKE = (I32, BOOL)
SHAPE_DTYPES = (F32, I32, BOOL, BF16)  # data movement: float16 adds nothing over bfloat16
F32_ONLY = (F32,)

# (rtol, atol) by the *output* dtype of a comparison.
TOL = {F32: (1e-5, 1e-6), F16: (1e-2, 1e-3), BF16: (3e-2, 2e-2)}


@dataclass(frozen=True)
class Static:
    """An argument passed unchanged to both nablax and the reference."""

    value: Any


@dataclass
class Case:
    args: tuple
    kwargs: dict = field(default_factory=dict)
    label: str = ""
    core: bool = False  # also generated for the spec's non-primary dtypes
    xfail: str | None = None  # "BUG: ..." for a known nablax bug (strict xfail)


@dataclass
class OpSpec:
    name: str
    fn: Callable
    ref: Callable
    gen: Callable[[np.dtype, np.random.Generator], list[Case]]
    dtypes: tuple
    prims: frozenset
    np_ref: Callable | None = None  # NumPy value reference (float32/int32/bool inputs only)
    tol_scale: float = 1.0
    lazy: bool = True  # building the op must not realize anything

    def cases(self, dtype: np.dtype) -> list[Case]:
        seed = sum(map(ord, f"{self.name}/{dtype}"))
        cases = self.gen(dtype, np.random.default_rng(seed))
        if dtype == self.dtypes[0]:
            return cases
        core = [c for c in cases if c.core]
        if core:
            return core
        return [cases[0], cases[-1]] if len(cases) > 1 else cases


# ---- conversion ------------------------------------------------------------------------------


def _convert(x, arr_fn):
    if isinstance(x, Static):
        return x.value
    if isinstance(x, np.ndarray):
        return arr_fn(x)
    if isinstance(x, list):
        return [_convert(v, arr_fn) for v in x]
    if isinstance(x, tuple):
        return tuple(_convert(v, arr_fn) for v in x)
    if isinstance(x, dict):
        return {k: _convert(v, arr_fn) for k, v in x.items()}
    return x


def to_nx(x):
    return _convert(x, nx.tensor)


def to_jnp(x):
    return _convert(x, jnp.asarray)


def to_np(x):
    return _convert(x, lambda a: a)


def outputs(x) -> list:
    """Flatten an op's result (tensor / array or a list/tuple of them)."""
    if isinstance(x, (list, tuple)):
        return [o for v in x for o in outputs(v)]
    return [x]


# ---- input generators ------------------------------------------------------------------------


def A(rng, shape, dt, kind="normal") -> np.ndarray:
    """A random array of ``shape`` and ``dt``; ``kind`` picks the value domain."""
    dt = np.dtype(dt)
    shape = tuple(shape)
    if dt == BOOL:
        return rng.random(shape) < 0.5
    if dt == I32:
        lo, hi = {
            "pos": (1, 6),
            "gt1": (1, 6),
            "expo": (0, 4),
            "nonzero": (1, 6),
            "small": (-3, 4),
            "unit": (-1, 2),
        }.get(kind, (-5, 6))
        v = rng.integers(lo, hi, shape)
        if kind == "nonzero":
            v = v * rng.choice([-1, 1], shape)
        return v.astype(np.int32)
    if kind == "pos":
        v = rng.uniform(0.1, 3.0, shape)
    elif kind == "gt1":  # arccosh's domain
        v = rng.uniform(1.1, 4.0, shape)
    elif kind == "unit":
        v = rng.uniform(-0.9, 0.9, shape)
    elif kind == "small":
        v = rng.uniform(-3.0, 3.0, shape)
    elif kind == "nonzero":
        v = rng.uniform(0.5, 3.0, shape) * rng.choice([-1, 1], shape)
    elif kind == "expo":
        v = rng.integers(0, 4, shape).astype(np.float64)
    elif kind == "special":
        v = rng.choice([0.0, 1.5, -2.0, np.nan, np.inf, -np.inf], shape)
    elif kind == "distinct":  # no ties (sort/argmax stay unambiguous in low precision)
        v = rng.permutation(int(np.prod(shape, dtype=np.int64))).reshape(shape) - 3.0
    else:
        v = rng.standard_normal(shape)
    return v.astype(np.float32).astype(dt)


def py_scalars(dt, kind="normal") -> list:
    """Python scalars that exercise weak typing against a tensor of ``dt``."""
    if dt == BOOL:
        return [True, 2]
    if kind == "expo":
        return [2, 0.5]
    if dt == I32:
        return [3 if kind in ("pos", "nonzero") else -2, 1.5]
    if kind in ("pos", "nonzero"):
        return [1.5, 3]
    return [-1.5, 2]


BIN_SHAPES = [((3, 4), (3, 4)), ((3, 1), (2, 1, 4)), ((), (2, 3)), ((0, 3), (1, 3))]


def _int_scalars(dt, kind="normal"):
    return [True, 2] if dt == BOOL else [3, -2]


def binary(ka="normal", kb="normal", scalars=py_scalars):
    """Broadcasting pairs, then Python scalars on the right and on the left (weak typing)."""

    def gen(dt, rng):
        cases = [
            Case((A(rng, sa, dt, ka), A(rng, sb, dt, kb)), label=f"{sa}x{sb}", core=i == 0)
            for i, (sa, sb) in enumerate(BIN_SHAPES)
        ]
        if scalars:
            # (the other scalar types of each dtype: test_broadcasting's promotion table)
            s = scalars(dt, kb)[0]
            cases.append(Case((A(rng, (3, 4), dt, ka), s), label=f"x_{s!r}"))
            s = scalars(dt, ka)[0]
            cases.append(Case((s, A(rng, (3, 4), dt, kb)), label=f"{s!r}_x", core=True))
        return cases

    return gen


def unary(kind="normal", shapes=((3, 4), (), (0, 2), (2, 3, 5))):
    def gen(dt, rng):
        return [
            Case((A(rng, s, dt, kind),), label=str(s), core=i == 0) for i, s in enumerate(shapes)
        ]

    return gen


REDUCE_CASES = [
    ((3, 4), None, False),
    ((3, 4), 0, False),
    ((3, 4), -1, True),
    ((2, 3, 4), (0, 2), False),
    ((2, 3, 4), (1,), True),
    ((), None, False),
    ((0, 3), 0, False),
]


def reduction(kind="normal", cases=REDUCE_CASES, axis_kw=True):
    def gen(dt, rng):
        out = []
        for i, (shape, axis, keep) in enumerate(cases):
            kw = {"axis": axis, "keepdims": keep} if axis_kw else {"axis": axis}
            out.append(Case((A(rng, shape, dt, kind),), kw, f"{shape}-{axis}-{keep}", i in (0, 3)))
        return out

    return gen


def cases_of(*items):
    """A generator from ``args_builder(dt, rng)`` or ``(args_builder, kwargs[, xfail])`` entries;
    ``kwargs`` may be a function of the dtype. The first entry is the core case."""

    def gen(dt, rng):
        out = []
        for i, item in enumerate(items):
            build, kw, xfail = (*item, None)[:3] if isinstance(item, tuple) else (item, {}, None)
            kw = kw(dt) if callable(kw) else dict(kw)
            out.append(Case(tuple(build(dt, rng)), kw, f"c{i}", core=i == 0, xfail=xfail))
        return out

    return gen


def P(*names) -> frozenset:
    return frozenset(names)


SPECS: list[OpSpec] = []


def spec(name, fn, ref, gen, dtypes, prims, **kw) -> OpSpec:
    s = OpSpec(name, fn, ref, gen, dtypes, P(*prims), **kw)
    SPECS.append(s)
    return s


# ---- elementwise: unary ----------------------------------------------------------------------


def _floating(x):
    """ints become float32 first, as jnp.exp & co. do (jax.nn rejects ints)."""
    return x if jnp.issubdtype(x.dtype, jnp.floating) else x.astype(jnp.float32)


_FLOAT_UNARY = {
    # name: (jnp reference, input kind, dtypes)
    "exp": (jnp.exp, "small", NUMERIC),
    "log": (jnp.log, "pos", NUMERIC),
    "log1p": (jnp.log1p, "pos", NUMERIC),
    "expm1": (jnp.expm1, "small", NUMERIC),
    "sqrt": (jnp.sqrt, "pos", NUMERIC),
    "rsqrt": (jax.lax.rsqrt, "pos", FLOATS),
    "sin": (jnp.sin, "normal", NUMERIC),
    "cos": (jnp.cos, "normal", NUMERIC),
    "tan": (jnp.tan, "unit", NUMERIC),
    "tanh": (jnp.tanh, "normal", NUMERIC),
    "arcsin": (jnp.arcsin, "unit", NUMERIC),
    "arccos": (jnp.arccos, "unit", NUMERIC),
    "arctan": (jnp.arctan, "normal", NUMERIC),
    "sinh": (jnp.sinh, "small", NUMERIC),
    "cosh": (jnp.cosh, "small", NUMERIC),
    "arcsinh": (jnp.arcsinh, "normal", NUMERIC),
    "arccosh": (jnp.arccosh, "gt1", NUMERIC),
    "arctanh": (jnp.arctanh, "unit", NUMERIC),
    "log2": (jnp.log2, "pos", NUMERIC),
    "log10": (jnp.log10, "pos", NUMERIC),
    "sigmoid": (lambda x: jax.nn.sigmoid(_floating(x)), "normal", NUMERIC),
    "erf": (jax.scipy.special.erf, "normal", NUMERIC),
    "negative": (jnp.negative, "normal", NUMERIC),
    "abs": (jnp.abs, "normal", ALL),
    "sign": (jnp.sign, "normal", NUMERIC),
    "floor": (jnp.floor, "small", NUMERIC),
    "ceil": (jnp.ceil, "small", NUMERIC),
    "isnan": (jnp.isnan, "special", NUMERIC),
    "isinf": (jnp.isinf, "special", NUMERIC),
    "isfinite": (jnp.isfinite, "special", NUMERIC),
    "invert": (jnp.invert, "normal", INTLIKE),
}
_NP_UNARY = {
    "exp": np.exp,
    "log": np.log,
    "sqrt": np.sqrt,
    "sin": np.sin,
    "tanh": np.tanh,
    "arcsin": np.arcsin,
    "arccos": np.arccos,
    "arctan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "arcsinh": np.arcsinh,
    "arccosh": np.arccosh,
    "arctanh": np.arctanh,
    "log2": np.log2,
    "log10": np.log10,
    "negative": np.negative,
    "abs": np.abs,
    "sign": np.sign,
    "floor": np.floor,
    "isnan": np.isnan,
    "invert": np.invert,
}
_EDGES = {
    # name: boundary inputs (float dtypes), where values and derivatives are inf/nan or the
    # derivative is finite at a nan value: nablax must give JAX's results there too
    "arcsin": [-1.0, -0.5, 0.0, 1.0, 1.5],
    "arccos": [-1.0, -0.5, 0.0, 1.0, 1.5],
    "arctan": [-np.inf, 0.0, 1e20, np.inf, np.nan],
    "sinh": [-100.0, -1.0, 0.0, 100.0],
    "cosh": [-100.0, -1.0, 0.0, 100.0],
    "arcsinh": [-np.inf, -1.0, 0.0, 1e20, np.inf],
    "arccosh": [-2.0, 0.5, 1.0, 1.5, np.inf],
    "arctanh": [-1.0, -0.5, 0.0, 1.0, 2.0],
    "log2": [-1.0, 0.0, 0.5, 8.0, np.inf],
    "log10": [-1.0, 0.0, 0.5, 100.0, np.inf],
    "exp2": [-np.inf, -200.0, 0.0, 3.0, 200.0, np.inf],
    "reciprocal": [-2.0, -0.0, 0.0, 0.5, np.inf],
    "trunc": [-2.5, -1.0, -0.5, 0.0, 0.5, 2.5, np.inf, np.nan],
    "relu": [-np.inf, -1.0, -0.0, 0.0, 2.0, np.inf, np.nan],  # NaN stays NaN, derivative 0 at 0
}


def unary_edges(name, kind):
    """``unary(kind)`` with the op's boundary points second (so that the derivative and vmap
    tests, which take the first cases of a spec, include them)."""
    base = unary(kind)

    def gen(dt, rng):
        cases = base(dt, rng)
        if dt in FLOATS:
            with np.errstate(over="ignore"):  # 1e20 is inf in float16: an edge there too
                e = np.array(_EDGES[name], np.float32).astype(dt)
            cases.insert(1, Case((e,), label="edges"))
        return cases

    return gen


for _n, (_ref, _kind, _dts) in _FLOAT_UNARY.items():
    _gen = unary_edges(_n, _kind) if _n in _EDGES else unary(_kind)
    spec(_n, getattr(nx, _n), _ref, _gen, _dts, [_n], np_ref=_NP_UNARY.get(_n))
# Nabla's and PyTorch's spellings: the same functions
for _alias, _n in [
    ("asin", "arcsin"),
    ("acos", "arccos"),
    ("atan", "arctan"),
    ("asinh", "arcsinh"),
    ("acosh", "arccosh"),
    ("atanh", "arctanh"),
]:
    _ref, _kind, _ = _FLOAT_UNARY[_n]
    spec(_alias, getattr(nx, _alias), _ref, unary(_kind, shapes=((3, 4),)), F32_ONLY, [_n])

spec(
    "round",
    nx.round,
    jnp.round,
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt, "small") * 2],
        lambda dt, r: [np.array([0.5, 1.5, 2.5, -0.5, -1.5, 3.0], dtype=dt)],
        (lambda dt, r: [A(r, (5,), dt, "small")], {"decimals": 1}),
    ),
    NUMERIC,
    ["round", "multiply", "divide"],
    np_ref=np.round,
)
spec("square", nx.square, jnp.square, unary("normal"), NUMERIC, ["multiply"], np_ref=np.square)
spec(
    "trunc",
    nx.trunc,
    jnp.trunc,
    unary_edges("trunc", "small"),
    ALL,  # integer and bool tensors come back unchanged
    ["less", "ceil", "floor", "select"],
    np_ref=np.trunc,
)
spec(
    "exp2",
    nx.exp2,
    jnp.exp2,
    unary_edges("exp2", "small"),
    ALL,
    ["multiply", "exp"],
    np_ref=lambda x: np.exp2(x.astype(np.float32)),  # NumPy: float16 for bools
)
spec(
    "reciprocal",
    nx.reciprocal,
    jnp.reciprocal,
    unary_edges("reciprocal", "nonzero"),
    ALL,
    ["divide"],
    np_ref=lambda x: 1 / x.astype(np.float32),  # as jnp: ints become float (NumPy truncates)
)
spec(
    "stop_gradient",
    nx.stop_gradient,
    jax.lax.stop_gradient,
    unary(),
    ALL,
    ["stop_gradient"],
)
spec(
    "vjp_primal",  # nx.vjp's forward value: exercises the trace_input marker primitive
    # of a pending input (a computed input's marker is computed at once: no node to test)
    lambda x: nx.vjp(lambda y: y * 2.0, x * 1.0)[0],
    lambda x: x * 2.0,
    unary(),
    FLOATS,
    ["trace_input", "multiply"],
)
spec(
    "vmap_rows",  # nx.vmap over the rows: exercises the batch-axis view primitives
    lambda x: nx.vmap(lambda r: r * 2.0 + r.sum())(x),
    lambda x: jax.vmap(lambda r: r * 2.0 + r.sum())(x),
    cases_of(lambda dt, r: [A(r, (3, 4), dt)], lambda dt, r: [A(r, (2, 5, 3), dt)]),
    FLOATS,
    ["incr_batch_dims", "decr_batch_dims", "multiply", "add", "reduce_sum"],
)
_scaled_grad = nx.custom_vjp(lambda x: x * 1.0)
_scaled_grad.defvjp(lambda x: (x * 1.0, None), lambda res, g: (g * 3.0,))
spec(
    "custom_vjp_primal",  # a custom_vjp function called under a trace: one custom_vjp_call node
    lambda x: nx.vjp(_scaled_grad, x * 1.0)[0],  # pending input: a trace_input node
    lambda x: x * 1.0,
    unary(),
    FLOATS,
    ["trace_input", "stop_gradient", "multiply", "custom_vjp_call"],
)


class _SpecScale(nx.kernels.Kernel):
    """A kernel with a hand-written vjp, to check the kernel_call node against JAX."""

    def run(self, x, w, *, cfg):
        return jnp.tanh(x @ w) * 2.0

    def fwd_with_residuals(self, x, w, *, cfg):
        y = self.run(x, w, cfg=cfg)
        return y, (y,)

    def vjp(self, res, y, dy, x, w, *, cfg):
        (out,) = res
        dz = dy * (2.0 - out * out / 2.0)  # d(2 tanh z) = 2 (1 - tanh^2 z)
        return dz @ w.T, x.T @ dz

    def heuristic_cfg(self, inv):
        return _SpecCfg()


@dataclass(frozen=True)
class _SpecCfg:
    unused: int = 0


_spec_kernel = _SpecScale("spec_scale")
_spec_executor = nx.kernels.Executor(
    nx.kernels.ConfigSelectorChain(
        policy=nx.kernels.AutotunePolicy(allow_autotune=False), persistent=False
    )
)
spec(
    "kernel_call",  # a nablax.kernels Kernel on Tensors: one kernel_call node, its vjp by hand
    lambda x, w: _spec_executor(_spec_kernel, x, w),
    lambda x, w: jnp.tanh(x @ w) * 2.0,
    cases_of(lambda dt, r: [A(r, (3, 4), dt), A(r, (4, 2), dt)]),
    F32_ONLY,
    ["kernel_call"],
)
_MESH1 = nx.DeviceMesh((1,), ("dp",))  # sharding on the one in-process device (multi-device
# checks: tests/core/test_shard_map_transforms.py)


def _rows(x):
    return [nx.DimSpec(["dp"])] + [nx.DimSpec([])] * (x.ndim - 1)


spec(
    "shard_pending",  # Tensor.shard of a pending tensor: one lazy sharding_constraint node
    lambda x: (x * 2.0).shard(_MESH1, _rows(x)),
    lambda x: x * 2.0,
    unary(shapes=((3, 4), (2, 3, 5))),
    FLOATS,
    ["multiply", "sharding_constraint"],
)
spec(
    "shard_map",  # one nx.shard_map call: one shard_map_call node (its vjp/jvp: more of them)
    nx.shard_map(lambda x, w: nx.tanh(x @ w) * 2.0 + x.sum(), _MESH1),
    lambda x, w: jnp.tanh(x @ w) * 2.0 + x.sum(),
    cases_of(lambda dt, r: [A(r, (3, 4), dt), A(r, (4, 2), dt)]),
    F32_ONLY,
    ["shard_map_call"],
)


def _cf(lib):
    """Control-flow specs: the same Python bodies on nablax and on jax.lax (``lib``)."""
    if lib is nx:
        return nx, nx.tanh, nx.sin
    return jax.lax, jnp.tanh, jnp.sin


def _cond_fn(lib):
    m, tanh, _ = _cf(lib)
    # a branch that closes over an outside value (w) and one that does not
    return lambda x, w: m.cond(
        x.sum() > 0, lambda a: tanh(a @ w) * 2.0, lambda a: a[:, :2] - 1.0, x
    )


def _switch_fn(lib):
    m, tanh, sin = _cf(lib)
    fs = [lambda a, w: tanh(a @ w), lambda a, w: sin(a) @ w, lambda a, w: a @ w * 3.0]
    return lambda x, w: m.switch((x[0, 0] > 0) * 1 + (x[1, 0] > 0) * 1, fs, x, w)


def _scan_fn(lib):
    m, tanh, _ = _cf(lib)

    def f(x, w):
        def step(h, row):
            h = tanh(h @ w[:2, :] + row[:2] * 0.5)
            return h, h.sum() * row[2]

        return m.scan(step, x[0, :2] * 0.0 + 0.1, x)

    return f


def _while_fn(lib):
    m, _, sin = _cf(lib)
    # float carry (forward mode only, as in JAX) and an integer trip counter
    return lambda x: m.while_loop(
        lambda c: c[1] < 3, lambda c: (sin(c[0]) * 1.5 + x, c[1] + 1), (x, 0)
    )[0]


def _remat_fn(lib):
    if lib is nx:
        return nx.checkpoint(lambda x, w: nx.tanh(x @ w) * nx.sin(x @ w))
    return jax.checkpoint(lambda x, w: jnp.tanh(x @ w) * jnp.sin(x @ w))


_XW = cases_of(lambda dt, r: [A(r, (3, 4), dt), A(r, (4, 2), dt)])
spec("cond", _cond_fn(nx), _cond_fn(jax), _XW, F32_ONLY, ["cond"])
spec("switch", _switch_fn(nx), _switch_fn(jax), _XW, F32_ONLY, ["cond"])
spec("scan", _scan_fn(nx), _scan_fn(jax), _XW, F32_ONLY, ["scan"])
spec(
    "while_loop",
    _while_fn(nx),
    _while_fn(jax),
    unary(shapes=((3,), (2, 2))),
    F32_ONLY,
    ["while_loop"],
)
spec("checkpoint", _remat_fn(nx), _remat_fn(jax), _XW, F32_ONLY, ["checkpoint"])


def _scan_grad_fn(lib):
    """The gradient of a scan: its backward node (``cf_pullback``) as an op of its own, so that
    its shape rule, derivative (second order) and batching are checked like any primitive's."""
    f = _scan_fn(lib)
    grad = nx.grad if lib is nx else jax.grad

    def loss(x, w):
        c, ys = f(x, w)
        return (c * c).sum() + (ys * ys).sum()

    return grad(loss, argnums=1)


spec("scan_grad", _scan_grad_fn(nx), _scan_grad_fn(jax), _XW, F32_ONLY, ["cf_pullback"])

# ---- windowed ops: conv and pooling (nn.functional, PyTorch's arguments; lax as the reference) --


def _conv_ref(x, w, stride=1, padding=0, dilation=1, groups=1):
    pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
    pads = [(p, p) for p in pair(padding)]
    return jax.lax.conv_general_dilated(
        x, w, pair(stride), pads, rhs_dilation=pair(dilation), feature_group_count=groups
    )


def _pool_ref(kind):
    def ref(x, kernel_size, stride=None, padding=0):
        pair = lambda v: (v, v) if isinstance(v, int) else tuple(v)
        k, p = pair(kernel_size), pair(padding)
        s = k if stride is None else pair(stride)
        pads = ((0, 0), (0, 0)) + tuple((q, q) for q in p)
        if kind == "max":
            init, op = -jnp.inf, jax.lax.max
        else:
            init, op = 0.0, jax.lax.add
        y = jax.lax.reduce_window(x, np.array(init, x.dtype), op, (1, 1) + k, (1, 1) + s, pads)
        return y if kind == "max" else y / (k[0] * k[1])

    return ref


_F = nx.nn.functional
spec(
    "conv2d",
    _F.conv2d,
    _conv_ref,
    cases_of(
        lambda dt, r: [A(r, (2, 3, 6, 5), dt), A(r, (4, 3, 3, 3), dt)],
        (
            lambda dt, r: [A(r, (1, 4, 7, 7), dt), A(r, (6, 2, 3, 2), dt)],
            {"stride": 2, "padding": (1, 2), "groups": 2},
        ),
        (
            lambda dt, r: [A(r, (2, 2, 8, 8), dt), A(r, (3, 2, 2, 2), dt)],
            {"dilation": 2, "padding": 1},
        ),
    ),
    FLOATS,
    ["conv"],
    tol_scale=4.0,
)
spec(
    "max_pool2d",
    _F.max_pool2d,
    _pool_ref("max"),
    cases_of(
        lambda dt, r: [A(r, (2, 3, 6, 6), dt), Static(2)],
        (lambda dt, r: [A(r, (1, 2, 7, 5), dt), Static(3)], {"stride": 2, "padding": 1}),
    ),
    FLOATS,
    ["reduce_window"],
)
spec(
    "avg_pool2d",
    _F.avg_pool2d,
    _pool_ref("sum"),
    cases_of(
        lambda dt, r: [A(r, (2, 3, 6, 6), dt), Static(2)],
        (lambda dt, r: [A(r, (1, 2, 7, 5), dt), Static((3, 2))], {"stride": (2, 1), "padding": 1}),
    ),
    FLOATS,
    ["reduce_window"],
)


# ---- fused training primitives (core/prims/fused.py): cross-entropy and Adam's update ----------


def _cross_entropy_ref(x, y, label_smoothing=0.0, reduction="mean", ignore_index=-100):
    logp = jax.nn.log_softmax(x, axis=1)
    valid = y != ignore_index
    picked = jnp.take_along_axis(logp, jnp.expand_dims(jnp.where(valid, y, 0), 1), axis=1)[:, 0]
    nll = -picked * (1 - label_smoothing) - label_smoothing * logp.mean(axis=1)
    nll = jnp.where(valid, nll, 0.0)
    if reduction == "none":
        return nll
    return nll.sum() if reduction == "sum" else nll.sum() / valid.sum().astype(x.dtype)


def _labels(shape, n_cls, ignore=True):
    y = np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape) * 7 % n_cls
    if ignore:
        y.flat[1] = -100  # an ignored target
    return y


spec(
    "cross_entropy",
    _F.cross_entropy,
    _cross_entropy_ref,
    cases_of(
        lambda dt, r: [A(r, (6, 5), dt), _labels((6,), 5)],
        (lambda dt, r: [A(r, (4, 3), dt), _labels((4,), 3, False)], {"label_smoothing": 0.2}),
        (lambda dt, r: [A(r, (2, 4, 3), dt), _labels((2, 3), 4)], {"reduction": "none"}),
        (lambda dt, r: [A(r, (5, 4), dt), _labels((5,), 4)], {"reduction": "sum"}),
    ),
    FLOATS,
    ["cross_entropy"],
    tol_scale=4.0,
)


def _adam_fn(mod):
    def f(g, m, v, count):
        if mod is nx:
            from nablax.core.prims import fused

            return fused.adam_update(g, m, v, count, 0.9, 0.999, 1e-8)
        m = 0.9 * m + 0.1 * g
        v = 0.999 * v + 0.001 * (g * g)
        t = count.astype(jnp.float32)
        c1, c2 = 1 - 0.9**t, jnp.sqrt(1 - 0.999**t)
        return m, v, (m / c1.astype(m.dtype)) / (jnp.sqrt(v) / c2.astype(v.dtype) + 1e-8)

    return f


spec(
    "adam_update",
    _adam_fn(nx),
    _adam_fn(jax),
    cases_of(
        lambda dt, r: [
            A(r, (3, 4), dt),
            A(r, (3, 4), dt),
            A(r, (3, 4), dt, "pos"),
            np.array(3, np.int32),
        ],
        lambda dt, r: [A(r, (), dt), A(r, (), dt), A(r, (), dt, "pos"), np.array(1, np.int32)],
    ),
    FLOATS,
    ["adam_update"],
    tol_scale=4.0,
)


# ---- fused layers (core/prims/fused_nn.py): layer norm, linear with bias (gelu: activations) ----


def _layer_norm_ref(x, w=None, b=None, n_axes=1, eps=1e-5):
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    mu = x.mean(axis=axes, keepdims=True)
    var = jnp.square(x - mu).mean(axis=axes, keepdims=True)
    y = (x - mu) / jnp.sqrt(var + eps)
    y = y if w is None else y * w
    return y if b is None else y + b


spec(
    "layer_norm",
    lambda x, w, b: _F.layer_norm(x, (5,), w, b),
    _layer_norm_ref,
    cases_of(lambda dt, r: [A(r, (3, 5), dt), A(r, (5,), dt), A(r, (5,), dt)]),
    F32_ONLY,
    ["layer_norm"],
    tol_scale=4.0,
)


def _rms_norm_ref(x, w=None, n_axes=1, eps=1e-6):
    axes = tuple(range(x.ndim - n_axes, x.ndim))
    y = x / jnp.sqrt(jnp.square(x).mean(axis=axes, keepdims=True) + eps)
    return y if w is None else y * w


spec(
    "rms_norm",
    lambda x, w: _F.rms_norm(x, (5,), w, eps=1e-6),
    _rms_norm_ref,
    cases_of(lambda dt, r: [A(r, (3, 5), dt), A(r, (5,), dt)]),
    F32_ONLY,
    ["rms_norm"],
    tol_scale=4.0,
)
spec(
    "rms_norm_2d_plain",
    lambda x: _F.rms_norm(x, (2, 3), eps=1e-3),
    lambda x: _rms_norm_ref(x, n_axes=2, eps=1e-3),
    cases_of(lambda dt, r: [A(r, (4, 2, 3), dt)]),
    F32_ONLY,
    ["rms_norm"],
    tol_scale=4.0,
)
spec(
    "layer_norm_2d_plain",
    lambda x: _F.layer_norm(x, (2, 3), eps=1e-3),
    lambda x: _layer_norm_ref(x, n_axes=2, eps=1e-3),
    cases_of(lambda dt, r: [A(r, (4, 2, 3), dt)]),
    F32_ONLY,
    ["layer_norm"],
    tol_scale=4.0,
)
spec(
    "linear_bias",
    _F.linear,
    lambda x, w, b: jnp.einsum("...i,oi->...o", x, w, precision="highest") + b,
    cases_of(
        lambda dt, r: [A(r, (2, 3, 4), dt), A(r, (5, 4), dt), A(r, (5,), dt)],
        lambda dt, r: [A(r, (4,), dt), A(r, (2, 4), dt), A(r, (2,), dt)],
    ),
    F32_ONLY,
    ["linear"],
    tol_scale=4.0,
)


def _clip_fn(mod):
    def f(a, b):
        if mod is nx:
            from nablax.core.prims import fused_nn

            return tuple(fused_nn.clip_by_global_norm([a, b], 1.0))
        norm = jnp.sqrt(jnp.sum(a * a) + jnp.sum(b * b))
        return tuple(jnp.where(norm < 1.0, x, (x / norm) * 1.0) for x in (a, b))

    return f


def _adamw_fn(mod):
    def f(g, m, v, count, p):
        if mod is nx:
            from nablax.core.prims import fused_nn

            return fused_nn.adamw_update(g, m, v, count, p, 0.9, 0.999, 1e-8, 0.01, -1e-3)
        m, v, d = _adam_fn(jax)(g, m, v, count)
        return m, v, (d + 0.01 * p) * -1e-3

    return f


spec(
    "adamw_update",
    _adamw_fn(nx),
    _adamw_fn(jax),
    cases_of(
        lambda dt, r: [
            A(r, (3, 4), dt),
            A(r, (3, 4), dt),
            A(r, (3, 4), dt, "pos"),
            np.array(3, np.int32),
            A(r, (3, 4), dt),
        ],
    ),
    F32_ONLY,
    ["adamw_update"],
    tol_scale=4.0,
)


def _adamw_tree_fn(mod):
    """Two parameters of different shapes in one AdamW node (the optimizer's whole tree)."""

    def f(g1, g2, m1, m2, v1, v2, count, p1, p2):
        if mod is nx:
            from nablax.core.prims import fused_nn

            out = fused_nn.adamw_update_tree(
                [g1, g2], [m1, m2], [v1, v2], count, [p1, p2], 0.9, 0.999, 1e-8, 0.01, -1e-3
            )
            return tuple(x for triple in zip(*out) for x in triple)
        ref = _adamw_fn(jax)
        return ref(g1, m1, v1, count, p1) + ref(g2, m2, v2, count, p2)

    return f


spec(
    "adamw_update_tree",
    _adamw_tree_fn(nx),
    _adamw_tree_fn(jax),
    cases_of(
        lambda dt, r: [
            A(r, (3, 4), dt),
            A(r, (2,), dt),
            A(r, (3, 4), dt),
            A(r, (2,), dt),
            A(r, (3, 4), dt, "pos"),
            A(r, (2,), dt, "pos"),
            np.array(3, np.int32),
            A(r, (3, 4), dt),
            A(r, (2,), dt),
        ],
    ),
    F32_ONLY,
    ["adamw_update"],
    tol_scale=4.0,
)


def _apply_updates_fn(mod):
    def f(p1, p2, u1, u2):
        if mod is nx:
            from nablax import optim

            out = optim.apply_updates({"a": p1, "b": p2}, {"a": u1, "b": u2})
            return out["a"], out["b"]
        return p1 + u1, p2 + u2

    return f


spec(
    "apply_updates",
    _apply_updates_fn(nx),
    _apply_updates_fn(jax),
    cases_of(lambda dt, r: [A(r, (3, 4), dt), A(r, (2,), dt), A(r, (3, 4), dt), A(r, (2,), dt)]),
    FLOATS,
    ["apply_updates"],
)

spec(
    "clip_by_global_norm",
    _clip_fn(nx),
    _clip_fn(jax),
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt), A(r, (2,), dt)],  # a norm over 1: scaled
        lambda dt, r: [A(r, (2,), dt, "unit") / 10, np.asarray(A(r, (), dt, "unit") / 10)],  # kept
    ),
    F32_ONLY,
    ["clip_by_global_norm"],
    tol_scale=4.0,
)

spec(
    "astype",
    nx.astype,
    lambda x, d: x.astype(d),
    lambda dt, r: [
        Case((A(r, (3, 4), dt, "small"), Static(d)), label=str(d), core=d == F32 or d == I32)
        for d in ALL
        if d != dt
    ],
    ALL,
    ["convert_element_type"],
)

# ---- elementwise: binary ---------------------------------------------------------------------

_BINARY = {
    # name: (jnp reference, lhs kind, rhs kind, dtypes, NumPy reference)
    "add": (jnp.add, "normal", "normal", ALL, np.add),
    "subtract": (jnp.subtract, "normal", "normal", NUMERIC, np.subtract),
    "multiply": (jnp.multiply, "normal", "normal", ALL, np.multiply),
    "divide": (jnp.divide, "normal", "nonzero", NUMERIC, np.divide),
    "floor_divide": (jnp.floor_divide, "normal", "nonzero", NUMERIC, np.floor_divide),
    "mod": (jnp.remainder, "normal", "nonzero", NUMERIC, np.mod),
    "power": (jnp.power, "pos", "expo", NUMERIC, np.power),
    "maximum": (jnp.maximum, "normal", "normal", ALL, np.maximum),
    "minimum": (jnp.minimum, "normal", "normal", ALL, np.minimum),
    "arctan2": (jnp.arctan2, "normal", "normal", NUMERIC, np.arctan2),
    "equal": (jnp.equal, "small", "small", ALL, np.equal),
    "not_equal": (jnp.not_equal, "small", "small", ALL, np.not_equal),
    "less": (jnp.less, "small", "small", ALL, np.less),
    "less_equal": (jnp.less_equal, "small", "small", ALL, np.less_equal),
    "greater": (jnp.greater, "small", "small", ALL, np.greater),
    "greater_equal": (jnp.greater_equal, "small", "small", ALL, np.greater_equal),
    "bitwise_and": (jnp.bitwise_and, "normal", "normal", INTLIKE, np.bitwise_and),
    "bitwise_or": (jnp.bitwise_or, "normal", "normal", INTLIKE, np.bitwise_or),
    "bitwise_xor": (jnp.bitwise_xor, "normal", "normal", INTLIKE, np.bitwise_xor),
}
for _n, (_ref, _ka, _kb, _dts, _np) in _BINARY.items():
    _sc = _int_scalars if _n.startswith("bitwise") else py_scalars
    spec(_n, getattr(nx, _n), _ref, binary(_ka, _kb, _sc), _dts, [_n], np_ref=_np)

spec(
    "true_divide",
    nx.true_divide,
    jnp.true_divide,
    binary("normal", "nonzero"),
    F32_ONLY,
    ["divide"],
)
spec("remainder", nx.remainder, jnp.remainder, binary("normal", "nonzero"), (I32,), ["mod"])

for _n, _ref in {
    "logical_and": jnp.logical_and,
    "logical_or": jnp.logical_or,
    "logical_xor": jnp.logical_xor,
}.items():
    _bit = "bitwise_" + _n.split("_")[1]
    spec(
        _n,
        getattr(nx, _n),
        _ref,
        binary("small", "small"),
        (BOOL, I32, F32),
        [_bit, "convert_element_type"],
    )
spec(
    "logical_not",
    nx.logical_not,
    jnp.logical_not,
    unary("small"),
    (BOOL, I32, F32),
    ["invert", "convert_element_type"],
)


def _where_gen(dt, r):
    c = lambda s: A(r, s, BOOL)  # noqa: E731
    s1, s2 = py_scalars(dt)
    return [
        Case((c((3, 4)), A(r, (3, 4), dt), A(r, (3, 4), dt)), label="same", core=True),
        Case((c((3, 1)), A(r, (1, 4), dt), A(r, (), dt)), label="bcast"),
        Case((A(r, (3, 4), I32, "unit"), A(r, (3, 4), dt), A(r, (4,), dt)), label="intcond"),
        Case((c((3, 4)), A(r, (3, 4), dt), s1), label="x_scalar", core=True),
        Case((c((3, 4)), s2, A(r, (3, 4), dt)), label="scalar_y"),
        Case((c((2, 3)), s1, s2), label="two_scalars"),
        Case((c((0, 3)), A(r, (0, 3), dt), A(r, (3,), dt)), label="empty"),
    ]


spec("where", nx.where, jnp.where, _where_gen, ALL, ["select"], np_ref=np.where)


def _clip_gen(dt, r):
    return [
        Case((A(r, (3, 4), dt), -0.5 if dt != I32 else -1, 1), label="scalars", core=True),
        Case((A(r, (3, 4), dt), None, 0.5 if dt != I32 else 2), label="max_only"),
        Case((A(r, (3, 4), dt), A(r, (4,), dt) - 1, None), label="min_tensor"),
        Case((A(r, (3, 4), dt), A(r, (3, 1), dt) - 1, A(r, (4,), dt) + 1), label="tensors"),
    ]


spec(
    "clip",
    nx.clip,
    lambda x, lo, hi: jnp.clip(x, lo, hi),
    _clip_gen,
    NUMERIC,
    ["maximum", "minimum"],
    np_ref=lambda x, lo, hi: np.clip(x, lo, hi),
)

# ---- activations (jax.nn) --------------------------------------------------------------------

_ACT_CASES = unary("small", shapes=((3, 4), (), (0, 2), (7,)))
spec("relu", nx.relu, jax.nn.relu, unary_edges("relu", "small"), NUMERIC, ["relu"])
spec("relu_bool", nx.relu, jax.nn.relu, unary(), (BOOL,), ["select"])
spec(
    "gelu",
    nx.gelu,
    jax.nn.gelu,
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt, "small")],
        lambda dt, r: [A(r, (), dt, "small")],
        (lambda dt, r: [A(r, (6,), dt, "small")], {"approximate": True}),
        (lambda dt, r: [A(r, (6,), dt, "small")], {"approximate": False}),
    ),
    FLOATS,
    ["gelu"],
    tol_scale=2,
)
spec("silu", nx.silu, jax.nn.silu, _ACT_CASES, FLOATS, ["multiply", "sigmoid"])
spec(
    "softplus",
    nx.softplus,
    jax.nn.softplus,
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt, "small")],
        lambda dt, r: [np.array([-30.0, -1.0, 0.0, 1.0, 30.0], dtype=dt)],
    ),
    FLOATS,
    ["greater", "select", "minimum", "log1p", "exp"],
    tol_scale=2,
)


def _softmax_cases(big):
    return cases_of(
        lambda dt, r: [A(r, (3, 4), dt)],
        (lambda dt, r: [A(r, (2, 3, 4), dt)], {"axis": 1}),
        (lambda dt, r: [A(r, (2, 3, 4), dt)], {"axis": (0, 2)}),
        (lambda dt, r: [np.array([big, big, -big], dtype=np.float32).astype(dt)], {}),
        (lambda dt, r: [A(r, (5,), dt)], {"axis": 0}),
    )


# log_softmax of large inputs: see also test_ops.py::test_log_softmax_large_inputs
spec(
    "softmax",
    nx.softmax,
    jax.nn.softmax,
    _softmax_cases(1000.0),
    FLOATS,
    ["exp", "subtract", "stop_gradient", "reduce_max", "reduce_sum", "divide"],
    tol_scale=2,
)
spec(
    "log_softmax",
    nx.log_softmax,
    jax.nn.log_softmax,
    _softmax_cases(50.0),
    FLOATS,
    ["subtract", "reduce_max", "reduce_sum", "exp", "log", "stop_gradient"],
    tol_scale=2,
)

# ---- reductions, scans, sorting --------------------------------------------------------------

spec(
    "sum", nx.sum, jnp.sum, reduction(), ALL, ["reduce_sum", "reshape"], np_ref=np.sum, tol_scale=3
)
spec("prod", nx.prod, jnp.prod, reduction("unit"), ALL, ["reduce_prod", "reshape"], np_ref=np.prod)
spec(
    "mean",
    nx.mean,
    jnp.mean,
    reduction(),
    ALL,
    ["reduce_sum", "divide", "reshape"],
    np_ref=lambda x, **kw: np.mean(x.astype(np.float32), **kw),
    tol_scale=3,
)
_NONEMPTY = [c for c in REDUCE_CASES if 0 not in c[0]] + [((0, 3), 1, False)]
spec(
    "max",
    nx.max,
    jnp.max,
    reduction("normal", _NONEMPTY),
    ALL,
    ["reduce_max", "reshape"],
    np_ref=np.max,
)
spec(
    "min",
    nx.min,
    jnp.min,
    reduction("normal", _NONEMPTY),
    ALL,
    ["reduce_min", "reshape"],
    np_ref=np.min,
)
# zero-size all/any: see test_ops.py::test_all_any_of_empty
spec(
    "all",
    nx.all,
    jnp.all,
    reduction("unit", _NONEMPTY),
    (BOOL, I32, F32),
    ["reduce_and", "convert_element_type"],
    np_ref=np.all,
)
spec(
    "any",
    nx.any,
    jnp.any,
    reduction("unit", _NONEMPTY),
    (BOOL, I32, F32),
    ["reduce_or", "convert_element_type"],
    np_ref=np.any,
)
_VAR_CASES = cases_of(
    lambda dt, r: [A(r, (3, 4), dt)],
    (lambda dt, r: [A(r, (3, 4), dt)], {"axis": 0}),
    (lambda dt, r: [A(r, (2, 3, 4), dt)], {"axis": (0, 2), "keepdims": True}),
    (lambda dt, r: [A(r, (5, 3), dt)], {"axis": -1, "ddof": 1}),
    (lambda dt, r: [A(r, (), dt)], {}),
)
spec(
    "var",
    nx.var,
    jnp.var,
    _VAR_CASES,
    (F32, I32, F16, BF16),
    ["subtract", "multiply", "reduce_sum", "divide", "reshape"],
    np_ref=lambda x, **kw: np.var(x.astype(np.float64), **kw),
    tol_scale=5,
)
spec(
    "std",
    nx.std,
    jnp.std,
    _VAR_CASES,
    (F32, I32, F16, BF16),
    ["subtract", "multiply", "reduce_sum", "divide", "sqrt"],
    np_ref=lambda x, **kw: np.std(x.astype(np.float64), **kw),
    tol_scale=5,
)
spec(
    "logsumexp",
    nx.logsumexp,
    jax.nn.logsumexp,
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt)],
        (lambda dt, r: [A(r, (3, 4), dt)], {"axis": 1}),
        (lambda dt, r: [A(r, (2, 3, 4), dt)], {"axis": (0, 2), "keepdims": True}),
        (lambda dt, r: [np.array([[-np.inf, -np.inf], [1000.0, 1000.0]], dtype=dt)], {"axis": 1}),
        (lambda dt, r: [A(r, (), dt)], {}),
    ),
    FLOATS,
    [
        "reduce_max",
        "stop_gradient",
        "isfinite",
        "select",
        "subtract",
        "exp",
        "reduce_sum",
        "log",
        "add",
    ],
    tol_scale=3,
)
_ARG_CASES = cases_of(
    lambda dt, r: [A(r, (3, 4), dt, "distinct")],
    (lambda dt, r: [A(r, (3, 4), dt, "distinct")], {"axis": 0}),
    (lambda dt, r: [A(r, (2, 3, 4), dt, "distinct")], {"axis": -1, "keepdims": True}),
    (lambda dt, r: [A(r, (3, 4), dt, "distinct")], {"keepdims": True}),
    (lambda dt, r: [np.array([1.0, 3.0, 3.0, 0.0], dtype=dt)], {}),  # first occurrence wins
)
spec(
    "argmax",
    nx.argmax,
    jnp.argmax,
    _ARG_CASES,
    (F32, I32, F16, BF16),
    ["argmax", "reshape"],
    np_ref=np.argmax,
)
spec(
    "argmin",
    nx.argmin,
    jnp.argmin,
    _ARG_CASES,
    (F32, I32, F16, BF16),
    ["argmin", "reshape"],
    np_ref=np.argmin,
)
spec(
    "cumsum",
    nx.cumsum,
    jnp.cumsum,
    cases_of(
        (lambda dt, r: [A(r, (3, 4), dt)], {"axis": 1}),
        (lambda dt, r: [A(r, (3, 4), dt)], {"axis": 0}),
        (lambda dt, r: [A(r, (2, 3), dt)], {}),
        (lambda dt, r: [A(r, (0, 3), dt)], {"axis": 0}),
    ),
    ALL,
    ["cumsum", "reshape"],
    np_ref=np.cumsum,
    tol_scale=3,
)
_SORT_CASES = cases_of(
    lambda dt, r: [A(r, (3, 5), dt, "distinct")],
    (lambda dt, r: [A(r, (3, 5), dt, "distinct")], {"axis": 0}),
    (lambda dt, r: [A(r, (2, 3), dt, "distinct")], {"axis": None}),
    (lambda dt, r: [np.array([3.0, np.nan, -1.0, 2.0, -np.inf], dtype=dt)], {}),
    (lambda dt, r: [A(r, (0,), dt)], {}),
)
spec("sort", nx.sort, jnp.sort, _SORT_CASES, FLOATS, ["sort", "reshape"], np_ref=np.sort)
spec(
    "argsort",
    nx.argsort,
    lambda x, **kw: jnp.argsort(x, stable=True, **kw),
    _SORT_CASES,
    FLOATS,
    ["argsort", "reshape"],
    np_ref=lambda x, **kw: np.argsort(x, kind="stable", **kw),
)
spec(
    "sort_int",
    nx.sort,
    jnp.sort,
    cases_of(lambda dt, r: [A(r, (4, 6), dt)], (lambda dt, r: [A(r, (4, 6), dt)], {"axis": 0})),
    (I32, BOOL),
    ["sort"],
    np_ref=np.sort,
)
spec(
    "argsort_int",
    nx.argsort,
    lambda x, **kw: jnp.argsort(x, stable=True, **kw),
    cases_of(lambda dt, r: [A(r, (4, 6), dt)], (lambda dt, r: [A(r, (4, 6), dt)], {"axis": 0})),
    (I32, BOOL),
    ["argsort"],
    np_ref=lambda x, **kw: np.argsort(x, kind="stable", **kw),
)


def _ref_topk(x, k, axis=-1):
    x = jnp.moveaxis(x, axis, -1)
    v, i = jax.lax.top_k(x, k)
    return jnp.moveaxis(v, -1, axis), jnp.moveaxis(i, -1, axis)


spec(
    "topk",
    nx.topk,
    _ref_topk,
    cases_of(
        lambda dt, r: [A(r, (3, 6), dt, "distinct"), 2],
        (lambda dt, r: [A(r, (4, 3), dt, "distinct"), 3], {"axis": 0}),
        lambda dt, r: [A(r, (5,), dt, "distinct"), 5],
        lambda dt, r: [np.array([1.0, 3.0, 3.0, 2.0], dtype=dt), 2],
    ),
    (F32, I32, F16, BF16),
    ["top_k", "transpose"],
)

# ---- linear algebra --------------------------------------------------------------------------


def _pair(sa, sb, ka="normal"):
    return lambda dt, r: [A(r, sa, dt, ka), A(r, sb, dt, ka)]


spec(
    "matmul",
    nx.matmul,
    jnp.matmul,
    cases_of(
        _pair((3, 4), (4, 5)),
        _pair((4,), (4, 5)),
        _pair((3, 4), (4,)),
        _pair((4,), (4,)),
        _pair((2, 3, 4), (4, 5)),
        _pair((2, 1, 3, 4), (5, 4, 2)),
        _pair((0, 4), (4, 3)),
        _pair((3, 0), (0, 2)),
        _pair((4,), (2, 4, 3)),
    ),
    NUMERIC,
    ["einsum"],
    np_ref=np.matmul,
    tol_scale=3,
)
spec(
    "dot",
    nx.dot,
    jnp.dot,
    cases_of(
        _pair((3, 4), (4, 5)),
        _pair((2, 3, 4), (5, 4, 2)),
        _pair((4,), (4,)),
        _pair((), (3,)),
        _pair((3, 4), (4,)),
        _pair((4,), (4, 2)),
    ),
    NUMERIC,
    ["einsum", "multiply"],
    np_ref=np.dot,
    tol_scale=3,
)


def _ein(spec_str, *shapes):
    return lambda dt, r: [Static(spec_str), *(A(r, s, dt) for s in shapes)]


spec(
    "einsum",
    nx.einsum,
    jnp.einsum,
    cases_of(
        _ein("ij,jk->ik", (3, 4), (4, 5)),
        _ein("bij,bjk->bik", (2, 3, 4), (2, 4, 5)),
        _ein("ij->ji", (3, 4)),
        _ein("ij->", (3, 4)),
        _ein("ii->i", (3, 3)),
        _ein("ij,jk", (2, 3), (3, 2)),
        _ein("...ij,...jk->...ik", (2, 1, 3, 4), (5, 4, 2)),
        _ein("i,j->ij", (3,), (4,)),
        _ein("i j , j k -> i k", (2, 3), (3, 2)),
        _ein("ij,jk,kl->il", (2, 3), (3, 4), (4, 2)),
    ),
    NUMERIC,
    ["einsum"],
    np_ref=np.einsum,
    tol_scale=3,
)
spec(
    "outer",
    nx.outer,
    jnp.outer,
    cases_of(_pair((3,), (4,)), _pair((2, 2), (3,)), _pair((), (2,))),
    ALL,
    ["reshape", "multiply"],
    np_ref=np.outer,
)

# ---- shape -----------------------------------------------------------------------------------


def _x(shape, kind="normal"):
    return lambda dt, r: [A(r, shape, dt, kind)]


def _xa(shape, *args):
    return lambda dt, r: [A(r, shape, dt), *(Static(a) for a in args)]


spec(
    "reshape",
    nx.reshape,
    jnp.reshape,
    cases_of(
        _xa((3, 4), (2, 6)),
        _xa((3, 4), (-1,)),
        _xa((2, 3, 4), (4, -1)),
        _xa((), (1, 1)),
        _xa((6,), (3, 2)),
        _xa((0, 3), (3, 0)),
    ),
    SHAPE_DTYPES,
    ["reshape"],
    np_ref=np.reshape,
)
spec(
    "reshape_varargs",
    lambda x, *s: nx.reshape(x, *s),
    lambda x, *s: jnp.reshape(x, s),
    cases_of(_xa((3, 4), 6, 2), _xa((3, 4), 2, -1, 3)),
    F32_ONLY,
    ["reshape"],
)
spec(
    "ravel",
    nx.ravel,
    jnp.ravel,
    cases_of(_x((3, 4)), _x(())),
    SHAPE_DTYPES,
    ["reshape"],
    np_ref=np.ravel,
)
spec(
    "transpose",
    nx.transpose,
    jnp.transpose,
    cases_of(
        _x((3, 4)), _xa((2, 3, 4), (1, 2, 0)), _x((2, 3, 4)), _xa((2, 3, 4), (0, -1, 1)), _x((5,))
    ),
    SHAPE_DTYPES,
    ["transpose"],
    np_ref=np.transpose,
)
spec(
    "permute",
    nx.permute,
    lambda x, *d: jnp.transpose(x, d[0] if len(d) == 1 else d),
    cases_of(_xa((2, 3, 4), 2, 0, 1), _xa((2, 3, 4), (1, 0, 2))),
    SHAPE_DTYPES,
    ["transpose"],
)
spec(
    "swapaxes",
    nx.swapaxes,
    jnp.swapaxes,
    cases_of(_xa((2, 3, 4), 0, 2), _xa((3, 4), -1, 0), _xa((3, 4), 1, 1)),
    SHAPE_DTYPES,
    ["transpose"],
    np_ref=np.swapaxes,
)
spec(
    "moveaxis",
    nx.moveaxis,
    jnp.moveaxis,
    cases_of(
        _xa((2, 3, 4), 0, -1),
        _xa((2, 3, 4, 5), (0, 1), (3, 0)),
        _xa((2, 3, 4), -1, 0),
        _xa((2, 3, 4, 5), (3, 0), (1, 2)),
    ),
    SHAPE_DTYPES,
    ["transpose"],
    np_ref=np.moveaxis,
)
spec(
    "squeeze",
    nx.squeeze,
    jnp.squeeze,
    cases_of(_x((1, 3, 1, 4)), _xa((1, 3, 1), 0), _xa((1, 3, 1), (0, -1)), _x((1,))),
    SHAPE_DTYPES,
    ["reshape"],
    np_ref=np.squeeze,
)
spec(
    "expand_dims",
    nx.expand_dims,
    jnp.expand_dims,
    cases_of(_xa((3, 4), 0), _xa((3, 4), -1), _xa((3, 4), (0, 2)), _xa((), 0), _xa((3,), (-1, 0))),
    SHAPE_DTYPES,
    ["reshape"],
    np_ref=np.expand_dims,
)
spec(
    "unsqueeze",
    nx.unsqueeze,
    jnp.expand_dims,
    cases_of(_xa((3, 4), 1), _xa((3, 4), -1)),
    SHAPE_DTYPES,
    ["reshape"],
)
spec(
    "broadcast_to",
    nx.broadcast_to,
    jnp.broadcast_to,
    cases_of(_xa((3, 1), (2, 3, 4)), _xa((), (2, 2)), _xa((4,), (3, 4)), _xa((1, 3), (0, 3))),
    SHAPE_DTYPES,
    ["broadcast_in_dim"],
    np_ref=np.broadcast_to,
)


def _ts(*shapes, dts=None):
    def build(dt, r):
        return [[A(r, s, d or dt) for s, d in zip(shapes, dts or [None] * len(shapes))]]

    return build


spec(
    "concatenate",
    nx.concatenate,
    jnp.concatenate,
    cases_of(
        _ts((2, 3), (4, 3)),
        (_ts((2, 3), (2, 1), (2, 2)), {"axis": 1}),
        (_ts((2, 3), (2, 3)), {"axis": -1}),
        (_ts((2, 3), (3,)), {"axis": None}),
        _ts((0, 3), (2, 3)),
        _ts((2, 3), (1, 3), dts=[None, I32]),
        _ts((3,)),
    ),
    SHAPE_DTYPES,
    ["concatenate"],
    np_ref=np.concatenate,
)
spec(
    "stack",
    nx.stack,
    jnp.stack,
    cases_of(
        _ts((2, 3), (2, 3)),
        (_ts((2, 3), (2, 3), (2, 3)), {"axis": -1}),
        (_ts((3,), (3,)), {"axis": 1}),
        _ts((), ()),
    ),
    SHAPE_DTYPES,
    ["reshape", "concatenate"],
    np_ref=np.stack,
)


def _ref_split(x, ios, axis=0):
    """NumPy's split (decreasing indices allowed), written with jnp slicing."""
    n = x.shape[axis]
    if isinstance(ios, int):
        bounds = [i * (n // ios) for i in range(ios + 1)]
    else:
        bounds = [0, *ios, n]
    sl = lambda a, b: (slice(None),) * (axis % x.ndim) + (slice(a, b),)  # noqa: E731
    return [x[sl(a, b)] for a, b in zip(bounds[:-1], bounds[1:])]


spec(
    "split",
    nx.split,
    _ref_split,
    cases_of(
        _xa((6, 2), 3),
        _xa((6,), [2, 3]),
        (_xa((2, 6), [1, 4]), {"axis": 1}),
        _xa((6,), [-2]),
        _xa((6,), [3, 1]),
        _xa((6,), [0, 10]),
        (_xa((2, 4), 2), {"axis": -1}),
    ),
    SHAPE_DTYPES,
    ["split", "slice"],
    np_ref=np.split,
)


def _ref_chunk(x, chunks, axis=0):
    # numpy.array_split into min(chunks, n) parts (never an empty part)
    n = x.shape[axis]
    return list(jnp.array_split(x, max(1, min(chunks, n)), axis=axis))


spec(
    "chunk",
    nx.chunk,
    _ref_chunk,
    cases_of(
        _xa((5,), 3),
        _xa((6, 2), 4),
        (_xa((2, 6), 3), {"axis": 1}),
        _xa((4,), 1),
        _xa((10, 2), 3),
        _xa((2, 3), 5),
    ),
    SHAPE_DTYPES,
    ["split"],
)


def _ref_pad(x, pad_width, **kw):
    # NumPy also accepts per-axis (before=after,) pairs, which jnp.pad rejects; normalize first
    return jnp.pad(x, np.broadcast_to(np.asarray(pad_width), (x.ndim, 2)), **kw)


spec(
    "pad",
    nx.pad,
    _ref_pad,
    cases_of(
        _xa((3, 4), 1),
        _xa((3, 4), ((1, 2), (0, 3))),
        _xa((3,), (2, 1)),
        (_xa((2, 3), ((0, 1), (1, 0))), {"constant_values": 2}),
        _xa((0, 2), 1),
        # NumPy reads ((1,), (2,)) as per-axis widths: 1 on axis 0, 2 on axis 1
        (_xa((2, 3), ((1,), (2,))), {}),
    ),
    SHAPE_DTYPES,
    ["pad"],
    np_ref=np.pad,
)
spec(
    "flip",
    nx.flip,
    jnp.flip,
    cases_of(_x((3, 4)), _xa((3, 4), 0), _xa((2, 3, 4), (0, 2)), _xa((5,), -1)),
    SHAPE_DTYPES,
    ["rev"],
    np_ref=np.flip,
)
spec(
    "tile",
    nx.tile,
    jnp.tile,
    cases_of(
        _xa((2, 3), (2, 1)),
        _xa((3,), 2),
        _xa((2, 3), (2, 1, 2)),
        _xa((2, 2, 3), (2,)),
        _xa((2,), 0),
    ),
    SHAPE_DTYPES,
    ["reshape", "broadcast_in_dim"],
    np_ref=np.tile,
)
spec(
    "repeat",
    nx.repeat,
    lambda x, r, **kw: jnp.repeat(x, np.asarray(r), **kw),
    cases_of(
        _xa((2, 3), 2),
        (_xa((2, 3), 3), {"axis": 1}),
        (_xa((2, 3), [1, 0, 2]), {"axis": 1}),
        (_xa((3, 2), 0), {"axis": 0}),
        (_xa((2, 3), 2), {"axis": -1}),
    ),
    SHAPE_DTYPES,
    ["reshape", "broadcast_in_dim", "gather"],
    np_ref=np.repeat,
)

# ---- indexing functions ----------------------------------------------------------------------

spec(
    "take",
    nx.take,
    jnp.take,
    cases_of(
        _xa((3, 4), np.array([0, 5, -1, 11])),
        (_xa((3, 4), np.array([2, 0, 2])), {"axis": 0}),
        (_xa((3, 4), np.array([[0, 1], [3, -2]])), {"axis": 1}),
        (lambda dt, r: [A(r, (3, 4), dt), np.array([1, 2], dtype=np.int32)], {"axis": -1}),
        (_xa((3, 4), 2), {"axis": 1}),
    ),
    SHAPE_DTYPES,
    ["gather", "reshape"],
    np_ref=np.take,
)
spec(
    "take_along_axis",
    nx.take_along_axis,
    lambda a, i, axis: jnp.take_along_axis(a, i, axis=axis),
    cases_of(
        lambda dt, r: [A(r, (3, 4), dt), Static(np.array([[0], [3], [1]])), Static(1)],
        lambda dt, r: [A(r, (3, 4), dt), np.array([[2, 0, 1, 1]], dtype=np.int32), Static(0)],
        lambda dt, r: [A(r, (2, 3, 4), dt), Static(r.integers(0, 3, (2, 5, 4))), Static(-2)],
        lambda dt, r: [
            A(r, (3, 4), dt),
            np.argsort(A(r, (3, 4), F32), axis=1).astype(np.int32),
            Static(1),
        ],
    ),
    SHAPE_DTYPES,
    ["gather", "iota"],
    np_ref=lambda a, i, axis: np.take_along_axis(a, np.asarray(i), axis=axis),
)
spec(
    "one_hot",
    nx.one_hot,
    jax.nn.one_hot,
    cases_of(
        lambda dt, r: [np.array([0, 2, 1, 4], dtype=np.int32), Static(5)],
        lambda dt, r: [np.array([[0, -1], [3, 7]], dtype=np.int32), Static(4)],
        (
            lambda dt, r: [np.array([1, 0], dtype=np.int32), Static(3)],
            lambda dt: {"dtype": Static(dt)},
        ),
    ),
    SHAPE_DTYPES,
    ["iota", "equal", "reshape", "convert_element_type"],
)

# ---- creation --------------------------------------------------------------------------------


spec(
    "zeros",
    nx.zeros,
    jnp.zeros,
    lambda d, r: [
        Case((Static((2, 3)), Static(d)), core=True),
        Case((Static(4), Static(d))),
        Case((Static(()), Static(d))),
        Case((Static((0, 2)), Static(d))),
    ],
    ALL,
    ["broadcast_in_dim"],
)
spec(
    "ones",
    nx.ones,
    jnp.ones,
    lambda d, r: [Case((Static((2, 3)), Static(d)), core=True), Case((Static(3), Static(d)))],
    ALL,
    ["broadcast_in_dim"],
)
spec(
    "zeros_default",
    nx.zeros,
    jnp.zeros,
    lambda d, r: [Case((Static((2, 3)),)), Case((Static(5),))],
    F32_ONLY,
    ["broadcast_in_dim"],
)
spec(
    "full",
    nx.full,
    jnp.full,
    lambda d, r: [
        Case((Static((2,)), 7.0), label="float"),
        Case((Static((2, 3)), 7), label="int"),
        Case((Static((2,)), True), label="bool"),
        Case((Static((2, 2)), 2.5, Static(I32)), label="float_to_int"),
        Case((Static((2, 2)), -2.5, Static(I32)), label="neg_float_to_int"),
        Case((Static((3,)), 1, Static(F16)), label="int_to_f16"),
        Case((Static(()), 3.0, Static(BF16)), label="0d_bf16"),
        Case((Static((2, 3)), np.array([1.0, 2.0, 3.0], dtype=np.float32)), label="array_fill"),
        Case((Static((2,)), np.float32(1.5)), label="np_scalar"),
        Case((Static((2, 3)), np.array([1, 2, 3], np.int32), Static(F32)), label="array_cast"),
    ],
    F32_ONLY,
    ["broadcast_in_dim", "convert_element_type"],
)
spec(
    "zeros_like",
    nx.zeros_like,
    jnp.zeros_like,
    cases_of(_x((2, 3)), _x(()), (_x((3,)), {"dtype": Static(I32)})),
    ALL,
    ["broadcast_in_dim"],
)
spec(
    "ones_like",
    nx.ones_like,
    jnp.ones_like,
    cases_of(_x((2, 3)), (_x((3,)), {"dtype": Static(F16)})),
    ALL,
    ["broadcast_in_dim"],
)
spec(
    "full_like",
    nx.full_like,
    jnp.full_like,
    lambda d, r: [
        Case((A(r, (2, 3), d), 2), core=True),
        Case((A(r, (2,), d), 1.5)),
        Case((A(r, (2,), d), 3, Static(F32))),
    ],
    ALL,
    ["broadcast_in_dim"],
)
spec(
    "arange",
    nx.arange,
    jnp.arange,
    lambda d, r: [
        Case((10,)),
        Case((2, 11, 3)),
        Case((10, 0, -3)),
        Case((5, 2)),
        Case((0,)),
        Case((0.5, 3.0)),
        Case((0.0, 1.0, 0.25)),
        Case((5,), {"dtype": Static(F32)}),
        Case((-3, 3), {"dtype": Static(F16)}),
    ],
    F32_ONLY,
    ["iota", "multiply", "add"],
    np_ref=lambda *a, **kw: np.arange(*a, **kw),
)
spec(
    "linspace",
    nx.linspace,
    jnp.linspace,
    lambda d, r: [
        Case((0, 1, 5)),
        Case((-2.0, 3.0, 7)),
        Case((0, 1, 4), {"endpoint": False}),
        Case((1, 1, 1)),
        Case((0, 1, 0)),
        Case((0.0, 10.0, 6), {"dtype": Static(F16)}),
    ],
    F32_ONLY,
    [],
    np_ref=np.linspace,
)
spec(
    "linspace_int",
    nx.linspace,
    jnp.linspace,
    lambda d, r: [
        Case((0, 10, 4), {"dtype": Static(I32)}, label="pos"),
        Case(
            (-5, 0, 4),
            {"dtype": Static(I32)},
            label="neg",
        ),
    ],
    F32_ONLY,
    [],
    np_ref=np.linspace,
)
spec(
    "eye",
    nx.eye,
    jnp.eye,
    lambda d, r: [
        Case((3,), {"dtype": Static(d)}, core=True),
        Case((2, 4), {"k": 1, "dtype": Static(d)}),
        Case((4, 3), {"k": -2, "dtype": Static(d)}),
        Case((0,), {"dtype": Static(d)}),
    ],
    (F32, I32, BOOL, BF16),
    ["iota", "equal", "add", "convert_element_type"],
)
spec(
    "tensor",
    nx.tensor,
    jnp.asarray,
    lambda d, r: [
        Case((Static(A(r, (2, 3), d)),), core=True),
        Case((Static(A(r, (), d)),)),
        Case((Static([[1.0, 2.0], [3.0, 4.0]]),)),
        Case((Static([1, 2, 3]),)),
        Case((Static([True, False]),)),
        Case((Static(2.5),)),
        Case((Static(7),)),
        Case((Static([[1, 2]]), Static(d))),
        Case((Static(np.arange(4, dtype=np.float64)),)),
        Case((Static(np.arange(4, dtype=np.int64)),)),
        Case((Static(jnp.arange(3.0)),)),
        Case((Static(np.zeros((0, 2), np.float32)),)),
    ],
    ALL,
    [],
)
spec(
    "asarray",
    nx.asarray,
    jnp.asarray,
    lambda d, r: [
        Case((Static(A(r, (2, 3), d)),), core=True),
        Case((Static(jnp.asarray(A(r, (3,), d))),), core=True),
        Case((Static([0.5, 1.5]), Static(F16))),
        Case((Static(jnp.arange(3)), Static(F32))),
    ],
    ALL,
    [],
)

# ---- operators and methods -------------------------------------------------------------------

_OPERATORS = {
    # name: (function of two operands, lhs kind, rhs kind, dtypes)
    "+": (lambda a, b: a + b, "normal", "normal", ALL, "add"),
    "-": (lambda a, b: a - b, "normal", "normal", NUMERIC, "subtract"),
    "*": (lambda a, b: a * b, "normal", "normal", ALL, "multiply"),
    "/": (lambda a, b: a / b, "normal", "nonzero", NUMERIC, "divide"),
    "//": (lambda a, b: a // b, "normal", "nonzero", NUMERIC, "floor_divide"),
    "%": (lambda a, b: a % b, "normal", "nonzero", NUMERIC, "mod"),
    "**": (lambda a, b: a**b, "pos", "expo", NUMERIC, "power"),
    "<": (lambda a, b: a < b, "small", "small", ALL, "less"),
    "<=": (lambda a, b: a <= b, "small", "small", ALL, "less_equal"),
    ">": (lambda a, b: a > b, "small", "small", ALL, "greater"),
    ">=": (lambda a, b: a >= b, "small", "small", ALL, "greater_equal"),
    "==": (lambda a, b: a == b, "small", "small", ALL, "equal"),
    "!=": (lambda a, b: a != b, "small", "small", ALL, "not_equal"),
    "&": (lambda a, b: a & b, "normal", "normal", INTLIKE, "bitwise_and"),
    "|": (lambda a, b: a | b, "normal", "normal", INTLIKE, "bitwise_or"),
    "^": (lambda a, b: a ^ b, "normal", "normal", INTLIKE, "bitwise_xor"),
}


def _operator_gen(ka, kb, scalars=py_scalars):
    """Operators dispatch to the functions above: check the dispatch, reflection and operands."""

    def gen(dt, r):
        s_right, s_left = scalars(dt, kb)[0], scalars(dt, ka)[0]
        return [
            Case((A(r, (3, 1), dt, ka), A(r, (4,), dt, kb)), label="tensors"),
            Case((A(r, (3, 4), dt, ka), s_right), label=f"x_{s_right!r}"),
            Case((s_left, A(r, (3, 4), dt, kb)), label=f"{s_left!r}_x", core=True),
            # NumPy arrays on either side (the left one must defer to Tensor's reflected operator)
            Case((Static(A(r, (3, 4), dt, ka)), A(r, (4,), dt, kb)), label="np_left", core=True),
            Case((A(r, (3, 4), dt, ka), Static(A(r, (3, 4), dt, kb))), label="np_right"),
        ]

    return gen


for _sym, (_f, _ka, _kb, _dts, _prim) in _OPERATORS.items():
    _sc = _int_scalars if _sym in "&|^" else py_scalars
    # dtype coverage is the functions' job; two dtypes check the dispatch and weak typing
    spec(f"operator{_sym}", _f, _f, _operator_gen(_ka, _kb, _sc), _dts[:2], [_prim])

spec(
    "operator@",
    lambda a, b: a @ b,
    lambda a, b: a @ b,
    cases_of(
        _pair((3, 4), (4, 2)),
        _pair((4,), (4,)),
        _pair((2, 3, 4), (4,)),
        lambda dt, r: [Static(A(r, (2, 3), dt)), A(r, (3, 2), dt)],
        lambda dt, r: [A(r, (2, 3), dt), Static(A(r, (3, 2), dt))],
    ),
    NUMERIC,
    ["einsum"],
    tol_scale=3,
)
for _n, _f, _dts, _prim in [
    ("neg", lambda a: -a, NUMERIC, "negative"),
    ("pos", lambda a: +a, ALL, None),
    ("abs", lambda a: abs(a), ALL, "abs"),
    ("invert", lambda a: ~a, INTLIKE, "invert"),
]:
    spec(f"operator_{_n}", _f, _f, unary(shapes=((3, 4), ())), _dts[:2], [_prim] if _prim else [])

_METHODS = [
    # (name, nablax/jnp-compatible lambda, jnp reference or None (same lambda), dtypes, prims)
    ("sum", lambda x: x.sum(axis=1), None, ALL, ["reduce_sum"]),
    ("sum_keepdims", lambda x: x.sum(0, keepdims=True), None, ALL, ["reduce_sum", "reshape"]),
    ("prod", lambda x: x.prod(), None, NUMERIC, ["reduce_prod"]),
    ("mean", lambda x: x.mean(axis=-1), None, ALL, ["reduce_sum", "divide"]),
    ("max", lambda x: x.max(axis=0), None, ALL, ["reduce_max"]),
    ("min", lambda x: x.min(), None, ALL, ["reduce_min"]),
    ("all", lambda x: x.all(axis=1), None, INTLIKE, ["reduce_and"]),
    ("any", lambda x: x.any(), None, INTLIKE, ["reduce_or"]),
    ("var", lambda x: x.var(axis=1), None, FLOATS, ["reduce_sum"]),
    ("std", lambda x: x.std(), None, FLOATS, ["sqrt"]),
    ("argmax", lambda x: x.argmax(axis=1), None, NUMERIC, ["argmax"]),
    ("argmin", lambda x: x.argmin(), None, NUMERIC, ["argmin"]),
    ("cumsum", lambda x: x.cumsum(axis=0), None, ALL, ["cumsum"]),
    ("sort", lambda x: x.sort(axis=0), lambda x: jnp.sort(x, axis=0), NUMERIC, ["sort"]),
    ("argsort", lambda x: x.argsort(), lambda x: jnp.argsort(x, stable=True), NUMERIC, ["argsort"]),
    (
        "logsumexp",
        lambda x: x.logsumexp(axis=1),
        lambda x: jax.nn.logsumexp(x, axis=1),
        FLOATS,
        ["log"],
    ),
    ("topk", lambda x: x.topk(2), lambda x: jax.lax.top_k(x, 2), NUMERIC, ["top_k"]),
    ("T", lambda x: x.T, None, ALL, ["transpose"]),
    ("reshape", lambda x: x.reshape(2, 6), None, ALL, ["reshape"]),
    ("reshape_tuple", lambda x: x.reshape((4, -1)), None, ALL, ["reshape"]),
    ("transpose", lambda x: x.transpose(), None, ALL, ["transpose"]),
    ("transpose_axes", lambda x: x.transpose(1, 0), None, ALL, ["transpose"]),
    ("permute", lambda x: x.permute(1, 0), lambda x: x.transpose(1, 0), ALL, ["transpose"]),
    ("swapaxes", lambda x: x.swapaxes(0, 1), None, ALL, ["transpose"]),
    ("squeeze", lambda x: x.reshape(1, 12).squeeze(), None, ALL, ["reshape"]),
    ("unsqueeze", lambda x: x.unsqueeze(1), lambda x: x[:, None], ALL, ["reshape"]),
    ("flatten", lambda x: x.flatten(), None, ALL, ["reshape"]),
    ("ravel", lambda x: x.ravel(), None, ALL, ["reshape"]),
    (
        "broadcast_to",
        lambda x: x.broadcast_to((2, 3, 4)),
        lambda x: jnp.broadcast_to(x, (2, 3, 4)),
        ALL,
        ["broadcast_in_dim"],
    ),
    ("flip", lambda x: x.flip(0), lambda x: jnp.flip(x, 0), ALL, ["rev"]),
    ("repeat", lambda x: x.repeat(2, axis=0), None, ALL, ["broadcast_in_dim"]),
    ("take", lambda x: x.take(np.array([1, 0]), axis=1), None, ALL, ["gather"]),
    ("astype", lambda x: x.astype(jnp.float16), None, ALL, ["convert_element_type"]),
    ("clip", lambda x: x.clip(-1, 1), None, NUMERIC, ["maximum", "minimum"]),
    ("round", lambda x: x.round(), None, NUMERIC, ["round"]),
    ("abs", lambda x: x.abs(), lambda x: jnp.abs(x), NUMERIC, ["abs"]),
    ("square", lambda x: x.square(), lambda x: jnp.square(x), NUMERIC, ["multiply"]),
    ("maximum", lambda x: x.maximum(0), lambda x: jnp.maximum(x, 0), NUMERIC, ["maximum"]),
    ("minimum", lambda x: x.minimum(x.T.T), lambda x: jnp.minimum(x, x), NUMERIC, ["minimum"]),
    ("dot", lambda x: x.dot(x.T), None, NUMERIC, ["einsum"]),
    ("matmul", lambda x: x.matmul(x.T), lambda x: x @ x.T, NUMERIC, ["einsum"]),
    ("relu", lambda x: x.relu(), lambda x: jax.nn.relu(x), NUMERIC, ["relu"]),
    ("softmax", lambda x: x.softmax(), lambda x: jax.nn.softmax(x), FLOATS, ["exp"]),
    ("log_softmax", lambda x: x.log_softmax(), lambda x: jax.nn.log_softmax(x), FLOATS, ["log"]),
    ("exp", lambda x: x.exp(), lambda x: jnp.exp(x), FLOATS, ["exp"]),
    ("log", lambda x: abs(x).log(), lambda x: jnp.log(jnp.abs(x)), FLOATS, ["log"]),
    ("sqrt", lambda x: abs(x).sqrt(), lambda x: jnp.sqrt(jnp.abs(x)), FLOATS, ["sqrt"]),
    ("tanh", lambda x: x.tanh(), lambda x: jnp.tanh(x), FLOATS, ["tanh"]),
    ("sigmoid", lambda x: x.sigmoid(), lambda x: jax.nn.sigmoid(x), FLOATS, ["sigmoid"]),
    ("isnan", lambda x: x.isnan(), lambda x: jnp.isnan(x), FLOATS, ["isnan"]),
    ("sign", lambda x: x.sign(), lambda x: jnp.sign(x), NUMERIC, ["sign"]),
    ("floor", lambda x: x.floor(), lambda x: jnp.floor(x), FLOATS, ["floor"]),
]
_EW_METHODS = {
    # method: (jnp function, input transform into its domain, primitive), NumPy's and Nabla's names
    "arcsin": (jnp.arcsin, lambda x: x / 4, "arcsin"),
    "asin": (jnp.arcsin, lambda x: x / 4, "arcsin"),
    "arccos": (jnp.arccos, lambda x: x / 4, "arccos"),
    "acos": (jnp.arccos, lambda x: x / 4, "arccos"),
    "arctan": (jnp.arctan, lambda x: x, "arctan"),
    "atan": (jnp.arctan, lambda x: x, "arctan"),
    "sinh": (jnp.sinh, lambda x: x, "sinh"),
    "cosh": (jnp.cosh, lambda x: x, "cosh"),
    "arcsinh": (jnp.arcsinh, lambda x: x, "arcsinh"),
    "asinh": (jnp.arcsinh, lambda x: x, "arcsinh"),
    "arccosh": (jnp.arccosh, lambda x: x * x + 1.5, "arccosh"),
    "acosh": (jnp.arccosh, lambda x: x * x + 1.5, "arccosh"),
    "arctanh": (jnp.arctanh, lambda x: x / 4, "arctanh"),
    "atanh": (jnp.arctanh, lambda x: x / 4, "arctanh"),
    "trunc": (jnp.trunc, lambda x: x, "select"),
    "log2": (jnp.log2, abs, "log2"),
    "log10": (jnp.log10, abs, "log10"),
    "exp2": (jnp.exp2, lambda x: x, "exp"),
    "reciprocal": (jnp.reciprocal, lambda x: x, "divide"),
}
for _n, (_jf, _pre, _prim) in _EW_METHODS.items():
    _METHODS.append(
        (
            _n,
            lambda x, n=_n, pre=_pre: getattr(pre(x), n)(),
            lambda x, jf=_jf, pre=_pre: jf(pre(x)),
            FLOATS,
            [_prim],
        )
    )
for _n, _f, _r, _dts, _prims in _METHODS:
    # methods dispatch to the functions tested above: one dtype each is enough
    spec(f"method.{_n}", _f, _r or _f, cases_of(_x((3, 4), "small")), _dts[:1], _prims)

# ---- indexing ops (details in test_indexing.py) ----------------------------------------------


def _gi(*idx):
    return lambda dt, r: [A(r, (4, 5, 6), dt), Static(idx if len(idx) != 1 else idx[0])]


def _jidx(i):
    """jax.numpy wants arrays, not lists, inside an index tuple."""
    if isinstance(i, tuple):
        return tuple(np.asarray(v) if isinstance(v, list) else v for v in i)
    return np.asarray(i) if isinstance(i, list) else i


spec(
    "getitem",
    lambda x, i: x[i],
    lambda x, i: x[_jidx(i)],
    cases_of(
        _gi(1),
        _gi(-1, slice(None, None, -2)),
        _gi(Ellipsis, None, 2),
        _gi(np.array([0, 3, -1]), slice(1, 4)),
        _gi(slice(None), [0, 2], [1, -1]),
        _gi([0, 1], slice(None), [2, 3]),
        _gi(np.array([True, False, True, True])),
        _gi(slice(5, 1, -1), 0, slice(None, None, 3)),
    ),
    SHAPE_DTYPES,
    ["gather"],
    np_ref=lambda x, i: x[i],
)
spec(
    "getitem_tensor_index",
    lambda x, i: x[:, i],
    lambda x, i: x[:, i],
    cases_of(
        lambda dt, r: [A(r, (3, 5), dt), np.array([4, 0, -2], dtype=np.int32)],
        lambda dt, r: [A(r, (3, 5), dt), np.array([[1], [2]], dtype=np.int32)],
    ),
    SHAPE_DTYPES,
    ["gather"],
)
spec(
    "take_along_axis_fill",
    lambda x, i: nx.take_along_axis(x, i, axis=1),
    lambda x, i: jnp.take_along_axis(x, i, axis=1, mode="fill"),
    cases_of(  # out-of-range indices read the fill value (one filling gather)
        lambda dt, r: [A(r, (3, 5), dt), np.array([[4], [7], [-2]], dtype=np.int32)],
        lambda dt, r: [A(r, (3, 5), dt), np.array([[0, -6, 2], [1, 1, 5], [3, 4, 0]], np.int32)],
    ),
    SHAPE_DTYPES,
    ["gather", "iota"],
)
spec(
    "take_fill_value",
    lambda x, i: nx.take(x, i, axis=0, fill_value=0),
    lambda x, i: jnp.take(x, i, axis=0, mode="fill", fill_value=0),
    cases_of(lambda dt, r: [A(r, (4, 3), dt), np.array([3, 9, -1, -5], dtype=np.int32)]),
    SHAPE_DTYPES,
    ["gather"],
)
spec(
    "getitem_bool_tensor",
    lambda x, m: x[m],
    lambda x, m: x[np.asarray(m)],
    cases_of(
        lambda dt, r: [A(r, (3, 5), dt), A(r, (3, 5), BOOL)],
        lambda dt, r: [A(r, (3, 5), dt), A(r, (3,), BOOL)],
    ),
    SHAPE_DTYPES,
    ["gather"],
    lazy=False,  # a boolean mask realizes: the result shape depends on data
)


def _upd(idx, vshape):
    return lambda dt, r: [A(r, (4, 5), dt), Static(idx), A(r, vshape, dt)]


_UPDATE_CASES = cases_of(
    _upd(1, (5,)),
    _upd((slice(None), 2), ()),
    _upd((np.array([0, 2, 0]),), (3, 5)),
    _upd((slice(1, 3), np.array([1, 1, 4])), (2, 3)),
    _upd((np.array([[0], [3]]), np.array([0, 4])), (2, 2)),
    _upd(Ellipsis, (5,)),
)
spec(
    "at.set",
    lambda x, i, v: x.at[i].set(v),
    lambda x, i, v: x.at[i].set(v),
    _UPDATE_CASES,
    SHAPE_DTYPES,
    ["scatter"],
)
spec(
    "at.add",
    lambda x, i, v: x.at[i].add(v),
    lambda x, i, v: x.at[i].add(v),
    _UPDATE_CASES,
    (F32, I32, F16, BF16),
    ["scatter"],
)
spec(
    "at.add_scalar",
    lambda x, i, v: x.at[i].add(v),
    lambda x, i, v: x.at[i].add(v),
    lambda dt, r: [Case((A(r, (5,), dt), Static(np.array([1, 1, 3])), Static(2)))],
    (F32, I32),
    ["scatter"],
)


def _setitem(x, i, v):
    x[i] = v
    return x


spec("setitem", _setitem, lambda x, i, v: x.at[i].set(v), _UPDATE_CASES, ALL, ["scatter"])

# ---- random (bit-exact with jax.random and the same key) -------------------------------------


def _key(seed):
    return jax.random.PRNGKey(seed)


spec(
    "random.key",
    nx.random.key,
    _key,
    lambda d, r: [Case((0,)), Case((42,)), Case((2**31 - 1,))],
    (U32,),
    [],
)
spec(
    "random.split",
    nx.random.split,
    jax.random.split,
    lambda d, r: [
        Case((np.asarray(_key(0)),)),
        Case((np.asarray(_key(3)), 3)),
        Case((np.asarray(_key(7)),), {"num": 1}),
    ],
    (U32,),
    ["random_split"],
)


def _rand_gen(extra):
    def gen(dt, r):
        out = []
        for i, (seed, shape, kw) in enumerate(extra(dt)):
            out.append(Case((np.asarray(_key(seed)), Static(shape)), kw, f"{seed}-{shape}", i == 0))
        return out

    return gen


spec(
    "random.normal",
    lambda k, s, **kw: nx.random.normal(k, s, **kw),
    lambda k, s, **kw: jax.random.normal(k, s, **kw),
    _rand_gen(
        lambda dt: [
            (0, (3, 4), {"dtype": Static(dt)}),
            (1, (), {"dtype": Static(dt)}),
            (2, (0, 3), {"dtype": Static(dt)}),
            (5, (1000,), {}),
        ]
    ),
    FLOATS,
    ["random_normal"],
)
spec(
    "random.uniform",
    lambda k, s, **kw: nx.random.uniform(k, s, **kw),
    lambda k, s, **kw: jax.random.uniform(k, s, **kw),
    _rand_gen(
        lambda dt: [
            (0, (3, 4), {"dtype": Static(dt)}),
            (1, (5,), {"minval": -2.0, "maxval": 3, "dtype": Static(dt)}),
            (2, (), {}),
        ]
    ),
    FLOATS,
    ["random_uniform"],
)
spec(
    "random.randint",
    lambda k, s, **kw: nx.random.randint(k, s, **kw),
    lambda k, s, low, high: jax.random.randint(k, s, low, high),
    _rand_gen(
        lambda dt: [
            (0, (3, 4), {"low": 0, "high": 10}),
            (1, (50,), {"low": -5, "high": 5}),
            (2, (), {"low": 3, "high": 4}),
        ]
    ),
    (I32,),
    ["random_randint"],
)
spec(
    "random.bernoulli",
    lambda k, s, p: nx.random.bernoulli(k, p, s),
    lambda k, s, p: jax.random.bernoulli(k, p, s),
    _rand_gen(
        lambda dt: [(0, (3, 4), {"p": 0.5}), (1, (100,), {"p": 0.1}), (2, (2, 2), {"p": 1.0})]
    ),
    (BOOL,),
    ["random_uniform", "less"],
)
spec(
    "random.split_then_normal",
    lambda k: nx.random.normal(nx.random.split(k)[1], (4,)),
    lambda k: jax.random.normal(jax.random.split(k)[1], (4,)),
    lambda d, r: [Case((np.asarray(_key(11)),))],
    (F32,),
    ["random_split", "gather", "random_normal"],
)
spec(
    "random.fold_in",
    lambda k, d: nx.random.fold_in(k, d),
    lambda k, d: jax.random.fold_in(k, d),
    lambda d, r: [Case((np.asarray(_key(0)), 5)), Case((np.asarray(_key(4)), 2**32 - 1))],
    (U32,),
    ["random_fold_in"],
)
spec(
    "random.categorical",
    lambda k, lg, **kw: nx.random.categorical(k, lg, **kw),
    lambda k, lg, **kw: jax.random.categorical(k, lg, **kw),
    lambda d, r: [
        Case((np.asarray(_key(0)), A(r, (3, 5), d)), {}, "rows", True),
        Case((np.asarray(_key(1)), A(r, (4, 2), d)), {"axis": 0, "shape": Static((3, 2))}),
    ],
    (F32, BF16),
    ["random_categorical"],
)


# Primitives that exist only inside nx.compile traces, so no eager spec can build them: each is
# checked (shape rule against its lowering, derivative, batching) by the test file named here.
STAGING_ONLY = {
    "compile_input": "tests/core/test_staging_primitives.py",
    "dimension_value": "tests/core/test_staging_primitives.py",
}


def primitives_covered() -> set:
    out: set = set()
    for s in SPECS:
        out |= s.prims
    return out


def tolerance(dtype: np.dtype, scale: float = 1.0) -> tuple[float, float]:
    rtol, atol = TOL.get(np.dtype(dtype), (0.0, 0.0))
    return rtol * scale, atol * scale


def assert_close(
    actual: np.ndarray, expected: np.ndarray, rtol: float, atol: float, what: str = ""
):
    """Compare in float64 (bfloat16 has no NumPy math); exact for ints and bools."""
    a = np.asarray(actual)
    e = np.asarray(expected)
    assert a.shape == e.shape, f"{what}: shape {a.shape} != reference {e.shape}"
    if a.dtype.kind in "biu" and e.dtype.kind in "biu":
        np.testing.assert_array_equal(a, e, err_msg=what)
        return
    a = a.astype(np.float32).astype(np.float64) if a.dtype == BF16 else a.astype(np.float64)
    e = e.astype(np.float32).astype(np.float64) if e.dtype == BF16 else e.astype(np.float64)
    np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)

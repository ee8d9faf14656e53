"""The bundled ``matmul`` kernel: ``a (..., M, K) @ b (K, N)`` with tunable block sizes.

Implementations share one config class, :class:`MatmulCfg`, whose ``impl`` chooses one:

- ``impl=None`` (the default, and what configs stored before ``impl`` existed load as) off a GPU:
  pure JAX, where an unblocked config is one XLA dot and a blocked one mirrors the GPU kernel's
  structure — a sequential grid over ``(block_m, block_n)`` output tiles, each accumulating
  ``block_k``-wide slices of the contraction in float32 — so the configs really differ in speed
  and the tuner has something to choose. On a GPU ``impl=None`` is the Pallas kernel for a blocked
  config (XLA where JAX no longer supports nablax's Pallas GPU backend, see :mod:`._impls`) and
  XLA's dot for the unblocked one.
- ``impl="xla"``: one XLA dot (cuBLAS on a GPU); the tiles are unused.
- ``impl="pallas"``: a Pallas kernel with a grid over output tiles and a loop over K (interpret
  mode off a GPU; on JAX 0.11+ GPUs ``NotImplementedError``, see :mod:`._impls`).
- ``vjp`` / ``vjp_gpu``: ``da = dy @ b.T`` and ``db = a.T @ dy`` computed by the same
  implementation, with the block sizes permuted to match each product's dims.

The GPU candidates are XLA's dot and (where supported) the Pallas tilings; the GPU heuristic is
XLA's dot, the fastest measured on an H100 (so tuning never ends slower than it).

>>> import jax.numpy as jnp
>>> a, b = jnp.ones((3, 5)), jnp.ones((5, 2))
>>> MATMUL.run(a, b, cfg=MatmulCfg(block_m=2, block_n=None, block_k=2)).tolist()
[[5.0, 5.0], [5.0, 5.0], [5.0, 5.0]]
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _caches
from ...errors import DTypeError, ShapeError, describe
from ..kernel import Kernel
from ._impls import (
    IMPLS,
    pallas_available,
    pallas_gpu_reason,
    pallas_interpret,
    pallas_params,
    platform,
)

if TYPE_CHECKING:
    from ..invocation import Invocation

API = "nablax.kernels.library.matmul"

# Tests flip this to run the Pallas kernels in interpret mode and offer them as CPU candidates
# (slow; tiny shapes only). Off a GPU an impl="pallas" config always runs in interpret mode.
INTERPRET = False

# Triton's dot needs tiles of at least 16 in every dim, and loads/stores of power-of-two sizes.
_GPU_MIN_BLOCK = 16
_GPU_DEFAULT = (128, 128, 32)


@dataclasses.dataclass(frozen=True)
class MatmulCfg:
    """Config of :class:`Matmul`: block sizes (``None`` leaves that dim untiled) and the
    implementation (module docstring).

    ``MatmulCfg()`` (all ``None``) is "unblocked": a single XLA dot. For Pallas a ``None`` field
    takes the default tile (128, 128, 32) and sizes are rounded up to powers of two. ``impl``:
    None (the platform's default), ``"xla"`` or ``"pallas"``.

    >>> MatmulCfg(block_k=64)
    MatmulCfg(block_m=None, block_n=None, block_k=64)
    >>> MatmulCfg().unblocked, MatmulCfg(impl="xla")
    (True, MatmulCfg(block_m=None, block_n=None, block_k=None, impl='xla'))
    """

    block_m: int | None = None
    block_n: int | None = None
    block_k: int | None = None
    impl: str | None = None

    def __post_init__(self) -> None:
        for f in ("block_m", "block_n", "block_k"):
            v = getattr(self, f)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
                raise ValueError(
                    f"{API}: MatmulCfg.{f} must be a positive int or None, got {v!r}. "
                    f"Fix: pass e.g. MatmulCfg({f}=128), or None to leave the dim untiled"
                )
        if self.impl is not None and (self.impl not in IMPLS or self.impl == "cudnn"):
            raise ValueError(
                f"{API}: MatmulCfg.impl must be None, 'xla' or 'pallas', got {self.impl!r}. "
                f"Fix: e.g. MatmulCfg(impl='xla'), or None for the platform's default"
            )

    def __repr__(self) -> str:  # impl=None is left out, so reprs of older configs read as before
        extra = "" if self.impl is None else f", impl={self.impl!r}"
        return (
            f"MatmulCfg(block_m={self.block_m}, block_n={self.block_n}, "
            f"block_k={self.block_k}{extra})"
        )

    @property
    def unblocked(self) -> bool:
        """True when no dim is tiled (one plain dot)."""
        return self.block_m is None and self.block_n is None and self.block_k is None


UNBLOCKED = MatmulCfg()


# -- argument checks ------------------------------------------------------------------------------
# (shapes, dtypes) -> result: the executor calls prepare on every call
_CHECKED = _caches.DictCache("kernels.matmul_checked_args", 4096)


def check_args(a: Any, b: Any) -> tuple[int, int, int]:
    """Validate the arguments (memoized by shapes and dtypes; see :func:`_check_args`)."""
    try:
        key = (tuple(a.shape), a.dtype, tuple(b.shape), b.dtype)
        hit = _CHECKED.get(key)
    except (AttributeError, TypeError):  # not array-like: let the full check explain
        return _check_args(a, b)
    if hit is None:
        hit = _check_args(a, b)
        _CHECKED.put(key, hit)
    return hit


def _check_args(a: Any, b: Any) -> tuple[int, int, int]:
    """Validate ``a (..., M, K)`` and ``b (K, N)``; return ``(M_total, K, N)`` where ``M_total``
    folds ``a``'s leading dims into M.

    >>> import jax, jax.numpy as jnp
    >>> check_args(jax.ShapeDtypeStruct((2, 3, 4), jnp.float32), jnp.zeros((4, 5)))
    (6, 4, 5)
    """
    for name, x in (("a", a), ("b", b)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(
                f"{API}: argument {name} must be an array (jax.Array, nablax Tensor or "
                f"jax.ShapeDtypeStruct), got {describe(x)}. Fix: wrap it with jnp.asarray"
            )
    sa, sb = tuple(a.shape), tuple(b.shape)
    if len(sb) != 2:
        raise ShapeError(
            f"{API}: b must be 2-D (K, N), got b={describe(b)} (a={describe(a)}). Fix: only a may "
            f"carry batch dims; for batched b use jax.vmap or jnp.matmul"
        )
    if len(sa) < 2:
        raise ShapeError(
            f"{API}: a must have shape (..., M, K) with at least 2 dims, got a={describe(a)}. "
            f"Fix: reshape a vector to (1, K) with a[None, :]"
        )
    if sa[-1] != sb[0]:
        raise ShapeError(
            f"{API}: contraction dims differ: a={describe(a)} has K={sa[-1]} in its last dim but "
            f"b={describe(b)} has K={sb[0]} in its first. Fix: transpose or reshape so that "
            f"a.shape[-1] == b.shape[0]"
        )
    da, db = np.dtype(a.dtype), np.dtype(b.dtype)
    if not (jnp.issubdtype(da, jnp.floating) and da == db):
        raise DTypeError(
            f"{API}: a and b must share one floating dtype, got a={describe(a)}, b={describe(b)}. "
            f"Fix: cast both, e.g. b.astype(a.dtype) (integer inputs: cast to float32)"
        )
    return math.prod(sa[:-1]), sa[-1], sb[1]


def acc_dtype(dtype: Any) -> np.dtype:
    """Accumulation dtype: float32, or float64 for float64 inputs.

    >>> import jax.numpy as jnp
    >>> str(acc_dtype(jnp.bfloat16))
    'float32'
    """
    return np.dtype(jnp.promote_types(dtype, jnp.float32))


# -- pure-JAX blocked implementation --------------------------------------------------------------
def _pad2(x: jax.Array, r: int, c: int) -> jax.Array:
    pr, pc = -x.shape[0] % r, -x.shape[1] % c
    return jnp.pad(x, ((0, pr), (0, pc))) if pr or pc else x


def _k_loop(a_tiles: jax.Array, b_tiles: jax.Array, acc_t: Any) -> jax.Array:
    """Sum over K tiles: ``a_tiles (kt, bm, bk)``, ``b_tiles (kt, bk, bn)`` → ``(bm, bn)``."""
    if a_tiles.shape[0] == 1:
        return lax.dot(a_tiles[0], b_tiles[0], preferred_element_type=acc_t)

    def step(acc, ab):
        return acc + lax.dot(ab[0], ab[1], preferred_element_type=acc_t), None

    acc0 = jnp.zeros((a_tiles.shape[1], b_tiles.shape[2]), acc_t)
    return lax.scan(step, acc0, (a_tiles, b_tiles))[0]


def blocked_matmul_2d(a: jax.Array, b: jax.Array, cfg: MatmulCfg) -> jax.Array:
    """``a (M, K) @ b (K, N)`` with ``cfg``'s tiling, float32 accumulation, output in a's dtype.

    >>> import jax.numpy as jnp
    >>> blocked_matmul_2d(jnp.ones((5, 7)), jnp.ones((7, 3)), MatmulCfg(2, 2, 4))[0].tolist()
    [7.0, 7.0, 7.0]
    """
    (m, k), n = a.shape, b.shape[1]
    acc_t = acc_dtype(a.dtype)
    if cfg.unblocked or 0 in (m, n, k):
        return lax.dot(a, b, preferred_element_type=acc_t).astype(a.dtype)
    bm, bn, bk = (
        min(s or d, d) for s, d in zip((cfg.block_m, cfg.block_n, cfg.block_k), (m, n, k))
    )
    a, b = _pad2(a, bm, bk), _pad2(b, bk, bn)
    mt, kt, nt = a.shape[0] // bm, a.shape[1] // bk, b.shape[1] // bn
    # Tile-major layouts, arranged once outside the loops: a4[i, kk] and b4[j, kk] are tiles.
    a4 = a.reshape(mt, bm, kt, bk).transpose(0, 2, 1, 3)
    b4 = b.reshape(kt, bk, nt, bn).transpose(2, 0, 1, 3)
    if mt * nt == 1:
        out = _k_loop(a4[0], b4[0], acc_t)[None]
    else:
        # A sequential grid over output tiles (the CPU analogue of the GPU grid): bounds the
        # live accumulator to one (bm, bn) tile.
        out = lax.map(lambda t: _k_loop(a4[t // nt], b4[t % nt], acc_t), jnp.arange(mt * nt))
    out = out.reshape(mt, nt, bm, bn).transpose(0, 2, 1, 3).reshape(mt * bm, nt * bn)
    return out[:m, :n].astype(a.dtype)


# -- Pallas (GPU) implementation -------------------------------------------------------------------
def _pow2_block(want: int | None, default: int, dim: int) -> int:
    want = default if want is None else want
    cap = max(_GPU_MIN_BLOCK, next_pow2(dim))
    return max(_GPU_MIN_BLOCK, min(next_pow2(want), cap))


def next_pow2(x: int) -> int:
    """Smallest power of two >= x (>= 1).

    >>> next_pow2(1), next_pow2(17), next_pow2(64)
    (1, 32, 64)
    """
    return 1 << max(0, int(x) - 1).bit_length()


def gpu_blocks(cfg: MatmulCfg, m: int, n: int, k: int) -> tuple[int, int, int]:
    """The power-of-two tile sizes the Pallas kernel uses for ``cfg`` on an (M, K) x (K, N).

    >>> gpu_blocks(MatmulCfg(100, None, 8), m=1000, n=20, k=512)
    (128, 32, 16)
    """
    fields = (cfg.block_m, cfg.block_n, cfg.block_k)
    return tuple(_pow2_block(f, d, s) for f, d, s in zip(fields, _GPU_DEFAULT, (m, n, k)))  # type: ignore[return-value]


def _matmul_body(a_ref, b_ref, o_ref, *, n_k: int, bk: int) -> None:
    # a_ref: (bm, Kp) row strip, b_ref: (Kp, bn) column strip; loads are (bm, bk) / (bk, bn).
    import jax.experimental.pallas as pl

    def tile(kk):
        at = a_ref[:, pl.ds(kk * bk, bk)]
        bt = b_ref[pl.ds(kk * bk, bk), :]
        return jnp.dot(at, bt, preferred_element_type=jnp.float32)

    # The first K tile starts the accumulator (no jnp.zeros constant: under an enclosing
    # jax.ensure_compile_time_eval a zeros array is folded into a constant the kernel "captures",
    # which pallas_call rejects).
    acc = tile(0)
    if n_k > 1:
        acc = lax.fori_loop(1, n_k, lambda kk, acc: acc + tile(kk), acc)
    o_ref[...] = acc.astype(o_ref.dtype)


def pallas_matmul_2d(
    a: jax.Array, b: jax.Array, cfg: MatmulCfg, *, interpret: bool | None = None
) -> jax.Array:
    """``a (M, K) @ b (K, N)`` with a tiled Pallas kernel (grid over output tiles, loop over K).

    ``interpret=True`` runs the kernel body on any backend (slow; for tests); None decides by the
    platform (interpret mode off a GPU, or with the module switch ``INTERPRET``). An unblocked
    config without ``impl="pallas"`` is XLA's dot.

    >>> import jax, jax.numpy as jnp
    >>> a, b = jnp.ones((40, 24)), jnp.ones((24, 8))
    >>> jax.eval_shape(lambda a, b: pallas_matmul_2d(a, b, MatmulCfg(16, 16, 16)), a, b).shape
    (40, 8)
    """
    import jax.experimental.pallas as pl

    (m, k), n = a.shape, b.shape[1]
    if (cfg.unblocked and cfg.impl != "pallas") or 0 in (m, n, k):
        return blocked_matmul_2d(a, b, UNBLOCKED)
    interp = pallas_interpret(platform(), INTERPRET) if interpret is None else interpret
    bm, bn, bk = gpu_blocks(cfg, m, n, k)
    a, b = _pad2(a, bm, bk), _pad2(b, bk, bn)
    (mp, kp), np_ = a.shape, b.shape[1]
    out = pl.pallas_call(
        functools.partial(_matmul_body, n_k=kp // bk, bk=bk),
        out_shape=jax.ShapeDtypeStruct((mp, np_), a.dtype),
        grid=(mp // bm, np_ // bn),
        in_specs=[
            pl.BlockSpec((bm, kp), lambda i, j: (i, 0)),
            pl.BlockSpec((kp, bn), lambda i, j: (0, j)),
        ],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j: (i, j)),
        name="nablax_matmul",
        **pallas_params(API, interp, 8 if bm * bn >= 128 * 128 else 4),
    )(a, b)
    return out[:m, :n]


# -- the kernel -----------------------------------------------------------------------------------
def _as_2d(a: jax.Array) -> jax.Array:
    return a.reshape(-1, a.shape[-1])


def _vjp_with(impl, a: jax.Array, b: jax.Array, dy: jax.Array, cfg: MatmulCfg) -> tuple:
    """``da = dy @ b.T``, ``db = a.T @ dy`` with ``cfg``'s tiles mapped onto each product's dims."""
    dy2 = _as_2d(dy).astype(a.dtype)
    # da: (M, N) @ (N, K) tiles its output cols with block_k and its contraction with block_n.
    da = impl(dy2, b.T, MatmulCfg(cfg.block_m, cfg.block_k, cfg.block_n, cfg.impl))
    # db: (K, M) @ (M, N) tiles its output rows with block_k and contracts over M with block_m.
    db = impl(_as_2d(a).T, dy2, MatmulCfg(cfg.block_k, cfg.block_n, cfg.block_m, cfg.impl))
    return da.reshape(a.shape).astype(a.dtype), db.astype(b.dtype)


def _cpu_candidates(m: int, k: int, n: int) -> list[MatmulCfg]:
    def fit(v: int | None, d: int) -> int | None:
        return None if v is None or v >= d else v  # a tile covering the dim is "untiled"

    raw = [
        (None, None, None),
        (None, None, 512),
        (None, None, 128),
        (256, None, None),
        (512, None, 256),
        (128, 128, 128),
        (256, 256, 256),
        (512, 512, None),
    ]
    out: list[MatmulCfg] = []
    for bm, bn, bk in raw:
        c = MatmulCfg(fit(bm, m), fit(bn, n), fit(bk, k))
        if c not in out:
            out.append(c)
    return out


def _pallas_candidates(m: int, k: int, n: int, count: int) -> list[MatmulCfg]:
    out: list[MatmulCfg] = []
    for bm, bn, bk in [(128, 128, 32), (64, 64, 32), (128, 64, 32), (64, 128, 32), (128, 128, 64),
                       (64, 64, 64), (32, 32, 32)]:  # fmt: skip
        c = MatmulCfg(*gpu_blocks(MatmulCfg(bm, bn, bk), m, n, k), impl="pallas")
        if c not in out and len(out) < count:
            out.append(c)
    return out


XLA_DOT = MatmulCfg(impl="xla")


def resolve_impl(cfg: MatmulCfg, plat: str) -> str:
    """The implementation ``cfg`` runs on ``plat`` (``"blocked"``: the pure-JAX path).

    >>> resolve_impl(MatmulCfg(64, 64, 64), "cpu"), resolve_impl(MatmulCfg(), "gpu")
    ('blocked', 'xla')
    """
    if cfg.impl is not None:
        return cfg.impl
    if plat != "gpu":
        return "blocked"
    if cfg.unblocked:
        return "xla"
    return "pallas" if INTERPRET or pallas_gpu_reason() is None else "xla"


def _xla_2d(a: jax.Array, b: jax.Array, cfg: MatmulCfg) -> jax.Array:
    return blocked_matmul_2d(a, b, UNBLOCKED)


_IMPLS = {"blocked": blocked_matmul_2d, "xla": _xla_2d, "pallas": pallas_matmul_2d}


class Matmul(Kernel[MatmulCfg, jax.Array]):
    """``a (..., M, K) @ b (K, N)`` → ``(..., M, N)`` in ``a``'s dtype (float32 accumulation).

    >>> import jax.numpy as jnp
    >>> k = Matmul("matmul")
    >>> a, b = jnp.arange(6.0).reshape(2, 3), jnp.ones((3, 2))
    >>> k.run(a, b, cfg=MatmulCfg(block_k=2)).tolist()
    [[3.0, 3.0], [12.0, 12.0]]
    """

    def prepare(self, *args: Any, **kw: Any) -> tuple[tuple, dict]:
        """Check the shapes and dtypes before a config is chosen (clear errors early)."""
        if len(args) != 2 or kw:
            raise TypeError(
                f"{API}: takes exactly two arrays (a, b) and no keyword options besides cfg, got "
                f"{len(args)} positional and keywords {sorted(kw)}. Fix: call matmul(a, b)"
            )
        check_args(*args)
        return args, kw

    def _run(self, a, b, cfg: MatmulCfg | None, plat: str) -> jax.Array:
        check_args(a, b)
        cfg = cfg or UNBLOCKED
        out = _IMPLS[resolve_impl(cfg, plat)](_as_2d(a), b, cfg)
        return out.reshape(*a.shape[:-1], b.shape[1])

    def run(self, a: jax.Array, b: jax.Array, *, cfg: MatmulCfg | None = None) -> jax.Array:
        """The config's implementation; ``impl=None`` off a GPU is the pure-JAX blocked matmul
        (see :func:`blocked_matmul_2d`); jit-traceable."""
        return self._run(a, b, cfg, _plat_of_run())

    def run_gpu(self, a: jax.Array, b: jax.Array, *, cfg: MatmulCfg | None = None) -> jax.Array:
        """As ``run`` on a GPU: ``impl=None`` is the Pallas kernel for a blocked config (module
        switch ``INTERPRET`` runs it in interpret mode) and XLA's dot for the unblocked one."""
        return self._run(a, b, cfg, "gpu")

    def heuristic_cfg(self, inv: Invocation) -> MatmulCfg:
        """On CPU XLA's own dot (Eigen, already cache-blocked) wins at every size we measured."""
        check_args(*inv.args)
        return UNBLOCKED

    def heuristic_cfg_gpu(self, inv: Invocation) -> MatmulCfg:
        """XLA's dot (cuBLAS): on an H100 it ran 4096^3 bfloat16 at 394.8 TFLOP/s against 137
        for a tiled Pallas config, so tuning starts from it and keeps it unless beaten."""
        check_args(*inv.args)
        return XLA_DOT

    def candidate_cfgs(self, inv: Invocation) -> list[MatmulCfg]:
        """Up to 8 configs, always including the unblocked one (so tuning never loses to XLA);
        with the ``INTERPRET`` switch also two Pallas tilings (interpret mode)."""
        m, k, n = check_args(*inv.args)
        extra = _pallas_candidates(m, k, n, 2) if INTERPRET else []
        return _cpu_candidates(m, k, n) + extra

    def candidate_cfgs_gpu(self, inv: Invocation) -> list[MatmulCfg]:
        """XLA's dot (cuBLAS) plus up to 7 Pallas tilings where JAX supports nablax's Pallas GPU
        backend (see :mod:`._impls`)."""
        m, k, n = check_args(*inv.args)
        tiles = _pallas_candidates(m, k, n, 7) if pallas_available("gpu", INTERPRET) else []
        return [XLA_DOT, *tiles]

    def fwd_with_residuals(self, a, b, *, cfg: MatmulCfg | None = None) -> tuple[jax.Array, None]:
        """The output; no residuals (the backward pass needs only ``a`` and ``b``)."""
        return self.run(a, b, cfg=cfg), None

    def fwd_with_residuals_gpu(self, a, b, *, cfg: MatmulCfg | None = None) -> tuple:
        """As ``fwd_with_residuals`` on a GPU."""
        return self.run_gpu(a, b, cfg=cfg), None

    def vjp(self, res: Any, y: Any, dy: jax.Array, a, b, *, cfg: MatmulCfg | None = None) -> tuple:
        """``(da, db)``: ``dy @ b.T`` and ``a.T @ dy`` (summed over a's batch dims) by the
        config's implementation."""
        check_args(a, b)
        cfg = cfg or UNBLOCKED
        return _vjp_with(_IMPLS[resolve_impl(cfg, _plat_of_run())], a, b, dy, cfg)

    def vjp_gpu(self, res: Any, y: Any, dy: jax.Array, a, b, *, cfg: MatmulCfg | None = None):
        """As ``vjp`` on a GPU (``impl=None``: the Pallas kernel for both products)."""
        check_args(a, b)
        cfg = cfg or UNBLOCKED
        return _vjp_with(_IMPLS[resolve_impl(cfg, "gpu")], a, b, dy, cfg)


def _plat_of_run() -> str:
    plat = platform()
    return "cpu" if plat == "gpu" else plat


def matmul_reference(a: jax.Array, b: jax.Array) -> jax.Array:
    """Plain ``a @ b`` with float32 accumulation, the ground truth for tests.

    >>> import jax.numpy as jnp
    >>> matmul_reference(jnp.eye(2), jnp.full((2, 3), 2.0)).shape
    (2, 3)
    """
    check_args(a, b)
    return jnp.matmul(a, b, preferred_element_type=acc_dtype(a.dtype)).astype(a.dtype)


MATMUL = Matmul("matmul")

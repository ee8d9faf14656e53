"""The bundled ``attention`` kernel: scaled dot-product attention with the implementation chosen by
its config.

Layout ``(batch, seq, heads, head_dim)`` for ``q``, ``k`` and ``v``; ``k``/``v`` may have another
sequence length than ``q`` (and ``v`` another head_dim). :class:`AttentionCfg` picks the
implementation and its tiles: the blocked pure-JAX path (:mod:`.attention_blocked`, ``impl=None``
off a GPU), nablax's Pallas flash kernels, forward and backward (:mod:`.attention_pallas`,
``"pallas"``), XLA's whole-matrix fusion or cuDNN (:mod:`.attention_xla`, ``"xla"``/``"cudnn"``).
The blocked and Pallas paths compute one ``(block_q, block_kv)`` tile of scores at a time with an
online softmax (float32 accumulation), so the ``seq_q x seq_kv`` score matrix never exists —
neither in the forward pass nor in the residuals, which are only ``(out, logsumexp)``; their
backward passes recompute scores blockwise (flash-attention backward: ``D = rowsum(dO * O)``,
``dS = P * (dP - D)``). The tuner's candidates are every implementation available on the
platform (see :mod:`._impls`).

**Causal alignment.** With ``causal=True`` query ``i`` attends to keys ``j <= i``: queries and keys
are aligned at the *start* (top-left), as ``jax.nn.dot_product_attention(is_causal=True)`` does.
When ``seq_q > seq_kv`` the queries past ``seq_kv`` see every key; when ``seq_q < seq_kv`` the last
keys are seen by no query. Every query sees key 0, so no row is ever fully masked.

>>> import jax.numpy as jnp
>>> q = k = v = jnp.ones((1, 5, 2, 4))
>>> ATTENTION.run(q, k, v, cfg=AttentionCfg(block_q=2, block_kv=2), causal=True).shape
(1, 5, 2, 4)
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np

from ... import _caches
from ...errors import DTypeError, ShapeError, describe
from ..kernel import Kernel
from . import attention_ext as ext_mod
from ._impls import (
    IMPLS,
    cudnn_reason,
    pallas_available,
    pallas_gpu_reason,
    pallas_interpret,
    platform,
    xla_max_scores,
)
from .attention_blocked import blocked_backward, blocked_forward
from .attention_ext import resolve_scale
from .attention_pallas import gpu_blocks as _pow2_blocks
from .attention_pallas import pallas_backward
from .attention_pallas import pallas_forward as _pallas_forward
from .attention_xla import cudnn_backward, cudnn_forward, xla_backward, xla_forward
from .matmul import acc_dtype

if TYPE_CHECKING:
    from ..invocation import Invocation

API = "nablax.kernels.library.attention"

# Tests flip this to run the Pallas kernels in interpret mode and offer them as CPU candidates
# (slow; tiny shapes only). Off a GPU an impl="pallas" config always runs in interpret mode.
INTERPRET = False


@dataclasses.dataclass(frozen=True)
class AttentionCfg:
    """Config of :class:`Attention`: the implementation and its tiles, ``block_q`` queries x
    ``block_kv`` keys per step.

    ``impl``: ``"pallas"`` (nablax's flash kernels, forward and backward; interpret mode on a CPU),
    ``"xla"`` (the whole score matrix in plain JAX, XLA's fusion; tiles unused), ``"cudnn"``
    (``jax.nn.dot_product_attention``'s cuDNN path, NVIDIA GPUs; tiles unused), or None (the
    default, and what configs stored before ``impl`` existed load as): the platform's own choice,
    the blocked pure-JAX path with these tiles on a CPU or TPU and the Pallas kernels on a GPU
    (XLA where JAX no longer supports nablax's Pallas GPU backend). Blocks larger than a sequence
    act as the whole sequence; Pallas rounds them up to powers of two (at least 16).

    >>> AttentionCfg(block_q=64, block_kv=128)
    AttentionCfg(block_q=64, block_kv=128)
    >>> AttentionCfg(impl="xla")
    AttentionCfg(block_q=128, block_kv=128, impl='xla')
    """

    block_q: int = 128
    block_kv: int = 128
    impl: str | None = None

    def __post_init__(self) -> None:
        for f in ("block_q", "block_kv"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(
                    f"{API}: AttentionCfg.{f} must be a positive int, got {v!r}. "
                    f"Fix: pass e.g. AttentionCfg(block_q=64, block_kv=64)"
                )
        if self.impl is not None and self.impl not in IMPLS:
            raise ValueError(
                f"{API}: AttentionCfg.impl must be None or one of {IMPLS}, got {self.impl!r}. "
                f"Fix: e.g. AttentionCfg(impl='xla'), or None for the platform's default"
            )

    def __repr__(self) -> str:  # impl=None is left out, so reprs of older configs read as before
        extra = "" if self.impl is None else f", impl={self.impl!r}"
        return f"AttentionCfg(block_q={self.block_q}, block_kv={self.block_kv}{extra})"


# -- argument checks ------------------------------------------------------------------------------
# (shapes, dtypes) -> result: the executor calls prepare on every call
_CHECKED = _caches.DictCache("kernels.attention_checked_args", 4096)


def check_args(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int, int]:
    """Validate the arguments (memoized by shapes and dtypes; see :func:`_check_args`)."""
    try:
        key = (tuple(q.shape), q.dtype, tuple(k.shape), k.dtype, tuple(v.shape), v.dtype)
        hit = _CHECKED.get(key)
    except (AttributeError, TypeError):  # not array-like: let the full check explain
        return _check_args(q, k, v)
    if hit is None:
        hit = _check_args(q, k, v)
        _CHECKED.put(key, hit)
    return hit


def _check_args(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int, int]:
    """Validate the layout; return ``(batch, seq_q, seq_kv, heads, head_dim, v_head_dim)``.

    >>> import jax.numpy as jnp
    >>> check_args(jnp.zeros((2, 5, 3, 8)), jnp.zeros((2, 7, 3, 8)), jnp.zeros((2, 7, 3, 4)))
    (2, 5, 7, 3, 8, 4)
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(
                f"{API}: argument {name} must be an array (jax.Array, nablax Tensor or "
                f"jax.ShapeDtypeStruct), got {describe(x)}. Fix: wrap it with jnp.asarray"
            )
    seen = f"q={describe(q)}, k={describe(k)}, v={describe(v)}"
    if not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
        raise ShapeError(
            f"{API}: q, k, v must be 4-D (batch, seq, heads, head_dim), got {seen}. "
            f"Fix: add a batch or heads axis, e.g. x[None] or x[:, :, None, :]"
        )
    (b, sq, h, d), (bk, skv, hk, dk), (bv, sv, hv, _) = q.shape, k.shape, v.shape
    if not (b == bk == bv and h == hk == hv and skv == sv and d == dk):
        raise ShapeError(
            f"{API}: shapes disagree, got {seen}; q and k need equal (batch, heads, head_dim), "
            f"k and v equal (batch, seq, heads). Fix: transpose to (batch, seq, heads, head_dim) "
            f"(for grouped-query attention k/v's head count must divide q's)"
        )
    if min(sq, skv, d) < 1:
        raise ShapeError(f"{API}: seq and head_dim must be at least 1, got {seen}")
    dts = {np.dtype(x.dtype) for x in (q, k, v)}
    if len(dts) != 1 or not jnp.issubdtype(next(iter(dts)), jnp.floating):
        raise DTypeError(
            f"{API}: q, k, v must share one floating dtype, got {seen}. "
            f"Fix: cast them, e.g. k.astype(q.dtype)"
        )
    return b, sq, skv, h, d, v.shape[3]


# -- implementations -------------------------------------------------------------------------------
def gpu_blocks(cfg: AttentionCfg, sq: int, skv: int) -> tuple[int, int]:
    """Power-of-two tiles (>= 16, <= the padded sequence) the Pallas kernels use for ``cfg``.

    >>> gpu_blocks(AttentionCfg(100, 128), sq=1000, skv=40)
    (128, 64)
    """
    return _pow2_blocks(cfg.block_q, cfg.block_kv, sq, skv)


def pallas_forward(q, k, v, *, scale: float, causal: bool, cfg: AttentionCfg, interpret=None):
    """``(out, lse)`` like :func:`blocked_forward`, from the Pallas forward kernel (see
    :mod:`.attention_pallas`). ``interpret``: None decides by the platform (interpret mode off a
    GPU, or with the module switch ``INTERPRET``).

    >>> import jax, jax.numpy as jnp
    >>> q = jnp.ones((1, 20, 2, 8))
    >>> f = lambda q: pallas_forward(q, q, q, scale=0.3, causal=True, cfg=AttentionCfg(16, 16))
    >>> [x.shape for x in jax.eval_shape(f, q)]
    [(1, 20, 2, 8), (1, 2, 20)]
    """
    check_args(q, k, v)
    interp = pallas_interpret(platform(), INTERPRET) if interpret is None else interpret
    blocks = (cfg.block_q, cfg.block_kv)
    return _pallas_forward(q, k, v, scale=scale, causal=causal, blocks=blocks, interpret=interp)


def pallas_vjp(q, k, v, out, lse, dout, *, scale: float, causal: bool, cfg: AttentionCfg):
    """``(dq, dk, dv)`` from the Pallas flash-attention backward kernels (see
    :func:`.attention_pallas.pallas_backward`)."""
    interp = pallas_interpret(platform(), INTERPRET)
    return pallas_backward(
        q, k, v, out, lse, dout, scale=scale, causal=causal, blocks=(cfg.block_q, cfg.block_kv),
        interpret=interp,
    )  # fmt: skip


# impl -> (forward -> (out, lse), backward -> (dq, dk, dv)); "blocked" is impl=None off a GPU.
_CORES = {
    "blocked": (blocked_forward, blocked_backward),
    "pallas": (pallas_forward, pallas_vjp),
    "xla": (xla_forward, xla_backward),
    "cudnn": (cudnn_forward, cudnn_backward),
}


def resolve_impl(cfg: AttentionCfg, plat: str) -> str:
    """The implementation ``cfg`` runs on ``plat``: its ``impl``, or for None the blocked JAX path
    off a GPU and on a GPU the Pallas kernels (XLA where nablax's Pallas GPU backend is not
    supported by this JAX, see :mod:`._impls`).

    >>> resolve_impl(AttentionCfg(), "cpu"), resolve_impl(AttentionCfg(impl="xla"), "gpu")
    ('blocked', 'xla')
    """
    if cfg.impl is not None:
        return cfg.impl
    if plat != "gpu":
        return "blocked"
    return "pallas" if INTERPRET or pallas_gpu_reason() is None else "xla"


def _grouped(q, k, v) -> bool:
    """Plain-layout q, k, v whose k/v head counts differ from q's and divide it."""
    try:
        if not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
            return False
        h, hk, hv = q.shape[2], k.shape[2], v.shape[2]
    except (AttributeError, TypeError):
        return False
    return (hk != h or hv != h) and min(hk, hv) > 0 and h % hk == 0 and h % hv == 0


# -- candidates ------------------------------------------------------------------------------------
def _clip_cfg(bq: int, bkv: int, sq: int, skv: int, impl: str | None = None) -> AttentionCfg:
    return AttentionCfg(min(bq, sq), min(bkv, skv), impl)


def _cpu_candidates(sq: int, skv: int) -> list[AttentionCfg]:
    raw = [(64, 64), (64, 128), (128, 128), (128, 256), (256, 128), (256, 256), (256, 512)]
    out: list[AttentionCfg] = []
    for bq, bkv in [*raw, (512, 512)]:
        c = _clip_cfg(bq, bkv, sq, skv)
        if c not in out:
            out.append(c)
    return out


def _pallas_tiles(sq: int, skv: int, n: int, impl: str | None) -> list[AttentionCfg]:
    raw = [(128, 64), (64, 64), (128, 128), (64, 32), (32, 32), (64, 128), (128, 32), (32, 64)]
    out: list[AttentionCfg] = []
    for bq, bkv in raw:
        c = AttentionCfg(*_pow2_blocks(bq, bkv, sq, skv), impl=impl)
        if c not in out and len(out) < n:
            out.append(c)
    return out


class _Call:
    """What the candidates and heuristics of one invocation depend on."""

    def __init__(self, inv: Invocation) -> None:
        self.sq, self.skv = ext_mod.seq_lens(inv.args, inv.kwargs)
        self.causal = bool(inv.kwargs.get("causal", False))
        # masks, bias and dropout always take the blocked path: only the tiles matter then
        self.blocked_only = any(k in inv.kwargs for k in ("mask", "bias", "dropout_key"))
        q, k, v = inv.args
        lead = int(np.prod(q.shape[:-2])) if inv.kwargs.get("layout") == "bhsd" else None
        heads = q.shape[0] * q.shape[2] if lead is None else lead
        self.scores = heads * self.sq * self.skv
        shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
        plain = not inv.kwargs.get("layout") and not _grouped(q, k, v)
        self.cudnn_ok = plain and cudnn_reason(*shapes, q.dtype, platform()) is None

    def library(self, gpu: bool) -> list[AttentionCfg]:
        """The xla and cudnn configs this call may use (tiles unused; sized for the tests'
        per-platform rules)."""
        if self.blocked_only:
            return []
        if gpu:
            mk = lambda impl: AttentionCfg(*_pow2_blocks(128, 64, self.sq, self.skv), impl=impl)  # noqa: E731
        else:
            mk = lambda impl: _clip_cfg(128, 128, self.sq, self.skv, impl)  # noqa: E731
        out = [mk("xla")] if self.scores <= xla_max_scores("gpu" if gpu else "cpu") else []
        return out + ([mk("cudnn")] if gpu and self.cudnn_ok else [])


class Attention(Kernel[AttentionCfg, jax.Array]):
    """``softmax(q k^T * scale + mask) v`` in layout ``(batch, seq, heads, head_dim)``.

    Keyword options: ``causal`` (bool, start-aligned, see the module docstring) and ``scale``
    (Python float, default ``1/sqrt(head_dim)``); and ``mask``, ``bias``, ``dropout_rate``,
    ``dropout_key``, ``layout`` and grouped-query heads (see :mod:`.attention_ext`). A call with
    a mask, bias or dropout takes the blocked JAX path on every platform, whatever the config's
    ``impl``; grouped heads and the ``"bhsd"`` layout run the config's implementation.

    The config chooses the implementation (:class:`AttentionCfg`): the candidates on a platform
    are every available implementation with its tiles, and a call that needs a gradient (under
    ``jax.grad``) is tuned on forward plus backward (``tune_grad``).

    >>> import jax.numpy as jnp
    >>> k = Attention("attention")
    >>> q = jnp.ones((1, 3, 1, 2))
    >>> k.run(q, q, q, cfg=AttentionCfg(block_q=2, block_kv=2)).shape
    (1, 3, 1, 2)
    >>> k.run(q, q, q, mask=jnp.tril(jnp.ones((3, 3), bool))).shape
    (1, 3, 1, 2)
    >>> k.run(q, q, q, cfg=AttentionCfg(impl="xla")).shape
    (1, 3, 1, 2)
    """

    tune_grad = True  # the tuner times forward plus backward for calls that need a gradient

    def prepare(self, *args: Any, **kw: Any) -> tuple[tuple, dict]:
        """Check the layout and options before a config is chosen (clear errors early); options
        left at their defaults are dropped, so plain calls keep their call keys."""
        extra = set(kw) - {"causal", "scale", *ext_mod.DEFAULTS}
        if len(args) != 3 or extra:
            raise TypeError(
                f"{API}: takes (q, k, v) and the keywords causal, scale, mask, bias, "
                f"dropout_rate, dropout_key, layout, cfg; got {len(args)} positional and unknown "
                f"keywords {sorted(extra)}. Fix: attention(q, k, v, causal=True)"
            )
        base, ext = ext_mod.split_options(kw)
        if ext or _grouped(*args):
            ext, _, _, d = ext_mod.check_options(*args, ext)
        else:
            d = check_args(*args)[4]
        kw = {**base, **ext}
        if kw.get("scale") is not None:
            # A concrete numpy/jax scalar becomes a float here, so it stays a static option.
            kw["scale"] = resolve_scale(kw["scale"], d)
        if "causal" in kw:
            kw["causal"] = bool(kw["causal"])
        return args, kw

    @staticmethod
    def _extra(q, k, v, kw: dict) -> dict:
        """The call's non-default extra options; ``{"layout": "bshd"}`` for grouped heads alone
        (a truthy dict sends the call down the general path)."""
        ext = ext_mod.split_options(kw)[1]
        if not ext and _grouped(q, k, v):
            ext = {"layout": "bshd"}
        return ext

    def _setup(self, q, k, v, cfg, causal, kw, plat):
        """``(ext, cfg, (forward, backward))`` of a call on ``plat``."""
        ext = self._extra(q, k, v, kw)
        if ext:
            sq, skv = ext_mod.seq_lens((q, k), ext)
        else:
            sq, skv = check_args(q, k, v)[1:3]
        cfg = cfg or self._heuristic(sq, skv, bool(causal))
        return ext, cfg, _CORES[resolve_impl(cfg, plat)]

    def _forward(self, q, k, v, cfg, causal, scale, kw, plat):
        """``(out, lse)`` (``lse`` None for cuDNN) of the call's implementation."""
        ext, cfg, (fwd, _) = self._setup(q, k, v, cfg, causal, kw, plat)
        if ext:
            return ext_mod.general_forward(
                q, k, v, core_fn=fwd, blocked_fn=blocked_forward, cfg=cfg, causal=bool(causal),
                scale=scale, **ext,
            )  # fmt: skip
        d = check_args(q, k, v)[4]
        return fwd(q, k, v, scale=resolve_scale(scale, d), causal=bool(causal), cfg=cfg)

    def _vjp(self, res, y, dy, q, k, v, cfg, causal, scale, kw, plat) -> tuple:
        ext, cfg, core = self._setup(q, k, v, cfg, causal, kw, plat)
        if ext:
            return ext_mod.general_vjp(
                res, y, dy, q, k, v, fns=(blocked_forward, blocked_backward), core=core,
                cfg=cfg, causal=bool(causal), scale=scale, **ext,
            )  # fmt: skip
        opts = dict(scale=resolve_scale(scale, check_args(q, k, v)[4]), causal=bool(causal))
        out, lse = res if res is not None else core[0](q, k, v, cfg=cfg, **opts)
        return core[1](q, k, v, out, lse, dy, cfg=cfg, **opts)

    def run(self, q, k, v, *, cfg: AttentionCfg | None = None, causal=False, scale=None, **kw):
        """The config's implementation (off a GPU, ``impl=None`` is the blockwise pure-JAX
        forward, :func:`blocked_forward`); jit-traceable."""
        return self._forward(q, k, v, cfg, causal, scale, kw, platform_of_run())[0]

    def run_gpu(self, q, k, v, *, cfg: AttentionCfg | None = None, causal=False, scale=None, **kw):
        """As ``run`` on a GPU: ``impl=None`` is the Pallas forward kernel (module switch
        ``INTERPRET`` runs it in interpret mode)."""
        return self._forward(q, k, v, cfg, causal, scale, kw, "gpu")[0]

    def fwd_with_residuals(self, q, k, v, *, cfg=None, causal=False, scale=None, **kw):
        """``(out, (out, lse))``; ``lse`` is ``(batch, heads, seq_q)`` float32 (no score matrix;
        None for cuDNN). With extra options the residual is ``lse`` alone."""
        return self._residuals(q, k, v, cfg, causal, scale, kw, platform_of_run())

    def fwd_with_residuals_gpu(self, q, k, v, *, cfg=None, causal=False, scale=None, **kw):
        """As ``fwd_with_residuals`` on a GPU (``impl=None``: the Pallas forward)."""
        return self._residuals(q, k, v, cfg, causal, scale, kw, "gpu")

    def _residuals(self, q, k, v, cfg, causal, scale, kw, plat):
        out, lse = self._forward(q, k, v, cfg, causal, scale, kw, plat)
        return (out, lse) if self._extra(q, k, v, kw) else (out, (out, lse))

    def vjp(self, res, y, dy, q, k, v, *, cfg=None, causal=False, scale=None, **kw) -> tuple:
        """``(dq, dk, dv)`` by the implementation's backward from ``res=(out, lse)`` (with a
        ``bias``, also ``{"bias": dbias}``); ``impl=None``: the blockwise JAX backward."""
        return self._vjp(res, y, dy, q, k, v, cfg, causal, scale, kw, platform_of_run())

    def vjp_gpu(self, res, y, dy, q, k, v, *, cfg=None, causal=False, scale=None, **kw) -> tuple:
        """As ``vjp`` on a GPU: ``impl=None`` is the Pallas flash-attention backward."""
        return self._vjp(res, y, dy, q, k, v, cfg, causal, scale, kw, "gpu")

    @staticmethod
    def _heuristic(sq: int, skv: int, causal: bool) -> AttentionCfg:
        # CPU: few, large tiles amortize the per-step loop cost; causal prefers 128 x 128 so
        # that more tiles above the diagonal are skipped (measured on 512..1024 sequences).
        return _clip_cfg(128, 128, sq, skv) if causal else _clip_cfg(256, 512, sq, skv)

    def heuristic_cfg(self, inv: Invocation) -> AttentionCfg:
        """Tiles of 256 x 512 (causal: 128 x 128) clipped to the sequences, blocked JAX path."""
        c = _Call(inv)
        return self._heuristic(c.sq, c.skv, c.causal)

    def heuristic_cfg_gpu(self, inv: Invocation) -> AttentionCfg:
        """cuDNN where it takes the call (the fastest measured on an H100), else the Pallas
        kernels with 128 x 64 tiles (the usual flash-attention start), else XLA."""
        c = _Call(inv)
        tiles = _pow2_blocks(128, 64, c.sq, c.skv)
        if c.blocked_only:
            return AttentionCfg(*tiles)
        if c.cudnn_ok:
            return AttentionCfg(*tiles, impl="cudnn")
        if pallas_available("gpu", INTERPRET):
            return AttentionCfg(*tiles, impl="pallas")
        return AttentionCfg(*tiles, impl="xla")

    def candidate_cfgs(self, inv: Invocation) -> list[AttentionCfg]:
        """Up to 8 tile pairs from 64..512 for the blocked path, clipped to the sequences, and
        XLA's whole-matrix path (when the score matrix is at most ``_impls.xla_max_scores``); with the
        ``INTERPRET`` switch also Pallas tiles (interpret mode)."""
        self.prepare(*inv.args, **inv.kwargs)  # clear errors (memoized checks)
        c = _Call(inv)
        out = _cpu_candidates(c.sq, c.skv) + c.library(gpu=False)
        if INTERPRET and not c.blocked_only:
            out += _pallas_tiles(c.sq, c.skv, 2, "pallas")
        return out

    def candidate_cfgs_gpu(self, inv: Invocation) -> list[AttentionCfg]:
        """Every available implementation: up to 6 power-of-two Pallas tile pairs (when JAX
        supports nablax's Pallas GPU backend), XLA and cuDNN; with the heuristic's config."""
        self.prepare(*inv.args, **inv.kwargs)
        c = _Call(inv)
        if c.blocked_only:
            return _pallas_tiles(c.sq, c.skv, 8, None)
        out = _pallas_tiles(c.sq, c.skv, 6, "pallas") if pallas_available("gpu", INTERPRET) else []
        out += c.library(gpu=True)
        return out or [AttentionCfg(*_pow2_blocks(128, 64, c.sq, c.skv), impl="xla")]


def platform_of_run() -> str:
    """The platform ``run`` serves: the default backend's, except that a GPU is served by
    ``run_gpu`` (so ``run`` called directly on a GPU machine keeps the blocked default)."""
    plat = platform()
    return "cpu" if plat == "gpu" else plat


def attention_reference(q, k, v, *, causal: bool = False, scale: float | None = None):
    """Plain ``softmax(q k^T * scale + mask) v`` (the whole score matrix), for tests.

    >>> import jax.numpy as jnp
    >>> q = jnp.ones((1, 2, 1, 4))
    >>> attention_reference(q, q, q, causal=True).shape
    (1, 2, 1, 4)
    """
    _, sq, skv, _, d, _ = check_args(q, k, v)
    ct = acc_dtype(q.dtype)
    s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(ct), k.astype(ct)) * resolve_scale(scale, d)
    if causal:
        s = jnp.where(jnp.tril(jnp.ones((sq, skv), bool)), s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(ct)).astype(q.dtype)


ATTENTION = Attention("attention")

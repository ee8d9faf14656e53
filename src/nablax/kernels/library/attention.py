"""The bundled ``attention`` kernel: blockwise (flash-style) scaled dot-product attention.

Layout ``(batch, seq, heads, head_dim)`` for ``q``, ``k`` and ``v``; ``k``/``v`` may have another
sequence length than ``q`` (and ``v`` another head_dim). ``softmax(q k^T * scale + mask) v`` is
computed one ``(block_q, block_kv)`` tile of scores at a time with an online softmax (running max,
running sum, float32 accumulation), so the ``seq_q x seq_kv`` score matrix never exists — neither
in the forward pass nor in the residuals, which are only ``(out, logsumexp)``. The backward pass
recomputes scores blockwise (flash-attention backward: ``D = rowsum(dO * O)``,
``dS = P * (dP - D)``).

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
import functools
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ...errors import DTypeError, ShapeError, describe
from ..kernel import Kernel
from . import attention_ext as ext_mod
from .attention_ext import Extras, resolve_scale
from .matmul import acc_dtype, next_pow2

if TYPE_CHECKING:
    from ..invocation import Invocation

API = "nablax.kernels.library.attention"

# Tests flip this to run the Pallas kernel on CPU in interpret mode (slow; tiny shapes only).
INTERPRET = False

# Finite stand-in for -inf in masked scores: exp(NEG - m) is 0 without inf - inf = nan.
_NEG = -1e30
_BLOCKS = (32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class AttentionCfg:
    """Tile sizes of :class:`Attention`: ``block_q`` queries x ``block_kv`` keys per step.

    Blocks larger than a sequence act as the whole sequence. On GPU they are rounded up to powers
    of two (at least 16).

    >>> AttentionCfg(block_q=64, block_kv=128)
    AttentionCfg(block_q=64, block_kv=128)
    """

    block_q: int = 128
    block_kv: int = 128

    def __post_init__(self) -> None:
        for f in ("block_q", "block_kv"):
            v = getattr(self, f)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(
                    f"{API}: AttentionCfg.{f} must be a positive int, got {v!r}. "
                    f"Fix: pass e.g. AttentionCfg(block_q=64, block_kv=64)"
                )


# -- argument checks ------------------------------------------------------------------------------
_CHECKED: dict = {}  # (shapes, dtypes) -> result: the executor calls prepare on every call


def check_args(q: Any, k: Any, v: Any) -> tuple[int, int, int, int, int, int]:
    """Validate the arguments (memoized by shapes and dtypes; see :func:`_check_args`)."""
    try:
        key = (tuple(q.shape), q.dtype, tuple(k.shape), k.dtype, tuple(v.shape), v.dtype)
        hit = _CHECKED.get(key)
    except (AttributeError, TypeError):  # not array-like: let the full check explain
        return _check_args(q, k, v)
    if hit is None:
        hit = _check_args(q, k, v)
        if len(_CHECKED) > 4096:
            _CHECKED.clear()
        _CHECKED[key] = hit
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


# -- blocked layouts ------------------------------------------------------------------------------
def to_blocks(x: jax.Array, blk: int, fill: float = 0.0) -> jax.Array:
    """``(B, S, H, D)`` → ``(S/blk, B, H, blk, D)``, padding S up to a multiple of ``blk``.

    >>> import jax.numpy as jnp
    >>> to_blocks(jnp.ones((2, 5, 3, 4)), 2).shape
    (3, 2, 3, 2, 4)
    """
    b, s, h, d = x.shape
    t = -(-s // blk)
    x = jnp.pad(x, ((0, 0), (0, t * blk - s), (0, 0), (0, 0)), constant_values=fill)
    return x.reshape(b, t, blk, h, d).transpose(1, 0, 3, 2, 4)


def from_blocks(x: jax.Array, s: int) -> jax.Array:
    """Inverse of :func:`to_blocks`, dropping the padding.

    >>> import jax.numpy as jnp
    >>> x = jnp.arange(30.0).reshape(1, 5, 2, 3)
    >>> bool((from_blocks(to_blocks(x, 2), 5) == x).all())
    True
    """
    t, b, h, blk, d = x.shape
    return x.transpose(1, 0, 3, 2, 4).reshape(b, t * blk, h, d)[:, :s]


def _visible(i, j, bq: int, bkv: int, skv: int, causal: bool) -> jax.Array:
    """``(bq, bkv)`` mask of tile (i, j): real keys, and keys ``<= query`` when causal."""
    qi = i * bq + jnp.arange(bq)[:, None]
    kj = j * bkv + jnp.arange(bkv)[None, :]
    mask = kj < skv
    return mask & (kj <= qi) if causal else mask


def _tile_needed(i, j, bq: int, bkv: int, causal: bool):
    """False for tiles wholly above the causal diagonal (skipped, not computed)."""
    return j * bkv <= i * bq + bq - 1 if causal else True


def _maybe(pred, fn, carry):
    """``fn(carry)`` where ``pred`` holds, else ``carry`` (a static True skips the cond)."""
    return fn(carry) if pred is True else lax.cond(pred, fn, lambda c: c, carry)


# -- pure-JAX forward -----------------------------------------------------------------------------
def _fwd_q_block(i, qb, kb, vb, *, scale, causal, bq, bkv, skv, ext=None):
    """Online softmax over kv tiles for q tile ``i``: ``qb (B,H,bq,D)``, ``kb/vb (T,B,H,bkv,.)``.
    ``ext``: mask, bias and dropout (:class:`~.attention_ext.Extras`) or None."""

    def step(carry, j):
        def update(c):
            m, den, acc = c
            s = jnp.einsum("bhqd,bhkd->bhqk", qb, kb[j]) * scale
            mask = _visible(i, j, bq, bkv, skv, causal)
            if ext is not None:
                s, mask = ext.scores(s, mask, i, j)
            s = jnp.where(mask, s, _NEG)
            m_new = jnp.maximum(m, s.max(-1))
            p = jnp.where(mask, jnp.exp(s - m_new[..., None]), 0.0)
            corr = jnp.exp(m - m_new)
            z = None if ext is None else ext.dropout(i, j, *qb.shape[:2], p.dtype)
            pv = p if z is None else p * z
            acc = acc * corr[..., None] + jnp.einsum("bhqk,bhkd->bhqd", pv, vb[j])
            return m_new, den * corr + p.sum(-1), acc

        return _maybe(_tile_needed(i, j, bq, bkv, causal), update, carry), None

    b, h = qb.shape[:2]
    init = (
        jnp.full((b, h, bq), _NEG, qb.dtype),
        jnp.zeros((b, h, bq), qb.dtype),
        jnp.zeros((b, h, bq, vb.shape[-1]), qb.dtype),
    )
    m, den, acc = lax.scan(step, init, jnp.arange(kb.shape[0]))[0]
    den = jnp.where(den == 0, 1.0, den)  # unreachable (key 0 is always visible); avoids 0/0
    return acc / den[..., None], m + jnp.log(den)


def blocked_forward(q, k, v, *, scale: float, causal: bool, cfg: AttentionCfg, extras=None):
    """``(out (B,Sq,H,Dv), lse (B,H,Sq) float32)`` computed tile by tile in pure JAX.

    >>> import jax.numpy as jnp
    >>> q = jnp.ones((1, 5, 2, 4))
    >>> out, lse = blocked_forward(q, q, q, scale=0.5, causal=True, cfg=AttentionCfg(2, 2))
    >>> out.shape, lse.shape
    ((1, 5, 2, 4), (1, 2, 5))
    """
    _, sq, skv, *_ = check_args(q, k, v)
    bq, bkv = min(cfg.block_q, sq), min(cfg.block_kv, skv)
    ct = acc_dtype(q.dtype)
    qb, kb, vb = (to_blocks(x.astype(ct), n) for x, n in ((q, bq), (k, bkv), (v, bkv)))
    ext = None if extras is None else Extras.build(extras, sq, skv, bq, bkv, ct)
    fwd = functools.partial(
        _fwd_q_block, scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv, ext=ext
    )
    if qb.shape[0] == 1:
        o, lse = (x[None] for x in fwd(0, qb[0], kb, vb))
    else:
        # q tiles run one after another so only one tile's (bq, bkv) scores are live at a time.
        o, lse = lax.map(lambda a: fwd(a[0], a[1], kb, vb), (jnp.arange(qb.shape[0]), qb))
    lse = lse.transpose(1, 2, 0, 3).reshape(lse.shape[1], lse.shape[2], -1)[:, :, :sq]
    return from_blocks(o, sq).astype(q.dtype), lse.astype(jnp.float32)


# -- pure-JAX backward ----------------------------------------------------------------------------
def _bwd_q_block(carry, xs, *, kb, vb, scale, causal, bq, bkv, skv, ext=None):
    """Accumulate dq for q tile ``i`` and add its share into the full dk, dv (and the bias
    gradient, when there is a bias) carried across q tiles."""
    i, qi, doi, lsei, deli = xs

    def step(c, j):
        def update(c):
            dq, dk, dv, db = c
            s = jnp.einsum("bhqd,bhkd->bhqk", qi, kb[j]) * scale
            mask = _visible(i, j, bq, bkv, skv, causal)
            if ext is not None:
                s, mask = ext.scores(s, mask, i, j)
            p = jnp.where(mask, jnp.exp(s - lsei[..., None]), 0.0)
            dp = jnp.einsum("bhqd,bhkd->bhqk", doi, vb[j])
            z = None if ext is None else ext.dropout(i, j, *qi.shape[:2], p.dtype)
            if z is not None:  # out = sum(p * z * v): dP = z * dO.v, and D = rowsum(dO * out)
                dp = dp * z
            ds = p * (dp - deli[..., None])
            dq = dq + jnp.einsum("bhqk,bhkd->bhqd", ds, kb[j]) * scale
            dk = dk.at[j].add(jnp.einsum("bhqk,bhqd->bhkd", ds, qi) * scale)
            dv = dv.at[j].add(jnp.einsum("bhqk,bhqd->bhkd", p if z is None else p * z, doi))
            db = None if ext is None else ext.add_dbias(db, ds, i, j)
            return dq, dk, dv, db

        return _maybe(_tile_needed(i, j, bq, bkv, causal), update, c), None

    dq, dk, dv, db = lax.scan(step, (jnp.zeros_like(qi), *carry), jnp.arange(kb.shape[0]))[0]
    return (dk, dv, db), dq


def blocked_backward(
    q, k, v, out, lse, dout, *, scale: float, causal: bool, cfg: AttentionCfg, extras=None
):
    """``(dq, dk, dv)`` recomputing the scores tile by tile from ``lse`` (never all at once).
    With ``extras=(mask, bias, dropout_key, dropout_rate)`` (4-D mask/bias in the core layout,
    any None) the result is ``(dq, dk, dv, dbias)`` (``dbias`` None without a bias).

    >>> import jax.numpy as jnp
    >>> q, cfg = jnp.ones((1, 5, 2, 4)), AttentionCfg(2, 2)
    >>> out, lse = blocked_forward(q, q, q, scale=0.5, causal=False, cfg=cfg)
    >>> dq, dk, dv = blocked_backward(q, q, q, out, lse, out, scale=0.5, causal=False, cfg=cfg)
    >>> dq.shape, round(float(dv.sum()), 3)
    ((1, 5, 2, 4), 40.0)
    """
    _, sq, skv, *_ = check_args(q, k, v)
    bq, bkv = min(cfg.block_q, sq), min(cfg.block_kv, skv)
    ct = acc_dtype(q.dtype)
    qb, dob = to_blocks(q.astype(ct), bq), to_blocks(dout.astype(ct), bq)
    kb, vb = to_blocks(k.astype(ct), bkv), to_blocks(v.astype(ct), bkv)
    # D = rowsum(dO * O); padded query rows get D = 0 and lse = +inf, so they contribute nothing.
    delta = to_blocks(jnp.sum(dout.astype(ct) * out.astype(ct), -1, keepdims=True), bq)[..., 0]
    lse_b = to_blocks(lse.transpose(0, 2, 1)[..., None].astype(ct), bq, fill=jnp.inf)[..., 0]
    ext = None if extras is None else Extras.build(extras, sq, skv, bq, bkv, ct)
    body = functools.partial(
        _bwd_q_block, kb=kb, vb=vb, scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv, ext=ext
    )
    xs = (jnp.arange(qb.shape[0]), qb, dob, lse_b, delta)
    db0 = None if ext is None else ext.dbias_zeros()
    (dk, dv, db), dq = lax.scan(body, (jnp.zeros_like(kb), jnp.zeros_like(vb), db0), xs)
    grads = tuple(
        from_blocks(g, s).astype(x.dtype) for g, s, x in ((dq, sq, q), (dk, skv, k), (dv, skv, v))
    )
    if extras is None:
        return grads
    return (*grads, None if ext is None else ext.crop_dbias(db, sq, skv))


# -- Pallas (GPU) forward -------------------------------------------------------------------------
def _attn_fwd_body(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, bq, bkv, skv, n_kv):
    # One program per (batch, head, q tile); it loops over kv tiles with an online softmax.
    import jax.experimental.pallas as pl

    i = pl.program_id(2)
    q = q_ref[...]

    def step(j, carry):
        m, den, acc = carry
        kt = k_ref[pl.ds(j * bkv, bkv), :]
        vt = v_ref[pl.ds(j * bkv, bkv), :]
        s = lax.dot_general(q, kt, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
        mask = _visible(i, j, bq, bkv, skv, causal)
        s = jnp.where(mask, s * scale, _NEG)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.dot(p.astype(vt.dtype), vt, preferred_element_type=jnp.float32)
        return m_new, den * corr + p.sum(-1), acc * corr[:, None] + pv

    # Causal: tiles past the diagonal are never visited (a data-dependent trip count).
    upper = lax.min(n_kv, lax.div((i + 1) * bq + bkv - 1, bkv)) if causal else n_kv
    init = (
        jnp.full((bq,), _NEG, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
        jnp.zeros(o_ref.shape, jnp.float32),
    )
    m, den, acc = lax.fori_loop(0, upper, step, init)
    den = jnp.where(den == 0, 1.0, den)
    o_ref[...] = (acc / den[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(den)


def _pad_to(x: jax.Array, seq: int, dim: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, seq - x.shape[1]), (0, 0), (0, dim - x.shape[3])))


def gpu_blocks(cfg: AttentionCfg, sq: int, skv: int) -> tuple[int, int]:
    """Power-of-two tiles (>= 16, <= the padded sequence) the Pallas kernel uses.

    >>> gpu_blocks(AttentionCfg(100, 128), sq=1000, skv=40)
    (128, 64)
    """

    def fit(b: int, s: int) -> int:
        return max(16, min(next_pow2(b), next_pow2(s)))

    return fit(cfg.block_q, sq), fit(cfg.block_kv, skv)


def pallas_forward(q, k, v, *, scale: float, causal: bool, cfg: AttentionCfg, interpret=False):
    """``(out, lse)`` like :func:`blocked_forward`, from a Pallas kernel with grid (B, H, q tiles).

    Sequences are padded to whole tiles and head dims to powers of two (Triton loads need them).
    ``interpret=True`` runs the kernel body on any backend (slow; for tests).

    >>> import jax, jax.numpy as jnp
    >>> q = jnp.ones((1, 20, 2, 8))
    >>> f = lambda q: pallas_forward(q, q, q, scale=0.3, causal=True, cfg=AttentionCfg(16, 16))
    >>> [x.shape for x in jax.eval_shape(f, q)]
    [(1, 20, 2, 8), (1, 2, 20)]
    """
    import jax.experimental.pallas as pl
    from jax.experimental.pallas import triton as pltriton

    b, sq, skv, h, d, dv = check_args(q, k, v)
    bq, bkv = gpu_blocks(cfg, sq, skv)
    sqp, skvp = -(-sq // bq) * bq, -(-skv // bkv) * bkv
    dp, dvp = max(16, next_pow2(d)), max(16, next_pow2(dv))
    qp, kp, vp = _pad_to(q, sqp, dp), _pad_to(k, skvp, dp), _pad_to(v, skvp, dvp)
    body = functools.partial(
        _attn_fwd_body, scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv, n_kv=skvp // bkv
    )
    out, lse = pl.pallas_call(
        body,
        out_shape=(
            jax.ShapeDtypeStruct((b, sqp, h, dvp), q.dtype),
            jax.ShapeDtypeStruct((b, h, sqp), jnp.float32),
        ),
        grid=(b, h, sqp // bq),
        in_specs=[
            pl.BlockSpec((None, bq, None, dp), lambda bi, hi, i: (bi, i, hi, 0)),
            pl.BlockSpec((None, skvp, None, dp), lambda bi, hi, i: (bi, 0, hi, 0)),
            pl.BlockSpec((None, skvp, None, dvp), lambda bi, hi, i: (bi, 0, hi, 0)),
        ],
        out_specs=[
            pl.BlockSpec((None, bq, None, dvp), lambda bi, hi, i: (bi, i, hi, 0)),
            pl.BlockSpec((None, None, bq), lambda bi, hi, i: (bi, hi, i)),
        ],
        compiler_params=pltriton.CompilerParams(num_warps=4 if bq * bkv <= 64 * 64 else 8),
        interpret=interpret,
        name="nablax_attention_fwd",
    )(qp, kp, vp)
    return out[:, :sq, :, :dv], lse[:, :, :sq]


def _grouped(q, k, v) -> bool:
    """Plain-layout q, k, v whose k/v head counts differ from q's and divide it."""
    try:
        if not (len(q.shape) == len(k.shape) == len(v.shape) == 4):
            return False
        h, hk, hv = q.shape[2], k.shape[2], v.shape[2]
    except (AttributeError, TypeError):
        return False
    return (hk != h or hv != h) and min(hk, hv) > 0 and h % hk == 0 and h % hv == 0


def _pallas(q, k, v, **opts):
    return pallas_forward(q, k, v, interpret=INTERPRET, **opts)


# -- the kernel -----------------------------------------------------------------------------------
def _clip_cfg(bq: int, bkv: int, sq: int, skv: int) -> AttentionCfg:
    return AttentionCfg(min(bq, sq), min(bkv, skv))


def _cpu_candidates(sq: int, skv: int) -> list[AttentionCfg]:
    raw = [(64, 64), (64, 128), (128, 128), (128, 256), (256, 128), (256, 256), (256, 512)]
    out: list[AttentionCfg] = []
    for bq, bkv in [*raw, (512, 512)]:
        c = _clip_cfg(bq, bkv, sq, skv)
        if c not in out:
            out.append(c)
    return out


def _gpu_candidates(sq: int, skv: int) -> list[AttentionCfg]:
    raw = [(128, 64), (64, 64), (128, 128), (64, 32), (32, 32), (64, 128), (128, 32), (32, 64)]
    out: list[AttentionCfg] = []
    for bq, bkv in raw:
        c = AttentionCfg(*gpu_blocks(AttentionCfg(bq, bkv), sq, skv))
        if c not in out:
            out.append(c)
    return out


class Attention(Kernel[AttentionCfg, jax.Array]):
    """``softmax(q k^T * scale + mask) v`` in layout ``(batch, seq, heads, head_dim)``.

    Keyword options: ``causal`` (bool, start-aligned, see the module docstring) and ``scale``
    (Python float, default ``1/sqrt(head_dim)``); and ``mask``, ``bias``, ``dropout_rate``,
    ``dropout_key``, ``layout`` and grouped-query heads (see :mod:`.attention_ext`). A call with
    any of those takes the blocked JAX path for masks, bias and dropout on every platform (the
    Pallas forward still serves grouped heads and the ``"bhsd"`` layout on a GPU).

    >>> import jax.numpy as jnp
    >>> k = Attention("attention")
    >>> q = jnp.ones((1, 3, 1, 2))
    >>> k.run(q, q, q, cfg=AttentionCfg(block_q=2, block_kv=2)).shape
    (1, 3, 1, 2)
    >>> k.run(q, q, q, mask=jnp.tril(jnp.ones((3, 3), bool))).shape
    (1, 3, 1, 2)
    """

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

    def _opts(self, q, k, v, cfg, causal, scale):
        _, sq, skv, _, d, _ = check_args(q, k, v)
        cfg = cfg or self._heuristic(sq, skv, bool(causal))
        return dict(scale=resolve_scale(scale, d), causal=bool(causal), cfg=cfg)

    @staticmethod
    def _extra(q, k, v, kw: dict) -> dict:
        """The call's non-default extra options; ``{"layout": "bshd"}`` for grouped heads alone
        (a truthy dict sends the call down the general path)."""
        ext = ext_mod.split_options(kw)[1]
        if not ext and _grouped(q, k, v):
            ext = {"layout": "bshd"}
        return ext

    def _general(self, q, k, v, cfg, causal, ext, core_fn, scale):
        sq, skv = ext_mod.seq_lens((q, k), ext)
        cfg = cfg or self._heuristic(sq, skv, bool(causal))
        return ext_mod.general_forward(
            q, k, v, core_fn=core_fn, blocked_fn=blocked_forward, cfg=cfg, causal=bool(causal),
            scale=scale, **ext,
        )  # fmt: skip

    def run(self, q, k, v, *, cfg: AttentionCfg | None = None, causal=False, scale=None, **kw):
        """Blockwise pure-JAX forward (see :func:`blocked_forward`); jit-traceable."""
        ext = self._extra(q, k, v, kw)
        if ext:
            return self._general(q, k, v, cfg, causal, ext, blocked_forward, scale)[0]
        return blocked_forward(q, k, v, **self._opts(q, k, v, cfg, causal, scale))[0]

    def run_gpu(self, q, k, v, *, cfg: AttentionCfg | None = None, causal=False, scale=None, **kw):
        """The Pallas forward kernel (module switch ``INTERPRET`` runs it in interpret mode)."""
        ext = self._extra(q, k, v, kw)
        if ext:
            return self._general(q, k, v, cfg, causal, ext, _pallas, scale)[0]
        opts = self._opts(q, k, v, cfg, causal, scale)
        return pallas_forward(q, k, v, interpret=INTERPRET, **opts)[0]

    def fwd_with_residuals(self, q, k, v, *, cfg=None, causal=False, scale=None, **kw):
        """``(out, (out, lse))``; ``lse`` is ``(batch, heads, seq_q)`` float32 (no score matrix).
        With extra options the residual is ``lse`` alone (the output comes back as ``y``)."""
        ext = self._extra(q, k, v, kw)
        if ext:
            out, lse = self._general(q, k, v, cfg, causal, ext, blocked_forward, scale)
            return out, lse
        out, lse = blocked_forward(q, k, v, **self._opts(q, k, v, cfg, causal, scale))
        return out, (out, lse)

    def fwd_with_residuals_gpu(self, q, k, v, *, cfg=None, causal=False, scale=None, **kw):
        """As ``fwd_with_residuals`` with the Pallas forward."""
        ext = self._extra(q, k, v, kw)
        if ext:
            return self._general(q, k, v, cfg, causal, ext, _pallas, scale)
        opts = self._opts(q, k, v, cfg, causal, scale)
        out, lse = pallas_forward(q, k, v, interpret=INTERPRET, **opts)
        return out, (out, lse)

    def vjp(self, res, y, dy, q, k, v, *, cfg=None, causal=False, scale=None, **kw) -> tuple:
        """``(dq, dk, dv)`` by the blockwise flash-attention backward from ``res=(out, lse)``
        (with a ``bias``, also ``{"bias": dbias}``)."""
        ext = self._extra(q, k, v, kw)
        if ext:
            sq, skv = ext_mod.seq_lens((q, k), ext)
            cfg = cfg or self._heuristic(sq, skv, bool(causal))
            return ext_mod.general_vjp(
                res, y, dy, q, k, v, fns=(blocked_forward, blocked_backward), cfg=cfg,
                causal=bool(causal), scale=scale, **ext,
            )  # fmt: skip
        opts = self._opts(q, k, v, cfg, causal, scale)
        out, lse = res if res is not None else blocked_forward(q, k, v, **opts)
        return blocked_backward(q, k, v, out, lse, dy, **opts)

    @staticmethod
    def _heuristic(sq: int, skv: int, causal: bool) -> AttentionCfg:
        # CPU: few, large tiles amortize the per-step loop cost; causal prefers 128 x 128 so
        # that more tiles above the diagonal are skipped (measured on 512..1024 sequences).
        return _clip_cfg(128, 128, sq, skv) if causal else _clip_cfg(256, 512, sq, skv)

    def heuristic_cfg(self, inv: Invocation) -> AttentionCfg:
        """Tiles of 256 x 512 (causal: 128 x 128) clipped to the sequences."""
        sq, skv = ext_mod.seq_lens(inv.args, inv.kwargs)
        return self._heuristic(sq, skv, bool(inv.kwargs.get("causal", False)))

    def heuristic_cfg_gpu(self, inv: Invocation) -> AttentionCfg:
        """128 x 64 tiles (rounded to the sequences), the usual flash-attention start."""
        sq, skv = ext_mod.seq_lens(inv.args, inv.kwargs)
        return AttentionCfg(*gpu_blocks(AttentionCfg(128, 64), sq, skv))

    def candidate_cfgs(self, inv: Invocation) -> list[AttentionCfg]:
        """Up to 8 tile pairs from 64..512, clipped to the sequences, with the heuristic's."""
        self.prepare(*inv.args, **inv.kwargs)  # clear errors (memoized checks)
        sq, skv = ext_mod.seq_lens(inv.args, inv.kwargs)
        return _cpu_candidates(sq, skv)

    def candidate_cfgs_gpu(self, inv: Invocation) -> list[AttentionCfg]:
        """Up to 8 power-of-two tile pairs for the Pallas kernel, with the heuristic's."""
        self.prepare(*inv.args, **inv.kwargs)
        sq, skv = ext_mod.seq_lens(inv.args, inv.kwargs)
        return _gpu_candidates(sq, skv)


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

"""The ``attention`` kernel's blocked pure-JAX implementation (``impl=None`` off a GPU):
``softmax(q k^T * scale + mask) v`` one ``(block_q, block_kv)`` tile of scores at a time with an
online softmax (running max, running sum, float32 accumulation), and the flash-attention backward
recomputing the scores tile by tile from the saved logsumexp (``D = rowsum(dO * O)``,
``dS = P * (dP - D)``). Masks, bias and dropout (:mod:`.attention_ext`) are applied per tile.
Callers have checked the arguments (``attention.check_args``); ``cfg`` is an ``AttentionCfg``.

>>> import jax.numpy as jnp
>>> from nablax.kernels.library.attention import AttentionCfg
>>> q = jnp.ones((1, 5, 2, 4))
>>> blocked_forward(q, q, q, scale=0.5, causal=True, cfg=AttentionCfg(2, 2))[0].shape
(1, 5, 2, 4)
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .attention_ext import Extras
from .attention_pallas import NEG, visible
from .matmul import acc_dtype


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
            mask = visible(i, j, bq, bkv, skv, causal)
            if ext is not None:
                s, mask = ext.scores(s, mask, i, j)
            s = jnp.where(mask, s, NEG)
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
        jnp.full((b, h, bq), NEG, qb.dtype),
        jnp.zeros((b, h, bq), qb.dtype),
        jnp.zeros((b, h, bq, vb.shape[-1]), qb.dtype),
    )
    m, den, acc = lax.scan(step, init, jnp.arange(kb.shape[0]))[0]
    den = jnp.where(den == 0, 1.0, den)  # unreachable (key 0 is always visible); avoids 0/0
    return acc / den[..., None], m + jnp.log(den)


def blocked_forward(q, k, v, *, scale: float, causal: bool, cfg: Any, extras=None):
    """``(out (B,Sq,H,Dv), lse (B,H,Sq) float32)`` computed tile by tile in pure JAX.

    >>> import jax.numpy as jnp
    >>> from nablax.kernels.library.attention import AttentionCfg
    >>> q = jnp.ones((1, 5, 2, 4))
    >>> out, lse = blocked_forward(q, q, q, scale=0.5, causal=True, cfg=AttentionCfg(2, 2))
    >>> out.shape, lse.shape
    ((1, 5, 2, 4), (1, 2, 5))
    """
    sq, skv = q.shape[1], k.shape[1]
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
# The plain backward (no mask, bias or dropout) works on transposed tiles, ``(bkv, bq)``: XLA's CPU
# backend runs a dot at its library speed only when the left operand contracts its last axis, and
# ``dK = dS^T Q`` and ``dV = P^T dO`` on ``(bq, bkv)`` tiles contract the first (2.3x slower on a
# 64 x 64 tile). With ``S^T = K Q^T`` recomputed instead, four of the five dots take the fast form;
# ``dQ = dS K`` reads ``dS^T`` transposed, copied first while a tile's scores fit in
# ``_DQ_COPY_BYTES`` (cache-resident: the copy costs less than the slow dot; past that the copy's
# memory traffic costs more). Medians on 2 CPU cores, causal, against the untransposed backward:
# batch 16, 4 heads, 64 tokens, head 32, 64 x 64 tiles 0.91 ms for 1.25; batch 64, 6 heads,
# 256 tokens, head 64, 128 x 128 tiles 240 ms for 280; batch 4, 4 heads, 1024 tokens 49 for 74.
_DQ_COPY_BYTES = 4 << 20


def _plain_bwd_tile(c, i, j, qi, doi, lsei, deli, kj, vj, *, scale, causal, bq, bkv, skv):
    """One tile of the plain backward in the transposed layout (see above)."""
    dq, dk, dv, db = c
    st = jnp.einsum("bhkd,bhqd->bhkq", kj, qi) * scale
    mask = visible(i, j, bq, bkv, skv, causal).T
    pt = jnp.where(mask, jnp.exp(st - lsei[..., None, :]), 0.0)
    dpt = jnp.einsum("bhkd,bhqd->bhkq", vj, doi)
    dst = pt * (dpt - deli[..., None, :])
    if dst.size * dst.dtype.itemsize <= _DQ_COPY_BYTES:
        ds = lax.optimization_barrier(dst.swapaxes(-1, -2))  # kept: XLA would fold it into the dot
        dq = dq + jnp.einsum("bhqk,bhkd->bhqd", ds, kj) * scale
    else:
        dq = dq + jnp.einsum("bhkq,bhkd->bhqd", dst, kj) * scale
    dk = dk.at[j].add(jnp.einsum("bhkq,bhqd->bhkd", dst, qi) * scale)
    dv = dv.at[j].add(jnp.einsum("bhkq,bhqd->bhkd", pt, doi))
    return dq, dk, dv, db


def _bwd_q_block(carry, xs, *, kb, vb, scale, causal, bq, bkv, skv, ext=None):
    """Accumulate dq for q tile ``i`` and add its share into the full dk, dv (and the bias
    gradient, when there is a bias) carried across q tiles."""
    i, qi, doi, lsei, deli = xs

    def step(c, j):
        def update(c):
            if ext is None:
                return _plain_bwd_tile(
                    c, i, j, qi, doi, lsei, deli, kb[j], vb[j],
                    scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv,
                )  # fmt: skip
            dq, dk, dv, db = c
            s = jnp.einsum("bhqd,bhkd->bhqk", qi, kb[j]) * scale
            mask = visible(i, j, bq, bkv, skv, causal)
            s, mask = ext.scores(s, mask, i, j)
            p = jnp.where(mask, jnp.exp(s - lsei[..., None]), 0.0)
            dp = jnp.einsum("bhqd,bhkd->bhqk", doi, vb[j])
            z = ext.dropout(i, j, *qi.shape[:2], p.dtype)
            if z is not None:  # out = sum(p * z * v): dP = z * dO.v, and D = rowsum(dO * out)
                dp = dp * z
            ds = p * (dp - deli[..., None])
            dq = dq + jnp.einsum("bhqk,bhkd->bhqd", ds, kb[j]) * scale
            dk = dk.at[j].add(jnp.einsum("bhqk,bhqd->bhkd", ds, qi) * scale)
            dv = dv.at[j].add(jnp.einsum("bhqk,bhqd->bhkd", p if z is None else p * z, doi))
            db = ext.add_dbias(db, ds, i, j)
            return dq, dk, dv, db

        return _maybe(_tile_needed(i, j, bq, bkv, causal), update, c), None

    dq, dk, dv, db = lax.scan(step, (jnp.zeros_like(qi), *carry), jnp.arange(kb.shape[0]))[0]
    return (dk, dv, db), dq


def blocked_backward(q, k, v, out, lse, dout, *, scale: float, causal: bool, cfg: Any, extras=None):
    """``(dq, dk, dv)`` recomputing the scores tile by tile from ``lse`` (never all at once).
    With ``extras=(mask, bias, dropout_key, dropout_rate)`` (4-D mask/bias in the core layout,
    any None) the result is ``(dq, dk, dv, dbias)`` (``dbias`` None without a bias).

    >>> import jax.numpy as jnp
    >>> from nablax.kernels.library.attention import AttentionCfg
    >>> q, cfg = jnp.ones((1, 5, 2, 4)), AttentionCfg(2, 2)
    >>> out, lse = blocked_forward(q, q, q, scale=0.5, causal=False, cfg=cfg)
    >>> dq, dk, dv = blocked_backward(q, q, q, out, lse, out, scale=0.5, causal=False, cfg=cfg)
    >>> dq.shape, round(float(dv.sum()), 3)
    ((1, 5, 2, 4), 40.0)
    """
    sq, skv = q.shape[1], k.shape[1]
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

"""The ``attention`` kernel's Pallas implementation (``impl="pallas"``): a flash-attention forward
and a flash-attention backward, both blocked, in layout ``(batch, seq, heads, head_dim)``.

- :func:`pallas_forward`: one program per (batch, head, q tile) runs an online softmax over the kv
  tiles (float32 running max, sum and accumulator) and writes ``out`` and the row logsumexp
  ``lse``; with ``causal`` the tiles above the diagonal are never visited.
- :func:`pallas_backward`: two kernels that recompute the probabilities ``P = exp(S - lse)`` tile
  by tile from the saved ``lse`` (the score matrix never exists): one program per (batch, head, kv
  tile) accumulates ``dK`` and ``dV`` over the q tiles, one per (batch, head, q tile) accumulates
  ``dQ`` over the kv tiles, with ``D = rowsum(dO * O)`` and ``dS = P * (dP - D)``.

Sequences are padded to whole tiles (padded keys are masked; padded queries get ``lse = +inf`` so
their probabilities are 0) and head dims to powers of two (>= 16). On the CPU the kernels run in
Pallas's interpret mode; on a GPU through the Triton backend where JAX still supports it (see
:mod:`._impls`: on JAX 0.11+ they raise ``NotImplementedError``). Not yet run on a GPU.

>>> import jax, jax.numpy as jnp
>>> q = jnp.ones((1, 20, 2, 8))
>>> f = lambda q: pallas_forward(q, q, q, scale=0.3, causal=True, blocks=(16, 16), interpret=True)
>>> [x.shape for x in jax.eval_shape(f, q)]
[(1, 20, 2, 8), (1, 2, 20)]
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from ._impls import pallas_params
from .matmul import next_pow2

API = "nablax.kernels.library.attention"

# Finite stand-in for -inf in masked scores: exp(NEG - m) is 0 without inf - inf = nan.
NEG = -1e30


def visible(i, j, bq: int, bkv: int, skv: int, causal: bool) -> jax.Array:
    """``(bq, bkv)`` mask of tile (i, j): real keys, and keys ``<= query`` when causal."""
    qi = i * bq + jnp.arange(bq)[:, None]
    kj = j * bkv + jnp.arange(bkv)[None, :]
    mask = kj < skv
    return mask & (kj <= qi) if causal else mask


def gpu_blocks(block_q: int, block_kv: int, sq: int, skv: int) -> tuple[int, int]:
    """Power-of-two tiles (>= 16, <= the padded sequence) the Pallas kernels use.

    >>> gpu_blocks(100, 128, sq=1000, skv=40)
    (128, 64)
    """

    def fit(b: int, s: int) -> int:
        return max(16, min(next_pow2(b), next_pow2(s)))

    return fit(block_q, sq), fit(block_kv, skv)


def _pad_to(x: jax.Array, seq: int, dim: int) -> jax.Array:
    return jnp.pad(x, ((0, 0), (0, seq - x.shape[1]), (0, 0), (0, dim - x.shape[3])))


def _dot_t(a, b):
    """``a @ b.T`` in float32 (contract the last dims)."""
    return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _t_dot(a, b):
    """``a.T @ b`` in float32 (contract the first dims)."""
    return lax.dot_general(a, b, (((0,), (0,)), ((), ())), preferred_element_type=jnp.float32)


def _warps(bq: int, bkv: int) -> int:
    return 4 if bq * bkv <= 64 * 64 else 8


class _Layout:
    """Tile sizes and padded sizes of one call."""

    def __init__(self, q, k, v, blocks):
        self.b, self.sq, self.h, self.d = q.shape
        self.skv, self.dv = k.shape[1], v.shape[3]
        self.bq, self.bkv = gpu_blocks(*blocks, self.sq, self.skv)
        self.sqp = -(-self.sq // self.bq) * self.bq
        self.skvp = -(-self.skv // self.bkv) * self.bkv
        self.dp, self.dvp = max(16, next_pow2(self.d)), max(16, next_pow2(self.dv))
        self.n_q, self.n_kv = self.sqp // self.bq, self.skvp // self.bkv

    def spec(self, seq: int | None, dim: int, tiled: str | None):
        """BlockSpec of a ``(B, S, H, D)`` array: one tile of ``seq`` rows (``tiled`` names the
        grid axis that picks it) or the whole padded sequence."""
        import jax.experimental.pallas as pl

        if tiled is None:
            return pl.BlockSpec((None, seq, None, dim), lambda bi, hi, t: (bi, 0, hi, 0))
        return pl.BlockSpec((None, seq, None, dim), lambda bi, hi, t: (bi, t, hi, 0))

    def row_spec(self, seq: int, tiled: bool):
        """BlockSpec of a ``(B, H, S)`` row statistic (lse, D)."""
        import jax.experimental.pallas as pl

        if tiled:
            return pl.BlockSpec((None, None, seq), lambda bi, hi, t: (bi, hi, t))
        return pl.BlockSpec((None, None, seq), lambda bi, hi, t: (bi, hi, 0))


# -- forward ---------------------------------------------------------------------------------------
def _fwd_body(q_ref, k_ref, v_ref, o_ref, lse_ref, *, scale, causal, bq, bkv, skv, n_kv):
    import jax.experimental.pallas as pl

    i = pl.program_id(2)
    q = q_ref[...]

    def step(j, carry):
        m, den, acc = carry
        kt = k_ref[pl.ds(j * bkv, bkv), :]
        vt = v_ref[pl.ds(j * bkv, bkv), :]
        mask = visible(i, j, bq, bkv, skv, causal)
        s = jnp.where(mask, _dot_t(q, kt) * scale, NEG)
        m_new = jnp.maximum(m, s.max(-1))
        p = jnp.where(mask, jnp.exp(s - m_new[:, None]), 0.0)
        corr = jnp.exp(m - m_new)
        pv = jnp.dot(p.astype(vt.dtype), vt, preferred_element_type=jnp.float32)
        return m_new, den * corr + p.sum(-1), acc * corr[:, None] + pv

    # Causal: tiles past the diagonal are never visited (a data-dependent trip count).
    upper = lax.min(n_kv, lax.div((i + 1) * bq + bkv - 1, bkv)) if causal else n_kv
    init = (
        jnp.full((bq,), NEG, jnp.float32),
        jnp.zeros((bq,), jnp.float32),
        jnp.zeros(o_ref.shape, jnp.float32),
    )
    m, den, acc = lax.fori_loop(0, upper, step, init)
    den = jnp.where(den == 0, 1.0, den)
    o_ref[...] = (acc / den[:, None]).astype(o_ref.dtype)
    lse_ref[...] = m + jnp.log(den)


def pallas_forward(q, k, v, *, scale: float, causal: bool, blocks: tuple, interpret: bool):
    """``(out (B,Sq,H,Dv), lse (B,H,Sq) float32)`` from the Pallas forward kernel with tiles
    ``blocks = (block_q, block_kv)`` (rounded by :func:`gpu_blocks`); grid (B, H, q tiles)."""
    import jax.experimental.pallas as pl

    t = _Layout(q, k, v, blocks)
    qp, kp, vp = _pad_to(q, t.sqp, t.dp), _pad_to(k, t.skvp, t.dp), _pad_to(v, t.skvp, t.dvp)
    body = functools.partial(
        _fwd_body, scale=scale, causal=causal, bq=t.bq, bkv=t.bkv, skv=t.skv, n_kv=t.n_kv
    )
    out, lse = pl.pallas_call(
        body,
        out_shape=(
            jax.ShapeDtypeStruct((t.b, t.sqp, t.h, t.dvp), q.dtype),
            jax.ShapeDtypeStruct((t.b, t.h, t.sqp), jnp.float32),
        ),
        grid=(t.b, t.h, t.n_q),
        in_specs=[t.spec(t.bq, t.dp, "q"), t.spec(t.skvp, t.dp, None), t.spec(t.skvp, t.dvp, None)],
        out_specs=[t.spec(t.bq, t.dvp, "q"), t.row_spec(t.bq, True)],
        name="nablax_attention_fwd",
        **pallas_params(API, interpret, _warps(t.bq, t.bkv)),
    )(qp, kp, vp)
    return out[:, : t.sq, :, : t.dv], lse[:, :, : t.sq]


# -- backward --------------------------------------------------------------------------------------
def _probs(qt, kt, lse, i, j, *, scale, causal, bq, bkv, skv):
    """The tile's probabilities ``exp(S - lse)`` (0 where masked), float32 ``(bq, bkv)``."""
    mask = visible(i, j, bq, bkv, skv, causal)
    s = _dot_t(qt, kt) * scale
    return jnp.where(mask, jnp.exp(s - lse[:, None]), 0.0)


def _dkdv_body(q_ref, k_ref, v_ref, do_ref, lse_ref, de_ref, dk_ref, dv_ref, *, scale, causal,
               bq, bkv, skv, n_q):  # fmt: skip
    # One program per (batch, head, kv tile j): loop over the q tiles that see it.
    import jax.experimental.pallas as pl

    j = pl.program_id(2)
    kt, vt = k_ref[...], v_ref[...]

    def step(i, carry):
        dk, dv = carry
        qt = q_ref[pl.ds(i * bq, bq), :]
        dot = do_ref[pl.ds(i * bq, bq), :]
        lse, de = lse_ref[pl.ds(i * bq, bq)], de_ref[pl.ds(i * bq, bq)]
        p = _probs(qt, kt, lse, i, j, scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv)
        dv = dv + _t_dot(p.astype(dot.dtype), dot)
        ds = p * (_dot_t(dot, vt) - de[:, None])
        dk = dk + _t_dot(ds.astype(qt.dtype), qt) * scale
        return dk, dv

    # Causal: q tiles wholly before this kv tile see none of its keys.
    lower = lax.div(j * bkv, bq) if causal else 0
    init = (jnp.zeros(dk_ref.shape, jnp.float32), jnp.zeros(dv_ref.shape, jnp.float32))
    dk, dv = lax.fori_loop(lower, n_q, step, init)
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


def _dq_body(q_ref, k_ref, v_ref, do_ref, lse_ref, de_ref, dq_ref, *, scale, causal, bq, bkv,
             skv, n_kv):  # fmt: skip
    # One program per (batch, head, q tile i): loop over the kv tiles it sees.
    import jax.experimental.pallas as pl

    i = pl.program_id(2)
    qt, dot = q_ref[...], do_ref[...]
    lse, de = lse_ref[...], de_ref[...]

    def step(j, dq):
        kt = k_ref[pl.ds(j * bkv, bkv), :]
        vt = v_ref[pl.ds(j * bkv, bkv), :]
        p = _probs(qt, kt, lse, i, j, scale=scale, causal=causal, bq=bq, bkv=bkv, skv=skv)
        ds = p * (_dot_t(dot, vt) - de[:, None])
        return dq + jnp.dot(ds.astype(kt.dtype), kt, preferred_element_type=jnp.float32) * scale

    upper = lax.min(n_kv, lax.div((i + 1) * bq + bkv - 1, bkv)) if causal else n_kv
    dq = lax.fori_loop(0, upper, step, jnp.zeros(dq_ref.shape, jnp.float32))
    dq_ref[...] = dq.astype(dq_ref.dtype)


def pallas_backward(q, k, v, out, lse, dout, *, scale: float, causal: bool, blocks: tuple,
                    interpret: bool):  # fmt: skip
    """``(dq, dk, dv)`` from the two Pallas backward kernels (see the module docstring), given the
    forward's ``out`` and ``lse (B, H, Sq)``.

    >>> import jax.numpy as jnp
    >>> q = jnp.ones((1, 5, 1, 4))
    >>> o, lse = pallas_forward(q, q, q, scale=0.5, causal=True, blocks=(16, 16), interpret=True)
    >>> dq, dk, dv = pallas_backward(q, q, q, o, lse, o, scale=0.5, causal=True, blocks=(16, 16),
    ...                              interpret=True)
    >>> dq.shape, round(float(dv.sum()), 3)
    ((1, 5, 1, 4), 20.0)
    """
    import jax.experimental.pallas as pl

    t = _Layout(q, k, v, blocks)
    qp, kp = _pad_to(q, t.sqp, t.dp), _pad_to(k, t.skvp, t.dp)
    vp, dop = _pad_to(v, t.skvp, t.dvp), _pad_to(dout.astype(q.dtype), t.sqp, t.dvp)
    # D = rowsum(dO * O) in float32; padded query rows get D = 0 and lse = +inf (P = 0 there).
    de = jnp.sum(dout.astype(jnp.float32) * out.astype(jnp.float32), -1).transpose(0, 2, 1)
    de = jnp.pad(de, ((0, 0), (0, 0), (0, t.sqp - t.sq)))
    lse_p = jnp.pad(lse.astype(jnp.float32), ((0, 0), (0, 0), (0, t.sqp - t.sq)),
                    constant_values=jnp.inf)  # fmt: skip
    opts = dict(scale=scale, causal=causal, bq=t.bq, bkv=t.bkv, skv=t.skv)
    params = pallas_params(API, interpret, _warps(t.bq, t.bkv))
    full_q = [t.spec(t.sqp, t.dp, None), t.spec(t.bkv, t.dp, "kv"), t.spec(t.bkv, t.dvp, "kv"),
              t.spec(t.sqp, t.dvp, None), t.row_spec(t.sqp, False), t.row_spec(t.sqp, False)]  # fmt: skip
    dk, dv = pl.pallas_call(
        functools.partial(_dkdv_body, n_q=t.n_q, **opts),
        out_shape=(
            jax.ShapeDtypeStruct((t.b, t.skvp, t.h, t.dp), k.dtype),
            jax.ShapeDtypeStruct((t.b, t.skvp, t.h, t.dvp), v.dtype),
        ),
        grid=(t.b, t.h, t.n_kv),
        in_specs=full_q,
        out_specs=[t.spec(t.bkv, t.dp, "kv"), t.spec(t.bkv, t.dvp, "kv")],
        name="nablax_attention_bwd_dkdv",
        **params,
    )(qp, kp, vp, dop, lse_p, de)
    full_kv = [t.spec(t.bq, t.dp, "q"), t.spec(t.skvp, t.dp, None), t.spec(t.skvp, t.dvp, None),
               t.spec(t.bq, t.dvp, "q"), t.row_spec(t.bq, True), t.row_spec(t.bq, True)]  # fmt: skip
    dq = pl.pallas_call(
        functools.partial(_dq_body, n_kv=t.n_kv, **opts),
        out_shape=jax.ShapeDtypeStruct((t.b, t.sqp, t.h, t.dp), q.dtype),
        grid=(t.b, t.h, t.n_q),
        in_specs=full_kv,
        out_specs=t.spec(t.bq, t.dp, "q"),
        name="nablax_attention_bwd_dq",
        **params,
    )(qp, kp, vp, dop, lse_p, de)
    crop = lambda x, s, d: x[:, :s, :, :d]  # noqa: E731
    return crop(dq, t.sq, t.d), crop(dk, t.skv, t.d), crop(dv, t.skv, t.dv)

"""The ``attention`` kernel's library implementations: ``impl="xla"`` (the whole score matrix in
plain JAX, fused by XLA) and ``impl="cudnn"`` (``jax.nn.dot_product_attention``'s cuDNN path).

Both take and return the kernel's core layout ``(batch, seq, heads, head_dim)``, with the same
start-aligned causal mask as the blocked and Pallas implementations, and have the signatures of
``blocked_forward`` / ``blocked_backward``: forward ``-> (out, lse)``, backward ``-> (dq, dk,
dv)``. The "xla" backward is the flash-attention backward on the whole matrix (``P`` recomputed
from ``lse``); cuDNN gives no logsumexp (``lse`` is None) and its backward is JAX's derivative of
the cuDNN call (cuDNN's own backward kernel, after recomputing the forward).

>>> import jax.numpy as jnp
>>> q = jnp.ones((1, 3, 2, 4))
>>> out, lse = xla_forward(q, q, q, scale=0.5, causal=True)
>>> out.shape, lse.shape
((1, 3, 2, 4), (1, 2, 3))
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from ._impls import cudnn_reason, platform
from .matmul import acc_dtype

API = "nablax.kernels.library.attention"


def _scores(q, k, scale: float, causal: bool):
    ct = acc_dtype(q.dtype)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=ct) * scale
    if causal:
        sq, skv = q.shape[1], k.shape[1]
        s = jnp.where(jnp.tril(jnp.ones((sq, skv), bool)), s, -jnp.inf)
    return s


def xla_forward(q, k, v, *, scale: float, causal: bool, cfg=None):
    """``(out, lse (B, H, Sq) float32)`` with the whole ``(Sq, Skv)`` score matrix per head."""
    ct = acc_dtype(q.dtype)
    s = _scores(q, k, scale, causal)
    lse = jax.nn.logsumexp(s, axis=-1)
    p = jnp.exp(s - lse[..., None])
    out = jnp.einsum("bhqk,bkhd->bqhd", p.astype(v.dtype), v, preferred_element_type=ct)
    return out.astype(q.dtype), lse.astype(jnp.float32)


def xla_backward(q, k, v, out, lse, dout, *, scale: float, causal: bool, cfg=None):
    """``(dq, dk, dv)``: ``dS = P * (dO v^T - rowsum(dO * O))`` on the whole matrix.

    >>> import jax, jax.numpy as jnp
    >>> q = jax.random.normal(jax.random.key(0), (1, 4, 1, 8))
    >>> o, lse = xla_forward(q, q, q, scale=0.3, causal=True)
    >>> g = xla_backward(q, q, q, o, lse, o, scale=0.3, causal=True)
    >>> want = jax.vjp(lambda q, k, v: xla_forward(q, k, v, scale=0.3, causal=True)[0], q, q, q)
    >>> all(bool(jnp.allclose(a, b, atol=1e-5)) for a, b in zip(g, want[1](o)))
    True
    """
    ct = acc_dtype(q.dtype)
    if lse is None:
        out, lse = xla_forward(q, k, v, scale=scale, causal=causal)
    s = _scores(q, k, scale, causal)
    p = jnp.exp(s - lse.astype(ct)[..., None])
    do = dout.astype(ct)
    dp = jnp.einsum("bqhd,bkhd->bhqk", do, v.astype(ct))
    delta = jnp.sum(do * out.astype(ct), -1).transpose(0, 2, 1)  # (B, H, Sq)
    ds = p * (dp - delta[..., None])
    dq = jnp.einsum("bhqk,bkhd->bqhd", ds, k.astype(ct)) * scale
    dk = jnp.einsum("bhqk,bqhd->bkhd", ds, q.astype(ct)) * scale
    dv = jnp.einsum("bhqk,bqhd->bkhd", p, do)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)


def _check_cudnn(q, k, v) -> None:
    reason = cudnn_reason(tuple(q.shape), tuple(k.shape), tuple(v.shape), q.dtype, platform())
    if reason is not None:
        raise NotImplementedError(
            f"{API}: impl='cudnn' cannot run this call: {reason}. Fix: use impl='xla' or "
            f"impl='pallas', or leave cfg=None so the tuner picks an available implementation"
        )


def _cudnn(q, k, v, scale: float, causal: bool):
    return jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=causal, implementation="cudnn"
    )


def cudnn_forward(q, k, v, *, scale: float, causal: bool, cfg=None):
    """``(out, None)`` from cuDNN's fused attention (NVIDIA GPUs; see :mod:`._impls`)."""
    _check_cudnn(q, k, v)
    return _cudnn(q, k, v, scale, causal), None


def cudnn_backward(q, k, v, out, lse, dout, *, scale: float, causal: bool, cfg=None):
    """``(dq, dk, dv)`` from cuDNN's backward kernel (JAX's derivative of the cuDNN call)."""
    _check_cudnn(q, k, v)
    _, pull = jax.vjp(lambda q, k, v: _cudnn(q, k, v, scale, causal), q, k, v)
    return pull(dout.astype(q.dtype))


cudnn_backward.needs_lse = False  # type: ignore[attr-defined]  # (general_vjp skips recomputing)
xla_backward.needs_lse = False  # type: ignore[attr-defined]  # (recomputes lse itself)

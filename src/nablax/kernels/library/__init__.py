"""Bundled kernels: ``matmul`` and ``attention``, tunable and differentiable.

The wrappers pick a config through the default executor (override → caches → autotune →
heuristic), run the platform's implementation (pure JAX on CPU, Pallas on GPU) and give it the
kernel's custom gradient. They take ``jax.Array`` s (and return one) or nablax Tensors (and return
a lazy Tensor). The kernel instances, their classes, configs and plain reference functions are
exported for direct use and tests.

>>> import jax.numpy as jnp
>>> a = jnp.ones((4, 3))
>>> MATMUL.run(a, a.T, cfg=MatmulCfg()).shape
(4, 4)
"""

from __future__ import annotations

from typing import Any

from .attention import ATTENTION, Attention, AttentionCfg, attention_reference
from .matmul import MATMUL, Matmul, MatmulCfg, matmul_reference

__all__ = [
    "ATTENTION",
    "MATMUL",
    "Attention",
    "AttentionCfg",
    "Matmul",
    "MatmulCfg",
    "attention",
    "attention_reference",
    "matmul",
    "matmul_reference",
]


def matmul(a: Any, b: Any, *, cfg: MatmulCfg | None = None) -> Any:
    """``a (..., M, K) @ b (K, N)`` → ``(..., M, N)`` through the tuned ``matmul`` kernel.

    ``cfg`` forces a config for this call only (never stored); by default one is chosen from the
    caches, by autotuning or by the heuristic. Inputs must share a floating dtype; the result has
    that dtype (float32 accumulation). Differentiable with respect to ``a`` and ``b``.

    >>> import jax.numpy as jnp
    >>> a = jnp.arange(12.0).reshape(2, 2, 3)
    >>> b = jnp.ones((3, 4))
    >>> y = matmul(a, b, cfg=MatmulCfg(block_k=2))
    >>> y.shape, bool(jnp.allclose(y, matmul_reference(a, b)))
    ((2, 2, 4), True)
    """
    from .matmul import check_args

    check_args(a, b)  # fail with this API's message before any config is chosen
    from ..executor import default_executor

    return default_executor()(MATMUL, a, b, cfg=cfg)


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    scale: float | None = None,
    cfg: AttentionCfg | None = None,
    mask: Any = None,
    bias: Any = None,
    dropout_rate: float = 0.0,
    dropout_key: Any = None,
    layout: str = "bshd",
) -> Any:
    """Scaled dot-product attention in layout ``(batch, seq, heads, head_dim)``.

    ``softmax(q k^T * scale + mask) v`` computed blockwise (flash-style): memory grows with
    ``seq``, not ``seq_q * seq_kv``. ``scale`` defaults to ``1/sqrt(head_dim)``. With
    ``causal=True`` query ``i`` sees keys ``j <= i``, aligned at the start like
    ``jax.nn.dot_product_attention(is_causal=True)`` (also when ``seq_q != seq_kv``). ``cfg``
    forces an :class:`AttentionCfg` for this call only. Differentiable with respect to q, k, v
    (and ``bias``).

    Options (see ``nablax.kernels.library.attention_ext``): ``mask`` (boolean, True where
    attention is allowed, combined with ``causal``) and ``bias`` (added to the scaled scores),
    both broadcastable to ``(batch, heads, seq_q, seq_kv)``; dropout of the probabilities with
    ``dropout_rate`` when a ``dropout_key`` is given; ``k``/``v`` with fewer heads than ``q``
    (grouped-query attention, when the count divides q's); ``layout="bhsd"`` for PyTorch's
    ``(..., heads, seq, head_dim)``. Rows with every key masked give 0.

    >>> import jax, jax.numpy as jnp
    >>> q = jax.random.normal(jax.random.key(0), (1, 6, 2, 8))
    >>> out = attention(q, q, q, causal=True)
    >>> out.shape, bool(jnp.allclose(out, attention_reference(q, q, q, causal=True), atol=1e-5))
    ((1, 6, 2, 8), True)
    >>> kv = q[:, :, :1]  # one kv head shared by both query heads
    >>> attention(q, kv, kv, mask=jnp.ones((6, 6), bool)).shape
    (1, 6, 2, 8)
    """
    from ..executor import default_executor

    # (the kernel's prepare checks the arguments before any config is chosen)
    options = dict(
        mask=mask, bias=bias, dropout_rate=dropout_rate, dropout_key=dropout_key, layout=layout
    )

    return default_executor()(ATTENTION, q, k, v, cfg=cfg, causal=causal, scale=scale, **options)

"""``nn.MultiheadAttention``: PyTorch's module, its fields, initialisation and call.

Weights have PyTorch's names and layouts (``in_proj_weight (3E, E)``, ``in_proj_bias (3E,)``,
``out_proj`` a ``Linear(E, E)``), so a ``torch.nn.MultiheadAttention``'s state dict moves over
unchanged. Without ``need_weights`` the attention is one call of the attention kernel
(``nablax.kernels.library.attention``, one graph node); with it the probabilities are computed
explicitly (as PyTorch does on that path) so they can be returned.
"""

from __future__ import annotations

import math
from typing import Any

from ..core import dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.ops import linalg as _la
from ..core.ops import random as _random
from ..core.tensor import Tensor, to_impl
from ..errors import DTypeError, ShapeError, op_error
from . import functional as F
from ._layers import Linear, _keys, _positive
from ._module import Module, field
from ._sdpa import _cast_for_autocast

_OP = "nn.MultiheadAttention"


def _t(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x))


def _as_bias(m: Tensor, dtype) -> Tensor:
    """A PyTorch module mask as an additive float mask: boolean True → -inf (not allowed)."""
    if m.dtype == dtypes.bool_:
        return _ew.where(m, float("-inf"), 0.0).astype(dtype)
    return m.astype(dtype)


class MultiheadAttention(Module):
    """PyTorch's ``nn.MultiheadAttention``: ``softmax(Q K^T / sqrt(head_dim) + mask) V`` over
    ``num_heads`` heads of ``embed_dim // num_heads`` dims, between an input projection
    (``in_proj_weight``, ``in_proj_bias``) and ``out_proj``.

    Initialisation as PyTorch: ``in_proj_weight`` by ``xavier_uniform_``, ``in_proj_bias`` and
    ``out_proj.bias`` zeros, ``out_proj.weight`` as ``nn.Linear``'s. Called as ``m(query, key,
    value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True,
    is_causal=False, *, dropout_key=None)`` with inputs ``(L, N, E)`` (``(N, L, E)`` when
    ``batch_first``) or unbatched ``(L, E)``; returns ``(output, weights)``, ``weights`` being
    ``(N, L, S)`` (averaged over heads) or ``(N, num_heads, L, S)``, or None without
    ``need_weights``. Boolean masks are True where attention is *not* allowed (PyTorch's module
    convention, the opposite of ``scaled_dot_product_attention``'s); float masks are added.
    ``attn_mask`` is ``(L, S)`` or ``(N * num_heads, L, S)``, ``key_padding_mask`` ``(N, S)``.
    ``is_causal`` is PyTorch's hint: it needs ``attn_mask`` (the causal mask), and without
    ``key_padding_mask`` and ``need_weights`` the kernel's causal mode replaces it. Dropout
    (probability ``dropout``) only with ``dropout_key``.

    >>> import nablax as nx
    >>> from nablax import nn
    >>> m = nn.MultiheadAttention(8, 2, key=nx.random.key(0))
    >>> m.in_proj_weight.shape, m.out_proj.weight.shape
    ((24, 8), (8, 8))
    >>> x = nx.random.normal(nx.random.key(1), (5, 3, 8))  # (L, N, E)
    >>> out, w = m(x, x, x)
    >>> out.shape, w.shape
    ((5, 3, 8), (3, 5, 5))
    >>> m(x, x, x, need_weights=False)[1] is None
    True
    """

    in_proj_weight: Tensor
    in_proj_bias: Tensor | None
    out_proj: Linear
    embed_dim: int = field(static=True)
    num_heads: int = field(static=True)
    dropout: float = field(static=True)
    batch_first: bool = field(static=True)
    head_dim: int = field(static=True)

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        *,
        batch_first: bool = False,
        key=None,
        dtype=None,
    ):
        _positive("MultiheadAttention", embed_dim=embed_dim, num_heads=num_heads)
        if embed_dim % num_heads:
            raise op_error(
                ValueError, _OP, f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}",
                "pick num_heads dividing embed_dim",
            )  # fmt: skip
        if not 0.0 <= dropout <= 1.0:
            raise op_error(ValueError, _OP, f"dropout={dropout} is not in [0, 1]")
        dt = dtype or dtypes.float32
        kw, ko = _keys(key, 2)
        bound = math.sqrt(6.0 / (embed_dim + 3 * embed_dim))  # xavier_uniform_ of (3E, E)
        self.in_proj_weight = _random.uniform(
            kw, (3 * embed_dim, embed_dim), -bound, bound, dtype=dt
        )
        self.in_proj_bias = _cr.zeros((3 * embed_dim,), dtype=dt) if bias else None
        out = Linear(embed_dim, embed_dim, bias=bias, key=ko, dtype=dt)
        self.out_proj = out.replace(bias=_cr.zeros((embed_dim,), dtype=dt)) if bias else out
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.dropout, self.batch_first = float(dropout), bool(batch_first)
        self.head_dim = embed_dim // num_heads

    # -- pieces ---------------------------------------------------------------------------------
    def _project(self, query: Tensor, key: Tensor, value: Tensor) -> tuple:
        e, w, b = self.embed_dim, self.in_proj_weight, self.in_proj_bias
        if query is key and key is value:  # self-attention: one matmul, as PyTorch's packed path
            qkv = F.linear(query, w, b)
            return qkv[..., :e], qkv[..., e : 2 * e], qkv[..., 2 * e :]
        bs = (None, None, None) if b is None else (b[:e], b[e : 2 * e], b[2 * e :])
        ws = (w[:e], w[e : 2 * e], w[2 * e :])
        return tuple(F.linear(x, wi, bi) for x, wi, bi in zip((query, key, value), ws, bs))

    def _masks(self, attn_mask, key_padding_mask, n: int, lq: int, s: int, dtype):
        """``(bool_allowed or None, float_bias or None)``, each broadcastable to (N, H, L, S)."""
        masks = []
        if attn_mask is not None:
            m = _t(attn_mask)
            if m.ndim == 2 and tuple(m.shape) == (lq, s):
                m = m.reshape(1, 1, lq, s)
            elif m.ndim == 3 and tuple(m.shape) == (n * self.num_heads, lq, s):
                m = m.reshape(n, self.num_heads, lq, s)
            else:
                raise op_error(
                    ShapeError, _OP,
                    f"attn_mask must be (L, S) = {(lq, s)} or (N * num_heads, L, S) = "
                    f"{(n * self.num_heads, lq, s)}, got {tuple(m.shape)}",
                    "reshape the mask",
                )  # fmt: skip
            masks.append(m)
        if key_padding_mask is not None:
            m = _t(key_padding_mask)
            if tuple(m.shape) != (n, s):
                raise op_error(
                    ShapeError, _OP,
                    f"key_padding_mask must be (N, S) = {(n, s)} ((S,) unbatched), got "
                    f"{tuple(m.shape)}",
                    "pass one row per batch element, True where a key is padding",
                )  # fmt: skip
            masks.append(m.reshape(n, 1, 1, s))
        for m in masks:
            if not (m.dtype == dtypes.bool_ or dtypes.is_floating(m.dtype)):
                raise op_error(
                    DTypeError, _OP, f"masks must be boolean or floating, got {m.dtype}",
                    "pass a boolean mask (True = not allowed) or a float mask (added)",
                )  # fmt: skip
        if not masks:
            return None, None
        if all(m.dtype == dtypes.bool_ for m in masks):
            blocked = masks[0] if len(masks) == 1 else _ew.logical_or(masks[0], masks[1])
            return _ew.logical_not(blocked), None
        bias = _as_bias(masks[0], dtype)
        if len(masks) == 2:
            bias = bias + _as_bias(masks[1], dtype)
        return None, bias

    # -- call -----------------------------------------------------------------------------------
    def __call__(
        self,
        query,
        key,
        value,
        key_padding_mask=None,
        need_weights: bool = True,
        attn_mask=None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        dropout_key=None,
    ) -> tuple:
        query, key, value = (_t(x) for x in (query, key, value))
        e, h, hd = self.embed_dim, self.num_heads, self.head_dim
        batched = query.ndim == 3
        for name, x in (("query", query), ("key", key), ("value", value)):
            if x.ndim != query.ndim or x.ndim not in (2, 3) or x.shape[-1] != e:
                raise op_error(
                    ShapeError, _OP,
                    f"{name} must be (L, N, E), (N, L, E) with batch_first, or unbatched (L, E) "
                    f"with E = {e}, like query; got query {query.shape}, {name} {x.shape}",
                    "check batch_first and the embedding size",
                )  # fmt: skip
        same = query is key and key is value
        if not batched:
            query, key, value = (x.reshape(1, *x.shape) for x in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = _t(key_padding_mask).reshape(1, -1)
        elif not self.batch_first:
            query, key, value = (x.swapaxes(0, 1) for x in (query, key, value))
        if same:
            key = value = query
        n, lq, s = query.shape[0], query.shape[1], key.shape[1]
        if key.shape[:2] != value.shape[:2] or key.shape[0] != n:
            raise op_error(
                ShapeError, _OP,
                f"key and value need one (N, S) and the query's N, got query {query.shape}, "
                f"key {key.shape}, value {value.shape} (batch first)",
                "check batch_first",
            )  # fmt: skip
        if is_causal and attn_mask is None:
            raise op_error(
                ValueError, _OP, "is_causal=True needs attn_mask (PyTorch's hint convention)",
                "pass attn_mask=nx.triu(nx.ones((L, S), dtype=nx.bool_), 1) with is_causal=True",
            )  # fmt: skip
        q, k, v = self._project(query, key, value)
        q, k, v = (x.reshape(n, x.shape[1], h, hd) for x in (q, k, v))  # (N, L, H, hd)
        causal = bool(is_causal) and key_padding_mask is None and not need_weights
        allowed, bias = self._masks(
            None if causal else attn_mask, key_padding_mask, n, lq, s, q.dtype
        )
        p = self.dropout if dropout_key is not None else 0.0
        if need_weights:
            scores = _la.einsum("nlhd,nshd->nhls", q, k) * (1.0 / math.sqrt(hd))
            if bias is not None:
                scores = scores + bias
            if allowed is not None:
                scores = _ew.where(allowed, scores, float("-inf"))
            weights = F.softmax(scores, dim=-1)
            if p > 0.0:
                weights = F.dropout(weights, p, key=dropout_key)
            attn = _la.einsum("nhls,nshd->nlhd", weights.astype(v.dtype), v)
        else:
            qa, ka, va = _cast_for_autocast(q, k, v)
            attn = _library().attention(
                qa, ka, va, causal=causal, mask=allowed, bias=bias,
                dropout_rate=p, dropout_key=None if p == 0.0 else _t(dropout_key),
            )  # fmt: skip
            weights = None
        out = self.out_proj(attn.reshape(n, lq, e))
        if not batched:
            out = out.reshape(lq, e)
        elif not self.batch_first:
            out = out.swapaxes(0, 1)
        if weights is None:
            return out, None
        if average_attn_weights:
            weights = weights.mean(axis=1)
        if not batched:
            weights = weights.reshape(weights.shape[1:])
        return out, weights


_LIBRARY: Any = None  # nablax.kernels.library, imported at the first call (kernels import late)


def _library() -> Any:
    """``nablax.kernels.library``, imported once (an import statement in ``__call__`` would run
    the import machinery on every call)."""
    global _LIBRARY
    if _LIBRARY is None:
        from ..kernels import library

        _LIBRARY = library
    return _LIBRARY

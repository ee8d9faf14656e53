"""``nn.functional.scaled_dot_product_attention``: PyTorch's function on the attention kernel.

The whole call is one graph node: ``nablax.kernels.library.attention`` in its ``"bhsd"`` layout
(PyTorch's ``(..., heads, seq, head_dim)``) takes the boolean mask, the float mask (as an additive
bias), causality, the scale, grouped-query heads and dropout itself, and the executor picks the
implementation and its tiles (blocked JAX on a CPU; Pallas on a GPU for calls without a mask,
bias or dropout). Its gradient is the kernel's blockwise backward.
"""

from __future__ import annotations

from typing import Any

from .. import _caches
from ..core import dtypes
from ..core.autocast import cast_inputs
from ..core.context import CTX
from ..core.tensor import Tensor, to_impl
from ..errors import DTypeError, ShapeError, op_error

_OP = "nn.functional.scaled_dot_product_attention"


def _t(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor._wrap(to_impl(x))


def _cast_for_autocast(*tensors):
    """q, k, v in the ``nx.autocast`` dtype (attention's op class) when autocast is on."""
    return cast_inputs("attention", *tensors)


def _heads(x: Tensor) -> int:
    return x.shape[-3] if x.ndim >= 3 else 1


def _check_qkv(q: Tensor, k: Tensor, v: Tensor) -> None:
    """Raise the error of the first bad argument (ranks and dtypes, in argument order)."""
    for name, x in (("query", q), ("key", k), ("value", v)):
        if x.ndim < 2:
            raise op_error(
                ShapeError, _OP, f"{name} must have at least 2 dims (..., L, E), got {x.shape}",
                "add a sequence axis",
            )  # fmt: skip
        if not dtypes.is_floating(x.dtype):
            raise op_error(DTypeError, _OP, f"{name} must be floating, got {x.dtype}", "cast it")
    if not (q.dtype == k.dtype == v.dtype):
        raise op_error(
            DTypeError, _OP,
            f"query, key and value must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}",
            "cast them to one dtype, e.g. key.astype(query.dtype)",
        )  # fmt: skip


def scaled_dot_product_attention(
    query,
    key,
    value,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    *,
    dropout_key=None,
) -> Tensor:
    """``softmax(query @ key.T * scale + mask) @ value`` as
    ``torch.nn.functional.scaled_dot_product_attention``, in one graph node.

    Layout ``(..., L, E)`` for ``query``, ``(..., S, E)`` for ``key`` and ``(..., S, Ev)`` for
    ``value`` (``Ev`` may differ from ``E``), with broadcast leading dims (typically ``(N, H)``);
    the result is ``(..., L, Ev)``. ``attn_mask`` broadcasts to ``(..., L, S)``: a boolean mask
    is True where attention is *allowed*; a floating mask is added to the scaled scores (and gets
    a gradient). ``is_causal`` keeps key ``j <= i`` for query ``i``, aligned at the top-left
    (``torch.ones(L, S).tril()``) also when ``L != S``; given together with ``attn_mask`` both
    apply (PyTorch refuses that combination when differentiating; its no-grad result is the
    same). ``scale`` defaults to ``1/sqrt(E)``. With ``enable_gqa`` the key/value head count
    (dim ``-3``) may divide the query's: key head ``j`` serves query heads ``j*g .. j*g+g-1``
    (``repeat_interleave``); without it head counts broadcast as any leading dim. Rows whose every
    key is masked give 0, as PyTorch.

    Dropout of the attention probabilities (kept ones scaled by ``1/(1-dropout_p)``) happens only
    when ``dropout_key`` is given, like ``nn.Dropout``: ``dropout_p > 0`` without a key is the
    identity (evaluation code passes no key). Under ``nx.autocast`` query, key and value are cast
    to the autocast dtype (the kernel accumulates in float32). Differentiable; works under
    ``nx.grad``, ``nx.vmap`` and ``nx.compile``.

    >>> import nablax as nx, nablax.nn.functional as F
    >>> q = nx.random.normal(nx.random.key(0), (2, 4, 5, 8))  # (N, H, L, E)
    >>> kv = nx.random.normal(nx.random.key(1), (2, 2, 7, 8))  # two kv heads: grouped-query
    >>> F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True).shape
    (2, 4, 5, 8)
    >>> allowed = nx.tril(nx.ones((5, 7), dtype=nx.bool_))
    >>> y = F.scaled_dot_product_attention(q, kv, kv, attn_mask=allowed, enable_gqa=True)
    >>> z = F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    >>> float(nx.abs(y - z).max()) < 1e-6
    True
    """
    q, k, v = _t(query), _t(key), _t(value)
    if (
        attn_mask is None and dropout_key is None and not enable_gqa and CTX.autocast is None
        and (scale is None or type(scale) is float)
        and type(dropout_p) in (float, int)
        and _PLAIN_OK.data.get((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype)) is not None
    ):  # fmt: skip
        # the common call (every training step of a transformer): its shapes and dtypes passed
        # the checks below before, and those checks read nothing else
        if not 0.0 <= dropout_p <= 1.0:
            raise op_error(ValueError, _OP, f"dropout_p={dropout_p} is not in [0, 1]")
        causal = bool(is_causal)
        # the shapes, dtypes and options fix the kernel's prepared call (executor.call_known)
        key = (q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype, causal, scale)
        return _executor().call_known(
            _kernel, key, q, k, v, causal=causal, scale=scale, layout="bhsd"
        )
    plain = attn_mask is None and not enable_gqa
    dt = q.dtype
    if not (
        len(q.shape) >= 2 and len(k.shape) >= 2 and len(v.shape) >= 2
        and k.dtype == dt and v.dtype == dt and dtypes.is_floating(dt)
    ):  # fmt: skip
        _check_qkv(q, k, v)
    hq, hk, hv = _heads(q), _heads(k), _heads(v)
    if enable_gqa:
        if hq % hk or hq % hv:
            raise op_error(
                ShapeError, _OP,
                f"with enable_gqa the key/value head counts ({hk}, {hv}; dim -3) must divide the "
                f"query's ({hq}), got query {q.shape}, key {k.shape}, value {v.shape}",
                "give key and value a head count that divides the query's",
            )  # fmt: skip
    elif not hq == hk == hv and any(h not in (1, max(hq, hk, hv)) for h in (hq, hk, hv)):
        raise op_error(
            ShapeError, _OP,
            f"head counts (dim -3) {hq}, {hk}, {hv} of query, key, value do not broadcast",
            "pass enable_gqa=True for grouped-query attention, or match the head counts",
        )  # fmt: skip
    mask = bias = None
    if attn_mask is not None:
        m = _t(attn_mask)
        if m.dtype == dtypes.bool_:
            mask = m
        elif dtypes.is_floating(m.dtype):
            bias = m
        else:
            raise op_error(
                DTypeError, _OP,
                f"attn_mask must be boolean (True = attend) or floating (added), got {m.dtype}",
                "pass mask.astype(nx.bool_) or a float mask",
            )  # fmt: skip
    try:
        p = float(dropout_p)
    except (TypeError, ValueError):
        raise op_error(TypeError, _OP, f"dropout_p must be a number, got {dropout_p!r}") from None
    if not 0.0 <= p <= 1.0:
        raise op_error(ValueError, _OP, f"dropout_p={p} is not in [0, 1]")
    if dropout_key is None or p == 0.0:
        p, dropout_key = 0.0, None
    else:
        dropout_key = _t(dropout_key)
    if scale is not None and isinstance(scale, Tensor):
        raise op_error(
            TypeError, _OP, "scale must be a Python number (a static option), got a Tensor",
            "pass float(scale), or multiply query by a tensor scale instead",
        )  # fmt: skip
    q, k, v = _cast_for_autocast(q, k, v)
    # library.attention's call, with the options left at their defaults left out (the kernel's
    # prepare drops them anyway)
    options: dict = {"causal": bool(is_causal), "scale": scale, "layout": "bhsd"}
    if mask is not None:
        options["mask"] = mask
    if bias is not None:
        options["bias"] = bias
    if dropout_key is not None:
        options["dropout_rate"], options["dropout_key"] = p, dropout_key
    if plain:
        _PLAIN_OK.put((q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype), True)
    return _run(q, k, v, options)


# (query, key, value shapes and dtypes) of calls without a mask and grouped-query heads that
# passed the rank, dtype and head-count checks: those checks depend on nothing else (a plain
# dict read on the hot path: the values are cheap to recompute)
_PLAIN_OK = _caches.DictCache("nn.sdpa_checked_calls", 1024)
# library.ATTENTION and kernels.executor.default_executor, imported at the first call (kernels
# import late; an import statement here would run the import machinery on every call)
_kernel: Any = None
_default_executor: Any = None


def _executor() -> Any:
    """The default kernel executor (``_kernel`` is set once this has run)."""
    global _kernel, _default_executor
    if _default_executor is None:  # set last: a thread that sees it set sees the kernel too
        from ..kernels import library
        from ..kernels.executor import default_executor

        _kernel = library.ATTENTION
        _default_executor = default_executor
    return _default_executor()


def _run(q: Tensor, k: Tensor, v: Tensor, options: dict) -> Tensor:
    return _executor()(_kernel, q, k, v, **options)

"""What the ``attention`` kernel takes beyond ``(q, k, v, causal, scale)``: a boolean ``mask``, an
additive ``bias``, dropout of the probabilities, grouped-query heads and PyTorch's layout.

The kernel's keyword options (all optional; a call without them is the plain kernel, unchanged):

- ``mask``: boolean array, True where a query may attend to a key, broadcastable to
  ``(batch, heads, seq_q, seq_kv)`` (``"bshd"``) or to the output's leading dims + ``(seq_q,
  seq_kv)`` (``"bhsd"``). It is *combined* with ``causal`` (both must allow a pair).
- ``bias``: floating array added to the scaled scores, broadcast like ``mask``; differentiable
  (its gradient is reduced to its own shape). ``-inf`` entries act as a mask.
- ``dropout_rate`` (Python float in ``[0, 1]``) and ``dropout_key`` (a ``uint32`` key, e.g.
  ``nx.random.key(0)``'s data): each probability is dropped with that rate and the kept ones are
  scaled by ``1 / (1 - rate)``, as ``torch.nn.functional.scaled_dot_product_attention`` does.
  The keep pattern is a counter-based hash of ``(key, batch, head, query, key position)``
  (:func:`dropout_keep`), so it does not depend on the tiles and the backward pass regenerates it
  instead of storing it. Without ``dropout_key`` there is no dropout.
- ``layout``: ``"bshd"`` (the kernel's ``(batch, seq, heads, head_dim)``, the default) or
  ``"bhsd"``, PyTorch's ``(..., heads, seq, head_dim)`` with any number of leading dims (a 2-D
  ``(seq, head_dim)`` input has one head), broadcast between ``q``, ``k`` and ``v``.
- Grouped-query heads: ``k`` and ``v`` may have fewer heads than ``q`` when their count divides
  it; kv head ``j`` serves query heads ``j * g .. (j + 1) * g - 1`` (``torch.repeat_interleave``).

Rows whose every key is masked give 0 (PyTorch's result), never NaN.

:func:`plan` works the layout out from the shapes; :func:`to_core` / :func:`from_core` convert to
and from the kernel's core layout (``(B, S, H, D)`` with equal heads, a 4-D mask and bias), all in
plain JAX, so the gradients of the conversions come from ``jax.vjp``.

>>> import jax.numpy as jnp
>>> p = plan((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 3), (5, 7), None, "bhsd")
>>> p.core_q, p.core_kv, p.out_shape, p.mask4
((2, 5, 4, 8), (2, 7, 4, 8), (2, 4, 5, 3), (1, 1, 5, 7))
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from ... import _caches
from ...errors import DTypeError, ShapeError, describe

API = "nablax.kernels.library.attention"
LAYOUTS = ("bshd", "bhsd")
DEFAULTS: dict[str, Any] = {
    "mask": None,
    "bias": None,
    "dropout_rate": 0.0,
    "dropout_key": None,
    "layout": "bshd",
}


def split_options(kw: dict) -> tuple[dict, dict]:
    """``(base, extra)``: ``causal``/``scale`` and the extra options that differ from defaults.

    >>> split_options({"causal": True, "mask": None, "layout": "bhsd"})
    ({'causal': True}, {'layout': 'bhsd'})
    """
    base, extra = {}, {}
    for k, v in kw.items():
        if k not in DEFAULTS:
            base[k] = v
        elif not (
            v is None or (k == "dropout_rate" and v == 0.0) or (k == "layout" and v == "bshd")
        ):
            extra[k] = v
    if "dropout_key" not in extra:  # dropout only with a key (as nn.Dropout)
        extra.pop("dropout_rate", None)
    elif "dropout_rate" not in extra:
        extra.pop("dropout_key")
    return base, extra


@dataclasses.dataclass(frozen=True)
class Plan:
    """Static layout of one call (see :func:`plan`)."""

    layout: str
    batch: tuple  # leading batch dims of the broadcast result ("bhsd"), or (B,)
    heads: int
    core_q: tuple  # (B, Sq, H, D)
    core_kv: tuple  # (B, Skv, H, D) of k (v has Dv)
    dv: int
    out_shape: tuple
    mask4: tuple | None
    bias4: tuple | None


def _fail(msg: str, seen: str, fix: str) -> ShapeError:
    return ShapeError(f"{API}: {msg}, got {seen}. Fix: {fix}")


def _group(h: int, heads: int, name: str, seen: str) -> None:
    if heads % h:
        raise _fail(
            f"{name} has {h} heads, which does not divide the {heads} query heads",
            seen,
            "give k and v a head count that divides q's (grouped-query attention)",
        )


_plans = _caches.Cache("kernels.attention_plans", 1024)


def plan(qs: tuple, ks: tuple, vs: tuple, ms: tuple | None, bs: tuple | None, layout: str) -> Plan:
    """The core shapes of a call from the argument shapes (``ms``/``bs``: mask/bias or None);
    memoized in a registered cache (``nx.clear_caches()`` empties it)."""
    key = (qs, ks, vs, ms, bs, layout)
    return _plans.get_or_make(key, lambda: _plan(qs, ks, vs, ms, bs, layout))


def _plan(qs: tuple, ks: tuple, vs: tuple, ms: tuple | None, bs: tuple | None, layout: str) -> Plan:
    seen = f"q{qs}, k{ks}, v{vs}" + (f", mask{ms}" if ms else "") + (f", bias{bs}" if bs else "")
    if layout == "bshd":
        if not (len(qs) == len(ks) == len(vs) == 4):
            raise _fail("q, k, v must be 4-D (batch, seq, heads, head_dim)", seen, "add axes")
        (b, sq, h, d), (bk, skv, hk, dk), (bv, sv, hv, dv) = qs, ks, vs
        if not (b == bk == bv and skv == sv and d == dk):
            raise _fail(
                "shapes disagree: q, k, v need one batch, k and v one seq, q and k one head_dim",
                seen,
                "transpose to (batch, seq, heads, head_dim)",
            )
        _group(hk, h, "k", seen)
        _group(hv, h, "v", seen)
        batch, heads, out = (b,), h, (b, sq, h, dv)
        full = (b, h, sq, skv)
    elif layout == "bhsd":
        if min(len(qs), len(ks), len(vs)) < 2:
            raise _fail("q, k, v need at least 2 dims (seq, head_dim)", seen, "add axes")
        nd = max(3, len(qs), len(ks), len(vs))
        q3, k3, v3 = ((1,) * (nd - len(s)) + tuple(s) for s in (qs, ks, vs))
        sq, d = q3[-2:]
        (skv, dk), (sv, dv) = k3[-2:], v3[-2:]
        if skv != sv or d != dk:
            raise _fail("k and v need one seq, q and k one head_dim", seen, "check the layout")
        try:
            batch = tuple(np.broadcast_shapes(q3[:-3], k3[:-3], v3[:-3]))
        except ValueError:
            raise _fail("the leading dims do not broadcast", seen, "match them") from None
        heads = max(q3[-3], k3[-3], v3[-3])
        if q3[-3] not in (1, heads):
            raise _fail("q has fewer heads than k or v", seen, "give q at least k's heads")
        _group(k3[-3], heads, "k", seen)
        _group(v3[-3], heads, "v", seen)
        lead = (*batch, heads)
        out = (*lead[len(lead) - (max(len(qs), len(ks), len(vs)) - 2) :], sq, dv)
        b = math.prod(batch)
        full = (*batch, heads, sq, skv)
    else:
        raise ValueError(f"{API}: layout must be one of {LAYOUTS}, got {layout!r}")
    if min(sq, skv, d) < 1:
        raise _fail("seq and head_dim must be at least 1", seen, "pass non-empty arrays")
    return Plan(
        layout, batch, heads, (b, sq, heads, d), (b, skv, heads, d), dv, out,
        *(_plan4(s, full, layout, n, seen) for s, n in ((ms, "mask"), (bs, "bias"))),
    )  # fmt: skip


def _plan4(s: tuple | None, full: tuple, layout: str, name: str, seen: str) -> tuple | None:
    """The 4-D ``(b', h', Sq', Skv')`` shape of a mask/bias (each dim 1 or full)."""
    if s is None:
        return None
    if len(s) > len(full) or any(a not in (1, f) for a, f in zip(s[::-1], full[::-1])):
        raise _fail(
            f"{name} must broadcast to {full} (batch..., heads, seq_q, seq_kv)",
            seen,
            f"give {name} shape (seq_q, seq_kv) or one that broadcasts to {full}",
        )
    s = (1,) * (len(full) - len(s)) + tuple(s)
    if layout == "bshd":
        return s
    bdims = s[:-3]
    return (1 if all(x == 1 for x in bdims) else math.prod(full[:-3]), *s[-3:])


def to_core(p: Plan, q, k, v, mask=None, bias=None) -> tuple:
    """``(q4, k4, v4, mask4, bias4)`` in the core layout (plain JAX; differentiable)."""

    def bhsd(x, h_to):
        nd = len(p.batch) + 3
        x = x.reshape((1,) * (nd - x.ndim) + x.shape)
        x = jnp.broadcast_to(x, (*p.batch, *x.shape[-3:]))
        x = x.reshape(-1, *x.shape[-3:])
        if x.shape[1] != h_to:
            x = jnp.repeat(x, h_to // x.shape[1], axis=1)
        return x.transpose(0, 2, 1, 3)

    if p.layout == "bhsd":
        q, k, v = (bhsd(x, p.heads) for x in (q, k, v))
    else:
        k, v = (
            x if x.shape[2] == p.heads else jnp.repeat(x, p.heads // x.shape[2], 2) for x in (k, v)
        )
    return q, k, v, _four(p, mask, p.mask4), _four(p, bias, p.bias4)


def _four(p: Plan, x, shape4):
    if x is None:
        return None
    full = (*p.batch, p.heads, *p.core_q[1:2], p.core_kv[1]) if p.layout == "bhsd" else None
    if full is not None:
        nd = len(full)
        x = x.reshape((1,) * (nd - x.ndim) + x.shape)
        if shape4[0] != 1:
            x = jnp.broadcast_to(x, (*p.batch, *x.shape[-3:]))
    return x.reshape(shape4)


def from_core(p: Plan, out4):
    """The output in the call's layout from the core ``(B, Sq, H, Dv)``."""
    if p.layout == "bshd":
        return out4
    return out4.transpose(0, 2, 1, 3).reshape(p.out_shape)


def out_to_core(p: Plan, y):
    """Inverse of :func:`from_core` (for the output and its cotangent)."""
    if p.layout == "bshd":
        return y
    b, sq, h, _ = p.core_q
    return y.reshape(b, h, sq, p.dv).transpose(0, 2, 1, 3)


def resolve_scale(scale: Any, head_dim: int) -> float:
    """``scale`` as a Python float; ``None`` means ``1/sqrt(head_dim)``.

    >>> resolve_scale(None, 16), resolve_scale(2, 16)
    (0.25, 2.0)
    """
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        return float(scale)
    except (TypeError, jax.errors.ConcretizationTypeError):
        raise TypeError(
            f"{API}: scale must be a Python number (it is a static option), got "
            f"{describe(scale)}. Fix: pass float(scale), or multiply q by a traced scale instead"
        ) from None


# -- dropout ---------------------------------------------------------------------------------------
def _mix(x):
    """A 32-bit integer finalizer (lowbias32): every input bit affects every output bit."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def _bits(seed, b, h, q, k):
    x = jnp.uint32(0x9E3779B9)
    for w in range(seed.shape[0]):
        x = _mix(x ^ seed[w])
    for idx in (b, h, q, k):
        x = _mix(x ^ (idx.astype(jnp.uint32) + jnp.uint32(0x9E3779B9) + (x << 6) + (x >> 2)))
    return x


def keep_scale(seed, rate: float, bidx, hidx, qidx, kidx, dtype):
    """``0`` for dropped, ``1/(1-rate)`` for kept entries at the given (broadcast) positions."""
    if rate >= 1.0:
        return jnp.zeros(
            jnp.broadcast_shapes(bidx.shape, hidx.shape, qidx.shape, kidx.shape), dtype
        )
    thr = jnp.uint32(min(int(round(rate * 2.0**32)), 2**32 - 1))
    keep = _bits(seed, bidx, hidx, qidx, kidx) >= thr
    return jnp.where(keep, jnp.asarray(1.0 / (1.0 - rate), dtype), jnp.asarray(0.0, dtype))


def seed_words(key) -> jax.Array:
    """A dropout key as a flat ``uint32`` vector (typed JAX keys are unwrapped).

    >>> seed_words(jax.random.key(0)).dtype
    dtype('uint32')
    """
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.key_data(key)
    if key.dtype != jnp.uint32 or key.ndim != 1:
        raise DTypeError(
            f"{API}: dropout_key must be a random key (uint32 key data of shape (2,), e.g. "
            f"nx.random.key(0)), got {describe(key)}. Fix: pass nx.random.key(seed)"
        )
    return key


def dropout_keep(key, rate: float, shape4: tuple, dtype=jnp.float32) -> jax.Array:
    """The whole ``(B, H, Sq, Skv)`` dropout scale the kernel applies (for tests and references).

    >>> import jax
    >>> z = dropout_keep(jax.random.key_data(jax.random.key(0)), 0.25, (1, 2, 64, 64))
    >>> sorted({float(x) for x in z.ravel().tolist()}), 0.2 < float((z == 0).mean()) < 0.3
    ([0.0, 1.3333333730697632], True)
    """
    bi, hi, qi, ki = (
        jnp.arange(n).reshape([n if a == i else 1 for a in range(4)]) for i, n in enumerate(shape4)
    )
    return keep_scale(seed_words(key), rate, bi, hi, qi, ki, dtype)


# -- tiles -----------------------------------------------------------------------------------------
def _pad_to(x, axis: int, n: int, fill):
    if x.shape[axis] == 1 or x.shape[axis] == n:
        return x
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, n - x.shape[axis])
    return jnp.pad(x, pad, constant_values=fill)


def _slice(x, i, j, bq: int, bkv: int):
    if x.shape[2] != 1:
        x = lax.dynamic_slice_in_dim(x, i * bq, bq, axis=2)
    if x.shape[3] != 1:
        x = lax.dynamic_slice_in_dim(x, j * bkv, bkv, axis=3)
    return x


@dataclasses.dataclass
class Extras:
    """The padded mask/bias and dropout seed of one core call, with the per-tile pieces."""

    mask: Any  # bool (b', h', Sq'|pad, Skv'|pad) or None
    bias: Any  # float, same, or None
    seed: Any  # uint32 words or None
    rate: float
    bq: int
    bkv: int

    @classmethod
    def build(cls, extras: tuple, sq: int, skv: int, bq: int, bkv: int, ct) -> Extras | None:
        """From ``(mask4, bias4, dropout_key, dropout_rate)`` for tiles of ``bq x bkv``."""
        mask, bias, key, rate = extras
        if mask is None and bias is None and key is None:
            return None
        sqp, skvp = -(-sq // bq) * bq, -(-skv // bkv) * bkv
        if mask is not None:
            mask = _pad_to(_pad_to(mask.astype(bool), 2, sqp, False), 3, skvp, False)
        if bias is not None:
            bias = _pad_to(_pad_to(bias.astype(ct), 2, sqp, 0.0), 3, skvp, 0.0)
        seed = None if key is None else seed_words(key)
        return cls(mask, bias, seed, float(rate), bq, bkv)

    def scores(self, s, visible, i, j):
        """``(s + bias tile, visible & mask tile)``."""
        if self.bias is not None:
            s = s + _slice(self.bias, i, j, self.bq, self.bkv)
        if self.mask is not None:
            visible = visible & _slice(self.mask, i, j, self.bq, self.bkv)
        return s, visible

    def dropout(self, i, j, b: int, h: int, dtype):
        """The tile's ``(B, H, bq, bkv)`` dropout scale, or None without dropout."""
        if self.seed is None:
            return None
        bi = jnp.arange(b).reshape(b, 1, 1, 1)
        hi = jnp.arange(h).reshape(1, h, 1, 1)
        qi = (i * self.bq + jnp.arange(self.bq)).reshape(1, 1, self.bq, 1)
        ki = (j * self.bkv + jnp.arange(self.bkv)).reshape(1, 1, 1, self.bkv)
        return keep_scale(self.seed, self.rate, bi, hi, qi, ki, dtype)

    def dbias_zeros(self):
        return None if self.bias is None else jnp.zeros_like(self.bias)

    def add_dbias(self, db, ds, i, j):
        """``db`` plus the tile's score gradient reduced to the bias' broadcast shape."""
        if db is None:
            return None
        axes = tuple(a for a in range(4) if db.shape[a] == 1 and ds.shape[a] != 1)
        g = ds.sum(axes, keepdims=True) if axes else ds
        start = (
            0,
            0,
            i * self.bq if db.shape[2] != 1 else 0,
            j * self.bkv if db.shape[3] != 1 else 0,
        )
        cur = lax.dynamic_slice(db, start, g.shape)
        return lax.dynamic_update_slice(db, cur + g.astype(db.dtype), start)

    def crop_dbias(self, db, sq: int, skv: int):
        if db is None:
            return None
        return db[:, :, : (sq if db.shape[2] != 1 else 1), : (skv if db.shape[3] != 1 else 1)]


# -- the kernel's path with extra options ----------------------------------------------------------
def core_call(q, k, v, *, causal, scale, cfg, mask=None, bias=None, dropout_key=None,
              dropout_rate=0.0, layout="bshd"):  # fmt: skip
    """``(plan, (q4, k4, v4), extras or None, scale, sq, skv)`` of a call with extra options."""
    p = plan(
        tuple(q.shape), tuple(k.shape), tuple(v.shape),
        None if mask is None else tuple(mask.shape), None if bias is None else tuple(bias.shape),
        layout,
    )  # fmt: skip
    q4, k4, v4, m4, b4 = to_core(p, q, k, v, mask, bias)
    extras = None
    if m4 is not None or b4 is not None or dropout_key is not None:
        extras = (m4, b4, dropout_key, dropout_rate)
    return p, (q4, k4, v4), extras, resolve_scale(scale, p.core_q[3])


def general_forward(q, k, v, *, core_fn, blocked_fn, cfg, causal, scale, **ext):
    """``(out, lse)``: the options applied around ``core_fn`` (blocked JAX or Pallas), or
    ``blocked_fn`` (``attention.blocked_forward``) whenever there is a mask, a bias or dropout.
    (The kernel module passes its functions in: this lower module never imports it.)"""
    p, (q4, k4, v4), extras, s = core_call(q, k, v, causal=causal, scale=scale, cfg=cfg, **ext)
    if extras is not None:
        out4, lse = blocked_fn(q4, k4, v4, scale=s, causal=causal, cfg=cfg, extras=extras)
    else:
        out4, lse = core_fn(q4, k4, v4, scale=s, causal=causal, cfg=cfg)
    return from_core(p, out4), lse


def general_vjp(lse, y, dy, q, k, v, *, fns, cfg, causal, scale, core=None, **ext) -> tuple:
    """``(dq, dk, dv)`` (plus ``{"bias": dbias}`` with a bias): the backward in the core layout,
    pulled back through the layout conversion by ``jax.vjp``. ``fns``: the kernel module's
    ``(blocked_forward, blocked_backward)``, used with a mask, bias or dropout; ``core``: the
    config's implementation ``(forward, backward)`` for the other calls (None: ``fns``)."""
    blocked_forward, blocked_backward = fns
    p, _, extras, s = core_call(q, k, v, causal=causal, scale=scale, cfg=cfg, **ext)
    fwd, bwd = fns if extras is not None or core is None else core
    bias = ext.get("bias")
    if bias is None:
        (q4, k4, v4), pull = jax.vjp(lambda q, k, v: to_core(p, q, k, v)[:3], q, k, v)
    else:
        (q4, k4, v4, b4), pull = jax.vjp(
            lambda q, k, v, b: (*to_core(p, q, k, v)[:3], _four(p, b, p.bias4)), q, k, v, bias
        )
    out4, dy4 = out_to_core(p, y), out_to_core(p, dy)
    if y is None or (lse is None and getattr(bwd, "needs_lse", True)):
        fwd_all = functools.partial(
            general_forward, core_fn=fwd, blocked_fn=blocked_forward, cfg=cfg, causal=causal,
        )  # fmt: skip
        y, lse = fwd_all(q, k, v, scale=scale, **ext)
        out4 = out_to_core(p, y)
    if extras is not None:
        g = bwd(q4, k4, v4, out4, lse, dy4, scale=s, causal=causal, cfg=cfg, extras=extras)
    else:
        g = bwd(q4, k4, v4, out4, lse, dy4, scale=s, causal=causal, cfg=cfg)
    if bias is None:
        return tuple(pull(tuple(g[:3])))
    dq, dk, dv, db = pull(tuple(g[:3]) + (g[3],))
    return dq, dk, dv, {"bias": db}


_DTYPES_OK = _caches.Cache("kernels.attention_dtypes", 256)  # dtype combinations that passed


def _check_dtypes(q, k, v, mask, bias) -> None:
    dts = {np.dtype(x.dtype) for x in (q, k, v)}
    if len(dts) != 1 or not jnp.issubdtype(next(iter(dts)), jnp.floating):
        raise DTypeError(
            f"{API}: q, k, v must share one floating dtype, got q={describe(q)}, k={describe(k)}, "
            f"v={describe(v)}. Fix: cast them, e.g. k.astype(q.dtype)"
        )
    if mask is not None and np.dtype(mask.dtype) != np.bool_:
        raise DTypeError(
            f"{API}: mask must be boolean (True where attention is allowed), got "
            f"{describe(mask)}. Fix: pass a float mask as bias= instead"
        )
    if bias is not None and not jnp.issubdtype(np.dtype(bias.dtype), jnp.floating):
        raise DTypeError(f"{API}: bias must be floating, got {describe(bias)}. Fix: cast it")


# (layout, shapes and dtypes of q, k, v, mask, bias) -> (seq_q, seq_kv, head_dim) of calls
# without dropout that passed every check: what check_options reads of such a call, all of it
_CHECKED_OPTIONS = _caches.Cache("kernels.attention_checked_options", 1024)


def _options_key(q, k, v, ext: dict) -> tuple | None:
    """The memo key of a call without dropout whose arrays have plain shapes and numpy dtypes;
    None for any other call (it is checked in full every time)."""
    if "dropout_key" in ext or "dropout_rate" in ext:
        return None
    mask, bias = ext.get("mask"), ext.get("bias")
    try:
        key = (
            ext.get("layout", "bshd"), len(ext),
            q.shape, k.shape, v.shape, q.dtype, k.dtype, v.dtype,
            None if mask is None else (mask.shape, mask.dtype),
            None if bias is None else (bias.shape, bias.dtype),
        )  # fmt: skip
    except AttributeError:
        return None
    for x in (q, k, v, mask, bias):
        if x is not None and not (type(x.shape) is tuple and isinstance(x.dtype, np.dtype)):
            return None
    return key


def check_options(q, k, v, ext: dict) -> tuple[dict, int, int, int]:
    """Validate the extra options; ``(normalized options, seq_q, seq_kv, head_dim)``.

    A call without dropout is a function of its layout, shapes and dtypes: the result of one
    that passed is remembered (a failing call is never stored, and raises every time)."""
    okey = _options_key(q, k, v, ext)
    if okey is not None:
        hit = _CHECKED_OPTIONS.get(okey)
        if hit is not None:
            return (dict(ext), *hit)
    out = _check_options(q, k, v, ext)
    if okey is not None:
        _CHECKED_OPTIONS.put(okey, out[1:])
    return out


def _check_options(q, k, v, ext: dict) -> tuple[dict, int, int, int]:
    ext = dict(ext)
    layout = ext.get("layout", "bshd")
    if layout not in LAYOUTS:
        raise ValueError(f"{API}: layout must be one of {LAYOUTS}, got {layout!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not (hasattr(x, "shape") and hasattr(x, "dtype")):
            raise TypeError(f"{API}: argument {name} must be an array, got {describe(x)}")
    mask, bias = ext.get("mask"), ext.get("bias")
    dkey = (
        q.dtype, k.dtype, v.dtype,
        None if mask is None else mask.dtype, None if bias is None else bias.dtype,
    )  # fmt: skip
    if not all(d is None or isinstance(d, np.dtype) for d in dkey):
        dkey = None  # not plain dtypes: checked below every time
    if dkey is None or _DTYPES_OK.get(dkey) is None:
        _check_dtypes(q, k, v, mask, bias)
        if dkey is not None:
            _DTYPES_OK.put(dkey, True)  # only combinations that passed are remembered
    if "dropout_rate" in ext:
        rate = ext["dropout_rate"]
        try:
            rate = float(rate)
        except (TypeError, jax.errors.ConcretizationTypeError):
            raise TypeError(
                f"{API}: dropout_rate must be a Python number (a static option), got "
                f"{describe(rate)}"
            ) from None
        if not 0.0 <= rate <= 1.0:
            raise ValueError(f"{API}: dropout_rate={rate} is not in [0, 1]")
        ext["dropout_rate"] = rate
    key = ext.get("dropout_key")
    if key is not None and jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        ext["dropout_key"] = key = jax.random.key_data(key)
    if key is not None and (np.dtype(key.dtype) != np.uint32 or len(key.shape) != 1):
        seed_words(key)  # raises with the message
    p = plan(
        tuple(q.shape), tuple(k.shape), tuple(v.shape),
        None if mask is None else tuple(mask.shape), None if bias is None else tuple(bias.shape),
        layout,
    )  # fmt: skip
    return ext, p.core_q[1], p.core_kv[1], p.core_q[3]


def seq_lens(args: tuple, kw: dict) -> tuple[int, int]:
    """``(seq_q, seq_kv)`` of a prepared call in either layout."""
    q, k = args[0], args[1]
    if kw.get("layout", "bshd") == "bhsd":
        return q.shape[-2], k.shape[-2]
    return q.shape[1], k.shape[1]

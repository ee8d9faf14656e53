"""Small kernels shared by the kernel-layer tests."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from nablax.kernels import Kernel


@dataclasses.dataclass(frozen=True)
class Reps:
    n: int


class Repeat(Kernel):
    """``tanh(x @ w)`` applied ``cfg.n`` times: configs differ in cost by their ``n``. Its math is
    the same for every config only when w is the identity (the tests use it for timing only)."""

    def run(self, x, w, *, cfg):
        def body(_, y):
            return jnp.tanh(y @ w)

        return jax.lax.fori_loop(0, cfg.n, body, x)

    def heuristic_cfg(self, inv):
        return Reps(3)

    def candidate_cfgs(self, inv):
        return [Reps(300), Reps(3), Reps(30)]


@dataclasses.dataclass(frozen=True)
class Unroll:
    k: int = 1


class Affine(Kernel):
    """``scale * (x @ w) + bias`` with a hand-written vjp; ``idx`` (int array) gets no gradient
    (``None``), ``scale`` is static, ``bias`` a keyword array with its gradient in the dict."""

    def run(self, x, w, idx, *, cfg, scale=1.0, bias=None):
        y = scale * (x @ w) + idx.astype(x.dtype)[:, None] * 0.0
        return y if bias is None else y + bias

    def fwd_with_residuals(self, x, w, idx, *, cfg, scale=1.0, bias=None):
        return self.run(x, w, idx, cfg=cfg, scale=scale, bias=bias), (x, w)

    def vjp(self, res, y, dy, x, w, idx, *, cfg, scale=1.0, bias=None):
        x, w = res
        grads = (scale * dy @ w.T, scale * x.T @ dy, None)
        if bias is None:
            return grads
        return grads + ({"bias": dy.sum(0) if bias.ndim == 1 else dy},)

    def heuristic_cfg(self, inv):
        return Unroll()


def affine_reference(x, w, idx, scale=1.0, bias=None):
    y = scale * (x @ w)
    return y if bias is None else y + bias

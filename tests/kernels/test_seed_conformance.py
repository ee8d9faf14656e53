"""A kernel written the way ejKernel kernels are written runs unchanged on nablax.kernels.

``RMSNorm`` below is a tensor-parallel RMS norm in the seed's style: a string ``version``, the op
id passed to ``super().__init__(op_id=...)``, ``prepare`` filling defaults, ``run(..., cfg)`` with
``cfg`` as a plain parameter, ``fwd_with_residuals`` / ``vjp(residuals, y, dy, *args, cfg,
**kwargs)``, ``run_shard_map`` / ``fwd_with_residuals_shard_map`` / ``vjp_shard_map`` for a hidden
axis sharded over a mesh axis, and the seed's call keywords (``stamp=``, ``check_vma=``, ``_cfg=``,
``AutotunePolicy(cache_miss_fallback="heuristics")``). It goes through the selection chain, grad
and ``Executor.compile``, compared with a plain jnp reference and ``jax.grad``; the sharded cases
also run on 8 virtual devices in a fresh process (``python test_seed_conformance.py``)."""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Invocation,
    Kernel,
    PersistentCache,
    Tuner,
    device_fingerprint,
    policy_override,
)

TOL = dict(rtol=2e-5, atol=2e-5)


# ---- the ported kernel (seed style) -------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RMSNormConfig:
    block_rows: int = 8
    platform: str = "xla"
    backend: str = "any"


def _sum_squares(x, block_rows):
    """Row sums of x**2, computed ``block_rows`` rows at a time (the tunable part)."""
    d = x.shape[-1]
    rows = x.reshape(-1, d)
    n = rows.shape[0]
    pad = (-n) % block_rows
    blocks = jnp.pad(rows, ((0, pad), (0, 0))).reshape(-1, block_rows, d)
    ss = jax.lax.map(lambda b: jnp.sum(b * b, axis=-1), blocks).reshape(-1)[:n]
    return ss.reshape(x.shape[:-1] + (1,))


class RMSNorm(Kernel[RMSNormConfig, jax.Array]):
    version = "1"

    def __init__(self):
        super().__init__(op_id="rms_norm")

    def prepare(self, x, weight, eps=1e-6, axis_name=None):
        return (x, weight), {"eps": float(eps), "axis_name": axis_name}

    # -- single device
    def run(self, x, weight, cfg: RMSNormConfig, eps=1e-6, axis_name=None):
        return self.fwd_with_residuals(x, weight, cfg=cfg, eps=eps)[0]

    def fwd_with_residuals(self, x, weight, cfg: RMSNormConfig, eps=1e-6, axis_name=None):
        rstd = jax.lax.rsqrt(_sum_squares(x, cfg.block_rows) / x.shape[-1] + eps)
        return x * rstd * weight, (x, weight, rstd)

    def vjp(self, residuals, y, dy, *args, cfg: RMSNormConfig, **kwargs):
        x, weight, rstd = residuals
        g = dy * weight
        dot = jnp.sum(g * x, axis=-1, keepdims=True)
        dx = rstd * g - x * rstd**3 * dot / x.shape[-1]
        dw = jnp.sum((dy * x * rstd).reshape(-1, x.shape[-1]), axis=0)
        return dx, dw

    # -- hidden axis sharded over `axis_name` (inside jax.shard_map)
    def run_shard_map(self, x, weight, cfg: RMSNormConfig, eps=1e-6, axis_name=None):
        return self.fwd_with_residuals_shard_map(x, weight, cfg=cfg, eps=eps, axis_name=axis_name)[
            0
        ]

    def fwd_with_residuals_shard_map(self, x, weight, cfg, eps=1e-6, axis_name=None):
        ss = jax.lax.psum(_sum_squares(x, cfg.block_rows), axis_name)
        d = jax.lax.psum(x.shape[-1], axis_name)
        rstd = jax.lax.rsqrt(ss / d + eps)
        return x * rstd * weight, (x, weight, rstd)

    def vjp_shard_map(self, residuals, y, dy, *args, cfg, axis_name=None, **kwargs):
        x, weight, rstd = residuals
        g = dy * weight
        dot = jax.lax.psum(jnp.sum(g * x, axis=-1, keepdims=True), axis_name)
        d = jax.lax.psum(x.shape[-1], axis_name)
        dx = rstd * g - x * rstd**3 * dot / d
        dw = jnp.sum((dy * x * rstd).reshape(-1, x.shape[-1]), axis=0)
        return dx, dw

    # -- configs
    def heuristic_cfg(self, inv) -> RMSNormConfig:
        rows = math.prod(inv.args[0].shape[:-1])
        return RMSNormConfig(block_rows=min(8, rows))

    def candidate_cfgs(self, inv):
        rows = math.prod(inv.args[0].shape[:-1])
        return [RMSNormConfig(block_rows=b) for b in (1, 4, 16) if b <= rows]


RMS = RMSNorm()


def rms_reference(x, w, eps=1e-6):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _data(rows=6, d=16, seed=0):
    rng = np.random.default_rng(seed)
    x = jnp.asarray(rng.standard_normal((2, rows, d)), jnp.float32)
    w = jnp.asarray(1.0 + 0.1 * rng.standard_normal((d,)), jnp.float32)
    ct = jnp.asarray(rng.standard_normal((2, rows, d)), jnp.float32)
    return x, w, ct


def _grads(fn, x, w, ct):
    return jax.grad(lambda a, b: jnp.sum(fn(a, b) * ct), argnums=(0, 1))(x, w)


def _close(got, want):
    for g, r in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), **TOL)


# ---- the checks (shared by the in-process tests and the 8-device script) -----------------------


def check_sharded(executor, mesh, axis="tp"):
    """Values and gradients of the run_shard_map path equal the reference, for both check_vma
    settings, directly and through jax.jit; the call goes through the chain like any other."""
    x, w, ct = _data(d=8 * mesh.shape[axis])
    spec = _sharded(mesh, axis)
    want = rms_reference(x, w, 1e-5)
    want_g = _grads(lambda a, b: rms_reference(a, b, 1e-5), x, w, ct)
    for check_vma in (False, True):

        def f(a, b, cv=check_vma):
            return executor(RMS, a, b, eps=1e-5, axis_name=axis, check_vma=cv, **spec)

        _close(f(x, w), want)
        _close(_grads(f, x, w, ct), want_g)
        _close(jax.jit(lambda a, b, f=f: _grads(f, a, b, ct))(x, w), want_g)
    compiled = executor.compile(RMS, x, w, eps=1e-5, axis_name=axis, **spec)
    _close(compiled(x, w, eps=1e-5, axis_name=axis), want)
    _close(_grads(lambda a, b: compiled(a, b, eps=1e-5, axis_name=axis), x, w, ct), want_g)
    return compiled.cfg


def _sharded(mesh, axis="tp"):
    return dict(
        method="shard_map",
        mesh=mesh,
        in_specs=(P(None, None, axis), P(axis)),
        out_specs=P(None, None, axis),
    )


def _chain(store, fallback="heuristics"):
    policy = AutotunePolicy(allow_autotune=True, cache_miss_fallback=fallback)
    return ConfigSelectorChain(ConfigCache(), policy, Tuner(warmup=1, iters=3), store)


# ---- in-process tests (one real device) --------------------------------------------------------


def test_ported_kernel_ids_and_the_chain(tmp_path):
    store = PersistentCache(tmp_path / "k.sqlite")
    selector = _chain(store)
    executor = Executor(selector)
    x, w, _ = _data()
    assert RMS.versioned_id == "rms_norm@v1"
    _close(executor(RMS, x, w, eps=1e-5), rms_reference(x, w, 1e-5))
    # "heuristics" (the seed's default fallback) took the heuristic although tuning is allowed
    inv = Invocation(op_id=RMS.op_id, args=(x, w), kwargs={"eps": 1e-5, "axis_name": None})
    key = (
        device_fingerprint(),
        "rms_norm@v1",
        Invocation("rms_norm@v1", (x, w), inv.kwargs).call_key,
    )
    assert store.get_entry(*key).source == "heuristic"
    assert selector.choose(inv, RMS) == RMSNormConfig(block_rows=8)  # unversioned op id accepted
    # the seed's policy_override spelling: autotune this scope; the tuner times real candidates
    x2, w2, _ = _data(rows=8, seed=1)
    with policy_override(selector, cache_miss_fallback="autotune"):
        tuned = executor.choose_config(RMS, x2, w2, eps=1e-5)
    inv2 = Invocation("rms_norm@v1", (x2, w2), {"eps": 1e-5, "axis_name": None})
    entry = store.get_entry(device_fingerprint(), "rms_norm@v1", inv2.call_key)
    assert entry.source == "autotune" and entry.cfg == tuned
    assert len(entry.timings) == 4  # 3 candidates + the heuristic's config (the baseline)
    assert all(math.isfinite(t[1]) and t[1] > 0 for t in entry.timings)
    # the seed's _cfg= keyword: this call only, stored nowhere
    before = len(store)
    out = executor(RMS, x2, w2, eps=1e-5, _cfg=RMSNormConfig(block_rows=2), stamp=False)
    _close(out, rms_reference(x2, w2, 1e-5))
    assert len(store) == before
    store.close()


def test_ported_kernel_grad_and_compile():
    executor = Executor(_chain(False))
    x, w, ct = _data()
    want = _grads(lambda a, b: rms_reference(a, b, 1e-5), x, w, ct)
    _close(_grads(lambda a, b: executor(RMS, a, b, eps=1e-5), x, w, ct), want)
    _close(
        jax.jit(lambda a, b: _grads(lambda p, q: executor(RMS, p, q, eps=1e-5), a, b, ct))(x, w),
        want,
    )
    compiled = executor.compile(RMS, x, w, eps=1e-5)
    assert compiled.cfg == RMSNormConfig(block_rows=8)
    x3, w3, ct3 = _data(seed=3)
    _close(compiled(x3, w3, eps=1e-5), rms_reference(x3, w3, 1e-5))
    want3 = _grads(lambda a, b: rms_reference(a, b, 1e-5), x3, w3, ct3)
    _close(_grads(lambda a, b: compiled(a, b, eps=1e-5), x3, w3, ct3), want3)
    # nablax Tensors: one graph node, differentiated through the kernel's vjp
    import nablax as nx

    got = nx.grad(
        lambda a, b: (executor(RMS, a, b, eps=1e-5) * nx.asarray(ct)).sum(), argnums=(0, 1)
    )(nx.asarray(x), nx.asarray(w))
    _close([g.numpy() for g in got], want)


def test_ported_kernel_stamp_and_shard_map_on_one_device():
    executor = Executor(_chain(False), stamp_prefix="ejk_ops")
    x, w, _ = _data()

    def hlo(**kw):
        return jax.jit(lambda a: executor(RMS, a, w, eps=1e-5, **kw)).lower(x).as_text()

    assert "ejk_ops_rms_norm_v1_" in hlo()
    assert "ejk_ops_rms_norm" not in hlo(stamp=False)
    mesh = Mesh(np.array(jax.devices()[:1]), ("tp",))
    assert check_sharded(executor, mesh) == RMSNormConfig(block_rows=8)


def test_ported_kernel_on_eight_virtual_devices():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8")
    src = Path(__file__).resolve().parents[2] / "src"
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok sharded 8 devices" in r.stdout and "ok autotuned shard_map" in r.stdout


def _main() -> None:
    assert len(jax.devices()) == 8, jax.devices()
    mesh = Mesh(np.array(jax.devices()), ("tp",))
    check_sharded(Executor(_chain(False)), mesh)
    print("ok sharded 8 devices")
    # autotuning a shard_map call times the shard-mapped run_shard_map (psum needs the mesh axis)
    selector = _chain(False, fallback="autotune")
    cfg = check_sharded(Executor(selector), mesh)
    x, w, _ = _data(d=64)
    spec = _sharded(mesh)
    inv = Invocation(
        "rms_norm@v1", (x, w), {"eps": 1e-5, "axis_name": "tp"}, None, spec["method"],
        mesh, spec["in_specs"], spec["out_specs"],
    )  # fmt: skip
    entry = selector.cache.get_entry(device_fingerprint(), "rms_norm@v1", inv.call_key)
    assert entry.source == "autotune" and entry.cfg == cfg, entry
    assert all(math.isfinite(t[1]) for t in entry.timings), entry.timings  # none failed
    assert len(entry.timings) == len(RMS.candidate_cfgs(inv)) + 1
    print("ok autotuned shard_map", cfg)


if __name__ == "__main__":
    _main()

"""nablax's kernels against the vendor libraries on a GPU: attention and matmul, forward and
forward plus backward, in one process.

Run from the repository root on a machine with a GPU (``pip install "nablax[cuda]"``)::

    python bench/bench_gpu.py                 # a few minutes on one H100
    python bench/bench_gpu.py --rounds 5      # fewer rounds
    python bench/bench_gpu.py --smoke         # tiny shapes (what the test suite runs)

Cases (the shapes of issue 38):

- **attention**: batch 4, seq 2048, 16 heads, head dim 128, bfloat16, causal. Peers: nablax's
  ``library.attention`` with each available implementation (``AttentionCfg(impl=...)``: "pallas",
  "xla", "cudnn"), ``jax.nn.dot_product_attention`` with ``implementation="cudnn"`` and ``"xla"``,
  and ``torch.nn.functional.scaled_dot_product_attention`` when PyTorch with CUDA is installed.
  FLOPs: ``4 * B * H * S^2 * D`` halved for causal (forward), 2.5 times that for the backward.
Each case also times "nablax tuned (cfg=None)": a fresh executor whose chain autotunes the call
(forward alone, or forward plus backward under ``jax.vjp``) and prints every candidate's time.

- **matmul**: 4096 x 4096 x 4096, bfloat16. Peers: nablax's ``library.matmul`` with each available
  implementation, ``jnp.dot`` and ``torch.mm``. FLOPs: ``2 M N K`` forward, twice that backward.

Every peer is compiled and checked against the XLA result first (the largest difference is
printed); then the peers take turns in blocks of calls, each block synchronized
(``block_until_ready`` / ``torch.cuda.synchronize``), and the median and best block are reported
with TFLOP/s and the ratio to the reference peer (PyTorch when present, else cuDNN / ``jnp.dot``).
The issue's targets are printed as PASS/MISS lines: attention forward plus backward within 1.1x
PyTorch SDPA's time and forward at least cuDNN's throughput; matmul at least 0.95x XLA's.

Without a GPU the script says so and runs tiny shapes on the CPU (nablax's Pallas kernels in
interpret mode, PyTorch on the CPU): the code paths are exercised, the timings mean nothing.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from _common import environment, fmt, med_best, time_blocks, verdict  # bench/ is on sys.path
from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Tuner,
    library,
)
from nablax.kernels.library import AttentionCfg, MatmulCfg, _impls


class _ReportingTuner(Tuner):
    """The tuner of the "nablax tuned" peers: prints what each tuning chose."""

    def tune(self, kernel, inv, candidates, *a, **kw):
        result = super().tune(kernel, inv, candidates, *a, **kw)
        timed = ", ".join(
            f"{t.cfg}: {t.median_s * 1e3:.3f} ms" if t.error is None else f"{t.cfg}: failed"
            for t in result.timings
        )
        print(f"  tuned {kernel.versioned_id} on {result.objective}: {result.best} ({timed})")
        return result


def _tuned_executor() -> Executor:
    """A fresh executor whose chain autotunes on every new call (memory cache only)."""
    tuner = _ReportingTuner(warmup=1, iters=5, progress=False)
    return Executor(ConfigSelectorChain(ConfigCache(), AutotunePolicy(), tuner, persistent=False))


GPU = _impls.platform() == "gpu"
TUNED = "nablax tuned (cfg=None)"


def _torch():
    """``(torch, device)`` or ``(None, why)``: CUDA on a GPU machine, the CPU without a GPU."""
    try:
        import torch
    except ImportError:
        return None, "PyTorch is not installed"
    if torch.cuda.is_available():
        return torch, "cuda"
    if GPU:
        return None, "PyTorch has no CUDA here"
    return torch, "cpu"


class Peer:
    """One timed function: ``step()`` runs it, ``sync()`` waits for its last result."""

    def __init__(self, name: str, run: Callable[[], object], wait: Callable[[object], None]):
        self.name, self.run, self.wait, self.last = name, run, wait, None

    def step(self) -> None:
        self.last = self.run()

    def sync(self) -> None:
        self.wait(self.last)


def _jax_peer(name: str, fn, *args) -> Peer:
    jitted = jax.jit(fn)
    return Peer(name, lambda: jitted(*args), jax.block_until_ready)


def _torch_peer(name: str, torch, device: str, fn) -> Peer:
    def wait(_):
        if device == "cuda":
            torch.cuda.synchronize()

    return Peer(name, fn, wait)


def _first(x):
    """The output of a forward peer or the first gradient of a forward+backward peer."""
    x = x[0] if isinstance(x, (tuple, list)) else x
    if hasattr(x, "detach"):  # a torch tensor: back to the (batch, seq, heads, dim) layout
        x = x.detach().float().cpu().numpy()
        return np.swapaxes(x, 1, 2) if x.ndim == 4 else x
    return np.asarray(x, np.float32)


def _check(peers: list[Peer], ref: np.ndarray) -> list[Peer]:
    """Run each peer once (compiling it) and print its largest difference from ``ref``; a peer
    that fails is reported and dropped."""
    kept = []
    for p in peers:
        try:
            p.step()
            p.sync()
            err = float(np.max(np.abs(_first(p.last) - ref)))
            print(f"  {p.name:<34} ok, max |diff| vs XLA {err:.3g}")
            kept.append(p)
        except Exception as e:  # noqa: BLE001 - a peer that cannot run is reported, not fatal
            print(f"  {p.name:<34} FAILED: {type(e).__name__}: {str(e).splitlines()[0][:160]}")
    return kept


def _table(title: str, peers: list[Peer], flops: float, ref: str | None, args) -> dict:
    """Time the peers in interleaved blocks and print ms, TFLOP/s and ratios; medians by name."""
    if not peers:
        print(f"{title}: no peer ran")
        return {}
    times = time_blocks({p.name: (p.step, p.sync) for p in peers}, args.rounds, args.block)
    med, best = med_best(times)
    ref = ref if ref in med else min(med, key=med.get)
    print(f"\n{title} ({args.rounds} rounds of {args.block} calls; ratio = time / {ref}'s)")
    print(f"  {'peer':<34} {'median ms':>10} {'best ms':>9} {'TFLOP/s':>9} {'ratio':>7}")
    for name in med:
        tflops = flops / med[name] / 1e12
        print(
            f"  {name:<34} {fmt(med[name] * 1e3):>10} {fmt(best[name] * 1e3):>9} "
            f"{fmt(tflops):>9} {med[name] / med[ref]:>7.2f}"
        )
    return med


def _attention(args, torch, device) -> None:
    b, s, h, d = (1, 64, 2, 32) if args.smoke else (4, 2048, 16, 128)
    dtype = jnp.bfloat16
    rng = np.random.default_rng(0)
    q, k, v, do = (jnp.asarray(rng.standard_normal((b, s, h, d)), dtype) for _ in range(4))
    fwd_flops = 4 * b * h * s * s * d / 2  # causal: half the score matrix
    print(f"\nattention: batch {b}, seq {s}, heads {h}, head dim {d}, bfloat16, causal")

    def grads(f):
        return lambda q, k, v, do: jax.vjp(f, q, k, v)[1](do)

    impls = {"xla": AttentionCfg(impl="xla")}
    if _pallas_ok():  # off a GPU an impl="pallas" config runs in interpret mode
        impls["pallas"] = AttentionCfg(*((128, 64) if GPU else (16, 32)), impl="pallas")
    why = _impls.cudnn_reason(q.shape, k.shape, v.shape, dtype, _impls.platform())
    if why is None:
        impls["cudnn"] = AttentionCfg(impl="cudnn")
    else:
        print(f"  cuDNN: not available: {why}")

    def jnn(impl):
        return lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, is_causal=True, implementation=impl
        )

    fwds = {
        f"nablax impl={n}": lambda q, k, v, c=c: library.attention(q, k, v, causal=True, cfg=c)
        for n, c in impls.items()
    }
    fwds["jax.nn xla"] = jnn("xla")
    if why is None:
        fwds["jax.nn cudnn"] = jnn("cudnn")
    ref_out = np.asarray(jax.jit(jnn("xla"))(q, k, v), np.float32)
    ref_grad = np.asarray(jax.jit(grads(jnn("xla")))(q, k, v, do)[0], np.float32)

    for mode, mult in (("forward", 1.0), ("forward+backward", 3.5)):
        print(f"\nattention {mode}: checking peers")
        # cfg=None: the chain picks among every available implementation; a fresh executor per
        # mode (an executor memoizes its choice per shape, whatever the mode)
        ex = _tuned_executor()
        fns = {**fwds, TUNED: lambda q, k, v, ex=ex: ex(library.ATTENTION, q, k, v, causal=True)}
        if mode == "forward":
            peers = [_jax_peer(n, f, q, k, v) for n, f in fns.items()]
        else:
            peers = [_jax_peer(n, grads(f), q, k, v, do) for n, f in fns.items()]
        if torch is not None:
            peers.append(_torch_sdpa(torch, device, (q, k, v, do), mode))
        peers = _check(peers, ref_out if mode == "forward" else ref_grad)
        ref = "torch sdpa" if torch is not None else ("jax.nn cudnn" if why is None else None)
        med = _table(f"attention {mode}", peers, fwd_flops * mult, ref, args)
        _targets_attention(mode, med)


def _torch_sdpa(torch, device, arrays, mode) -> Peer:
    tq, tk, tv, tdo = (
        torch.tensor(np.asarray(x, np.float32)).to(device, torch.bfloat16).transpose(1, 2)
        for x in arrays
    )
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if mode == "forward":
        return _torch_peer("torch sdpa", torch, device, lambda: sdpa(tq, tk, tv, is_causal=True))
    leaves = [x.detach().requires_grad_() for x in (tq, tk, tv)]

    def fwd_bwd():
        for x in leaves:
            x.grad = None
        sdpa(*leaves, is_causal=True).backward(tdo)
        return tuple(x.grad for x in leaves)

    return _torch_peer("torch sdpa", torch, device, fwd_bwd)


def _pallas_ok() -> bool:
    """Whether nablax's Pallas kernels run here (interpret mode off a GPU), else say why not."""
    if GPU and _impls.pallas_gpu_reason() is not None:
        print(f"  nablax impl='pallas': not available: {_impls.pallas_gpu_reason()}")
        return False
    return True


def _targets_attention(mode: str, med: dict) -> None:
    best = min((t for n, t in med.items() if n.startswith("nablax")), default=None)
    if best is None or not GPU:  # CPU timings of tiny shapes judge nothing
        return
    if mode == "forward+backward" and "torch sdpa" in med:
        r = best / med["torch sdpa"]
        print(f"  {verdict(r <= 1.1)} attention fwd+bwd: best nablax {r:.2f}x torch SDPA's time")
    if mode == "forward" and "jax.nn cudnn" in med:
        r = med["jax.nn cudnn"] / best
        print(f"  {verdict(r >= 1.0)} attention forward: best nablax {r:.2f}x cuDNN's throughput")


def _matmul(args, torch, device) -> None:
    n = 128 if args.smoke else 4096
    rng = np.random.default_rng(1)
    a, b, dy = (jnp.asarray(rng.standard_normal((n, n)), jnp.bfloat16) for _ in range(3))
    print(f"\nmatmul: {n} x {n} x {n}, bfloat16")
    cfgs = {"xla": MatmulCfg(impl="xla")}
    if _pallas_ok():
        cfgs["pallas"] = MatmulCfg(*((128, 128, 32) if GPU else (64, 64, 32)), impl="pallas")
    fwds = {
        f"nablax impl={k}": lambda a, b, c=c: library.matmul(a, b, cfg=c) for k, c in cfgs.items()
    }
    fwds["jnp.dot"] = jnp.dot
    ref_out = np.asarray(jax.jit(jnp.dot)(a, b), np.float32)
    ref_grad = np.asarray(jax.jit(lambda dy, b: jnp.dot(dy, b.T))(dy, b), np.float32)
    for mode, mult in (("forward", 1.0), ("forward+backward", 3.0)):
        print(f"\nmatmul {mode}: checking peers")
        ex = _tuned_executor()
        fns = {**fwds, TUNED: lambda a, b, ex=ex: ex(library.MATMUL, a, b)}
        if mode == "forward":
            peers = [_jax_peer(k, f, a, b) for k, f in fns.items()]
        else:
            peers = [
                _jax_peer(k, lambda a, b, dy, f=f: jax.vjp(f, a, b)[1](dy), a, b, dy)
                for k, f in fns.items()
            ]
        if torch is not None:
            peers.append(_torch_mm(torch, device, (a, b, dy), mode))
        peers = _check(peers, ref_out if mode == "forward" else ref_grad)
        med = _table(f"matmul {mode}", peers, 2 * n**3 * mult, "jnp.dot", args)
        best = min((t for k, t in med.items() if k.startswith("nablax")), default=None)
        if best is not None and "jnp.dot" in med and GPU:
            r = med["jnp.dot"] / best
            print(f"  {verdict(r >= 0.95)} matmul {mode}: best nablax {r:.2f}x XLA's throughput")


def _torch_mm(torch, device, arrays, mode) -> Peer:
    ta, tb, tdy = (
        torch.tensor(np.asarray(x, np.float32)).to(device, torch.bfloat16) for x in arrays
    )
    if mode == "forward":
        return _torch_peer("torch.mm", torch, device, lambda: torch.mm(ta, tb))
    la, lb = ta.detach().requires_grad_(), tb.detach().requires_grad_()

    def fwd_bwd():
        la.grad = lb.grad = None
        torch.mm(la, lb).backward(tdy)
        return la.grad, lb.grad

    return _torch_peer("torch.mm", torch, device, fwd_bwd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--smoke", action="store_true", help="tiny shapes (for the test suite)")
    p.add_argument("--rounds", type=int, default=None, help="timed rounds (default 10; smoke 2)")
    p.add_argument("--block", type=int, default=None, help="calls per block (default 10; smoke 1)")
    p.add_argument("--only", choices=("attention", "matmul"), default=None)
    args = p.parse_args(argv)
    torch, device = _torch()
    print(environment(torch))
    if not GPU:
        print(
            f"no GPU: JAX's default backend is {jax.default_backend()}; running tiny shapes on "
            f"the CPU (Pallas in interpret mode), so the timings below mean nothing"
        )
        args.smoke = True
        print("targets (PASS/MISS) are judged on a GPU only")
    args.rounds = args.rounds or (2 if args.smoke else 10)
    args.block = args.block or (1 if args.smoke else 10)
    if torch is None:
        print(f"PyTorch peers skipped: {device}")
    else:
        print(f"PyTorch {torch.__version__} on {device}")
    if args.only in (None, "attention"):
        _attention(args, torch, device)
    if args.only in (None, "matmul"):
        _matmul(args, torch, device)
    return 0


if __name__ == "__main__":
    sys.exit(main())

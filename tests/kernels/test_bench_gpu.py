"""``bench/bench_gpu.py --smoke`` runs (tiny shapes; without a GPU it says so and runs them on the
CPU with nablax's Pallas kernels in interpret mode), so the GPU benchmark is known to work before a
GPU session runs it. The subprocess inherits this process's environment."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import jax

from nablax.kernels.library import _impls

ROOT = Path(__file__).resolve().parents[2]


def test_bench_gpu_smoke_runs_every_case():
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_gpu.py"), "--smoke"],
        cwd=ROOT,
        env={**os.environ},
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    for case in ("attention forward", "attention forward+backward", "matmul forward",
                 "matmul forward+backward"):  # fmt: skip
        assert f"{case} (" in out, out[-4000:]
    assert "TFLOP/s" in out and "ratio" in out
    assert "FAILED" not in out, out[-4000:]
    # the tuned peer's chain timed attention on forward plus backward under jax.vjp
    assert "tuned attention@v1 on forward+backward" in out, out[-4000:]
    peers = ["nablax impl=xla", "nablax tuned (cfg=None)", "jax.nn xla", "jnp.dot"]
    if jax.default_backend() == "cpu" or _impls.pallas_gpu_reason() is None:
        peers.append("nablax impl=pallas")  # else the script says why it is not available
    for peer in peers:
        assert peer in out, out[-4000:]
    if jax.default_backend() == "cpu":
        assert "no GPU: JAX's default backend is cpu" in out

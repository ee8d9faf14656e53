"""examples/data_parallel.py: 2 processes x 2 devices through the launcher give the losses of one
process with 4 devices (float32 rounding), and the loss goes down."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "data_parallel.py"


def _run(args: list[str], out: Path) -> list[float]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")])
        ),
        "JAX_PLATFORMS": "cpu",
    }
    env.pop("XLA_FLAGS", None)  # the suite's 8 virtual devices: each run sets its own count
    proc = subprocess.run(
        [sys.executable, *args, "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return [float(v) for v in out.read_text().split()]


def test_two_processes_match_one(tmp_path):
    one = _run([str(EXAMPLE), "--devices", "4"], tmp_path / "one.txt")
    two = _run(
        ["-m", "nablax.launch", "--nproc", "2", "--devices-per-proc", "2", "--timeout", "120",
         str(EXAMPLE)],
        tmp_path / "two.txt",
    )  # fmt: skip
    assert len(one) == len(two) == 8
    np.testing.assert_allclose(two, one, rtol=2e-6, atol=1e-6)
    assert one[-1] < 0.7 * one[0]  # it trains

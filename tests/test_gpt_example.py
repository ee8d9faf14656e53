"""examples/gpt.py trains, evaluates, checkpoints, resumes exactly and samples (tiny config, run
as a user would: in subprocesses that inherit this process's environment)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "examples" / "gpt.py"
# 1 layer of width 32, 2 heads, 16 characters of context: the smallest model that is still a GPT
TINY = [
    "--layers", "1", "--width", "32", "--heads", "2", "--context", "16", "--batch", "8",
    "--lr", "1e-2", "--data-mb", "0.2", "--eval-every", "4", "--eval-batches", "2",
]  # fmt: skip


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    env = dict(os.environ)  # inherit (NABLAX_CACHE_DIR from conftest, JAX settings, ...)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    # on a GPU, the embedding's scatter-add gradient sums with atomics unless XLA is asked for
    # deterministic ops; the resume check compares losses bit for bit (a no-op on a CPU)
    flags = env.get("XLA_FLAGS", "")
    env["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, timeout: float = 240) -> str:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}"
    return out


def test_help_lists_the_options(tmp_path):
    out = _finish(_start(["--help"], tmp_path))
    for opt in ("--steps", "--batch", "--context", "--layers", "--width", "--heads", "--lr"):
        assert opt in out
    for opt in ("--eval-every", "--checkpoint", "--resume", "--sample", "--seed", "--compile"):
        assert opt in out


def test_trains_resumes_exactly_and_samples(tmp_path):
    ckpt = tmp_path / "gpt.safetensors"
    # A: 8 steps in one go; B: the first 4, checkpointed (runs alongside A)
    a = _start([*TINY, "--steps", "8", "--sample", "40", "--log", "a.json"], tmp_path)
    b = _start(
        [*TINY, "--steps", "4", "--sample", "0", "--checkpoint", str(ckpt), "--log", "b.json"],
        tmp_path,
    )
    out_a, _ = _finish(a), _finish(b)
    assert ckpt.exists()
    # C: resumes B's checkpoint and trains to step 8
    c = _start(
        [*TINY, "--steps", "8", "--sample", "40", "--checkpoint", str(ckpt), "--resume"]
        + ["--log", "c.json"],
        tmp_path,
    )
    out_c = _finish(c)
    la, lb, lc = (json.loads((tmp_path / f"{n}.json").read_text()) for n in "abc")

    # the loss falls: from ln(97) = 4.57 at step 1, on the training and the held-out batches
    train = [la["train"][str(i)] for i in range(1, 9)]
    assert abs(train[0] - 4.6) < 0.5, train
    assert max(train[-3:]) < train[0] - 0.5, train
    assert la["val"]["8"] < la["val"]["4"] < train[0] - 0.5, la["val"]
    assert "val loss" in out_a and "ms/step" in out_a

    # resuming gives exactly the losses of the run that never stopped
    assert "resumed from" in out_c and "at step 4" in out_c
    assert [lb["train"][str(i)] for i in range(1, 5)] == train[:4]
    assert sorted(lc["train"], key=int) == ["5", "6", "7", "8"]
    assert [lc["train"][str(i)] for i in range(5, 9)] == train[4:]
    assert lc["val"] == {"8": la["val"]["8"]}

    # sampling: the prompt and 40 characters of the vocabulary, the same from the same weights;
    # 40 steps (12 filling the 16-character buffer, 28 sliding it) compile a handful of programs
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import gpt
    finally:
        sys.path.remove(str(SCRIPT.parent))
    text = la["sample"]
    assert text.startswith("def ") and len(text) == 4 + 40
    assert set(text) <= set(gpt.VOCAB)
    assert lc["sample"] == text
    assert 1 <= la["sample_compiles"] <= 8, la["sample_compiles"]

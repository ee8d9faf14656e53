"""Train digit classifiers with ``nablax.nn`` and ``nablax.optim``, end to end.

The data is scikit-learn's bundled digits set: 1797 grey 8x8 images of the digits 0-9, shipped
inside the package (nothing is downloaded). Install the extra and run::

    pip install -e ".[examples]"
    python examples/digits.py                  # an MLP and a small CNN, about 20 s on 2 cores
    python examples/digits.py --model cnn --epochs 30 --lr 3e-3

What it shows:

- models built from layers (``nn.MLP``, and a CNN from ``nn.Conv2d`` + ``nn.MaxPool2d``), with
  PyTorch's layouts and initialisation;
- ``optim.adam`` with an optax-shaped ``init`` / ``update`` / ``apply_updates`` loop;
- a training step under ``nx.compile``: the model, the optimizer state and the batch go in, the
  new model and state come out, and the step is traced exactly once (the script checks it);
- shuffled minibatches with a progress bar and per-epoch times;
- evaluation, a checkpoint written with ``nx.save`` and read back with ``nx.load(like=model)``,
  and the same accuracy from the reloaded model.

**The last partial batch is padded and masked.** 1437 training images make 22 batches of 64 and
one of 29. Padding that batch to 64 rows (with copies of row 0) and giving the padded rows weight
0 in the loss keeps every step the same shape, so ``nx.compile`` traces once for the whole run
instead of once more for the odd size. The mean loss divides by the number of real rows, so the
gradient is exactly that of the 29-row batch.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import nablax as nx
import nablax.nn.functional as F
from nablax import nn, optim

BATCH = 64


def load_data(seed: int = 0):
    """``(x_train, y_train, x_test, y_test)``: images as float32 ``(n, 1, 8, 8)`` in ``[0, 1]``,
    labels int32; a shuffled 80/20 split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit('examples/digits.py needs scikit-learn: pip install -e ".[examples]"')
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]  # NCHW, one channel
    y = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_train = int(0.8 * len(x))
    tr, te = order[:n_train], order[n_train:]
    return x[tr], y[tr], x[te], y[te]


def make_model(kind: str, key):
    k1, k2, k3 = nx.random.split(key, 3)
    if kind == "mlp":
        return nn.Sequential(nn.Flatten(), nn.MLP([64, 128, 128, 10], key=k1))
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1, key=k1),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 8x8 -> 4x4
        nn.Conv2d(16, 32, 3, padding=1, key=k2),
        nn.ReLU(),
        nn.MaxPool2d(2),  # 4x4 -> 2x2
        nn.Flatten(),
        nn.Linear(32 * 2 * 2, 10, key=k3),
    )


def masked_loss(model, x, y, mask):
    """Mean cross entropy over the rows where ``mask`` is 1 (padded rows count 0)."""
    per_row = F.cross_entropy(model(x), y, reduction="none")
    return (per_row * mask).sum() / mask.sum()


def make_step(opt):
    @nx.compile
    def step(model, state, x, y, mask):
        loss, grads = nx.value_and_grad(masked_loss)(model, x, y, mask)
        updates, state = opt.update(grads, state, model)
        return optim.apply_updates(model, updates), state, loss

    return step


def batches(x, y, rng):
    """Shuffled batches of ``BATCH`` rows; the last one padded, with its mask."""
    order = rng.permutation(len(x))
    for start in range(0, len(x), BATCH):
        idx = order[start : start + BATCH]
        mask = np.ones(BATCH, np.float32)
        if len(idx) < BATCH:
            mask[len(idx) :] = 0.0
            idx = np.concatenate([idx, np.full(BATCH - len(idx), idx[0])])
        yield x[idx], y[idx], mask


def accuracy(model, x, y) -> float:
    pred = nx.argmax(model(nx.tensor(x)), axis=1)
    return float((pred == nx.tensor(y)).astype(nx.float32).mean().item())


def progress(epoch: int, epochs: int, done: int, total: int, loss: float, quiet: bool) -> None:
    if quiet or not sys.stdout.isatty():
        return
    width = 24
    bar = "#" * (width * done // total) + "-" * (width - width * done // total)
    print(f"\r  epoch {epoch:2d}/{epochs} [{bar}] {done}/{total} loss {loss:.4f}", end="")


def train(kind: str, data, *, epochs: int, lr: float, seed: int, quiet: bool = False) -> dict:
    x_tr, y_tr, x_te, y_te = data
    model = make_model(kind, nx.random.key(seed))
    opt = optim.adam(lr)
    state = opt.init(model)
    step = make_step(opt)
    rng = np.random.default_rng(seed)
    n_batches = -(-len(x_tr) // BATCH)
    times = []
    print(f"{kind}: {sum(p.size for p in nx.tree.leaves(model))} parameters")
    for epoch in range(1, epochs + 1):
        t0 = time.perf_counter()
        total = nx.zeros(())
        for i, (xb, yb, mb) in enumerate(batches(x_tr, y_tr, rng), 1):
            model, state, loss = step(model, state, nx.tensor(xb), nx.tensor(yb), nx.tensor(mb))
            total = total + loss
            if i % 8 == 0 or i == n_batches:  # reading the loss waits for the step
                progress(epoch, epochs, i, n_batches, loss.item(), quiet)
        mean_loss = total.item() / n_batches
        nx.block_until_ready((model, state))
        times.append(time.perf_counter() - t0)
        if not quiet:
            note = " (includes compilation)" if epoch == 1 else ""
            clear = "\r" + " " * 64 + "\r" if sys.stdout.isatty() else ""
            line = f"  epoch {epoch:2d}/{epochs}  loss {mean_loss:.4f}  {times[-1] * 1e3:7.1f} ms"
            print(clear + line + note)
    acc = accuracy(model, x_te, y_te)
    traces = step.cache_info().traces
    assert traces == 1, f"the step traced {traces} times; padding should keep it at 1"
    return {"model": model, "accuracy": acc, "epoch_times": times, "traces": traces}


def check_checkpoint(model, x_te, y_te, acc: float, out: Path | None) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = (out or Path(tmp)) / "digits.safetensors"
        nx.save(path, model)
        size_kb = path.stat().st_size / 1024
        reloaded = nx.load(path, like=model)
    acc2 = accuracy(reloaded, x_te, y_te)
    print(f"  checkpoint: {path.name}, {size_kb:.0f} KiB; reloaded test accuracy {acc2:.4f}")
    if acc2 != acc:
        raise SystemExit(f"the reloaded model scores {acc2}, the trained one {acc}")
    return acc2


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=["mlp", "cnn", "both"], default="both")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="keep the checkpoints in this folder")
    ap.add_argument("--quiet", action="store_true", help="no per-epoch lines")
    args = ap.parse_args(argv)
    data = load_data(args.seed)
    print(f"digits: {len(data[0])} training and {len(data[2])} test images of 8x8, batch {BATCH}")
    results = {}
    for kind in ("mlp", "cnn") if args.model == "both" else (args.model,):
        r = train(kind, data, epochs=args.epochs, lr=args.lr, seed=args.seed, quiet=args.quiet)
        first, rest = r["epoch_times"][0], r["epoch_times"][1:]
        steady = f"{statistics.median(rest) * 1e3:.1f} ms" if rest else "n/a"
        print(
            f"  test accuracy {r['accuracy']:.4f}; epoch 1 {first:.2f} s, steady epoch (median) "
            f"{steady}; the step traced {r['traces']} time(s)"
        )
        r["reloaded_accuracy"] = check_checkpoint(
            r["model"], data[2], data[3], r["accuracy"], args.out
        )
        results[kind] = r
    return results


if __name__ == "__main__":
    main()

"""Training a model: an MLP with Adam on scikit-learn's digits, per epoch, four ways in one process.

Run from the repository root (needs ``scikit-learn`` for the data set)::

    python bench/bench_digits.py              # about 35 s on 2 cores (much of it: XLA compiles)
    python bench/bench_digits.py --quick      # fewer timed epochs (a smoke run)
    python bench/bench_digits.py --markdown   # also: the results as a markdown table for the README
    python bench/bench_digits.py --profile    # also: eager nablax epoch split, and its cProfile

The workload is a small model trained as a new user would write it, in small steps. Data: the
1797 8x8 digits of ``sklearn.datasets.load_digits``; the first 1472 samples are the training
split (23 full batches of 64, the same batches in the same order every epoch), the other 325 the
test set, all of them evaluated after training. Features are standardized with the training
split's mean and standard deviation (constant pixels divided by 1). Model: MLP 64-256-256-10
(ReLU), softmax cross-entropy on integer labels, batch 64, float32. Optimizer: Adam, lr 1e-3,
betas 0.9/0.999, eps 1e-8. Every peer starts from the same He-normal weights (NumPy, drawn as
``(in, out)`` and stored transposed in PyTorch's ``(out, in)`` layout for every peer) and zero
biases. Peers:

- **nx.compile**: ``nn.MLP([64, 256, 256, 10])`` with those weights set by ``replace``,
  ``F.cross_entropy`` and ``optim.adam(1e-3)`` (``init`` / ``update`` / ``apply_updates``; no
  hand-written Adam), the step under ``nx.compile``. The step count lives in the optimizer state
  as an int32 tensor, so the step traces once.
- **nablax**: the same step function run eagerly.
- **nablax read-once**: the same eager step, but the losses are summed as tensors and read once
  at the end of the epoch, so an epoch is one lazy graph of 23 steps (for reference; no target).
- **jax.jit**: the reference: ``value_and_grad`` and a hand-written Adam (``torch.optim.Adam``'s
  formula) in one jitted function; the step counter is an int32 array argument.
- **torch** (PyTorch eager, its default intra-op thread count, printed) and **torch 1 thread**
  (``torch.set_num_threads(1)`` during its epochs): ``torch.nn.Linear`` layers,
  ``F.cross_entropy``, ``loss.backward()`` and ``torch.optim.Adam`` with its defaults.

XLA (JAX and nablax) uses its own CPU thread pool; both thread counts are printed. nablax puts
that pool's threads under Linux's ``SCHED_BATCH`` policy (its option ``batch_xla_threads``, on
by default): a pool thread that wakes up no longer preempts the Python thread. The benchmark sets
it before any peer runs, so jax.jit's epochs use the same threads under the same policy, and the
header prints it; ``NABLAX_BATCH_XLA_THREADS=0`` runs every peer with the normal policy. Every loop
except read-once reads its loss every step (``loss.item()`` / ``float(loss)``). An epoch ends with
every parameter and optimizer moment computed (``nx.block_until_ready`` on the model and state,
``jax.block_until_ready`` on the JAX pytrees; PyTorch is synchronous), so asynchronous work is
charged to the peer that caused it.

Measurements. *Epoch 1*: every peer trains one epoch from the shared weights and from empty
caches (``nx.clear_caches()`` before each nablax peer, a fresh ``jax.jit`` function for JAX), so
it includes tracing and XLA compilation (one-time process start-up is paid before, by one step of
a tiny unrelated model in each framework: PyTorch's first ``optimizer.step()`` imports
``torch._dynamo``, about 1 s); after it the largest absolute difference of every
peer's parameters to JAX's is printed. *Steady epochs*: fresh runners from the same weights train
2 warm-up epochs each and then the timed epochs, the peers taking turns epoch by epoch in an
order rotated every round, after a ``--settle`` sleep (default 0.01 s, so thread pools that
spin-wait go idle); reported are the median and the best timed epoch. Measured on a 2-core VM:
the sleep, or a multi-threaded PyTorch epoch just before, slows eager nablax's next epoch more than
the other peers' (its Python thread and XLA's threads hand work to each other every step, and a
vCPU that went idle wakes up late); ``--settle 0`` shows the back-to-back figures, and ``--warm 1``
runs one untimed epoch of the same peer right before each timed one (each peer's own steady state,
whatever ran before it). *Accuracy*: each
peer's own forward pass on the 325 test samples after those runs. *Compiles*: XLA backend
compilations (counted with a ``jax.monitoring`` listener on JAX's
``/jax/core/compile/backend_compile_duration`` event, which nablax's programs go through too)
during each peer's epoch 1 and during its timed epochs; plus nablax's own counters
(``nx.cache_info().compiles``, the compiled step's ``cache_info()`` traces and executables) and
``jax_step._cache_size()``. PyTorch eager compiles nothing ("n/a").

Targets: nx.compile steady epoch (median) <= 1.1x jax.jit's; eager nablax faster than PyTorch
eager (the faster of its two rows). Checks: parameters after one epoch equal JAX's within 1e-4
of the largest |parameter|, and all final test accuracies within 2 percentage points.
"""

from __future__ import annotations

import argparse
import collections
import os
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from sklearn.datasets import load_digits

import nablax as nx
import nablax.nn.functional as F
from _common import (
    environment,
    jax_mlp_loss,
    load_warning,
    med_best,
    profile,
    threads,
    time_blocks,
    verdict,
)
from _common import fmt as _fmt
from nablax import nn, optim

SIZES = (64, 256, 256, 10)
BATCH = 64
N_TRAIN = 1472  # 23 full batches of 64; the remaining 325 samples are the test set
LR, B1, B2, EPS = 1e-3, 0.9, 0.999, 1e-8
WARMUP = 2  # untimed epochs per peer before the timed ones
TARGET_COMPILE = 1.1  # nx.compile epoch / jax.jit epoch
ACC_SPREAD = 2.0  # percentage points between the best and the worst final test accuracy
ROWS = ("nx.compile", "nablax", "nablax read-once", "jax.jit", "torch", "torch 1 thread")

Params = list[tuple[np.ndarray, np.ndarray]]


def load_data() -> tuple[list[tuple[np.ndarray, np.ndarray]], tuple[np.ndarray, np.ndarray]]:
    """The training split as ``N_TRAIN // BATCH`` standardized float32 batches with int32 labels,
    and the test split (every sample after ``N_TRAIN``), standardized the same way."""
    digits = load_digits()
    x, y = digits.data, digits.target.astype(np.int32)
    mean, std = x[:N_TRAIN].mean(axis=0), x[:N_TRAIN].std(axis=0)
    x = ((x - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
    batches = [
        (x[i * BATCH : (i + 1) * BATCH], y[i * BATCH : (i + 1) * BATCH])
        for i in range(N_TRAIN // BATCH)
    ]
    return batches, (x[N_TRAIN:], y[N_TRAIN:])


def init_params(seed: int = 0) -> Params:
    """He-normal weights drawn as ``(in, out)`` and stored transposed, in PyTorch's ``(out, in)``
    layout (``nn.Linear``'s and ``torch.nn.Linear``'s), zero biases; float32."""
    rng = np.random.default_rng(seed)
    params = []
    for i, o in zip(SIZES[:-1], SIZES[1:]):
        w = (rng.standard_normal((i, o)) * np.sqrt(2.0 / i)).astype(np.float32)
        params.append((np.ascontiguousarray(w.T), np.zeros(o, np.float32)))
    return params


class XlaCompiles:
    """Counts XLA backend compilations (JAX's and nablax's) through ``jax.monitoring``."""

    EVENT = "/jax/core/compile/backend_compile_duration"

    def __init__(self) -> None:
        self.total = 0
        self.by_name: collections.Counter = collections.Counter()
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == self.EVENT:
            self.total += 1
            self.by_name[kwargs.get("fun_name", "?")] += 1


XLA = XlaCompiles()


class Runner:
    """One peer: ``epoch()`` trains one epoch and returns the summed loss, ``sync()`` waits for
    every parameter; ``start()`` / ``finish()`` wrap them with the compile counters."""

    def __init__(self) -> None:
        self.xla_log: list[int] = []  # XLA compilations per epoch
        self.nx_log: list[int] = []  # nx.cache_info().compiles per epoch
        self._x0 = self._n0 = 0

    def start(self) -> float:
        self._x0, self._n0 = XLA.total, nx.cache_info().compiles
        return self.epoch()

    def finish(self) -> None:
        self.sync()
        self.xla_log.append(XLA.total - self._x0)
        self.nx_log.append(nx.cache_info().compiles - self._n0)

    def epoch(self) -> float:
        raise NotImplementedError

    def sync(self) -> None:
        raise NotImplementedError

    def params_np(self) -> list[np.ndarray]:
        raise NotImplementedError

    def accuracy(self, x: np.ndarray, y: np.ndarray) -> float:
        raise NotImplementedError


# ---- nablax ----------------------------------------------------------------------------------

OPT = optim.adam(LR, B1, B2, EPS)


def nx_loss(model, x, y):
    return F.cross_entropy(model(x), y)


def nx_step(model, state, x, y):
    """One Adam step with ``nablax.optim``: ``(loss, new_model, new_state)``."""
    loss, grads = nx.value_and_grad(nx_loss)(model, x, y)
    updates, state = OPT.update(grads, state, model)
    return loss, optim.apply_updates(model, updates), state


def nx_model(params_np: Params) -> nn.MLP:
    """``nn.MLP(SIZES)`` with every ``Linear``'s weight and bias replaced by the shared arrays."""
    model = nn.MLP(list(SIZES), key=nx.random.key(0))
    layers = tuple(
        layer.replace(weight=nx.tensor(w), bias=nx.tensor(b))
        for layer, (w, b) in zip(model.layers, params_np)
    )
    return model.replace(layers=layers)


class NablaxRunner(Runner):
    """``mode``: ``"eager"`` (read every step), ``"once"`` (read once per epoch), ``"compile"``."""

    def __init__(self, params_np: Params, batches_np, mode: str):
        super().__init__()
        self.model = nx_model(params_np)
        self.state = OPT.init(self.model)
        self.batches = [(nx.tensor(x), nx.tensor(y)) for x, y in batches_np]
        self.mode = mode
        self.fn = nx.compile(nx_step) if mode == "compile" else nx_step

    def epoch(self) -> float:
        total = nx.zeros(()) if self.mode == "once" else 0.0
        for x, y in self.batches:
            loss, self.model, self.state = self.fn(self.model, self.state, x, y)
            total = total + (loss if self.mode == "once" else loss.item())
        return total.item() if self.mode == "once" else total

    def sync(self) -> None:
        nx.block_until_ready((self.model, self.state))

    def params_np(self) -> list[np.ndarray]:
        return [p.numpy() for p in nx.tree.leaves(self.model)]

    def accuracy(self, x, y) -> float:
        pred = nx.argmax(self.model(nx.tensor(x)), axis=1).numpy()
        return float(np.mean(pred == y))


# ---- JAX: jax.jit with a hand-written Adam (the reference) ------------------------------------


jax_loss = jax_mlp_loss  # the same model and loss in JAX, weights (out, in)


def make_jax_step():
    """A new jitted Adam step (a new function object, so nothing is cached for it yet)."""

    def jax_step(params, m, v, t, x, y):
        t = t + 1
        loss, g = jax.value_and_grad(jax_loss)(params, x, y)
        m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
        v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        tf = t.astype(jnp.float32)
        c1, c2 = 1 - B1**tf, 1 - B2**tf
        upd = lambda p, m, v: p - LR * (m / c1) / (jnp.sqrt(v) / jnp.sqrt(c2) + EPS)
        return loss, jax.tree.map(upd, params, m, v), m, v, t

    return jax.jit(jax_step)


class JaxRunner(Runner):
    def __init__(self, params_np: Params, batches_np):
        super().__init__()
        self.step = make_jax_step()
        self.params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params_np]
        self.m = jax.tree.map(jnp.zeros_like, self.params)
        self.v = jax.tree.map(jnp.zeros_like, self.params)
        self.t = jnp.asarray(0, jnp.int32)
        self.batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in batches_np]

    def epoch(self) -> float:
        total = 0.0
        for x, y in self.batches:
            loss, self.params, self.m, self.v, self.t = self.step(
                self.params, self.m, self.v, self.t, x, y
            )
            total += float(loss)
        return total

    def sync(self) -> None:
        jax.block_until_ready((self.params, self.m, self.v, self.t))

    def params_np(self) -> list[np.ndarray]:
        return [np.asarray(p) for p in jax.tree.leaves(self.params)]

    def accuracy(self, x, y) -> float:
        h = jnp.asarray(x)
        for w, b in self.params[:-1]:
            h = jax.nn.relu(h @ w.T + b)
        w, b = self.params[-1]
        return float(np.mean(np.asarray(jnp.argmax(h @ w.T + b, axis=1)) == y))


# ---- PyTorch eager: torch.nn.Linear + torch.optim.Adam -----------------------------------------


class TorchRunner(Runner):
    def __init__(self, params_np: Params, batches_np, n_threads: int):
        super().__init__()
        tnn = torch.nn
        layers: list = []
        for k, (w, b) in enumerate(params_np):
            lin = tnn.Linear(w.shape[1], w.shape[0])
            with torch.no_grad():
                lin.weight.copy_(torch.from_numpy(w))
                lin.bias.copy_(torch.from_numpy(b))
            layers += [lin] if k == len(params_np) - 1 else [lin, tnn.ReLU()]
        self.model = tnn.Sequential(*layers)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=LR, betas=(B1, B2), eps=EPS)
        self.batches = [(torch.from_numpy(x), torch.from_numpy(y).long()) for x, y in batches_np]
        self.n_threads = n_threads

    def epoch(self) -> float:
        torch.set_num_threads(self.n_threads)
        total = 0.0
        for x, y in self.batches:
            self.opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            self.opt.step()
            total += loss.item()
        return total

    def sync(self) -> None:
        """PyTorch eager is synchronous on the CPU: nothing left to wait for."""

    def params_np(self) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for p in self.model.parameters()]

    def accuracy(self, x, y) -> float:
        torch.set_num_threads(self.n_threads)
        with torch.no_grad():
            pred = self.model(torch.from_numpy(x)).argmax(dim=1).numpy()
        return float(np.mean(pred == y))


def make_runner(name: str, params: Params, batches, default_threads: int) -> Runner:
    if name == "jax.jit":
        return JaxRunner(params, batches)
    if name.startswith("torch"):
        return TorchRunner(params, batches, 1 if name == "torch 1 thread" else default_threads)
    mode = {"nx.compile": "compile", "nablax": "eager", "nablax read-once": "once"}[name]
    return NablaxRunner(params, batches, mode)


# ---- measurements ----------------------------------------------------------------------------


def prime() -> None:
    """Pay every framework's one-time process start-up before any epoch 1 is timed: one Adam step
    of a tiny unrelated model in each (PyTorch's first ``optimizer.step()`` imports
    ``torch._dynamo``, about 1 s here; JAX and nablax start their runtimes). Then nablax's caches
    are cleared, so no peer's compilation is prepaid."""
    lin = torch.nn.Linear(2, 2)
    opt = torch.optim.Adam(lin.parameters())
    lin(torch.ones(1, 2)).sum().backward()
    opt.step()
    p = {"w": nx.ones(2)}
    g = nx.grad(lambda p: (p["w"] * p["w"]).sum())(p)
    tiny = optim.adam(LR)
    nx.block_until_ready(optim.apply_updates(p, tiny.update(g, tiny.init(p), p)[0]))
    jax.block_until_ready(jax.jit(jax.grad(lambda w: (w * w).sum()))(jnp.ones(2)))
    nx.clear_caches()


def first_epochs(params, batches, default_threads: int) -> tuple[dict, dict, dict]:
    """Every peer's first epoch from empty caches: seconds, the runners (for their compile logs)
    and, per peer, the largest absolute parameter difference to JAX's afterwards."""
    secs, runners = {}, {}
    for name in ROWS:
        if name.startswith("n"):
            nx.clear_caches()  # this nablax peer compiles from scratch
        r = make_runner(name, params, batches, default_threads)
        t0 = time.perf_counter()
        r.start()
        r.finish()
        secs[name] = time.perf_counter() - t0
        runners[name] = r
    torch.set_num_threads(default_threads)
    ref = runners["jax.jit"].params_np()
    diffs = {
        name: max(float(np.max(np.abs(a - b))) for a, b in zip(r.params_np(), ref))
        for name, r in runners.items()
        if name != "jax.jit"
    }
    return secs, runners, diffs


def eager_split(r: NablaxRunner, n: int = 5) -> str:
    """Where an eager nablax epoch goes: building the step's graphs (forward, backward, Adam)
    against ``loss.item()`` (hashing and dispatching the programs, waiting for the loss) and the
    final sync; medians over ``n`` epochs."""
    build, read, sync = [], [], []
    for _ in range(n):
        b = rd = 0.0
        for x, y in r.batches:
            t0 = time.perf_counter()
            loss, r.model, r.state = nx_step(r.model, r.state, x, y)
            t1 = time.perf_counter()
            loss.item()
            b, rd = b + t1 - t0, rd + time.perf_counter() - t1
        t0 = time.perf_counter()
        r.sync()
        build.append(b), read.append(rd), sync.append(time.perf_counter() - t0)
    x, y = r.batches[0]
    vg, up = [], []
    for _ in range(20):  # one step's graph building, in two parts (nothing is run)
        t0 = time.perf_counter()
        _, grads = nx.value_and_grad(nx_loss)(r.model, x, y)
        t1 = time.perf_counter()
        optim.apply_updates(r.model, OPT.update(grads, r.state, r.model)[0])
        vg.append(t1 - t0), up.append(time.perf_counter() - t1)
    med = lambda v: statistics.median(v) * 1e3
    return (
        f"eager nablax epoch, medians of {n}: building graphs {med(build):.1f} ms, loss.item() "
        f"(realize, dispatch, wait) {med(read):.1f} ms, final sync {med(sync):.1f} ms; one step's "
        f"value_and_grad graph {med(vg) * 1e3:.0f} us, optimizer update + apply_updates graph "
        f"{med(up) * 1e3:.0f} us (medians of 20)"
    )


def compile_cell(name: str, first: Runner, timed: Runner) -> str:
    """``XLA compiles in epoch 1 / in the timed epochs``, or ``n/a`` for PyTorch eager."""
    if name.startswith("torch"):
        return "n/a"
    return f"{first.xla_log[0]} / {sum(timed.xla_log[WARMUP:])}"


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the tables; return 0 (missed targets are reported, not fatal)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer timed epochs (a smoke run)")
    p.add_argument("--epochs", type=int, default=None, help="timed epochs per peer (default 40)")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument("--profile", action="store_true", help="also profile an eager nablax epoch")
    p.add_argument(
        "--settle",
        type=float,
        default=0.01,
        help="seconds of sleep before each timed epoch (default 0.01; 0 runs the epochs back to "
        "back, as a training loop does)",
    )
    p.add_argument(
        "--warm",
        type=int,
        default=0,
        help="untimed epochs of the same peer right before each timed one (default 0)",
    )
    args = p.parse_args(argv)
    epochs = args.epochs or (8 if args.quick else 40)
    t_start = time.perf_counter()
    default_threads = torch.get_num_threads()

    print(environment(torch), flush=True)
    print(threads(torch), flush=True)
    params, (batches, (x_test, y_test)) = init_params(), load_data()
    print(
        f"digits: {N_TRAIN} training samples in {len(batches)} batches of {BATCH} per epoch, "
        f"{len(y_test)} test samples; MLP {'-'.join(map(str, SIZES))}, float32, softmax "
        f"cross-entropy, Adam lr={LR:g}; epoch 1 from empty caches, then {WARMUP} warm-up and "
        f"{epochs} timed epochs per peer (each ends with every parameter computed; "
        f"{args.settle:g} s of sleep and {args.warm} untimed epoch(s) of the same peer before "
        "each)",
        flush=True,
    )

    # ---- epoch 1 (compilation included) and the agreement check
    prime()
    first_s, first, diffs = first_epochs(params, batches, default_threads)
    scale = max(float(np.max(np.abs(a))) for a in first["jax.jit"].params_np())
    for name, d in diffs.items():
        print(
            f"- after 1 epoch, {name} vs jax.jit: max abs diff of parameters {d:.2e} "
            f"({d / scale:.1e} of max |p|)"
        )
    agree_ok = all(d / scale < 1e-4 for d in diffs.values())
    print(
        f"{verdict(agree_ok)} correctness: every peer's parameters equal jax.jit's within 1e-4 of "
        "the largest |parameter| after one epoch (float32 rounding differs by op order, and Adam "
        "divides by sqrt(v), which magnifies it where gradients are tiny)",
        flush=True,
    )

    # ---- steady epochs: fresh runners, warm-up, then the peers interleaved epoch by epoch
    nx.clear_caches()
    runners = {name: make_runner(name, params, batches, default_threads) for name in ROWS}
    for r in runners.values():
        for _ in range(WARMUP):
            r.start()
            r.finish()
    times = time_blocks(
        {k: (r.start, r.finish) for k, r in runners.items()},
        epochs,
        1,
        settle_s=args.settle,
        warm=args.warm,
    )
    torch.set_num_threads(default_threads)
    med, low = med_best(times)
    ms = {k: v * 1e3 for k, v in med.items()}
    best = {k: v * 1e3 for k, v in low.items()}
    first_ms = {k: v * 1e3 for k, v in first_s.items()}
    acc = {k: 100.0 * r.accuracy(x_test, y_test) for k, r in runners.items()}
    torch.set_num_threads(default_threads)
    jit_ms, jit_best = ms["jax.jit"], best["jax.jit"]

    head = (
        "peer",
        "test acc",
        "epoch 1 (ms)",
        "median epoch (ms)",
        "best epoch (ms)",
        "median / jax.jit",
        "best / jax.jit",
        "XLA compiles (epoch 1 / timed)",
    )
    rows = [
        (
            k,
            f"{acc[k]:.1f}%",
            _fmt(first_ms[k]),
            _fmt(ms[k]),
            _fmt(best[k]),
            f"{ms[k] / jit_ms:.2f}x",
            f"{best[k] / jit_best:.2f}x",
            compile_cell(k, first[k], runners[k]),
        )
        for k in ROWS
    ]
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    print()
    for r in [head, *rows]:
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(r, widths))
            )
        )
    print()

    r_comp = ms["nx.compile"] / jit_ms
    print(
        f"{verdict(r_comp <= TARGET_COMPILE)} nx.compile epoch {ms['nx.compile']:.2f} ms = "
        f"{r_comp:.3f}x jax.jit {jit_ms:.2f} ms (target <= {TARGET_COMPILE}x; best epochs "
        f"{best['nx.compile'] / jit_best:.2f}x)"
    )
    torch_row = min(("torch", "torch 1 thread"), key=lambda k: ms[k])
    print(
        f"{verdict(ms['nablax'] < ms[torch_row])} eager nablax faster than PyTorch eager: "
        f"{ms['nablax']:.2f} ms vs {ms[torch_row]:.2f} ms = {ms['nablax'] / ms[torch_row]:.2f}x "
        f"(the faster torch row, '{torch_row}'; {default_threads} threads {ms['torch']:.2f} ms, "
        f"1 thread {ms['torch 1 thread']:.2f} ms)"
    )
    spread = max(acc.values()) - min(acc.values())
    print(
        f"{verdict(spread <= ACC_SPREAD)} final test accuracies within {ACC_SPREAD:g} points of "
        f"each other: {min(acc.values()):.1f}% to {max(acc.values()):.1f}% ({len(y_test)} test "
        f"samples, after {WARMUP + epochs} epochs of training)"
    )
    print(
        f"- eager nablax epoch = {ms['nablax'] / jit_ms:.2f}x jax.jit; read-once epoch = "
        f"{ms['nablax read-once'] / ms['nablax']:.2f}x the read-every-step loop"
    )
    comp, jr = runners["nx.compile"], runners["jax.jit"]
    info = comp.fn.cache_info()
    print(
        f"- nablax counters: nx.compile step {info.traces} trace(s), {info.executables} "
        f"executable(s), {info.hits} cache hits; nx.cache_info().compiles in epoch 1 / timed "
        f"epochs: nx.compile {first['nx.compile'].nx_log[0]} / {sum(comp.nx_log[WARMUP:])}, "
        f"nablax {first['nablax'].nx_log[0]} / {sum(runners['nablax'].nx_log[WARMUP:])}, "
        f"read-once {first['nablax read-once'].nx_log[0]} / "
        f"{sum(runners['nablax read-once'].nx_log[WARMUP:])}"
    )
    print(
        f"- jax counters: jax_step._cache_size() = {jr.step._cache_size()}; XLA compiles named "
        f"jit(jax_step) over the whole run: {XLA.by_name['jit(jax_step)']} (one per fresh jit "
        "function: epoch 1 and the steady runner)"
    )
    warn = load_warning()
    if warn:
        print(f"- warning: {warn}")
    print(f"- load average at the end {os.getloadavg()[0]:.2f}")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")

    if args.markdown:
        print()
        print(
            f"MLP 64-256-256-10, Adam, batch 64, {len(batches)} steps per epoch on digits; "
            f"{default_threads} torch threads; median and best of {epochs} epochs; epoch 1 "
            "includes compilation; accuracy on the 325 held-out digits."
        )
        print()
        print(
            "| peer | test accuracy | epoch 1 (ms) | steady epoch, median (ms) | best (ms) "
            "| median vs jax.jit | XLA compiles (epoch 1 / timed) |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for k, a, f1, m, b, rm, _, c in rows:
            print(f"| {k} | {a} | {f1} | {m} | {b} | {rm} | {c} |")

    if args.profile:
        r = runners["nablax"]
        print()
        print(eager_split(r))
        print("cProfile of one steady-state eager nablax epoch (read every step):")
        print(profile(lambda: (r.epoch(), r.sync()), 20))
    return 0


if __name__ == "__main__":
    sys.exit(main())

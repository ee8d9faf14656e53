"""MLP training step: plain eager nablax against ``jax.jit`` and PyTorch eager, in one process.

Run from the repository root::

    python bench/bench_mlp.py              # about 15 s on 2 idle cores
    python bench/bench_mlp.py --quick      # fewer blocks (about 6 s)
    python bench/bench_mlp.py --profile    # also: nablax step split, cProfile of the eager step

The model is an MLP 784-512-512-10 (ReLU), batch 128, float32, softmax cross-entropy (mean over
the batch, integer class labels picked with ``take_along_axis``), plain SGD with ``lr = 0.01``;
parameters are a pytree (a list of ``(W, b)`` tuples). Every peer starts from the same parameters
and cycles through the same few batches. Peers:

- **nablax** (the target): ordinary eager code, no ``compile``::

      loss, grads = nx.value_and_grad(loss_fn)(params, x, y)
      params = nx.tree.map(lambda p, g: p - lr * g, params, grads)
      loss.item()

- **nx.compile**: the same step function under ``nx.compile`` (for reference, no target).
- **jax.jit**: a jitted step doing ``jax.value_and_grad`` and the same update.
- **torch** (if installed): the same model eagerly, ``loss.backward()``, SGD under ``no_grad``.

Every step reads its loss to the host (``loss.item()`` / ``float(loss)``), as a training loop that
logs its loss does. Reading the loss does not wait for the parameter update: nablax runs the
loss's part of the step and dispatches the backward pass and update asynchronously, and
``jax.jit`` returns the new parameters as futures. So steps are timed in blocks of 5 that end with
**every updated parameter computed** (``Tensor.block_until_ready()`` on each nablax parameter,
``jax.block_until_ready`` on the JAX pytree; PyTorch is synchronous on the CPU): the whole step is
charged to the peer that ran it. The peers take turns block by block (order rotated each round),
so machine load hits all alike; reported are the median and the best block, per step.

Before timing, the script runs 5 steps of every peer from identical parameters and prints the
largest absolute difference of the losses and of the final parameters against JAX.

The thread counts are printed: PyTorch's OpenMP workers wait for each other at the end of every
op, so on a machine where other processes hold cores its multi-threaded median can be many times
its best (compare the best blocks, or pass ``--torch-threads 1``).

Target: the eager nablax step <= 1.1x ``jax.jit`` and faster than PyTorch eager (median over blocks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx
from _common import environment, load_warning, med_best, profile, threads, time_blocks, verdict
from _common import fmt as _fmt

try:  # PyTorch is optional: `pip install -e ".[bench]"`
    import torch
except ImportError:  # pragma: no cover - depends on the environment
    torch = None

SIZES = (784, 512, 512, 10)
BATCH = 128
LR = 0.01
N_BATCHES = 4  # distinct batches, cycled
AGREE_STEPS = 5
BLOCK = 5  # steps per timed block, ending with every parameter computed
TARGET = 1.1  # eager nablax step / jax.jit step
COLUMNS = ("nablax", "nx.compile", "jax.jit", "torch")


# ---- data and parameters (NumPy, shared by every peer) ---------------------------------------


def init_params(seed: int = 0) -> list[tuple[np.ndarray, np.ndarray]]:
    """He-normal weights, zero biases, float32."""
    rng = np.random.default_rng(seed)
    params = []
    for fan_in, fan_out in zip(SIZES[:-1], SIZES[1:]):
        w = rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)
        params.append((w.astype(np.float32), np.zeros(fan_out, np.float32)))
    return params


def make_batches(seed: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """``N_BATCHES`` batches of float32 inputs and int32 class labels in ``[0, 10)``."""
    rng = np.random.default_rng(seed)
    return [
        (
            rng.standard_normal((BATCH, SIZES[0])).astype(np.float32),
            rng.integers(0, SIZES[-1], BATCH).astype(np.int32),
        )
        for _ in range(N_BATCHES)
    ]


# ---- nablax: plain eager code ----------------------------------------------------------------


def nx_loss(params, x, y):
    """Mean softmax cross-entropy of the MLP on ``(x, y)``."""
    h = x
    for w, b in params[:-1]:
        h = nx.relu(h @ w + b)
    w, b = params[-1]
    logp = nx.log_softmax(h @ w + b, axis=-1)
    return -nx.mean(nx.take_along_axis(logp, y[:, None], axis=1))


_nx_value_and_grad = nx.value_and_grad(nx_loss)


def nx_build_step(params, x, y):
    """One SGD step as lazy tensors: ``(loss, new_params)``; nothing runs yet."""
    loss, grads = _nx_value_and_grad(params, x, y)
    return loss, nx.tree.map(lambda p, g: p - LR * g, params, grads)


class NablaxRunner:
    """Eager nablax training state; ``step()`` builds one step and reads its loss.

    With ``compiled=True`` the step function runs under a fresh ``nx.compile``."""

    def __init__(self, params_np, batches_np, compiled: bool = False):
        self.params = [(nx.tensor(w), nx.tensor(b)) for w, b in params_np]
        self.batches = [(nx.tensor(x), nx.tensor(y)) for x, y in batches_np]
        self.fn = nx.compile(nx_build_step) if compiled else nx_build_step
        self.i = 0
        self.build_s: list[float] = []
        self.realize_s: list[float] = []

    def step(self) -> float:
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        t0 = time.perf_counter()
        loss, self.params = self.fn(self.params, x, y)
        t1 = time.perf_counter()
        value = loss.item()  # realizes the step (the loss first, the rest asynchronously)
        self.build_s.append(t1 - t0)
        self.realize_s.append(time.perf_counter() - t1)
        return value

    def sync(self) -> None:
        """Wait until every parameter is computed."""
        for p in nx.tree.leaves(self.params):
            p.block_until_ready()

    def params_np(self) -> list[np.ndarray]:
        return [p.numpy() for p in nx.tree.leaves(self.params)]


# ---- JAX: jax.jit of the whole step ----------------------------------------------------------


def jax_loss(params, x, y):
    """The same loss as :func:`nx_loss`, in JAX."""
    h = x
    for w, b in params[:-1]:
        h = jax.nn.relu(h @ w + b)
    w, b = params[-1]
    logp = jax.nn.log_softmax(h @ w + b, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def make_jax_step() -> Callable:
    """A new jitted step function (a fresh Python function, so nothing is cached for it)."""

    def step(params, x, y):
        loss, grads = jax.value_and_grad(jax_loss)(params, x, y)
        return loss, jax.tree.map(lambda p, g: p - LR * g, params, grads)

    return jax.jit(step)


class JaxRunner:
    def __init__(self, params_np, batches_np):
        self.params = [(jnp.asarray(w), jnp.asarray(b)) for w, b in params_np]
        self.batches = [(jnp.asarray(x), jnp.asarray(y)) for x, y in batches_np]
        self.fn = make_jax_step()
        self.i = 0

    def step(self) -> float:
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        loss, self.params = self.fn(self.params, x, y)
        return float(loss)

    def sync(self) -> None:
        jax.block_until_ready(self.params)

    def params_np(self) -> list[np.ndarray]:
        return [np.asarray(p) for p in jax.tree.leaves(self.params)]


# ---- PyTorch eager ---------------------------------------------------------------------------


class TorchRunner:
    def __init__(self, params_np, batches_np):
        self.params = [
            (
                torch.from_numpy(w.copy()).requires_grad_(),
                torch.from_numpy(b.copy()).requires_grad_(),
            )
            for w, b in params_np
        ]
        self.batches = [
            (torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64)))
            for x, y in batches_np
        ]
        self.i = 0

    def step(self) -> float:
        F = torch.nn.functional
        x, y = self.batches[self.i % N_BATCHES]
        self.i += 1
        h = x
        for w, b in self.params[:-1]:
            h = F.relu(h @ w + b)
        w, b = self.params[-1]
        logp = F.log_softmax(h @ w + b, dim=-1)
        loss = -logp.gather(1, y[:, None]).mean()
        loss.backward()
        with torch.no_grad():
            for w, b in self.params:
                w -= LR * w.grad
                b -= LR * b.grad
                w.grad = None
                b.grad = None
        return float(loss.detach())

    def sync(self) -> None:
        """PyTorch eager is synchronous on the CPU: nothing left to wait for."""

    def params_np(self) -> list[np.ndarray]:
        return [p.detach().numpy().copy() for wb in self.params for p in wb]


def make_runners(params, batches) -> dict[str, object]:
    runners: dict[str, object] = {
        "nablax": NablaxRunner(params, batches),
        "nx.compile": NablaxRunner(params, batches, compiled=True),
        "jax.jit": JaxRunner(params, batches),
    }
    if torch is not None:
        runners["torch"] = TorchRunner(params, batches)
    return runners


# ---- measurements ----------------------------------------------------------------------------


def agreement() -> tuple[dict[str, tuple[float, float]], bool]:
    """``AGREE_STEPS`` steps of every peer from identical parameters and data: per peer, the
    largest absolute difference to JAX of the losses and of the final parameters."""
    runners = make_runners(init_params(), make_batches())
    losses = {k: [r.step() for _ in range(AGREE_STEPS)] for k, r in runners.items()}
    finals = {k: r.params_np() for k, r in runners.items()}
    out = {}
    for k in runners:
        if k == "jax.jit":
            continue
        dl = max(abs(a - b) for a, b in zip(losses[k], losses["jax.jit"]))
        dp = max(float(np.max(np.abs(a - b))) for a, b in zip(finals[k], finals["jax.jit"]))
        out[k] = (dl, dp)
    ok = all(dl <= 1e-4 and dp <= 1e-5 for k, (dl, dp) in out.items() if k != "torch")
    return out, ok


def first_step(reps: int) -> dict[str, float]:
    """Median seconds of the first step of a never-compiled graph: eager nablax with its caches
    cleared, a fresh ``nx.compile``, a fresh ``jax.jit``. All include tracing, lowering and XLA
    compilation (and reading the loss)."""
    params, batches = init_params(), make_batches()
    times: dict[str, list[float]] = {"nablax": [], "nx.compile": [], "jax.jit": []}
    for _ in range(reps):
        for name in times:
            nx.clear_caches()
            if name == "jax.jit":
                r = JaxRunner(params, batches)
            else:
                r = NablaxRunner(params, batches, compiled=name == "nx.compile")
            t0 = time.perf_counter()
            r.step()
            r.sync()
            times[name].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def program_split(steps: int) -> tuple[float, float, float] | None:
    """Median ms per step of graph building, realization, and the XLA programs inside it.

    Times the cached executables by wrapping ``nablax.core.realize._compile`` (a private hook,
    for this diagnosis only; ``None`` if it is not there). The wrapper waits for each program's
    results, so nothing overlaps here: "programs" is their run time per step (the loss's program
    plus the rest), and realization minus programs is nablax's own work: collecting the graph,
    structure keys, cache lookups, dispatch, storing the results, copying the loss to the host.
    """
    try:
        from nablax.core import realize as realize_mod

        original = realize_mod._compile
    except (ImportError, AttributeError):
        return None
    running = [0.0]

    def timed_compile(*args, **kwargs):
        fn = original(*args, **kwargs)

        def timed(*a):
            t0 = time.perf_counter()
            out = jax.block_until_ready(fn(*a))
            running[0] += time.perf_counter() - t0
            return out

        return timed

    realize_mod._compile = timed_compile
    program_s: list[float] = []
    try:
        nx.clear_caches()
        r = NablaxRunner(init_params(), make_batches())
        for _ in range(steps + 3):
            running[0] = 0.0
            r.step()
            r.sync()
            program_s.append(running[0])
    finally:
        realize_mod._compile = original
        nx.clear_caches()
    med = statistics.median
    return med(r.build_s[3:]) * 1e3, med(r.realize_s[3:]) * 1e3, med(program_s[3:]) * 1e3


def profile_nablax(steps: int, top: int = 25) -> str:
    """cProfile of ``steps`` steady-state eager nablax steps: top functions by own time, then by
    cumulative time."""
    r = NablaxRunner(init_params(), make_batches())
    for _ in range(3):
        r.step()
    r.sync()

    def run() -> None:
        for _ in range(steps):
            r.step()
        r.sync()

    return profile(run, top)


# ---- report ----------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table; return 0 (missed targets are reported, not fatal)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer blocks (about 6 s)")
    p.add_argument("--blocks", type=int, default=None, help="timed blocks per peer (default 30)")
    p.add_argument("--profile", action="store_true", help="also profile the eager nablax step")
    p.add_argument(
        "--torch-threads",
        type=int,
        default=None,
        help="torch.set_num_threads(N) (default: PyTorch's own choice, printed)",
    )
    args = p.parse_args(argv)
    if torch is not None and args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    blocks = args.blocks or (6 if args.quick else 30)
    warmup = 3 if args.quick else 5
    first_reps = 1 if args.quick else 3

    t_start = time.perf_counter()
    print(environment(torch), flush=True)
    print(threads(torch), flush=True)
    print(
        f"MLP {'-'.join(map(str, SIZES))}, batch {BATCH}, float32, softmax cross-entropy, "
        f"SGD lr={LR}; {blocks} timed blocks of {BLOCK} steps per peer (each block ends with "
        f"every parameter computed) after {warmup} warm-up steps",
        flush=True,
    )

    diffs, agree_ok = agreement()
    for name, (dl, dp) in diffs.items():
        print(
            f"- agreement after {AGREE_STEPS} steps, {name} vs jax.jit: max abs diff of losses "
            f"{dl:.2e}, of parameters {dp:.2e}",
            flush=True,
        )
    print(
        f"{verdict(agree_ok)} correctness: nablax (eager and compiled) equals jax.jit "
        "(losses within 1e-4, parameters within 1e-5)",
        flush=True,
    )
    first = first_step(first_reps)

    nx.clear_caches()
    runners = make_runners(init_params(), make_batches())
    for r in runners.values():
        for _ in range(warmup):
            r.step()
        r.sync()
    before = nx.cache_info()
    nxr = runners["nablax"]
    nxr.build_s.clear()
    nxr.realize_s.clear()
    times = time_blocks({k: (r.step, r.sync) for k, r in runners.items()}, blocks, BLOCK)
    info = nx.cache_info()
    med, low = med_best(times)
    ms = {k: v * 1e3 for k, v in med.items()}
    best = {k: v * 1e3 for k, v in low.items()}

    def ratios(d: dict[str, float]) -> str:
        parts = [f"nablax {d['nablax'] / d['jax.jit']:.2f}x jax.jit"]
        parts.append(f"nx.compile {d['nx.compile'] / d['jax.jit']:.2f}x jax.jit")
        if "torch" in d:
            parts.append(f"nablax {d['nablax'] / d['torch']:.2f}x torch")
        return "; ".join(parts)

    rows = [
        ("step, median over blocks (ms)", ms, ratios(ms)),
        ("step, best block (ms)", best, ratios(best)),
        (
            "first step, new graph (ms)",
            {k: v * 1e3 for k, v in first.items()},
            f"nablax {first['nablax'] / first['jax.jit']:.2f}x jax.jit",
        ),
    ]
    print()
    print("| case | " + " | ".join(COLUMNS) + " | ratios |")
    print("|---|" + "---:|" * len(COLUMNS) + "---|")
    for case, vals, ratio in rows:
        print(f"| {case} | " + " | ".join(_fmt(vals.get(c)) for c in COLUMNS) + f" | {ratio} |")
    print()
    ratio = ms["nablax"] / ms["jax.jit"]
    print(
        f"{verdict(ratio <= TARGET)} eager MLP step: nablax {ms['nablax']:.2f} ms = {ratio:.3f}x "
        f"jax.jit {ms['jax.jit']:.2f} ms (target <= {TARGET:g}x; median over {blocks} blocks of "
        f"{BLOCK} steps; best blocks {best['nablax'] / best['jax.jit']:.2f}x)"
    )
    print(
        f"- eager nablax step split (median): graph building {statistics.median(nxr.build_s) * 1e3:.2f}"
        f" ms (value_and_grad + tree.map, Python), loss.item() "
        f"{statistics.median(nxr.realize_s) * 1e3:.2f} ms (graph walk, cache lookup, dispatch, "
        "waiting for the loss); the backward pass and update finish asynchronously"
    )
    print(
        f"- nablax realization cache during timing: {info.compiles - before.compiles} compile(s), "
        f"{info.hits - before.hits} hit(s); nx.cache_info() {info}"
    )
    warn = load_warning()
    if warn:
        print(f"- warning: {warn}")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.profile:
        steps = 20 if args.quick else 100
        split = program_split(steps)
        if split is not None:
            b_ms, r_ms, p_ms = split
            print(
                f"- profile, eager step split with every program waited for: graph building "
                f"{b_ms:.2f} ms + loss.item() {r_ms:.2f} ms; XLA programs {p_ms:.2f} ms, nablax "
                f"bookkeeping {b_ms + r_ms - p_ms:.2f} ms per step"
            )
        print()
        print(f"cProfile of {steps} steady-state eager nablax steps:")
        print(profile_nablax(steps))
    return 0


if __name__ == "__main__":
    sys.exit(main())

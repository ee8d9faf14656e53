"""Training a transformer: examples/gpt.py's character-level GPT, step by step, five ways in one
process.

Run from the repository root::

    python bench/bench_gpt.py                  # small model, a few minutes on 2 cores
    python bench/bench_gpt.py --quick          # fewer steps (a smoke run)
    python bench/bench_gpt.py --model large    # 6 layers, width 384, context 256, batch 64
    python bench/bench_gpt.py --device gpu     # on a GPU (JAX with CUDA, PyTorch with CUDA)
    python bench/bench_gpt.py --markdown       # also: the table as markdown for the README

Model (examples/gpt.py's ``GPT``): token + position embeddings, pre-norm blocks (LayerNorm,
causal multi-head self-attention ``softmax(q k^T / sqrt(d) + mask) v``, a GELU-tanh MLP of width
4x), final LayerNorm, linear head over the 97-character vocabulary; mean next-character
cross-entropy on windows of the standard library's ``.py`` text. ``small`` (the default): 2 layers,
width 128, 4 heads, context 64, batch 16; ``large``: 6 layers, width 384, 6 heads, context 256,
batch 64. Optimizer in every peer: the global gradient norm clipped to 1.0 (optax's formula:
scaled by ``1 / norm`` when ``norm >= 1``) then AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8, weight
decay 0.01 on every parameter, ``torch.optim.AdamW``'s formula). Every peer starts from the same
weights (a ``torch.nn`` model's default initialisation, copied into nablax and JAX) and trains on
the same batches in the same order. Peers:

- **nablax** (eager): examples/gpt.py's model and step (``nn`` + ``optim.chain(
  optim.clip_by_global_norm(1.0), optim.adamw(...))``), the loss read every step; attention by
  ``nn.functional.scaled_dot_product_attention`` where this nablax has it (one graph node; the
  kernel layer picks the implementation), else written out (``--attention manual`` forces that);
- **nx.compile**: the same step under ``nx.compile``;
- **jax.jit**: a hand-written pure-JAX model (the same math) with a hand-written clip + AdamW, the
  whole step jitted;
- **torch**: ``torch.nn`` modules with the same attention written out, ``loss.backward()``, the
  clip written out (``torch.nn.utils.clip_grad_norm_`` adds 1e-6 to the norm) and
  ``torch.optim.AdamW``;
- **torch.compile**: the same model's forward and loss under ``torch.compile`` (the backward pass
  through AOTAutograd), the clip and AdamW eager. If it fails here, the reason is printed.
- torch and torch.compile run with PyTorch's default intra-op threads and again with
  ``torch.set_num_threads(1)`` ("1 thread" rows; CPU only): on a loaded machine its OpenMP
  threads can be many times slower than one. "vs torch eager" divides by the faster eager row.

Measurements. *Check*: each peer trains ``--check-steps`` steps from the shared weights and empty
caches (``nx.clear_caches()`` before each nablax peer; a fresh ``jax.jit`` and ``torch.compile``);
the losses of every step are compared with torch's and with jax.jit's (max relative difference
over the steps), the first step's time includes tracing and compilation, and the process's peak
resident memory is reset before the peer (``/proc/self/clear_refs``) and read after it (the rise
over the resident memory at its start; on a GPU also the device's peak). *Steady steps*: the
peers take turns in blocks of ``--block`` steps, in an order rotated every round (bench/_common.py's
``time_blocks``), each block ending with every parameter computed; the median and best ms/step.
*Compiles*: XLA backend compilations (a ``jax.monitoring`` listener) in the check and in the timed
steps, and nablax's ``nx.cache_info().compiles``. *Nodes*: the graph nodes one eager nablax step
builds (forward, backward, clip, AdamW), counted with the graph's creation counter.
*Build*: the time of nablax's eager step call alone (it builds the graph; nothing runs until the
loss is read), timed right after nablax's check and before any other peer runs in the process,
then after a pause, with warm caches, and once more after every peer ran (``build_times``); the
same figures are also given scaled by the machine's interpreter speed measured around them
(``sum(range(1000))``, against the 15.7 µs of the machine the target was set on), since a shared
machine's Python speed varies by up to 2x from day to day.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import resource
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import torch

import nablax as nx
from _common import (
    environment,
    fmt,
    interpreter_us,
    load_warning,
    med_best,
    threads,
    time_blocks,
    verdict,
)
from nablax.core import graph as _graph

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("gpt_example", ROOT / "examples" / "gpt.py")
gpt = importlib.util.module_from_spec(_spec)
sys.modules["gpt_example"] = gpt  # dataclasses look the module up while the file runs
_spec.loader.exec_module(gpt)

SIZES = {  # layers, width, heads, context, batch
    "small": (2, 128, 4, 64, 16),
    "large": (6, 384, 6, 256, 64),
}
BUILD_STEPS = 20  # eager steps whose graph building is timed
BUILD_PAUSE_S = 0.5  # the "settled" build's pause: the CPU runtime has released the last step
EVICT_BYTES = 64 * 2**20  # the "evicted" build's memory sweep: more than the processor's caches
BUILD_TARGET_MS = {"large": 3.0}  # issue 37: the 6-layer step's graph building, 2-core CPU
REFERENCE_US = 15.7  # interpreter_us() on that machine when the target was set
LR, B1, B2, EPS, WD, CLIP = 1e-3, 0.9, 0.999, 1e-8, 0.01, 1.0
VOCAB = len(gpt.VOCAB)
N_BATCHES = 16  # distinct batches, cycled
ROWS = (
    "nablax",
    "nx.compile",
    "jax.jit",
    "torch",
    "torch 1 thread",
    "torch.compile",
    "torch.compile 1 thread",
)


class XlaCompiles:
    """Counts XLA backend compilations (JAX's and nablax's) through ``jax.monitoring``."""

    def __init__(self) -> None:
        self.total = 0
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **kwargs) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            self.total += 1


XLA = XlaCompiles()


# ---- memory ----------------------------------------------------------------------------------


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def reset_peak() -> bool:
    """Reset the process's peak resident size (Linux ``clear_refs`` 5); False where refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """Peak resident size since the last reset (``VmHWM``), else ``ru_maxrss`` (never reset)."""
    hwm = _status_kb("VmHWM")
    kb = hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024


def rss_mb() -> float:
    return (_status_kb("VmRSS") or 0) / 1024


# ---- the reference model in torch ------------------------------------------------------------


class TorchBlock(torch.nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        tnn = torch.nn
        self.ln1, self.qkv = tnn.LayerNorm(width), tnn.Linear(width, 3 * width)
        self.proj, self.ln2 = tnn.Linear(width, width), tnn.LayerNorm(width)
        self.fc, self.out = tnn.Linear(width, 4 * width), tnn.Linear(4 * width, width)
        self.heads = heads

    def forward(self, x, mask):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.reshape(b, t, h, c // h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-1, -2)) * (1.0 / (c // h) ** 0.5)
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TorchGPT(torch.nn.Module):
    def __init__(self, layers: int, width: int, heads: int, context: int):
        super().__init__()
        self.tok = torch.nn.Embedding(VOCAB, width)
        self.pos = torch.nn.Embedding(context, width)
        self.blocks = torch.nn.ModuleList(TorchBlock(width, heads) for _ in range(layers))
        self.ln_f = torch.nn.LayerNorm(width)
        self.head = torch.nn.Linear(width, VOCAB)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:t]
        i = torch.arange(t, device=idx.device)
        mask = i[:, None] >= i[None, :]
        for block in self.blocks:
            x = block(x, mask)
        return self.head(self.ln_f(x))


def torch_loss(model, x, y):
    logits = model(x)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


# ---- the same model in pure JAX ----------------------------------------------------------------


def jax_forward(p: dict, idx, layers: int, heads: int):
    ln = lambda x, pre: _jax_ln(x, p[pre + ".weight"], p[pre + ".bias"])
    lin = lambda x, pre: x @ p[pre + ".weight"].T + p[pre + ".bias"]
    b, t = idx.shape
    x = p["tok.weight"][idx] + p["pos.weight"][:t]
    i = jnp.arange(t)
    mask = i[:, None] >= i[None, :]
    for n in range(layers):
        pre = f"blocks.{n}."
        c = x.shape[-1]
        q, k, v = jnp.split(lin(ln(x, pre + "ln1"), pre + "qkv"), 3, axis=-1)
        q, k, v = (z.reshape(b, t, heads, c // heads).transpose(0, 2, 1, 3) for z in (q, k, v))
        att = (q @ k.swapaxes(-1, -2)) * (1.0 / (c // heads) ** 0.5)
        att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
        x = x + lin((att @ v).transpose(0, 2, 1, 3).reshape(b, t, c), pre + "proj")
        x = x + lin(jax.nn.gelu(lin(ln(x, pre + "ln2"), pre + "fc"), approximate=True), pre + "out")
    return lin(ln(x, "ln_f"), "head")


def _jax_ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * w + b


def make_jax_step(layers: int, heads: int):
    def loss_fn(p, x, y):
        logp = jax.nn.log_softmax(jax_forward(p, x, layers, heads), axis=-1)
        return -jnp.mean(jnp.take_along_axis(logp, y[..., None], axis=-1))

    def step(p, m, v, t, x, y):
        loss, g = jax.value_and_grad(loss_fn)(p, x, y)
        norm = jnp.sqrt(sum(jnp.sum(a * a) for a in jax.tree.leaves(g)))
        g = jax.tree.map(lambda a: jnp.where(norm < CLIP, a, a / norm * CLIP), g)
        t = t + 1
        m = jax.tree.map(lambda m, g: B1 * m + (1 - B1) * g, m, g)
        v = jax.tree.map(lambda v, g: B2 * v + (1 - B2) * g * g, v, g)
        tf = t.astype(jnp.float32)
        c1, c2 = 1 - B1**tf, 1 - B2**tf

        def upd(p, m, v):
            p = p * (1 - LR * WD)
            return p - (LR / c1) * m / (jnp.sqrt(v) / jnp.sqrt(c2) + EPS)

        return loss, jax.tree.map(upd, p, m, v), m, v, t

    return jax.jit(step)


# ---- runners -------------------------------------------------------------------------------


class NablaxRunner:
    def __init__(self, state_np: dict, batches, cfg, compile: bool, attention: str):
        layers, width, heads, context, _ = cfg
        model = gpt.GPT(
            VOCAB, context, layers, width, heads, key=nx.random.key(0), attention=attention
        )
        paths = [p for p, _ in nx.tree.leaves_with_path(model)]
        names = [re.sub(r"\[(\d+)\]", r".\1", p).lstrip(".") for p in paths]
        leaves = [nx.tensor(state_np[n]) for n in names]
        self.model = nx.tree.unflatten(nx.tree.structure(model), leaves)
        self.opt = gpt.make_optimizer(LR, CLIP, WD)
        self.state = self.opt.init(self.model)
        self.step_fn = gpt.make_step(self.opt, compile)
        self.batches = [(nx.tensor(x), nx.tensor(y)) for x, y in batches]
        self.i = 0

    def step(self) -> float:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.model, self.state, loss = self.step_fn(self.model, self.state, x, y)
        return loss.item()

    def sync(self) -> None:
        nx.block_until_ready((self.model, self.state))

    def nodes_per_step(self) -> int:
        """Graph nodes built by one eager step (nothing runs until the loss is read)."""
        x, y = self.batches[0]
        a = _graph._next_seq()
        self.model, self.state, loss = self.step_fn(self.model, self.state, x, y)
        n = _graph._next_seq() - a - 1
        loss.item()
        return n

    def build_times(
        self, n: int, warm: bool = False, pause: float = 0.0, evict: bool = False
    ) -> list[float]:
        """Seconds of graph building of ``n`` eager steps: the step function's call alone (it
        builds the forward, backward, clip and AdamW nodes; nothing runs until the loss is read,
        which happens after the clock stops, as does waiting for the step's programs).

        By default each build starts as soon as the previous step's values are ready, as in a
        training loop. On the CPU the XLA runtime is then still releasing the previous step's
        temporary buffers on one of its threads (unmapping about 1 GB for the large model takes
        about 0.3 s on the 2-core machine), and that work runs beside the build. ``pause``: sleep
        that many seconds first, so the build finds the runtime idle.

        ``warm``: build each step's graph once first and drop it (nothing runs), so the timed
        build finds the processor's caches warm, as a GPU host's stay while the device computes.
        ``evict``: after that, read and write a 64 MiB NumPy array (more than the processor's
        caches), so the timed build finds its code and data evicted again: equal to the first
        figure, this shows that the cold build's extra time is cache misses, not other work."""
        out = []
        sweep = np.ones(EVICT_BYTES // 8) if evict else None
        for i in range(n):
            x, y = self.batches[i % len(self.batches)]
            if pause:
                time.sleep(pause)
            if warm:
                self.step_fn(self.model, self.state, x, y)  # built and dropped, never run
            if sweep is not None:
                sweep += 1.0  # every cache line of 64 MiB read and written
            t0 = time.perf_counter()
            self.model, self.state, loss = self.step_fn(self.model, self.state, x, y)
            out.append(time.perf_counter() - t0)
            loss.item()
            self.sync()
        return out


class JaxRunner:
    def __init__(self, state_np: dict, batches, cfg, device):
        layers, _, heads, _, _ = cfg
        put = lambda a: jax.device_put(jnp.asarray(a), device)
        self.p = {k: put(v) for k, v in state_np.items()}
        self.m = jax.tree.map(jnp.zeros_like, self.p)
        self.v = jax.tree.map(jnp.zeros_like, self.p)
        self.t = put(np.int32(0))
        self.fn = make_jax_step(layers, heads)
        self.batches = [(put(x), put(y)) for x, y in batches]
        self.i = 0

    def step(self) -> float:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        loss, self.p, self.m, self.v, self.t = self.fn(self.p, self.m, self.v, self.t, x, y)
        return float(loss)

    def sync(self) -> None:
        jax.block_until_ready((self.p, self.m, self.v, self.t))


class TorchRunner:
    def __init__(self, state_np: dict, batches, cfg, device, compile: bool, n_threads: int):
        self.model = TorchGPT(*cfg[:4]).to(device)
        self.model.load_state_dict({k: torch.from_numpy(v) for k, v in state_np.items()})
        self.params = list(self.model.parameters())
        self.opt = torch.optim.AdamW(self.params, lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
        self.loss = torch.compile(torch_loss) if compile else torch_loss
        self.batches = [
            (torch.from_numpy(x).long().to(device), torch.from_numpy(y).long().to(device))
            for x, y in batches
        ]
        self.device, self.i, self.n_threads = device, 0, n_threads

    def step(self) -> float:
        torch.set_num_threads(self.n_threads)
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        self.opt.zero_grad(set_to_none=True)
        loss = self.loss(self.model, x, y)
        loss.backward()
        with torch.no_grad():  # optax's clip_by_global_norm (clip_grad_norm_ adds 1e-6)
            grads = [p.grad for p in self.params]
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            # decided on the device, as in the other peers (no host sync on a GPU)
            torch._foreach_mul_(grads, torch.where(norm < CLIP, 1.0, CLIP / norm))
        self.opt.step()
        return loss.item()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()


# ---- the benchmark -------------------------------------------------------------------------------


def make_batches(cfg, seed: int = 0):
    text, _ = gpt.load_text(500_000)
    data = gpt.encode(text)
    return [gpt.get_batch(data, cfg[4], cfg[3], seed, i) for i in range(N_BATCHES)]


def make_runner(name: str, state_np, batches, cfg, devices):
    if name == "jax.jit":
        return JaxRunner(state_np, batches, cfg, devices["jax"])
    if name.startswith("torch"):
        n = 1 if name.endswith("1 thread") else devices["threads"]
        compiled = name.startswith("torch.compile")
        return TorchRunner(state_np, batches, cfg, devices["torch"], compiled, n)
    return NablaxRunner(state_np, batches, cfg, name == "nx.compile", devices["attention"])


def check(name: str, state_np, batches, cfg, devices, steps: int) -> dict:
    """``steps`` steps from the shared weights and empty caches: losses, timings, memory."""
    if name.startswith("n"):
        nx.clear_caches()
    if devices["torch"].type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    reset_peak()
    rss0 = rss_mb()
    r = make_runner(name, state_np, batches, cfg, devices)
    x0, n0 = XLA.total, nx.cache_info().compiles  # the steps' compiles, not the set-up's
    times, losses = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        losses.append(r.step())
        times.append(time.perf_counter() - t0)
    r.sync()
    out = {
        "runner": r,
        "losses": losses,
        "first_ms": times[0] * 1e3,
        "mem_mb": peak_rss_mb() - rss0,
        "xla": XLA.total - x0,
        "nx": nx.cache_info().compiles - n0,
    }
    if devices["torch"].type == "cuda" and name.startswith("torch"):
        out["dev_mb"] = torch.cuda.max_memory_allocated() / 2**20
    elif devices["torch"].type == "cuda":
        stats = devices["jax"].memory_stats() or {}
        out["dev_mb"] = stats.get("peak_bytes_in_use", 0) / 2**20  # since start: never reset
    return out


def max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def prime(devices) -> None:
    """Pay each framework's one-time start-up (not a peer's compilation) before the check."""
    lin = torch.nn.Linear(2, 2).to(devices["torch"])
    opt = torch.optim.AdamW(lin.parameters())
    lin(torch.ones(1, 2, device=devices["torch"])).sum().backward()
    opt.step()
    g = nx.grad(lambda w: (w * w).sum())(nx.ones(2))
    nx.block_until_ready(g)
    jax.block_until_ready(jax.jit(jax.grad(lambda w: (w * w).sum()))(jnp.ones(2)))
    nx.clear_caches()


def select_devices(kind: str) -> dict:
    threads = torch.get_num_threads()  # torch's default, restored after each 1-thread step
    if kind == "gpu":
        if jax.default_backend() != "gpu" or not torch.cuda.is_available():
            sys.exit(
                f"bench_gpt --device gpu: jax's backend is {jax.default_backend()!r} and torch "
                f"CUDA is {'available' if torch.cuda.is_available() else 'unavailable'}; install "
                "jax[cuda] and a CUDA torch, or run with --device cpu"
            )
        # float32 matmuls in full precision everywhere (nablax's default, torch's default)
        jax.config.update("jax_default_matmul_precision", "highest")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return {"jax": jax.devices("gpu")[0], "torch": torch.device("cuda"), "threads": threads}
    jax.config.update("jax_platforms", "cpu")  # before any computation picks a backend
    if jax.default_backend() != "cpu":  # a backend was chosen already: nablax follows it
        sys.exit("bench_gpt --device cpu: JAX already runs on a GPU here; set JAX_PLATFORMS=cpu")
    return {"jax": jax.devices("cpu")[0], "torch": torch.device("cpu"), "threads": threads}


def build_figures(runner: NablaxRunner) -> tuple[list[float], ...]:
    """Graph building of eager steps in ms: right after the previous step, after a pause that
    lets the runtime finish releasing its memory, with warm caches, and with warm caches evicted
    again by a memory sweep."""
    ms = lambda ts: [t * 1e3 for t in ts]  # noqa: E731
    return (
        ms(runner.build_times(BUILD_STEPS)),
        ms(runner.build_times(BUILD_STEPS // 2, pause=BUILD_PAUSE_S)),
        ms(runner.build_times(BUILD_STEPS // 2, warm=True)),
        ms(runner.build_times(BUILD_STEPS // 2, warm=True, evict=True)),
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(SIZES), default="small")
    p.add_argument("--device", choices=["cpu", "gpu"], default="cpu")
    p.add_argument("--check-steps", type=int, default=10, help="steps compared per peer")
    p.add_argument("--rounds", type=int, default=8, help="timed blocks per peer")
    p.add_argument("--block", type=int, default=5, help="steps per timed block")
    p.add_argument("--quick", action="store_true", help="3 check steps, 3 rounds of 3 steps")
    p.add_argument("--no-torch-compile", action="store_true", help="leave torch.compile out")
    p.add_argument("--markdown", action="store_true", help="also print a markdown table")
    p.add_argument(
        "--attention",
        choices=["auto", "manual", "sdpa"],
        default="auto",
        help="nablax's attention: F.scaled_dot_product_attention ('sdpa', one graph node; 'auto' "
        "picks it where this nablax has it) or the same math written out ('manual')",
    )
    args = p.parse_args(argv)
    attention = args.attention
    if attention == "auto":
        attention = "sdpa" if "sdpa" in gpt.ATTENTION else "manual"
    if attention not in gpt.ATTENTION:
        sys.exit("bench_gpt: this nablax has no nn.functional.scaled_dot_product_attention")
    if args.quick:
        args.check_steps, args.rounds, args.block = 3, 3, 3
    devices = select_devices(args.device)
    devices["attention"] = attention
    cfg = SIZES[args.model]
    t_start = time.perf_counter()
    print(environment(torch), flush=True)
    print(threads(torch), flush=True)
    if args.device == "gpu":
        print(f"devices: jax {devices['jax']}, torch {torch.cuda.get_device_name()}")
    layers, width, heads, context, batch = cfg
    print(
        f"model {args.model}: {layers} layers, width {width}, {heads} heads, context {context}, "
        f"batch {batch}, vocabulary {VOCAB}; nablax attention: {attention}; clip {CLIP:g} + "
        f"AdamW lr {LR:g} wd {WD:g}; "
        f"{args.check_steps} check steps per peer from empty caches, then {args.rounds} rounds "
        f"of {args.block}-step blocks, interleaved",
        flush=True,
    )
    torch.manual_seed(0)
    state_np = {k: v.detach().numpy().copy() for k, v in TorchGPT(*cfg[:4]).state_dict().items()}
    print(f"parameters: {sum(v.size for v in state_np.values()) / 1e6:.2f} M")
    batches = make_batches(cfg)
    prime(devices)

    skip = {"torch.compile", "torch.compile 1 thread"} if args.no_torch_compile else set()
    if args.device == "gpu":  # CPU threads do not compute on a GPU
        skip |= {"torch 1 thread", "torch.compile 1 thread"}
    rows = [r for r in ROWS if r not in skip]
    checks, failed = {}, {}
    for name in rows:
        try:
            checks[name] = check(name, state_np, batches, cfg, devices, args.check_steps)
            if name == "nablax":  # its graph building, before any other peer has run here
                speed = interpreter_us()
                build, build_settled, build_warm, build_evicted = build_figures(
                    checks[name]["runner"]
                )
                speed = (speed + interpreter_us()) / 2
        except Exception as e:  # torch.compile may lack a compiler or a backend here
            if not name.startswith("torch.compile"):
                raise
            failed[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
            print(f"- {name} failed here, left out: {failed[name]}")
    rows = [r for r in rows if r in checks]
    ref_t, ref_j = checks["torch"]["losses"], checks["jax.jit"]["losses"]
    print(f"- losses, step 1 -> {args.check_steps}: " + ", ".join(
        f"{k} {c['losses'][0]:.4f} -> {c['losses'][-1]:.4f}" for k, c in checks.items()
    ))  # fmt: skip
    nx_runner = checks["nablax"]["runner"]
    nodes = nx_runner.nodes_per_step()
    build_after = [t * 1e3 for t in nx_runner.build_times(BUILD_STEPS)]

    runners = {k: checks[k]["runner"] for k in rows}
    xla_before, nx_before = XLA.total, nx.cache_info().compiles
    times = time_blocks({k: (r.step, r.sync) for k, r in runners.items()}, args.rounds, args.block)
    xla_timed, nx_timed = XLA.total - xla_before, nx.cache_info().compiles - nx_before
    med, low = med_best(times)
    ms = {k: v * 1e3 for k, v in med.items()}
    best = {k: v * 1e3 for k, v in low.items()}

    torch_row = min((k for k in rows if k in ("torch", "torch 1 thread")), key=ms.__getitem__)
    head = ["peer", "first step (ms)", "median ms/step", "best ms/step", "vs torch eager"]
    head += ["vs jax.jit"]
    head += ["max rel loss diff vs torch / jax.jit", "XLA compiles (check)", "peak RSS rise (MB)"]
    gpu = args.device == "gpu"
    if gpu:
        head.append("device peak (MiB)")
    table = []
    for k in rows:
        c = checks[k]
        row = [
            k,
            fmt(c["first_ms"]),
            fmt(ms[k]),
            fmt(best[k]),
            f"{ms[k] / ms[torch_row]:.2f}x",
            f"{ms[k] / ms['jax.jit']:.2f}x",
            f"{max_rel(c['losses'], ref_t):.1e} / {max_rel(c['losses'], ref_j):.1e}",
            "n/a" if k.startswith("torch") else str(c["xla"]),
            f"{c['mem_mb']:.0f}",
        ]
        if gpu:
            row.append(f"{c.get('dev_mb', 0):.0f}")
        table.append(row)
    widths = [max(len(str(r[i])) for r in [head, *table]) for i in range(len(head))]
    print()
    for r in [head, *table]:
        print("  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in
                        enumerate(zip(r, widths))))  # fmt: skip
    print()
    comp = checks["nx.compile"]["runner"].step_fn.cache_info()
    print(
        f"- nablax: an eager step builds {nodes} graph nodes (forward, backward, clip, AdamW); "
        f"nx.cache_info().compiles in the check: nablax {checks['nablax']['nx']}, nx.compile "
        f"{checks['nx.compile']['nx']}; nx.compile step: {comp.traces} trace(s), "
        f"{comp.executables} executable(s); in the timed steps: {nx_timed} nablax compiles, "
        f"{xla_timed} XLA compiles in all"
    )
    build_target = BUILD_TARGET_MS.get(args.model) if args.device == "cpu" else None
    median = statistics.median
    print(
        f"- nablax: graph building of an eager step (the step function's call, before the loss is "
        f"read), timed right after nablax's check, before any other peer ran: median "
        f"{median(build):.2f} ms, best {min(build):.2f} ms over {len(build)} steps, each built as "
        f"soon as the previous step's values were ready"
        + (
            f"; {verdict(median(build) <= build_target)} target <= {build_target} ms "
            f"(median, 2-core CPU)"
            if build_target
            else ""
        )
    )
    print(
        f"- nablax: the interpreter ran sum(range(1000)) in {speed:.1f} us around those builds; "
        f"scaled to the {REFERENCE_US} us of the machine the targets were set on, the build "
        f"figures are median {median(build) * REFERENCE_US / speed:.2f} ms (settled "
        f"{median(build_settled) * REFERENCE_US / speed:.2f}, warm "
        f"{median(build_warm) * REFERENCE_US / speed:.2f})"
    )
    print(
        f"- nablax: the same after a {BUILD_PAUSE_S:g} s pause (on the CPU the XLA runtime is still "
        f"releasing the previous step's buffers on one of its threads when the values are ready; "
        f"the pause lets it finish): median {median(build_settled):.2f} ms; with warm processor "
        f"caches too (each step's graph built once and dropped first, as a GPU host's caches stay "
        f"warm while the device computes): median {median(build_warm):.2f} ms, best "
        f"{min(build_warm):.2f} ms; warm, then the caches evicted by a {EVICT_BYTES >> 20} MiB "
        f"memory sweep: median {median(build_evicted):.2f} ms (close to the first figure: the "
        f"cold build's extra time is cache misses after the step's computation)"
    )
    print(
        f"- nablax: the first figure again after every peer ran in this process: median "
        f"{median(build_after):.2f} ms, best {min(build_after):.2f} ms (what the peers left in the "
        f"process stays: torch's threads and allocations)"
    )
    print(
        f"- vs torch eager: against the faster torch eager row ('{torch_row}', "
        f"{ms[torch_row]:.1f} ms/step); torch's default is {devices['threads']} threads"
    )
    print(
        "- losses compared at every one of the check steps; the relative difference grows with "
        "the steps (float32 rounding differs by operation order and Adam amplifies it)"
    )
    if reset_peak():
        print("- peak RSS rise: the peak resident size during the peer's check (reset before it)")
    else:
        print("- peak RSS rise: ru_maxrss deltas (could not reset the peak: later peers show only "
              "growth past earlier ones)")  # fmt: skip
    for k, why in failed.items():
        print(f"- {k}: not measured ({why})")
    warn = load_warning()
    if warn:
        print(f"- warning: {warn}")
    print(f"- total benchmark time {time.perf_counter() - t_start:.1f} s")
    if args.markdown:
        print()
        print("| " + " | ".join(head) + " |")
        print("|---|" + "---:|" * (len(head) - 1))
        for r in table:
            print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

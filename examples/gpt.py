"""Train a character-level GPT on Python's own source code, with ``nablax.nn`` and ``nablax.optim``.

The text ships with every Python: the standard library's ``.py`` files (the top level of
``sysconfig.get_paths()["stdlib"]``, sorted by name, concatenated until ``--data-mb`` megabytes;
nothing is downloaded). The last 10% is held out for evaluation. Run::

    python examples/gpt.py                       # 2 layers, width 128: about 2 minutes on 2 cores
    python examples/gpt.py --compile --steps 2000 --checkpoint gpt.safetensors
    python examples/gpt.py --steps 3000 --checkpoint gpt.safetensors --resume   # goes on exactly
    python examples/gpt.py --steps 0 --checkpoint gpt.safetensors --resume --sample 400

What it shows:

- a nanoGPT-style model written as ``nn.Module`` pytrees: token and position embeddings, pre-norm
  blocks (``LayerNorm``, causal multi-head self-attention, a GELU-tanh MLP), a final
  ``LayerNorm`` and a linear head;
- ``optim.chain(optim.clip_by_global_norm(1.0), optim.adamw(lr))`` in an optax-shaped loop; the
  step runs eagerly (every op recorded lazily, one program per step) or under ``nx.compile``;
- a progress bar on stderr, periodic evaluation on the held-out split;
- a checkpoint (``nx.save`` / ``nx.load``) holding the model, the optimizer state, the step and
  the data seed. Batch ``i`` is drawn by ``numpy.random.default_rng((seed, i))``, so the data
  position *is* the step: a resumed run sees the same batches and prints the same losses as one
  that never stopped (tests/test_gpt_example.py checks it);
- sampling with temperature (``nx.random.categorical``) from an eager decode loop that writes each new token into a
  fixed-size buffer (``buf.at[:, pos].set(tok)``) and masks the positions not yet written, so the
  shapes never change and the number of compiled programs stays bounded whatever the length.

**Attention.** ``attention`` uses ``nn.functional.scaled_dot_product_attention`` (one graph node,
implemented by the kernel layer) when this nablax has it, and otherwise the same math by hand:
``softmax(q @ k.T * scale + mask) @ v`` with the mask built by ``nx.where`` on an iota
comparison. ``--attention manual`` forces the hand-written form.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np

import nablax as nx
import nablax.nn.functional as F
from nablax import nn, optim

# ---- data ------------------------------------------------------------------------------------

# a fixed vocabulary (so checkpoints never depend on the text): newline, tab, printable ASCII;
# any other character reads as "?"
VOCAB = "\n\t" + "".join(chr(c) for c in range(32, 127))
_UNKNOWN = VOCAB.index("?")
_LOOKUP = np.full(0x110000, _UNKNOWN, np.uint8)
_LOOKUP[[ord(c) for c in VOCAB]] = np.arange(len(VOCAB), dtype=np.uint8)


def encode(text: str) -> np.ndarray:
    """Token ids (uint8) of ``text``; characters outside ``VOCAB`` become ``?``."""
    return _LOOKUP[np.frombuffer(text.encode("utf-32-le"), np.uint32)]


def decode(ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def load_text(max_bytes: int) -> tuple[str, int]:
    """The standard library's top-level ``.py`` files, sorted, concatenated up to ``max_bytes``
    characters; also the number of files read."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, total = [], 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        parts.append(text)
        total += len(text)
        if total >= max_bytes:
            break
    if not parts:
        sys.exit(f"examples/gpt.py: no .py files under {root}")
    return "".join(parts)[:max_bytes], len(parts)


def get_batch(data: np.ndarray, batch: int, context: int, seed: int, step: int, stream: int = 0):
    """Batch number ``step``: ``batch`` random windows of ``context + 1`` tokens, split into
    inputs and next-token targets (int32). A pure function of ``(seed, stream, step)``
    (``stream`` 0: training batches, 1: the held-out ones)."""
    rng = np.random.default_rng((seed, stream, step))
    starts = rng.integers(0, len(data) - context - 1, size=batch)
    win = data[starts[:, None] + np.arange(context + 1)].astype(np.int32)
    return win[:, :-1], win[:, 1:]


# ---- model -----------------------------------------------------------------------------------


def causal_mask(t: int) -> nx.Tensor:
    """``(t, t)`` booleans, True where query ``i`` may attend to key ``j`` (``j <= i``)."""
    i = nx.arange(t)
    return i[:, None] >= i[None, :]


def manual_attention(q, k, v, mask):
    """``softmax(q @ k^T / sqrt(d) + mask) @ v`` with a boolean ``mask`` (True: attend)."""
    scores = (q @ nx.swapaxes(k, -1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    scores = nx.where(mask, scores, float("-inf"))
    return nx.softmax(scores, axis=-1) @ v


_SDPA = getattr(F, "scaled_dot_product_attention", None)
# name -> (attention(q, k, v, mask), whether it applies the causal mask itself). One that does
# gets only the extra mask (None, or the keys ``valid`` hides); one that does not gets the full
# boolean mask, causal part included.
ATTENTION = {"manual": (manual_attention, False)}
if _SDPA is not None:
    ATTENTION["sdpa"] = (
        lambda q, k, v, mask: _SDPA(q, k, v, attn_mask=mask, is_causal=True),
        True,
    )


class Block(nn.Module):
    """A pre-norm transformer block: ``x + attn(ln1(x))``, then ``x + mlp(ln2(x))``."""

    ln1: nn.LayerNorm
    qkv: nn.Linear
    proj: nn.Linear
    ln2: nn.LayerNorm
    fc: nn.Linear
    out: nn.Linear
    heads: int = nn.field(static=True)
    attention: str = nn.field(static=True, default="manual")

    def __init__(self, width: int, heads: int, *, key, attention: str = "manual"):
        k1, k2, k3, k4 = nx.random.split(key, 4)
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, key=k1)
        self.proj = nn.Linear(width, width, key=k2)
        self.fc = nn.Linear(width, 4 * width, key=k3)
        self.out = nn.Linear(4 * width, width, key=k4)
        self.heads = heads
        self.attention = attention

    def __call__(self, x, mask):
        b, t, c = x.shape
        h = self.heads
        q, k, v = nx.split(self.qkv(self.ln1(x)), 3, axis=-1)
        q, k, v = (z.reshape(b, t, h, c // h).transpose(0, 2, 1, 3) for z in (q, k, v))
        y = ATTENTION[self.attention][0](q, k, v, mask)  # (b, h, t, c // h)
        x = x + self.proj(y.transpose(0, 2, 1, 3).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    tok: nn.Embedding
    pos: nn.Embedding
    blocks: list
    ln_f: nn.LayerNorm
    head: nn.Linear

    def __init__(self, vocab, context, layers, width, heads, *, key, attention="manual"):
        if width % heads:
            raise ValueError(f"GPT: width={width} is not divisible by heads={heads}")
        keys = nx.random.split(key, layers + 3)
        self.tok = nn.Embedding(vocab, width, key=keys[0])
        self.pos = nn.Embedding(context, width, key=keys[1])
        self.blocks = [
            Block(width, heads, key=keys[3 + i], attention=attention) for i in range(layers)
        ]
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, key=keys[2])

    def __call__(self, idx, valid=None):
        """Logits ``(b, t, vocab)`` of int ids ``(b, t)``. ``valid`` (``(t,)`` booleans) hides
        the keys where it is False, in addition to the causal mask."""
        t = idx.shape[1]
        x = self.tok(idx) + self.pos.weight[:t]
        extra = None if valid is None else valid[None, :]  # keys hidden beyond causality
        full = None  # causal_mask(t) and extra, built once if a block needs it
        for block in self.blocks:
            if ATTENTION[block.attention][1]:
                x = block(x, extra)
                continue
            if full is None:
                full = causal_mask(t) if extra is None else nx.logical_and(causal_mask(t), extra)
            x = block(x, full)
        return self.head(self.ln_f(x))


def loss_fn(model, x, y):
    logits = model(x)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def make_optimizer(lr: float, clip: float = 1.0, weight_decay: float = 0.01):
    return optim.chain(optim.clip_by_global_norm(clip), optim.adamw(lr, weight_decay=weight_decay))


def make_step(opt, compile: bool):
    def step(model, state, x, y):
        loss, grads = nx.value_and_grad(loss_fn)(model, x, y)
        updates, state = opt.update(grads, state, model)
        return optim.apply_updates(model, updates), state, loss

    return nx.compile(step) if compile else step


def evaluate(model, data, args, n_batches: int) -> float:
    """Mean loss over ``n_batches`` fixed held-out batches (the same ones at every evaluation)."""
    total = 0.0
    for i in range(n_batches):
        x, y = get_batch(data, args.batch, args.context, args.seed, i, stream=1)
        total += loss_fn(model, nx.tensor(x), nx.tensor(y)).item()
    return total / n_batches


# ---- sampling ----------------------------------------------------------------------------------

_CATEGORICAL = getattr(nx.random, "categorical", None)  # Gumbel-max by hand where missing


def sample(model, prompt: str, length: int, *, context: int, temperature: float, key, rows=1):
    """``rows`` continuations of ``prompt``, ``length`` characters each.

    The context lives in a fixed ``(rows, context)`` buffer. Every step is the same program:
    the model reads the buffer with keys past the last written position masked (row ``p - 1``
    of a lower-triangular table), the next token is written at its position with
    ``buf.at[:, pos].set(tok)``, and once the buffer is full it first slides left by one (chosen
    by a flag tensor, so filling and sliding share the program). Positions are runtime values,
    so the whole loop compiles one program whatever ``length`` is."""
    ids = encode(prompt)[-context:] if prompt else np.array([VOCAB.index("\n")], np.uint8)
    start = np.zeros((rows, context), np.int32)
    start[:, : len(ids)] = ids
    buf = nx.tensor(start)
    visible = nx.tril(nx.ones((context, context), dtype=nx.bool_))  # row p - 1: first p keys
    nx.realize(visible)
    pos = len(ids)  # the next position to write
    out = []
    for _ in range(length):
        key, sub = nx.random.split(key)
        p = min(pos, context)  # tokens in the buffer
        logits = model(buf, valid=visible[p - 1])[:, p - 1]
        if temperature <= 0:
            tok = nx.argmax(logits, axis=-1).astype(nx.int32)
        elif _CATEGORICAL is not None:
            tok = _CATEGORICAL(sub, logits / temperature)
        else:  # Gumbel-max: the same distribution
            u = nx.random.uniform(sub, logits.shape, minval=1e-20, maxval=1.0)
            tok = nx.argmax(logits / temperature - nx.log(-nx.log(u)), axis=-1).astype(nx.int32)
        full = nx.tensor(pos >= context)  # a value, not a program: filling and sliding share one
        buf = nx.where(full, nx.concatenate([buf[:, 1:], buf[:, :1]], axis=1), buf)
        buf = buf.at[:, min(pos, context - 1)].set(tok)
        pos += 1
        nx.realize(tok, buf, key)  # one program; nothing pending is carried to the next step
        out.append(tok.numpy())
    return [prompt + decode(col) for col in np.stack(out, axis=1)]


# ---- the loop ----------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on stderr (only when stderr is a terminal, or ``force``)."""

    def __init__(self, total: int, start: int, force: bool = False):
        self.total, self.start, self.t0 = total, start, time.perf_counter()
        self.on = force or sys.stderr.isatty()

    def update(self, done: int, loss: float) -> None:
        if not self.on or self.total <= 0:
            return
        width = 30
        fill = width * done // self.total
        rate = (done - self.start) / max(time.perf_counter() - self.t0, 1e-9)
        sys.stderr.write(
            f"\r[{'#' * fill}{'-' * (width - fill)}] {done}/{self.total} "
            f"loss {loss:.3f} {rate:.1f} it/s "
        )
        sys.stderr.flush()

    def clear(self) -> None:
        if self.on:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    ap.add_argument("--steps", type=int, default=1000, help="train until this step")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--context", type=int, default=64, help="characters per sequence")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--clip", type=float, default=1.0, help="max global gradient norm")
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--eval-batches", type=int, default=8)
    ap.add_argument("--checkpoint", type=Path, default=None, help="save here at every eval")
    ap.add_argument("--resume", action="store_true", help="start from --checkpoint")
    ap.add_argument("--sample", type=int, default=200, help="characters to sample at the end")
    ap.add_argument("--prompt", default="def ")
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data-mb", type=float, default=2.0, help="megabytes of stdlib text")
    ap.add_argument("--compile", action="store_true", help="run the step under nx.compile")
    ap.add_argument("--attention", choices=["auto", "manual", "sdpa"], default="auto")
    ap.add_argument("--progress", action="store_true", help="progress bar even when not a tty")
    ap.add_argument("--log", type=Path, default=None, help="write every loss here (JSON)")
    return ap


def main(argv: list[str] | None = None) -> dict:
    args = build_parser().parse_args(argv)
    if args.resume and args.checkpoint is None:
        sys.exit("examples/gpt.py: --resume needs --checkpoint PATH")
    attention = "sdpa" if args.attention == "auto" and "sdpa" in ATTENTION else args.attention
    if attention == "auto":
        attention = "manual"
    if attention not in ATTENTION:
        sys.exit("examples/gpt.py: this nablax has no nn.functional.scaled_dot_product_attention")

    text, n_files = load_text(int(args.data_mb * 1e6))
    data = encode(text)
    split = int(0.9 * len(data))
    train, val = data[:split], data[split:]
    if len(val) <= args.context + 1:
        sys.exit(
            f"examples/gpt.py: --data-mb {args.data_mb:g} gives {len(val)} held-out characters, "
            f"fewer than --context {args.context} + 1; read more text or shorten the context"
        )
    print(
        f"data: {len(data) / 1e6:.2f} M characters from {n_files} stdlib files, "
        f"{len(train)} train / {len(val)} held out; vocabulary {len(VOCAB)}"
    )

    model = GPT(
        len(VOCAB),
        args.context,
        args.layers,
        args.width,
        args.heads,
        key=nx.random.key(args.seed),
        attention=attention,
    )
    opt = make_optimizer(args.lr, args.clip, args.weight_decay)
    state = opt.init(model)
    start = 0
    if args.resume:
        like = {"model": model, "opt": state, "step": 0, "seed": 0}
        ckpt = nx.load(args.checkpoint, like=like)
        if ckpt["seed"] != args.seed:
            sys.exit(f"examples/gpt.py: {args.checkpoint} was trained with --seed {ckpt['seed']}")
        model, state, start = ckpt["model"], ckpt["opt"], ckpt["step"]
        print(f"resumed from {args.checkpoint} at step {start}")
    n_params = sum(p.size for p in nx.tree.leaves(model))
    print(
        f"model: {args.layers} layers, width {args.width}, {args.heads} heads, context "
        f"{args.context}, {n_params / 1e6:.2f} M parameters, attention {attention}; batch "
        f"{args.batch}, AdamW lr {args.lr:g}, clip {args.clip:g}, "
        f"{'nx.compile' if args.compile else 'eager'}"
    )

    step = make_step(opt, args.compile)
    log = {"train": {}, "val": {}}
    times, bar = [], Progress(args.steps, start, force=args.progress)
    compiles0 = nx.cache_info().compiles

    def save(i: int) -> None:
        if args.checkpoint is not None:
            nx.save(args.checkpoint, {"model": model, "opt": state, "step": i, "seed": args.seed})

    for i in range(start, args.steps):
        x, y = get_batch(train, args.batch, args.context, args.seed, i)
        t0 = time.perf_counter()
        model, state, loss = step(model, state, nx.tensor(x), nx.tensor(y))
        lv = loss.item()
        times.append(time.perf_counter() - t0)
        log["train"][i + 1] = lv
        bar.update(i + 1, lv)
        if (i + 1) % args.eval_every == 0 or i + 1 == args.steps:
            vl = evaluate(model, val, args, args.eval_batches)
            log["val"][i + 1] = vl
            bar.clear()
            print(f"step {i + 1:5d}  train loss {lv:.4f}  val loss {vl:.4f}", flush=True)
            save(i + 1)
    bar.clear()
    compiles = nx.cache_info().compiles - compiles0
    if times:
        steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
        extra = ""
        if args.compile:
            info = step.cache_info()
            extra = f"; nx.compile traced {info.traces}, {info.executables} executable(s)"
        print(
            f"{len(times)} steps: first {times[0] * 1e3:.0f} ms (compiles), then "
            f"{steady * 1e3:.1f} ms/step (median); {compiles} programs compiled while "
            f"training and evaluating{extra}"
        )
    log["step_ms"] = statistics.median(times[1:]) * 1e3 if len(times) > 1 else None
    log["train_compiles"] = compiles

    if args.sample > 0:
        c0, t0 = nx.cache_info().compiles, time.perf_counter()
        key = nx.random.key(args.seed + 10)  # apart from the initialisation's key
        (text_out,) = sample(
            model,
            args.prompt,
            args.sample,
            context=args.context,
            temperature=args.temperature,
            key=key,
        )
        dt, sc = time.perf_counter() - t0, nx.cache_info().compiles - c0
        print(f"--- sample ({args.sample} characters, temperature {args.temperature:g}) ---")
        print(text_out)
        print(f"--- {dt:.1f} s, {sc} programs compiled for {args.sample} decode steps ---")
        log["sample"], log["sample_compiles"] = text_out, sc
    if args.log is not None:
        args.log.write_text(json.dumps(log))
    return log


if __name__ == "__main__":
    main()

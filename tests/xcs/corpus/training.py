"""Corpus: model training utilities in JAX, nablax and PyTorch (labels in CASES at the bottom)."""

from __future__ import annotations

import functools
import math
import os
import pickle
import time
from pathlib import Path

import jax
import numpy as np
from jax import lax as L
from jax import numpy as jnp

import nablax as nx

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # torch is an optional extra
    torch = None
    F = None


# ---- JAX -------------------------------------------------------------------------------------


def init_mlp(key, sizes=(784, 256, 10)):
    params = []
    for k, (m, n) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        w = jax.random.normal(k, (m, n)) * jnp.sqrt(2.0 / m)
        params.append((w, jnp.zeros(n)))
    return params


def mlp_apply(params, x):
    for w, b in params[:-1]:
        x = jax.nn.relu(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def cross_entropy(params, x, y):
    logits = mlp_apply(params, x)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@jax.jit
def sgd_step(params, x, y, lr=0.1):
    grads = jax.grad(cross_entropy)(params, x, y)
    return jax.tree_util.tree_map(lambda p, g: p - lr * g, params, grads)


def ema_update(avg, new, decay=0.999):
    return jax.tree_util.tree_map(lambda a, n: decay * a + (1 - decay) * n, avg, new)


def cumulative_max(xs):
    return L.associative_scan(jnp.maximum, xs)


def relax_constraints(x, lower, upper, strength=0.5):
    # "relax" the box constraints toward the feasible set (not jax.lax!)
    clipped = jnp.clip(x, lower, upper)
    return x + strength * (clipped - x)


def cosine_lr(step: int, total: int, base: float = 3e-4, warmup: int = 500) -> float:
    if step < warmup:
        return base * step / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * base * (1 + math.cos(math.pi * progress))


def upgrade_checkpoint_keys(state: dict) -> dict:
    """Rename v1 keys ('dense_0/kernel') to v2 ('layers.0.weight'); upgrade is not grad."""
    renamed = {}
    for key, value in state.items():
        parts = key.replace("dense_", "layers.").split("/")
        renamed[".".join(parts).replace("kernel", "weight")] = value
    return renamed


def train_epoch(params, batches, lr=0.1):
    """One pass over the data, reporting the loss every 100 steps."""
    for i, (x, y) in enumerate(batches):
        params = sgd_step(params, x, y, lr)
        if i % 100 == 0:
            print(f"step {i}: loss {float(cross_entropy(params, x, y)):.4f}")
    return params


def save_params(params, path):
    host = jax.device_get(params)
    with open(path, "wb") as fh:
        pickle.dump(host, fh)


def load_batches(folder: str, batch_size: int = 128):
    """Yield (x, y) batches from .npz shards on disk."""
    for name in sorted(os.listdir(folder)):
        data = np.load(os.path.join(folder, name))
        x, y = data["x"].astype(np.float32) / 255.0, data["y"]
        for s in range(0, len(x), batch_size):
            yield x[s : s + batch_size], y[s : s + batch_size]


def accuracy(logits, labels):
    return jnp.mean(jnp.argmax(logits, axis=-1) == labels)


def timed(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        wrapper.last_seconds = time.perf_counter() - t0
        return out

    return wrapper


@timed
def layer_norm(x, eps=1e-5):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.var(x, axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps)


# ---- nablax ----------------------------------------------------------------------------------


def nx_attention(q, k, v):
    scale = 1.0 / math.sqrt(q.shape[-1])
    return nx.softmax(nx.matmul(q, nx.swapaxes(k, -1, -2)) * scale, axis=-1) @ v


def nx_loss(w, x, y):
    return nx.mean((x @ w - y) ** 2)


nx_grad_loss = nx.grad(nx_loss)


def count_parameters(shapes: dict[str, tuple[int, ...]]) -> int:
    return sum(math.prod(s) for s in shapes.values())


# ---- PyTorch ---------------------------------------------------------------------------------


def torch_focal_loss(logits, targets, gamma=2.0):
    ce = F.cross_entropy(logits, targets, reduction="none")
    pt = torch.exp(-ce)
    return ((1 - pt) ** gamma * ce).mean()


def torch_train_step(model, optimizer, x, y):
    optimizer.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    optimizer.step()
    return loss.detach()


def save_torch_checkpoint(model, directory: str, step: int) -> Path:
    path = Path(directory) / f"ckpt_{step:06d}.pt"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return path


def running_mean(values, window=10):
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


CASES = [
    ("init_mlp", init_mlp, "tensor", False),
    ("mlp_apply", mlp_apply, "tensor", False),
    ("cross_entropy", cross_entropy, "tensor", False),
    ("sgd_step (jax.jit)", sgd_step, "tensor", False),
    ("ema_update", ema_update, "tensor", False),
    ("cumulative_max", cumulative_max, "tensor", False),
    ("relax_constraints", relax_constraints, "tensor", False),
    ("cosine_lr", cosine_lr, "pure", False),
    ("upgrade_checkpoint_keys", upgrade_checkpoint_keys, "pure", False),
    ("train_epoch", train_epoch, "hybrid", True),
    ("save_params", save_params, "hybrid", True),
    ("load_batches", load_batches, "hybrid", False),
    ("accuracy", accuracy, "tensor", False),
    ("layer_norm (wrapped)", layer_norm, "tensor", False),
    ("nx_attention", nx_attention, "tensor", False),
    ("nx_loss", nx_loss, "tensor", False),
    ("nx_grad_loss (nx.grad)", nx_grad_loss, "tensor", False),
    ("count_parameters", count_parameters, "pure", False),
    ("torch_focal_loss", torch_focal_loss, "tensor", False),
    ("torch_train_step", torch_train_step, "tensor", False),
    ("save_torch_checkpoint", save_torch_checkpoint, "orchestration", True),
    ("running_mean", running_mean, "pure", False),
]

"""Corpus: a held-out set, written after the classifier was done and added without changing it
(labels in CASES at the bottom). Cloud SDKs, caches, threads, modules, generators, decorators."""

from __future__ import annotations

import asyncio
import functools
import glob
import hashlib
import itertools
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
import scipy.optimize

import nablax as nx

try:
    import boto3
except ImportError:  # optional
    boto3 = None

try:
    import redis
except ImportError:  # optional
    redis = None

try:
    import torch
    from torch import nn
except ImportError:  # optional
    torch = nn = None

logger = logging.getLogger("holdout")


def upload_report(bucket: str, key: str, body: bytes) -> None:
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key=key, Body=body)


def cached_completion(prompt: str) -> str:
    r = redis.Redis()
    hit = r.get(hashlib.sha256(prompt.encode()).hexdigest())
    return hit.decode() if hit else ""


async def run_tool(*argv: str) -> str:
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    return out.decode()


def find_notebooks(root: str) -> list[str]:
    found = []
    for dirpath, _dirs, files in os.walk(root):
        found += [os.path.join(dirpath, f) for f in files if f.endswith(".ipynb")]
    return found


def list_configs(pattern: str = "configs/*.yaml") -> list[str]:
    return sorted(glob.glob(pattern))


def log_choice(choice: str, score: float) -> str:
    logger.info("picked %s (%.3f)", choice, score)
    return choice


@dataclass
class RunConfig:
    lr: float = 1e-3
    batch_size: int = 32

    def __post_init__(self):
        if self.lr <= 0 or self.batch_size <= 0:
            raise ValueError("lr and batch_size must be positive")


def batched_norms(xs):
    return jax.vmap(lambda v: jnp.sqrt(jnp.sum(v * v)))(xs)


@nx.compile
def fused_gelu_mlp(x, w1, w2):
    return nx.gelu(x @ w1) @ w2


@functools.lru_cache(maxsize=32)
def read_prompt_template(name: str) -> str:
    with open(os.path.join("prompts", f"{name}.txt"), encoding="utf-8") as fh:
        return fh.read()


def dropout_mask(seed: int, shape, rate: float = 0.1):
    key = jax.random.PRNGKey(seed)
    return jax.random.bernoulli(key, 1.0 - rate, shape)


def bilinear(x, w, y):
    return np.einsum("bi,ij,bj->b", x, w, y)


if nn is not None:

    class TinyNet(nn.Module):
        def __init__(self, d: int = 8):
            super().__init__()
            self.fc = nn.Linear(d, 1)

        def forward(self, x):
            return torch.sigmoid(self.fc(x))

else:
    TinyNet = None


def tail_lines(path: str, n: int = 10):
    with open(path, encoding="utf-8") as fh:
        yield from list(fh)[-n:]


def fetch_in_background(url: str) -> threading.Thread:
    from urllib.request import urlopen

    def work():
        with urlopen(url) as resp:
            resp.read()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    return t


def parallel_fft(signals, workers: int = 4):
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(np.fft.rfft, signals))


def stable_hash(obj) -> str:
    return hashlib.md5(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def progress(done: int, total: int) -> None:
    sys.stdout.write(f"\r{done}/{total}")
    sys.stdout.flush()


def gemini_answer(question: str) -> str:
    from google import genai

    client = genai.Client()
    return client.models.generate_content(model="gemini-2.0-flash", contents=question).text


def litellm_answer(question: str) -> str:
    import litellm

    resp = litellm.completion(model="gpt-4o-mini", messages=[{"role": "user", "content": question}])
    return resp.choices[0].message.content


def fit_remote_dataset(url: str):
    from urllib.request import urlopen

    with urlopen(url) as resp:
        xs, ys = np.array(json.loads(resp.read())).T
    result = scipy.optimize.minimize(lambda p: np.sum((p[0] * xs + p[1] - ys) ** 2), x0=[0.0, 0.0])
    return result.x


def runs_of(values: list[int]) -> list[tuple[int, int]]:
    return [(k, len(list(g))) for k, g in itertools.groupby(values)]


def cumulative_returns(prices):
    def step(carry, p):
        value = carry * p
        return value, value

    _, path = jax.lax.scan(step, jnp.float32(1.0), prices)
    return path


def fresh_workdir(prefix: str = "run-") -> str:
    d = tempfile.mkdtemp(prefix=prefix)
    shutil.rmtree(d)
    os.makedirs(d)
    return d


def save_embeddings(path: str, vectors) -> None:
    normed = vectors / jnp.linalg.norm(vectors, axis=-1, keepdims=True)
    np.save(path, np.asarray(normed))


class RateLimiter:
    def __init__(self, per_second: float):
        self.interval = 1.0 / per_second
        self.last = 0.0

    def wait(self) -> float:
        now = time.monotonic()
        delay = max(0.0, self.last + self.interval - now)
        self.last = now + delay
        return delay


_limiter = RateLimiter(5.0)

CASES = [
    ("upload_report (boto3)", upload_report, "orchestration", True),
    ("cached_completion (redis)", cached_completion, "orchestration", False),
    ("run_tool (asyncio subprocess)", run_tool, "orchestration", True),
    ("find_notebooks (os.walk)", find_notebooks, "orchestration", False),
    ("list_configs (glob)", list_configs, "orchestration", False),
    ("log_choice (logging only)", log_choice, "pure", False),
    ("RunConfig (dataclass)", RunConfig, "pure", False),
    ("batched_norms (jax.vmap)", batched_norms, "tensor", False),
    ("fused_gelu_mlp (@nx.compile)", fused_gelu_mlp, "tensor", False),
    ("read_prompt_template (@lru_cache)", read_prompt_template, "orchestration", False),
    ("dropout_mask", dropout_mask, "tensor", False),
    ("bilinear (np.einsum)", bilinear, "tensor", False),
    ("TinyNet (nn.Module)", TinyNet, "tensor", False),
    ("tail_lines (generator)", tail_lines, "orchestration", False),
    ("fetch_in_background (thread target)", fetch_in_background, "orchestration", False),
    ("parallel_fft (pool.map of np.fft.rfft)", parallel_fft, "tensor", False),
    ("stable_hash", stable_hash, "pure", False),
    ("progress (sys.stdout)", progress, "orchestration", True),
    ("gemini_answer (google genai)", gemini_answer, "orchestration", False),
    ("litellm_answer", litellm_answer, "orchestration", False),
    ("fit_remote_dataset", fit_remote_dataset, "hybrid", False),
    ("runs_of", runs_of, "pure", False),
    ("cumulative_returns (lax.scan)", cumulative_returns, "tensor", False),
    ("fresh_workdir", fresh_workdir, "orchestration", True),
    ("save_embeddings", save_embeddings, "hybrid", True),
    ("RateLimiter.wait (bound)", _limiter.wait, "pure", False),
]

"""Corpus: compound-AI pipelines that mix I/O (LLMs, HTTP, files, databases, processes) with
tensor math, plus higher-order helpers (labels in CASES at the bottom)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx

try:
    from openai import AsyncOpenAI, OpenAI
except ImportError:  # optional
    OpenAI = AsyncOpenAI = None

JUDGE_PROMPT = "Rate the answer from 1 to 10. Reply with the number only.\n\n{answer}"


def _complete(prompt: str, model: str = "gpt-4o-mini") -> str:
    client = OpenAI()
    r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}])
    return r.choices[0].message.content


def _mean_and_ci(x):
    x = jnp.asarray(x, dtype=jnp.float32)
    half = 1.96 * jnp.std(x) / jnp.sqrt(x.shape[0])
    return jnp.mean(x), half


def judge_answers(answers: list[str]):
    """LLM-as-judge, then a mean score with a confidence interval."""
    scores = [float(_complete(JUDGE_PROMPT.format(answer=a))) for a in answers]
    return _mean_and_ci(scores)


def embed_and_cluster(texts: list[str], k: int = 3, iters: int = 10):
    client = OpenAI()
    resp = client.embeddings.create(model="text-embedding-3-small", input=texts)
    x = jnp.asarray([d.embedding for d in resp.data])
    centers = x[:k]
    for _ in range(iters):
        assign = jnp.argmin(((x[:, None] - centers[None]) ** 2).sum(-1), axis=1)
        centers = jnp.stack([x[assign == j].mean(0) for j in range(k)])
    return assign


def metrics_from_api(url: str):
    with urllib.request.urlopen(url) as resp:
        rows = json.load(resp)
    latencies = np.array([r["latency_ms"] for r in rows], dtype=np.float64)
    return {"p50": float(np.percentile(latencies, 50)), "p99": float(np.percentile(latencies, 99))}


def csv_column_stats(path: str, column: int = 1):
    data = np.loadtxt(path, delimiter=",", skiprows=1, usecols=[column])
    return data.mean(), data.std()


def gpu_utilization() -> float:
    out = subprocess.check_output(
        ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits"], text=True
    )
    return float(np.mean(np.array(out.split(), dtype=np.float32)))


def predict_for_users(db_path: str, w, b):
    conn = sqlite3.connect(db_path)
    feats = conn.execute("SELECT age, visits, spend FROM users").fetchall()
    conn.close()
    x = jnp.asarray(feats, dtype=jnp.float32)
    return jax.nn.sigmoid(x @ w + b)


def train_and_checkpoint(w, batches, path: str, lr: float = 0.01):
    def loss(w, x, y):
        return nx.mean((x @ w - y) ** 2)

    step = nx.grad(loss)
    for x, y in batches:
        w = w - lr * step(w, x, y)
    np.save(path, w.numpy())
    return w


def simulate_and_store(key, n: int, out_path: str) -> None:
    samples = jax.random.normal(key, (n,))
    summary = {"mean": float(samples.mean()), "std": float(samples.std())}
    with open(out_path, "w") as fh:
        json.dump(summary, fh)


def bandit_prompt(prompts: list[str], counts, rewards, rng=None):
    """Pick a prompt by UCB, send it, return the arm and the reply."""
    rng = rng or np.random.default_rng()
    ucb = rewards / np.maximum(counts, 1) + np.sqrt(
        2 * np.log(counts.sum() + 1) / np.maximum(counts, 1)
    )
    arm = int(np.argmax(ucb + 1e-9 * rng.random(len(prompts))))
    return arm, _complete(prompts[arm])


async def async_lengths(prompts: list[str]):
    client = AsyncOpenAI()
    replies = await asyncio.gather(
        *(
            client.chat.completions.create(
                model="gpt-4o-mini", messages=[{"role": "user", "content": p}]
            )
            for p in prompts
        )
    )
    return jnp.mean(jnp.array([len(r.choices[0].message.content) for r in replies]))


class Evaluator:
    """Runs a model over prompts and aggregates a metric with jnp."""

    def __init__(self, model: str = "gpt-4o-mini"):
        self.model = model

    def generate(self, prompt: str) -> str:
        return _complete(prompt, self.model)

    def metric(self, predictions: list[str], references: list[str]):
        hits = jnp.array([p.strip() == r.strip() for p, r in zip(predictions, references)])
        return hits.mean()

    def run(self, prompts: list[str], references: list[str]):
        preds = [self.generate(p) for p in prompts]
        return self.metric(preds, references)


def parallel_embed_norms(texts: list[str], workers: int = 8):
    with ThreadPoolExecutor(workers) as pool:
        replies = list(pool.map(_complete, texts))
    return np.linalg.norm(np.array([[len(r), r.count(" ")] for r in replies]), axis=1)


def map_batch(fn, items, batch_size=16):
    """Apply ``fn`` to each batch (higher-order: its kind is the callback's)."""
    out = []
    for s in range(0, len(items), batch_size):
        out.extend(fn(items[s : s + batch_size]))
    return out


def with_timeout(call, seconds: float):
    return asyncio.run(asyncio.wait_for(call(), timeout=seconds))


_evaluator = Evaluator()

CASES = [
    ("_complete", _complete, "orchestration", False),
    ("_mean_and_ci", _mean_and_ci, "tensor", False),
    ("judge_answers", judge_answers, "hybrid", False),
    ("embed_and_cluster", embed_and_cluster, "hybrid", False),
    ("metrics_from_api", metrics_from_api, "hybrid", False),
    ("csv_column_stats", csv_column_stats, "hybrid", False),
    ("gpu_utilization", gpu_utilization, "hybrid", True),
    ("predict_for_users", predict_for_users, "hybrid", False),
    ("train_and_checkpoint", train_and_checkpoint, "hybrid", True),
    ("simulate_and_store", simulate_and_store, "hybrid", True),
    ("bandit_prompt", bandit_prompt, "hybrid", False),
    ("async_lengths (async)", async_lengths, "hybrid", False),
    ("Evaluator (class)", Evaluator, "hybrid", False),
    ("Evaluator.generate (bound)", _evaluator.generate, "orchestration", False),
    ("Evaluator.metric (bound)", _evaluator.metric, "tensor", False),
    ("Evaluator.run (bound)", _evaluator.run, "hybrid", False),
    ("parallel_embed_norms", parallel_embed_norms, "hybrid", False),
    ("map_batch (higher-order: safe route)", map_batch, "hybrid", True),
    ("with_timeout (higher-order: safe route)", with_timeout, "hybrid", True),
]

"""Corpus: array code written only with operators and methods (``a @ b``, ``(x ** 2).sum()``,
``x.T``, ``.mean()``, ``.reshape``), with and without annotations; plain Python that shares the
method names arrays have (``str.count``, ``dict.get``, ``list.index``); and hybrids whose I/O
half is reached through an unresolved client (labels: kind, effects)."""

from __future__ import annotations

import math
from typing import Optional

import jax
import numpy as np

try:
    import torch
except ImportError:  # optional
    torch = None


def mse(pred, target):
    return ((pred - target) ** 2).mean()


def l2_penalty(params, lam=1e-4):
    return lam * sum((w**2).sum() for w in params)


def linear(x, w, b):
    return x @ w + b


def gram_matrix(feats):
    return feats.T @ feats / feats.shape[0]


def flatten_batch(x):
    return x.reshape(x.shape[0], -1)


def center(x):
    return x - x.mean(axis=0, keepdims=True)


def attention_scores(q, k):
    return (q @ k.transpose(0, 2, 1)) / math.sqrt(q.shape[-1])


def to_half(x):
    return x.astype("float16")


def clip_norm(g, max_norm: float = 1.0):
    norm = (g * g).sum() ** 0.5
    return g * min(1.0, max_norm / (float(norm) + 1e-12))


def residual_block(x: jax.Array, w1: jax.Array, w2: jax.Array) -> jax.Array:
    h = x @ w1
    return x + (h * (h > 0)) @ w2


def annotated_scale(x: np.ndarray, k: float) -> np.ndarray:
    return x * k


def torch_logits(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x.matmul(w).softmax(dim=-1)


def optional_mask(x, mask: Optional[np.ndarray] = None):  # noqa: UP045 - a common style
    return x if mask is None else x * mask


def variance_explained(s):
    s2 = s**2
    return s2.cumsum() / s2.sum()


def batch_accuracy(logits, labels):
    return (logits.argmax(-1) == labels).mean()


def polyline_length(points: list[tuple[float, float]]) -> float:
    return sum(math.dist(a, b) for a, b in zip(points, points[1:]))


def count_vowels(text: str) -> int:
    return sum(text.count(v) for v in "aeiou")


def lookup_price(prices: dict, item: str, default: float = 0.0) -> float:
    return prices.get(item.lower(), default)


def weighted_average(values: list[float], weights: list[float]) -> float:
    total = sum(weights)
    return sum(v * w for v, w in zip(values, weights)) / total if total else 0.0


def matrix_from_lists(rows: list[list[float]]) -> list[list[float]]:
    cols = len(rows[0])
    return [[rows[r][c] for r in range(len(rows))] for c in range(cols)]


def position_of(items: list, target) -> int:
    return items.index(target) if target in items else -1


def scale_scores(scores: dict[str, float], k: float) -> dict[str, float]:
    return {name: s * k for name, s in scores.items()}


def normalize_text(s: str) -> str:
    return " ".join(s.strip().lower().split())


def embed_and_project(client, texts: list[str], proj):
    vecs = client.embed(texts)
    return vecs @ proj


def grade_then_mean(llm, answers: list[str]):
    grades = np.array([float(llm.invoke(f"Grade 1-5: {a}").content) for a in answers])
    return grades.mean(), grades.std()


def rerank_by_dot(retriever, query_vec, question: str):
    docs = retriever.invoke(question)
    mat = np.stack([d.metadata["vec"] for d in docs])
    return [docs[i] for i in (mat @ query_vec).argsort()[::-1]]


class Projector:
    def __init__(self, w):
        self.w = w

    def __call__(self, x):
        return (x @ self.w).clip(-1.0, 1.0)


class ChatScorer:
    def __init__(self, chat):
        self.chat = chat

    def score(self, prompts: list[str]):
        lens = np.array([len(self.chat(p)) for p in prompts], dtype=np.float32)
        return (lens - lens.mean()) / (lens.std() + 1e-6)


_proj = Projector(np.eye(3))
_scorer = ChatScorer(chat=None)

CASES = [
    ("mse ((x - y) ** 2).mean())", mse, "tensor", False),
    ("l2_penalty ((w**2).sum())", l2_penalty, "tensor", False),
    ("linear (x @ w + b)", linear, "tensor", False),
    ("gram_matrix (x.T @ x)", gram_matrix, "tensor", False),
    ("flatten_batch (reshape)", flatten_batch, "tensor", False),
    ("center (mean keepdims)", center, "tensor", False),
    ("attention_scores (@ and transpose)", attention_scores, "tensor", False),
    ("to_half (astype)", to_half, "tensor", False),
    ("clip_norm ((g * g).sum())", clip_norm, "tensor", False),
    ("residual_block (jax.Array annotations)", residual_block, "tensor", False),
    ("annotated_scale (np.ndarray annotations only)", annotated_scale, "tensor", False),
    ("torch_logits (torch.Tensor, matmul)", torch_logits, "tensor", False),
    ("optional_mask (Optional[np.ndarray])", optional_mask, "tensor", False),
    ("variance_explained (cumsum / sum)", variance_explained, "tensor", False),
    ("batch_accuracy (argmax, mean)", batch_accuracy, "tensor", False),
    ("polyline_length", polyline_length, "pure", False),
    ("count_vowels (str.count)", count_vowels, "pure", False),
    ("lookup_price (dict.get)", lookup_price, "pure", False),
    ("weighted_average", weighted_average, "pure", False),
    ("matrix_from_lists", matrix_from_lists, "pure", False),
    ("position_of (list.index)", position_of, "pure", False),
    ("scale_scores", scale_scores, "pure", False),
    ("normalize_text", normalize_text, "pure", False),
    ("embed_and_project (client.embed, @)", embed_and_project, "hybrid", False),
    ("grade_then_mean (llm.invoke, np)", grade_then_mean, "hybrid", False),
    ("rerank_by_dot (retriever.invoke, @)", rerank_by_dot, "hybrid", False),
    ("Projector() instance (@, clip)", _proj, "tensor", False),
    ("ChatScorer.score (self.chat(...), np)", _scorer.score, "hybrid", False),
]

"""Corpus: a retrieval-augmented question answering service (labels in CASES at the bottom).

Written in the styles such code has in the wild: SDK clients created lazily inside functions,
guarded optional imports, NumPy for the vector store, jax.numpy for scoring.
"""

from __future__ import annotations

import hashlib
import json
import re
import textwrap
from dataclasses import dataclass, field

import jax.numpy as jnp
import numpy as onp

try:  # the OpenAI SDK is optional for this module
    import openai
except ImportError:  # pragma: no cover - depends on the environment
    openai = None

EMBED_MODEL = "text-embedding-3-small"
CHAT_MODEL = "gpt-4o-mini"
_STOPWORDS = frozenset("a an the of to in and or for on with is are was".split())


@dataclass
class Chunk:
    doc_id: str
    text: str
    tags: list[str] = field(default_factory=list)


def split_into_chunks(text: str, size: int = 400, overlap: int = 50) -> list[str]:
    """Split on whitespace into windows of roughly ``size`` characters."""
    words = text.split()
    chunks, current = [], []
    for word in words:
        current.append(word)
        if sum(len(w) + 1 for w in current) >= size:
            chunks.append(" ".join(current))
            keep = max(1, overlap // 8)
            current = current[-keep:]
    if current:
        chunks.append(" ".join(current))
    return chunks


def normalize_query(q: str) -> str:
    # lowercase, drop punctuation and stopwords: the "requests" users type are noisy
    tokens = re.findall(r"[a-z0-9]+", q.lower())
    return " ".join(t for t in tokens if t not in _STOPWORDS)


def chunk_id(doc_id: str, index: int) -> str:
    return hashlib.sha1(f"{doc_id}:{index}".encode()).hexdigest()[:12]


def embed_texts(texts: list[str]) -> list[list[float]]:
    """Embed with the OpenAI embeddings endpoint (one request per batch of 64)."""
    client = openai.OpenAI()
    out = []
    for start in range(0, len(texts), 64):
        resp = client.embeddings.create(model=EMBED_MODEL, input=texts[start : start + 64])
        out.extend(item.embedding for item in resp.data)
    return out


def cosine_scores(query_vec, doc_matrix):
    q = query_vec / onp.linalg.norm(query_vec)
    d = doc_matrix / onp.linalg.norm(doc_matrix, axis=1, keepdims=True)
    return d @ q


def top_k(scores, k: int = 5):
    idx = onp.argpartition(-scores, kth=min(k, len(scores) - 1))[:k]
    return idx[onp.argsort(-scores[idx])]


def softmax_weights(logits, temperature=1.0):
    z = jnp.asarray(logits) / temperature
    return jnp.exp(z - jnp.max(z)) / jnp.sum(jnp.exp(z - jnp.max(z)))


def build_prompt(question: str, contexts: list[str]) -> str:
    joined = "\n\n".join(f"[{i + 1}] {c}" for i, c in enumerate(contexts))
    return textwrap.dedent(
        f"""\
        Answer using only the sources below. Cite them as [n].

        {joined}

        Question: {question}
        """
    )


def answer(question: str, contexts: list[str]) -> str:
    from openai import OpenAI

    client = OpenAI()
    completion = client.chat.completions.create(
        model=CHAT_MODEL,
        messages=[{"role": "user", "content": build_prompt(question, contexts)}],
        temperature=0.0,
    )
    return completion.choices[0].message.content


def retrieve(question: str, doc_matrix, chunks: list[str], k: int = 4) -> list[str]:
    """Embed the question, score it against the store, return the best chunks."""
    qvec = onp.asarray(embed_texts([question])[0])
    best = top_k(cosine_scores(qvec, doc_matrix), k)
    return [chunks[i] for i in best]


def rag(question: str, doc_matrix, chunks: list[str]) -> str:
    return answer(question, retrieve(question, doc_matrix, chunks))


def rerank_with_llm(question: str, candidates: list[str]) -> list[float]:
    """Ask the model for a relevance grade per passage, then turn grades into weights."""
    client = openai.OpenAI()
    grades = []
    for passage in candidates:
        msg = client.chat.completions.create(
            model=CHAT_MODEL,
            messages=[{"role": "user", "content": f"Grade 0-9: {question}\n{passage}"}],
        )
        digits = re.findall(r"\d", msg.choices[0].message.content or "0")
        grades.append(float(digits[0]) if digits else 0.0)
    return softmax_weights(jnp.array(grades)).tolist()


def parse_citations(text: str) -> list[int]:
    return sorted({int(m) for m in re.findall(r"\[(\d+)\]", text)})


def load_index(path: str):
    """Read the on-disk vector store: a .npy matrix and a JSON list of chunks."""
    matrix = onp.load(path + ".npy")
    with open(path + ".json", encoding="utf-8") as fh:
        chunks = json.load(fh)
    return matrix, chunks


def save_chunks(path: str, chunks: list[Chunk]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump([c.__dict__ for c in chunks], fh)


def dedupe_chunks(chunks: list[Chunk]) -> list[Chunk]:
    seen, out = set(), []
    for c in chunks:
        key = c.text.strip().lower()
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def mmr(query_vec, doc_vecs, k=5, lam=0.7):
    """Maximal marginal relevance selection (all NumPy)."""
    selected, remaining = [], list(range(len(doc_vecs)))
    sim_q = doc_vecs @ query_vec
    sim_d = doc_vecs @ doc_vecs.T
    while remaining and len(selected) < k:
        if selected:
            penalty = onp.max(sim_d[onp.ix_(remaining, selected)], axis=1)
        else:
            penalty = onp.zeros(len(remaining))
        scores = lam * sim_q[remaining] - (1 - lam) * penalty
        selected.append(remaining.pop(int(onp.argmax(scores))))
    return selected


CASES = [
    ("split_into_chunks", split_into_chunks, "pure", False),
    ("normalize_query", normalize_query, "pure", False),
    ("chunk_id", chunk_id, "pure", False),
    ("embed_texts", embed_texts, "orchestration", False),
    ("cosine_scores", cosine_scores, "tensor", False),
    ("top_k", top_k, "tensor", False),
    ("softmax_weights", softmax_weights, "tensor", False),
    ("build_prompt", build_prompt, "pure", False),
    ("answer", answer, "orchestration", False),
    ("retrieve", retrieve, "hybrid", False),
    ("rag", rag, "hybrid", False),
    ("rerank_with_llm", rerank_with_llm, "hybrid", False),
    ("parse_citations", parse_citations, "pure", False),
    ("load_index", load_index, "orchestration", False),
    ("save_chunks", save_chunks, "orchestration", True),
    ("dedupe_chunks", dedupe_chunks, "pure", False),
    ("mmr", mmr, "tensor", False),
]

"""Corpus: agent-style code: classes, callable objects, partials, bound methods, async clients,
decorators and closures over clients (labels in CASES at the bottom)."""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
import time
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

import nablax as nx

try:
    import anthropic
except ImportError:  # optional
    anthropic = None

try:
    import httpx
except ImportError:  # optional
    httpx = None

try:
    import openai
except ImportError:  # optional
    openai = None

CLAUDE = "claude-3-5-sonnet-latest"


def retry(times=3, delay=0.2):
    """Retry a flaky call (decorator factory)."""

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            for i in range(times):
                try:
                    return fn(*args, **kwargs)
                except Exception:
                    if i == times - 1:
                        raise
                    time.sleep(delay * (i + 1))

        return wrapper

    return deco


@retry(times=4)
def summarize(text: str) -> str:
    client = anthropic.Anthropic()
    msg = client.messages.create(
        model=CLAUDE, max_tokens=300, messages=[{"role": "user", "content": f"Summarize:\n{text}"}]
    )
    return msg.content[0].text


class Summarizer:
    """A callable object holding an Anthropic client."""

    def __init__(self, client=None, model=CLAUDE):
        self.client = client or anthropic.Anthropic()
        self.model = model

    def __call__(self, text: str) -> str:
        msg = self.client.messages.create(
            model=self.model, max_tokens=200, messages=[{"role": "user", "content": text}]
        )
        return msg.content[0].text


class KeywordScorer:
    """Scores texts by keyword overlap: plain Python."""

    def __init__(self, keywords):
        self.keywords = {k.lower() for k in keywords}

    def __call__(self, text: str) -> float:
        words = set(re.findall(r"\w+", text.lower()))
        return len(words & self.keywords) / max(1, len(self.keywords))


class EmbeddingRanker:
    def __init__(self, dim: int = 64, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.proj = rng.standard_normal((256, dim)).astype(np.float32)

    def featurize(self, text: str):
        counts = np.zeros(256, np.float32)
        for byte in text.encode()[:4096]:
            counts[byte] += 1.0
        return counts @ self.proj

    def rank(self, query: str, docs: list[str]) -> list[int]:
        q = self.featurize(query)
        scores = [float(np.dot(q, self.featurize(d))) for d in docs]
        return sorted(range(len(docs)), key=lambda i: -scores[i])


class WebAgent:
    """Tool-using agent: fetches pages and asks Claude about them."""

    def __init__(self, http_client, llm_client):
        self.http = http_client
        self.llm = llm_client
        self.history: list[dict] = []

    def fetch(self, url: str) -> str:
        resp = self.http.get(url, timeout=10)
        resp.raise_for_status()
        return resp.text

    def ask(self, question: str, url: str) -> str:
        page = self.fetch(url)[:20000]
        self.history.append({"role": "user", "content": f"{question}\n\n{page}"})
        msg = self.llm.messages.create(model=CLAUDE, max_tokens=500, messages=self.history)
        return msg.content[0].text

    def transcript(self) -> str:
        return "\n".join(f"{m['role']}: {m['content'][:80]}" for m in self.history)


def make_classifier(client, labels):
    """A closure over an LLM client: zero-shot classification."""

    def classify_text(text):
        prompt = f"Pick one of {labels} for: {text}"
        out = client.chat.completions.create(
            model="gpt-4o-mini", messages=[{"role": "user", "content": prompt}]
        )
        return out.choices[0].message.content.strip()

    return classify_text


def make_normalizer(mean, std):
    def normalize(x):
        return (x - mean) / std

    return normalize


def make_jnp_normalizer(mean, std):
    mean, std = jnp.asarray(mean), jnp.asarray(std)

    def normalize(x):
        return (jnp.asarray(x) - mean) / std

    return normalize


async def fetch_page(url: str) -> str:
    async with httpx.AsyncClient(timeout=10) as client:
        r = await client.get(url)
        return r.text


async def fetch_many(urls: list[str]) -> list[str]:
    return await asyncio.gather(*(fetch_page(u) for u in urls))


async def jittered_sleep(base: float) -> None:
    await asyncio.sleep(base * (0.5 + random.random()))


async def stream_tokens(session, url, payload):
    async with session.post(url, json=payload) as resp:
        async for line in resp.content:
            if line.startswith(b"data: "):
                yield json.loads(line[6:])


def score_answers(question: str, answers: list[str]):
    """LLM grades each answer, then scores are normalized with jnp."""
    grader = Summarizer()
    raw = [len(grader(f"Q: {question}\nA: {a}")) for a in answers]
    x = jnp.asarray(raw, dtype=jnp.float32)
    return (x - x.mean()) / (x.std() + 1e-6)


def nx_score_answers(answers: list[str], weights):
    feats = nx.tensor(np.array([[len(a), a.count(" ")] for a in answers], np.float32))
    return nx.softmax(feats @ weights, axis=0)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict

    @classmethod
    def from_json(cls, payload: str) -> ToolCall:
        data = json.loads(payload)
        return cls(data["name"], data.get("arguments", {}))

    def render(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in sorted(self.arguments.items()))
        return f"{self.name}({args})"


# a local OpenAI-compatible endpoint (nothing is contacted when the client is created)
_llm = openai.OpenAI(api_key="sk-local", base_url="http://127.0.0.1:8000/v1") if openai else None
_scorer = KeywordScorer(["jax", "xla", "tensor"])
_ranker = EmbeddingRanker()
_agent = WebAgent(http_client=None, llm_client=None)
_call = ToolCall("search", {"q": "xla"})

CASES = [
    ("retry (decorator factory)", retry, "pure", False),
    ("summarize (@retry-wrapped)", summarize, "orchestration", False),
    ("Summarizer (class)", Summarizer, "orchestration", False),
    ("KeywordScorer() instance", _scorer, "pure", False),
    ("EmbeddingRanker.featurize (bound)", _ranker.featurize, "tensor", False),
    ("EmbeddingRanker.rank (bound)", _ranker.rank, "tensor", False),
    ("WebAgent.fetch (bound)", _agent.fetch, "orchestration", False),
    ("WebAgent.ask (bound)", _agent.ask, "orchestration", False),
    ("WebAgent.transcript (bound)", _agent.transcript, "pure", False),
    ("make_classifier(...) closure", make_classifier(_llm, ["a", "b"]), "orchestration", False),
    ("make_normalizer(...) closure", make_normalizer(0.0, 1.0), "pure", False),
    ("make_jnp_normalizer(...) closure", make_jnp_normalizer(0.0, 1.0), "tensor", False),
    ("fetch_page (async)", fetch_page, "orchestration", False),
    ("fetch_many (async)", fetch_many, "orchestration", False),
    ("jittered_sleep (async)", jittered_sleep, "orchestration", False),
    ("stream_tokens (async generator)", stream_tokens, "orchestration", True),
    ("score_answers", score_answers, "hybrid", False),
    ("nx_score_answers", nx_score_answers, "tensor", False),
    ("ToolCall.from_json (classmethod)", ToolCall.from_json, "pure", False),
    ("ToolCall.render (bound)", _call.render, "pure", False),
    (
        "partial(WebAgent.ask, url=...)",
        functools.partial(_agent.ask, url="https://x.test"),
        "orchestration",
        False,
    ),
    ("partial(cosine-like numpy)", functools.partial(np.dot, np.ones(3)), "tensor", False),
]

"""Corpus: a second hold-out, written after the issue-15 rules (array methods, keyword fallback,
waits, effects) were finished, and scored without changing them (labels: kind, effects).
Styles not used elsewhere in the corpus: other SDKs (Cohere, Groq, Mistral, Ollama, Bedrock),
DSPy / LangGraph-like objects, Kafka and Slack clients, job queues, PyTorch loops, pandas
pipelines, operator-only array code, and plain Python that reads like any of those."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import random
import tempfile
import time
import zipfile

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # optional
    torch = F = None

try:
    import boto3
except ImportError:  # optional
    boto3 = None

try:
    import cohere
except ImportError:  # optional
    cohere = None

try:
    import ollama
except ImportError:  # optional
    ollama = None


def cohere_rerank(query: str, docs: list[str], top_n: int = 3) -> list[int]:
    co = cohere.Client()
    res = co.rerank(model="rerank-english-v3.0", query=query, documents=docs, top_n=top_n)
    return [r.index for r in res.results]


def groq_chat(groq_client, prompt: str) -> str:
    out = groq_client.chat.completions.create(
        model="llama-3.1-8b-instant", messages=[{"role": "user", "content": prompt}]
    )
    return out.choices[0].message.content


def local_chat(prompt: str, model: str = "llama3") -> str:
    return ollama.chat(model=model, messages=[{"role": "user", "content": prompt}])["message"][
        "content"
    ]


def bedrock_invoke(prompt: str) -> str:
    brt = boto3.client("bedrock-runtime")
    body = json.dumps({"prompt": prompt, "max_tokens": 256})
    resp = brt.invoke_model(modelId="anthropic.claude-v2", body=body)
    return json.loads(resp["body"].read())["completion"]


def predict_with_signature(predictor, question: str) -> str:
    """A DSPy-style module: calling it runs the LM."""
    return predictor(question=question).answer


def run_graph(app, state: dict) -> dict:
    """A compiled LangGraph-style app."""
    return app.invoke(state, config={"recursion_limit": 10})


def produce_events(producer, topic: str, events: list[dict]) -> None:
    for e in events:
        producer.send(topic, json.dumps(e).encode())
    producer.flush()


def post_to_slack(slack, channel: str, text: str) -> str:
    resp = slack.chat_postMessage(channel=channel, text=text)
    return resp["ts"]


def enqueue_job(queue, payload: dict) -> str:
    job = queue.enqueue("workers.process", payload, job_timeout=600)
    return job.id


def wait_until(predicate, timeout: float = 10.0, interval: float = 0.2) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if predicate():
            return True
        time.sleep(interval)
    return False


def jittered_backoff(attempt: int, base: float = 0.5) -> None:
    time.sleep(base * 2**attempt * random.uniform(0.8, 1.2))


def softmax_rows(z):
    z = z - z.max(axis=1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=1, keepdims=True)


def cosine_matrix(a, b):
    a = a / (a * a).sum(-1, keepdims=True) ** 0.5
    b = b / (b * b).sum(-1, keepdims=True) ** 0.5
    return a @ b.T


def ridge_solve(X, y, lam: float = 1.0):
    d = X.shape[1]
    return np.linalg.solve(X.T @ X + lam * np.eye(d), X.T @ y)


def kl_divergence(p, q, eps: float = 1e-9):
    return (p * ((p + eps) / (q + eps)).log()).sum(-1).mean()


def torch_epoch(model, loader, optimizer):
    model.train()
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    return total / max(1, len(loader))


def evaluate_and_log(model, x, y, path: str) -> float:
    with torch.no_grad():
        acc = (model(x).argmax(-1) == y).float().mean().item()
    with open(path, "a") as fh:
        fh.write(f"{acc:.4f}\n")
    return acc


def sales_by_region(df):
    return df.groupby("region")["sales"].agg(["sum", "mean"]).sort_values("sum")


def load_and_describe(csv_path: str):
    import pandas as pd

    return pd.read_csv(csv_path).describe()


def checksum_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 16), b""):
            h.update(block)
    return h.hexdigest()


def zip_folder(folder: str, out_path: str) -> str:
    with zipfile.ZipFile(out_path, "w") as zf:
        for name in os.listdir(folder):
            zf.write(os.path.join(folder, name), arcname=name)
    return out_path


def scratch_copy(data: bytes) -> str:
    fd, path = tempfile.mkstemp(suffix=".bin")
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    return path


def encode_image_b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode("ascii")


def merge_configs(*configs: dict) -> dict:
    out: dict = {}
    for c in configs:
        for k, v in c.items():
            out[k] = merge_configs(out[k], v) if isinstance(v, dict) and k in out else v
    return out


def chunk_list(items: list, size: int) -> list[list]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def model_card(model_name: str, params: int) -> str:
    return f"{model_name}: {params / 1e6:.1f}M parameters"


def render_chat(messages: list[dict]) -> str:
    return "\n".join(f"<|{m['role']}|>{m['content']}" for m in messages)


def estimate_cost(prompt_tokens: int, completion_tokens: int, prices: dict) -> float:
    return prompt_tokens * prices["input"] / 1e6 + completion_tokens * prices["output"] / 1e6


class Memory:
    """Conversation memory kept in process."""

    def __init__(self, limit: int = 20):
        self.limit = limit
        self.turns: list[tuple[str, str]] = []

    def add(self, role: str, text: str) -> None:
        self.turns.append((role, text))
        del self.turns[: -self.limit]

    def as_prompt(self) -> str:
        return "\n".join(f"{r}: {t}" for r, t in self.turns)


class ToolAgent:
    def __init__(self, llm, tools: dict, memory: Memory):
        self.llm = llm
        self.tools = tools
        self.memory = memory

    def act(self, task: str) -> str:
        self.memory.add("user", task)
        decision = json.loads(self.llm.invoke(self.memory.as_prompt()).content)
        result = self.tools[decision["tool"]](**decision["args"])
        self.memory.add("tool", str(result))
        return str(result)


class Embedder:
    def __init__(self, client, dim: int = 256):
        self.client = client
        self.dim = dim

    def __call__(self, texts: list[str]):
        resp = self.client.embeddings.create(model="text-embedding-3-small", input=texts)
        vecs = np.array([d.embedding[: self.dim] for d in resp.data])
        return vecs / np.linalg.norm(vecs, axis=1, keepdims=True)


@dataclasses.dataclass
class Budget:
    limit_usd: float
    spent_usd: float = 0.0

    def charge(self, usd: float) -> bool:
        if self.spent_usd + usd > self.limit_usd:
            return False
        self.spent_usd += usd
        return True


def timed_call(fn, *args):
    t0 = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - t0


def mistral_complete(mistral_client, prompt: str) -> str:
    res = mistral_client.chat.complete(
        model="mistral-small-latest", messages=[{"role": "user", "content": prompt}]
    )
    return res.choices[0].message.content


def moderate_and_store(client, db, text: str) -> bool:
    flagged = client.moderations.create(input=text).results[0].flagged
    db.execute("INSERT INTO moderation(text, flagged) VALUES (?, ?)", (text, flagged))
    db.commit()
    return flagged


def suppress_missing(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def llm_scores_to_probs(llm, items: list[str]):
    logits = np.array([float(llm.invoke(f"Score 0-10: {i}").content) for i in items])
    return softmax_rows(logits[None, :])[0]


_memory = Memory()
_agent = ToolAgent(llm=None, tools={}, memory=_memory)
_embedder = Embedder(client=None)
_budget = Budget(limit_usd=5.0)
_quick = functools.partial(local_chat, model="phi3")

CASES = [
    ("cohere_rerank", cohere_rerank, "orchestration", False),
    ("groq_chat (groq_client parameter)", groq_chat, "orchestration", False),
    ("local_chat (ollama.chat)", local_chat, "orchestration", False),
    ("bedrock_invoke (boto3 bedrock-runtime)", bedrock_invoke, "orchestration", False),
    ("predict_with_signature (DSPy predictor)", predict_with_signature, "orchestration", False),
    ("run_graph (app.invoke)", run_graph, "orchestration", False),
    ("produce_events (producer.send)", produce_events, "orchestration", True),
    ("post_to_slack (chat_postMessage)", post_to_slack, "orchestration", True),
    ("enqueue_job (queue.enqueue)", enqueue_job, "orchestration", True),
    ("wait_until (sleep polling a callback)", wait_until, "orchestration", True),
    ("jittered_backoff (time.sleep)", jittered_backoff, "orchestration", False),
    ("softmax_rows (methods only)", softmax_rows, "tensor", False),
    ("cosine_matrix (operators only)", cosine_matrix, "tensor", False),
    ("ridge_solve", ridge_solve, "tensor", False),
    ("kl_divergence (methods only)", kl_divergence, "tensor", False),
    ("torch_epoch", torch_epoch, "tensor", False),
    ("evaluate_and_log", evaluate_and_log, "hybrid", True),
    ("sales_by_region (pandas methods)", sales_by_region, "tensor", False),
    ("load_and_describe (pd.read_csv)", load_and_describe, "hybrid", False),
    ("checksum_file", checksum_file, "orchestration", False),
    ("zip_folder", zip_folder, "orchestration", True),
    ("scratch_copy (mkstemp)", scratch_copy, "orchestration", True),
    ("encode_image_b64", encode_image_b64, "pure", False),
    ("merge_configs", merge_configs, "pure", False),
    ("chunk_list", chunk_list, "pure", False),
    ("model_card", model_card, "pure", False),
    ("render_chat", render_chat, "pure", False),
    ("estimate_cost", estimate_cost, "pure", False),
    ("Memory.add (bound)", _memory.add, "pure", False),
    ("Memory.as_prompt (bound)", _memory.as_prompt, "pure", False),
    ("ToolAgent.act (bound)", _agent.act, "orchestration", True),
    ("Embedder() instance", _embedder, "hybrid", False),
    ("Budget.charge (bound, in memory)", _budget.charge, "pure", False),
    ("timed_call (callback)", timed_call, "hybrid", True),
    ("mistral_complete (chat.complete)", mistral_complete, "orchestration", False),
    ("moderate_and_store", moderate_and_store, "orchestration", True),
    ("suppress_missing (os.unlink)", suppress_missing, "orchestration", True),
    ("llm_scores_to_probs", llm_scores_to_probs, "hybrid", False),
    ("partial(local_chat, model=...)", _quick, "orchestration", False),
]

"""Corpus: production services that combine I/O with model math: media processing, pricing,
moderation, reward models, checkpoints (labels in CASES at the bottom)."""

from __future__ import annotations

import functools
import io
import pickle
import sqlite3
import subprocess
import tempfile
import urllib.request
import wave

import jax
import jax.numpy as jnp
import numpy as np

import nablax as nx

try:
    from PIL import Image
except ImportError:  # optional
    Image = None

try:
    import anthropic
except ImportError:  # optional
    anthropic = None

try:
    import torch
except ImportError:  # optional
    torch = None


def audio_rms(path: str, rate: int = 16000) -> float:
    """Decode with ffmpeg, then compute the RMS loudness."""
    pcm = subprocess.run(
        ["ffmpeg", "-i", path, "-f", "s16le", "-ac", "1", "-ar", str(rate), "-"],
        capture_output=True,
        check=True,
    ).stdout
    samples = np.frombuffer(pcm, dtype=np.int16).astype(np.float32) / 32768.0
    return float(np.sqrt(np.mean(samples**2)))


def wav_duration(data: bytes) -> float:
    with wave.open(io.BytesIO(data)) as w:
        return w.getnframes() / w.getframerate()


def image_batch(paths: list[str], size=(224, 224)):
    arrays = []
    for p in paths:
        with Image.open(p) as im:
            arrays.append(np.asarray(im.convert("RGB").resize(size), dtype=np.float32) / 255.0)
    return np.stack(arrays)


def log_returns(session, symbols: list[str]):
    """Daily log returns for each symbol from a JSON price API."""
    out = {}
    for sym in symbols:
        resp = session.get(f"https://prices.example/v1/{sym}/daily")
        resp.raise_for_status()
        closes = jnp.asarray([bar["close"] for bar in resp.json()["bars"]])
        out[sym] = jnp.diff(jnp.log(closes))
    return out


def read_frames(sock, n_frames: int, frame_bytes: int = 4096):
    frames = []
    for _ in range(n_frames):
        chunk = sock.recv(frame_bytes)
        frames.append(nx.tensor(np.frombuffer(chunk, dtype=np.uint8).astype(np.float32)))
    return nx.stack(frames).mean(axis=0)


def cached_grade(db: sqlite3.Connection, prompt: str) -> str:
    row = db.execute("SELECT grade FROM grades WHERE prompt = ?", (prompt,)).fetchone()
    if row:
        return row[0]
    client = anthropic.Anthropic()
    msg = client.messages.create(
        model="claude-3-5-haiku-latest",
        max_tokens=5,
        messages=[{"role": "user", "content": prompt}],
    )
    db.execute("INSERT INTO grades VALUES (?, ?)", (prompt, msg.content[0].text))
    return msg.content[0].text


class RewardModel:
    """Scores completions with a remote model's logprobs, normalized with jax."""

    def __init__(self, client, model: str = "gpt-4o-mini"):
        self.client = client
        self.model = model

    def __call__(self, prompt: str, completions: list[str]):
        logps = []
        for c in completions:
            r = self.client.chat.completions.create(
                model=self.model,
                messages=[{"role": "user", "content": prompt}, {"role": "assistant", "content": c}],
                logprobs=True,
                max_tokens=1,
            )
            logps.append(r.choices[0].logprobs.content[0].logprob)
        return jax.nn.softmax(jnp.asarray(logps))


def make_remote_scorer(endpoint: str, weights):
    w = np.asarray(weights, dtype=np.float32)

    def score(text: str) -> float:
        with urllib.request.urlopen(f"{endpoint}?q={text}") as resp:
            feats = np.frombuffer(resp.read(), dtype=np.float32)
        return float(feats @ w)

    return score


async def moderate(texts: list[str], threshold: float = 0.5):
    client = anthropic.AsyncAnthropic()
    scores = []
    for t in texts:
        msg = await client.messages.create(
            model="claude-3-5-haiku-latest",
            max_tokens=3,
            messages=[{"role": "user", "content": f"Toxicity 0-1 for: {t}"}],
        )
        scores.append(float(msg.content[0].text))
    return jnp.asarray(scores) > threshold


def download_and_predict(url: str, x):
    with tempfile.NamedTemporaryFile(suffix=".pt") as tmp:
        urllib.request.urlretrieve(url, tmp.name)
        model = torch.jit.load(tmp.name)
    with torch.no_grad():
        return model(torch.as_tensor(x)).softmax(-1)


def evaluate_checkpoint(path: str, x, y):
    with open(path, "rb") as fh:
        params = pickle.load(fh)
    logits = x @ params["w"] + params["b"]
    return jnp.mean(jnp.argmax(logits, -1) == y)


def append_metrics(path: str, step: int, loss: float) -> None:
    with open(path, "a") as fh:
        fh.write(f"{step},{loss:.6f}\n")


def summarize_file(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    client = anthropic.Anthropic()
    msg = client.messages.create(
        model="claude-3-5-haiku-latest",
        max_tokens=200,
        messages=[{"role": "user", "content": text}],
    )
    return msg.content[0].text


class Pipeline:
    """Runs user-supplied steps in order (their kinds decide)."""

    def __init__(self, *steps):
        self.steps = steps

    def __call__(self, x):
        for step in self.steps:
            x = step(x)
        return x


def pad_token_ids(batch: list[list[int]], pad_id: int = 0):
    width = max(map(len, batch))
    return np.array([ids + [pad_id] * (width - len(ids)) for ids in batch], dtype=np.int32)


def greedy_decode(step_fn, state, max_len: int = 32):
    """Greedy decoding with any step function returning logits (JAX ops around it)."""
    tokens = []
    for _ in range(max_len):
        logits, state = step_fn(state)
        tokens.append(int(jnp.argmax(logits)))
    return jnp.asarray(tokens)


_reward = RewardModel(client=None)
_remote = make_remote_scorer("http://127.0.0.1:9000/features", [0.1, 0.2])

CASES = [
    ("audio_rms", audio_rms, "hybrid", True),
    ("wav_duration", wav_duration, "pure", False),
    ("image_batch (PIL optional)", image_batch, "hybrid", False),
    ("log_returns (session parameter)", log_returns, "hybrid", False),
    ("read_frames (socket parameter)", read_frames, "hybrid", False),
    ("cached_grade", cached_grade, "orchestration", True),
    ("RewardModel() instance", _reward, "hybrid", False),
    ("make_remote_scorer(...) closure", _remote, "hybrid", False),
    ("moderate (async)", moderate, "hybrid", False),
    ("download_and_predict", download_and_predict, "hybrid", True),
    ("evaluate_checkpoint", evaluate_checkpoint, "hybrid", False),
    ("append_metrics", append_metrics, "orchestration", True),
    ("summarize_file", summarize_file, "orchestration", False),
    ("Pipeline() instance (steps chosen at run time)", Pipeline(str.strip), "hybrid", True),
    ("pad_token_ids", pad_token_ids, "tensor", False),
    ("greedy_decode (step_fn parameter)", greedy_decode, "tensor", False),
    ("partial(audio_rms, rate=8000)", functools.partial(audio_rms, rate=8000), "hybrid", True),
]

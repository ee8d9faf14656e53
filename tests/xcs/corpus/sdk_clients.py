"""Corpus: SDK and HTTP client code as written in services: OpenAI / Anthropic / LiteLLM / Cohere
clients, requests and httpx (GET vs POST/PUT/DELETE), aiohttp, urllib with a body, webhooks,
e-mail, payments, cloud storage (labels: kind, effects)."""

from __future__ import annotations

import asyncio
import json
import os
import smtplib
import urllib.request
from email.message import EmailMessage

import numpy as np

try:
    import httpx
except ImportError:  # optional
    httpx = None

try:
    import requests
except ImportError:  # optional
    requests = None

try:
    import aiohttp
except ImportError:  # optional
    aiohttp = None

try:
    import litellm
except ImportError:  # optional
    litellm = None

try:
    from anthropic import Anthropic
    from openai import OpenAI
except ImportError:  # optional
    OpenAI = Anthropic = None

API = os.environ.get("API_URL", "https://api.example.test")
SLACK_WEBHOOK = os.environ.get("SLACK_WEBHOOK", "https://hooks.slack.test/T000")
openai_client = OpenAI() if OpenAI is not None and os.environ.get("OPENAI_API_KEY") else None


def chat_once(prompt: str, model: str = "gpt-4o-mini") -> str:
    resp = openai_client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}]
    )
    return resp.choices[0].message.content


def respond(client, instructions: str, text: str) -> str:
    return client.responses.create(
        model="gpt-4o", instructions=instructions, input=text
    ).output_text


def claude_reply(client, history: list[dict]) -> str:
    msg = client.messages.create(model="claude-3-5-haiku-latest", max_tokens=512, messages=history)
    return "".join(block.text for block in msg.content if block.type == "text")


def litellm_route(prompt: str, models=("gpt-4o-mini", "claude-3-5-haiku-latest")) -> str:
    for name in models:
        try:
            out = litellm.completion(model=name, messages=[{"role": "user", "content": prompt}])
            return out.choices[0].message.content
        except Exception:
            continue
    raise RuntimeError("every model failed")


def embed_batch(client, texts: list[str]):
    resp = client.embeddings.create(model="text-embedding-3-small", input=texts)
    return np.array([d.embedding for d in resp.data], dtype=np.float32)


def upload_training_file(client, path: str) -> str:
    with open(path, "rb") as fh:
        return client.files.create(file=fh, purpose="fine-tune").id


def get_user(user_id: int) -> dict:
    r = requests.get(f"{API}/users/{user_id}", timeout=10)
    r.raise_for_status()
    return r.json()


def create_issue(token: str, repo: str, title: str, body: str) -> int:
    r = requests.post(
        f"https://api.github.test/repos/{repo}/issues",
        headers={"Authorization": f"Bearer {token}"},
        json={"title": title, "body": body},
        timeout=10,
    )
    r.raise_for_status()
    return r.json()["number"]


def delete_webhook(session, hook_id: str) -> None:
    session.delete(f"{API}/hooks/{hook_id}").raise_for_status()


def update_profile(user_id: int, fields: dict) -> dict:
    with httpx.Client(base_url=API, timeout=5.0) as client:
        resp = client.patch(f"/users/{user_id}", json=fields)
        resp.raise_for_status()
        return resp.json()


def search_docs(query: str, top: int = 5) -> list[dict]:
    resp = httpx.get(f"{API}/search", params={"q": query, "top": top})
    return resp.json()["hits"]


async def fetch_all(urls: list[str]) -> list[str]:
    async with aiohttp.ClientSession() as session:

        async def one(url):
            async with session.get(url) as resp:
                return await resp.text()

        return await asyncio.gather(*(one(u) for u in urls))


async def post_events(events: list[dict]) -> int:
    async with httpx.AsyncClient() as client:
        resp = await client.post(f"{API}/events", json=events)
        return resp.status_code


def notify_slack(text: str) -> None:
    data = json.dumps({"text": text}).encode()
    req = urllib.request.Request(
        SLACK_WEBHOOK, data=data, headers={"Content-Type": "application/json"}
    )
    urllib.request.urlopen(req, timeout=5).close()


def download_text(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read().decode("utf-8", "replace")


def send_report_email(to: str, subject: str, body: str, host: str = "localhost") -> None:
    msg = EmailMessage()
    msg["To"], msg["Subject"] = to, subject
    msg.set_content(body)
    with smtplib.SMTP(host) as smtp:
        smtp.send_message(msg)


def charge_card(stripe, customer_id: str, cents: int) -> str:
    intent = stripe.PaymentIntent.create(amount=cents, currency="usd", customer=customer_id)
    return intent.id


def build_headers(token: str, json_body: bool = True) -> dict:
    headers = {"Authorization": f"Bearer {token}", "User-Agent": "svc/1.0"}
    if json_body:
        headers["Content-Type"] = "application/json"
    return headers


def backoff_schedule(retries: int, base: float = 0.25, cap: float = 8.0) -> list[float]:
    return [min(cap, base * 2**i) for i in range(retries)]


def parse_sse_line(line: str) -> dict | None:
    if not line.startswith("data: ") or line.strip() == "data: [DONE]":
        return None
    return json.loads(line[len("data: ") :])


def weather_features(client, cities: list[str]):
    """GET the forecast per city, then standardize the features with NumPy."""
    rows = [client.get(f"{API}/weather/{c}").json()["temps"] for c in cities]
    x = np.asarray(rows, dtype=np.float32)
    return (x - x.mean(0)) / (x.std(0) + 1e-6)


def put_object(s3, bucket: str, key: str, payload: bytes) -> None:
    s3.put_object(Bucket=bucket, Key=key, Body=payload)


def list_keys(s3, bucket: str, prefix: str = "") -> list[str]:
    resp = s3.list_objects_v2(Bucket=bucket, Prefix=prefix)
    return [o["Key"] for o in resp.get("Contents", [])]


CASES = [
    ("chat_once (module-level OpenAI client)", chat_once, "orchestration", False),
    ("respond (client.responses.create)", respond, "orchestration", False),
    ("claude_reply (client.messages.create)", claude_reply, "orchestration", False),
    ("litellm_route", litellm_route, "orchestration", False),
    ("embed_batch", embed_batch, "hybrid", False),
    ("upload_training_file (client.files.create)", upload_training_file, "orchestration", True),
    ("get_user (requests.get)", get_user, "orchestration", False),
    ("create_issue (requests.post)", create_issue, "orchestration", True),
    ("delete_webhook (session.delete)", delete_webhook, "orchestration", True),
    ("update_profile (httpx patch)", update_profile, "orchestration", True),
    ("search_docs (httpx.get)", search_docs, "orchestration", False),
    ("fetch_all (aiohttp get)", fetch_all, "orchestration", False),
    ("post_events (httpx async post)", post_events, "orchestration", True),
    ("notify_slack (urlopen with data)", notify_slack, "orchestration", True),
    ("download_text (urlopen)", download_text, "orchestration", False),
    ("send_report_email (smtplib)", send_report_email, "orchestration", True),
    ("charge_card (stripe parameter)", charge_card, "orchestration", True),
    ("build_headers", build_headers, "pure", False),
    ("backoff_schedule", backoff_schedule, "pure", False),
    ("parse_sse_line", parse_sse_line, "pure", False),
    ("weather_features", weather_features, "hybrid", False),
    ("put_object (s3 parameter)", put_object, "orchestration", True),
    ("list_keys (s3 parameter)", list_keys, "orchestration", False),
]

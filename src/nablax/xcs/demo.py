"""The hybrid pipeline of ``nablax demo``: LLM calls to a local loopback service mixed with tensor
scoring, run by ``xcs.jit``.

For each document the pipeline asks the service for a summary, then for a relevance score of that
summary; nablax turns the scores into softmax weights (tensor code), picks the best summary and asks
one last question about it. The functions are plain Python: ``xcs`` classifies ``summarize``,
``relevance`` and ``answer`` as orchestration (they call the service over HTTP), so under
``xcs.jit`` all summaries are requested at once, each score as soon as its summary arrives, and the
tensor code waits only for the values it reads.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

import nablax as nx

from . import jit
from .loopback import LoopbackServer, chat, score

DOCS = (
    "XLA fuses element-wise operations into a single kernel.",
    "A lazy tensor records operations and runs them when a value is read.",
    "SQLite in WAL mode lets readers and one writer work at the same time.",
    "Autotuning times each candidate config on synchronized, compiled runs.",
    "Thread pools hide the latency of network calls.",
    "Softmax turns scores into weights that sum to one.",
)


def summarize(url: str, doc: str) -> str:
    return chat(url, "Summarize in five words: " + doc)


def relevance(url: str, text: str) -> float:
    return score(url, text)


def answer(url: str, question: str) -> str:
    return chat(url, question)


def pipeline(url: str, docs: tuple[str, ...]):
    summaries = [summarize(url, d) for d in docs]
    scores = [relevance(url, s) for s in summaries]
    weights = nx.softmax(nx.tensor(np.array(scores, np.float32)) * 4.0, axis=0)
    best = int(nx.argmax(weights).item())
    reply = answer(url, f"Why does this matter? {summaries[best]}")
    return reply, weights.numpy(), best


def run_pipeline(latency_s: float = 0.05, print_fn: Callable[[str], object] | None = print) -> dict:
    """Run the pipeline once plainly and once under ``xcs.jit`` against a loopback service with
    ``latency_s`` per call; print the plan and the overlap. Returns both wall times, the
    ``xcs.jit`` stats and whether the results were equal.

    >>> r = run_pipeline(latency_s=0.01, print_fn=None)
    >>> r["same_result"], r["stats"].calls
    (True, 13)
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    fast = jit(pipeline)
    with LoopbackServer(latency_s=latency_s) as server:
        t0 = time.perf_counter()
        plain = pipeline(server.url, DOCS)
        t_plain = time.perf_counter() - t0
        t0 = time.perf_counter()
        lazy = fast(server.url, DOCS)
        t_jit = time.perf_counter() - t0
    same = plain[0] == lazy[0] and plain[2] == lazy[2] and np.allclose(plain[1], lazy[1])
    stats, plan = fast.stats(), fast.last_plan()
    say(
        f"xcs.jit hybrid pipeline: {stats.calls} calls to a loopback service "
        f"({latency_s * 1e3:.0f} ms each) and softmax scoring in nablax"
    )
    say(f"  plain Python {t_plain * 1e3:.0f} ms, xcs.jit {t_jit * 1e3:.0f} ms "
        f"({t_plain / t_jit:.1f}x), same result: {same}")  # fmt: skip
    say(f"  overlap {stats.overlap:.1f}x, time saved {stats.saved_s * 1e3:.0f} ms; the plan:")
    for line in str(plan).splitlines()[1:]:
        say("  " + line)
    say(f"  best document #{lazy[2]}: {lazy[0]!r}")
    return {"plain_s": t_plain, "jit_s": t_jit, "stats": stats, "same_result": same}

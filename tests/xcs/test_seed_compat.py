"""Behaviours nablax.xcs shares with the seed (Ember's XCS) where the two used to differ:
operation summaries list only what was found, undefined names called directly are judged by their
words, array-free tuples and dicts of numbers come back by position from the map fallback
(tests/xcs/test_maps.py), and ``f.stats()`` also reads as the seed's dict."""

from __future__ import annotations

import time

import numpy as np
import pytest

from nablax import xcs
from nablax.xcs.classify.analysis import analyze_operations, classify, clear_cache

# ---- operation summaries: operations found, never a placeholder ----------------------------------


def run_given(fn, items):
    return [fn(x) for x in items]


def forward(net, x):
    return net(x)


def test_summaries_of_functions_calling_what_they_are_given_are_empty():
    for fn in (run_given, forward):
        c, s = classify(fn), analyze_operations(fn)
        assert (c.kind, c.effects) == ("hybrid", True)  # still the safe route
        assert "known only at run time" in c.reasons[0]
        assert (s.tensor_ops, s.orchestration_ops) == (frozenset(), frozenset())
        assert not (s.has_tensor_ops or s.has_orchestration_ops or s.is_hybrid)


# ---- undefined names called directly: the keyword fallback ---------------------------------------
# The names below are bound nowhere on purpose (F821): only their words can tell what they are.


def summarize_ticket(text):
    return request_llm_summary(text)  # noqa: F821


def draft_reply(text):
    return create_chat_completion(messages=[{"role": "user", "content": text}])  # noqa: F821


def purge_cache(key):
    return delete_completion(key)  # noqa: F821


def project(a, b):
    return batched_matmul(a, b) * 2.0  # noqa: F821


def normalize(scores):
    return softmax(scores)  # noqa: F821


def tidy(text):
    return strip_markup(text)  # noqa: F821


pending_chat_fn = None  # a placeholder, set at start-up: unresolved when classified


def greet(name):
    return pending_chat_fn(f"say hello to {name}")


def call_back(on_completion, result):  # a parameter keeps its stricter rule
    return on_completion(result)


def create_completion(prompt):  # a defined helper is read, not judged by its name
    return prompt.strip().lower()


def uses_helper(prompt):
    return create_completion(prompt)


@pytest.mark.parametrize(
    ("fn", "kind", "effects", "op"),
    [
        (summarize_ticket, "orchestration", False, "request_llm_summary"),
        (draft_reply, "orchestration", False, "create_chat_completion"),
        (purge_cache, "orchestration", True, "delete_completion"),
        (greet, "orchestration", False, "pending_chat_fn"),
        (project, "tensor", False, "batched_matmul"),
        (normalize, "tensor", False, "softmax"),
    ],
)
def test_undefined_names_are_judged_by_their_words(fn, kind, effects, op):
    clear_cache()
    c, s = classify(fn), analyze_operations(fn)
    assert (c.kind, c.effects) == (kind, effects), c
    assert c.reasons[0].startswith("keyword fallback") and op in c.reasons[0]
    assert op in (s.orchestration_ops if kind == "orchestration" else s.tensor_ops)
    assert not c.jax_traceable  # an unknown library: never handed to jax transforms


def test_keyword_fallback_for_undefined_names_stays_narrow():
    assert classify(tidy).kind == "pure"  # no telling word: nothing found
    assert analyze_operations(tidy) == xcs.OperationSummary()
    c = classify(call_back)
    assert c.kind == "hybrid" and "known only at run time" in c.reasons[0]
    assert classify(uses_helper).kind == "pure"  # the helper's code decides, not its name
    assert classify(draft_reply).reasons[-1].startswith("read-only: calls create_chat_completion")
    assert "writes: `delete`" in classify(purge_cache).reasons[-1]


# ---- f.stats() as the seed's dict ----------------------------------------------------------------


@xcs.mark_orchestration(effects=False)
def fetch(i):
    time.sleep(0.05)
    return i * 10


def test_stats_read_as_the_seeds_dict():
    @xcs.jit
    def arithmetic():
        a = 1
        return a + 3

    @xcs.jit
    def fan_out():
        return [fetch(i) for i in range(4)]

    @xcs.jit
    def chain():
        return fetch(fetch(fetch(1)))

    assert arithmetic() == 4
    s = arithmetic.stats()
    assert s.calls == 0 and not s["optimized"] and s["status"] == "fallback"
    assert s["reason"] == "no_parallelism" and s.get("reason") == "no_parallelism"

    assert fan_out() == [0, 10, 20, 30]
    f = fan_out.stats()
    assert f.overlap > 1.2 and f["optimized"] and f["status"] == "compiled"
    assert "reason" not in f and f.get("reason", "-") == "-"
    assert dict(f) == {
        "status": "compiled",
        "optimized": True,
        **{k: getattr(f, k) for k in ("calls", "busy_s", "wall_s", "overlap", "saved_s")},
    }
    assert f["calls"] == 4 and list(f) == list(f.keys()) and len(f) == len(f.items()) == 7

    assert chain() == 1000
    c = chain.stats()  # each call waits for the previous one: nothing overlaps
    assert c.calls == 3 and c.overlap <= 1.0 + 1e-6 and c["status"] == "fallback"
    with pytest.raises(KeyError, match="'hits'.*Fix: one of status, optimized"):
        c["hits"]
    assert np.isclose(c["saved_s"], c.saved_s)

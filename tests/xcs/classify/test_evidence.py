"""``classify/evidence.py``: evidence from a rule, the order in which reasons are told, and a
helper's analysis as one item of evidence per kind for its caller."""

from __future__ import annotations

from nablax.xcs.classify import rules
from nablax.xcs.classify.evidence import evidence_from_rule, rank, summarize
from nablax.xcs.classify.records import READ, WRITE, Analysis, Evidence


def test_evidence_from_rule():
    (e,) = evidence_from_rule(rules.JAX, "jnp.dot", "calls jnp.dot", (WRITE, "ignored"))
    assert (e.kind, e.op, e.traceable, e.ops, e.fx) == ("tensor", "jnp.dot", True, ("jnp.dot",), "")
    (e,) = evidence_from_rule(rules.HTTP, "requests.get", "calls it", (READ, "a GET"), weak=True)
    assert (e.kind, e.fx, e.fx_why, e.weak) == ("orchestration", READ, "a GET", True)
    assert evidence_from_rule(rules.NEUTRAL, "json.dumps", "x") == []
    assert evidence_from_rule(rules.DYNAMIC, "exec", "x") == []


def test_rank_puts_calls_before_guesses_imports_and_constants():
    call = Evidence("tensor", "a", "calls np.tanh (NumPy) at line 2")
    weak = Evidence("tensor", "b", "calls x.sum at line 3 (array method)", weak=True)
    imported = Evidence("tensor", "c", "imports numpy (NumPy) at line 1")
    constant = Evidence("tensor", "d", "uses np.float32 (NumPy constant) at line 4")
    shuffled = [weak, constant, imported, call]
    assert sorted(shuffled, key=rank) == [call, constant, imported, weak]


def test_summarize_gives_one_item_per_kind_of_the_helper():
    sub = Analysis(
        evidence=[
            Evidence("tensor", "np.tanh", "calls np.tanh (NumPy) at line 2", ops=("np.tanh",)),
            Evidence("tensor", "np.exp", "calls np.exp (NumPy) at line 3", ops=("np.exp",)),
            Evidence("orchestration", "requests.post", "calls requests.post at line 4",
                     ops=("requests.post",), fx=WRITE, fx_why="calls requests.post (writes)"),
        ]
    )  # fmt: skip
    out = summarize("helper", 7, sub)
    assert [e.kind for e in out] == ["tensor", "orchestration"]
    tensor, orch = out
    assert tensor.ops == ("np.tanh", "np.exp") and tensor.op == "helper"
    assert tensor.reason == (
        "calls helper at line 7, which is tensor code (calls np.tanh (NumPy) at line 2; +1 more)"
    )
    assert tensor.leaf == "calls np.tanh (NumPy) at line 2"
    assert orch.fx == WRITE and "calls helper at line 7" in orch.fx_why
    assert summarize("helper", None, Analysis()) == []

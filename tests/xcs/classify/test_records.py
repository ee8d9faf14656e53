"""``classify/records.py``: the shared records. ``Analysis.merge`` keeps one copy of each fact,
and ``OperationSummary``'s properties are set logic over its two sets."""

from __future__ import annotations

import itertools

import pytest

from nablax.xcs.classify.records import (
    READ,
    UNKNOWN,
    WRITE,
    Analysis,
    Classification,
    Evidence,
    OperationSummary,
    Rule,
)


def test_merge_keeps_one_copy_of_each_fact():
    a = Evidence("tensor", "jnp.dot", "calls jnp.dot (JAX) at line 2", True)
    b = Evidence("orchestration", "requests.get", "calls requests.get (HTTP I/O) at line 3")
    left = Analysis(evidence=[a], uncertain=["u"], fx_extra=[(READ, "r")], notes=["len"])
    right = Analysis(
        evidence=[a, b], uncertain=["u", "v"], fx_extra=[(READ, "r")], notes=["len"], complete=False
    )
    left.merge(right)
    assert left.evidence == [a, b] and left.uncertain == ["u", "v"]
    assert left.fx_extra == [(READ, "r")] and left.notes == ["len", "len"]  # notes are counted
    assert left.kinds() == {"tensor", "orchestration"} and left.complete is False


@pytest.mark.parametrize(
    "tensor, orch", list(itertools.product([frozenset(), frozenset({"jnp.dot"})], repeat=2))
)
def test_operation_summary_properties(tensor, orch):
    orch = frozenset({"requests.get"}) if orch else frozenset()
    s = OperationSummary(tensor, orch)
    assert s.has_tensor_ops == bool(tensor) and s.has_orchestration_ops == bool(orch)
    assert s.only_tensor_ops == (bool(tensor) and not orch)
    assert s.only_orchestration_ops == (bool(orch) and not tensor)
    assert s.is_hybrid == (bool(tensor) and bool(orch))


def test_records_are_values():
    assert Rule("tensor", "JAX", True) == Rule("tensor", "JAX", True)
    assert hash(Classification("pure", ("x",), False)) == hash(
        Classification("pure", ("x",), False)
    )
    assert len({WRITE, READ, UNKNOWN}) == 3
    with pytest.raises(AttributeError):
        Classification("pure", (), False).kind = "tensor"  # type: ignore[misc]

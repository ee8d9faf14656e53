"""The labeled corpus (``tests/xcs/corpus/*.py``): realistic functions, each labeled in its
module's ``CASES``, classified as a whole; ``pytest -s`` prints the per-class accuracy table."""

from __future__ import annotations

import sys
from collections import Counter

from nablax.xcs.classify.analysis import (
    classify,
    clear_cache,
)

from .corpus import KINDS, OPTIONAL, accuracy_table, corpus_cases, corpus_rows


def test_corpus_is_large_and_balanced():
    cases = corpus_cases()
    counts = Counter(kind for _, _, kind, _ in cases)
    assert len(cases) >= 250, counts
    assert set(counts) == set(KINDS)
    assert min(counts.values()) >= 25, counts
    assert all(isinstance(e, bool) for *_, e in cases)
    with_effects = [k for _, _, k, e in cases if e]
    assert len(with_effects) >= 50 and set(with_effects) == {"orchestration", "hybrid"}
    holdout = [n for n, *_ in cases if n.startswith("holdout2.")]
    assert len(holdout) >= 30  # written after the rules, scored separately


def test_corpus_accuracy():
    clear_cache()
    overall, fx_rate, table = accuracy_table(corpus_rows())
    print("\nxcs.classify on the labeled corpus\n" + table)
    assert overall >= 0.97, table
    assert fx_rate >= 0.95, table


def test_holdout_accuracy():
    """The hold-out files (written after the rules, not tuned on) on their own."""
    clear_cache()
    overall, fx_rate, table = accuracy_table(corpus_rows(holdout=True))
    print("\nxcs.classify on the hold-out files\n" + table)
    assert overall >= 0.9 and fx_rate >= 0.85, table


def test_corpus_without_optional_packages(monkeypatch):
    """SDKs that are not installed (import fails) are classified from the source just the same."""
    for name in OPTIONAL:
        monkeypatch.setitem(sys.modules, name, None)  # `import openai` now raises ImportError
    clear_cache()
    try:
        rows = corpus_rows("xcs_corpus_bare")
    finally:
        clear_cache()
    overall, fx_rate, table = accuracy_table(rows)
    print(f"\nxcs.classify on the corpus with {', '.join(OPTIONAL)} unavailable\n" + table)
    assert overall >= 0.97 and fx_rate >= 0.95, table


def test_reasons_are_readable_sentences():
    clear_cache()
    for name, obj, _kind, _ in corpus_cases():
        c = classify(obj)
        assert c.reasons and all(isinstance(r, str) and r for r in c.reasons), name
        assert all(len(r) < 400 and " at 0x" not in r for r in c.reasons), (name, c.reasons)
        about_effects = [r for r in c.reasons if r.startswith(("effects", "read-only"))]
        assert len(about_effects) == (c.kind in ("orchestration", "hybrid")), (name, c.reasons)

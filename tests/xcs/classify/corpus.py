"""The labeled corpus of the classifier tests (``tests/xcs/corpus/*.py``): each module lists its
functions in ``CASES`` as ``(name, callable, kind, effects)``."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from nablax.xcs.classify.analysis import (
    Classification,
    classify,
)

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
KINDS = ("tensor", "orchestration", "hybrid", "pure")
OPTIONAL = ("openai", "anthropic", "httpx", "torch", "PIL", "pandas", "requests", "aiohttp")


def load(path: Path, prefix: str):
    name = f"{prefix}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def corpus_cases(prefix: str = "xcs_corpus") -> list[tuple[str, object, str, bool]]:
    """``(group.name, callable, kind, effects)`` for every labeled corpus function."""
    cases = []
    for path in sorted(CORPUS.glob("*.py")):
        module = load(path, prefix)
        for n, obj, kind, effects in module.CASES:
            if obj is not None:
                cases.append((f"{path.stem}.{n}", obj, kind, effects))
    return cases


def accuracy_table(rows: list[tuple[str, str, bool, Classification]]) -> tuple[float, float, str]:
    """Kind accuracy per class, per corpus file and overall, effects accuracy, and the
    misclassified rows, as printable text."""
    lines = ["| class | correct | total | accuracy |", "|---|---:|---:|---:|"]
    for kind in KINDS:
        mine = [r for r in rows if r[1] == kind]
        ok = sum(r[3].kind == kind for r in mine)
        lines.append(f"| {kind} | {ok} | {len(mine)} | {ok / max(1, len(mine)):.1%} |")
    ok = sum(r[3].kind == r[1] for r in rows)
    fx = sum(r[3].effects == r[2] for r in rows)
    overall, fx_rate = ok / len(rows), fx / len(rows)
    lines.append(f"| overall | {ok} | {len(rows)} | {overall:.1%} |")
    lines += ["", "| group | n | kind | effects |", "|---|---:|---:|---:|"]
    for group in sorted({r[0].split(".")[0] for r in rows}):
        mine = [r for r in rows if r[0].split(".")[0] == group]
        k = sum(r[3].kind == r[1] for r in mine) / len(mine)
        e = sum(r[3].effects == r[2] for r in mine) / len(mine)
        lines.append(f"| {group} | {len(mine)} | {k:.1%} | {e:.1%} |")
    lines.append(f"| all | {len(rows)} | {overall:.1%} | {fx_rate:.1%} |")
    for name, kind, effects, c in rows:
        if (c.kind, c.effects) != (kind, effects):
            lines.append(
                f"  WRONG {name}: expected {kind}/effects={effects}, got {c.kind}/"
                f"effects={c.effects}: {'; '.join(c.reasons)}"
            )
    return overall, fx_rate, "\n".join(lines)


def corpus_rows(prefix: str = "xcs_corpus", holdout: bool | None = None) -> list:
    rows = []
    for name, obj, kind, effects in corpus_cases(prefix):
        if holdout is None or name.startswith("holdout") == holdout:
            rows.append((name, kind, effects, classify(obj)))
    return rows

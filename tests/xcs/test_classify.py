"""The xcs function classifier: markers, source analysis, the labeled corpus, caching, targets.

The corpus (``tests/xcs/corpus/*.py``) holds realistic functions, each labeled in its module's
``CASES``; ``pytest -s`` prints the per-class accuracy table.
"""

from __future__ import annotations

import functools
import importlib.util
import sqlite3
import sys
import textwrap
from collections import Counter
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from nablax.xcs import _resolve
from nablax.xcs.analysis import (
    Classification,
    OperationSummary,
    analyze_operations,
    classify,
    classify_target,
    clear_cache,
    format_table,
)
from nablax.xcs.markers import (
    mark_hybrid,
    mark_orchestration,
    mark_pytree_safe,
    mark_tensor,
    marker_of,
    pytree_safe,
)

CORPUS = Path(__file__).parent / "corpus"
KINDS = ("tensor", "orchestration", "hybrid", "pure")
OPTIONAL = ("openai", "anthropic", "httpx", "torch", "PIL")


def _load(path: Path, prefix: str):
    name = f"{prefix}_{path.stem}"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def corpus_cases(prefix: str = "xcs_corpus") -> list[tuple[str, object, str]]:
    cases = []
    for path in sorted(CORPUS.glob("*.py")):
        module = _load(path, prefix)
        cases += [
            (f"{path.stem}.{n}", obj, kind) for n, obj, kind in module.CASES if obj is not None
        ]
    return cases


def accuracy_table(rows: list[tuple[str, str, Classification]]) -> tuple[float, str]:
    """Per-class and overall accuracy, and the misclassified rows, as printable text."""
    lines = ["| class | correct | total | accuracy |", "|---|---:|---:|---:|"]
    for kind in KINDS:
        mine = [r for r in rows if r[1] == kind]
        ok = sum(r[2].kind == kind for r in mine)
        lines.append(f"| {kind} | {ok} | {len(mine)} | {ok / max(1, len(mine)):.1%} |")
    ok = sum(r[2].kind == r[1] for r in rows)
    overall = ok / len(rows)
    lines.append(f"| overall | {ok} | {len(rows)} | {overall:.1%} |")
    for name, expected, c in rows:
        if c.kind != expected:
            lines.append(
                f"  WRONG {name}: expected {expected}, got {c.kind}: {'; '.join(c.reasons)}"
            )
    return overall, "\n".join(lines)


# ---- the labeled corpus ---------------------------------------------------------------------


def test_corpus_is_large_and_balanced():
    counts = Counter(kind for _, _, kind in corpus_cases())
    assert sum(counts.values()) >= 120, counts
    assert set(counts) == set(KINDS)
    assert min(counts.values()) >= 25, counts


def test_corpus_accuracy():
    clear_cache()
    rows = [(name, kind, classify(obj)) for name, obj, kind in corpus_cases()]
    overall, table = accuracy_table(rows)
    print("\nxcs.classify on the labeled corpus\n" + table)
    assert overall >= 0.95, table


def test_corpus_without_optional_packages(monkeypatch):
    """SDKs that are not installed (import fails) are classified from the source just the same."""
    for name in OPTIONAL:
        monkeypatch.setitem(sys.modules, name, None)  # `import openai` now raises ImportError
    clear_cache()
    try:
        rows = [(n, k, classify(obj)) for n, obj, k in corpus_cases("xcs_corpus_bare")]
    finally:
        clear_cache()
    overall, table = accuracy_table(rows)
    print(f"\nxcs.classify on the corpus with {', '.join(OPTIONAL)} unavailable\n" + table)
    assert overall >= 0.95, table


def test_reasons_are_readable_sentences():
    clear_cache()
    for name, obj, _ in corpus_cases():
        c = classify(obj)
        assert c.reasons and all(isinstance(r, str) and r for r in c.reasons), name
        assert all(len(r) < 400 and " at 0x" not in r for r in c.reasons), (name, c.reasons)


# ---- markers --------------------------------------------------------------------------------


def _deco(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class _Model:
    @mark_tensor
    def forward(self, x):
        return x

    def plain(self, x):
        return x


def test_markers_through_wraps_partial_bound_and_objects():
    @_deco
    @_deco
    @mark_orchestration
    def fetch(url, timeout=1.0):
        return url

    assert marker_of(fetch) == "orchestration"
    assert marker_of(functools.partial(fetch, timeout=3)) == "orchestration"
    assert marker_of(_Model().forward) == "tensor" and marker_of(_Model().plain) is None
    bound = mark_hybrid(_Model().plain)  # a bound method takes no attributes: a wrapper does
    assert marker_of(bound) == "hybrid" and bound(3) == 3
    assert marker_of(mark_orchestration(len)) == "orchestration" and marker_of(len) is None

    @mark_hybrid
    class Agent:
        def __call__(self, q):
            return q

    assert marker_of(Agent) == marker_of(Agent()) == "hybrid"
    assert mark_tensor()(lambda x: x).__xcs_kind__ == "tensor"  # @mark_tensor() works too


def test_marker_cycles_and_pytree_flag():
    def f(x):
        return x

    f.__wrapped__ = f  # a cycle must not hang
    assert marker_of(f) is None
    assert pytree_safe(mark_pytree_safe(f)) is True
    assert pytree_safe(mark_pytree_safe(False)(_deco(len))) is False
    assert pytree_safe(_deco(f)) is True  # seen through the wraps chain
    with pytest.raises(TypeError, match=r"xcs.mark_pytree_safe: argument `flag`"):
        mark_pytree_safe("yes")
    with pytest.raises(TypeError, match=r"xcs.mark_tensor: .*must be callable"):
        mark_tensor(3)


def test_markers_override_the_analysis():
    @mark_orchestration
    def sums(x):
        return jnp.sum(x)

    c = classify(sums)
    assert c.kind == "orchestration" and c.reasons[0] == "marked with @mark_orchestration"
    assert classify(mark_tensor(lambda x: jnp.tanh(x))).jax_traceable
    assert not classify(mark_tensor(lambda x: np.tanh(x))).jax_traceable
    assert classify(_deco(mark_hybrid(lambda x: x))).kind == "hybrid"


# ---- source analysis ------------------------------------------------------------------------


def test_whole_tokens_only():
    def upgrade(relax, requests_count, grad_norm):
        lax_ok = relax and grad_norm < 1
        return requests_count + upgrade_level(lax_ok)

    def upgrade_level(ok):
        return 2 if ok else 1

    c = classify(upgrade)
    assert c.kind == "pure", c


def test_strings_docstrings_and_comments_are_ignored():
    def describe(n):
        """Uses requests.get and jax.grad to open files (it does not)."""
        # import numpy as np; np.dot(a, b); subprocess.run(["ls"])
        return f"requests: {n}, see open('x') and jnp.dot in the docs"

    assert classify(describe).kind == "pure"


xp = np


def test_aliases_at_module_level_and_inside_the_function():
    def a(x):
        return xp.tanh(x)  # xp = np at module level

    def b(x):
        from jax import numpy as jnumpy

        return jnumpy.tanh(x)

    def c(path):
        from os.path import exists as there

        return there(path)

    def d(x):
        import jax.lax as L

        return L.cumsum(x)

    assert (classify(a).kind, classify(a).jax_traceable) == ("tensor", False)
    assert (classify(b).kind, classify(b).jax_traceable) == ("tensor", True)
    assert classify(c).kind == "orchestration"
    assert classify(d).jax_traceable
    assert "(JAX)" in classify(b).reasons[0]


def test_closures_globals_and_instance_attributes():
    conn = sqlite3.connect(":memory:")

    def count_rows():
        return conn.execute("SELECT 1").fetchall()

    class Repo:
        def __init__(self, db):
            self.db = db

        def rows(self):
            return self.db.execute("SELECT 1").fetchall()

    try:
        assert classify(count_rows).kind == "orchestration"
        c = classify(Repo(conn).rows)
        assert c.kind == "orchestration" and "sqlite3" in " ".join(c.reasons)
    finally:
        conn.close()


def test_lambdas_sharing_a_line():
    pair = [lambda x: jnp.sum(x), lambda s: len(s)]  # noqa: E731
    assert [classify(f).kind for f in pair] == ["tensor", "pure"]


def test_mutual_recursion_and_depth_limit(tmp_path):
    src = ["import jax.numpy as jnp", ""]
    src += [f"def f{i}(x):\n    return f{i + 1}(x)\n" for i in range(9)]
    src += ["def f9(x):\n    return jnp.sum(x)\n"]
    src += [
        "def even(n):\n    return True if n == 0 else odd(n - 1)\n",
        "def odd(n):\n    return jnp.zeros(()) if n == 0 else even(n - 1)\n",
    ]
    path = tmp_path / "deep_helpers.py"
    path.write_text("\n".join(src))
    clear_cache()
    mod = _load(path, "xcs_classify_test")
    assert classify(mod.even).kind == classify(mod.odd).kind == "tensor"  # a cycle ends
    deep = classify(mod.f0)
    assert deep.kind == "hybrid" and "deeper than" in deep.reasons[0]  # unknown past the limit
    assert classify(mod.f5).kind == "tensor"  # within the limit


def test_no_source_is_hybrid_but_bytecode_still_speaks():
    ns: dict = {}
    exec("def f(x):\n    return x + 1\n", ns)
    c = classify(ns["f"])
    assert c.kind == "hybrid" and "no source code" in c.reasons[0]
    ns = {"np": np}
    exec("def g(x):\n    return np.add(x, 1)\n", ns)
    assert classify(ns["g"]).kind == "tensor"


def test_library_callables_by_module():
    assert classify(np.add).kind == classify(jnp.dot).kind == "tensor"
    assert classify(len).kind == classify(sorted).kind == "pure"
    assert classify(open).kind == classify(print).kind == classify(input).kind == "orchestration"
    assert classify(sqlite3.connect).kind == "orchestration"
    assert classify(jnp.dot).jax_traceable and not classify(np.add).jax_traceable


def test_jax_traceable_needs_pure_jax():
    log: list = []

    def traced(x):
        return jnp.tanh(x) * 2

    def host(x):
        return np.asarray(jnp.tanh(x))

    def noisy(x):
        log.append(x)
        return jnp.tanh(x)

    def chatty(x):
        print(x)
        return jnp.tanh(x)

    assert classify(traced).jax_traceable
    assert classify(host).kind == "tensor" and not classify(host).jax_traceable
    assert classify(noisy).kind == "tensor" and not classify(noisy).jax_traceable
    assert classify(chatty).kind == "hybrid" and not classify(chatty).jax_traceable


def test_callable_objects_classes_and_partials():
    class Scale:
        def __init__(self, k):
            self.k = jnp.asarray(k)

        def __call__(self, x):
            return self.k * jnp.tanh(x)

    assert classify(Scale(2.0)).kind == classify(Scale).kind == "tensor"
    assert classify(functools.partial(np.add, 1)).kind == "tensor"
    assert classify(functools.partial(print, end="")).kind == "orchestration"


def test_errors_name_the_api_and_fix():
    with pytest.raises(TypeError, match=r"xcs.classify: argument `func` must be callable.*Fix"):
        classify(3)
    with pytest.raises(ValueError, match=r"xcs.classify_target: .*no_such_module_x.*Fix"):
        classify_target("no_such_module_x")
    with pytest.raises(ValueError, match=r"no such file"):
        classify_target("missing/file.py")


# ---- cache ----------------------------------------------------------------------------------


def test_cache_hits_and_invalidation():
    def f(x):
        return jnp.sum(x)

    clear_cache()
    first = classify(f)
    assert classify(f) is first  # a hit returns the cached object
    assert analyze_operations(f).tensor_ops == frozenset({"jnp.sum"})

    def g(x):
        print(x)

    f.__code__ = g.__code__  # new code: classified again
    assert classify(f).kind == "orchestration"
    clear_cache()
    assert classify(f) is not first


def test_closure_rebinding_is_never_stale():
    def make():
        op = np.add

        def run(x):
            return op(x, 1)

        def swap(new):
            nonlocal op
            op = new

        return run, swap

    run, swap = make()
    assert classify(run).kind == "tensor"
    swap(print)
    assert classify(run).kind == "orchestration"
    swap(np.add)
    assert classify(run).kind == "tensor"


def test_bound_methods_are_cached_per_instance():
    class Box:
        def __init__(self, handler):
            self.handler = handler

        def go(self, x):
            return self.handler(x)

    a, b = Box(np.tanh), Box(print)
    assert classify(a.go).kind == "tensor" and classify(b.go).kind == "orchestration"
    assert classify(a.go) is classify(a.go)


# ---- legacy API, targets, table -------------------------------------------------------------


def test_analyze_operations_fields():
    def hybrid(url, x):
        import requests

        return jnp.dot(x, x) + len(requests.get(url).text)

    s = analyze_operations(hybrid)
    assert isinstance(s, OperationSummary)
    assert "jnp.dot" in s.tensor_ops and "requests.get" in s.orchestration_ops
    assert s.is_hybrid and not s.only_tensor_ops and not s.only_orchestration_ops
    t = analyze_operations(jnp.dot)
    assert t.only_tensor_ops and not t.is_hybrid
    assert analyze_operations(len) == OperationSummary(frozenset(), frozenset())


def test_classify_target_on_a_file_and_a_module():
    rows = classify_target(CORPUS / "ops_tools.py")
    names = [n for n, _ in rows]
    assert names[:3] == ["git_revision", "disk_usage_gb", "record_event"]  # source order
    assert dict(rows)["slugify"].kind == "pure"
    rows = classify_target("nablax.xcs.markers")
    assert ("marker_of", classify(marker_of)) in rows
    methods = [n for n, _ in classify_target(str(CORPUS / "agents.py")) if "." in n]
    assert "WebAgent.fetch" in methods and "Summarizer.__call__" in methods


def test_format_table():
    rows = [
        ("score", Classification("tensor", ("calls jnp.dot (JAX) at line 3",), True)),
        (
            "ask",
            Classification("orchestration", ("calls a (LLM API)", "calls b (HTTP I/O)"), False),
        ),
    ]
    text = format_table(rows)
    expected = textwrap.dedent(
        """\
        name   kind           reasons
        -----  -------------  -----------------------------
        score  tensor         calls jnp.dot (JAX) at line 3
        ask    orchestration  calls a (LLM API)
                              calls b (HTTP I/O)

        2 callables: 1 tensor, 1 orchestration"""
    )
    assert text == expected


def test_helper_limits_are_sane():
    assert 3 <= _resolve.MAX_DEPTH <= 10 and _resolve.MAX_VISITS >= 64


def test_marking_after_classifying_is_seen():
    def step(x):
        return jnp.tanh(x)

    assert classify(step).kind == "tensor"
    mark_orchestration(step)
    assert classify(step).kind == "orchestration"


def test_annotations_are_the_last_resort():
    import jax

    def total(x: jax.Array) -> jax.Array:
        return x.sum()

    def rows(conn: sqlite3.Connection):
        return conn.cursor()

    def described(x: np.ndarray):
        """Annotations lose to the source: this one calls print."""
        print(x)

    assert (
        classify(total).kind == "tensor" and "annotated as jax.Array" in classify(total).reasons[0]
    )
    assert classify(rows).kind == "orchestration"
    assert classify(described).kind == "orchestration"


def test_host_transfers_break_traceability():
    def to_host(x):
        return jnp.sum(x).item()

    def default_dtype(x, dtype=jnp.float32):
        return x.astype(dtype)

    assert classify(to_host).kind == "tensor" and not classify(to_host).jax_traceable
    assert classify(default_dtype).kind == "tensor" and classify(default_dtype).jax_traceable

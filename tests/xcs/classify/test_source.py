"""``classify/source.py``: what a function's source says (whole names only; strings, docstrings
and comments ignored; lambdas found by line; bytecode when there is no source)."""

from __future__ import annotations

import linecache

import jax.numpy as jnp
import numpy as np

from nablax.xcs.classify import source
from nablax.xcs.classify.analysis import classify


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


def test_lambdas_sharing_a_line():
    pair = [lambda x: jnp.sum(x), lambda s: len(s)]  # noqa: E731
    assert [classify(f).kind for f in pair] == ["tensor", "pure"]


def test_no_source_is_hybrid_but_bytecode_still_speaks():
    ns: dict = {}
    exec("def f(x):\n    return x + 1\n", ns)
    c = classify(ns["f"])
    assert c.kind == "hybrid" and "no source code" in c.reasons[0]
    ns = {"np": np}
    exec("def g(x):\n    return np.add(x, 1)\n", ns)
    assert classify(ns["g"]).kind == "tensor"


def test_facts_are_cached_per_code_object_and_forgotten_by_clear():
    def f(x):
        return np.tanh(x)

    first = source.facts_for(f.__code__, f.__globals__)
    assert source.facts_for(f.__code__, f.__globals__) is first
    assert [r.names for r in first.refs][:1] == [("np", "tanh", "()")]
    source.clear()
    again = source.facts_for(f.__code__, f.__globals__)
    assert again is not first and again == first
    assert source._codes.maxsize == source._MAX_CODES and source._files.maxsize == source._MAX_FILES


def test_a_file_is_parsed_again_when_its_text_changes(tmp_path):
    path = tmp_path / "edited.py"
    path.write_text("import json\n")
    assert source.file_info(str(path), None).imports == {"json": "json"}
    path.write_text("import os\nimport sys\n")
    linecache.checkcache(str(path))
    assert source.file_info(str(path), None).imports == {"os": "os", "sys": "sys"}

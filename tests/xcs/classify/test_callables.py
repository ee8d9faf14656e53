"""``classify/callables.py``: each kind of callable (library callables by module, callable
objects, classes, partials) and the limits on following helpers."""

from __future__ import annotations

import functools
import sqlite3

import jax.numpy as jnp
import numpy as np

from nablax.xcs.classify import callables
from nablax.xcs.classify.analysis import (
    classify,
    clear_cache,
)

from .corpus import load


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
    mod = load(path, "xcs_classify_test")
    assert classify(mod.even).kind == classify(mod.odd).kind == "tensor"  # a cycle ends
    deep = classify(mod.f0)
    assert deep.kind == "hybrid" and "deeper than" in deep.reasons[0]  # unknown past the limit
    assert classify(mod.f5).kind == "tensor"  # within the limit


def test_library_callables_by_module():
    assert classify(np.add).kind == classify(jnp.dot).kind == "tensor"
    assert classify(len).kind == classify(sorted).kind == "pure"
    assert classify(open).kind == classify(print).kind == classify(input).kind == "orchestration"
    assert classify(sqlite3.connect).kind == "orchestration"
    assert classify(jnp.dot).jax_traceable and not classify(np.add).jax_traceable


def test_callable_objects_classes_and_partials():
    class Scale:
        def __init__(self, k):
            self.k = jnp.asarray(k)

        def __call__(self, x):
            return self.k * jnp.tanh(x)

    assert classify(Scale(2.0)).kind == classify(Scale).kind == "tensor"
    assert classify(functools.partial(np.add, 1)).kind == "tensor"
    assert classify(functools.partial(print, end="")).kind == "orchestration"


def test_helper_limits_are_sane():
    assert 3 <= callables.MAX_DEPTH <= 10 and callables.MAX_VISITS >= 64

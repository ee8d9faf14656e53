"""``classify/analysis.py``: the entry points' errors and the classification cache."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from nablax.xcs.classify.analysis import (
    analyze_operations,
    classify,
    classify_target,
    clear_cache,
)


def test_errors_name_the_api_and_fix():
    with pytest.raises(TypeError, match=r"xcs.classify: argument `func` must be callable.*Fix"):
        classify(3)
    with pytest.raises(ValueError, match=r"xcs.classify_target: .*no_such_module_x.*Fix"):
        classify_target("no_such_module_x")
    with pytest.raises(ValueError, match=r"no such file"):
        classify_target("missing/file.py")


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

"""``classify/function.py``: evidence from one function's names (array methods and operators)."""

from __future__ import annotations

import numpy as np

from nablax.xcs.classify.analysis import classify


def test_array_methods_and_operators_mean_tensor():
    def mse(pred, target):
        return ((pred - target) ** 2).mean()

    def linear(x, w, b):
        return x @ w + b

    def gram(f):
        return f.T @ f

    def flat(x):
        return x.reshape(x.shape[0], -1)

    for fn in (mse, linear, gram, flat):
        c = classify(fn)
        assert (c.kind, c.effects) == ("tensor", False), (fn.__name__, c)
    assert "array method" in classify(mse).reasons[0]
    assert "@ operator" in " ".join(classify(linear).reasons)
    assert classify(mse).jax_traceable  # traceable when the inputs are JAX arrays
    x, w = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
    np.testing.assert_allclose(linear(x, w, 1.0), x @ w + 1.0)  # the corpus code is real code


def test_names_arrays_share_with_builtins_stay_pure():
    def vowels(text):
        return sum(text.count(v) for v in "aeiou")

    def price(prices, item):
        return prices.get(item.lower(), 0.0)

    def where(items, target):
        return items.index(target) if target in items else -1

    def scaled(values, k):
        return [v * k for v in values] + [max(values), min(values)]

    for fn in (vowels, price, where, scaled):
        assert classify(fn).kind == "pure", (fn.__name__, classify(fn))

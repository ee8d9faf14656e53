"""``nablax demo``: logistic regression with hand-written gradient steps, in plain eager nablax.

The point of the demo is lazy eager execution: every training step is ordinary imperative tensor
code, each step is realized with one :func:`nablax.realize` call, and because every step builds a
graph of the same *structure*, XLA compiles the step once and every later step is a cache hit
(see :func:`nablax.cache_info`). The learning rate is a Python scalar, so it travels as a runtime
argument and never causes a recompile.

There is no autodiff in this demo on purpose: the gradient of the mean binary cross-entropy of
``p = sigmoid(X @ w + b)`` is written by hand as ``X.T @ (p - y) / n`` and ``mean(p - y)``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import nablax as nx

_EPS = 1e-7  # keeps log() finite when a prediction saturates


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run` measured.

    ``losses`` has one entry per step (the loss *before* that step's update); ``compiles`` and
    ``hits`` count realization-cache events during the training loop only.
    """

    losses: list[float]
    accuracy: float
    compiles: int
    hits: int
    seconds: float
    cache: object  # nx.cache_info() at the end of the run


def make_blobs(
    n: int = 512, features: int = 4, seed: int = 0, sep: float = 1.5
) -> tuple[np.ndarray, np.ndarray]:
    """Two Gaussian blobs (unit variance, centres at ``±sep`` in every feature), shuffled.

    Returns ``(X, y)`` with ``X`` float32 of shape ``(n, features)`` and ``y`` float32 labels in
    ``{0, 1}``. The centres are ``2 * sep * sqrt(features)`` apart, so the classes are separable
    up to a tiny overlap (about 0.1 % Bayes error for the defaults).

    >>> X, y = make_blobs(8, features=2)
    >>> X.shape, y.shape, sorted(set(y.tolist()))
    ((8, 2), (8,), [0.0, 1.0])
    """
    rng = np.random.default_rng(seed)
    y = (np.arange(n) % 2).astype(np.float32)
    centres = np.where(y[:, None] > 0.5, sep, -sep)
    X = centres + rng.standard_normal((n, features))
    perm = rng.permutation(n)
    return X[perm].astype(np.float32), y[perm]


def _step(X, XT, y, w, b, lr: float):
    """One gradient step; returns ``(new_w, new_b, loss_before_step)`` as lazy tensors."""
    n = X.shape[0]
    p = nx.sigmoid(X @ w + b)
    q = nx.clip(p, _EPS, 1.0 - _EPS)
    loss = -nx.mean(y * nx.log(q) + (1.0 - y) * nx.log(1.0 - q))
    err = p - y
    grad_w = (XT @ err) / n
    grad_b = nx.mean(err)
    return w - lr * grad_w, b - lr * grad_b, loss


def run(
    steps: int = 200,
    print_fn: Callable[[str], object] | None = print,
    *,
    lr: float = 0.5,
    n: int = 512,
    features: int = 4,
    seed: int = 0,
    print_every: int | None = None,
) -> DemoResult:
    """Fit logistic regression on two Gaussian blobs and report loss, accuracy and cache stats.

    ``print_fn`` receives each line of the report (``None`` silences it). Every step is realized
    with one ``nx.realize(w, b, loss)``, so all steps share one graph structure: one compile, then
    cache hits.

    >>> r = run(steps=5, print_fn=None)
    >>> len(r.losses), r.losses[-1] < r.losses[0], r.compiles + r.hits
    (5, True, 5)
    """
    say = print_fn if print_fn is not None else (lambda _line: None)
    if print_every is None:
        print_every = max(1, steps // 10)
    X_np, y_np = make_blobs(n, features, seed)
    X = nx.tensor(X_np)
    XT = nx.tensor(np.ascontiguousarray(X_np.T))  # a constant: transpose it once, on the host
    y = nx.tensor(y_np)
    w = nx.tensor(np.zeros(features, np.float32))  # realized leaves: step 1 has step 2's structure
    b = nx.tensor(np.float32(0.0))

    say(f"logistic regression: {n} points, {features} features, {steps} steps, lr={lr}")
    before = nx.cache_info()
    t0 = time.perf_counter()
    losses: list[float] = []
    for i in range(steps):
        w, b, loss = _step(X, XT, y, w, b, lr)
        nx.realize(w, b, loss)  # one program per step; same structure every step
        losses.append(loss.item())
        if i % print_every == 0 or i == steps - 1:
            say(f"  step {i:4d}  loss {losses[-1]:.4f}")
    seconds = time.perf_counter() - t0
    after = nx.cache_info()

    correct = (X @ w + b > 0) == (y > 0.5)
    accuracy = float(correct.astype(nx.float32).mean().item())
    compiles, hits = after.compiles - before.compiles, after.hits - before.hits
    say(f"final accuracy {accuracy:.3f}   ({steps} steps in {seconds:.2f} s)")
    say(f"training loop: {compiles} compile(s), {hits} cache hit(s)")
    info = nx.cache_info()
    say(f"nx.cache_info() = {info}")
    return DemoResult(losses, accuracy, compiles, hits, seconds, info)

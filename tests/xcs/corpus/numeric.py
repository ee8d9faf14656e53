"""Corpus: numerical helpers in many import styles, and plain Python that only *sounds* numerical
or networked (names, strings and comments that mention requests, lax, grad, open ...)."""

from __future__ import annotations

import math
import statistics
from functools import partial, reduce
from operator import mul

import numpy
import numpy as np
import scipy.signal
from jax.numpy import dot as jdot
from numpy import linalg as la

try:
    import torch as th
except ImportError:  # optional
    th = None

xp = np  # array-API style: code below is written against `xp`
WEIGHTS = np.linspace(-1.0, 1.0, 16, dtype=np.float32)


def zscore(values):
    arr = numpy.asarray(values, dtype=float)
    return (arr - arr.mean()) / (arr.std() or 1.0)


def pairwise_distances(a, b):
    return la.norm(a[:, None, :] - b[None, :, :], axis=-1)


def project(features):
    return features @ WEIGHTS


def xp_logsumexp(x, axis=-1):
    m = xp.max(x, axis=axis, keepdims=True)
    return (m + xp.log(xp.sum(xp.exp(x - m), axis=axis, keepdims=True))).squeeze(axis)


def bandpass(signal, low, high, fs):
    b, a = scipy.signal.butter(4, [low / (fs / 2), high / (fs / 2)], btype="band")
    return scipy.signal.filtfilt(b, a, signal)


def gram(x):
    return jdot(x, x.T)


def local_import_jax(x):
    import jax.numpy as jnp
    from jax import lax

    return lax.fori_loop(0, 3, lambda i, acc: acc + jnp.sin(acc), x)


def torch_cosine(a, b):
    return th.nn.functional.cosine_similarity(a, b, dim=-1)


unit = lambda v: v / np.linalg.norm(v)  # noqa: E731 - kept as a lambda on purpose
smooth3 = partial(np.convolve, np.ones(3) / 3.0, mode="same")


def requests_per_second(n_requests: int, seconds: float) -> float:
    """Throughput: how many requests per second (no HTTP is done here)."""
    return n_requests / seconds if seconds > 0 else float("inf")


def grad_school_gpa(grades: dict[str, float]) -> float:
    # grad = graduate school, not jax.grad; np.mean would be overkill here
    return round(statistics.fmean(grades.values()), 2)


def describe_upgrade(pkg: str, old: str, new: str) -> str:
    return f"upgrade {pkg}: {old} -> {new} (run `pip install -U {pkg}` then open the docs)"


def lax_mode_enabled(flags: dict) -> bool:
    relax = flags.get("relax", False)
    lax_mode = flags.get("lax_mode", relax)
    return bool(lax_mode)


def open_issue_count(issues: list[dict]) -> int:
    return sum(1 for i in issues if i.get("state") == "open")


def product(xs):
    return reduce(mul, xs, 1)


def geometric_mean(xs):
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def student_report(student) -> str:
    # attribute names that contain tensor words: .grad_year, .tensor_course
    return f"{student.name} ({student.grad_year}) took {student.tensor_course}"


def histogram(values, bins=10):
    counts, edges = np.histogram(values, bins=bins)
    return list(zip(edges[:-1].tolist(), counts.tolist()))


def top_words(text: str, n: int = 5) -> list[tuple[str, int]]:
    counts: dict[str, int] = {}
    for w in text.lower().split():
        counts[w] = counts.get(w, 0) + 1
    return sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]


CASES = [
    ("zscore (import numpy)", zscore, "tensor", False),
    ("pairwise_distances (from numpy import linalg as la)", pairwise_distances, "tensor", False),
    ("project (global ndarray)", project, "tensor", False),
    ("xp_logsumexp (xp = np)", xp_logsumexp, "tensor", False),
    ("bandpass (scipy)", bandpass, "tensor", False),
    ("gram (from jax.numpy import dot as jdot)", gram, "tensor", False),
    ("local_import_jax", local_import_jax, "tensor", False),
    ("torch_cosine (import torch as th)", torch_cosine, "tensor", False),
    ("unit (lambda)", unit, "tensor", False),
    ("smooth3 (partial of np.convolve)", smooth3, "tensor", False),
    ("requests_per_second", requests_per_second, "pure", False),
    ("grad_school_gpa", grad_school_gpa, "pure", False),
    ("describe_upgrade", describe_upgrade, "pure", False),
    ("lax_mode_enabled", lax_mode_enabled, "pure", False),
    ("open_issue_count", open_issue_count, "pure", False),
    ("product", product, "pure", False),
    ("geometric_mean", geometric_mean, "pure", False),
    ("student_report", student_report, "pure", False),
    ("histogram", histogram, "tensor", False),
    ("top_words", top_words, "pure", False),
]

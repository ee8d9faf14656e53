"""Known-bad jaxlib releases: pinned out of the install, warned about at import when present.

jaxlib 0.10.2's CPU backend segfaults on rank-7 multiply-reduce fusions (what
``hessian∘hessian∘hessian`` produces: tests/core/test_transform_compositions.py died of it) and
returns wrong sums for a vmapped matrix-vector product followed by a large reduction. Both
programs are checked here against NumPy on the installed release, through nablax.
"""

from __future__ import annotations

import re
import tomllib
import warnings
from pathlib import Path

import jaxlib
import numpy as np
import pytest

import nablax as nx
from nablax.core import jaxlib_bugs

_PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


@pytest.mark.parametrize("version", ["0.10.0", "0.10.1", "0.11.0", "0.11.2", "0.12.0.1"])
def test_good_releases_get_no_warning(version):
    assert jaxlib_bugs.message(version, {}) is None


def test_a_bad_release_is_named_with_its_reports_and_the_fix():
    text = jaxlib_bugs.message("0.10.2", {"XLA_FLAGS": "--xla_dump_to=/tmp/x"})
    assert text is not None
    assert "jaxlib 0.10.2" in text and "#39257" in text and "#39103" in text
    assert "Fix:" in text and "XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=" in text


def test_the_workaround_flag_silences_the_warning():
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2 "
           "--xla_cpu_experimental_ynn_fusion_type="}  # fmt: skip
    assert jaxlib_bugs.message("0.10.2", env) is None


def test_check_warns_when_a_bad_release_is_installed(monkeypatch):
    monkeypatch.setattr(jaxlib, "__version__", "0.10.2")
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    with pytest.warns(RuntimeWarning, match=r"jaxlib 0\.10\.2 is installed"):
        jaxlib_bugs.check()
    monkeypatch.setattr(jaxlib, "__version__", "0.10.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        jaxlib_bugs.check()


def test_the_installed_release_is_not_a_known_bad_one():
    # the pins keep it out: a failure here means the environment was changed by hand
    assert jaxlib.__version__ not in jaxlib_bugs.KNOWN_BAD, jaxlib_bugs.message(
        jaxlib.__version__, {}
    )


def test_every_jax_requirement_excludes_every_bad_release():
    project = tomllib.loads(_PYPROJECT.read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in ("cuda", "cuda13"):
        reqs += project["optional-dependencies"][extra]
    jax_reqs = [r for r in reqs if re.match(r"jax(lib)?\b", r)]
    assert len(jax_reqs) >= 7, jax_reqs
    for r in jax_reqs:
        for bad in jaxlib_bugs.KNOWN_BAD:
            assert f"!={bad}" in r.split(";")[0], (r, bad)


def test_vmapped_matvec_then_large_sum_matches_numpy():
    # jax-ml/jax#39103: jax.jit of this is silently wrong on jaxlib 0.10.2's CPU backend; nablax's
    # program for it happened to be right there (checked), and stays checked on every release
    n = 32_769
    i = np.arange(n, dtype=np.float32)
    x = np.stack([i, np.zeros_like(i), np.zeros_like(i)], axis=1)
    m = nx.eye(3)
    got = nx.vmap(lambda row: ((m @ row) ** 2).sum())(nx.tensor(x)).numpy()
    want = (x.astype(np.float64) ** 2).sum(axis=1)
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_rank7_multiply_reduce_with_a_unit_axis_matches_numpy():
    # jax-ml/jax#40412: a segfault on a worker thread on jaxlib 0.10.2's CPU backend
    rng = np.random.default_rng(0)
    u = rng.standard_normal((3, 1, 2, 2, 8, 8, 8)).astype(np.float32)
    v = rng.standard_normal((3, 1, 2, 2, 8, 8, 8)).astype(np.float32)
    got = (nx.tensor(u) * nx.tensor(v)).sum(axis=3).numpy()
    want = (u.astype(np.float64) * v).sum(axis=3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)

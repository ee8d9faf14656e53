"""``nx.config`` option ``matmul_precision`` (API.md §1): float32 matmuls, einsums, dots and
convolutions in full float32 by default on every platform (``Precision.HIGHEST`` in the lowered
program), ``"tensorfloat32"`` / ``"bfloat16"`` on request; bfloat16 and float16 products
unaffected; the precision is part of the realization cache key (a program compiled under one
precision is never reused under another)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F

RNG = np.random.default_rng(0)
A = RNG.standard_normal((3, 64, 48)).astype(np.float32)
B = RNG.standard_normal((48, 40)).astype(np.float32)
X = RNG.standard_normal((2, 3, 9, 9)).astype(np.float32)
W = RNG.standard_normal((4, 3, 3, 3)).astype(np.float32)
HLO_NAME = {"float32": "HIGHEST", "tensorfloat32": "HIGH", "bfloat16": "DEFAULT"}


def _products(a, b, x, w):
    """Every way nablax multiplies matrices: @, einsum, dot, a folded ``.T``, conv2d."""
    a, b, x, w = (nx.asarray(v) for v in (a, b, x, w))
    return [
        a @ b,
        nx.einsum("bij,jk->bik", a, b),
        nx.dot(a[0], b),
        a[0] @ b.T.T,  # the transpose-folding path
        F.conv2d(x, w, padding=1),
    ]


def _precisions(text: str) -> set[str]:
    """The precision names of every dot_general and convolution in lowered StableHLO."""
    dots = re.findall(r"dot_general.*?precision = \[(\w+), (\w+)\]", text)
    convs = re.findall(
        r"precision_config = \[#stablehlo<precision (\w+)>, #stablehlo<precision (\w+)>", text
    )
    assert dots and convs, text
    return {p for pair in dots + convs for p in pair}


def _lowered(dtype=jnp.float32) -> str:
    args = [jnp.asarray(v, dtype) for v in (A, B, X, W)]

    def f(a, b, x, w):
        return [t.to_jax() for t in _products(a, b, x, w)]

    # a fresh function per call: jax.jit's own trace cache does not know nablax's options
    return jax.jit(lambda *v: f(*v)).lower(*args).as_text()


def test_default_is_float32():
    assert nx.config.matmul_precision == "float32"
    with nx.config.override(matmul_precision="TensorFloat32"):  # names are case-insensitive
        assert nx.config.matmul_precision == "tensorfloat32"
    with pytest.raises(nx.errors.ConfigError, match="matmul_precision"):
        nx.config.update("matmul_precision", "fp8")


@pytest.mark.parametrize("precision", ["float32", "tensorfloat32", "bfloat16"])
def test_lowered_programs_carry_the_precision(precision):
    with nx.config.override(matmul_precision=precision):
        assert _precisions(_lowered()) == {HLO_NAME[precision]}


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16])
def test_narrow_float_products_are_unaffected(dtype):
    for precision in ("float32", "bfloat16"):
        with nx.config.override(matmul_precision=precision):
            assert _precisions(_lowered(dtype)) == {"DEFAULT"}


def test_gradients_inherit_the_forward_precision():
    a, b = jnp.asarray(A[0]), jnp.asarray(B)

    def loss(a, b):
        return nx.grad(lambda a, b: (nx.tanh(a @ b) ** 2).sum(), argnums=(0, 1))(
            nx.asarray(a), nx.asarray(b)
        )

    for precision in ("float32", "bfloat16"):
        with nx.config.override(matmul_precision=precision):
            text = jax.jit(lambda a, b: [g.to_jax() for g in loss(a, b)]).lower(a, b).as_text()
        dots = re.findall(r"dot_general.*?precision = \[(\w+), (\w+)\]", text)
        assert len(dots) >= 3 and {p for d in dots for p in d} == {HLO_NAME[precision]}


def test_float32_values_are_full_float32():
    """Against float64 NumPy with a float32 tolerance (on a GPU the TensorFloat-32 path is off by
    about 1e-3 relative, so this holds only with full float32 products)."""
    got = [t.numpy() for t in _products(A, B, X, W)]
    a64, b64 = A.astype(np.float64), B.astype(np.float64)
    conv = jax.lax.conv_general_dilated(
        jnp.asarray(X), jnp.asarray(W), (1, 1), ((1, 1), (1, 1)), precision="highest"
    )
    want = [a64 @ b64, a64 @ b64, a64[0] @ b64, a64[0] @ b64, np.asarray(conv, np.float64)]
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.sqrt(48))
    exact = jnp.einsum("bij,jk->bik", A, B, precision="highest")
    np.testing.assert_allclose(got[1], np.asarray(exact), rtol=1e-6, atol=1e-5)


def test_switching_precision_gives_another_program_for_the_same_structure():
    a, b = nx.asarray(A[0]), nx.asarray(B)

    def read():
        before = nx.cache_info().compiles
        value = (nx.tanh(a @ b) * 2.0).numpy()
        return value, nx.cache_info().compiles - before

    with nx.config.override(matmul_precision="float32"):
        for _ in range(3):  # the structure settles (it may compile twice, see API §1)
            first, _ = read()
        assert read()[1] == 0  # cached
    with nx.config.override(matmul_precision="bfloat16"):
        other, compiles = read()
    assert compiles >= 1, "the float32 program was reused under matmul_precision='bfloat16'"
    with nx.config.override(matmul_precision="float32"):
        again, compiles = read()
    assert compiles == 0  # the float32 program is still cached
    np.testing.assert_array_equal(first, again)
    np.testing.assert_allclose(other, first, rtol=2e-2, atol=2e-2)  # bfloat16 passes at worst


def test_compile_traces_again_under_another_precision():
    """``nx.compile``'s cache (and its fast path) keys on the precision too: a function compiled
    under one precision is traced again under another, and each keeps its own program."""
    traces = []

    @nx.compile
    def f(a, b):
        traces.append(nx.config.matmul_precision)
        return nx.tanh(a @ b)

    def hlo(precision):
        with nx.config.override(matmul_precision=precision):
            text = jax.jit(lambda a, b: f(nx.asarray(a), nx.asarray(b)).to_jax())
            return text.lower(jnp.asarray(A[0]), jnp.asarray(B)).as_text()

    a, b = nx.asarray(A[0]), nx.asarray(B)
    with nx.config.override(matmul_precision="float32"):
        want = f(a, b).numpy()
        f(a, b)  # the fast path
    with nx.config.override(matmul_precision="bfloat16"):
        other = f(a, b).numpy()
        f(a, b)
    with nx.config.override(matmul_precision="float32"):
        again = f(a, b).numpy()
    assert traces == ["float32", "bfloat16"]
    np.testing.assert_array_equal(want, again)
    np.testing.assert_allclose(other, want, rtol=2e-2, atol=2e-2)
    assert "HIGHEST" in hlo("float32") and "HIGHEST" not in hlo("bfloat16")

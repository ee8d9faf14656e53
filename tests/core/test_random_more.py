"""``nx.random.categorical`` and ``nx.random.fold_in``: bit for bit ``jax.random``'s values for
the same key, eagerly and under ``nx.vmap``, ``nx.compile`` and ``nx.grad``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax.errors import ShapeError


def _jkey(seed):
    return jax.random.PRNGKey(seed)


@pytest.mark.parametrize("data", [0, 1, 7, 2**31, 2**32 - 1])
def test_fold_in_matches_jax(data):
    out = nx.random.fold_in(nx.random.key(3), data)
    assert out.dtype == nx.uint32 and out.shape == (2,)
    assert out.tolist() == jax.random.fold_in(_jkey(3), data).tolist()


def test_fold_in_tensor_data_wraps_as_jax():
    for d in (jnp.int32(-1), jnp.int32(5), jnp.uint32(9)):
        out = nx.random.fold_in(nx.random.key(0), nx.asarray(d))
        assert out.tolist() == jax.random.fold_in(_jkey(0), d).tolist()


def test_fold_in_errors():
    with pytest.raises(ValueError, match="random.fold_in: data=-1 is not a 32-bit"):
        nx.random.fold_in(nx.random.key(0), -1)
    with pytest.raises(ShapeError, match="random.fold_in: data must be a scalar"):
        nx.random.fold_in(nx.random.key(0), nx.arange(2))


def test_fold_in_vmap_and_compile_reuse_one_program():
    k = nx.random.key(1)
    out = nx.vmap(lambda d: nx.random.fold_in(k, d))(nx.arange(4))
    ref = jax.vmap(lambda d: jax.random.fold_in(_jkey(1), d))(jnp.arange(4))
    assert out.tolist() == ref.tolist()
    f = nx.compile(lambda key, d: nx.random.normal(nx.random.fold_in(key, d), (3,)))
    for d in range(3):
        ref = jax.random.normal(jax.random.fold_in(_jkey(1), d), (3,))
        assert f(k, d).tolist() == ref.tolist()
    assert f.cache_info().traces == 1
    nx.clear_caches()
    for d in range(5):  # eager: the data is a runtime value
        nx.random.fold_in(k, d).numpy()
    assert nx.cache_info().compiles <= 2


@pytest.mark.parametrize(
    "shape, axis, sample_shape",
    [
        ((5,), -1, None),
        ((3, 5), -1, None),
        ((3, 5), 0, None),
        ((3, 5), -1, (4, 3)),
        ((2, 3), 0, (7, 3)),
    ],
)
def test_categorical_matches_jax(shape, axis, sample_shape):
    logits = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    out = nx.random.categorical(nx.random.key(5), nx.tensor(logits), axis, sample_shape)
    ref = jax.random.categorical(_jkey(5), jnp.asarray(logits), axis, sample_shape)
    assert out.dtype == nx.int32 and out.shape == ref.shape
    assert out.tolist() == ref.tolist()


def test_categorical_follows_the_probabilities():
    logits = nx.log(nx.tensor([0.1, 0.0, 0.9]))
    s = nx.random.categorical(nx.random.key(0), logits, shape=(4000,)).numpy()
    assert not (s == 1).any()
    assert abs((s == 2).mean() - 0.9) < 0.03


def test_categorical_under_vmap_compile_and_grad():
    logits = np.random.default_rng(1).standard_normal((4, 6)).astype(np.float32)
    keys = nx.random.split(nx.random.key(2), 4)
    out = nx.vmap(nx.random.categorical)(keys, nx.tensor(logits))
    ref = jax.vmap(jax.random.categorical)(keys.to_jax(), jnp.asarray(logits))
    assert out.tolist() == ref.tolist()
    f = nx.compile(lambda k, lg: nx.random.categorical(k, lg, shape=(2, 4)))
    ref = jax.random.categorical(_jkey(2), jnp.asarray(logits), shape=(2, 4))
    assert f(nx.random.key(2), nx.tensor(logits)).tolist() == ref.tolist()
    # integer samples: no gradient reaches the logits (zero, as jax.grad through a float cast)
    g = nx.grad(lambda lg: nx.random.categorical(nx.random.key(0), lg).astype(nx.float32).sum())(
        nx.tensor(logits)
    )
    assert g.tolist() == np.zeros_like(logits).tolist()


def test_categorical_errors():
    with pytest.raises(ShapeError, match="random.categorical: shape=\\(4,\\) does not fit"):
        nx.random.categorical(nx.random.key(0), nx.zeros((3, 5)), shape=(4,))
    with pytest.raises(ShapeError, match="random.categorical: logits must be at least 1-D"):
        nx.random.categorical(nx.random.key(0), nx.tensor(1.0))

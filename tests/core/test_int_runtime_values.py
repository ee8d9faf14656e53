"""Python ints in indices are runtime values (API.md section 1, DESIGN.md convention 16): ``x[i]``,
``x[i:i + n]`` and ``.at[]`` positions over a loop compile at most twice per graph structure, with
NumPy's values and bounds checks, and JAX's gradients. Written the way the bug was found: a
training step indexing ``keys[step]``, a decode loop writing into a fixed buffer, threads."""

from __future__ import annotations

import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

A = np.arange(60, dtype=np.float32).reshape(5, 12)


def _compiles(fn):
    nx.clear_caches()
    out = fn()
    return out, nx.cache_info().compiles


@pytest.mark.parametrize(
    "index",
    [
        lambda i: (i,),
        lambda i: (-i - 1,),
        lambda i: (slice(None), i),
        lambda i: (slice(None), slice(i, i + 4)),
        lambda i: (slice(None), slice(i, i + 6, 2)),
        lambda i: (slice(None), slice(i + 6, i, -2)),
        lambda i: (i % 5, slice(i, i + 3)),
        lambda i: (Ellipsis, i),
        lambda i: (None, i, slice(1, 3)),
        lambda i: ([0, 2], i),
        lambda i: (i % 5, [1, 3]),
    ],
)
def test_reads_over_a_loop_compile_at_most_twice(index):
    x = nx.tensor(A)

    def loop():
        return [x[index(i)].numpy() for i in range(5)]

    got, compiles = _compiles(loop)
    for i, g in enumerate(got):
        np.testing.assert_array_equal(g, A[index(i)])
    assert compiles <= 2


@pytest.mark.parametrize(
    "index",
    [
        lambda i: (slice(None), i),
        lambda i: (i % 5, slice(i, i + 3)),
        lambda i: (slice(None), slice(i + 4, i, -1)),
        lambda i: ([1, 3], i),
    ],
)
@pytest.mark.parametrize("mode", ["set", "add"])
def test_updates_over_a_loop_compile_at_most_twice(index, mode):
    def loop():
        buf = nx.zeros(A.shape)
        ref = np.zeros(A.shape, np.float32)
        for i in range(6):
            v = np.float32(i + 1)
            buf = getattr(buf.at[index(i)], mode)(v)
            if mode == "set":
                ref[index(i)] = v
            else:
                np.add.at(ref, index(i), v)
            buf.numpy()
        return buf.numpy(), ref

    (got, ref), compiles = _compiles(loop)
    np.testing.assert_array_equal(got, ref)
    assert compiles <= 3  # the first buffer from zeros, then one structure (baked, then params)


@pytest.mark.parametrize("bad", [5, -6])
def test_out_of_bounds_ints_raise_like_numpy(bad):
    x = nx.tensor(A)
    with pytest.raises(IndexError, match=f"index {bad} is out of bounds for axis 0 with size 5"):
        x[bad]
    with pytest.raises(IndexError):
        A[bad]
    with pytest.raises(IndexError, match="out of bounds"):
        x.at[bad].set(1.0)
    with pytest.raises(IndexError, match="out of bounds"):
        x[:, 12]


def test_slices_past_the_end_clip_like_numpy():
    x = nx.tensor(A)
    for i in (8, 10, 11, 12, 20):
        np.testing.assert_array_equal(x[:, i : i + 4].numpy(), A[:, i : i + 4])


def test_gradients_match_jax_through_dynamic_positions():
    def f(x, i):
        return (x[:, i : i + 3] ** 2).sum() + (x.at[i % 5, i].set(0.0) * x).sum() + x[i % 5, -1]

    for i in (0, 4, 9):
        g = nx.grad(lambda x, i=i: f(x, i))(nx.tensor(A)).numpy()
        ref = jax.grad(lambda x, i=i: f(x, i))(jnp.asarray(A))
        np.testing.assert_allclose(g, ref, rtol=1e-6)


def test_vmap_and_compile_with_python_int_positions():
    x = nx.tensor(A)
    for i in (1, 7):
        got = nx.vmap(lambda r, i=i: r[i : i + 2] * r[i], in_axes=(0, None))(x, i).numpy()
        np.testing.assert_allclose(got, A[:, i : i + 2] * A[:, i : i + 1])
    c = nx.compile(lambda t, j: t[:, j : j + 2], static_argnums=(1,))
    for j in (0, 3, 0):
        np.testing.assert_array_equal(c(x, j).numpy(), A[:, j : j + 2])
    assert c.cache_info().traces == 2  # a static int is program identity there, as in jax.jit


def test_a_training_step_that_indexes_keys_by_step_compiles_twice():
    keys = nx.random.split(nx.random.key(0), 50)
    w = nx.ones((4, 4))
    x = nx.ones((8, 4))
    opt_lr = 0.1

    def step(w, s):
        k = keys[s]
        noise = nx.random.normal(k, x.shape)
        loss, g = nx.value_and_grad(lambda w: ((x + noise) @ w).sum() ** 2 * 1e-4)(w)
        return w - opt_lr * g, loss

    nx.clear_caches()
    losses = []
    for s in range(20):
        w, loss = step(w, s)
        losses.append(loss.item())
    assert nx.cache_info().compiles <= 6, nx.cache_info()
    assert len(set(losses)) > 10  # each step saw its own key


def test_decode_loop_into_a_fixed_buffer_compiles_a_handful():
    emb = nx.tensor(np.random.default_rng(0).normal(size=(7, 8)).astype(np.float32))
    ctx = 16
    nx.clear_caches()
    buf = nx.zeros((2, ctx), dtype=nx.int32)
    iota = nx.arange(ctx)
    toks = []
    for pos in range(1, ctx):
        h = emb[buf]  # (2, ctx, 8)
        valid = (iota < pos)[None, :, None]
        logits = (nx.where(valid, h, 0.0).sum(axis=1) @ emb.T)[:, :7]
        tok = nx.argmax(logits + pos, axis=-1).astype(nx.int32) % 7
        buf = buf.at[:, pos].set(tok)
        toks.append(tok.numpy())
    assert nx.cache_info().compiles <= 6, nx.cache_info()
    # the same loop in NumPy
    e = emb.numpy()
    b = np.zeros((2, ctx), np.int32)
    for pos in range(1, ctx):
        h = e[b]
        logits = (np.where(np.arange(ctx)[None, :, None] < pos, h, 0).sum(1) @ e.T)[:, :7]
        t = (np.argmax(logits + pos, axis=-1) % 7).astype(np.int32)
        b[:, pos] = t
        np.testing.assert_array_equal(toks[pos - 1], t)


def test_threads_indexing_in_loops():
    x = nx.tensor(A)
    errors = []

    def work(offset: int) -> None:
        try:
            for i in range(10):
                j = (i + offset) % 9
                np.testing.assert_array_equal(x[:, j : j + 3].numpy(), A[:, j : j + 3])
                np.testing.assert_array_equal(x[(i + offset) % 5].numpy(), A[(i + offset) % 5])
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors

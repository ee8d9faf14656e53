"""``nx.autocast`` against ``torch.autocast`` on the CPU (bfloat16): result dtypes and values,
gradients that reach float32 parameters as float32, and soundness under ``nx.grad``,
``nx.vmap``, ``nx.compile`` (one function called inside and outside autocast) and threads."""

from __future__ import annotations

import threading

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax import nn
from nablax.core.autocast import cast_inputs, get_dtype
from nablax.errors import DTypeError

torch = pytest.importorskip("torch")  # the references (a run without PyTorch skips)

BF16_EPS = float(jnp.finfo(jnp.bfloat16).eps)


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _close(actual, expected, k=4.0):
    """Within ``k`` bfloat16 roundings of the magnitude (relative to the largest value)."""
    a = np.asarray(actual, np.float64)
    e = np.asarray(expected, np.float64)
    scale = max(1.0, float(np.abs(e).max()))
    np.testing.assert_allclose(a, e, rtol=k * BF16_EPS, atol=k * BF16_EPS * scale)


def test_low_precision_ops_match_torch_autocast():
    a, b = _rand((4, 8)), _rand((8, 3), 1)
    w, bias = _rand((3, 8), 2), _rand((3,), 3)
    img, k = _rand((2, 3, 6, 6), 4), _rand((5, 3, 3, 3), 5)
    with nx.autocast(nx.bfloat16):
        ours = {
            "matmul": nx.tensor(a) @ nx.tensor(b),
            "einsum": nx.einsum("ij,jk->ik", nx.tensor(a), nx.tensor(b)),
            "linear": F.linear(nx.tensor(a), nx.tensor(w), nx.tensor(bias)),
            "conv2d": F.conv2d(nx.tensor(img), nx.tensor(k), nx.tensor(bias[:1].repeat(5))),
        }
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ta, tb = torch.tensor(a), torch.tensor(b)
        theirs = {
            "matmul": ta @ tb,
            "einsum": torch.einsum("ij,jk->ik", ta, tb),
            "linear": torch.nn.functional.linear(ta, torch.tensor(w), torch.tensor(bias)),
            "conv2d": torch.nn.functional.conv2d(
                torch.tensor(img), torch.tensor(k), torch.tensor(bias[:1].repeat(5))
            ),
        }
    for name, t in theirs.items():
        assert t.dtype == torch.bfloat16
        assert ours[name].dtype == nx.bfloat16, name
        _close(ours[name].astype(nx.float32).numpy(), t.float().numpy())


def test_float32_ops_under_autocast():
    x = nx.tensor(_rand((3, 5))).astype(nx.bfloat16)
    xt = torch.tensor(_rand((3, 5))).bfloat16()
    with nx.autocast():
        outs = {
            "softmax": nx.softmax(x),
            "log_softmax": F.log_softmax(x, dim=-1),
            "sum": x.sum(),
            "mean": nx.mean(x, axis=0),
            "var": nx.var(x),
            "logsumexp": nx.logsumexp(x, axis=1),
            "cumsum": nx.cumsum(x, axis=1),
            "layer_norm": F.layer_norm(x, (5,)),
            "rms_norm": F.rms_norm(x, (5,)),
            "mse_loss": F.mse_loss(x, nx.zeros((3, 5))),
            "cross_entropy": F.cross_entropy(x, nx.tensor([0, 1, 4])),
        }
        kept = {"max": x.max(), "relu": nx.relu(x), "add": x + 1}
    for name, o in outs.items():
        assert o.dtype == nx.float32, name
    for name, o in kept.items():
        assert o.dtype == nx.bfloat16, name
    ref = torch.softmax(xt.float(), -1).numpy()
    np.testing.assert_allclose(outs["softmax"].numpy(), ref, rtol=1e-6, atol=1e-7)
    ref = torch.nn.functional.cross_entropy(xt.float(), torch.tensor([0, 1, 4])).item()
    assert abs(outs["cross_entropy"].item() - ref) < 1e-5
    # float32 inputs are unchanged; integer sums stay integer
    with nx.autocast():
        assert nx.ones(3).sum().dtype == nx.float32
        assert nx.arange(3).sum().dtype == nx.int32


def _mlp_loss_nx(params, x, y):
    w1, b1, w2, b2 = params
    h = nx.relu(F.linear(x, w1, b1))
    return F.cross_entropy(F.linear(h, w2, b2), y)


def test_training_gradients_match_torch_autocast():
    x, y = _rand((8, 6)), np.array([0, 1, 2, 0, 1, 2, 0, 1])
    ps = [_rand((5, 6), 1), _rand((5,), 2), _rand((3, 5), 3), _rand((3,), 4)]
    tps = [torch.tensor(p, requires_grad=True) for p in ps]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = torch.relu(torch.nn.functional.linear(torch.tensor(x), tps[0], tps[1]))
        tl = torch.nn.functional.cross_entropy(
            torch.nn.functional.linear(h, tps[2], tps[3]), torch.tensor(y)
        )
    tl.backward()

    def loss(params):
        with nx.autocast():
            return _mlp_loss_nx(params, nx.tensor(x), nx.tensor(y))

    value, grads = nx.value_and_grad(loss)([nx.tensor(p) for p in ps])
    assert value.dtype == nx.float32 and tl.dtype == torch.float32
    _close(value.numpy(), tl.item(), 8)
    for g, tp in zip(grads, tps):
        assert g.dtype == nx.float32
        _close(g.numpy(), tp.grad.numpy(), 8)


def test_backward_outside_the_context_and_pytorch_style():
    w = nx.tensor(_rand((3, 4))).requires_grad_()
    with nx.autocast():
        out = (nx.tensor(_rand((2, 3), 1)) @ w).sum()
    out.backward()  # after the context: the backward pass uses the forward's dtypes
    assert w.grad.dtype == nx.float32
    ref = np.broadcast_to(_rand((2, 3), 1).sum(0)[:, None], (3, 4))
    _close(w.grad.numpy(), ref)


def test_compile_never_replays_the_other_trace():
    a, b = nx.tensor(_rand((4, 8))), nx.tensor(_rand((8, 3), 1))
    f = nx.compile(lambda x, y: nx.softmax(x @ y) * 1.0 + (x @ y).astype(nx.float32))
    plain = f(a, b)
    with nx.autocast():
        mixed = f(a, b)
        mixed_again = f(a, b)
    plain_again = f(a, b)
    assert plain.dtype == plain_again.dtype == nx.float32
    assert f.cache_info().traces == 2
    np.testing.assert_array_equal(plain.numpy(), plain_again.numpy())
    np.testing.assert_array_equal(mixed.numpy(), mixed_again.numpy())
    assert not np.array_equal(plain.numpy(), mixed.numpy())  # bfloat16 products differ
    g = nx.compile(lambda x, y: x @ y)
    assert g(a, b).dtype == nx.float32
    with nx.autocast():
        assert g(a, b).dtype == nx.bfloat16
    assert g(a, b).dtype == nx.float32
    with nx.autocast(nx.float16):
        assert g(a, b).dtype == nx.float16
    assert g.cache_info().traces == 3


def test_autocast_inside_a_compiled_function_and_grad_of_it():
    w = nx.tensor(_rand((3, 4)))
    x = nx.tensor(_rand((2, 3), 1))

    @nx.compile
    def step(w, x):
        def loss(w):
            with nx.autocast():
                return (x @ w).sum()

        return nx.value_and_grad(loss)(w)

    v, g = step(w, x)
    assert v.dtype == nx.float32 and g.dtype == nx.float32
    ref = np.broadcast_to(_rand((2, 3), 1).sum(0)[:, None], (3, 4))
    _close(g.numpy(), ref)


def test_vmap_under_autocast():
    a, b = _rand((5, 4, 3)), _rand((3, 2), 1)
    with nx.autocast():
        out = nx.vmap(lambda x: nx.softmax(x @ nx.tensor(b)))(nx.tensor(a))
    assert out.dtype == nx.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = torch.softmax((torch.tensor(a) @ torch.tensor(b)).float(), -1)
    _close(out.numpy(), ref.numpy())


def test_decorator_nesting_errors_and_restore():
    @nx.autocast(nx.float16)
    def f(x):
        return x @ x

    assert f(nx.ones((2, 2))).dtype == nx.float16
    assert get_dtype() is None
    with nx.autocast():
        with nx.autocast(enabled=False):
            assert (nx.ones((2, 2)) @ nx.ones((2, 2))).dtype == nx.float32
        assert get_dtype() == nx.bfloat16
    with pytest.raises(RuntimeError), nx.autocast():
        raise RuntimeError("boom")
    assert get_dtype() is None
    with pytest.raises(DTypeError, match="autocast: dtype must be nx.bfloat16 or nx.float16"):
        nx.autocast(nx.int32)


def test_threads_do_not_see_each_others_autocast():
    seen = {}
    entered, done = threading.Event(), threading.Event()

    def other():
        entered.wait(10)
        seen["dtype"] = (nx.ones((2, 2)) @ nx.ones((2, 2))).dtype
        done.set()

    t = threading.Thread(target=other)
    t.start()
    with nx.autocast():
        entered.set()
        done.wait(10)
        assert (nx.ones((2, 2)) @ nx.ones((2, 2))).dtype == nx.bfloat16
    t.join()
    assert seen["dtype"] == nx.float32


def test_cast_inputs_for_other_ops():
    q, ids, none = cast_inputs("attention", nx.ones(2), nx.arange(2), None)
    assert q.dtype == nx.float32 and none is None  # outside autocast: unchanged
    with nx.autocast():
        q, ids, none = cast_inputs("attention", nx.ones(2), nx.arange(2), None)
        (s,) = cast_inputs("softmax", nx.ones(2, dtype=nx.float16))
    assert q.dtype == nx.bfloat16 and ids.dtype == nx.int32 and s.dtype == nx.float32
    with pytest.raises(ValueError, match="unknown op class 'matmull'"):
        cast_inputs("matmull", nx.ones(2))


def test_module_training_step_under_autocast_matches_torch():
    lin = nn.Linear(6, 4, key=nx.random.key(0))
    norm = nn.RMSNorm(4)
    tl = torch.nn.Linear(6, 4)
    with torch.no_grad():
        tl.weight.copy_(torch.tensor(lin.weight.numpy()))
        tl.bias.copy_(torch.tensor(lin.bias.numpy()))
    tn = torch.nn.RMSNorm(4)
    x = _rand((3, 6), 9)

    def loss(models):
        lin, norm = models
        with nx.autocast():
            return norm(lin(nx.tensor(x))).sum()

    g_lin, g_norm = nx.grad(loss)((lin, norm))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        # torch's CPU autocast leaves rms_norm alone: cast as nx.autocast does (float32 norm)
        tout = tn(tl(torch.tensor(x)).float()).sum()
    tout.backward()
    assert g_lin.weight.dtype == g_norm.weight.dtype == nx.float32
    _close(g_lin.weight.numpy(), tl.weight.grad.numpy(), 8)
    _close(g_lin.bias.numpy(), tl.bias.grad.numpy(), 8)
    _close(g_norm.weight.numpy(), tn.weight.grad.numpy(), 8)

"""The schedules of nablax.optim against their closed forms (optax's formulas) computed with NumPy in
float64: at Python ints (a Python float comes back), at int32 tensor counts (a lazy float32 tensor
comes back; a 1-D count tensor evaluates many steps at once) and under nx.compile / nx.vmap."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import nablax as nx
from nablax import optim

STEPS = np.arange(0, 40)


def _check(schedule, want_fn, steps=STEPS, rtol=1e-6, atol=1e-7):
    want = np.array([want_fn(int(k)) for k in steps], dtype=np.float64)
    at_ints = [schedule(int(k)) for k in steps]
    assert all(isinstance(v, float) for v in at_ints), [type(v) for v in at_ints]
    np.testing.assert_allclose(at_ints, want, rtol=1e-12, atol=1e-12)
    counts = nx.tensor(np.asarray(steps, dtype=np.int32))
    got = schedule(counts)
    assert isinstance(got, nx.Tensor) and got.dtype == nx.float32 and not got.is_realized
    np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=atol)
    zero_d = schedule(nx.tensor(np.int32(steps[-1])))
    assert zero_d.shape == ()
    np.testing.assert_allclose(zero_d.item(), want[-1], rtol=rtol, atol=atol)


def _cosine(init, steps, alpha=0.0, exponent=1.0):
    def f(k):
        c = 0.5 * (1 + np.cos(np.pi * min(k, steps) / steps))
        return init * ((1 - alpha) * c**exponent + alpha)

    return f


@pytest.mark.parametrize(
    "args",
    [(0.1, 30), (2.0, 17, 0.25), (1.0, 25, 0.0, 2.0), (0.5, 1, 0.1, 0.5), (1e-3, 39.5)],
)
def test_cosine_decay_schedule(args):
    _check(optim.cosine_decay_schedule(*args), _cosine(*args))


def _exponential(init, steps, rate, begin=0, staircase=False, end=None):
    def f(k):
        d = k - begin
        p = np.floor(d / steps) if staircase else d / steps
        v = init if d <= 0 else init * rate**p
        if end is not None:
            v = max(v, end) if rate < 1 else min(v, end)
        return v

    return f


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(init_value=1.0, transition_steps=5, decay_rate=0.5),
        dict(init_value=0.3, transition_steps=4, decay_rate=0.7, staircase=True),
        dict(init_value=0.3, transition_steps=3, decay_rate=0.7, transition_begin=10),
        dict(init_value=1.0, transition_steps=2, decay_rate=0.5, end_value=0.01),
        dict(init_value=0.01, transition_steps=4, decay_rate=1.5, end_value=0.1),  # a ceiling
        dict(
            init_value=2.0,
            transition_steps=3,
            decay_rate=0.9,
            transition_begin=5,
            staircase=True,
            end_value=1.0,
        ),
    ],
)
def test_exponential_decay(kwargs):
    ref = _exponential(
        kwargs["init_value"],
        kwargs["transition_steps"],
        kwargs["decay_rate"],
        kwargs.get("transition_begin", 0),
        kwargs.get("staircase", False),
        kwargs.get("end_value"),
    )
    _check(optim.exponential_decay(**kwargs), ref, rtol=2e-6)


def test_exponential_decay_end_value_clips():
    down = optim.exponential_decay(1.0, 1, 0.5, end_value=0.1)
    assert down(3) == 0.125 and down(4) == 0.1 and down(100) == 0.1
    up = optim.exponential_decay(1.0, 1, 2.0, end_value=5.0)
    assert up(2) == 4.0 and up(3) == 5.0
    assert down(nx.tensor(100)).item() == pytest.approx(0.1)


def _linear(init, end, steps, begin=0):
    def f(k):
        c = min(max(k - begin, 0), steps)
        return (init - end) * (1 - c / steps) + end

    return f


@pytest.mark.parametrize(
    "args", [(0.0, 1.0, 10), (1e-4, 0.1, 7, 5), (1.0, 0.0, 20, 3), (0.5, 0.5, 4)]
)
def test_linear_warmup_is_optax_linear_schedule(args):
    _check(optim.linear_warmup(*args), _linear(*args))
    assert optim.linear_schedule is optim.linear_warmup


def test_join_schedules_switches_at_the_boundaries():
    warm = optim.linear_warmup(0.0, 0.1, 5)
    cos = optim.cosine_decay_schedule(0.1, 20, alpha=0.01)
    const = optim.exponential_decay(0.001, 1, 1.0)  # rate 1: constant 0.001
    s = optim.join_schedules([warm, cos, const], [5, 25])

    def want(k):
        if k < 5:
            return _linear(0.0, 0.1, 5)(k)
        if k < 25:
            return _cosine(0.1, 20, 0.01)(k - 5)
        return 0.001

    _check(s, want)
    assert s(4) == pytest.approx(0.08) and s(5) == 0.1 and s(25) == 0.001
    single = optim.join_schedules([cos], [])
    _check(single, _cosine(0.1, 20, 0.01))


def test_join_schedules_of_python_constants_at_tensor_counts():
    a = optim.exponential_decay(0.3, 1, 1.0)
    with pytest.warns(UserWarning):
        b = optim.linear_warmup(0.7, 0.0, 0)  # constant 0.7, a plain Python function
    s = optim.join_schedules([a, b], [3])
    np.testing.assert_allclose(s(nx.arange(6)).numpy(), [0.3] * 3 + [0.7] * 3, rtol=1e-6)


def test_schedules_under_compile_and_vmap():
    s = optim.join_schedules(
        [optim.linear_warmup(0.0, 1.0, 4), optim.cosine_decay_schedule(1.0, 8)], [4]
    )
    f = nx.compile(lambda c: s(c))
    got = [f(nx.tensor(np.int32(k))).item() for k in range(14)]
    assert f.cache_info().traces == 1
    np.testing.assert_allclose(got, [s(k) for k in range(14)], rtol=1e-6, atol=1e-7)
    batched = nx.vmap(s)(nx.arange(14))
    np.testing.assert_allclose(batched.numpy(), [s(k) for k in range(14)], rtol=1e-6, atol=1e-7)


# ---- argument checks, with optax's behaviour -------------------------------------------------------


def test_cosine_decay_steps_must_be_positive():
    for bad in (0, -3):
        with pytest.raises(ValueError, match=r"nx\.optim\.cosine_decay_schedule: decay_steps=.*"):
            optim.cosine_decay_schedule(0.1, bad)
    with pytest.raises(TypeError, match=r"optim\.cosine_decay_schedule: init_value='a'"):
        optim.cosine_decay_schedule("a", 10)


@pytest.mark.parametrize(
    "make",
    [
        lambda: optim.exponential_decay(0.2, 0, 0.5),
        lambda: optim.exponential_decay(0.2, -5, 0.5),
        lambda: optim.exponential_decay(0.2, 10, 0.0),
        lambda: optim.linear_warmup(0.2, 1.0, 0),
    ],
)
def test_degenerate_arguments_give_optaxs_constant_schedule_with_a_warning(make):
    with pytest.warns(UserWarning, match=r"optim\.\w+: .*constant 0\.2"):
        s = make()
    assert s(0) == 0.2 and s(1000) == 0.2
    assert s(nx.tensor(7)) == 0.2


def test_negative_transition_begin_counts_as_zero():
    with pytest.warns(UserWarning, match="transition_begin=-4 is negative"):
        s = optim.exponential_decay(1.0, 2, 0.5, transition_begin=-4)
    assert s(2) == 0.5
    with pytest.warns(UserWarning, match="transition_begin=-1 is negative"):
        w = optim.linear_warmup(0.0, 1.0, 4, transition_begin=-1)
    assert w(1) == 0.25


def test_join_schedules_checks_its_arguments():
    c = optim.cosine_decay_schedule(1.0, 5)
    with pytest.raises(ValueError, match=r"optim\.join_schedules: 2 schedules need 1 boundaries"):
        optim.join_schedules([c, c], [])
    with pytest.raises(ValueError, match=r"boundaries\[1\]=2 is before boundaries\[0\]=5"):
        optim.join_schedules([c, c, c], [5, 2])
    with pytest.raises(TypeError, match=r"schedules\[1\] is a float"):
        optim.join_schedules([c, 0.1], [3])
    with pytest.raises(TypeError, match="are not all ints"):
        optim.join_schedules([c, c], [2.5])
    with pytest.raises(ValueError, match="schedules is empty"):
        optim.join_schedules([], [])


def test_no_warning_for_regular_schedules():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        optim.exponential_decay(0.1, 10, 0.9)
        optim.linear_warmup(0.0, 0.1, 10)
        optim.cosine_decay_schedule(0.1, 10)
    assert math.isclose(optim.cosine_decay_schedule(0.1, 10)(5), 0.05)

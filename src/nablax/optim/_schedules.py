"""Learning-rate schedules with optax's arguments and formulas.

A schedule is a function of the step count. Called with a Python int it returns a Python float
(for printing and plotting); called with an int32 tensor (what the optimizers pass: the number of
updates done before this one) it returns a lazy float32 tensor, so a training step that uses a
schedule builds the same graph at every step and traces once under ``nx.compile``.
"""

from __future__ import annotations

import math
import numbers
import operator
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from ..core import dtypes as _dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.tensor import Tensor
from ..errors import op_error
from ._base import api_name, check_number


def _python(count: Any) -> bool:
    """Whether ``count`` is a plain number (computed in Python) rather than a tensor/array."""
    return isinstance(count, numbers.Real) and not isinstance(count, Tensor)


def _as_float_tensor(count: Any) -> Tensor:
    t = count if isinstance(count, Tensor) else _cr.asarray(count)
    return t if t.dtype == _dtypes.float32 else _ew.astype(t, _dtypes.float32)


def _constant(api: str, value: float, why: str, fix: str) -> Callable[[Any], float]:
    # optax returns a constant schedule here (and only logs it); say so where the user sees it
    warnings.warn(
        f"nx.{api}: {why}, so the schedule is the constant {value!r} (as optax). Fix: {fix}",
        UserWarning,
        stacklevel=3,
    )

    def schedule(count: Any) -> float:
        return value

    return schedule


def cosine_decay_schedule(
    init_value: float, decay_steps: int, alpha: float = 0.0, exponent: float = 1.0
) -> Callable[[Any], Any]:
    """``init_value * ((1 - alpha) * c**exponent + alpha)`` with
    ``c = (1 + cos(pi * min(count, decay_steps) / decay_steps)) / 2``: from ``init_value`` down to
    ``alpha * init_value`` at ``decay_steps``, then constant (optax's formula).

    >>> from nablax import optim
    >>> s = optim.cosine_decay_schedule(1.0, 10, alpha=0.1)
    >>> s(0), round(s(5), 6), round(s(10), 6), round(s(20), 6)
    (1.0, 0.55, 0.1, 0.1)
    >>> import nablax as nx
    >>> round(s(nx.tensor(5)).item(), 6)
    0.55
    """
    api = api_name("cosine_decay_schedule")
    init_value = check_number(api, "init_value", init_value)
    steps = check_number(api, "decay_steps", decay_steps)
    alpha = check_number(api, "alpha", alpha)
    exponent = check_number(api, "exponent", exponent)
    if steps <= 0:
        raise op_error(
            ValueError,
            api,
            f"decay_steps={steps:g} is not positive (the decay needs at least one step)",
            "pass decay_steps >= 1, e.g. the number of training steps",
        )

    def schedule(count: Any) -> Any:
        if _python(count):
            c = 0.5 * (1.0 + math.cos(math.pi * min(count, steps) / steps))
            return init_value * ((1.0 - alpha) * max(c, 0.0) ** exponent + alpha)
        t = _ew.minimum(_as_float_tensor(count), steps)
        ct = _ew.maximum(0.5 * (1.0 + _ew.cos(t * (math.pi / steps))), 0.0)
        if exponent != 1.0:
            ct = ct**exponent
        return init_value * ((1.0 - alpha) * ct + alpha)

    return schedule


def exponential_decay(
    init_value: float,
    transition_steps: int,
    decay_rate: float,
    transition_begin: int = 0,
    staircase: bool = False,
    end_value: float | None = None,
) -> Callable[[Any], Any]:
    """``init_value * decay_rate ** ((count - transition_begin) / transition_steps)`` after
    ``transition_begin`` (``init_value`` before it); ``staircase=True`` floors the exponent;
    ``end_value`` bounds the result (a floor when decaying, a ceiling when ``decay_rate > 1``).
    As in optax, ``transition_steps <= 0`` or ``decay_rate == 0`` give the constant
    ``init_value`` (with a warning) and a negative ``transition_begin`` counts as 0.

    >>> from nablax import optim
    >>> s = optim.exponential_decay(1.0, transition_steps=2, decay_rate=0.5, end_value=0.2)
    >>> s(0), round(s(1), 6), s(2), s(4), s(10)
    (1.0, 0.707107, 0.5, 0.25, 0.2)
    >>> optim.exponential_decay(1.0, 2, 0.5, staircase=True)(3)
    0.5
    """
    api = api_name("exponential_decay")
    init_value = check_number(api, "init_value", init_value)
    steps = check_number(api, "transition_steps", transition_steps)
    decay_rate = check_number(api, "decay_rate", decay_rate)
    begin = check_number(api, "transition_begin", transition_begin)
    if end_value is not None:
        end_value = check_number(api, "end_value", end_value)
    if steps <= 0:
        why = f"transition_steps={steps:g} is not positive"
        return _constant(api, init_value, why, "pass transition_steps >= 1 to decay")
    if decay_rate == 0:
        return _constant(api, init_value, "decay_rate is 0", "pass a decay_rate in (0, 1)")
    if begin < 0:
        warnings.warn(
            f"nx.{api}: transition_begin={begin:g} is negative; using 0 (as optax)",
            UserWarning,
            stacklevel=2,
        )
        begin = 0.0
    staircase = bool(staircase)
    decaying = decay_rate < 1.0

    def schedule(count: Any) -> Any:
        if _python(count):
            d = count - begin
            p = math.floor(d / steps) if staircase else d / steps
            value = init_value if d <= 0 else init_value * decay_rate**p
            if end_value is not None:
                value = max(value, end_value) if decaying else min(value, end_value)
            return value
        dt = _as_float_tensor(count) - begin
        pt = dt / steps
        if staircase:
            pt = _ew.floor(pt)
        out = _ew.where(dt <= 0, init_value, init_value * _ew.power(decay_rate, pt))
        if end_value is not None:
            out = (_ew.maximum if decaying else _ew.minimum)(out, end_value)
        return out

    return schedule


def linear_warmup(
    init_value: float, end_value: float, transition_steps: int, transition_begin: int = 0
) -> Callable[[Any], Any]:
    """Linear from ``init_value`` (until ``transition_begin``) to ``end_value`` (from
    ``transition_begin + transition_steps`` on); optax's ``linear_schedule``, also exported under
    that name. ``transition_steps <= 0`` gives the constant ``init_value`` (with a warning).

    >>> from nablax import optim
    >>> s = optim.linear_warmup(0.0, 1.0, transition_steps=4, transition_begin=2)
    >>> [s(k) for k in (0, 2, 3, 5, 6, 100)]
    [0.0, 0.0, 0.25, 0.75, 1.0, 1.0]
    """
    api = api_name("linear_warmup")
    init_value = check_number(api, "init_value", init_value)
    end_value = check_number(api, "end_value", end_value)
    steps = check_number(api, "transition_steps", transition_steps)
    begin = check_number(api, "transition_begin", transition_begin)
    if steps <= 0:
        why = f"transition_steps={steps:g} is not positive"
        return _constant(api, init_value, why, "pass transition_steps >= 1 for a ramp")
    if begin < 0:
        warnings.warn(
            f"nx.{api}: transition_begin={begin:g} is negative; using 0 (as optax)",
            UserWarning,
            stacklevel=2,
        )
        begin = 0.0

    def schedule(count: Any) -> Any:
        if _python(count):
            c = min(max(count - begin, 0.0), steps)
            return (init_value - end_value) * (1.0 - c / steps) + end_value
        ct = _ew.clip(_as_float_tensor(count) - begin, 0.0, steps)
        return (init_value - end_value) * (1.0 - ct / steps) + end_value

    return schedule


linear_schedule = linear_warmup


def join_schedules(
    schedules: Sequence[Callable], boundaries: Sequence[int]
) -> Callable[[Any], Any]:
    """``schedules[0]`` until ``boundaries[0]``, then ``schedules[1]`` counted from that
    boundary (its count starts at 0 there), and so on (optax's semantics). Use it for warmup
    followed by decay.

    >>> from nablax import optim
    >>> warmup = optim.linear_warmup(0.0, 1.0, transition_steps=2)
    >>> decay = optim.cosine_decay_schedule(1.0, decay_steps=4)
    >>> s = optim.join_schedules([warmup, decay], boundaries=[2])
    >>> [round(s(k), 4) for k in range(7)]
    [0.0, 0.5, 1.0, 0.8536, 0.5, 0.1464, 0.0]
    """
    api = api_name("join_schedules")
    schedules = list(schedules)
    if not schedules:
        raise op_error(ValueError, api, "schedules is empty", "pass at least one schedule")
    for k, s in enumerate(schedules):
        if not callable(s) or isinstance(s, Tensor):
            raise op_error(
                TypeError,
                api,
                f"schedules[{k}] is a {type(s).__name__}, not a callable count -> value",
                "pass schedules such as optim.linear_warmup(0.0, 1e-3, 100)",
            )
    try:
        bounds = [operator.index(b) for b in boundaries]
    except TypeError:
        raise op_error(
            TypeError, api, f"boundaries={boundaries!r} are not all ints", "pass step numbers"
        ) from None
    if len(bounds) != len(schedules) - 1:
        raise op_error(
            ValueError,
            api,
            f"{len(schedules)} schedules need {len(schedules) - 1} boundaries, got {len(bounds)}",
            "pass one boundary (the step where the next schedule starts) between each two",
        )
    for k in range(1, len(bounds)):
        if bounds[k] < bounds[k - 1]:
            raise op_error(
                ValueError,
                api,
                f"boundaries[{k}]={bounds[k]} is before boundaries[{k - 1}]={bounds[k - 1]}",
                "pass boundaries in increasing order",
            )

    def schedule(count: Any) -> Any:
        value = schedules[0](count)
        for b, s in zip(bounds, schedules[1:]):
            if _python(count):
                value = value if count < b else s(count - b)
            else:
                value = _ew.where(count < b, value, s(count - b))
        return value

    return schedule

"""The building blocks of the optimizers: scaling, moments, momentum, weight decay and clipping.

Each public factory is a thin wrapper over a private one that takes the public name (``api``) to
put in its errors, so ``optim.adam(...)``'s update names ``optim.adam`` even though the work is
done by its ``scale_by_adam`` stage. The formulas are torch.optim's (``eps`` added after the
square root, moments starting at zero, bias correction from the step count), written as lazy
nablax ops.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from .. import tree as _tree
from ..core import dtypes as _dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.ops import reduce as _red
from ..core.prims import fused as _fused
from ..core.prims import fused_nn as _fused_nn
from ..core.tensor import Tensor
from ..errors import DTypeError, op_error
from ._base import (
    EmptyState,
    GradientTransformation,
    api_name,
    check_against,
    check_lr,
    check_number,
    check_range,
    check_state,
    check_tree,
    increment,
    like,
    need_params,
    zero_count,
)


class ScaleByScheduleState(NamedTuple):
    """``count``: the number of updates done (an int32 0-d tensor)."""

    count: Tensor  # type: ignore[assignment]  # optax's name; hides tuple.count


class ScaleByAdamState(NamedTuple):
    """``count``: updates done (int32 0-d tensor); ``mu``/``nu``: the first and second moments,
    trees shaped like the params."""

    count: Tensor  # type: ignore[assignment]
    mu: Any
    nu: Any


class TraceState(NamedTuple):
    """``trace``: the momentum buffer, a tree shaped like the params."""

    trace: Any


class RmspropState(NamedTuple):
    """``nu``: the running average of squared gradients; ``mu``: of gradients (``centered=True``
    only, else ``None``)."""

    nu: Any
    mu: Any


class AdagradState(NamedTuple):
    """``sum_of_squares``: the accumulated squared gradients, shaped like the params."""

    sum_of_squares: Any


def _zeros(params: Any) -> Any:
    return _tree.map(_cr.zeros_like, params)


# ---- scaling ------------------------------------------------------------------------------------


def _scale(step_size: Any, api: str) -> GradientTransformation:
    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, EmptyState]:
        check_state(api, state, EmptyState)
        if params is not None:
            ups, treedef, _ = check_tree(api, updates, "grads", params, "params")
        else:
            ups, treedef = _tree.flatten(updates)
        return _tree.unflatten(treedef, [u * like(step_size, u) for u in ups]), state

    return GradientTransformation(init, update)


def scaled_upstream(api: str, checked: bool = False) -> GradientTransformation:
    """The ``scale`` stage of a chain whose previous stage already multiplied by the constant
    step (``adam``: its fused node does): the same state (``EmptyState``) and checks as
    :func:`scale`, so states and checkpoints do not depend on where the multiply happens.
    ``checked``: that stage already checked the updates it returns against ``params``
    (``adamw``'s does), so the tree is not walked again."""

    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, EmptyState]:
        check_state(api, state, EmptyState)
        if params is not None and not checked:
            check_tree(api, updates, "grads", params, "params")
        return updates, state

    return GradientTransformation(init, update)


def scale(step_size: float) -> GradientTransformation:
    """Multiply every update by ``step_size``.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.scale(-0.5)
    >>> opt.update({"w": nx.ones(2)}, opt.init(None))[0]["w"].tolist()
    [-0.5, -0.5]
    """
    api = api_name("scale")
    if not isinstance(step_size, Tensor):
        step_size = check_number(api, "step_size", step_size)
    return _scale(step_size, api)


def _schedule_value(value: Any) -> Any:
    if isinstance(value, (Tensor, int, float)) and not isinstance(value, bool):
        return value
    return _cr.asarray(value, dtype=_dtypes.float32)  # a NumPy scalar or a jax.Array


def _scale_by_schedule(step_size_fn: Callable, api: str) -> GradientTransformation:
    def init(params: Any) -> ScaleByScheduleState:
        return ScaleByScheduleState(zero_count())

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, ScaleByScheduleState]:
        check_state(api, state, ScaleByScheduleState)
        if params is not None:
            check_tree(api, updates, "grads", params, "params")
        count = increment(state.count)
        # evaluated at ``count - 1`` (== state.count) so the new counter is part of the update's
        # graph: reading only the loss then computes it with the update (nablax realizes the
        # pending work connected to what is read), instead of leaving a counter chain that grows
        # by one node per step and changes the graph, hence recompiles, every step
        s = _schedule_value(step_size_fn(count - 1))
        updates = _tree.map(lambda u: u * like(s, u), updates)
        return updates, ScaleByScheduleState(count)

    return GradientTransformation(init, update)


def scale_by_schedule(step_size_fn: Callable) -> GradientTransformation:
    """Multiply every update by ``step_size_fn(count)``, ``count`` being the number of updates
    done before this one (an int32 0-d tensor: write the function with nablax ops, or use the
    schedules of this module).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.scale_by_schedule(lambda count: 1.0 / (count + 1))
    >>> state = opt.init({"w": nx.zeros(1)})
    >>> for _ in range(3):
    ...     updates, state = opt.update({"w": nx.ones(1)}, state)
    >>> round(updates["w"].item(), 6), state.count.item()
    (0.333333, 3)
    """
    api = api_name("scale_by_schedule")
    if not callable(step_size_fn) or isinstance(step_size_fn, Tensor):
        raise _not_callable(api, "step_size_fn", step_size_fn)
    return _scale_by_schedule(step_size_fn, api)


def _not_callable(api: str, arg: str, value: Any) -> Exception:
    return op_error(
        TypeError,
        api,
        f"{arg} is a {type(value).__name__}, not a callable count -> value",
        "pass a schedule such as optim.cosine_decay_schedule(1e-3, 1000)",
    )


def _scale_by_learning_rate(lr: Any, api: str, flip_sign: bool = True) -> GradientTransformation:
    sign = -1.0 if flip_sign else 1.0
    if callable(lr) and not isinstance(lr, Tensor):
        return _scale_by_schedule(lambda count: sign * _schedule_value(lr(count)), api)
    return _scale(sign * lr, api)


def scale_by_learning_rate(learning_rate: Any, *, flip_sign: bool = True) -> GradientTransformation:
    """Multiply updates by ``-learning_rate`` (``flip_sign=False``: by ``+learning_rate``), a
    float or a schedule evaluated on the number of updates done before this one.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.scale_by_learning_rate(0.25)
    >>> opt.update({"w": nx.ones(2)}, opt.init(None))[0]["w"].tolist()
    [-0.25, -0.25]
    """
    api = api_name("scale_by_learning_rate")
    return _scale_by_learning_rate(check_lr(api, learning_rate), api, bool(flip_sign))


# ---- moments ------------------------------------------------------------------------------------


def _scale_by_adam(
    b1: float, b2: float, eps: float, api: str, scale: float = 1.0
) -> GradientTransformation:
    """``scale``: a constant the directions are multiplied by in the fused node (``adam`` folds
    its ``-lr`` in, see :func:`scaled_upstream`)."""

    def init(params: Any) -> ScaleByAdamState:
        return ScaleByAdamState(zero_count(), _zeros(params), _zeros(params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, ScaleByAdamState]:
        check_state(api, state, ScaleByAdamState)
        grads, treedef, mus = check_tree(api, updates, "grads", state.mu, "state.mu")
        nus = check_against(api, updates, grads, treedef, "grads", state.nu, "state.nu")
        count = increment(state.count)
        # one fused node per parameter: new m, new v and the direction (core/prims/fused.py)
        triples = [
            _fused.adam_update(g, m, v, count, b1, b2, eps, scale)
            for g, m, v in zip(grads, mus, nus)
        ]
        cols = list(zip(*triples)) or [(), (), ()]
        mu, nu, out = (_tree.unflatten(treedef, list(c)) for c in cols)
        return out, ScaleByAdamState(count, mu, nu)

    return GradientTransformation(init, update)


def check_betas(api: str, b1: Any, b2: Any, eps: Any) -> tuple[float, float, float]:
    return (
        check_range(api, "b1", b1, 0.0, 1.0, high_open=True),
        check_range(api, "b2", b2, 0.0, 1.0, high_open=True),
        check_range(api, "eps", eps, 0.0),
    )


def scale_by_adam(b1: float = 0.9, b2: float = 0.999, eps: float = 1e-08) -> GradientTransformation:
    """Adam's direction, without the learning rate: ``m_hat / (sqrt(v_hat) + eps)`` with
    bias-corrected moments (torch's formula, ``eps`` outside the square root).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.scale_by_adam()
    >>> updates, state = opt.update({"w": nx.tensor([2.0, -3.0])}, opt.init({"w": nx.zeros(2)}))
    >>> [round(u, 5) for u in updates["w"].tolist()], state.count.item()
    ([1.0, -1.0], 1)
    """
    api = api_name("scale_by_adam")
    return _scale_by_adam(*check_betas(api, b1, b2, eps), api)


def _scale_by_rmsprop(alpha: float, eps: float, centered: bool, api: str) -> GradientTransformation:
    def init(params: Any) -> RmspropState:
        return RmspropState(_zeros(params), _zeros(params) if centered else None)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, RmspropState]:
        check_state(api, state, RmspropState)
        check_tree(api, updates, "grads", state.nu, "state.nu")
        nu = _tree.map(lambda g, v: alpha * v + (1 - alpha) * (g * g), updates, state.nu)
        if centered:
            mu = _tree.map(lambda g, m: alpha * m + (1 - alpha) * g, updates, state.mu)
            # max(., 0): rounding can make E[g^2] - E[g]^2 slightly negative (torch gives NaN)
            var = _tree.map(lambda v, m: _ew.maximum(v - m * m, 0.0), nu, mu)
        else:
            mu, var = None, nu
        out = _tree.map(lambda g, v: g / (_ew.sqrt(v) + eps), updates, var)
        return out, RmspropState(nu, mu)

    return GradientTransformation(init, update)


def _scale_by_adagrad(initial: float, eps: float, api: str) -> GradientTransformation:
    def init(params: Any) -> AdagradState:
        return AdagradState(_tree.map(lambda p: _cr.full_like(p, initial), params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, AdagradState]:
        check_state(api, state, AdagradState)
        check_tree(api, updates, "grads", state.sum_of_squares, "state.sum_of_squares")
        acc = _tree.map(lambda g, s: s + g * g, updates, state.sum_of_squares)
        out = _tree.map(lambda g, s: g / (_ew.sqrt(s) + eps), updates, acc)
        return out, AdagradState(acc)

    return GradientTransformation(init, update)


# ---- momentum and weight decay ------------------------------------------------------------------


def _trace(decay: float, nesterov: bool, api: str) -> GradientTransformation:
    def init(params: Any) -> TraceState:
        return TraceState(_zeros(params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, TraceState]:
        check_state(api, state, TraceState)
        check_tree(api, updates, "grads", state.trace, "state.trace")
        # a zero buffer makes the first step's buffer the gradient itself, as torch's SGD
        buf = _tree.map(lambda g, t: g + decay * t, updates, state.trace)
        out = _tree.map(lambda g, t: g + decay * t, updates, buf) if nesterov else buf
        return out, TraceState(buf)

    return GradientTransformation(init, update)


def trace(decay: float, nesterov: bool = False) -> GradientTransformation:
    """Momentum: ``buf = decay * buf + g``; the update is ``buf``, or ``g + decay * buf`` with
    ``nesterov=True`` (torch's SGD momentum without dampening).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.trace(0.5)
    >>> state = opt.init({"w": nx.zeros(1)})
    >>> for _ in range(3):
    ...     updates, state = opt.update({"w": nx.ones(1)}, state)
    >>> updates["w"].tolist()
    [1.75]
    """
    api = api_name("trace")
    return _trace(check_range(api, "decay", decay, 0.0), bool(nesterov), api)


def _add_decayed_weights(weight_decay: float, api: str) -> GradientTransformation:
    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, EmptyState]:
        check_state(api, state, EmptyState)
        need_params(api, params)
        check_tree(api, updates, "grads", params, "params")
        return _tree.map(lambda u, p: u + weight_decay * p, updates, params), state

    return GradientTransformation(init, update)


def add_decayed_weights(weight_decay: float = 0.0) -> GradientTransformation:
    """Add ``weight_decay * params`` to the updates (decoupled weight decay when it comes after
    the optimizer's direction, as in ``adamw``); ``update`` needs ``params``.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.add_decayed_weights(0.1)
    >>> p = {"w": nx.full((2,), 10.0)}
    >>> opt.update({"w": nx.ones(2)}, opt.init(p), p)[0]["w"].tolist()
    [2.0, 2.0]
    """
    api = api_name("add_decayed_weights")
    return _add_decayed_weights(check_range(api, "weight_decay", weight_decay, 0.0), api)


# ---- clipping -----------------------------------------------------------------------------------


def _sq_f32(x: Tensor, api: str) -> Tensor:
    """``x**2`` element-wise in float32: float16/bfloat16 squares would overflow past
    ``sqrt(65504)``, integer ones wrap, bools multiply as logical and."""
    dt = x.dtype
    if _dtypes.is_complex(dt):  # x * x is not |x|**2, and nablax has no complex abs
        raise op_error(
            DTypeError,
            api,
            f"a {dt} leaf {x.shape}: the norm of complex leaves is not supported",
            "pass its real and imaginary parts as two float leaves",
        )
    if dt != _dtypes.float32:
        x = _ew.astype(x, _dtypes.float32)
    return x * x


def global_norm(tree: Any) -> Tensor:
    """The L2 norm of all leaves of ``tree`` together: a lazy float32 0-d tensor, with every leaf
    squared and summed in float32 (float16 leaves beyond ``sqrt(65504)`` do not overflow, integer
    leaves do not wrap; complex leaves raise ``DTypeError``).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> optim.global_norm({"a": nx.tensor([3.0]), "b": [nx.tensor([[4.0]]), None]}).item()
    5.0
    """
    return _global_norm(tree, api_name("global_norm"))


def _global_norm(tree: Any, api: str) -> Tensor:
    total: Any = None
    for leaf in _tree.leaves(tree):
        x = leaf if isinstance(leaf, Tensor) else _cr.asarray(leaf)
        s = _red.sum(_sq_f32(x, api))
        total = s if total is None else total + s
    if total is None:
        return _cr.zeros((), dtype=_dtypes.float32)
    return _ew.sqrt(total)


def clip_by_global_norm(max_norm: float) -> GradientTransformation:
    """Scale the updates by ``max_norm / global_norm(updates)`` when that norm exceeds
    ``max_norm`` (optax's formula; decided lazily with ``nx.where``, nothing is read). The norm
    and the scaling are float32 and each update keeps its dtype (rounded once; an integer update
    truncates toward zero, so the clipped norm never exceeds ``max_norm``). float16 updates with
    a norm past 65504 are scaled, not zeroed as by ``torch.nn.utils.clip_grad_norm_`` (whose
    float16 norm is ``inf``) and optax's formula (which casts the norm to the leaf's dtype).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.clip_by_global_norm(1.0)
    >>> g = {"a": nx.tensor([3.0]), "b": nx.tensor([4.0])}
    >>> out, _ = opt.update(g, opt.init(g))
    >>> [round(out["a"].item(), 6), round(out["b"].item(), 6)]
    [0.6, 0.8]
    """
    api = api_name("clip_by_global_norm")
    max_norm = check_range(api, "max_norm", max_norm, 0.0, low_open=True)

    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, EmptyState]:
        check_state(api, state, EmptyState)
        leaves, treedef = _tree.flatten(updates)
        fused = _fused_nn.clip_by_global_norm(leaves, max_norm)  # float32 leaves: one node
        if fused is not None:
            return _tree.unflatten(treedef, fused), state
        norm = _global_norm(updates, api)
        small = norm < max_norm

        def clip(t: Any) -> Any:
            # in float32 (the norm's dtype), cast back to the leaf's dtype once: a float16 norm
            # past 65504 would be inf and zero every update (optax and
            # torch.nn.utils.clip_grad_norm_ do that), an integer norm would truncate
            t = t if isinstance(t, Tensor) else _cr.asarray(t)
            dt = t.dtype
            c = ((t if dt == _dtypes.float32 else _ew.astype(t, _dtypes.float32)) / norm) * max_norm
            return _ew.where(small, t, c if c.dtype == dt else _ew.astype(c, dt))

        return _tree.map(clip, updates), state

    return GradientTransformation(init, update)

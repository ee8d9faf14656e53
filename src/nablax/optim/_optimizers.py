"""The optimizers: torch.optim's defaults and formulas, as chains of the building blocks.

``lr`` is first and positional, a float >= 0 or a schedule (a callable ``count -> lr``, evaluated
on the number of updates done before this one: 0 on the first). Bad hyper-parameters raise the
``ValueError`` torch raises, naming the optimizer, the argument and the accepted range.
"""

from __future__ import annotations

from typing import Any

from .. import tree as _tree
from ..core.prims import fused_nn as _fused_nn
from ..core.tensor import Tensor
from ..errors import op_error
from ._base import (
    EmptyState,
    GradientTransformation,
    api_name,
    check_against,
    check_lr,
    check_range,
    check_state,
    check_tree,
    increment,
    make_chain,
    need_params,
    same_structure,
    zero_count,
)
from ._transforms import (
    ScaleByAdamState,
    _add_decayed_weights,
    _scale_by_adagrad,
    _scale_by_adam,
    _scale_by_learning_rate,
    _scale_by_rmsprop,
    _trace,
    _zeros,
    check_betas,
    scaled_upstream,
)


def sgd(lr: Any = 0.001, momentum: float = 0.0, nesterov: bool = False) -> GradientTransformation:
    """Stochastic gradient descent, as ``torch.optim.SGD`` (no dampening, no weight decay):
    ``buf = momentum * buf + g`` (the first buffer is ``g``), the step is ``-lr * buf``, or
    ``-lr * (g + momentum * buf)`` with ``nesterov=True``. ``momentum=0`` keeps no state tensors.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> params = {"w": nx.tensor([1.0, 2.0])}
    >>> opt = optim.sgd(0.1, momentum=0.9)
    >>> state = opt.init(params)
    >>> for _ in range(2):
    ...     updates, state = opt.update({"w": nx.ones(2)}, state, params)
    ...     params = optim.apply_updates(params, updates)
    >>> [round(v, 6) for v in params["w"].tolist()]
    [0.71, 1.71]
    """
    api = api_name("sgd")
    lr = check_lr(api, lr)
    momentum = check_range(api, "momentum", momentum, 0.0)
    if nesterov and momentum <= 0:
        raise op_error(
            ValueError,
            api,
            "nesterov=True needs a momentum > 0 (Nesterov momentum requires a momentum)",
            "pass momentum=0.9 (say) or nesterov=False",
        )
    parts = [_trace(momentum, bool(nesterov), api)] if momentum > 0 else []
    return make_chain((*parts, _scale_by_learning_rate(lr, api)), api)


def adam(
    lr: Any = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-08
) -> GradientTransformation:
    """Adam, as ``torch.optim.Adam``: bias-corrected moments and
    ``step = -lr * m_hat / (sqrt(v_hat) + eps)`` (``eps`` added after the square root).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> params = {"w": nx.zeros(2), "b": nx.zeros(())}
    >>> opt = optim.adam(0.1)
    >>> state = opt.init(params)
    >>> grads = {"w": nx.tensor([1.0, -2.0]), "b": nx.tensor(0.5)}
    >>> updates, state = opt.update(grads, state, params)
    >>> [round(v, 5) for v in optim.apply_updates(params, updates)["w"].tolist()]
    [-0.1, 0.1]
    """
    api = api_name("adam")
    lr = check_lr(api, lr)
    b1, b2, eps = check_betas(api, b1, b2, eps)
    if not isinstance(lr, Tensor) and not callable(lr):
        # a number (check_lr): -lr is folded into the fused Adam node, as a Python float (a
        # NumPy scalar would be a strongly typed constant of the program)
        return make_chain((_scale_by_adam(b1, b2, eps, api, -float(lr)), scaled_upstream(api)), api)
    return make_chain((_scale_by_adam(b1, b2, eps, api), _scale_by_learning_rate(lr, api)), api)


def adamw(
    lr: Any = 0.001,
    b1: float = 0.9,
    b2: float = 0.999,
    eps: float = 1e-08,
    weight_decay: float = 0.01,
) -> GradientTransformation:
    """AdamW, as ``torch.optim.AdamW``: Adam's step plus the decoupled decay
    ``-lr * weight_decay * params``; ``update`` needs ``params``.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> params = {"w": nx.ones(2)}
    >>> opt = optim.adamw(0.1, weight_decay=0.5)
    >>> updates, _ = opt.update({"w": nx.zeros(2)}, opt.init(params), params)
    >>> [round(v, 5) for v in optim.apply_updates(params, updates)["w"].tolist()]
    [0.95, 0.95]
    """
    api = api_name("adamw")
    lr = check_lr(api, lr)
    b1, b2, eps = check_betas(api, b1, b2, eps)
    weight_decay = check_range(api, "weight_decay", weight_decay, 0.0)
    if not isinstance(lr, Tensor) and not callable(lr):
        # a number: the decay and -lr are folded into one fused node for the tree (as adam's
        # -lr); the stages and states stay those of the chain below
        stages = (
            _scale_by_adamw(b1, b2, eps, weight_decay, -float(lr), api),
            _decayed_upstream(api),
            scaled_upstream(api, checked=True),
        )
        return make_chain(stages, api)
    return make_chain(
        (
            _scale_by_adam(b1, b2, eps, api),
            _add_decayed_weights(weight_decay, api),
            _scale_by_learning_rate(lr, api),
        ),
        api,
    )


def _scale_by_adamw(b1, b2, eps, weight_decay, scale, api) -> GradientTransformation:
    """``scale_by_adam``, ``add_decayed_weights`` and the constant ``scale`` in one node for the
    whole tree (core/prims/fused_nn.py), with ``scale_by_adam``'s state and checks."""

    def init(params: Any) -> ScaleByAdamState:
        return ScaleByAdamState(zero_count(), _zeros(params), _zeros(params))

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, ScaleByAdamState]:
        check_state(api, state, ScaleByAdamState)
        same = None if params is None else same_structure(updates, state.mu, state.nu, params)
        if same is not None:
            treedef, (grads, mus, nus, ps) = same
            # one node when every leaf fuses; its checks (shapes equal) stand for check_tree's
            avals = _fused_nn.adamw_tree_avals(grads, mus, nus, ps)
            if avals is not None:
                count = increment(state.count)
                cols = _fused_nn.adamw_tree_node(
                    grads, mus, nus, count, ps, b1, b2, eps, weight_decay, scale, avals
                )
                mu, nu, out = (_tree.unflatten(treedef, c) for c in cols)
                return out, ScaleByAdamState(count, mu, nu)
        grads, treedef, mus = check_tree(api, updates, "grads", state.mu, "state.mu")
        nus = check_against(api, updates, grads, treedef, "grads", state.nu, "state.nu")
        need_params(api, params)
        ps = check_against(api, updates, grads, treedef, "grads", params, "params")
        count = increment(state.count)
        cols = _fused_nn.adamw_update_tree(
            grads, mus, nus, count, ps, b1, b2, eps, weight_decay, scale
        )
        mu, nu, out = (_tree.unflatten(treedef, c) for c in cols)
        return out, ScaleByAdamState(count, mu, nu)

    return GradientTransformation(init, update)


def _decayed_upstream(api: str) -> GradientTransformation:
    """The ``add_decayed_weights`` stage of a chain whose previous stage already added the decay:
    its state and checks, no nodes. The updates it gets are that stage's output, built on the
    structure of grads it checked against params: no tree is walked again."""

    def init(params: Any) -> EmptyState:
        return EmptyState()

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, EmptyState]:
        check_state(api, state, EmptyState)
        need_params(api, params)
        return updates, state

    return GradientTransformation(init, update)


def rmsprop(
    lr: Any = 0.01,
    alpha: float = 0.99,
    eps: float = 1e-08,
    momentum: float = 0.0,
    centered: bool = False,
) -> GradientTransformation:
    """RMSprop, as ``torch.optim.RMSprop``: ``v = alpha * v + (1 - alpha) * g**2``, the direction
    ``g / (sqrt(v) + eps)`` (``eps`` outside the square root; ``centered=True`` subtracts the
    squared running mean of ``g`` from ``v`` first), with optional momentum on that direction.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> params = {"w": nx.zeros(2)}
    >>> opt = optim.rmsprop(0.01, alpha=0.75)
    >>> updates, state = opt.update({"w": nx.tensor([1.0, -1.0])}, opt.init(params), params)
    >>> [round(u, 5) for u in updates["w"].tolist()]
    [-0.02, 0.02]
    """
    api = api_name("rmsprop")
    lr = check_lr(api, lr)
    alpha = check_range(api, "alpha", alpha, 0.0)
    eps = check_range(api, "eps", eps, 0.0)
    momentum = check_range(api, "momentum", momentum, 0.0)
    parts = [_scale_by_rmsprop(alpha, eps, bool(centered), api)]
    if momentum > 0:
        parts.append(_trace(momentum, False, api))
    return make_chain((*parts, _scale_by_learning_rate(lr, api)), api)


def adagrad(
    lr: Any = 0.01, initial_accumulator_value: float = 0.0, eps: float = 1e-10
) -> GradientTransformation:
    """Adagrad, as ``torch.optim.Adagrad`` (no lr decay): ``s = s + g**2`` starting at
    ``initial_accumulator_value``, step ``-lr * g / (sqrt(s) + eps)``.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> params = {"w": nx.zeros(1)}
    >>> opt = optim.adagrad(0.5, initial_accumulator_value=3.0)
    >>> updates, state = opt.update({"w": nx.ones(1)}, opt.init(params), params)
    >>> round(updates["w"].item(), 5), state[0].sum_of_squares["w"].tolist()
    (-0.25, [4.0])
    """
    api = api_name("adagrad")
    lr = check_lr(api, lr)
    initial = check_range(api, "initial_accumulator_value", initial_accumulator_value, 0.0)
    eps = check_range(api, "eps", eps, 0.0)
    return make_chain((_scale_by_adagrad(initial, eps, api), _scale_by_learning_rate(lr, api)), api)

"""Optimizers (``nablax.optim``): optax's shape, torch.optim's defaults and numerics.

An optimizer is a :class:`GradientTransformation`: ``state = opt.init(params)``, then each step
``updates, state = opt.update(grads, state, params)`` and
``params = optim.apply_updates(params, updates)``. Params, grads and states are pytrees (dicts,
lists, ``nablax.nn`` modules, registered dataclasses; ``None`` leaves are empty). Every update is
a lazy nablax expression and the step count is an int32 tensor, so an eager step is one graph
that compiles once, and ``nx.compile``, ``nx.vmap`` and ``nx.shard_map`` take a step unchanged.
States save with ``nx.save`` and load with ``nx.load(path, like=state)``.

>>> import nablax as nx
>>> from nablax import optim
>>> params = {"w": nx.zeros(3)}
>>> target = nx.tensor([1.0, -2.0, 3.0])
>>> loss_fn = lambda p: ((p["w"] - target) ** 2).sum()
>>> opt = optim.adam(optim.cosine_decay_schedule(0.1, decay_steps=200))
>>> state = opt.init(params)
>>> for step in range(200):
...     loss, grads = nx.value_and_grad(loss_fn)(params)
...     updates, state = opt.update(grads, state, params)
...     params = optim.apply_updates(params, updates)
...     last = loss.item()  # reading a value runs the step (the update too)
>>> [round(v, 1) for v in params["w"].tolist()], int(state[1].count)
([1.0, -2.0, 3.0], 200)
"""

from ._accumulate import MultiSteps, MultiStepsState
from ._base import EmptyState, GradientTransformation, apply_updates, chain
from ._optimizers import adagrad, adam, adamw, rmsprop, sgd
from ._schedules import (
    cosine_decay_schedule,
    exponential_decay,
    join_schedules,
    linear_schedule,
    linear_warmup,
)
from ._transforms import (
    AdagradState,
    RmspropState,
    ScaleByAdamState,
    ScaleByScheduleState,
    TraceState,
    add_decayed_weights,
    clip_by_global_norm,
    global_norm,
    scale,
    scale_by_adam,
    scale_by_learning_rate,
    scale_by_schedule,
    trace,
)

__all__ = [
    # the protocol and combinators
    "GradientTransformation",
    "apply_updates",
    "chain",
    "MultiSteps",
    # optimizers
    "sgd",
    "adam",
    "adamw",
    "rmsprop",
    "adagrad",
    # building blocks
    "scale",
    "scale_by_learning_rate",
    "scale_by_schedule",
    "scale_by_adam",
    "trace",
    "add_decayed_weights",
    "clip_by_global_norm",
    "global_norm",
    # schedules
    "cosine_decay_schedule",
    "exponential_decay",
    "linear_warmup",
    "linear_schedule",
    "join_schedules",
    # states
    "EmptyState",
    "ScaleByScheduleState",
    "ScaleByAdamState",
    "TraceState",
    "RmspropState",
    "AdagradState",
    "MultiStepsState",
]

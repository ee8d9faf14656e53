"""Gradient accumulation: ``optim.MultiSteps``, optax's.

optax chooses between the accumulating step and the applying step with ``lax.cond``; here every
update is a lazy nablax expression, so both branches are built and ``nx.where`` picks leaf by
leaf (the inner optimizer's update is computed every step and kept only on the k-th). The values
are optax's, and the step stays one graph: eager steps reuse one compiled program and
``nx.compile`` traces the step once, whatever the position in the cycle.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import tree as _tree
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.tensor import Tensor
from ..errors import op_error
from ._base import GradientTransformation, check_state, check_tree, increment, zero_count

_API = "optim.MultiSteps"


class MultiStepsState(NamedTuple):
    """The state of :class:`MultiSteps` (optax's fields): ``mini_step``, the gradients
    accumulated since the last applied update (int32, in ``[0, k)``); ``gradient_step``, the
    updates applied so far (int32); ``inner_opt_state``, the wrapped optimizer's state;
    ``acc_grads``, the running mean (or sum) of the accumulated gradients, shaped like the params;
    ``skip_state``, what ``should_skip_update_fn`` returned last (``()`` without one).

    >>> import nablax as nx
    >>> from nablax import optim
    >>> s = optim.MultiSteps(optim.sgd(0.1), 4).init({"w": nx.zeros(2)})
    >>> int(s.mini_step), int(s.gradient_step), s.acc_grads["w"].tolist()
    (0, 0, [0.0, 0.0])
    """

    mini_step: Tensor
    gradient_step: Tensor
    inner_opt_state: Any
    acc_grads: Any
    skip_state: Any = ()


def _zeros_like(x: Any) -> Any:
    return _cr.zeros_like(x) if isinstance(x, Tensor) else x


def _select(cond: Tensor, a: Any, b: Any) -> Any:
    """``a`` where ``cond`` else ``b``, leaf by leaf (non-tensor leaves must agree: taken from a)."""
    la, ta = _tree.flatten(a)
    lb = _tree.leaves(b)
    out = [
        _ew.where(cond, x, y) if isinstance(x, Tensor) or isinstance(y, Tensor) else x
        for x, y in zip(la, lb)
    ]
    return _tree.unflatten(ta, out)


class MultiSteps:
    """Gradient accumulation, as ``optax.MultiSteps``: ``update`` accumulates the gradients of
    ``k`` calls and, on every ``k``-th call, passes their mean (their sum with
    ``use_grad_mean=False``) to ``opt`` and returns its updates; the calls in between return zero
    updates and leave ``opt``'s state unchanged. ``every_k_schedule`` is an int ``k >= 1`` or a
    callable ``gradient_step -> k`` (the number of updates applied so far, an int32 tensor).
    ``should_skip_update_fn(updates, gradient_step, params) -> (skip, skip_state)``, as optax's,
    makes a step whose ``skip`` (a bool 0-d tensor) is true return zeros and leave the state as it
    was (``skip_state`` excepted). The state is a :class:`MultiStepsState` pytree.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.MultiSteps(optim.sgd(1.0), every_k_schedule=2)
    >>> params = {"w": nx.zeros(1)}
    >>> state = opt.init(params)
    >>> for g in (1.0, 3.0):
    ...     updates, state = opt.update({"w": nx.tensor([g])}, state, params)
    ...     print(updates["w"].tolist(), bool(opt.has_updated(state)))
    [0.0] False
    [-2.0] True
    """

    def __init__(
        self,
        opt: GradientTransformation,
        every_k_schedule: int | Callable[[Tensor], Any],
        use_grad_mean: bool = True,
        should_skip_update_fn: Callable | None = None,
    ) -> None:
        if not (callable(getattr(opt, "init", None)) and callable(getattr(opt, "update", None))):
            raise op_error(
                TypeError,
                _API,
                f"opt is a {type(opt).__name__}, not a GradientTransformation",
                "pass an optimizer such as optim.adam(1e-3)",
            )
        if not callable(every_k_schedule):
            k = every_k_schedule
            if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
                raise op_error(
                    ValueError,
                    _API,
                    f"every_k_schedule={k!r} must be an int >= 1 or a callable step -> k",
                    "pass e.g. every_k_schedule=4",
                )
            every_k_schedule = _constant(int(k))
        self._opt = opt
        self._every_k_schedule = every_k_schedule
        self._use_grad_mean = bool(use_grad_mean)
        self._should_skip_update_fn = should_skip_update_fn

    @property
    def inner_opt(self) -> GradientTransformation:
        """The wrapped optimizer."""
        return self._opt

    def init(self, params: Any) -> MultiStepsState:
        """The initial state: counters at 0, ``opt.init(params)``, zero accumulators."""
        skip_state = ()
        if self._should_skip_update_fn is not None:
            _, skip_state = self._should_skip_update_fn(
                _tree.map(_zeros_like, params), zero_count(), params
            )
        return MultiStepsState(
            mini_step=zero_count(),
            gradient_step=zero_count(),
            inner_opt_state=self._opt.init(params),
            acc_grads=_tree.map(_zeros_like, params),
            skip_state=skip_state,
        )

    def update(
        self, updates: Any, state: MultiStepsState, params: Any = None
    ) -> tuple[Any, MultiStepsState]:
        """Accumulate ``updates`` (the gradients); on the ``k``-th call apply ``opt`` to their
        mean. Returns ``(updates, new_state)``; the updates are zeros in between."""
        check_state(_API, state, MultiStepsState)
        check_tree(_API, updates, "grads", state.acc_grads, "the params given to init")
        mini = state.mini_step
        if self._use_grad_mean:
            acc = _tree.map(
                lambda g, a: a + (g - a) / (mini + 1) if isinstance(g, Tensor) else a,
                updates,
                state.acc_grads,
            )
        else:
            acc = _tree.map(
                lambda g, a: a + g if isinstance(g, Tensor) else a, updates, state.acc_grads
            )
        k = self._every_k_schedule(state.gradient_step)
        final = mini >= k - 1  # optax: cond(mini_step < k - 1, mid_step, final_step)
        inner_updates, inner_state = self._opt.update(acc, state.inner_opt_state, params)
        out = _tree.map(
            lambda u: _ew.where(final, u, 0) if isinstance(u, Tensor) else u, inner_updates
        )
        new_state = MultiStepsState(
            mini_step=_ew.where(final, 0, increment(mini)),
            gradient_step=_ew.where(final, increment(state.gradient_step), state.gradient_step),
            inner_opt_state=_select(final, inner_state, state.inner_opt_state),
            acc_grads=_tree.map(
                lambda a: _ew.where(final, 0, a) if isinstance(a, Tensor) else a, acc
            ),
            skip_state=state.skip_state,
        )
        if self._should_skip_update_fn is None:
            return out, new_state
        skip, skip_state = self._should_skip_update_fn(updates, state.gradient_step, params)
        out = _tree.map(lambda u: _ew.where(skip, 0, u) if isinstance(u, Tensor) else u, out)
        kept = state._replace(skip_state=skip_state)
        return out, _select(skip, kept, new_state._replace(skip_state=skip_state))

    def has_updated(self, state: MultiStepsState) -> Tensor:
        """Whether the last ``update`` applied the inner optimizer (a bool 0-d tensor), as
        optax's: ``mini_step == 0`` and ``gradient_step > 0``."""
        return _ew.logical_and(state.mini_step == 0, state.gradient_step > 0)

    def gradient_transformation(self) -> GradientTransformation:
        """This accumulator as a :class:`GradientTransformation` (for ``optim.chain``)."""
        return GradientTransformation(self.init, self.update)


def _constant(k: int) -> Callable[[Any], int]:
    def every_k(step: Any) -> int:
        return k

    return every_k

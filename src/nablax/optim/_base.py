"""The optimizer protocol (``GradientTransformation``), ``chain``, ``apply_updates`` and the
helpers every transform shares: argument checks that name the public function, tree checks that
name the first differing path, and the int32 step counter.

Nothing here reads a value: every update is a lazy nablax expression, so a whole training step
stays one graph (one XLA program) in eager code and traces once under ``nx.compile``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import tree as _tree
from ..core import dtypes as _dtypes
from ..core.ops import creation as _cr
from ..core.ops import elementwise as _ew
from ..core.prims import fused_nn as _fused_nn
from ..core.tensor import Tensor
from ..errors import op_error

_INT32_MAX = 2**31 - 1


class GradientTransformation(NamedTuple):
    """An optimizer, or one stage of one: ``init(params) -> state`` and
    ``update(updates, state, params=None) -> (updates, state)``.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.sgd(0.1)
    >>> isinstance(opt, optim.GradientTransformation)
    True
    >>> updates, state = opt.update({"w": nx.ones(2)}, opt.init({"w": nx.zeros(2)}))
    >>> updates["w"].tolist()
    [-0.10000000149011612, -0.10000000149011612]
    """

    init: Callable[[Any], Any]
    update: Callable[..., tuple[Any, Any]]


class EmptyState(NamedTuple):
    """The state of a transform that keeps none (a pytree with no leaves).

    >>> from nablax import optim
    >>> optim.scale(2.0).init({"w": None})
    EmptyState()
    """


# ---- argument checks ----------------------------------------------------------------------------


def api_name(name: str) -> str:
    return f"optim.{name}"


def check_number(api: str, arg: str, value: Any) -> float:
    """``value`` as a float; ``TypeError`` naming ``api`` and ``arg`` if it is not a real number."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise op_error(
            TypeError,
            api,
            f"{arg}={value!r} is a {type(value).__name__}, not a number",
            f"pass a Python float for {arg}",
        )
    value = float(value)
    if math.isnan(value):
        raise op_error(ValueError, api, f"{arg} is NaN", f"pass a finite number for {arg}")
    return value


def check_range(
    api: str,
    arg: str,
    value: Any,
    low: float | None = None,
    high: float | None = None,
    *,
    high_open: bool = False,
    low_open: bool = False,
) -> float:
    """``value`` checked to lie in ``[low, high]`` (``high_open``/``low_open``: that end
    excluded), with a ``ValueError`` naming ``api``, ``arg`` and the accepted range."""
    v = check_number(api, arg, value)
    bad_low = low is not None and (v <= low if low_open else v < low)
    bad_high = high is not None and (v >= high if high_open else v > high)
    if bad_low or bad_high:
        lo = "" if low is None else f"{'(' if low_open else '['}{low:g}"
        hi = "" if high is None else f"{high:g}{')' if high_open else ']'}"
        if high is None:
            want = f"{arg} > {low:g}" if low_open else f"{arg} >= {low:g}"
        elif low is None:
            want = f"{arg} < {high:g}" if high_open else f"{arg} <= {high:g}"
        else:
            want = f"{arg} in {lo}, {hi}"
        raise op_error(ValueError, api, f"invalid {arg}={value!r}", f"pass {want}")
    return v


def check_lr(api: str, lr: Any) -> Any:
    """A learning rate: a number >= 0, a 0-d tensor, or a schedule (a callable ``count -> lr``)."""
    if callable(lr) and not isinstance(lr, Tensor):
        return lr
    if isinstance(lr, Tensor):
        if lr.ndim != 0:
            raise op_error(
                ValueError,
                api,
                f"lr is a tensor of shape {lr.shape}",
                "pass a float, a 0-d tensor or a schedule",
            )
        return lr
    if isinstance(lr, bool) or not isinstance(lr, numbers.Real):
        raise op_error(
            TypeError,
            api,
            f"lr={lr!r} is a {type(lr).__name__}",
            "pass a float learning rate or a schedule (a callable count -> lr, such as "
            "optim.cosine_decay_schedule(...))",
        )
    return check_range(api, "lr", lr, 0.0)


# ---- trees --------------------------------------------------------------------------------------


def check_tree(api: str, tree: Any, name: str, ref: Any, ref_name: str) -> tuple[list, Any, list]:
    """Raise ``ValueError`` naming the first path where ``tree`` differs from ``ref`` (missing or
    extra leaves, another container, or another shape); return ``(leaves of tree, its structure,
    leaves of ref)`` so the caller walks neither tree again."""
    leaves, treedef = _tree.flatten(tree)
    return leaves, treedef, check_against(api, tree, leaves, treedef, name, ref, ref_name)


def same_structure(tree: Any, *refs: Any) -> tuple[Any, list[list]] | None:
    """``(treedef, [leaves of tree, leaves of each ref])`` when every ref flattens to the very
    treedef object that ``tree`` does (module trees of one model share their memoized one), else
    None. A fused update's own shape and dtype checks then stand for :func:`check_tree`'s; where
    they fail, the caller runs :func:`check_tree` for its error naming the first difference."""
    leaves, treedef = _tree.flatten(tree)
    out = [leaves]
    for ref in refs:
        ref_leaves, ref_def = _tree.flatten(ref)
        if ref_def is not treedef:
            return None
        out.append(ref_leaves)
    return treedef, out


def check_against(
    api: str, tree: Any, leaves: list, treedef: Any, name: str, ref: Any, ref_name: str
) -> list:
    """:func:`check_tree` of a ``tree`` already flattened into ``leaves`` and ``treedef`` (a
    transform that checks its updates against several trees walks them once); returns the
    leaves of ``ref``."""
    ref_leaves, ref_def = _tree.flatten(ref)
    if treedef is ref_def or treedef == ref_def:  # (comparing equal structures walks them)
        # the common case, every step: compare shapes without building path strings
        for a, b in zip(leaves, ref_leaves):
            if type(a) is Tensor and type(b) is Tensor:  # most leaves: no property calls
                if a._impl.shape != b._impl.shape:
                    break
                continue
            sa = getattr(a, "shape", None)
            if sa is not None:
                sb = getattr(b, "shape", None)
                if sb is not None and sa != sb:
                    break  # another shape: name its path below
        else:
            return ref_leaves
        for (path, a), (_, b) in zip(
            _tree.leaves_with_path(tree, name), _tree.leaves_with_path(ref, ref_name)
        ):
            sa, sb = getattr(a, "shape", None), getattr(b, "shape", None)
            if sa is not None and sb is not None and tuple(sa) != tuple(sb):
                raise op_error(
                    ValueError,
                    api,
                    f"{path} has shape {tuple(sa)} but {ref_name} has shape {tuple(sb)} there",
                    f"pass {name} shaped like the params given to init",
                )
        return ref_leaves
    mine = [p for p, _ in _tree.leaves_with_path(tree)]
    theirs = [p for p, _ in _tree.leaves_with_path(ref)]
    missing = [p for p in theirs if p not in set(mine)]
    extra = [p for p in mine if p not in set(theirs)]
    if missing:
        problem = f"{name} has no leaf at {ref_name}{missing[0]}"
    elif extra:
        problem = f"{name}{extra[0]} is not a leaf of {ref_name}"
    else:  # same paths, other containers (a tuple for a list, another class)
        problem = (
            f"{name} is structured as {_tree.structure(tree)} but {ref_name} as "
            f"{_tree.structure(ref)}"
        )
    raise op_error(
        ValueError,
        api,
        problem,
        f"pass {name} with the structure of the params given to init (None leaves included)",
    )


def check_state(api: str, state: Any, cls: type) -> None:
    if not isinstance(state, cls):
        raise op_error(
            TypeError,
            api,
            f"update: state is a {type(state).__name__}, expected a {cls.__name__}",
            "pass the state returned by this optimizer's init (or by its previous update; "
            "nx.load(path, like=state) restores a saved one)",
        )


def need_params(api: str, params: Any) -> None:
    if params is None:
        raise op_error(
            ValueError,
            api,
            "update needs the current params (weight decay is proportional to them)",
            "call opt.update(grads, state, params)",
        )


# ---- scalars ------------------------------------------------------------------------------------


def zero_count() -> Tensor:
    """A fresh step counter: an int32 0-d tensor, so the graph (and a compiled function's cache
    key) is the same at every step, where a Python int would be a new constant each time."""
    return _cr.zeros((), dtype=_dtypes.int32)


def increment(count: Tensor) -> Tensor:
    """``count + 1``, saturating at the int32 maximum instead of wrapping to a negative step."""
    return _ew.minimum(count, _INT32_MAX - 1) + 1  # two nodes: built every step


def like(scalar: Any, x: Any) -> Any:
    """A float32 scalar tensor cast to the dtype of a lower-precision leaf ``x``, so a bfloat16
    parameter's update stays bfloat16 (Python numbers are weakly typed and need no cast)."""
    if not isinstance(scalar, Tensor):
        return scalar
    dtype = getattr(x, "dtype", None)
    if dtype is None or dtype == scalar.dtype or not _dtypes.is_floating(dtype):
        return scalar
    return _ew.astype(scalar, dtype)


# ---- the public combinators ---------------------------------------------------------------------


def chain(*transforms: GradientTransformation) -> GradientTransformation:
    """Apply transforms one after another; the state is the tuple of their states.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> opt = optim.chain(optim.clip_by_global_norm(1.0), optim.sgd(0.5))
    >>> state = opt.init({"w": nx.zeros(2)})
    >>> updates, state = opt.update({"w": nx.tensor([3.0, 4.0])}, state)
    >>> [round(u, 6) for u in updates["w"].tolist()]
    [-0.3, -0.4]
    """
    api = api_name("chain")
    for k, t in enumerate(transforms):
        if not (callable(getattr(t, "init", None)) and callable(getattr(t, "update", None))):
            raise op_error(
                TypeError,
                api,
                f"transforms[{k}] is a {type(t).__name__}, not a GradientTransformation",
                "pass optimizers or transforms such as optim.adam(1e-3) or "
                "optim.clip_by_global_norm(1.0)",
            )
    return make_chain(tuple(transforms), api)


def make_chain(transforms: tuple, api: str) -> GradientTransformation:
    """``chain`` whose errors name ``api`` (the optimizer the user called)."""

    def init(params: Any) -> tuple:
        return tuple(t.init(params) for t in transforms)

    def update(updates: Any, state: Any, params: Any = None) -> tuple[Any, tuple]:
        plain = isinstance(state, tuple) and not hasattr(state, "_fields")
        if not plain or len(state) != len(transforms):
            got = f"a tuple of {len(state)}" if plain else f"a {type(state).__name__}"
            raise op_error(
                ValueError,
                api,
                f"update: state is {got}, expected a tuple of {len(transforms)} states",
                "pass the state returned by this optimizer's init (or by its previous update)",
            )
        new_state = []
        for t, s in zip(transforms, state):
            updates, s = t.update(updates, s, params)
            new_state.append(s)
        return updates, tuple(new_state)

    return GradientTransformation(init, update)


def apply_updates(params: Any, updates: Any) -> Any:
    """``params + updates`` leaf by leaf, each result cast back to its parameter's dtype.

    >>> import nablax as nx
    >>> from nablax import optim
    >>> p = {"w": nx.ones(2, dtype=nx.bfloat16), "b": None}
    >>> new = optim.apply_updates(p, {"w": nx.full((2,), 0.5), "b": None})
    >>> new["w"].dtype == nx.bfloat16, new["w"].tolist(), new["b"]
    (True, [1.5, 1.5], None)
    """
    api = api_name("apply_updates")
    same = same_structure(updates, params)
    if same is not None:  # one node when every leaf is exactly p + u (shapes and dtypes checked)
        treedef, (ups, ps) = same
        fused = _fused_nn.apply_updates(ps, ups)
        if fused is not None:
            return _tree.unflatten(treedef, fused)
    ups, treedef, ps = check_tree(api, updates, "updates", params, "params")
    fused = None if same is not None else _fused_nn.apply_updates(ps, ups)
    if fused is not None:
        return _tree.unflatten(treedef, fused)
    out = []
    for p, u in zip(ps, ups):
        new = p + u
        dtype = getattr(p, "dtype", None)
        if dtype is not None and new.dtype != dtype:
            new = _ew.astype(new, dtype)
        out.append(new)
    return _tree.unflatten(treedef, out)

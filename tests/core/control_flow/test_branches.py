"""``nx.cond`` and ``nx.switch`` (control_flow/branches.py): values against ``jax.lax``."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

from .programs import (
    JX,
    NX,
    _check,
    _close,
    _cond_prog,
    _r,
    _switch_prog,
)


@pytest.mark.parametrize("sign", [1.0, -1.0], ids=["true", "false"])
def test_cond_values_pytree_operands_and_closure(sign):
    x, y, c = sign * np.abs(_r(3)), _r(3, 1), _r(3, 2)

    def prog(L, x, y, c):
        def tb(ops):
            return {"s": ops["a"] * c + ops["b"], "t": (ops["a"].sum(),)}

        def fb(ops):
            return {"s": ops["a"] - ops["b"] * c, "t": ((ops["b"] * c).sum(),)}

        return L.cf.cond(x.sum() > 0, tb, fb, {"a": x, "b": y})

    got = _check(prog, x, y, c)
    assert set(got) == {"s", "t"} and isinstance(got["t"], tuple)
    want_s = x * c + y if sign > 0 else x - y * c
    _close(got["s"], want_s, "vs numpy")
    _check(_cond_prog, x, c, what="closure")


def test_cond_accepts_python_and_numpy_operands():
    out = nx.cond(True, lambda a, k: a * k, lambda a, k: a - k, np.arange(3.0, dtype="f4"), 2.0)
    _close(out, np.arange(3.0) * 2.0)
    out = nx.cond(np.bool_(False), lambda a: a + 1, lambda a: a - 1, jnp.ones(2, jnp.float32))
    _close(out, np.zeros(2, np.float32))


@pytest.mark.parametrize("index", [-3, 0, 1, 2, 7])
def test_switch_values_clamped_index(index):
    x, c = _r(3), _r(3, 1)
    _check(_switch_prog, np.int32(index), x, c, what=f"tensor index {index}")
    got = _switch_prog(NX, index, NX.arr(x), NX.arr(c))  # a Python int index
    _close(got, _switch_prog(JX, index, x, c), f"int index {index}")

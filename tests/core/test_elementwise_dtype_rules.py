"""core/prims/elementwise/dtype_rules.py: the dtype kinds and Python int operands, against JAX."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from nablax.core.prims.elementwise import dtype_rules
from nablax.errors import DTypeError


@pytest.mark.parametrize(
    "op, kind, jfn",
    [
        ("exp", "float", jnp.exp),
        ("add", "arith", jnp.add),
        ("less", "compare", jnp.less),
        ("isnan", "predicate", jnp.isnan),
        ("bitwise_and", "bitwise", jnp.bitwise_and),
        ("floor", "real", jnp.floor),
    ],
)
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.float16, np.float32])
def test_resolve_gives_jax_output_dtype(op, kind, jfn, dtype):
    x = jnp.ones((2,), dtype)
    if kind == "bitwise" and np.dtype(dtype).kind == "f":
        with pytest.raises(DTypeError, match=f"{op}.*needs integer or bool"):
            dtype_rules.resolve(op, kind, np.dtype(dtype))
        return
    want = (jfn(x) if op in ("exp", "isnan", "floor") else jfn(x, x)).dtype
    params, out = dtype_rules.resolve(op, kind, np.dtype(dtype))
    assert np.dtype(out) == want
    assert len(params) == 1  # the computation dtype is the only parameter


def test_arith_rejects_bool_subtract_naming_the_fix():
    with pytest.raises(DTypeError, match=r"subtract.*bool.*astype\(nx.int32\)"):
        dtype_rules.resolve("subtract", "arith", np.dtype(np.bool_))


@pytest.mark.parametrize("v", [300, -200, 127, -128, 2**31 - 1])
def test_weak_int_wraps_as_jax_does(v):
    want = int((jnp.zeros((), jnp.int8) + v).item())
    assert dtype_rules.weak_int("add", v, np.dtype(np.int8)) == want


def test_weak_int_beyond_int32_must_fit_and_names_the_op():
    assert dtype_rules.weak_int("add", 2**40, np.dtype(np.float32)) == 2**40
    with pytest.raises(OverflowError, match=r"multiply.*Python int 1099511627776.*int16"):
        dtype_rules.weak_int("multiply", 2**40, np.dtype(np.int16))

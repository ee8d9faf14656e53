"""The errors of the control-flow functions (control_flow/checks.py): carries, branch results,
arguments, and Python control flow on tensors naming ``nx.cond``."""

from __future__ import annotations

import re

import numpy as np
import pytest

import nablax as nx
from nablax.errors import ConcretizationError, GraphBreakError

from .programs import (
    ERR,
    _has_shape,
    _r,
)


def test_python_if_inside_body_and_under_vmap_names_cond():
    def body(c, x):
        if (c + x).sum() > 0:
            return c + x, c
        return c - x, c

    with pytest.raises((GraphBreakError, ConcretizationError)) as info:
        nx.scan(body, nx.ones(3), nx.tensor(_r((4, 3))))
    assert "nx.cond" in str(info.value) and "nx.where" in str(info.value), str(info.value)
    with pytest.raises(Exception) as info:
        nx.vmap(lambda x: x if x.sum() > 0 else -x)(nx.tensor(_r((4, 3))))
    assert "nx.cond" in str(info.value) and "nx.where" in str(info.value), str(info.value)


def test_carry_dtype_and_shape_changes_raise():
    xs = nx.tensor(_r((3, 2)))
    with pytest.raises(ERR, match=r"^nx\.scan:") as info:
        nx.scan(
            lambda c, x: ({"h": c["h"] + x, "n": c["n"] + 0.5}, None),
            {"h": nx.zeros(2), "n": nx.tensor(np.int32(0))},
            xs,
        )
    msg = str(info.value)
    assert "['n']" in msg and "int32" in msg and "float32" in msg, msg

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(
            lambda s: s["n"] < 3, lambda s: {"n": s["n"] + 1.5}, {"n": nx.tensor(np.int32(0))}
        )
    msg = str(info.value)
    assert "['n']" in msg and "int32" in msg and "float32" in msg, msg

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(
            lambda s: s["n"] < 3,
            lambda s: {"n": s["n"] + 1, "h": nx.stack([s["h"], s["h"]])},
            {"n": 0, "h": nx.zeros(3)},
        )
    msg = str(info.value)
    assert "['h']" in msg and _has_shape(msg, (3,)) and _has_shape(msg, (2, 3)), msg


def test_cond_branch_mismatches_raise():
    x = nx.tensor(_r(3))

    def same_fn(v):
        return {"out": v}

    def shape_fn(v):
        return {"out": v.sum()}

    def tree_fn(v):
        return {"out": v, "extra": v}

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, same_fn, shape_fn, x)
    msg = str(info.value)
    assert "same_fn" in msg and "shape_fn" in msg and "['out']" in msg, msg
    assert _has_shape(msg, (3,)) and _has_shape(msg, ()), msg

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, same_fn, tree_fn, x)
    assert "same_fn" in str(info.value) and "tree_fn" in str(info.value), str(info.value)

    with pytest.raises(ERR, match=r"^nx\.switch:") as info:
        nx.switch(1, [same_fn, same_fn, shape_fn], x)
    assert "shape_fn" in str(info.value) and "['out']" in str(info.value), str(info.value)

    with pytest.raises(ERR, match=r"^nx\.cond:") as info:
        nx.cond(x.sum() > 0, lambda v: v, lambda v: v.astype(nx.int32), x)
    assert "float32" in str(info.value) and "int32" in str(info.value), str(info.value)


def test_scan_and_while_argument_errors():
    with pytest.raises(ERR, match=r"^nx\.scan:") as info:
        nx.scan(lambda c, x: (c, None), nx.zeros(2), (nx.ones((5, 2)), nx.ones(4)))
    assert re.search(r"\b5\b", str(info.value)) and re.search(r"\b4\b", str(info.value)), str(
        info.value
    )
    with pytest.raises(ERR, match=r"^nx\.scan:"):
        nx.scan(lambda c, x: (c, None), nx.zeros(2), nx.ones((5, 2)), length=3)
    with pytest.raises(ERR, match=r"^nx\.scan:"):
        nx.scan(lambda c, x: (c, None), nx.zeros(2), None)  # neither xs nor length

    def cond_fun(v):
        return v > 0

    with pytest.raises(ERR, match=r"^nx\.while_loop:") as info:
        nx.while_loop(cond_fun, lambda v: v - 1.0, nx.ones(3))
    assert "cond_fun" in str(info.value) and _has_shape(str(info.value), (3,)), str(info.value)

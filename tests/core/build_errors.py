"""Assertions shared by the error tests: errors are raised when an op is built, never later."""

from __future__ import annotations

import re

import pytest

import nablax as nx


def raises_at_build(exc, build, *needles) -> str:
    """``build()`` raises ``exc`` without realizing anything; the message contains ``needles``
    (strings or compiled patterns). Returns the message."""
    before = nx.cache_info().realizations
    with pytest.raises(exc) as e:
        build()
    assert nx.cache_info().realizations == before, "the error was raised at realization"
    msg = str(e.value)
    for n in needles:
        assert n.search(msg) if isinstance(n, re.Pattern) else n in msg, f"{n!r} not in {msg!r}"
    return msg


def shape_re(shape) -> re.Pattern:
    """A shape printed as a tuple ``(2, 3)`` or a list ``[2, 3]``."""
    inner = r",\s*".join(str(d) for d in shape)
    return re.compile(rf"[\(\[]{inner},?[\)\]]")

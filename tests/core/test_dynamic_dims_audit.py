"""Issue 35, finding 5: under ``nx.compile(dynamic_dims=...)`` the *text* of a symbolic size
(``str``, ``repr``, f-strings, ``%`` formatting, ``str(x.shape)``) was the symbol's name ``"n"``
for every size, and ``nx.arange(x.shape[0])`` crashed with JAX's ``dim_as_value`` error. Every
case runs the compiled function on a sweep of sizes and compares values, shapes, dtypes and Python
outputs with running it eagerly on each size."""

from __future__ import annotations

import json
import logging
import math
import operator
import pickle
import sys
import traceback
import warnings

import jax
import numpy as np
import pytest

import nablax as nx
import nablax.nn.functional as F
from nablax.errors import ShapeError

SIZES = (4, 1, 2, 3, 7)  # the first call traces; then 1, even, odd, prime
DYN = {0: {0: "n"}}


def _x(n: int, cols: int = 3) -> nx.Tensor:
    return nx.tensor(np.arange(n * cols, dtype=np.float32).reshape(n, cols) / 7 - 1)


def _assert_same(got, want, n):
    got_leaves, got_def = jax.tree_util.tree_flatten(got, is_leaf=lambda v: v is None)
    want_leaves, want_def = jax.tree_util.tree_flatten(want, is_leaf=lambda v: v is None)
    assert got_def == want_def, (n, got_def, want_def)
    for g, w in zip(got_leaves, want_leaves):
        if isinstance(w, nx.Tensor):
            assert isinstance(g, nx.Tensor), (n, g)
            assert (g.shape, g.dtype) == (w.shape, w.dtype), (n, g.shape, w.shape, g.dtype)
            # exact: arange values and x * 2 / x * int are exact in every dtype used here
            np.testing.assert_array_equal(g.numpy(), w.numpy())
        else:
            assert type(g) is type(w) and g == w, (n, g, w)


def _sweep(fn, sizes=SIZES):
    """Compile ``fn``, call it on every size (twice), compare with eager; return the compiled
    function and the messages of nx.compile's warnings."""
    f = nx.compile(fn, dynamic_dims=DYN)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            for n in sizes:
                x = _x(n)
                _assert_same(f(x), fn(x), n)
    return f, [str(w.message) for w in caught if "nx.compile(" in str(w.message)]


def _per_size(f, msgs, sizes=SIZES):
    assert len(msgs) == 1, msgs
    assert "each size is traced on its own" in msgs[0].lower(), msgs[0]
    assert "test_dynamic_dims_audit.py:" in msgs[0], msgs[0]  # names the user's line
    info = f.cache_info()
    # one abandoned symbolic trace, then one trace per size
    assert (info.traces, info.executables) == (len(sizes) + 1, len(sizes)), info


# ---- the text of a size is a size-dependent decision: per-size traces, each size's text ------


def _n(x):
    return x.shape[0]


TEXT = {
    "str": lambda x: (x * 2, str(_n(x))),
    "repr": lambda x: (x * 2, repr(_n(x))),
    "fstring": lambda x: (x * 2, f"{_n(x)}"),
    "fstring_expr": lambda x: (x * 2, f"rows={_n(x) // 2}"),
    "format": lambda x: (x * 2, format(_n(x))),
    "str_format": lambda x: (x * 2, "{}-{}".format(_n(x), 3)),  # noqa: UP032
    "percent_s": lambda x: (x * 2, "%s" % (_n(x),)),  # noqa: UP031
    "str_shape": lambda x: (x * 2, str(x.shape)),
    "repr_shape": lambda x: (x * 2, repr(x.shape)),
    "fstring_shape": lambda x: (x * 2, f"{x.shape}"),
    "str_list": lambda x: (x * 2, str(list(x.shape))),
    "join": lambda x: (x * 2, "x".join(map(str, x.shape))),
    # a string that steers values: the first size's text used to pick for every size
    "string_key": lambda x: x * {"1": 2.0, "3": 3.0, "7": 4.0}.get(str(_n(x)), 1.0),
    "string_len": lambda x: x * len(str(_n(x) * 5)),
}


@pytest.mark.parametrize("name", sorted(TEXT))
def test_text_of_a_size_is_each_sizes_text(name):
    f, msgs = _sweep(TEXT[name])
    _per_size(f, msgs)


def test_warning_names_the_text_decision_and_the_line():
    def f(x):
        tag = str(x.shape[0])
        return x * 2, tag

    g, msgs = _sweep(f)
    _per_size(g, msgs)
    assert "`str(n)`" in msgs[0] and "(tag = str(x.shape[0]))" in msgs[0], msgs[0]


# ---- siblings: conversions that need the value; all per size, with each size's result -------


SIBLINGS = {
    "format_d": lambda x: (x * 2, f"{_n(x):d}"),
    "percent_d": lambda x: (x * 2, "%d" % _n(x)),  # noqa: UP031
    "percent_05d": lambda x: (x * 2, "%05d" % _n(x)),  # noqa: UP031
    "int": lambda x: x * int(_n(x)),
    "operator_index": lambda x: x * operator.index(_n(x)),
    "range": lambda x: x * len(range(_n(x))),
    "len": lambda x: x * len(x),
    "bytes": lambda x: (x * 2, bytes(_n(x))),
    "hash": lambda x: (x * 2, hash(_n(x))),
    "json": lambda x: (x * 2, json.dumps(_n(x))),
    "json_shape": lambda x: (x * 2, json.dumps(x.shape)),
    "lt_float": lambda x: x * 2 if _n(x) < 2.5 else x,
    "eq_float": lambda x: x * 2 if _n(x) == 3.0 else x,
    "not_int": lambda x: x * (_n(x) if isinstance(_n(x), int) else operator.index(_n(x)) + 1),
    "raise_not_int": lambda x: x * _int_only(_n(x)),
    "float_format": lambda x: (x * 2, f"{_n(x) * 1.0:.1f}"),
    "pickle": lambda x: (x * 2, pickle.dumps(_n(x))),
    "pickle_shape": lambda x: (x * 2, pickle.dumps(x.shape)),
}


def _int_only(n):
    if not isinstance(n, int):  # a Size is not an int: the TypeError falls back per size
        raise TypeError(f"expected an int, got {type(n).__name__}")
    return n


@pytest.mark.parametrize("name", sorted(SIBLINGS))
def test_conversions_needing_the_value_are_each_sizes(name):
    f, msgs = _sweep(SIBLINGS[name])
    assert len(msgs) == 1 and f.cache_info().traces == len(SIZES) + 1, msgs


def test_size_arithmetic_and_math_prod_keep_one_trace():
    f, msgs = _sweep(lambda x: (x.reshape(1, math.prod(x.shape)), x * (_n(x) - 1) + _n(x) // 2))
    assert msgs == [] and f.cache_info().traces == 1


def test_a_size_is_not_an_int():
    # documented (compile's docstring, docs/api.md): as JAX's symbolic dimensions
    seen = []
    f = nx.compile(lambda x: seen.append(isinstance(x.shape[0], int)) or x * 2, dynamic_dims=DYN)
    assert f(_x(3)).shape == (3, 3) and f(_x(5)).shape == (5, 3)
    assert seen == [False] and f.cache_info().traces == 1


# ---- nablax's own messages read a size's text without a decision -----------------------------


def test_nablax_messages_do_not_fall_back():
    def f(x):
        try:  # nablax.nn formats both shapes into its ShapeError
            F.mse_loss(x, x[:, :2])
        except ShapeError as e:
            ok = "mse_loss" in str(e)
        return x * 2, ok

    g, msgs = _sweep(f)
    assert msgs == [] and g.cache_info().traces == 1


def test_messages_of_nablax_modules_format_sizes_without_a_decision():
    # code of any nablax module (here one defined under such a name) formats sizes for its
    # messages, also with a string format spec; the user's code doing the same falls back
    ns = {"__name__": "nablax._audit_message_module"}
    exec(  # noqa: S102 - a function whose module is a nablax one
        "def message(x):\n    return f'{x.shape[0]:>4}|{x.shape}|' + repr(x.shape[0])\n", ns
    )
    seen = []
    f, msgs = _sweep(lambda x: seen.append(ns["message"](x)) or x * 2)
    assert msgs == [] and f.cache_info().traces == 1
    assert seen[0] == "   n|(n, 3)|n" and seen[1] == "   4|(4, 3)|4"  # trace, then eager


def test_log_records_show_the_symbol_without_falling_back(caplog):
    # a log line is a message, like nablax's own: the trace logs the symbolic shape once
    log = logging.getLogger("nablax.test_dynamic_dims_audit")
    f, msgs = _sweep(lambda x: log.warning("rows %s of %s", x.shape[0], x.shape) or x * 2)
    assert msgs == [] and f.cache_info().traces == 1
    assert "rows n of (n, 3)" in caplog.messages and "rows 7 of (7, 3)" in caplog.messages


def test_print_of_a_shape_prints_each_sizes_shape(capsys):
    # (print("shape", x.shape) would also write "shape " in the abandoned symbolic trace)
    f = nx.compile(lambda x: print(f"shape {x.shape}") or x * 2, dynamic_dims=DYN)
    with pytest.warns(UserWarning, match="traced on its own"):
        f(_x(3))
    f(_x(5))
    f(_x(3))  # a hit: no trace, no print
    assert capsys.readouterr().out.splitlines() == ["shape (3, 3)", "shape (5, 3)"]


def test_debugger_views_show_the_symbol_without_falling_back():
    # tracebacks with locals (and pdb / IPython / debugpy) repr a size to show it, not to use it
    views = []

    def local_view(n):  # what a traceback with locals shows for this frame's `n`
        here = sys._getframe()
        stack = traceback.StackSummary.extract([(here, here.f_lineno)], capture_locals=True)
        return stack[0].locals["n"]

    def f(x):
        n = x.shape[0]
        views.append(local_view(n))
        return x * n

    g, msgs = _sweep(f)
    assert msgs == [] and g.cache_info().traces == 1
    assert views[0] == "n" and views[1:] == [repr(k) for k in SIZES * 2]  # then eager calls


def test_a_kept_size_shows_its_symbol():
    # past its trace a size stands for no call: its text is the symbol (a debugger, a log)
    kept = []
    nx.compile(lambda x: kept.append(x.shape) or x, dynamic_dims=DYN)(_x(3))
    assert (str(kept[0]), repr(kept[0][0]), f"{kept[0][0]}") == ("(n, 3)", "n", "n")


# ---- nx.arange with a symbolic size --------------------------------------------------------


ARANGE_ONE_TRACE = {
    "n": lambda x: nx.arange(_n(x)),
    "start_n": lambda x: nx.arange(2, _n(x)),  # empty for n <= 2
    "n_step": lambda x: nx.arange(_n(x), step=2),
    "n_down": lambda x: nx.arange(_n(x), -1, -3),
    "half_to_n": lambda x: nx.arange(_n(x) // 2, _n(x) + 1),
    "minus_n": lambda x: nx.arange(-_n(x), 0),
    "float32": lambda x: nx.arange(_n(x), dtype=nx.float32) * 0.5,
    "as_index": lambda x: x * nx.arange(1, _n(x) + 1)[:, None],
    "with_x": lambda x: x[nx.arange(_n(x) - 1, -1, -1)],
}


@pytest.mark.parametrize("name", sorted(ARANGE_ONE_TRACE))
def test_arange_of_a_size_serves_every_size(name):
    f, msgs = _sweep(ARANGE_ONE_TRACE[name])
    assert msgs == [] and f.cache_info().traces == 1, msgs


ARANGE_PER_SIZE = {
    # values could leave int32 for some sizes (eager raises OverflowError there)
    "scaled": lambda x: nx.arange(0, _n(x) * 1000, 1000),
    "float_step": lambda x: nx.arange(0, _n(x), 0.5),
    "int8": lambda x: nx.arange(_n(x), dtype=nx.int8),
    "size_step": lambda x: nx.arange(0, 12, _n(x)),
}


@pytest.mark.parametrize("name", sorted(ARANGE_PER_SIZE))
def test_arange_that_cannot_serve_every_size_falls_back(name):
    f, msgs = _sweep(ARANGE_PER_SIZE[name])
    _per_size(f, msgs)
    assert "nx.arange(" in msgs[0]

"""Programs are resources (DESIGN.md convention 17): the realization cache is bounded by count
(option ``max_executables``) and by the process's memory mappings, an evicted program's memory is
released, and a line that keeps compiling new programs gets one warning naming what changes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import nablax as nx
from nablax import _config
from nablax.core import host_limits, realize, recompiles


def test_default_bound_is_at_most_256():
    assert 0 < _config.options()["max_executables"].default <= 256


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux /proc")
def test_hundreds_of_programs_in_one_process_release_their_memory():
    code = textwrap.dedent(
        """
        import gc, weakref
        import nablax as nx
        from nablax.core import host_limits, realize
        nx.config.update("max_executables", 8)
        nx.config.update("recompile_warning", 0)
        refs = []
        counts = []
        base = host_limits.map_count()
        for n in range(1, 161):
            x = nx.ones((n,))
            for k in range(4):
                x = nx.tanh(x) * float(k) + nx.sin(x)
            assert abs(x.sum().item()) >= 0
            refs.append(weakref.ref(next(reversed(realize._S.cache.values())).baked_fn))
            if n % 40 == 0:
                gc.collect()
                counts.append(host_limits.map_count() - base)
        info = nx.cache_info()
        alive = sum(r() is not None for r in refs)
        print(info.executables, info.evictions, alive, counts)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    executables, evictions, alive, counts = out.stdout.strip().split(" ", 3)
    assert int(executables) <= 8 and int(evictions) >= 152
    assert int(alive) <= 8  # evicted programs are really dropped (their code unmapped)
    growth = [int(c) for c in counts.strip("[]").split(",")]
    # the mappings stay flat once the cache is full: no growth from the 80th to the 160th program
    assert growth[-1] - growth[1] < 200, growth


def test_eviction_under_memory_map_pressure(monkeypatch):
    nx.clear_caches()
    monkeypatch.setattr(host_limits, "PRESSURE_FRACTION", 0.0)  # always "near the limit"
    with _config.override(max_executables=100, recompile_warning=0):
        for n in range(1, 30):
            assert (nx.ones(n) * 3).sum().item() == 3.0 * n
        assert nx.cache_info().executables <= 5
        assert nx.cache_info().evictions >= 20


def test_evicted_structure_recompiles_with_the_right_value():
    nx.clear_caches()
    with _config.override(max_executables=2, recompile_warning=0):
        vals = []
        for n in (3, 4, 5, 3, 4, 5):
            vals.append((nx.arange(n) * 2).sum().item())
    assert vals == [6, 12, 20, 6, 12, 20]


def _changing_shapes(count: int):
    out = []
    for n in range(1, count + 1):
        out.append((nx.ones(n) + 1).sum().item())  # one line, a new shape each time
    return out


def test_a_line_that_keeps_compiling_warns_once_naming_the_change():
    nx.clear_caches()
    recompiles._sites.clear()
    recompiles._warned.clear()
    with _config.override(recompile_warning=3), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert _changing_shapes(8) == [2.0 * n for n in range(1, 9)]
    msgs = [str(x.message) for x in w if "compiled" in str(x.message)]
    assert len(msgs) == 1, msgs
    assert "test_programs_bounded.py" in msgs[0]
    assert "broadcast_in_dim" in msgs[0] and "(3,)" in msgs[0] and "(4,)" in msgs[0]


def test_python_int_loops_do_not_warn():
    nx.clear_caches()
    recompiles._sites.clear()
    recompiles._warned.clear()
    x = nx.tensor(np.arange(40.0).reshape(20, 2))
    with _config.override(recompile_warning=2), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = [x[i].sum().item() for i in range(20)]
    assert got == [float(4 * i + 1) for i in range(20)]
    assert not [x for x in w if "compiled" in str(x.message)]
    assert nx.cache_info().compiles <= 2


def test_a_line_reading_unrelated_graphs_does_not_warn():
    nx.clear_caches()
    recompiles._sites.clear()
    recompiles._warned.clear()
    ops = [nx.exp, nx.sin, nx.cos, nx.tanh, nx.sqrt, nx.abs, nx.negative, nx.square, nx.log1p]
    with _config.override(recompile_warning=2), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        vals = [op(nx.ones(3)).sum().item() for op in ops]  # one line, nine unrelated programs
    assert not [x for x in w if "compiled" in str(x.message)]
    np.testing.assert_allclose(vals[0], 3 * np.e, rtol=1e-6)


def test_warning_can_be_turned_off():
    nx.clear_caches()
    recompiles._sites.clear()
    recompiles._warned.clear()
    with _config.override(recompile_warning=0), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _changing_shapes(12)
    assert not [x for x in w if "compiled" in str(x.message)]


def test_describe_names_shape_and_parameter_changes():
    nx.clear_caches()
    keys = []
    orig = recompiles.note
    try:
        recompiles.note = keys.append  # type: ignore[assignment]
        nx.tensor(np.ones(3, np.float32)).sum().item()
        nx.tensor(np.ones(4, np.float32)).sum().item()
    finally:
        recompiles.note = orig
    assert len(keys) == 2
    assert "input 0 changed from array float32[3] to array float32[4]" in recompiles.describe(
        keys[0], keys[1]
    )
    assert realize._S.cache  # the programs themselves were cached as usual


def test_describe_names_an_array_read_twice():
    # one structure, with w read by its marker and its update, then w's marker and v's update
    nx.clear_caches()
    keys = []
    orig = recompiles.note
    grad = nx.value_and_grad(lambda w: (w * w).sum())
    w = nx.tensor(np.arange(3, dtype=np.float32))
    v = nx.tensor(np.ones(3, np.float32))
    try:
        recompiles.note = keys.append  # type: ignore[assignment]
        for upd in (w, v):
            loss, g = grad(w)
            new = upd - 0.1 * g
            loss.item()
            np.testing.assert_allclose(new.numpy(), upd.numpy() - 0.2 * np.arange(3), rtol=1e-6)
    finally:
        recompiles.note = orig
    assert len(keys) == 2
    assert "changed from the array of leaf argument 0 again to array float32[3]" in (
        recompiles.describe(keys[0], keys[1])
    )


def test_kernel_executor_specs_are_bounded_too():
    from nablax.kernels import library
    from nablax.kernels.executor import default_executor

    ex = default_executor()
    with _config.override(max_executables=3, recompile_warning=0):
        for n in range(1, 9):
            a = np.ones((n, 2), np.float32)
            out = library.matmul(nx.tensor(a), nx.tensor(np.ones((2, 3), np.float32))).numpy()
            np.testing.assert_allclose(out, np.full((n, 3), 2.0))
        assert len(ex._specs) <= 3 and len(ex._memo) <= 3

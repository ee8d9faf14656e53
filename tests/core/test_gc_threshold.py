"""core/gc_threshold.py: the collector's young threshold follows the option ``gc_threshold``."""

from __future__ import annotations

import gc
import weakref

import pytest

import nablax as nx
from nablax import _config
from nablax.core import gc_threshold
from nablax.errors import ConfigError


@pytest.fixture
def fresh(monkeypatch):
    """A process where nablax has not touched the collector yet; the test's threshold is put
    back afterwards, whatever it did."""
    saved = gc.get_threshold()
    monkeypatch.setattr(gc_threshold, "_state", {"option": None, "previous": None, "applied": None})
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*saved)
    nx.config.reload()


def test_first_compile_raises_the_young_threshold_only(fresh):
    nx.config.update("gc_threshold", 5000)
    assert gc_threshold.apply() is True
    assert gc.get_threshold() == (5000, 10, 10)
    assert gc_threshold.apply() is False  # once per option value
    assert gc.get_threshold() == (5000, 10, 10)


def test_a_higher_user_threshold_is_kept(fresh):
    gc.set_threshold(50000, 20, 20)
    nx.config.update("gc_threshold", 5000)
    assert gc_threshold.apply() is False
    assert gc.get_threshold() == (50000, 20, 20)


def test_a_later_user_setting_is_not_overridden(fresh):
    nx.config.update("gc_threshold", 5000)
    gc_threshold.apply()
    gc.set_threshold(700, 10, 10)  # the user decides afterwards
    assert gc_threshold.apply() is False
    assert gc.get_threshold() == (700, 10, 10)
    nx.config.update("gc_threshold", 0)  # turning it off leaves the user's choice too
    assert gc_threshold.apply() is False
    assert gc.get_threshold() == (700, 10, 10)


def test_turning_it_off_restores_what_was_replaced(fresh):
    gc.set_threshold(900, 11, 12)
    nx.config.update("gc_threshold", 5000)
    gc_threshold.apply()
    assert gc.get_threshold() == (5000, 11, 12)
    nx.config.update("gc_threshold", 0)
    assert gc_threshold.apply() is True
    assert gc.get_threshold() == (900, 11, 12)


def test_off_from_the_start_touches_nothing(fresh):
    nx.config.update("gc_threshold", 0)
    assert gc_threshold.apply() is False
    assert gc.get_threshold() == (700, 10, 10)


def test_a_compile_applies_it(fresh):
    nx.config.update("gc_threshold", 4321)
    nx.clear_caches()
    (nx.ones(7) * 3).sum().item()
    assert gc.get_threshold()[0] == 4321


def test_garbage_cycles_are_still_collected(fresh):
    nx.config.update("gc_threshold", 2000)
    gc_threshold.apply()
    gc.collect()

    class Cycle:
        pass

    freed = []
    for i in range(5000):  # 5000 cycles of 2 objects: past the threshold several times
        a, b = Cycle(), Cycle()
        a.other, b.other = b, a
        if i == 0:
            first = weakref.ref(a, lambda _: freed.append(True))
        del a, b
    assert freed == [True] and first() is None  # by the collector itself, no gc.collect()


def test_scoped_override_is_refused():
    with pytest.raises(ConfigError):
        with _config.override(gc_threshold=0):
            pass


def test_negative_values_are_refused():
    with pytest.raises(ConfigError, match="gc_threshold"):
        nx.config.update("gc_threshold", -1)

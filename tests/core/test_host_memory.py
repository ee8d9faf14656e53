"""core/host_memory.py: glibc's malloc thresholds follow the option ``retain_host_memory``."""

from __future__ import annotations

import pytest

import nablax as nx
from nablax import _config
from nablax.core import host_memory
from nablax.errors import ConfigError


class _FakeMallopt:
    def __init__(self):
        self.calls = []

    def __call__(self, param, value):
        self.calls.append((param, value))
        return 1


@pytest.fixture
def fake(monkeypatch):
    f = _FakeMallopt()
    monkeypatch.setattr(host_memory, "_libc", [f])
    monkeypatch.setattr(host_memory, "_state", {"applied": None})
    yield f
    nx.config.reload()


def test_first_compile_retains_and_later_ones_do_nothing(fake):
    nx.config.update("retain_host_memory", True)
    assert host_memory.apply() is True
    assert sorted(fake.calls) == sorted(host_memory.RETAINED.items())
    assert host_memory.apply() is False  # once per process
    assert len(fake.calls) == 2


def test_turning_it_off_restores_the_defaults(fake):
    nx.config.update("retain_host_memory", True)
    host_memory.apply()
    nx.config.update("retain_host_memory", False)
    assert host_memory.apply() is True
    assert sorted(fake.calls[2:]) == sorted(host_memory.DEFAULTS.items())


def test_off_from_the_start_touches_nothing(fake):
    nx.config.update("retain_host_memory", False)
    assert host_memory.apply() is False
    assert fake.calls == []


def test_without_glibc_nothing_happens(monkeypatch):
    monkeypatch.setattr(host_memory, "_libc", [None])
    monkeypatch.setattr(host_memory, "_state", {"applied": None})
    assert host_memory.apply() is False


def test_a_compile_applies_it(fake):
    nx.config.update("retain_host_memory", True)
    nx.clear_caches()
    (nx.ones(7) * 3).sum().item()
    assert sorted(fake.calls) == sorted(host_memory.RETAINED.items())


def test_scoped_override_is_refused():
    with pytest.raises(ConfigError):
        with _config.override(retain_host_memory=False):
            pass


def test_the_real_glibc_accepts_the_values():
    fn = host_memory._mallopt()
    if fn is None:
        pytest.skip("not glibc")
    for param, value in host_memory.RETAINED.items():
        assert fn(param, value) == 1

"""The in-memory caches of the kernel layer are registered ``nablax._caches`` caches (store/live.py,
store/fingerprint.py, executor.py): ``nx.cache_info()`` counts them, ``nx.clear_caches()`` empties
every one of them (issue 39), and the executor's memos stay bounded by ``max_executables``."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx
from nablax import _caches, _config
from nablax.kernels import (
    AutotunePolicy,
    ConfigCache,
    ConfigSelectorChain,
    Executor,
    Kernel,
    PersistentCache,
    device_fingerprint,
)
from nablax.kernels.store import fingerprint

DEV, OP = "cpu|live-test", "scale@v1"


@dataclasses.dataclass(frozen=True)
class ScaleCfg:
    scale: float = 2.0


class Scale(Kernel):
    def run(self, x, *, cfg):
        return x * cfg.scale

    def heuristic_cfg(self, inv):
        return ScaleCfg()


def _executor() -> Executor:
    return Executor(
        ConfigSelectorChain(policy=AutotunePolicy(allow_autotune=False), persistent=False)
    )


KERNEL_CACHES = (
    "kernels.executor",
    "kernels.config_caches",
    "kernels.persistent_decoded",
    "kernels.device_fingerprint",
)


def test_clear_caches_empties_every_kernel_layer_cache(tmp_path):
    ex = _executor()  # not the default executor: every live one is counted and cleared
    for n in (3, 4, 5):
        np.testing.assert_allclose(ex(Scale("scale"), jnp.ones(n)), np.full(n, 2.0))
    own = ConfigCache(max_entries=8)
    own.put(DEV, OP, "k1", ScaleCfg(3.0))
    store = PersistentCache(tmp_path / "kernels.sqlite")
    store.put(DEV, OP, "k1", ScaleCfg(4.0))
    assert PersistentCache(store.path).get(DEV, OP, "k1") == ScaleCfg(4.0)
    assert store.get(DEV, OP, "k1") == ScaleCfg(4.0)
    device_fingerprint()

    info = nx.cache_info()
    assert set(KERNEL_CACHES) <= set(info)
    sizes = {name: info[name].size for name in KERNEL_CACHES}
    assert all(size > 0 for size in sizes.values()), sizes
    assert len(ex._memo) == 3 and len(ex._specs) == 3 and len(ex.chooser.cache) == 3

    nx.clear_caches()
    info = nx.cache_info()
    assert {name: info[name].size for name in KERNEL_CACHES} == dict.fromkeys(KERNEL_CACHES, 0)
    assert len(ex._memo) == len(ex._specs) == len(ex.chooser.cache) == len(own) == 0
    assert own.stats()["hits"] == own.stats()["misses"] == 0
    assert len(store._decoded) == 0 and len(fingerprint._memo) == 0
    # what the caches held is made again, and the persistent database kept its entry
    assert store.get(DEV, OP, "k1") == ScaleCfg(4.0)
    assert device_fingerprint().startswith(("cpu", "gpu", "tpu"))
    np.testing.assert_allclose(ex(Scale("scale"), jnp.ones(3)), np.full(3, 2.0))
    store.close()


def test_executor_memos_are_bounded_by_max_executables():
    ex = _executor()
    kernel = Scale("scale")
    with _config.override(max_executables=2):
        for n in range(1, 6):
            np.testing.assert_allclose(ex(kernel, jnp.ones(n)), np.full(n, 2.0))
        assert len(ex._memo) == 2 and len(ex._specs) == 2
        assert ex._memo.info().evictions == 3 and ex._specs.info().evictions == 3
        ex(kernel, jnp.ones(5))  # the most recent shape is kept: a memo hit, no new spec
        assert ex._memo.info().hits == 1 and len(ex._specs) == 2
    stats = nx.cache_info()["kernels.executor"]
    assert stats.size >= 4 and stats.evictions >= 6


@pytest.mark.parametrize("name", KERNEL_CACHES)
def test_kernel_caches_are_registered_once(name):
    assert name in _caches.infos()
    with pytest.raises(ValueError, match="already registered"):
        _caches.register(name, lambda: None, lambda: None)

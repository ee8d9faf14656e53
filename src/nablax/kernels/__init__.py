"""``nablax.kernels``: heavy operations as tunable ``Kernel``s.

A :class:`Kernel` has several implementations (per platform and context) and a frozen config.
An :class:`Executor` prepares a call, asks its :class:`ConfigSelectorChain` for the config
(explicit ``cfg=`` → ``overlay_cache`` → memory :class:`ConfigCache` → :class:`PersistentCache`
(SQLite) → autotune with the :class:`Tuner` → heuristic → :class:`NoConfigError`), runs the most
specific implementation with a custom VJP, and stamps the call in the lowered HLO. Bundled kernels
live in :mod:`nablax.kernels.library` (``matmul``, ``attention``).

Kernels written for ejKernel run unchanged where its public API is concerned: a string
``version`` (``"1"`` and ``1`` both give ``op@v1``), ``AutotunePolicy(cache_miss_fallback=
"heuristics")``, the executor's ``stamp=`` / ``check_vma=`` / ``_cfg=`` keywords,
``Executor.choose_config`` and ``stamp_prefix``, ``Invocation.batch_axes`` / ``stamp`` /
``versioned_op_id``, and ``Tuner.measure`` / ``Tuner.autotune`` (a tuner overriding them drives the
chain). Where nablax differs, it is safer: an explicit config is never persisted, and tuning keeps
the heuristic's config unless a candidate is clearly faster (``AutotunePolicy(min_gain=0)`` for
ejKernel's "fastest wins").

Module map: ``kernel.py`` (base class, dispatch), ``invocation.py`` (call keys), ``selection.py``
(chain, policy, overlay), ``tuner.py``, ``store/`` (the config store: memory + SQLite caches,
device fingerprint; ``cache.py`` re-exports it), ``executor.py``, ``_call.py`` (the JAX callable
of a call), ``library/``. This layer does not
import nablax core; core registers its Tensor type and the ``kernel_call`` graph node
(``nablax/core/ops/kernel_call.py``) with the executor when it is imported.

>>> import jax.numpy as jnp
>>> from nablax.kernels import library
>>> library.matmul(jnp.ones((2, 3)), jnp.ones((3, 4))).tolist()[0]
[3.0, 3.0, 3.0, 3.0]
"""

from ..errors import NoConfigError
from .cache import CacheEntry, ConfigCache, PersistentCache
from .executor import Executor, default_executor
from .invocation import Invocation
from .kernel import Kernel
from .selection import (
    AutotunePolicy,
    Choice,
    ConfigSelectorChain,
    overlay_cache,
    policy_override,
)
from .store.fingerprint import device_fingerprint, get_device_platform
from .tuner import CandidateTiming, Tuner, TuneResult

__all__ = [
    "AutotunePolicy",
    "CacheEntry",
    "CandidateTiming",
    "Choice",
    "ConfigCache",
    "ConfigSelectorChain",
    "Executor",
    "Invocation",
    "Kernel",
    "NoConfigError",
    "PersistentCache",
    "TuneResult",
    "Tuner",
    "default_executor",
    "device_fingerprint",
    "get_device_platform",
    "overlay_cache",
    "policy_override",
]

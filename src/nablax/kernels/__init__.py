"""``nablax.kernels``: heavy operations as tunable ``Kernel``s.

A :class:`Kernel` has several implementations (per platform and context) and a frozen config.
An :class:`Executor` prepares a call, asks its :class:`ConfigSelectorChain` for the config
(explicit ``cfg=`` → ``overlay_cache`` → memory :class:`ConfigCache` → :class:`PersistentCache`
(SQLite) → autotune with the :class:`Tuner` → heuristic → :class:`NoConfigError`), runs the most
specific implementation with a custom VJP, and stamps the call in the lowered HLO. Bundled kernels
live in :mod:`nablax.kernels.library` (``matmul``, ``attention``).

Module map: ``kernel.py`` (base class, dispatch), ``invocation.py`` (call keys), ``selection.py``
(chain, policy, overlay), ``tuner.py``, ``cache.py`` (memory + SQLite), ``executor.py``,
``fingerprint.py``, ``_call.py`` (the JAX callable of a call), ``library/``. This layer does not
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
from .fingerprint import device_fingerprint, get_device_platform
from .invocation import Invocation
from .kernel import Kernel
from .selection import (
    AutotunePolicy,
    Choice,
    ConfigSelectorChain,
    overlay_cache,
    policy_override,
)
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

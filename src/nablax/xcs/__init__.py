"""``nablax.xcs``: run programs that mix LLM / HTTP / file calls with tensor code.

Each function is classified (:func:`classify`: tensor, orchestration, hybrid or pure) and the
transforms route it to the engine that suits it: XLA through nablax or JAX for tensor code, a
concurrent executor for orchestration, both for hybrids.

- :func:`jit`: orchestration calls inside the function run as futures, concurrently by data flow,
  each exactly once, with results equal to plain sequential Python (``f.last_plan()``,
  ``f.stats()``).
- :func:`vmap` / :func:`pmap`: tensor functions are vectorized (``nx.vmap`` / ``jax.vmap`` /
  ``jax.pmap``); everything else maps items concurrently, in input order.
- :func:`grad`: gradients of tensor and hybrid functions; orchestration raises :class:`XCSError`.

Module map: ``markers.py`` (mark_*), ``classify/`` (the classifier: ``classify/analysis.py``
holds classify and analyze_operations; the package docstring lists its modules),
``runtime.py`` (is_tensor_value), ``futures.py`` (pending values), ``rewrite.py``
(call interception for jit), ``engine.py`` (the jit scheduler, its sequential rule and plan),
``jit.py`` (jit), ``scheduler.py`` (thread pools, help-while-waiting), ``transforms.py`` (vmap,
pmap, grad), ``stacking.py`` (per-item results), ``hybrid.py`` (orchestration calls inside
``jax.grad``), ``loopback.py`` (a local OpenAI-compatible server for tests, demos and benchmarks),
``_context.py`` (the per-thread state of xcs in one object, and the process-wide state named).

>>> from nablax import xcs
>>> import numpy as np
>>> xcs.classify(np.add).kind
'tensor'
"""

from ..errors import XCSError
from .classify.analysis import Classification, OperationSummary, analyze_operations, classify
from .engine import Plan, PlanNode, Stats
from .jit import jit
from .markers import mark_hybrid, mark_orchestration, mark_pytree_safe, mark_tensor
from .runtime import has_tensor_values, is_tensor_value
from .transforms import grad, pmap, vmap

__all__ = [
    "Classification",
    "OperationSummary",
    "Plan",
    "PlanNode",
    "Stats",
    "XCSError",
    "analyze_operations",
    "classify",
    "grad",
    "has_tensor_values",
    "is_tensor_value",
    "jit",
    "mark_hybrid",
    "mark_orchestration",
    "mark_pytree_safe",
    "mark_tensor",
    "pmap",
    "vmap",
]

"""``nx.compile``, one module per concept:

- ``compiled``: :class:`Compiled`, the compiled function (trace once per signature, then call
  the XLA executable directly) and ``nx.compile`` itself;
- ``entry``: one stored signature (:class:`Entry`) and the fast key a repeated call is found by;
- ``checks``: argument checks and messages (static arguments, graph breaks);
- ``info``: what ``nx.compile`` reports (``f.cache_info()``, the ``compile.executables`` entry
  of ``nx.cache_info()``);
- ``scalars``: Python numbers passed under ``nx.compile``, traced as weakly typed 0-d values.

Shared with the other staged transforms, and so one level up in ``core/transforms``:
``staging.py`` (staging a function into one XLA program: ``nx.compile`` and ``nx.shard_map``),
``subprogram.py`` (a staged sub-program as one node: ``nx.shard_map`` and control flow) and
``sizes.py`` (symbolic sizes of ``dynamic_dims``, which the shape ops of ``core/ops`` read too).
"""

from .compiled import Compiled, compile  # noqa: F401, A004 - the public name is nx.compile
from .info import CacheInfo  # noqa: F401

"""Control flow: ``nx.cond``, ``nx.switch``, ``nx.while_loop``, ``nx.fori_loop``, ``nx.scan`` and
``nx.checkpoint``.

Same signatures and semantics as ``jax.lax``. Each call records ONE graph node, whatever its trip
count: the branches and bodies run once per call (eager means eager) on logical placeholders and
are staged into sub-graphs (stage.py); the node lowers to the matching
``jax.lax`` primitive. Outside tensors a body reads become inputs of the node, so gradients reach
them. Every transform sees an ordinary primitive:

- **vmap**: ``jax.vmap`` of the lowering, so a batched predicate turns ``cond`` into a select of
  both branches and ``while_loop`` runs until every example is done, as in JAX;
- **grad / vjp / jvp**: JAX's derivatives of the lowering (``prims._rules.derived_from_jax``),
  whose nodes have the same rules again, so any order works. ``while_loop`` is forward-mode only,
  as in JAX: its reverse mode raises an error naming ``fori_loop`` and ``scan``;
- **compile**: the node is recorded like any other, so both branches are traced once and compiled
  into one program; **shard_map**: the node is replicated within the mapped function.

>>> import nablax as nx
>>> nx.cond(nx.tensor(2.0) > 1, lambda x: x * 10, lambda x: x, nx.tensor(3.0)).item()
30.0
>>> carry, ys = nx.scan(lambda c, x: (c + x, c * x), 0.0, nx.arange(1.0, 4.0))
>>> carry.item(), ys.tolist()
(6.0, [0.0, 2.0, 9.0])
>>> nx.while_loop(lambda i: i < 10, lambda i: i * 2, 1).item()
16

The package, one module per concept:

- ``primitives``: the records ``cond``, ``while_loop``, ``scan``, ``checkpoint`` and their rules;
- ``stage``: staging a branch or body into a logical sub-program (closure conversion);
- ``residuals``: the residual outputs that let a node's backward pass skip the forward loop;
- ``checks``: the checks of operands and carries, with clear errors;
- ``branches``: ``cond`` and ``switch``; ``loops``: ``while_loop``, ``fori_loop``, ``scan``;
- ``checkpoint``: ``nx.checkpoint`` / ``nx.remat``.
"""

from .branches import cond, switch  # noqa: F401
from .checkpoint import checkpoint, remat  # noqa: F401
from .loops import fori_loop, scan, while_loop  # noqa: F401
from .primitives import checkpoint_p, cond_p, scan_p, while_p  # noqa: F401

"""The primitives: nablax's equivalent of ``jax.lax``.

One module per family (elementwise, shape, reduce, index, linalg, random, creation,
window, the optimizers' fused updates and the fused layers). Each declares
its primitives as records (core/primitive.py) holding every rule (shape/dtype, lowering, jvp, vjp,
batching, sharding) in one place, together with the builder functions that bind them. The
NumPy-style composites (``mean``, ``softmax``, ``take_along_axis``, ...) live above, in
``nablax.core.ops``, and import this package, never the reverse.

Rules are written with ``Tensor`` methods and the builders of this layer, so derivatives are lazy
graphs that can be differentiated again. Importing this package registers every primitive.
"""

from . import (  # noqa: F401
    creation,
    elementwise,
    fused,
    fused_nn,
    index,
    linalg,
    random,
    random_more,
    reduce,
    shape,
    window,
)

"""Op families, one file each. Importing this package registers every primitive and gives
``Tensor``'s methods (declared in core/tensor.py) the modules they delegate to.

The ``*_rules`` modules hold the derivative, batching and sharding rules of the elementwise, shape
and index primitives (written with ops of every family, so they sit above all of them): importing
them here installs the rules before any op can be used.
"""

from .. import sharding as _sharding
from .. import tensor as _tensor
from ..transforms import jvp as _jvp  # noqa: F401  (registers Tensor.backward & co)
from ..transforms import vjp as _vjp  # noqa: F401
from . import (  # noqa: F401
    creation,
    elementwise,
    elementwise_rules,
    index,
    index_rules,
    kernel_call,  # the graph node of nablax.kernels calls on Tensors
    linalg,
    nn,
    random,
    reduce,
    shape,
    shape_rules,
)

_tensor.bind_method_modules(
    elementwise=elementwise,
    index=index,
    linalg=linalg,
    nn=nn,
    reduce=reduce,
    shape=shape,
    sharding=_sharding,
    autodiff=_vjp,
)

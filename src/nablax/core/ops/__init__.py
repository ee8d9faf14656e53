"""The NumPy-style functions, one file per family, over the primitives of ``nablax.core.prims``.

Importing this package registers every primitive (through ``prims``) and gives ``Tensor``'s
methods (declared in core/tensor.py) the modules they delegate to.
"""

from .. import hooks as _hooks
from .. import prims as _prims  # noqa: F401  (registers every primitive)
from .. import sharding as _sharding
from ..transforms import jvp as _jvp  # noqa: F401  (registers Tensor.backward & co)
from ..transforms import vjp as _vjp  # noqa: F401
from . import (  # noqa: F401
    creation,
    elementwise,
    index,
    kernel_call,  # the graph node of nablax.kernels calls on Tensors
    linalg,
    masks,
    nabla_compat,
    nn,
    random,
    reduce,
    shape,
)

_hooks.bind_tensor_methods(
    elementwise=elementwise,
    index=index,
    linalg=linalg,
    masks=masks,
    nn=nn,
    reduce=reduce,
    shape=shape,
    sharding=_sharding,
    autodiff=_vjp,
)

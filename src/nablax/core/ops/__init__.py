"""Op families, one file each. Importing this package registers every primitive and method."""

from ..transforms import jvp as _jvp  # noqa: F401  (registers Tensor.backward & co)
from ..transforms import vjp as _vjp  # noqa: F401
from . import (  # noqa: F401
    creation,
    elementwise,
    index,
    kernel_call,  # the graph node of nablax.kernels calls on Tensors
    linalg,
    nn,
    random,
    reduce,
    shape,
)

"""Op families, one file each. Importing this package registers every primitive and method."""

from ..transforms import jvp as _jvp  # noqa: F401  (registers Tensor.backward & co)
from ..transforms import vjp as _vjp  # noqa: F401
from . import creation, elementwise, index, linalg, nn, random, reduce, shape  # noqa: F401

"""Op families, one file each. Importing this package registers every primitive and method."""

from . import creation, elementwise, index, linalg, nn, random, reduce, shape  # noqa: F401

"""``nablax.nn``: layers and models as frozen dataclass pytrees (equinox-style), with PyTorch's
layouts and initialisation.

A model is a tree of modules whose leaves are tensors, so every transform takes it as it is:
``nx.grad(loss)(model, x, y)`` returns a gradient of the model's type, ``nx.compile`` traces a
training step once, ``nx.save(path, model)`` writes its weights. Calling a module runs it eagerly
(lazily recorded, like every nablax op). ``nablax.nn.functional`` holds the functions, with
``torch.nn.functional``'s arguments.

>>> import nablax as nx
>>> from nablax import nn
>>> import nablax.nn.functional as F
>>> model = nn.MLP([4, 16, 3], key=nx.random.key(0))
>>> x, y = nx.ones((8, 4)), nx.zeros(8, dtype=nx.int32)
>>> g = nx.grad(lambda m: F.cross_entropy(m(x), y))(model)
>>> type(g).__name__, g.layers[0].weight.shape
('MLP', (16, 4))
"""

from . import functional
from ._attention import MultiheadAttention
from ._layers import (
    GELU,
    MLP,
    AvgPool2d,
    Conv2d,
    Dropout,
    Embedding,
    Flatten,
    Lambda,
    LayerNorm,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
    Tanh,
)
from ._module import FrozenModuleError, Module, field
from ._norms import RMSNorm

__all__ = [
    "Module",
    "field",
    "FrozenModuleError",
    "Linear",
    "Conv2d",
    "LayerNorm",
    "RMSNorm",
    "Embedding",
    "Dropout",
    "MaxPool2d",
    "AvgPool2d",
    "Flatten",
    "Lambda",
    "ReLU",
    "GELU",
    "Tanh",
    "Sequential",
    "MLP",
    "MultiheadAttention",
    "functional",
]

"""nablax: lazy-eager tensors on XLA, kernels, and orchestration.

>>> import nablax as nx
>>> x = nx.tensor([[1., 2.], [3., 4.]])
>>> (x @ x + 1).sum().item()
58.0
"""

from . import _caches, errors, nn, optim, random, tree
from ._caches import CacheReport, CacheStats
from ._config_object import config
from ._io import block_until_ready, load, save
from .core import realize as _realize_mod
from .core.autocast import autocast
from .core.dtypes import (
    bfloat16,
    bool_,
    complex64,
    float16,
    float32,
    int8,
    int16,
    int32,
    uint8,
    uint32,
)
from .core.ops.creation import (
    arange,
    asarray,
    eye,
    full,
    full_like,
    linspace,
    ones,
    ones_like,
    tensor,
    zeros,
    zeros_like,
)
from .core.ops.elementwise import (
    abs,
    acos,
    acosh,
    add,
    arccos,
    arccosh,
    arcsin,
    arcsinh,
    arctan,
    arctan2,
    arctanh,
    asin,
    asinh,
    astype,
    atan,
    atanh,
    bitwise_and,
    bitwise_or,
    bitwise_xor,
    ceil,
    clip,
    cos,
    cosh,
    divide,
    equal,
    erf,
    exp,
    exp2,
    expm1,
    floor,
    floor_divide,
    greater,
    greater_equal,
    invert,
    isfinite,
    isinf,
    isnan,
    less,
    less_equal,
    log,
    log1p,
    log2,
    log10,
    logical_and,
    logical_not,
    logical_or,
    logical_xor,
    maximum,
    minimum,
    mod,
    multiply,
    negative,
    not_equal,
    power,
    reciprocal,
    remainder,
    round,
    rsqrt,
    sigmoid,
    sign,
    sin,
    sinh,
    sqrt,
    square,
    stop_gradient,
    subtract,
    tan,
    tanh,
    true_divide,
    trunc,
    where,
)
from .core.ops.index import one_hot, take, take_along_axis
from .core.ops.linalg import dot, einsum, matmul, outer
from .core.ops.masks import tril, triu
from .core.ops.nabla_compat import hann_window, minmax
from .core.ops.nn import gelu, log_softmax, relu, silu, softmax, softplus
from .core.ops.reduce import (
    all,
    any,
    argmax,
    argmin,
    argsort,
    cumsum,
    logsumexp,
    max,
    mean,
    min,
    prod,
    sort,
    std,
    sum,
    topk,
    var,
)
from .core.ops.shape import (
    broadcast_to,
    chunk,
    concatenate,
    expand_dims,
    flip,
    moveaxis,
    pad,
    permute,
    ravel,
    repeat,
    reshape,
    split,
    squeeze,
    stack,
    swapaxes,
    tile,
    transpose,
    unbind,
    unsqueeze,
)
from .core.realize import CacheInfo
from .core.realize_api import realize
from .core.sharding import DeviceMesh, DimSpec, ShardingSpec, devices
from .core.tensor import Tensor
from .core.transforms.compile import compile  # noqa: A004 - the public name is nx.compile
from .core.transforms.control_flow import (
    checkpoint,
    cond,
    fori_loop,
    remat,
    scan,
    switch,
    while_loop,
)
from .core.transforms.custom import custom_vjp
from .core.transforms.jacobian import hessian, jacfwd, jacrev
from .core.transforms.jvp import jvp
from .core.transforms.shard_map import shard_map
from .core.transforms.vjp import grad, value_and_grad, vjp
from .core.transforms.vmap import vmap

# isort: split
# after the core: nablax.distributed imports core.sharding, which needs the ops set up first
from . import distributed
from .distributed import process_count, process_index

# isort: split
from .core import jaxlib_bugs as _jaxlib_bugs

_jaxlib_bugs.check()  # a jaxlib release with known wrong answers or crashes: say so at import

__version__ = "0.1.0"


def cache_info() -> CacheReport:
    """Counters of every in-memory cache nablax keeps: a ``dict`` ``{name: nx.CacheStats}``
    (``"realize.executables"``, ``"autodiff.plans"``, ``"compile.executables"`` — the
    executables of every live ``nx.compile`` function, summed — and, once those layers are in
    use, ``"kernels.executor"`` and ``"xcs.classifier"``). Its attributes are the realization
    cache's ``nx.CacheInfo`` fields (``compiles``, ``hits``, ``executables``, ...).

    >>> import nablax as nx
    >>> nx.clear_caches()
    >>> for _ in range(3):
    ...     y = (nx.ones(4) * 2 + 1).sum().item()
    >>> info = nx.cache_info()
    >>> (info.compiles, info.hits), info["realize.executables"].size
    ((1, 2), 1)
    """
    return CacheReport(_caches.infos(), _realize_mod.cache_info())


def clear_caches() -> None:
    """Drop every in-memory cache nablax keeps (every cache ``nx.cache_info()`` lists: compiled
    graph structures, recorded backward passes, the executables of every ``nx.compile``
    function, the per-op memos of dtype promotion and shapes, every kernel executor's compiled
    calls and memory configs, the xcs classifier's results) and reset their counters. The
    persistent kernel database is kept: ``nablax cache clear`` empties it.

    >>> import nablax as nx
    >>> nx.clear_caches()
    >>> nx.cache_info()["realize.executables"].size
    0
    """
    _caches.clear_all()


# Public names: everything imported above except the implementation packages (``core``: the
# internals; ``kernels``/``xcs`` are public subpackages, imported on use: ``from nablax import xcs``).
__all__ = sorted(
    n for n in dir() if not n.startswith("_") and n not in ("annotations", "core", "kernels")
) + ["kernels", "xcs"]

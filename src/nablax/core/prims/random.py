"""Keyed random numbers (``nx.random``), bit-for-bit those of ``jax.random`` with the same key:
the random primitives, their builders and the global key (``bernoulli``: core/ops/random.py).

A key is a ``uint32[2]`` tensor (JAX's raw threefry key data), so keys are ordinary tensors: they can
be split, stored, indexed and (later) batched. Outside ``compile`` the key may be omitted; then a
global key, seeded by :func:`seed`, is split once per call.

>>> import nablax as nx
>>> k1, k2 = nx.random.split(nx.random.key(0))
>>> nx.random.normal(k1, (2, 3)).shape
(2, 3)
"""

from __future__ import annotations

import threading

import jax
import numpy as np

from ...errors import DTypeError, op_error
from .. import dtypes
from ..build import bind, impl_from_array
from ..context import CTX
from ..primitive import primitive
from ..realize import tracing_guard
from ..tensor import Tensor, to_impl
from . import _shard
from ._batch import batched_by_vmap
from ._rules import NONDIFFERENTIABLE
from ._util import norm_shape

__all__ = ["key", "split", "normal", "uniform", "randint", "seed"]


def _key_aval(shape):
    return (shape + (2,), dtypes.uint32)


def _wrap_key(k):
    return jax.random.wrap_key_data(k, impl="threefry2x32")


# Random bits have no derivative (as in JAX); each primitive batches through jax.vmap of its
# lowering and has no useful layout to propose: replicated (correct).
_RULES = dict(
    differentiable=False, **NONDIFFERENTIABLE, rules=batched_by_vmap, shard=_shard.replicated
)

split_p = primitive(
    "random_split",
    lambda params, k: (_key_aval((params[0],)),),
    lambda params, k: jax.random.key_data(jax.random.split(_wrap_key(k), params[0])),
    **_RULES,
)
normal_p = primitive(
    "random_normal",
    lambda params, k: ((params[0], params[1]),),
    lambda params, k: jax.random.normal(_wrap_key(k), params[0], params[1]),
    **_RULES,
)
uniform_p = primitive(
    "random_uniform",
    lambda params, k: ((params[0], params[1]),),
    lambda params, k: jax.random.uniform(_wrap_key(k), params[0], params[1], params[2], params[3]),
    **_RULES,
)
randint_p = primitive(
    "random_randint",
    lambda params, k: ((params[0], params[1]),),
    lambda params, k: jax.random.randint(_wrap_key(k), params[0], params[2], params[3], params[1]),
    **_RULES,
)


def key(seed: int) -> Tensor:
    """A new key from an integer seed (same bits as ``jax.random.PRNGKey(seed)``)."""
    data = jax.random.key_data(jax.random.key(int(seed), impl="threefry2x32"))
    return Tensor._wrap(impl_from_array(data))


class _Seed:
    """The process-wide seed of the global random stream (see :func:`seed`); each thread's
    stream is ``CTX.random_key`` (of seed generation ``CTX.random_generation``, core/context.py).
    """

    def __init__(self) -> None:
        self.seed = 0
        self.generation = 0  # bumped by every seed(): each thread's stream restarts
        self.threads = 0  # threads that have started a stream of this generation
        self.lock = threading.Lock()


_SEED = _Seed()


def seed(s: int) -> None:
    """Seed the global random stream used by the random functions when ``key`` is omitted.

    The rule for threads: the thread that calls ``seed(s)`` draws from ``key(s)``, exactly like a
    single-threaded program. Every other thread, at its first draw after the seeding, starts its
    own stream ``fold_in(key(s), n)``, where ``n = 1, 2, ...`` counts the threads in the order of
    their first draw. So worker threads never repeat each other's numbers or the seeding
    thread's, different seeds give different numbers in every thread, and a program whose threads
    first draw in a fixed order is reproducible. Before any ``seed`` call, the first thread to draw
    acts as the seeding thread of seed 0.

    >>> import nablax as nx
    >>> nx.random.seed(3); a = nx.random.normal(shape=(2,))
    >>> nx.random.seed(3); b = nx.random.normal(shape=(2,))
    >>> a.tolist() == b.tolist()
    True
    """
    s = int(s)
    ctx = CTX
    with _SEED.lock:
        _SEED.seed = s
        _SEED.generation += 1
        _SEED.threads = 0
        ctx.random_key = key(s)
        ctx.random_generation = _SEED.generation


def _thread_stream() -> Tensor:
    """This thread's key for the current seed generation (started on first use)."""
    ctx = CTX
    with _SEED.lock:
        if ctx.random_generation != _SEED.generation:
            _SEED.threads += 1
            n = _SEED.threads
            if n == 1 and _SEED.generation == 0:
                base = key(_SEED.seed)  # no seed() yet: the first drawing thread gets key(0)
            else:
                data = jax.random.key_data(
                    jax.random.fold_in(jax.random.key(_SEED.seed, impl="threefry2x32"), n)
                )
                base = Tensor._wrap(impl_from_array(data))
            ctx.random_key = base
            ctx.random_generation = _SEED.generation
        assert ctx.random_key is not None  # set above for this seed generation
        return ctx.random_key


def _next_key() -> Tensor:
    tracing_guard("nx.random (global key)")
    k, sub = split(_thread_stream())
    CTX.random_key = k
    return sub


def _as_key(k, op: str) -> Tensor:
    if k is None:
        return _next_key()
    if isinstance(k, Tensor):
        t = k
    elif isinstance(k, jax.Array) and jax.dtypes.issubdtype(k.dtype, jax.dtypes.prng_key):
        t = Tensor._wrap(impl_from_array(jax.random.key_data(k)))
    else:
        t = Tensor._wrap(to_impl(np.asarray(k) if not isinstance(k, jax.Array) else k))
    if t.shape != (2,) or t.dtype != dtypes.uint32:
        raise op_error(
            TypeError,
            f"random.{op}",
            f"key must be a uint32[2] tensor from nx.random.key / split, got {t.dtype}{list(t.shape)}",
            "pass key=nx.random.key(seed), or omit it to use the global key",
        )
    return t


def split(key, num: int = 2) -> Tensor:
    """Split a key into ``num`` new keys, a ``uint32[num, 2]`` tensor (unpack or index it)."""
    k = _as_key(key, "split")
    return Tensor._wrap(bind(split_p, [k._impl], (int(num),))[0])


def _float_dtype(dtype, op):
    dt = dtypes.canonicalize(dtype)
    if not dtypes.is_floating(dt):
        raise op_error(DTypeError, f"random.{op}", f"dtype must be a float dtype, got {dt}")
    return dt


def normal(key=None, shape=(), dtype=None) -> Tensor:
    """Standard normal samples of ``shape`` (same values as ``jax.random.normal``)."""
    k = _as_key(key, "normal")
    params = (norm_shape("random.normal", shape), _float_dtype(dtype, "normal"))
    return Tensor._wrap(bind(normal_p, [k._impl], params)[0])


def uniform(key=None, shape=(), minval=0.0, maxval=1.0, dtype=None) -> Tensor:
    """Uniform samples in ``[minval, maxval)`` (same values as ``jax.random.uniform``)."""
    k = _as_key(key, "uniform")
    params = (
        norm_shape("random.uniform", shape),
        _float_dtype(dtype, "uniform"),
        float(minval),
        float(maxval),
    )
    return Tensor._wrap(bind(uniform_p, [k._impl], params)[0])


def randint(key=None, shape=(), low=0, high=None, dtype=None) -> Tensor:
    """Integers in ``[low, high)`` (same values as ``jax.random.randint``)."""
    if high is None:
        raise op_error(TypeError, "random.randint", "high is required")
    k = _as_key(key, "randint")
    dt = dtypes.canonicalize(dtype if dtype is not None else dtypes.int32)
    if not dtypes.is_integer(dt):
        raise op_error(DTypeError, "random.randint", f"dtype must be an integer dtype, got {dt}")
    params = (norm_shape("random.randint", shape), dt, int(low), int(high))
    return Tensor._wrap(bind(randint_p, [k._impl], params)[0])

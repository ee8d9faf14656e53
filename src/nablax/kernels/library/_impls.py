"""Which implementations a bundled kernel may use on this machine, and the backend parameters of
its Pallas calls.

A kernel config may choose the implementation (API §6): ``"pallas"`` (nablax's own Pallas
kernels), ``"xla"`` (plain JAX, XLA's fusion) and, for attention, ``"cudnn"``
(``jax.nn.dot_product_attention(implementation="cudnn")``). This module says which of them can
run here:

- **Pallas on the CPU** runs in interpret mode (the only mode JAX offers there): correct but slow,
  so it is a tuning candidate only when a module's ``INTERPRET`` switch is on (tests).
- **Pallas on a GPU**: nablax's kernels are written for Pallas's Triton backend. JAX 0.11
  deprecated that backend (every lowering warns: "migrate to the Mosaic GPU backend, or use Triton
  through jax_triton"), and Mosaic GPU kernels need another programming model (Hopper+, warpgroup
  matmuls on shared-memory refs) that has not been written or verified for nablax yet. So on a JAX
  whose Triton backend is deprecated the ``"pallas"`` implementation is *not available*: it is left
  out of the candidates and an explicit ``impl="pallas"`` raises ``NotImplementedError`` (never a
  DeprecationWarning). On older JAX it lowers through Triton with ``pltriton.CompilerParams``.
  None of this has been run on a GPU in this session.
- **cuDNN** needs an NVIDIA GPU, float16/bfloat16 inputs, equal q/k/v head dims that are a
  multiple of 8 and at most 128 (cuDNN's flash-attention limits as JAX documents them).

>>> pallas_interpret("cpu")
True
>>> cudnn_reason((1, 8, 2, 64), (1, 8, 2, 64), (1, 8, 2, 64), "bfloat16", "cpu")
'cuDNN needs an NVIDIA GPU (this platform is cpu)'
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from ... import _caches

IMPLS = ("pallas", "xla", "cudnn")

# The full score matrix (batch x heads x seq_q x seq_kv elements) an "xla" attention candidate may
# build: beyond it the tuner does not offer the unblocked implementation (an explicit impl="xla"
# still runs). Accelerators: 2^30 (4 GiB of float32, so issue 38's 4 x 16 x 2048^2 call is in);
# the CPU: 2^25 (128 MiB; its backward holds a few such matrices in host memory).
XLA_MAX_SCORES_CPU = 1 << 25
XLA_MAX_SCORES_ACCEL = 1 << 30


def xla_max_scores(plat: str) -> int:
    """The largest score matrix (elements) an "xla" attention candidate may build on ``plat``.

    >>> xla_max_scores("cpu") < xla_max_scores("gpu")
    True
    """
    return XLA_MAX_SCORES_CPU if plat == "cpu" else XLA_MAX_SCORES_ACCEL


def platform() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the platform of JAX's default backend."""
    p = jax.default_backend()
    return "gpu" if p in ("gpu", "cuda", "rocm") else p


# the probes of this process's JAX and devices: computed once, registered (nx.clear_caches())
_PROBES = _caches.Cache("kernels.platform_probes", 8)


def triton_deprecated() -> bool:
    """Whether this JAX deprecates Pallas's Triton backend (see :func:`_probe_triton_deprecated`)."""
    return _PROBES.get_or_make("triton_deprecated", _probe_triton_deprecated)


def _probe_triton_deprecated() -> bool:
    """Whether this JAX deprecates Pallas's Triton backend (JAX 0.11+ registers the deprecation
    ``"jax-pallas-triton"``; the version is the fallback when that registry is not there)."""
    try:
        from jax._src import deprecations

        registered = getattr(deprecations, "_registered_deprecations", None)
        if isinstance(registered, dict):
            return "jax-pallas-triton" in registered
    except ImportError:  # pragma: no cover - a JAX without the module
        pass
    return tuple(int(x) for x in jax.__version__.split(".")[:2]) >= (0, 11)


def pallas_gpu_reason() -> str | None:
    """None when nablax's Pallas kernels can be compiled for a GPU with this JAX, else why not."""
    if triton_deprecated():
        return (
            f"nablax's Pallas GPU kernels are written for Pallas's Triton backend, which JAX "
            f"{jax.__version__} deprecates (JAX 0.11+: migrate to Mosaic GPU or use jax_triton); "
            f"a Mosaic GPU port has not been written and verified yet"
        )
    return None


def pallas_interpret(plat: str, interpret_flag: bool = False) -> bool:
    """Whether a Pallas call runs in interpret mode: always off a GPU (JAX compiles Pallas for the
    CPU only in interpret mode), and when the module's ``INTERPRET`` switch is on."""
    return interpret_flag or plat != "gpu"


def pallas_available(plat: str, interpret_flag: bool) -> bool:
    """Whether ``"pallas"`` candidates are offered: on a GPU when its backend is supported, on
    other platforms only with the ``INTERPRET`` switch (interpret mode is slow)."""
    if plat == "gpu" and not interpret_flag:
        return pallas_gpu_reason() is None
    return interpret_flag


def pallas_params(api: str, interpret: bool, num_warps: int) -> dict:
    """``pallas_call`` keywords for the backend: ``interpret=True`` alone in interpret mode, the
    Triton compiler params on a GPU whose JAX still supports them, else ``NotImplementedError``."""
    if interpret:
        return {"interpret": True}
    reason = pallas_gpu_reason()
    if reason is not None:
        raise NotImplementedError(
            f"{api}: impl='pallas' cannot run on this GPU: {reason}. Fix: use impl='xla' (or "
            f"impl='cudnn' for attention), or leave cfg=None so the tuner picks an available one"
        )
    from jax.experimental.pallas import triton as pltriton

    return {"compiler_params": pltriton.CompilerParams(num_warps=num_warps)}


def _is_cuda() -> bool:
    return _PROBES.get_or_make("is_cuda", _probe_is_cuda)


def _probe_is_cuda() -> bool:
    try:
        dev = jax.devices()[0]
    except RuntimeError:  # pragma: no cover - no backend
        return False
    if dev.platform == "cuda":
        return True
    version = str(getattr(getattr(dev, "client", None), "platform_version", "")).lower()
    return dev.platform == "gpu" and "cuda" in version


def cudnn_reason(qs: tuple, ks: tuple, vs: tuple, dtype: Any, plat: str) -> str | None:
    """None when ``jax.nn.dot_product_attention(implementation="cudnn")`` can take these
    ``(batch, seq, heads, head_dim)`` shapes on this platform, else why not."""
    if plat != "gpu" or not _is_cuda():
        return f"cuDNN needs an NVIDIA GPU (this platform is {plat})"
    dt = np.dtype(dtype)
    if dt.name not in ("float16", "bfloat16"):
        return f"cuDNN attention takes float16 or bfloat16, not {dt.name}"
    d, dk, dv = qs[-1], ks[-1], vs[-1]
    if not (d == dk == dv and d % 8 == 0 and d <= 128):
        return f"cuDNN attention needs equal head dims, a multiple of 8 and <= 128 (got {d}, {dv})"
    if not (qs[2] == ks[2] == vs[2]):
        return "cuDNN attention here takes equal q/k/v head counts"
    return None

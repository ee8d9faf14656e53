"""What device a kernel config was chosen on: ``get_device_platform`` and ``device_fingerprint``.

Configs and timings are only valid on the hardware and software that measured them, so every cache
entry is keyed by a fingerprint made of the platform, the device kind, the device count, the CPU
model (on CPU) and the versions of jax and jaxlib.

>>> from nablax.kernels import get_device_platform, device_fingerprint
>>> get_device_platform() in ("cpu", "gpu", "tpu")
True
>>> device_fingerprint().startswith(get_device_platform())
True
"""

from __future__ import annotations

import platform as _platform

import jax

from ... import _caches

# Both answers, computed once (jax's devices do not change in a process); a registered cache, so
# that nx.clear_caches() makes the next call ask jax again.
_memo = _caches.Cache("kernels.device_fingerprint", 2)


def _platform_name(p: str) -> str:
    return "gpu" if p in ("cuda", "rocm", "gpu") else p


def get_device_platform() -> str:
    """The default backend's platform: ``"cpu"``, ``"gpu"`` or ``"tpu"``."""
    return _memo.get_or_make("platform", lambda: _platform_name(jax.devices()[0].platform))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def device_fingerprint() -> str:
    """A stable string naming this machine's default device and software stack, e.g.
    ``"cpu|AMD EPYC 7B13|n=1|jax=0.10.2|jaxlib=0.10.2"``."""
    return _memo.get_or_make("fingerprint", _fingerprint)


def _fingerprint() -> str:
    import jaxlib

    devs = jax.devices()
    plat = _platform_name(devs[0].platform)
    kind = devs[0].device_kind
    if plat == "cpu":
        kind = _cpu_model()
    return f"{plat}|{kind}|n={len(devs)}|jax={jax.__version__}|jaxlib={jaxlib.__version__}"

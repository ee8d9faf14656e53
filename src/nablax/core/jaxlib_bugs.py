"""Known-bad jaxlib releases: a warning at import, so that a wrong answer is never silent.

nablax's pins (``pyproject.toml``) leave these releases out, so a plain ``pip install nablax``
never gets one; the warning is for an environment that installed one by hand or kept an older
install. Each entry names the upstream reports, what goes wrong, and the fix.

jaxlib 0.10.2's CPU backend sends reductions to its new YNN fusion, which

- segfaults on a worker thread while running an f32 multiply + reduce of rank 7 or more
  (jax-ml/jax#39257, #40412): nested transforms (``hessian`` of ``hessian`` of ``hessian``)
  produce such reductions, and the process dies at a later, unrelated line;
- returns wrong sums for a ``vmap``-ed matrix-vector product followed by a reduction over more
  than 2**15 rows, silently (jax-ml/jax#39103).

jaxlib 0.10.1 and 0.11+ run both programs correctly (checked against NumPy). Turning the YNN
fusion off (``XLA_FLAGS=--xla_cpu_experimental_ynn_fusion_type=``, set before JAX starts its
backends) avoids both on 0.10.2 too; with that flag set the warning is not given.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from types import MappingProxyType

_YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type"

# version -> (what goes wrong, the upstream reports)
KNOWN_BAD: Mapping[str, tuple[str, str]] = MappingProxyType(
    {
        "0.10.2": (
            "its CPU backend segfaults on f32 multiply-reduce of rank 7 or more (nested transforms "
            "such as hessian of hessian of hessian make them) and returns wrong sums for a vmapped "
            "matrix-vector product followed by a large reduction",
            "jax-ml/jax#39257, #40412, #39103",
        ),
    }
)


def message(version: str, environ: Mapping[str, str]) -> str | None:
    """The warning for jaxlib ``version`` under environment ``environ``, or None when that
    release has no known bug or the environment already works around it.

    >>> message("0.10.1", {}) is None
    True
    >>> "wrong sums" in message("0.10.2", {})
    True
    >>> message("0.10.2", {"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type="}) is None
    True
    """
    bad = KNOWN_BAD.get(version)
    if bad is None or _YNN_FLAG in environ.get("XLA_FLAGS", ""):
        return None
    what, reports = bad
    return (
        f"nablax: jaxlib {version} is installed, and {what} ({reports}). Fix: install a release "
        f'without these bugs (pip install "jax[cpu]!={version},>=0.10" "jaxlib!={version}": 0.10.1 '
        f"on Python 3.11, the newest on 3.12+), or start Python with "
        f"XLA_FLAGS={_YNN_FLAG}= to turn the faulty CPU fusion off."
    )


def check() -> None:
    """Warn (``RuntimeWarning``) once, at import, when the installed jaxlib is known to be bad."""
    import warnings

    import jaxlib

    text = message(getattr(jaxlib, "__version__", ""), os.environ)
    if text is not None:
        warnings.warn(text, RuntimeWarning, stacklevel=2)

"""Helpers shared by the benchmark scripts (run as ``python bench/<script>.py``)."""

from __future__ import annotations

import os
import platform

import jax
import numpy as np


def environment(torch_module=None) -> str:
    """One line naming the machine, its current load and the library versions."""
    tv = torch_module.__version__ if torch_module is not None else "not installed"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"python {platform.python_version()}, jax {jax.__version__} "
        f"({jax.default_backend()}), numpy {np.__version__}, torch {tv}, "
        f"{platform.machine()}, {os.cpu_count()} cores, load average {load:.1f}"
    )


def fmt(v: float | None) -> str:
    """A table cell: 3 significant digits, no more decimals than useful, an em dash for None."""
    if v is None:
        return "—"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 1:
        return f"{v:.2f}"
    return f"{v:.3g}"

"""``src/nablax/core`` type-checks clean with mypy (configuration: ``[tool.mypy]`` in
pyproject.toml). Tensor's methods are declared in core/tensor.py, so a type checker sees the whole
API; this test keeps it that way: a method attached from elsewhere, or a call with the wrong
arguments, fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_core_type_checks_clean():
    api = pytest.importorskip("mypy.api", reason="mypy is in the test extra")
    out, err, status = api.run(
        [
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--no-incremental",
            str(ROOT / "src/nablax/core"),
        ]
    )
    errors = [line for line in out.splitlines() if ": error:" in line]
    assert status == 0 and not errors, (
        f"mypy found {len(errors)} error(s) in src/nablax/core (exit {status}):\n"
        + "\n".join(errors[:60])
        + (f"\n... and {len(errors) - 60} more" if len(errors) > 60 else "")
        + (f"\n{err}" if err else "")
    )

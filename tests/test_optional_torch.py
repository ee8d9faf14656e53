"""PyTorch is optional for the test suite: the Python 3.12 run installs none (the test extra pins it
for Python < 3.12 only; its 3.12 wheel is a multi-GB CUDA build). A test module that compares with
PyTorch imports it with ``pytest.importorskip("torch")`` (the whole module skips) or inside
``try: ... except ImportError`` (the tests that use it skip), never with a bare ``import torch``
at module level, which would fail the collection of the whole suite without it."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _bare_torch_imports(tree: ast.Module) -> list[int]:
    """Lines of module-level ``import torch`` / ``from torch ...`` outside a ``try``."""
    out = []
    for node in tree.body:  # only top-level statements: a try block or a function is fine
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "torch" for a in node.names
        ):
            out.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            out.append(node.lineno)
    return out


def test_the_checker_finds_bare_imports_only():
    tree = ast.parse(
        "import torch\n"
        "from torch import nn\n"
        "try:\n    import torch\nexcept ImportError:\n    torch = None\n"
        "torch = pytest.importorskip('torch')\n"
        "def f():\n    import torch\n"
    )
    assert _bare_torch_imports(tree) == [1, 2]


def test_torch_is_imported_optionally_in_every_test_module():
    bad = []
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        bad += [f"{path.relative_to(TESTS)}:{line}" for line in _bare_torch_imports(tree)]
    assert not bad, (
        "bare `import torch` (fails collection where PyTorch is not installed, as in the Python "
        "3.12 run); use `torch = pytest.importorskip('torch')`, or try/except ImportError with "
        "a skipif mark on the tests that need it:\n" + "\n".join(bad)
    )

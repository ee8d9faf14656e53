"""Tests that start Python processes give them this process's environment plus their own variables
(a GPU run's CUDA/JAX settings, the suite's cache folder, a virtual environment's PYTHONPATH), never
a replacement: every ``env=`` dict literal in tests/ unpacks ``os.environ`` (``{**os.environ, ...}``
or ``dict(os.environ, ...)``), and a ``PYTHONPATH`` it sets keeps the inherited one after its own
folder."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def _mentions_environ(node: ast.AST) -> bool:
    return any(
        isinstance(n, ast.Attribute) and n.attr == "environ" and isinstance(n.value, ast.Name)
        for n in ast.walk(node)
    )


def _starts_a_process(func: ast.AST) -> bool:
    """``subprocess.run(...)``, ``subprocess.Popen(...)``, ``check_output``, ... (by attribute or
    imported name)."""
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in {"run", "Popen", "call", "check_call", "check_output"}


def _problems(tree: ast.AST) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _starts_a_process(node.func):
            for kw in node.keywords:
                if kw.arg == "env" and isinstance(kw.value, ast.Dict):
                    if None not in kw.value.keys:  # no **os.environ (or **ENV built from it)
                        out.append((kw.value.lineno, "env= dict literal without **os.environ"))
        if isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                if (
                    isinstance(k, ast.Constant)
                    and k.value == "PYTHONPATH"
                    and not _mentions_environ(v)
                ):
                    out.append((node.lineno, "PYTHONPATH replaced instead of extended"))
    return out


def test_the_checker_catches_replaced_environments():
    bad = ast.parse(
        'subprocess.run(a, env={"PYTHONPATH": src})\n'
        'env = {**os.environ, "PYTHONPATH": src}\n'
        'launch(a, env={"NABLAX_X": "1"})  # not a process: its own extra variables'
    )
    assert sorted(_problems(bad)) == [
        (1, "PYTHONPATH replaced instead of extended"),
        (1, "env= dict literal without **os.environ"),
        (2, "PYTHONPATH replaced instead of extended"),
    ]
    good = ast.parse(
        'env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ["PYTHONPATH"]])}\n'
        "subprocess.run(a, env={**os.environ, 'X': '1'})\n"
        "subprocess.Popen(a, env={**ENV, **extra})"
    )
    assert _problems(good) == []


def test_subprocesses_inherit_the_environment():
    found = []
    for path in sorted(TESTS.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        found += [f"{path.relative_to(TESTS)}:{line}: {why}" for line, why in _problems(tree)]
    assert not found, "subprocess environments that drop the caller's:\n" + "\n".join(found)

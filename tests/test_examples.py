"""The examples under examples/ run and reach what they promise."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    spec = importlib.util.spec_from_file_location(
        f"example_{name}", ROOT / "examples" / f"{name}.py"
    )
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_digits_reaches_97_percent_and_reloads_its_checkpoint(tmp_path, capsys):
    pytest.importorskip("sklearn")
    digits = _load("digits")
    results = digits.main(["--quiet", "--out", str(tmp_path)])
    for kind in ("mlp", "cnn"):
        r = results[kind]
        assert r["accuracy"] >= 0.97, (kind, r["accuracy"])
        assert r["reloaded_accuracy"] == r["accuracy"]
        assert r["traces"] == 1  # the padded last batch does not trace again
        assert len(r["epoch_times"]) == 20
    assert (tmp_path / "digits.safetensors").exists()
    out = capsys.readouterr().out
    assert "test accuracy" in out and "reloaded test accuracy" in out


def test_the_package_never_imports_scikit_learn():
    # `nablax demo` runs on its embedded data without the examples extra
    for path in (ROOT / "src" / "nablax").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n.split(".")[0] == "sklearn" for n in names), path

"""core/hooks.py: every late binding is made once ``nablax`` is imported, to the function or module
its docstring names, and only through that module (no other module assigns the slots)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import nablax  # noqa: F401 - binds the hooks
from nablax.core import hooks, realize, sharding, tensor
from nablax.core.ops import elementwise, index, linalg, masks, nn, reduce, shape
from nablax.core.transforms import staging, vjp

SRC = Path(__file__).resolve().parents[2] / "src" / "nablax"


def test_tensor_methods_delegate_to_the_bound_modules():
    bound = {name: getattr(tensor, f"_{name}") for name in hooks.TENSOR_METHOD_MODULES}
    assert bound == {
        "elementwise": elementwise,
        "index": index,
        "linalg": linalg,
        "masks": masks,
        "nn": nn,
        "reduce": reduce,
        "shape": shape,
        "sharding": sharding,
        "autodiff": vjp,
    }
    x = nablax.arange(3.0)
    assert (-x).tolist() == [-0.0, -1.0, -2.0] and x.sum().item() == 3.0


def test_sharding_of_and_tracing_check_are_bound():
    assert tensor._sharding_of is sharding.sharding_of
    assert realize._tracing_check is staging._check_no_placeholder
    assert nablax.ones((2, 2)).sharding is None  # propagated: no sharded leaf


def test_bind_tensor_methods_rejects_an_unknown_module_name():
    with pytest.raises(
        ValueError, match=r"bind_tensor_methods: .*'fft'; the names are elementwise"
    ):
        hooks.bind_tensor_methods(fft=elementwise)
    assert not hasattr(tensor, "_fft")


def test_every_late_binding_is_listed_and_made_only_in_hooks():
    """Assignments to another module's attribute (``tensor._x = ...``, ``setattr(tensor, ...)``)
    happen only in core/hooks.py, and its docstring names every slot it sets."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "hooks.py" and path.parent.name == "core":
            continue
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                for t in node.targets:
                    if (
                        isinstance(t, ast.Attribute)
                        and isinstance(t.value, ast.Name)
                        and t.value.id in ("_tensor", "tensor", "_realize", "realize")
                    ):
                        found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}")
    assert not found, "late bindings outside core/hooks.py:\n" + "\n".join(found)
    doc = hooks.__doc__ or ""
    for slot in ["tensor._sharding_of", "realize._tracing_check"] + [
        f"_{n}" for n in hooks.TENSOR_METHOD_MODULES
    ]:
        assert re.search(re.escape(slot), doc), f"core/hooks.py's docstring does not name {slot}"

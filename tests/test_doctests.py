"""Run the ``>>>`` examples of every nablax module's docstrings (they are the user docs)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import nablax


def _modules() -> list[str]:
    names = ["nablax"]
    for info in pkgutil.walk_packages(nablax.__path__, "nablax."):
        names.append(info.name)
    return sorted(names)


@pytest.mark.parametrize("name", _modules())
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False
    )
    tests = finder.find(mod, name, extraglobs={"nx": nablax})
    for t in tests:
        runner.run(t)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{result.failed} doctest example(s) failed in {name}"

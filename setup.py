"""Build configuration beyond pyproject.toml: the optional C extension ``nablax.core._graphc``.

It compiles the graph IR's two hottest walks (``core/graph.py``'s ``encode`` and ``collect``).
``optional=True``: where no C compiler (or no Python headers) is present, ``pip install`` still
succeeds and nablax uses the pure-Python versions of the same functions.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("nablax.core._graphc", ["src/nablax/core/_graphc.c"], optional=True),
    ]
)

# Type stub of the optional C extension built from _graphc.c (see core/graph.py).
from typing import Any

VERSION: int

def setup(var: type, node: type, literal: type, /) -> None: ...
def encode(order: Any, slot: dict, base: int = 0, /) -> tuple[list, int, list]: ...
def collect(roots: Any, seen: dict, /) -> dict: ...
def describe(ext: Any, position: Any, /) -> tuple[list, list, dict, list]: ...
def setup_build(
    impl: type, next_seq: Any, ctx: Any, note_pending: Any, deep_cut: Any, /
) -> None: ...
def node1(
    prim: Any,
    params: tuple,
    inputs: tuple,
    depth: int,
    shape: tuple,
    dtype: Any,
    trace: Any,
    bdims: Any,
    /,
) -> Any: ...
def node(
    prim: Any, params: tuple, inputs: tuple, depth: int, avals: Any, trace: Any, bdims: Any, /
) -> list: ...
def replay(nodes: Any, env: list, ext: list, trace: Any, made: dict, /) -> None: ...

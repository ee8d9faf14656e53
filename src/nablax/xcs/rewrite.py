"""Source rewriting for ``xcs.jit``: every call in the function goes through the runtime.

``xcs.jit`` needs to see each call the function makes, including calls to plain functions and
SDK methods nobody marked, so it recompiles the function from its source with three changes:

- ``g(a, *b, k=c, **d)`` becomes ``__xcs__.call(g, a, *b, k=c, **d)`` (not ``super()``, whose
  zero-argument form must stay a direct call); inside the body of a ``try`` with ``except``
  handlers it becomes ``__xcs__.call_now(...)``, which waits for an orchestration call's result so
  that its exception is raised inside the ``try``, as in plain Python;
- ``f"...{x!r:>8}..."`` becomes ``__xcs__.fstring("...", (x, 114, ">8"), ...)``, so a string built
  from a pending result stays lazy instead of waiting;
- ``x is y`` / ``x is not y`` compare real values (``__xcs__.is_(x, y)``), since a pending result is
  not its value's identity.

The new function keeps the original's globals, defaults, closure cells (matched by name), name and
docstring. Nested functions and lambdas inside it are rewritten too; classes are not.
"""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
import types
from typing import Any

from ..errors import XCSError

RUNTIME_NAME = "__xcs__"


class _Rewriter(ast.NodeTransformer):
    def __init__(self) -> None:
        self.in_try = 0  # inside the body of a try with handlers: calls must raise right there

    def visit_Try(self, node: ast.Try) -> ast.AST:
        if node.handlers:
            self.in_try += 1
            node.body = [self.visit(s) for s in node.body]
            self.in_try -= 1
            node.handlers = [self.visit(h) for h in node.handlers]
            node.orelse = [self.visit(s) for s in node.orelse]
            node.finalbody = [self.visit(s) for s in node.finalbody]
            return node
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            return node
        return ast.Call(
            func=_runtime_attr("call_now" if self.in_try else "call", node),
            args=[node.func, *node.args],
            keywords=node.keywords,
        )

    def visit_JoinedStr(self, node: ast.JoinedStr) -> ast.AST:
        self.generic_visit(node)
        parts: list[ast.expr] = []
        for v in node.values:
            if isinstance(v, ast.Constant):
                parts.append(v)
            elif isinstance(v, ast.FormattedValue):
                spec = v.format_spec if v.format_spec is not None else ast.Constant("")
                parts.append(ast.Tuple([v.value, ast.Constant(v.conversion), spec], ast.Load()))
            else:  # pragma: no cover - JoinedStr only holds those two
                return node
        return ast.Call(func=_runtime_attr("fstring", node), args=parts, keywords=[])

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) == 1 and isinstance(node.ops[0], (ast.Is, ast.IsNot)):
            fn = "is_" if isinstance(node.ops[0], ast.Is) else "is_not"
            return ast.Call(
                func=_runtime_attr(fn, node), args=[node.left, node.comparators[0]], keywords=[]
            )
        return node

    def visit_ClassDef(self, node: ast.ClassDef) -> ast.AST:
        return node  # class bodies keep plain semantics (metaclasses, __class__ cells)


def _runtime_attr(name: str, at: ast.AST) -> ast.Attribute:
    return ast.copy_location(
        ast.Attribute(value=ast.Name(RUNTIME_NAME, ast.Load()), attr=name, ctx=ast.Load()), at
    )


def _function_node(fn: Any) -> ast.FunctionDef:
    try:
        src = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as e:
        raise XCSError(
            f"xcs.jit: can't read the source of {getattr(fn, '__qualname__', fn)!r} ({e}); "
            f"xcs.jit rewrites the function's calls from its source. Fix: define it in a .py "
            f"file (not in a REPL or exec), or call it without xcs.jit"
        ) from None
    tree = ast.parse(src)
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__:
            if isinstance(node, ast.AsyncFunctionDef):
                raise XCSError(
                    f"xcs.jit: {fn.__qualname__} is an async function; xcs.jit runs plain "
                    f"functions (their calls already run concurrently). Fix: drop async, or use "
                    f"asyncio.gather inside it without xcs.jit"
                )
            node.decorator_list = []  # the decorators already ran; don't apply them again
            return node
    raise XCSError(
        f"xcs.jit: can't find the definition of {fn.__qualname__} in its source (a lambda or a "
        f"function made by exec?). Fix: use a def statement"
    )


def rewrite(fn: types.FunctionType, runtime: Any) -> types.FunctionType:
    """The function ``fn`` with its calls routed through ``runtime`` (an object with ``call``,
    ``call_now``, ``fstring``, ``is_`` and ``is_not``), which it sees as the closure variable
    ``__xcs__``."""
    if not isinstance(fn, types.FunctionType):
        raise XCSError(
            f"xcs.jit: expected a Python function, got {type(fn).__name__}. Fix: wrap the call "
            f"in a def"
        )
    node = _Rewriter().visit(_function_node(fn))
    freevars = fn.__code__.co_freevars + (RUNTIME_NAME,)
    # a factory whose locals are the closure's names makes the rewritten function a closure over
    # cells with the same names; the real cells are swapped in below
    factory = ast.FunctionDef(
        name="__xcs_factory__",
        args=ast.arguments(
            posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[], vararg=None
        ),
        body=[
            *[ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in freevars],
            node,
            ast.Return(ast.Name(fn.__name__, ast.Load())),
        ],
        decorator_list=[],
        returns=None,
    )
    module = ast.Module(body=[factory], type_ignores=[])
    ast.fix_missing_locations(module)
    ast.increment_lineno(module, fn.__code__.co_firstlineno - 1)
    code = compile(module, inspect.getsourcefile(fn) or "<xcs.jit>", "exec")
    factory_code = next(c for c in code.co_consts if isinstance(c, types.CodeType))
    inner = next(
        c
        for c in factory_code.co_consts
        if isinstance(c, types.CodeType) and c.co_name == fn.__name__
    )
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells[RUNTIME_NAME] = types.CellType(runtime)
    missing = [v for v in inner.co_freevars if v not in cells]
    if missing:  # pragma: no cover - the factory defines exactly fn's free variables
        raise XCSError(f"xcs.jit: internal error, free variables {missing} of {fn.__qualname__}")
    new = types.FunctionType(
        inner,
        fn.__globals__,
        fn.__name__,
        fn.__defaults__,
        tuple(cells[v] for v in inner.co_freevars) or None,
    )
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn)
    del new.__wrapped__
    return new

"""Source rewriting for ``xcs.jit``: every call in the function goes through the runtime.

``xcs.jit`` needs to see each call the function makes, including calls to plain functions and
SDK methods nobody marked, so it recompiles the function from its source with these changes:

- ``g(a, *b, k=c, **d)`` becomes ``__xcs__.call(g, a, *b, k=c, **d)`` (not ``super()``, whose
  zero-argument form must stay a direct call);
- ``try`` and ``with`` statements are preceded by ``__xcs__.settle()`` (an earlier failure is
  raised before them, outside them, as plain Python would), and calls in their bodies become
  ``__xcs__.call_now(...)``, which delivers the call's result or exception (and those of every
  call it made) before the next statement: handlers, ``finally`` blocks and context managers see
  exactly what they would see in plain Python;
- ``f"...{x!r:>8}..."`` becomes ``__xcs__.fstring("...", (x, 114, ">8"), ...)``, so a string built
  from a pending result stays lazy instead of waiting;
- ``x is y`` / ``x is not y`` compare real values (``__xcs__.is_(x, y)``), since a pending result is
  not its value's identity.

**The source must be the function's.** The definition (a ``def`` or a ``lambda``) is found in the
file its code object names, at its first line, and compiled unmodified first: only when that
gives the function's own code object (bytecode, constants, names, line table) is the rewritten
version used. After the file was edited, or without a source file, :class:`SourceUnavailable`
is raised and ``xcs.jit`` runs the function unmodified (sequentially) with a warning.

The new function keeps the original's globals, defaults, closure cells (matched by name), name,
docstring and ``__future__`` flags. Nested functions and lambdas inside it are rewritten too;
classes are not.
"""

from __future__ import annotations
import __future__

import ast
import functools
import inspect
import linecache
import types
from typing import Any

from ..errors import XCSError

RUNTIME_NAME = "__xcs__"
_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag
_CO_NESTED = 0x10


class SourceUnavailable(XCSError):
    """The function's source cannot be read, or is not the source of its code object."""


class _Rewriter(ast.NodeTransformer):
    def __init__(self) -> None:
        self.now = 0  # inside a try / with body: calls deliver their outcome before moving on

    def _visit_now(self, stmts: list) -> list:
        self.now += 1
        try:
            out: list = []
            for s in stmts:
                r = self.visit(s)
                out.extend(r if isinstance(r, list) else [r])
            return out
        finally:
            self.now -= 1

    def _visit_block(self, stmts: list) -> list:
        out: list = []
        for s in stmts:
            r = self.visit(s)
            out.extend(r if isinstance(r, list) else [r])
        return out

    def visit_Try(self, node: ast.Try) -> Any:
        node.body = self._visit_now(node.body)
        visit_rest = self._visit_now if node.finalbody else self._visit_block
        for h in node.handlers:
            if h.type is not None:
                h.type = self.visit(h.type)
            h.body = visit_rest(h.body)
        node.orelse = visit_rest(node.orelse)
        node.finalbody = self._visit_block(node.finalbody)
        return [_settle(node), node]

    visit_TryStar = visit_Try

    def visit_With(self, node: ast.With) -> Any:
        node.items = [self.visit(i) for i in node.items]
        node.body = self._visit_now(node.body)
        return [_settle(node), node]

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.func, ast.Name) and node.func.id == "super":
            return node
        return ast.Call(
            func=_runtime_attr("call_now" if self.now else "call", node),
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


def _settle(at: ast.stmt) -> ast.stmt:
    call = ast.Call(func=_runtime_attr("settle", at), args=[], keywords=[])
    return ast.copy_location(ast.Expr(call), at)


def _runtime_attr(name: str, at: ast.AST) -> ast.Attribute:
    return ast.copy_location(
        ast.Attribute(value=ast.Name(RUNTIME_NAME, ast.Load()), attr=name, ctx=ast.Load()), at
    )


def _definition(fn: types.FunctionType) -> tuple[ast.FunctionDef | ast.Lambda, list[ast.stmt]]:
    """The ``def`` / ``lambda`` node whose unmodified compilation is ``fn.__code__``, and the
    module's imports (see ``_module_imports``)."""
    code = fn.__code__
    name = getattr(fn, "__qualname__", code.co_name)
    lines = linecache.getlines(code.co_filename, fn.__globals__)
    if not lines:
        raise SourceUnavailable(f"the source of {name} is not available ({code.co_filename})")
    try:
        tree = ast.parse("".join(lines), code.co_filename)
    except SyntaxError as e:
        tree = _statement_only(lines, code.co_firstlineno, code.co_filename)
        if tree is None:
            raise SourceUnavailable(
                f"the source file of {name} does not parse any more ({e})"
            ) from None
    lam = code.co_name == "<lambda>"
    for node in ast.walk(tree):
        if lam:
            if not isinstance(node, ast.Lambda) or node.lineno != code.co_firstlineno:
                continue
        elif not (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == code.co_name
            and min([node.lineno] + [d.lineno for d in node.decorator_list]) == code.co_firstlineno
        ):
            continue
        if _same_code(_compile_in_factory(node, fn, _module_imports(tree)), code):
            if isinstance(node, ast.AsyncFunctionDef):
                raise XCSError(
                    f"xcs.jit: {name} is an async function; xcs.jit runs plain functions (their "
                    f"calls already run concurrently). Fix: drop async, or use asyncio.gather "
                    f"inside it without xcs.jit"
                )
            return node, _module_imports(tree)
    raise SourceUnavailable(
        f"the source of {name} in {code.co_filename} is not the code that is loaded (the file "
        f"was edited after it was imported?)"
    )


def _statement_only(lines: list[str], first: int, filename: str) -> ast.Module | None:
    """When the whole file is not Python (a function defined in a Markdown code block, a file
    being edited): the statement starting at line ``first`` (and the file's column-0 import
    lines), parsed at their own line numbers; None if that does not parse either."""
    block = inspect.getblock(lines[first - 1 :])
    indent = len(block[0]) - len(block[0].lstrip())
    pad = ["\n"] * (first - 1)
    if indent:
        if first < 2:
            return None
        pad[-1] = "if True:\n"  # keeps the statement's own columns and line numbers
    try:
        tree = ast.parse("".join(pad + block), filename)
    except SyntaxError:
        return None
    for i, line in enumerate(lines[: first - 1], 1):
        if line.startswith(("import ", "from ")):
            try:
                stmt = ast.parse("\n" * (i - 1) + line).body
            except SyntaxError:
                continue
            tree.body[:0] = stmt
    return tree


def _module_imports(tree: ast.Module) -> list[ast.stmt]:
    """The import statements of the module scope (not ``__future__``): compiled (never run) before
    the factory, they give the compiler the same knowledge of imported names (CPython calls a
    method of an imported module with a different instruction)."""
    out: list[ast.stmt] = []
    todo = list(tree.body)
    while todo:
        s = todo.pop(0)
        if isinstance(s, ast.Import) or (
            isinstance(s, ast.ImportFrom) and s.module != "__future__"
        ):
            out.append(s)
        elif not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for field in ("body", "orelse", "finalbody", "handlers"):
                todo.extend(getattr(s, field, None) or [])
    return out


def _compile_in_factory(
    node: ast.AST, fn: types.FunctionType, imports: list[ast.stmt]
) -> types.CodeType | None:
    """Compile ``node`` (a def or lambda) as ``fn`` was compiled: inside a factory whose locals are
    ``fn``'s free variables, after the module's imports, with ``fn``'s ``__future__`` flags; its
    code object."""
    code = fn.__code__
    freevars = code.co_freevars + (RUNTIME_NAME,)
    result = node if isinstance(node, ast.Lambda) else ast.Name(node.name, ast.Load())
    defn = [] if isinstance(node, ast.Lambda) else [node]
    if defn and node.name not in freevars:
        # the def binds its name in the factory: without this, a function that calls itself by
        # its (global) name would read it as a closure variable there, and never match its code
        defn.insert(0, ast.Global([node.name]))
    factory = ast.FunctionDef(
        name="__xcs_factory__",
        args=ast.arguments(
            posonlyargs=[], args=[], kwonlyargs=[], kw_defaults=[], defaults=[], vararg=None
        ),
        body=[
            *[ast.Assign([ast.Name(v, ast.Store())], ast.Constant(None)) for v in freevars],
            *defn,
            ast.Return(result),
        ],
        decorator_list=[],
        returns=None,
    )
    module = ast.Module(body=[*imports, factory], type_ignores=[])
    ast.fix_missing_locations(module)
    try:
        compiled = compile(
            module, code.co_filename, "exec", flags=code.co_flags & _FUTURE_FLAGS, dont_inherit=True
        )
    except SyntaxError:
        return None
    factory_code = next(
        c
        for c in compiled.co_consts
        if isinstance(c, types.CodeType) and c.co_name == "__xcs_factory__"
    )
    for c in factory_code.co_consts:
        if isinstance(c, types.CodeType) and c.co_name == code.co_name:
            return c
    return None


def _same_code(a: types.CodeType | None, b: types.CodeType) -> bool:
    if a is None:
        return False
    for attr in (
        "co_code", "co_names", "co_varnames", "co_cellvars", "co_argcount", "co_posonlyargcount",
        "co_kwonlyargcount", "co_firstlineno", "co_linetable", "co_exceptiontable", "co_name",
    ):  # fmt: skip
        if getattr(a, attr, None) != getattr(b, attr, None):
            return False
    if set(a.co_freevars) - {RUNTIME_NAME} != set(b.co_freevars):
        return False
    if (a.co_flags & ~_CO_NESTED) != (b.co_flags & ~_CO_NESTED):
        return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    for x, y in zip(a.co_consts, b.co_consts):
        if isinstance(x, types.CodeType) or isinstance(y, types.CodeType):
            if not (isinstance(x, types.CodeType) and isinstance(y, types.CodeType)):
                return False
            if not _same_code(x, y):
                return False
        elif type(x) is not type(y) or x != y:
            return False
    return True


def rewrite(fn: types.FunctionType, runtime: Any) -> types.FunctionType:
    """The function ``fn`` with its calls routed through ``runtime`` (an object with ``call``,
    ``call_now``, ``settle``, ``fstring``, ``is_`` and ``is_not``), which it sees as the closure
    variable ``__xcs__``. Raises :class:`SourceUnavailable` when its source cannot be trusted."""
    if not isinstance(fn, types.FunctionType):
        raise XCSError(
            f"xcs.jit: expected a Python function, got {type(fn).__name__}. Fix: wrap the call "
            f"in a def"
        )
    node, imports = _definition(fn)
    if isinstance(node, ast.FunctionDef):
        node.decorator_list = []  # the decorators already ran; don't apply them again
    node = _Rewriter().visit(node)
    inner = _compile_in_factory(node, fn, imports)
    if inner is None:  # pragma: no cover - the unmodified node compiled
        raise XCSError(f"xcs.jit: internal error, the rewritten {fn.__qualname__} does not compile")
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    cells[RUNTIME_NAME] = types.CellType(runtime)
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

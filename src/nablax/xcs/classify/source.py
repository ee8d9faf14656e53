"""Syntactic facts about a function, read from its source (``ast``) or, failing that, its bytecode.

Internal to :mod:`nablax.xcs.classify`. Nothing here imports or runs user code: the whole source
file is parsed once (so lambdas inside larger expressions and decorated functions are found by
line number) and the function's node is looked up by ``co_firstlineno`` and argument names.
Strings, docstrings and comments never produce references: only ``Name``/``Attribute`` chains do.
For effects, calls keep what their arguments are when that is knowable (a string literal such as
an SQL statement or a file mode, a name bound to one); a nested def that is only returned
(a decorator factory's wrapper) is not part of the function's own calls.
"""

from __future__ import annotations

import ast
import dis
import linecache
import types
from dataclasses import dataclass, field

from ... import _caches

CALL, ITEM, EXPR = "()", "[]", "?"  # chain elements: a call, a subscript, an unnamed expression
PIPE = "|"  # a chain rooted at ``a | b`` (a LangChain-style composition: ``(prompt | llm).batch``)
_MAX_FILES = 256
_MAX_CODES = 4096
_MUTATORS = frozenset("append extend insert update add pop popitem setdefault clear remove".split())


@dataclass(frozen=True)
class Ref:
    """One use of a name chain such as ``jnp.linalg.norm(x)`` → ``("jnp", "linalg", "norm", "()")``."""

    names: tuple[str, ...]
    line: int
    awaited: bool = False
    imported: bool = False
    nested: bool = False  # inside a nested def or lambda (runs only if that is called)
    calls: tuple = ()  # one ``Args`` per "()" in ``names``, in the same order

    @property
    def called(self) -> bool:
        return self.names[-1] == CALL

    def args_at(self, index: int) -> Args | None:
        """The arguments of the call right after ``names[index]`` (``None`` if not a call)."""
        if index + 1 >= len(self.names) or self.names[index + 1] != CALL:
            return None
        k = self.names[: index + 1].count(CALL)
        return self.calls[k] if k < len(self.calls) else None

    @property
    def text(self) -> str:
        out = {EXPR: "", PIPE: "(... | ...)"}.get(self.names[0], self.names[0])
        for n in self.names[1:]:
            out += "(...)" if n == CALL else "[...]" if n == ITEM else "." + n
        out = out.removesuffix("(...)") or "(expression)"
        return out.lstrip(".")


@dataclass(frozen=True)
class Args:
    """What a call's arguments are, as far as effects care: each is ``("s", text)`` for a string
    literal (an f-string's leading text, the literal inside ``text("...")``), ``("n", name)`` for
    a bare name, ``("c", repr)`` for another constant, ``("x", "")`` for anything else."""

    pos: tuple[tuple[str, str], ...] = ()
    kw: tuple[tuple[str, tuple[str, str]], ...] = ()

    def get(self, index: int, keyword: str | None = None) -> tuple[str, str] | None:
        for k, v in self.kw:
            if k == keyword:
                return v
        return self.pos[index] if index < len(self.pos) else None


def _arg(node: ast.AST) -> tuple[str, str]:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, (str, bytes)):
            return ("s", node.value if isinstance(node.value, str) else node.value.decode("latin1"))
        return ("c", repr(node.value))
    if isinstance(node, ast.JoinedStr):  # f"INSERT INTO {t} ...": its leading text
        first = node.values[0] if node.values else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            return ("s", first.value)
        return ("x", "")
    if isinstance(node, ast.Name):
        return ("n", node.id)
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
        if isinstance(node.args[0].value, str):  # session.execute(text("DELETE ..."))
            return ("s", node.args[0].value)
    if isinstance(node, ast.Call):  # session.execute(select(User).where(...)): a statement
        for name in chain_of(node)[0][:2]:
            if name in _STATEMENTS:
                return ("s", name.upper())
    return ("x", "")


_STATEMENTS = frozenset({"select", "insert", "update", "delete"})  # SQLAlchemy builders


def _args_of(call: ast.Call) -> Args:
    pos = tuple(_arg(a) for a in call.args if not isinstance(a, ast.Starred))
    kw = tuple((k.arg, _arg(k.value)) for k in call.keywords if k.arg is not None)
    return Args(pos, kw)


@dataclass
class Facts:
    """What a function's code says, before any name is resolved to an object."""

    refs: list[Ref] = field(default_factory=list)
    imports: dict[str, str] = field(default_factory=dict)  # local alias -> dotted module path
    assigns: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)  # name -> chains
    locals: set[str] = field(default_factory=set)
    local_defs: set[str] = field(default_factory=set)  # nested defs and lambdas bound to names
    params: list[str] = field(default_factory=list)
    annotations: list[Ref] = field(default_factory=list)  # parameter and return annotations
    self_attrs: dict[str, list[tuple[str, ...]]] = field(default_factory=dict)  # self.x = chain
    side_effects: list[str] = field(default_factory=list)
    has_source: bool = True
    strings: dict[str, str] = field(default_factory=dict)  # name = "a string literal"
    param_annotations: dict[str, tuple[str, ...]] = field(default_factory=dict)  # x: jax.Array
    matmul: list[int] = field(default_factory=list)  # lines using the @ operator


@dataclass
class FileInfo:
    """A parsed source file: module-level imports/assignments and function nodes by first line."""

    tree: ast.Module
    imports: dict[str, str]
    assigns: dict[str, list[tuple[str, ...]]]
    by_line: dict[int, list[ast.AST]]


# parsed files by name: (hash of the text, FileInfo or None); facts by id(code): (code, Facts)
_files = _caches.Cache("xcs.source_files", _MAX_FILES)
_codes = _caches.Cache("xcs.source_facts", _MAX_CODES)


def clear() -> None:
    """Forget every parsed file and every function's facts (``nx.clear_caches()`` does too)."""
    _files.clear()
    _codes.clear()


# ---- chains ---------------------------------------------------------------------------------


def chain_of(node: ast.AST, calls: list | None = None) -> tuple[tuple[str, ...], list[ast.AST]]:
    """``a.b(x)[i].c`` → (("a", "b", "()", "[]", "c"), [x, i]): the chain and its side expressions
    (and, into ``calls``, each call's node, last call first)."""
    names: list[str] = []
    side: list[ast.AST] = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            names.append(CALL)
            if calls is not None:
                calls.append(node)
            side.extend(node.args)
            side.extend(k.value for k in node.keywords)
            node = node.func
        elif isinstance(node, ast.Subscript):
            names.append(ITEM)
            side.append(node.slice)
            node = node.value
        elif isinstance(node, ast.Name):
            names.append(node.id)
            break
        else:
            pipe = isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr)
            names.append(PIPE if pipe else EXPR)
            side.append(node)
            break
    return tuple(reversed(names)), side


def value_chains(node: ast.AST | None) -> list[tuple[str, ...]]:
    """Chains a value expression may evaluate to (both branches of ``a if c else b``, ``a or b``)."""
    if node is None:
        return []
    if isinstance(node, ast.IfExp):
        return value_chains(node.body) + value_chains(node.orelse)
    if isinstance(node, ast.BoolOp):
        return [c for v in node.values for c in value_chains(v)]
    if isinstance(node, ast.Await):
        return value_chains(node.value)
    if isinstance(node, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        chain = chain_of(node)[0]
        return [] if chain[0] == EXPR else [chain]
    return []


def _import_aliases(node: ast.Import | ast.ImportFrom, package: str | None) -> dict[str, str]:
    out = {}
    if isinstance(node, ast.Import):
        for a in node.names:
            # `import os.path` binds `os`; `import numpy.linalg as la` binds the submodule
            out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        return out
    base = node.module or ""
    if node.level and package:
        parts = package.split(".")
        parts = parts[: len(parts) - node.level + 1] if node.level > 1 else parts
        base = ".".join(parts + ([node.module] if node.module else []))
    for a in node.names:
        if a.name != "*":
            out[a.asname or a.name] = f"{base}.{a.name}" if base else a.name
    return out


# ---- whole files ----------------------------------------------------------------------------


def _module_level(tree: ast.Module, package: str | None) -> tuple[dict, dict]:
    """Imports and simple assignments at module level, including inside top-level if/try/with."""
    imports: dict[str, str] = {}
    assigns: dict[str, list[tuple[str, ...]]] = {}
    stack = list(tree.body)
    while stack:
        node = stack.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            imports.update(_import_aliases(node, package))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name):
                    assigns.setdefault(t.id, []).extend(value_chains(node.value))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            for name in ("body", "orelse", "finalbody", "handlers"):
                stack.extend(getattr(node, name, []))
        elif isinstance(node, ast.ExceptHandler):
            stack.extend(node.body)
    return imports, assigns


def file_info(filename: str, module_globals: dict | None) -> FileInfo | None:
    """The parsed file (cached by its text), or ``None`` when there is no readable source."""
    lines = linecache.getlines(filename, module_globals)
    if not lines:
        return None
    text = "".join(lines)
    cached = _files.get(filename)
    if cached is not None and cached[0] == hash(text):
        return cached[1]
    try:
        tree = ast.parse(text, filename)
    except (SyntaxError, ValueError):
        info = None
    else:
        package = (module_globals or {}).get("__package__")
        imports, assigns = _module_level(tree, package)
        info = FileInfo(tree, imports, assigns, _index(tree))
    _files.put(filename, (hash(text), info))
    return info


def _index(tree: ast.Module) -> dict[int, list[ast.AST]]:
    by_line: dict[int, list[ast.AST]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            decos = getattr(node, "decorator_list", [])
            first = min([node.lineno, *(d.lineno for d in decos)])
            by_line.setdefault(first, []).append(node)
    return by_line


def find_node(code: types.CodeType, info: FileInfo) -> ast.AST | None:
    """The def/lambda node of ``code``: same first line, same name, same positional arguments."""
    argnames = list(code.co_varnames[: code.co_argcount])
    for node in info.by_line.get(code.co_firstlineno, []):
        if isinstance(node, ast.ClassDef):
            continue
        name = "<lambda>" if isinstance(node, ast.Lambda) else node.name
        args = node.args.posonlyargs + node.args.args
        if name == code.co_name and [a.arg for a in args] == argnames:
            return node
    return None


# ---- facts of one function ------------------------------------------------------------------


def facts_for(code: types.CodeType, module_globals: dict | None) -> Facts | None:
    """Facts of ``code`` from source, or from bytecode (``has_source=False``); cached per code."""
    hit = _codes.get(id(code))
    if hit is not None and hit[0] is code:
        return hit[1]
    info = file_info(code.co_filename, module_globals)
    node = find_node(code, info) if info is not None else None
    facts = _Collector(node).facts if node is not None else bytecode_facts(code)
    _codes.put(id(code), (code, facts))
    return facts


class _Collector(ast.NodeVisitor):
    """Walks one function node (nested defs, lambdas and comprehensions included)."""

    def __init__(self, node: ast.AST):
        self.facts = Facts()
        self._awaited: set[int] = set()
        self._depth = 0
        self._defs: dict[str, tuple[int, int]] = {}  # nested def name -> its refs' index range
        self._returned: set[str] = set()  # nested defs returned by name (`return wrapper`)
        args = node.args
        every = args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]
        self.facts.params = [a.arg for a in every if a is not None]
        self.facts.locals.update(self.facts.params)
        for a in every:
            if a is not None and a.annotation is not None:
                chain = self._annotation(a.annotation)
                if chain is not None:
                    self.facts.param_annotations[a.arg] = chain
        if getattr(node, "returns", None) is not None:
            self._annotation(node.returns)
        for d in [*getattr(node, "decorator_list", []), *args.defaults, *args.kw_defaults]:
            if d is not None:  # decorators and defaults (dtype=jnp.float32) run with the def
                self.visit(d)
        body = node.body if isinstance(node.body, list) else [node.body]
        for stmt in body:
            self.visit(stmt)
        self._drop_returned_defs()

    def _drop_returned_defs(self) -> None:
        """A nested def that is only returned (a decorator factory's ``deco``, a closure
        factory's product) does not run when this function runs: its calls are not this
        function's."""
        loaded = {r.names[0] for r in self.facts.refs}
        drop = [self._defs[n] for n in self._returned if n in self._defs and n not in loaded]
        if drop:
            refs = self.facts.refs
            self.facts.refs = [
                r for i, r in enumerate(refs) if not any(a <= i < b for a, b in drop)
            ]

    def _annotation(self, node: ast.AST) -> tuple[str, ...] | None:
        """Record the names an annotation uses; return its main chain (``Optional[X]`` and
        ``X | None`` give ``X``) when it names one class."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:  # a string annotation (from __future__ import annotations, forward refs)
                node = ast.parse(node.value, mode="eval").body
            except SyntaxError:
                return None
        main = _main_annotation(node)
        for sub in ast.walk(node):
            if isinstance(sub, (ast.Name, ast.Attribute)):
                chain = chain_of(sub)[0]
                if chain[0] != EXPR:
                    self.facts.annotations.append(Ref(chain, getattr(sub, "lineno", 0)))
        return main

    def _chain(self, node: ast.AST) -> None:
        calls: list[ast.Call] = []
        chain, side = chain_of(node, calls)
        if chain[0] != EXPR or len(chain) > 1:
            awaited = id(node) in self._awaited
            args = tuple(_args_of(c) for c in reversed(calls))
            ref = Ref(chain, node.lineno, awaited, nested=self._depth > 0, calls=args)
            self.facts.refs.append(ref)
        for s in side:
            self.visit(s)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult):
            self.facts.matmul.append(node.lineno)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.op, ast.MatMult):
            self.facts.matmul.append(node.lineno)
        self.generic_visit(node)

    def visit_Return(self, node: ast.Return) -> None:
        if isinstance(node.value, ast.Name) and node.value.id in self.facts.local_defs:
            self._returned.add(node.value.id)  # `return wrapper`: not a use that runs it
            return
        self.generic_visit(node)

    def visit_Await(self, node: ast.Await) -> None:
        self._awaited.add(id(node.value))
        self.visit(node.value)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._chain(node)
        else:
            self.facts.locals.add(node.id)

    visit_Call = visit_Subscript = _chain

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            return self._chain(node)
        chain, side = chain_of(node)  # an assignment target: self.x = ..., obj.attr = ...
        for s in side:
            self.visit(s)
        if chain[0] not in self.facts.locals or chain[0] == (self.facts.params or [""])[0]:
            self.facts.side_effects.append(f"assigns to {'.'.join(chain)} at line {node.lineno}")

    def visit_Assign(self, node: ast.Assign | ast.AnnAssign) -> None:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if isinstance(t, ast.Name):
                self.facts.assigns.setdefault(t.id, []).extend(value_chains(node.value))
                kind, text = _arg(node.value) if node.value is not None else ("x", "")
                if kind == "s":
                    self.facts.strings[t.id] = text
                if isinstance(node.value, ast.Lambda):
                    self.facts.local_defs.add(t.id)
            elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name):
                if self.facts.params and t.value.id == self.facts.params[0]:
                    chains = value_chains(node.value)
                    self.facts.self_attrs.setdefault(t.attr, []).extend(chains)
                    self.facts.locals.add(t.value.id)
                    if node.value is not None:
                        self.visit(node.value)
                    continue
            elif isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                if t.value.id not in self.facts.locals:
                    self.facts.side_effects.append(f"stores into {t.value.id}[...]")
            self.visit(t)
        if node.value is not None:
            self.visit(node.value)

    visit_AnnAssign = visit_Assign

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.facts.assigns.setdefault(node.target.id, []).extend(value_chains(node.value))
        self.facts.locals.add(node.target.id)
        self.visit(node.value)

    def visit_AsyncWith(self, node: ast.AsyncWith) -> None:
        for item in node.items:  # `async with session.post(...)`: an awaited call
            self._awaited.add(id(item.context_expr))
        self.generic_visit(node)

    def visit_AsyncFor(self, node: ast.AsyncFor) -> None:
        self._awaited.add(id(node.iter))  # `async for line in resp.content`
        self.generic_visit(node)

    def visit_withitem(self, node: ast.withitem) -> None:
        if isinstance(node.optional_vars, ast.Name):
            chains = value_chains(node.context_expr)
            self.facts.assigns.setdefault(node.optional_vars.id, []).extend(chains)
            self.facts.locals.add(node.optional_vars.id)
        self.visit(node.context_expr)

    def visit_Import(self, node: ast.Import | ast.ImportFrom) -> None:
        aliases = _import_aliases(node, None)
        self.facts.imports.update(aliases)
        self.facts.locals.update(aliases)
        for path in aliases.values():  # an import is a use of the module
            self.facts.refs.append(Ref(tuple(path.split(".")), node.lineno, imported=True))

    visit_ImportFrom = visit_Import

    def visit_Global(self, node: ast.Global | ast.Nonlocal) -> None:
        kind = "global" if isinstance(node, ast.Global) else "nonlocal"
        self.facts.side_effects.append(f"declares {kind} {', '.join(node.names)}")

    visit_Nonlocal = visit_Global

    def visit_Lambda(self, node: ast.Lambda | ast.FunctionDef) -> None:
        args = node.args
        for a in args.posonlyargs + args.args + args.kwonlyargs + [args.vararg, args.kwarg]:
            if a is not None:
                self.facts.locals.add(a.arg)
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.facts.locals.add(node.name)
        self.facts.local_defs.add(node.name)
        start = len(self.facts.refs)
        self.visit_Lambda(node)
        self._defs[node.name] = (start, len(self.facts.refs))

    visit_AsyncFunctionDef = visit_FunctionDef


def _main_annotation(node: ast.AST) -> tuple[str, ...] | None:
    """``jax.Array`` → ("jax", "Array"); ``Optional[X]``, ``X | None`` → X's chain; else None."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        sides = [s for s in (node.left, node.right) if not _is_none(s)]
        return _main_annotation(sides[0]) if len(sides) == 1 else None
    if isinstance(node, ast.Subscript) and chain_of(node.value)[0][-1] == "Optional":
        return _main_annotation(node.slice)
    if isinstance(node, (ast.Name, ast.Attribute)):
        chain = chain_of(node)[0]
        return chain if EXPR not in chain else None
    return None


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def mutated_roots(facts: Facts) -> set[str]:
    """Names on which a mutating method is called (``CACHE.append(x)``): a side effect when the
    name is a global or closure variable."""
    return {r.names[0] for r in facts.refs if len(r.names) == 3 and r.names[1] in _MUTATORS}


# ---- bytecode fallback ----------------------------------------------------------------------

_ROOT_OPS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"})
_ATTR_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def bytecode_facts(code: types.CodeType) -> Facts:
    """Name chains (``np.linalg.norm``) read from bytecode when the source is not available."""
    facts = Facts(has_source=False, params=list(code.co_varnames[: code.co_argcount]))
    chain: list[str] = []
    line = code.co_firstlineno
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions and ins.positions.lineno else line
        if ins.opname in _ATTR_OPS and chain:
            chain.append(str(ins.argval))
            continue
        if chain:
            facts.refs.append(Ref(tuple(chain), line))
            chain = []
        if ins.opname in _ROOT_OPS:
            chain = [str(ins.argval)]
        elif ins.opname in ("IMPORT_NAME", "IMPORT_FROM"):
            facts.refs.append(Ref(tuple(str(ins.argval).split(".")), line))
    if chain:
        facts.refs.append(Ref(tuple(chain), line))
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            facts.refs.extend(bytecode_facts(const).refs)
    return facts

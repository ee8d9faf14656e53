"""Keep docs/api.md, the API reference, in step with the code.

Conventions of docs/api.md (its last section, "About this page", says the same for writers):

- A *definition* is a code span in a heading, or a code span at the start of a list item
  (``- `nx.add(x1, x2)`, `nx.subtract(x1, x2)` — ...``), before the `` — `` that starts the
  description, which must be on the item's first line. Its text starts with one of the prefixes
  of ``ALIASES`` (``nx.`` is ``nablax.``, ``Tensor.`` is ``nablax.Tensor.``, ...). In a list item
  every span before the dash must be one; a heading's other spans are prose. A list item whose
  first span starts with ``nablax `` documents a command of the CLI, one whose first span starts
  with ``NABLAX_`` an environment variable.
- A definition written with parentheses gives the whole signature: the parameter names, kinds
  (``*args``, ``*``, ``**kw``), which have defaults, and the values of literal defaults must equal
  ``inspect.signature``'s (``self`` left out for methods). Without parentheses only existence is
  checked (attributes, properties, or a method named in a list).
- Every public name of the modules in ``COVERED`` must be defined, and so must every public
  member that a defined nablax class defines itself; the fields of a dataclass or namedtuple are
  covered by a definition of its constructor with parentheses.
- Every ``nablax`` subcommand is defined with exactly its options (and its positional arguments
  named), and every ``NABLAX_*`` variable of ``nablax._config`` is defined along with its option
  name.
- Every ```` ```python ```` block runs, with README.md's conventions (tests/test_readme.py): one
  namespace per section, ``expression  # literal`` lines are checked.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib
import importlib.util
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "api.md"
README = Path(__file__).resolve().parents[1] / "README.md"
ALIASES = {
    "nx": "nablax",
    "nablax": "nablax",
    "Tensor": "nablax.Tensor",
    "kernels": "nablax.kernels",
    "library": "nablax.kernels.library",
    "xcs": "nablax.xcs",
    "loopback": "nablax.xcs.loopback",
    "nn": "nablax.nn",
    "optim": "nablax.optim",
}
COVERED = (
    "nablax",
    "nablax.tree",
    "nablax.random",
    "nablax.errors",
    "nablax.kernels",
    "nablax.kernels.library",
    "nablax.xcs",
    "nablax.xcs.loopback",
    "nablax.nn",
    "nablax.nn.functional",
    "nablax.optim",
    "nablax.distributed",
)
_SPAN = re.compile(r"`([^`]+)`")
_DASH = re.compile(r" —( |$)")
_NAME = re.compile(r"([A-Za-z_][\w.]*)(?:\((.*)\))?")


def _readme_helpers():
    """tests/test_readme.py, whose parser and checked-comment machinery the examples reuse."""
    mod = sys.modules.get("test_readme")
    if mod is None:
        spec = importlib.util.spec_from_file_location(
            "test_readme", Path(__file__).with_name("test_readme.py")
        )
        mod = importlib.util.module_from_spec(spec)
        sys.modules["test_readme"] = mod
        spec.loader.exec_module(mod)
    return mod


# ---- reading the page ------------------------------------------------------------------------


@dataclass
class Item:
    line: int  # 1-based line of the heading or of the list item's first line
    spans: list[str]  # the definition spans (see the module docstring)
    text: str  # the whole heading or list item
    kind: str = "api"  # "api", "cli" or "env"


def _known(span: str) -> bool:
    return span.split(".", 1)[0] in ALIASES and _NAME.fullmatch(span) is not None


def parse(text: str) -> list[Item]:
    """The definitions of ``text``, by heading and list item, outside code fences."""
    lines = text.splitlines()
    items: list[Item] = []
    fence = False
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if s.startswith("```"):
            fence = not fence
        elif not fence and s.startswith("#"):
            spans = [t for t in _SPAN.findall(s) if _known(t)]
            if spans:
                items.append(Item(i + 1, spans, s))
        elif not fence and s.startswith("- `"):
            j = i + 1
            while j < len(lines) and lines[j].startswith("  ") and lines[j].strip():
                j += 1
            whole = " ".join(x.strip() for x in lines[i:j])
            item = _item(i + 1, s, whole)
            if item is not None:
                items.append(item)
            i = j
            continue
        i += 1
    return items


def _item(line: int, first: str, whole: str) -> Item | None:
    spans = _SPAN.findall(first)
    lead = spans[0]
    if lead.startswith("nablax "):
        kind = "cli"
    elif lead.startswith("NABLAX_"):
        kind = "env"
    elif _known(lead):
        kind = "api"
    else:
        return None  # a list item of prose
    m = _DASH.search(first)
    if m is None:
        raise ValueError(f"docs/api.md line {line}: a definition needs ' — ' on its first line")
    head = _SPAN.findall(first[: m.start()])
    if kind == "api":
        bad = [t for t in head if not _known(t)]
        if bad:
            raise ValueError(
                f"docs/api.md line {line}: {bad[0]!r} before the dash is not a name with a known "
                f"prefix ({', '.join(p + '.' for p in ALIASES)})"
            )
    return Item(line, head if kind == "api" else [lead], whole, kind)


def canonical(span: str) -> str:
    """``nx.tree.map(fn, tree, *rest)`` -> ``nablax.tree.map``."""
    name = _NAME.fullmatch(span).group(1)
    head, _, rest = name.partition(".")
    return ALIASES[head] + ("." + rest if rest else "")


# ---- resolving names and signatures ----------------------------------------------------------

_FIELD = object()  # a dataclass field without a class attribute


def _fields(cls: type) -> list[str]:
    if dataclasses.is_dataclass(cls):
        return [f.name for f in dataclasses.fields(cls)]
    return list(getattr(cls, "_fields", ()))  # namedtuples


def resolve(path: str) -> tuple[object, object]:
    """``(owner, obj)`` for a dotted path; ``LookupError`` if it names nothing."""
    parts = path.split(".")
    obj: object = importlib.import_module(parts[0])
    owner: object = None
    for k, part in enumerate(parts[1:], start=1):
        try:
            nxt = getattr(obj, part)
        except AttributeError:
            if inspect.isclass(obj) and part in _fields(obj):
                nxt = _FIELD
            else:
                try:
                    nxt = importlib.import_module(".".join(parts[: k + 1]))
                except ImportError:
                    raise LookupError(f"{'.'.join(parts[:k])} has no attribute {part!r}") from None
        owner, obj = obj, nxt
    return owner, obj


def _documented_params(params: str) -> list[tuple[str, str, bool, ast.expr | None]]:
    a = ast.parse(f"def _({params}): pass").body[0].args
    positional = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs]
    positional += [(p, "POSITIONAL_OR_KEYWORD") for p in a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    out = [(p.arg, kind, d is not None, d) for (p, kind), d in zip(positional, defaults)]
    if a.vararg:
        out.append((a.vararg.arg, "VAR_POSITIONAL", False, None))
    out += [(p.arg, "KEYWORD_ONLY", d is not None, d) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        out.append((a.kwarg.arg, "VAR_KEYWORD", False, None))
    return out


def _actual_params(owner: object, obj: object, name: str) -> list[inspect.Parameter]:
    params = list(inspect.signature(obj).parameters.values())
    if inspect.isclass(owner) and inspect.isfunction(inspect.getattr_static(owner, name)):
        params = params[1:]  # a method looked up on its class: leave out self
    return params


def check(span: str) -> list[str]:
    """Problems of one definition span: it names nothing, or its signature differs."""
    name, params = _NAME.fullmatch(span).groups()
    path = canonical(span)
    try:
        owner, obj = resolve(path)
    except LookupError as e:
        return [f"`{span}`: no such name ({e})"]
    if params is None:
        return []
    if obj is _FIELD or not callable(obj):
        return [f"`{span}`: {path} is not callable, so it takes no parameters"]
    try:
        documented = _documented_params(params)
    except SyntaxError as e:
        return [f"`{span}`: the parameters do not parse as a Python signature ({e.msg})"]
    actual = _actual_params(owner, obj, path.rsplit(".", 1)[-1])
    want = [(p.name, p.kind.name, p.default is not p.empty) for p in actual]
    got = [d[:3] for d in documented]
    if got != want:
        real = ", ".join(str(p.replace(annotation=p.empty)) for p in actual)
        return [f"`{span}`: the signature is ({real})"]
    problems = []
    for (pname, _, _, node), p in zip(documented, actual):
        if node is None:
            continue
        try:
            value = ast.literal_eval(node)
        except ValueError:
            continue  # not a literal (e.g. frozenset()): the text is not compared
        if type(value) is not type(p.default) or value != p.default:
            problems.append(f"`{span}`: the default of {pname} is {p.default!r}")
    return problems


# ---- what must be documented -----------------------------------------------------------------


def _module_names(module: object) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return [  # no __all__ (nablax.errors): what the module defines itself
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    ]


def _own_members(cls: type) -> list[str]:
    names = [n for n in vars(cls) if not n.startswith("_")]
    own = set(vars(cls).get("__annotations__", {}))
    names += [f for f in _fields(cls) if f not in names and (f in own or hasattr(cls, "_fields"))]
    return names


def _constructor_params(items: list[Item]) -> dict[str, set[str]]:
    """Class path -> parameter names of its documented constructor."""
    out: dict[str, set[str]] = {}
    for item in items:
        for span in item.spans if item.kind == "api" else ():
            params = _NAME.fullmatch(span).group(2)
            if params is not None:
                try:
                    names = {d[0] for d in _documented_params(params)}
                except SyntaxError:
                    continue
                out.setdefault(canonical(span), set()).update(names)
    return out


def undocumented(items: list[Item]) -> list[str]:
    """Public names of ``COVERED`` and public members of documented classes not defined."""
    documented = {canonical(s) for it in items if it.kind == "api" for s in it.spans}
    missing = []
    for mod_path in COVERED:
        _, module = resolve(mod_path)
        missing += [
            f"{mod_path}.{n}" for n in _module_names(module) if f"{mod_path}.{n}" not in documented
        ]
    ctor = _constructor_params(items)
    for path in sorted(documented):
        try:
            _, obj = resolve(path)
        except LookupError:
            continue  # reported by the existence test
        if not inspect.isclass(obj) or issubclass(obj, BaseException):
            continue
        if not obj.__module__.startswith("nablax"):
            continue
        for m in _own_members(obj):
            if f"{path}.{m}" not in documented and m not in ctor.get(path, set()):
                missing.append(f"{path}.{m}")
    return missing


# ---- the tests -------------------------------------------------------------------------------

ITEMS = parse(DOC.read_text(encoding="utf-8"))


def test_every_definition_names_an_existing_object_with_that_signature():
    spans = [(it.line, s) for it in ITEMS if it.kind == "api" for s in it.spans]
    problems = [f"docs/api.md line {line}: {p}" for line, s in spans for p in check(s)]
    assert not problems, "\n".join(problems)


def test_every_public_name_and_member_is_documented():
    missing = undocumented(ITEMS)
    assert not missing, (
        "public names without an entry in docs/api.md (add a `- `name(...)` — ...` line):\n"
        + "\n".join(missing)
    )


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    from nablax import cli

    parser = cli._parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_command_is_documented_with_its_options():
    commands = _subcommands()
    documented = {}
    for it in ITEMS:
        if it.kind == "cli":
            documented[it.spans[0].split()[1]] = it
    assert set(documented) == set(commands), "`nablax <command>` entries differ from the CLI's"
    for name, parser in commands.items():
        span = documented[name].spans[0]
        options = {
            o for a in parser._actions for o in a.option_strings if o not in ("-h", "--help")
        }
        assert set(re.findall(r"--[a-z][a-z-]*", span)) == options, (
            f"docs/api.md line {documented[name].line}: `nablax {name}` takes {sorted(options)}"
        )
        for a in parser._actions:
            if not a.option_strings:
                token = a.metavar or (
                    "{" + ",".join(a.choices) + "}" if a.choices else a.dest.upper()
                )
                assert token in span, f"`nablax {name}`: positional argument {token} not shown"


def test_every_environment_variable_is_documented_with_its_option():
    from nablax import _config

    want = {"NABLAX_" + name.upper(): name for name in _config.options()}
    documented = {it.spans[0]: it for it in ITEMS if it.kind == "env"}
    assert set(documented) == set(want), "NABLAX_* entries differ from nablax._config's options"
    for env, name in want.items():
        assert f"`{name}`" in documented[env].text, f"{env}: name its option `{name}`"


def test_readme_points_to_the_reference():
    text = README.read_text(encoding="utf-8")
    assert "docs/api.md" in text
    assert "`shared/`" not in text, "README.md sends users to a folder they do not have"


# ---- running the examples --------------------------------------------------------------------


def _sections() -> list:
    readme = _readme_helpers()
    try:
        return readme.parse(DOC.read_text(encoding="utf-8"))
    except ValueError as e:  # the parser names README.md in its messages
        raise ValueError(str(e).replace("README.md", "docs/api.md")) from None


def _expect(value, expected, line: int) -> None:
    readme = _readme_helpers()
    assert readme._equal(value, expected), (
        f"docs/api.md line {line}: the comment says {expected!r}, the code gives "
        f"{readme._plain(value)!r}"
    )


def _run(tree, ns: dict) -> None:
    # dont_inherit: this file's `from __future__ import annotations` must not reach the examples
    exec(compile(tree, str(DOC), "exec", dont_inherit=True), ns)


def run_section(section) -> None:
    readme = _readme_helpers()
    ns: dict = {"__name__": "__api_doc__", "__readme_expect__": _expect}
    for block in section.blocks:
        if block.skip is not None:
            continue
        for line, code in block.setup:
            _run(readme._shifted(code, line), ns)
        _run(readme._with_checks(block.code, block.line), ns)
        for line, code in block.checks:
            _run(readme._shifted(code, line), ns)


SECTIONS = _sections()


@pytest.mark.parametrize(
    "index",
    range(len(SECTIONS)),
    ids=[
        f"{k}-{re.sub(r'[^a-z0-9]+', '-', s.title.lower()).strip('-')}"
        for k, s in enumerate(SECTIONS)
    ],
)
def test_examples_run(index):
    section = SECTIONS[index]
    if all(b.skip is not None for b in section.blocks):
        pytest.skip("; ".join(b.skip for b in section.blocks))
    if section.devices > 1:
        pytest.skip("multi-device examples belong in README.md, which runs them in a subprocess")
    run_section(section)


# ---- the checker itself ----------------------------------------------------------------------

_SAMPLE = """\
## Things: `nx.tree`

- `nx.tensor(data)`, `nx.ones(shape, dtype=1)` — one parameter short; a wrong default.
- `nx.add(x1, x2)`, `Tensor.shape`, `nx.no_such_name` — fine, fine, missing.
- `kernels.Kernel.run(*args, cfg, **kw)`, `nx.DeviceMesh.from_jax(mesh)` — methods.
- `nx.DeviceMesh(shape, axis_names, devices=None)` — a class.
- `xcs.Classification(kind, reasons, jax_traceable, effects=False)` — a dataclass.
- `nablax tune [--ops OPS]` — a command.
- `NABLAX_AUTOTUNE` — option `autotune`.
- `other` text — prose, not a definition.

```python
- `nx.inside_a_fence` — ignored
```
"""


def test_parse_finds_definitions_commands_and_variables():
    items = parse(_SAMPLE)
    assert [(it.line, it.kind) for it in items] == [
        (1, "api"), (3, "api"), (4, "api"), (5, "api"), (6, "api"), (7, "api"), (8, "cli"),
        (9, "env"),
    ]  # fmt: skip
    assert items[0].spans == ["nx.tree"]
    assert canonical(items[2].spans[1]) == "nablax.Tensor.shape"
    with pytest.raises(ValueError, match="line 1: 'typo' before the dash"):
        parse("- `nx.add(x1, x2)`, `typo` — text\n")
    with pytest.raises(ValueError, match="needs ' — '"):
        parse("- `nx.add(x1, x2)` has no dash\n")


def test_check_reports_missing_names_and_wrong_signatures():
    items = parse(_SAMPLE)
    problems = {s: check(s) for it in items if it.kind == "api" for s in it.spans}
    assert problems["nx.tensor(data)"] == ["`nx.tensor(data)`: the signature is (data, dtype=None)"]
    assert problems["nx.ones(shape, dtype=1)"] == [
        "`nx.ones(shape, dtype=1)`: the default of dtype is None"
    ]
    assert "no such name" in problems["nx.no_such_name"][0]
    ok = ["nx.add(x1, x2)", "Tensor.shape", "kernels.Kernel.run(*args, cfg, **kw)"]
    ok += ["nx.DeviceMesh.from_jax(mesh)", "nx.DeviceMesh(shape, axis_names, devices=None)"]
    ok += ["xcs.Classification(kind, reasons, jax_traceable, effects=False)"]
    assert all(problems[s] == [] for s in ok), {s: problems[s] for s in ok}
    assert check("nx.add(x1, *, x2)") != []  # a keyword-only parameter that is not one


def test_undocumented_names_members_and_fields():
    missing = set(undocumented(parse(_SAMPLE)))
    assert "nablax.subtract" in missing and "nablax.tree.map" in missing
    assert "nablax.add" not in missing
    assert "nablax.DeviceMesh.size" in missing  # a member of a documented class
    assert "nablax.DeviceMesh.from_jax" not in missing
    assert "nablax.kernels.Kernel.run" not in missing
    assert "nablax.xcs.Classification.kind" not in missing  # a field, in the constructor

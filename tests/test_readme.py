"""Run the Python examples of README.md as a user would, and check what their comments claim.

Conventions in README.md (the directives are HTML comments, invisible when the page is rendered):

- Every fenced block opened with ```` ```python ```` runs (other fences, e.g. shell commands, do
  not). The blocks of one *section* (the text between two headings of any level) run in order in
  one namespace; every section starts with a fresh namespace, so a section's examples may build on
  each other but never on another section's. Nothing is pre-imported.
- ``<!-- readme-setup`` ... ``-->`` right before a block (only blank lines or other directives in
  between): its body is Python run in the section's namespace just before the block. It defines
  what the example takes from elsewhere (``params``, ``x``, ...), with the shapes its comments
  mention. Keep it short: the visible code is the example.
- ``<!-- readme-check`` ... ``-->`` right after a block: Python run just after it, asserting what
  the surrounding text promises against a reference (JAX, NumPy, plain Python).
- ``<!-- readme-skip: REASON -->`` before a block: the block does not run; REASON is required (a
  section whose blocks are all skipped is reported as skipped with it). Keep these rare.
- ``<!-- readme-devices: N -->`` before a block: its section needs N devices. If this process has
  fewer, the whole section runs in a fresh Python process with
  ``XLA_FLAGS=--xla_force_host_platform_device_count=N`` (it must be set before JAX starts).
- A line of a block that is a single expression with a trailing comment that is a Python literal,
  or starts with one followed by ``": "`` (``y.is_realized  # False``, ``g.shape  # (8, 4): ...``),
  is checked: the expression's value must equal the literal (a Tensor or array is compared by its
  ``tolist()``; numbers within 1e-6, relative and absolute).

Any other ``<!-- readme-...`` comment, or a setup/skip/devices directive not followed by a block,
or a check not following one, fails the parse test, so a typo cannot silently drop a check.
Run a section on its own with ``python tests/test_readme.py INDEX``.
"""

from __future__ import annotations

import ast
import io
import math
import os
import re
import subprocess
import sys
import textwrap
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
_DIRECTIVE = re.compile(r"<!--\s*readme-([a-z]+)\s*:?(.*)$")
_BEFORE = ("setup", "skip", "devices")


@dataclass
class Block:
    line: int  # README line of the block's first code line (1-based)
    code: str
    setup: list[tuple[int, str]] = field(default_factory=list)  # (line, code)
    checks: list[tuple[int, str]] = field(default_factory=list)
    skip: str | None = None
    devices: int = 1


@dataclass
class Section:
    title: str
    line: int
    blocks: list[Block] = field(default_factory=list)

    @property
    def devices(self) -> int:
        return max((b.devices for b in self.blocks if b.skip is None), default=1)


def _read_directive(lines: list[str], i: int) -> tuple[str, str, int, int]:
    """``(name, body, body_line, next_i)`` of the directive comment starting at ``lines[i]``."""
    m = _DIRECTIVE.match(lines[i].strip())
    name, rest = m.group(1), m.group(2)
    if "-->" in rest:  # one line: <!-- readme-skip: reason -->
        return name, rest.split("-->")[0].strip(), i + 1, i + 1
    body = []
    j = i + 1
    while j < len(lines) and "-->" not in lines[j]:
        body.append(lines[j])
        j += 1
    if j == len(lines):
        raise ValueError(f"README.md line {i + 1}: readme-{name} comment is never closed (-->)")
    return name, textwrap.dedent("\n".join(body)), i + 2, j + 1


def parse(text: str) -> list[Section]:
    """The sections of ``text`` that have Python blocks, with their directives attached."""
    lines = text.splitlines()
    sections = [Section("(top)", 1)]
    pending: list[tuple[str, str, int]] = []  # directives waiting for the next block
    last_block: Block | None = None  # the block a readme-check may follow
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("```"):
            lang = stripped[3:].strip().lower()
            start = i + 1
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                i += 1
            if i == len(lines):
                raise ValueError(f"README.md line {start}: code fence never closed")
            i += 1
            if lang not in ("python", "py"):
                if pending:
                    raise ValueError(
                        f"README.md line {start}: directives before a non-Python fence"
                    )
                last_block = None
                continue
            block = Block(start + 1, "\n".join(lines[start : i - 1]))
            for name, body, line in pending:
                if name == "setup":
                    block.setup.append((line, body))
                elif name == "skip":
                    if not body:
                        raise ValueError(f"README.md line {line}: readme-skip needs a reason")
                    block.skip = body
                else:
                    block.devices = max(block.devices, int(body))
            pending = []
            sections[-1].blocks.append(block)
            last_block = block
            continue
        if stripped.startswith("<!--") and _DIRECTIVE.match(stripped):
            name, body, line, i = _read_directive(lines, i)
            if name == "check":
                if last_block is None:
                    raise ValueError(f"README.md line {line}: readme-check must follow a block")
                last_block.checks.append((line, body))
            elif name in _BEFORE:
                pending.append((name, body, line))
            else:
                raise ValueError(f"README.md line {line}: unknown directive readme-{name}")
            continue
        if stripped:
            if pending:
                raise ValueError(
                    f"README.md line {i + 1}: readme-{pending[0][0]} (line {pending[0][2]}) must be "
                    "followed by a ```python block"
                )
            last_block = None
            if stripped.startswith("#"):
                sections.append(Section(stripped.lstrip("#").strip(), i + 1))
        i += 1
    if pending:
        raise ValueError(f"README.md: readme-{pending[0][0]} at the end, with no block after it")
    return [s for s in sections if s.blocks]


# ---- running ---------------------------------------------------------------------------------


def _expected_literal(comment: str):
    """The literal a trailing comment states, as an AST expression, or None."""
    text = comment.lstrip("#").strip()
    for candidate in (text, text.split(": ", 1)[0]):
        try:
            node = ast.parse(candidate, mode="eval").body
            ast.literal_eval(node)
        except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
            continue
        return node
    return None


def _with_checks(code: str, first_line: int) -> ast.Module:
    """``code`` parsed, with every checked expression line (see the module docstring) turned into
    a call ``__readme_expect__(value, literal, line)``; line numbers are README's."""
    comments = {}
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string
    tree = ast.parse(code)
    body = []
    for stmt in tree.body:
        literal = None
        if isinstance(stmt, ast.Expr) and stmt.lineno == stmt.end_lineno:
            if stmt.lineno in comments:
                literal = _expected_literal(comments[stmt.lineno])
        if literal is not None:
            call = ast.Call(
                ast.Name("__readme_expect__", ast.Load()),
                [stmt.value, literal, ast.Constant(stmt.lineno + first_line - 1)],
                [],
            )
            stmt = ast.copy_location(ast.Expr(call), stmt)
        body.append(stmt)
    tree.body = body
    ast.fix_missing_locations(tree)
    ast.increment_lineno(tree, first_line - 1)
    return tree


def _plain(value):
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple, str)):
        return value.tolist()  # nablax Tensor, NumPy and JAX arrays and scalars
    return value


def _equal(got, want) -> bool:
    got = _plain(got)
    if isinstance(want, bool) or isinstance(got, bool):
        return type(got) is type(want) and got == want
    if isinstance(want, (int, float)) and isinstance(got, (int, float)):
        return math.isclose(got, want, rel_tol=1e-6, abs_tol=1e-6)
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return len(got) == len(want) and all(_equal(g, w) for g, w in zip(got, want))
    return type(got) is type(want) and got == want


def _expect(value, expected, line: int) -> None:
    assert _equal(value, expected), (
        f"README.md line {line}: the comment says {expected!r}, the code gives {_plain(value)!r}"
    )


def run_section(section: Section) -> list[str]:
    """Run a section's blocks in one fresh namespace; return the skip reasons of skipped blocks."""
    ns: dict = {"__name__": "__readme__", "__readme_expect__": _expect}
    skipped = []
    name = str(README)
    for block in section.blocks:
        if block.skip is not None:
            skipped.append(f"README.md line {block.line}: {block.skip}")
            continue
        for line, code in block.setup:
            exec(compile(_shifted(code, line), name, "exec"), ns)
        exec(compile(_with_checks(block.code, block.line), name, "exec"), ns)
        for line, code in block.checks:
            exec(compile(_shifted(code, line), name, "exec"), ns)
    return skipped


def _shifted(code: str, first_line: int) -> ast.Module:
    tree = ast.parse(code)
    ast.increment_lineno(tree, first_line - 1)
    return tree


def _device_count() -> int:
    import jax

    return jax.device_count()


def _run_in_subprocess(index: int, devices: int) -> None:
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    src = README.parent / "src"
    env["PYTHONPATH"] = str(src) + os.pathsep + env.get("PYTHONPATH", "")
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), str(index)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def _sections() -> list[Section]:
    return parse(README.read_text(encoding="utf-8"))


def _slug(title: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


SECTIONS = _sections()


@pytest.mark.parametrize(
    "index", range(len(SECTIONS)), ids=[f"{k}-{_slug(s.title)}" for k, s in enumerate(SECTIONS)]
)
def test_readme_section(index):
    section = SECTIONS[index]
    if all(b.skip is not None for b in section.blocks):
        pytest.skip("; ".join(f"README.md line {b.line}: {b.skip}" for b in section.blocks))
    if section.devices > _device_count():
        _run_in_subprocess(index, section.devices)
    else:
        run_section(section)


def test_readme_has_examples_of_every_layer():
    titles = " ".join(s.title for s in SECTIONS).lower()
    for word in ("nablax", "autodiff", "vmap", "sharding", "kernels", "orchestration"):
        assert word in titles, f"no runnable README example under a heading naming {word!r}"


# ---- the conventions themselves --------------------------------------------------------------

_DEMO = """\
# Title

<!-- readme-setup
a = 2
-->
```python
b = a * 3
b          # 6
[b, 1.5]   # [6, 1.5]: a list
```
<!-- readme-check
assert b == 6
-->

## Other

<!-- readme-skip: needs two hosts -->
```python
raise RuntimeError("never runs")
```
"""


def test_conventions_setup_check_literal_comments_and_skip():
    sections = parse(_DEMO)
    assert [s.title for s in sections] == ["Title", "Other"]
    first, other = sections
    assert first.blocks[0].setup[0][1].strip() == "a = 2"
    assert run_section(first) == []
    assert run_section(other) == [f"README.md line {other.blocks[0].line}: needs two hosts"]


def test_a_wrong_literal_comment_fails_with_its_line():
    (section,) = parse("# T\n```python\nx = [1.0, 2.0]\nx  # [1.0, 3.0]\n```\n")
    with pytest.raises(AssertionError, match=r"line 4: the comment says \[1.0, 3.0\]"):
        run_section(section)
    (section,) = parse("# T\n```python\nTrue  # 1\n```\n")  # bool is not an int here
    with pytest.raises(AssertionError):
        run_section(section)


def test_comments_that_are_not_literals_are_prose():
    (section,) = parse("# T\n```python\nx = 5\nx  # lazy: records a graph\nprint(x)  # ok\n```\n")
    run_section(section)


@pytest.mark.parametrize(
    "text, message",
    [
        ("<!-- readme-setpu\nx = 1\n-->\n```python\nx\n```\n", "unknown directive"),
        ("<!-- readme-setup\nx = 1\n-->\nsome prose\n```python\nx\n```\n", "must be followed"),
        ("<!-- readme-check\nassert True\n-->\n", "must follow a block"),
        ("<!-- readme-skip -->\n```python\nx\n```\n", "needs a reason"),
        ("<!-- readme-setup\nx = 1\n", "never closed"),
    ],
)
def test_malformed_directives_are_errors(text, message):
    with pytest.raises(ValueError, match=message):
        parse(text)


if __name__ == "__main__":  # python tests/test_readme.py INDEX: one section, in this process
    run_section(SECTIONS[int(sys.argv[1])])
    print(f"ok section {sys.argv[1]}")

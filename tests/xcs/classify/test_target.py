"""``classify/target.py``: ``xcs.classify_target`` of a file or module, and the table ``nablax
classify`` prints.

Issue 35: ``xcs.classify_target`` of a file that is not Python source (``/etc/passwd``, a
``.txt``, a directory) raised ``'NoneType' object has no attribute 'loader'`` or a misleading "no
such file"; it must raise a ValueError naming the path and saying what is accepted, as the
``nablax classify`` command already does."""

from __future__ import annotations

import os
import textwrap

import pytest

from nablax import cli
from nablax.xcs.classify.analysis import Classification, classify, classify_target, format_table
from nablax.xcs.markers import marker_of

from .corpus import CORPUS

SOURCE = "def double(x):\n    return x * 2\n"


@pytest.mark.parametrize("name", ["notes.txt", "passwd", "script.py.bak", "data.json"])
def test_a_file_that_is_not_python_source_is_refused(tmp_path, name):
    path = tmp_path / name
    path.write_text(SOURCE)  # valid Python inside: the suffix alone decides, as for import
    for target in (path, str(path)):
        with pytest.raises(ValueError) as info:
            classify_target(target)
        msg = str(info.value)
        assert msg.startswith("xcs.classify_target: argument `path_or_module`")
        assert str(path) in msg and "not a Python source file" in msg
        assert "importable module names are accepted" in msg and "Fix:" in msg


@pytest.mark.skipif(not os.path.isfile("/etc/passwd"), reason="needs /etc/passwd")
def test_etc_passwd():
    with pytest.raises(ValueError, match=r"'/etc/passwd' is not a Python source file"):
        classify_target("/etc/passwd")


def test_a_directory_is_refused_by_name(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SOURCE)
    with pytest.raises(ValueError, match=r"pkg'? is a directory; only Python source files"):
        classify_target(tmp_path / "pkg")


def test_a_python_file_still_classifies(tmp_path):
    path = tmp_path / "ok_target_audit.py"
    path.write_text(SOURCE)
    assert [n for n, _ in classify_target(path)] == ["double"]


def test_the_cli_and_the_api_agree(tmp_path, capsys):
    # the command refuses before calling the API, and reports the API's own errors as usage
    # errors (exit 2) because they start with "xcs.classify_target"
    path = tmp_path / "notes.txt"
    path.write_text(SOURCE)
    assert cli.main(["classify", str(path)]) == 2
    assert "not a Python source file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="not a Python source file"):
        classify_target(str(path))


def test_classify_target_on_a_file_and_a_module():
    rows = classify_target(CORPUS / "ops_tools.py")
    names = [n for n, _ in rows]
    assert names[:3] == ["git_revision", "disk_usage_gb", "record_event"]  # source order
    assert dict(rows)["slugify"].kind == "pure"
    rows = classify_target("nablax.xcs.markers")
    assert ("marker_of", classify(marker_of)) in rows
    methods = [n for n, _ in classify_target(str(CORPUS / "agents.py")) if "." in n]
    assert "WebAgent.fetch" in methods and "Summarizer.__call__" in methods


def test_format_table():
    rows = [
        ("score", Classification("tensor", ("calls jnp.dot (JAX) at line 3",), True)),
        (
            "ask",
            Classification("orchestration", ("calls a (LLM API)", "calls b (HTTP I/O)"), False),
        ),
    ]
    text = format_table(rows)
    expected = textwrap.dedent(
        """\
        name   kind           reasons
        -----  -------------  -----------------------------
        score  tensor         calls jnp.dot (JAX) at line 3
        ask    orchestration  calls a (LLM API)
                              calls b (HTTP I/O)

        2 callables: 1 tensor, 1 orchestration"""
    )
    assert text == expected

"""``classify/rules.py``: a dotted name's rule is the one of its longest whole-component prefix
(checked against a brute-force search of the table), private module names read as the public
ones, and standard-library names without a rule are neutral."""

from __future__ import annotations

import pytest

from nablax.xcs.classify import rules
from nablax.xcs.classify.records import Rule

PATHS = [
    "numpy.add",
    "numpy.float32",
    "numpy.linalg.norm",
    "numpy.savez",
    "jax.numpy.dot",
    "jax.device_get",
    "requests.post",
    "requests_count",
    "relax.lax",
    "os.path.exists",
    "os.remove",
    "os.getcwd",
    "urllib.parse.quote",
    "urllib.request.urlopen",
    "builtins.print",
    "builtins.len",
    "json.dumps",
    "json.dump",
    "nablax.xcs.loopback.chat",
    "nablax.xcs.markers.marker_of",
    "nablax.xcs.demo.pipeline",
    "pathlib.Path.read_text",
    "my_project.helpers",
]


def _brute_force(path: str) -> Rule | None:
    best = None
    for key, rule in rules.RULES.items():
        if (path == key or path.startswith(key + ".")) and (
            best is None or len(key) > len(best[0])
        ):
            best = (key, rule)
    if best is not None:
        return None if best[1] is rules.USER_CODE else best[1]
    return rules.NEUTRAL if path.split(".")[0] in rules.STDLIB else None


@pytest.mark.parametrize("path", PATHS)
def test_lookup_is_the_longest_whole_component_prefix(path):
    assert rules.lookup(path) == _brute_force(path)


def test_some_rules_by_name():
    assert rules.lookup("numpy.add") is rules.NUMPY
    assert rules.lookup("numpy.float32") is rules.NUMPY_CONST and rules.NUMPY_CONST.traceable
    assert rules.lookup("requests.post") is rules.HTTP
    assert rules.lookup("requests_count") is None and rules.lookup("relax.lax") is None
    assert rules.lookup("os.getcwd") is rules.NEUTRAL  # standard library, no rule: neutral
    assert rules.lookup("builtins.exec") is rules.DYNAMIC
    assert rules.lookup("nablax.xcs.demo.pipeline") is None  # example user code, read as such


@pytest.mark.parametrize(
    "private, public",
    [
        ("posixpath.join", "os.path.join"),
        ("posix.remove", "os.remove"),
        ("_io.TextIOWrapper", "io.TextIOWrapper"),
        ("_sqlite3.connect", "sqlite3.connect"),
        ("numpy.add", "numpy.add"),
    ],
)
def test_canonical_names(private, public):
    assert rules.canonical(private) == public


def test_llm_suffixes_match_whole_endings():
    assert (
        rules.llm_suffix(("client", "chat", "completions", "create")) == "chat.completions.create"
    )
    assert rules.llm_suffix(("anthropic", "messages", "create")) == "messages.create"
    assert rules.llm_suffix(("chat", "completions")) is None
    assert rules.llm_suffix(("create",)) is None


def test_every_rule_says_what_it_is():
    table = list(rules.RULES.values()) + list(rules.METHOD_HINTS.values())
    assert all(isinstance(r, Rule) and r.what for r in table)
    kinds = {r.kind for r in table}
    assert kinds == {"tensor", "orchestration", "neutral", "unknown", "user"}

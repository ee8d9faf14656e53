"""Issue 35 item 17: the ``nablax`` command answers bad paths with one clear line and exit code 2,
before doing any work."""

from __future__ import annotations

import os

import pytest

from nablax import cli


def test_cache_with_a_folder_as_path_is_a_usage_error(tmp_path, capsys):
    for action in ("list", "show", "clear"):
        assert cli.main(["cache", action, "--path", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert f"nablax cache {action}: --path" in err and "is a directory" in err, err
        assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # nothing was created


@pytest.mark.parametrize("target", ["/etc/passwd", "data.csv"])
def test_classify_a_file_that_is_not_python_source(tmp_path, capsys, target):
    if target == "data.csv":
        target = str(tmp_path / target)
        with open(target, "w") as f:
            f.write("a,b\n1,2\n")
    elif not os.path.isfile(target):
        pytest.skip("no /etc/passwd here")
    assert cli.main(["classify", target]) == 2
    err = capsys.readouterr().err
    assert "is not a Python source file (.py)" in err and "NoneType" not in err, err


def test_classify_a_directory_says_so(tmp_path, capsys):
    assert cli.main(["classify", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "is a directory" in err and "no such file" not in err, err


@pytest.mark.parametrize(
    "out, says",
    [
        ("/nonexistent-nablax-dir/x.json", "does not exist"),
        ("{tmp}", "is a directory"),
    ],
)
def test_bench_checks_out_before_running(tmp_path, monkeypatch, capsys, out, says):
    ran = []
    monkeypatch.setattr(cli, "_find_bench_script", lambda: tmp_path / "bench_eager.py")
    monkeypatch.setattr(cli.runpy, "run_path", lambda *a, **k: ran.append(a) or {"main": len})
    assert cli.main(["bench", "--quick", "--out", out.format(tmp=tmp_path)]) == 2
    assert not ran, "the benchmark ran before --out was checked"
    err = capsys.readouterr().err
    assert err.startswith("nablax bench: --out") and says in err, err


def test_bench_with_a_writable_out_runs(tmp_path, monkeypatch):
    got = []
    monkeypatch.setattr(cli, "_find_bench_script", lambda: tmp_path / "bench_eager.py")
    monkeypatch.setattr(cli.runpy, "run_path", lambda *a, **k: {"main": got.append})
    assert cli.main(["bench", "--quick", "--out", str(tmp_path / "r.json")]) == 0
    assert got == [["--quick", "--out", str(tmp_path / "r.json")]]

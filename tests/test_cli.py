"""The ``nablax`` command line and the demo it runs."""

from __future__ import annotations

import pytest

from nablax import cli, demo


def test_demo_learns_and_compiles_once():
    lines: list[str] = []
    r = demo.run(steps=30, print_fn=lines.append)
    assert len(r.losses) == 30
    assert r.losses[-1] < r.losses[0] * 0.5, r.losses
    assert all(b <= a + 1e-6 for a, b in zip(r.losses, r.losses[1:])), "loss must not go up"
    assert r.accuracy > 0.9
    # every step has the same graph structure: at most one compile, the rest are cache hits
    assert r.compiles <= 1
    assert r.compiles + r.hits == 30
    text = "\n".join(lines)
    assert "loss" in text and "accuracy" in text and "CacheInfo" in text


def test_demo_is_deterministic_and_silent():
    a = demo.run(steps=3, print_fn=None, features=2)
    b = demo.run(steps=3, print_fn=None, features=2)
    assert a.losses == b.losses
    assert a.accuracy == b.accuracy


def test_make_blobs_is_balanced_and_separable():
    X, y = demo.make_blobs(512, features=8, seed=1)
    assert X.shape == (512, 8) and X.dtype.name == "float32"
    assert y.sum() == 256
    # the class means lie on opposite sides of the origin
    assert (X[y > 0.5].mean(0) > 0).all() and (X[y < 0.5].mean(0) < 0).all()


def test_cli_demo_prints_report(capsys):
    assert cli.main(["demo", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "final accuracy" in out
    assert "cache_info" in out


@pytest.mark.parametrize(
    "argv", [["tune"], ["cache"], ["cache", "clear"], ["classify", "some.module"]]
)
def test_placeholders_say_not_available(argv, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "not available yet: arrives with the kernels / xcs layer" in err


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main([])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        cli.main(["no-such-command"])
    assert e.value.code == 2


def test_bench_without_checkout_explains(monkeypatch, capsys):
    monkeypatch.setattr(cli, "_find_bench_script", lambda: None)
    assert cli.main(["bench"]) == 2
    assert "bench/bench_eager.py" in capsys.readouterr().err

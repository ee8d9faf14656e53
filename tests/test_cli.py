"""The ``nablax`` command line and the demo it runs."""

from __future__ import annotations

import numpy as np
import pytest

import nablax as nx
from nablax import cli, demo


def test_demo_trains_mlp_and_compiles_each_program_once():
    lines: list[str] = []
    r = demo.run(steps=250, print_fn=lines.append)
    assert len(r.losses) == 250
    assert r.losses[-1] < r.losses[0] * 0.2, r.losses
    # momentum may wiggle the loss from step to step, but every window of 25 steps improves on
    # the window before it
    windows = [sum(r.losses[i : i + 25]) for i in range(0, 250, 25)]
    assert all(b < a for a, b in zip(windows, windows[1:])), windows
    assert r.accuracy > 0.9
    # every step has the same graph structure, realized as two programs (the loss, then the
    # asynchronous backward pass and update): two compiles, the rest are cache hits
    assert r.compiles <= 2  # 0 if an earlier test in this process compiled them
    assert r.compiles + r.hits == 2 * 250
    text = "\n".join(lines)
    assert "loss" in text and "accuracy" in text and "CacheInfo" in text


def test_demo_is_deterministic_and_silent(capsys):
    a = demo.run(steps=3, print_fn=None, hidden=8)
    b = demo.run(steps=3, print_fn=None, hidden=8)
    assert a.losses == b.losses
    assert a.accuracy == b.accuracy
    assert capsys.readouterr().out == ""


def test_demo_uses_autodiff_gradients():
    # the gradients the demo trains with are nx.value_and_grad's: check them against a
    # central finite difference of the loss on one weight
    X, y = demo.make_spirals(30)
    x, yt = nx.tensor(X), nx.tensor(y)
    params = demo.init_params((2, 4, 4, 3))
    _, grads = nx.value_and_grad(demo.loss_fn)(params, x, yt)
    w = params[1]["w"].numpy().astype(np.float64)
    eps = 1e-2

    def loss_at(delta):
        w2 = w.copy()
        w2[0, 1] += delta
        p2 = [dict(layer) for layer in params]
        p2[1]["w"] = nx.tensor(w2.astype(np.float32))
        return demo.loss_fn(p2, x, yt).item()

    fd = (loss_at(eps) - loss_at(-eps)) / (2 * eps)
    assert abs(grads[1]["w"].numpy()[0, 1] - fd) < 1e-3


def test_make_spirals_is_balanced_and_bounded():
    X, y = demo.make_spirals(300, classes=3, seed=1)
    assert X.shape == (300, 2) and X.dtype.name == "float32"
    assert y.dtype.name == "int32"
    assert np.bincount(y).tolist() == [100, 100, 100]
    assert (np.linalg.norm(X, axis=1) <= 1.0 + 1e-6).all()
    X2, y2 = demo.make_spirals(300, classes=3, seed=1)
    assert (X == X2).all() and (y == y2).all()


def test_cli_demo_prints_report(capsys):
    assert cli.main(["demo", "--steps", "5"]) == 0
    out = capsys.readouterr().out
    assert "final train accuracy" in out
    assert "cache_info" in out


def test_classify_prints_a_table(tmp_path, capsys):
    src = tmp_path / "pipeline_mod.py"
    src.write_text(
        "import urllib.request\n"
        "import jax.numpy as jnp\n\n"
        "def fetch(url):\n    return urllib.request.urlopen(url).read()\n\n"
        "def score(x):\n    return jnp.tanh(x).sum()\n"
    )
    assert cli.main(["classify", str(src)]) == 0
    out = capsys.readouterr().out
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "orchestration" in lines["fetch"] and "tensor" in lines["score"]
    assert cli.main(["classify", str(tmp_path / "missing.py")]) == 2


@pytest.fixture
def fresh_default_executor(tmp_path, monkeypatch):
    """The default executor with its persistent database in tmp_path (the CLI and the library
    wrappers use the default executor)."""
    from nablax.kernels import ConfigSelectorChain, Executor, PersistentCache, Tuner
    from nablax.kernels import executor as ex_mod

    store = PersistentCache(tmp_path / "kernels.sqlite")
    ex = Executor(ConfigSelectorChain(tuner=Tuner(warmup=1, iters=2), persistent=store))
    monkeypatch.setattr(ex_mod, "_default", ex)
    yield ex
    store.close()


def test_tune_then_cache_list_show_clear(fresh_default_executor, capsys):
    path = str(fresh_default_executor.chooser.persistent.path)
    assert cli.main(["tune", "--ops", "matmul", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "[1/2] matmul@v1" in out and "[2/2] matmul@v1" in out and "candidates" in out
    assert cli.main(["tune", "--ops", "matmul", "--quick"]) == 0  # already tuned: cached
    assert capsys.readouterr().out.count(": cached ") == 2
    assert cli.main(["cache", "list", "--path", path]) == 0
    out = capsys.readouterr().out
    assert "2 entries" in out and out.count("matmul@v1") == 2 and "autotune" in out
    key = fresh_default_executor.chooser.persistent.entries()[0].call_key
    assert cli.main(["cache", "show", key[:10], "--path", path]) == 0
    out = capsys.readouterr().out
    assert f"call key: {key}" in out and "timings:" in out and " ms  MatmulCfg(" in out
    assert cli.main(["cache", "show", "nope", "--path", path]) == 1
    assert cli.main(["cache", "clear", "--path", path]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert cli.main(["tune", "--ops", "conv"]) == 2


def test_kernel_demo_trains_through_tuned_kernels(fresh_default_executor):
    lines: list[str] = []
    r = demo.run_kernels(steps=20, print_fn=lines.append)
    assert r["losses"][-1] < r["losses"][0] * 0.8, r["losses"]
    assert [c["op"] for c in r["configs"]] == ["matmul@v1", "attention@v1", "matmul@v1"]
    assert all(c["source"] == "autotune, tuned in this run" for c in r["configs"])
    r2 = demo.run_kernels(steps=2, print_fn=None)
    assert all(c["source"] == "autotune, already in the database" for c in r2["configs"])
    assert "attention classifier on tuned kernels" in lines[0]


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


def test_dp_sgd_demo_trains_with_clipped_per_example_gradients():
    r = demo.run_dp_sgd(steps=300, print_fn=None)
    assert len(r.losses) == 300
    assert r.accuracy > 0.85, r.accuracy
    assert 0.0 < r.clipped_fraction < 1.0


def test_dp_sgd_step_matches_a_per_example_loop():
    # with noise 0 the step is deterministic: compare with per-example nx.grad in a Python loop,
    # clipped and averaged in NumPy
    X, y = demo.make_spirals(30)
    x, yt = nx.tensor(X[:6]), nx.tensor(y[:6])
    params = demo.init_params((2, 8, 3), seed=1)
    new, n_clipped = demo.dp_sgd_step(params, x, yt, nx.random.key(0), lr=0.5, clip=0.3, noise=0.0)
    grads = [nx.grad(demo.example_loss)(params, nx.tensor(X[i]), nx.tensor(y[i])) for i in range(6)]
    flat = [[g.numpy() for g in nx.tree.leaves(gs)] for gs in grads]
    norms = [np.sqrt(sum((g**2).sum() for g in gs)) for gs in flat]
    scales = [min(1.0, 0.3 / (n + 1e-12)) for n in norms]
    for k, p in enumerate(nx.tree.leaves(params)):
        mean = sum(s * gs[k] for s, gs in zip(scales, flat)) / 6
        np.testing.assert_allclose(
            nx.tree.leaves(new)[k].numpy(), p.numpy() - 0.5 * mean, rtol=1e-5, atol=1e-6
        )
    assert int(n_clipped.item()) == sum(n > 0.3 for n in norms)


def test_classify_a_file_of_a_package_keeps_its_relative_imports(capsys):
    from pathlib import Path

    import nablax.xcs.demo as xdemo

    assert cli.main(["classify", str(Path(xdemo.__file__))]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    assert "orchestration" in lines["summarize"] and "hybrid" in lines["pipeline"]


# --- numbers are validated; classify reports what the file's top-level code did -----------------


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--steps", "0"], ["--steps", "from 1 to 1000000", "got 0"]),
        (["--steps", "-5"], ["--steps", "got -5"]),
        (["--steps", "2.5"], ["--steps", "got '2.5'"]),
        (["--lr", "0"], ["--lr", "> 0"]),
        (["--lr", "nan"], ["--lr", "got nan"]),
        (["--lr", "inf"], ["--lr", "got inf"]),
        (["--hidden", "0"], ["--hidden", "from 1 to 4096"]),
        (["--seed", "-1"], ["--seed", "from 0"]),
    ],
)
def test_demo_numbers_out_of_range_exit_2_with_one_line(capsys, argv, words):
    with pytest.raises(SystemExit) as e:
        cli.main(["demo", *argv])
    assert e.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert "\n" not in err and err.startswith("nablax demo: argument ")
    assert "Traceback" not in err and captured.out == ""
    for w in words:
        assert w in err


def test_classify_reports_top_level_sys_exit_and_errors(tmp_path, capsys):
    exits = tmp_path / "script_exits.py"
    exits.write_text("import sys\n\ndef f(x):\n    return x\n\nsys.exit(7)\n")
    assert cli.main(["classify", str(exits)]) == 1
    err = capsys.readouterr().err
    assert "sys.exit(7)" in err and "top-level code" in err and '__name__ == "__main__"' in err
    assert "\n" not in err.strip()
    raises = tmp_path / "script_raises.py"
    raises.write_text("def f(x):\n    return x\n\nrate = 1 / 0\n")
    assert cli.main(["classify", str(raises)]) == 1
    err = capsys.readouterr().err
    assert "ZeroDivisionError: division by zero" in err and f"{raises}, line 4" in err
    missing_import = tmp_path / "script_imports.py"
    missing_import.write_text("import no_such_package_xyz\n")
    assert cli.main(["classify", str(missing_import)]) == 1
    assert "ModuleNotFoundError" in capsys.readouterr().err
    assert cli.main(["classify", str(tmp_path / "missing.py")]) == 2  # no such file: usage


def test_classify_help_says_the_top_level_code_runs(capsys):
    with pytest.raises(SystemExit):
        cli.main(["classify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "top-level code RUNS" in text and 'if __name__ == "__main__":' in text

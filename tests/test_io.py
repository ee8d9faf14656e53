"""nx.save / nx.load (safetensors checkpoints) and nx.block_until_ready: round trips of every
dtype and nested trees, like= restoring classes, clear errors for missing, truncated, foreign and
mismatched files, atomic writes, and no code from the file."""

from __future__ import annotations

import collections
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import nablax as nx

DTYPES = [
    "float32",
    "float64",
    "float16",
    "bfloat16",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "bool",
    "complex64",
]


@nx.tree.register_dataclass
class Params:
    w: nx.Tensor
    b: nx.Tensor
    step: int


Pair = collections.namedtuple("Pair", ["mu", "nu"])


def _array(dtype: str):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 3)) * 3
    if dtype == "bool":
        return a > 0
    if dtype.startswith("complex"):
        return (a + 1j * a[::-1]).astype(dtype)
    if dtype == "bfloat16":
        return np.asarray(jnp.asarray(a, dtype=jnp.bfloat16))
    return a.astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_every_dtype(tmp_path, dtype):
    path = tmp_path / "x.safetensors"
    a = _array(dtype)
    t = nx.tensor(a)
    nx.save(path, {"x": t, "raw": a})
    back = nx.load(path)
    # the tensor comes back as it was; the NumPy array too: float64/int64 ones (which tensors,
    # 32-bit as without JAX's x64, would round or wrap) as NumPy arrays of their own dtype
    v = back["x"]
    assert isinstance(v, nx.Tensor) and v.dtype == t.dtype and v.shape == a.shape
    np.testing.assert_array_equal(v.numpy(), t.numpy())
    raw, wide = back["raw"], dtype in ("float64", "int64")
    assert isinstance(raw, np.ndarray if wide else nx.Tensor)
    assert raw.dtype == a.dtype and raw.shape == a.shape
    np.testing.assert_array_equal(raw if wide else raw.numpy(), a)


def test_nested_tree_modules_and_like(tmp_path):
    path = str(tmp_path / "ckpt.safetensors")
    params = Params(w=nx.ones((2, 3)) * 2, b=nx.zeros(3), step=5)
    tree = {
        "model": params,
        "opt": Pair(mu=[nx.full((2,), 0.5), None], nu=(nx.arange(3), 1.5)),
        "name": "run-1",
        "flags": [True, 0],
    }
    nx.save(path, tree)
    plain = nx.load(path)
    # without like=, classes are not rebuilt from the file: their fields come back as dicts
    assert set(plain["model"]) == {"w", "b", "step"} and plain["model"]["step"] == 5
    assert plain["name"] == "run-1" and plain["flags"] == [True, 0]
    back = nx.load(path, like=tree)
    assert isinstance(back["model"], Params) and isinstance(back["opt"], Pair)
    np.testing.assert_array_equal(back["model"].w.numpy(), np.full((2, 3), 2.0, np.float32))
    assert back["model"].step == 5 and back["opt"].mu[1] is None and back["opt"].nu[1] == 1.5
    loss = nx.grad(lambda w: (w * back["opt"].mu[0][0]).sum())(back["model"].w)
    assert loss.tolist() == [[0.5] * 3] * 2


def test_pending_tensors_are_computed_first(tmp_path):
    x = nx.ones(4)
    y = (x * 3 + 1).sum()
    assert not y.is_realized
    nx.save(tmp_path / "y.safetensors", [y])
    assert nx.load(tmp_path / "y.safetensors")[0].item() == 16.0


def test_missing_truncated_foreign_and_mismatched_files(tmp_path):
    path = str(tmp_path / "c.safetensors")
    with pytest.raises(ValueError, match=r"nx.load: no checkpoint at .*c.safetensors"):
        nx.load(path)
    tree = {"w": nx.ones((2, 3)), "b": [nx.zeros(2), nx.zeros(1, dtype=nx.int32)]}
    nx.save(path, tree)
    data = open(path, "rb").read()
    for cut in (4, 20, len(data) // 2, len(data) - 1):
        bad = str(tmp_path / f"cut{cut}.safetensors")
        open(bad, "wb").write(data[:cut])
        with pytest.raises(ValueError, match="nx.load: .*cut.* not a readable safetensors"):
            nx.load(bad)
    from safetensors.numpy import save_file

    foreign = str(tmp_path / "foreign.safetensors")
    save_file({"w": np.ones(2, np.float32)}, foreign)
    with pytest.raises(ValueError, match="no nablax metadata"):
        nx.load(foreign)
    like_shape = {"w": nx.ones((3, 2)), "b": [nx.zeros(2), nx.zeros(1, dtype=nx.int32)]}
    with pytest.raises(
        ValueError, match=r"float32\[2, 3\] at \['w'\], where like= has float32\[3, 2\]"
    ):
        nx.load(path, like=like_shape)
    like_dtype = {"w": nx.ones((2, 3)), "b": [nx.zeros(2), nx.zeros(1)]}
    with pytest.raises(
        ValueError, match=r"int32\[1\] at \['b'\]\[1\], where like= has float32\[1\]"
    ):
        nx.load(path, like=like_dtype)
    with pytest.raises(ValueError, match=r"extra keys \['b'\] and lacks \['c'\]"):
        nx.load(path, like={"w": nx.ones((2, 3)), "c": nx.ones(1)})
    with pytest.raises(ValueError, match=r"at \['b'\], where like= has a list of 3"):
        nx.load(path, like={"w": nx.ones((2, 3)), "b": [nx.zeros(2)] * 3})


def test_write_is_atomic(tmp_path, monkeypatch):
    path = str(tmp_path / "a.safetensors")
    nx.save(path, {"v": nx.ones(2)})
    before = open(path, "rb").read()

    def fail(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError, match="disk full"):
        nx.save(path, {"v": nx.zeros(5)})
    assert open(path, "rb").read() == before  # the old checkpoint is intact
    assert os.listdir(tmp_path) == ["a.safetensors"]  # no temporary file left behind
    with pytest.raises(
        TypeError, match="nx.save: cannot store \\['f'\\], a builtin_function_or_method"
    ):
        nx.save(str(tmp_path / "b.safetensors"), {"f": print})
    with pytest.raises(TypeError, match="non-string keys"):
        nx.save(str(tmp_path / "b.safetensors"), {1: nx.ones(1)})


def test_loading_never_imports_classes_from_the_file(tmp_path):
    """A crafted file naming a class to build gets plain data back: no import, no call."""
    from safetensors.numpy import save_file

    tree = {
        "t": "dataclass",
        "cls": "os.system",
        "fields": ["cmd"],
        "items": [{"t": "str", "v": "echo pwned > " + str(tmp_path / "pwned")}],
    }
    meta = {"nablax": json.dumps({"format": "nablax.tree/1", "tree": tree, "dtypes": {}})}
    path = str(tmp_path / "evil.safetensors")
    save_file({}, path, metadata=meta)
    assert nx.load(path) == {"cmd": "echo pwned > " + str(tmp_path / "pwned")}
    assert not (tmp_path / "pwned").exists()


def test_block_until_ready_computes_every_leaf():
    a = nx.ones(3) * 2
    tree = {"a": a, "b": [a + 1, 4], "c": jnp.ones(2), "d": None}
    out = nx.block_until_ready(tree)
    assert out is tree
    assert a.is_realized and tree["b"][0].is_realized
    assert tree["b"][0].tolist() == [3.0, 3.0, 3.0]


def test_zero_d_tensors_stay_zero_d(tmp_path):
    # safetensors' contiguous copy of a 0-d array is 1-d: step counters must come back as ()
    tree = {
        "count": nx.tensor(3, dtype=nx.int32),
        "lr": nx.tensor(0.5),
        "b": nx.zeros((), nx.bfloat16),
    }
    nx.save(tmp_path / "s.safetensors", tree)
    back = nx.load(tmp_path / "s.safetensors", like=tree)
    assert [(t.shape, t.dtype) for t in back.values()] == [
        (t.shape, t.dtype) for t in tree.values()
    ]
    assert back["count"].item() == 3 and back["lr"].item() == 0.5

"""Attacks on nx.save / nx.load (issue 35): every NumPy and ml_dtypes dtype, both byte orders,
scalars that Python floats cannot hold, malformed metadata at every level of the tree, files that
name one tensor many times, and what a save does to the file system (mode, symlinks, errors).

The contract (API.md section 10): ``save`` accepts only what ``load`` returns equal (dtype and
values) and otherwise raises naming the leaf; any malformed file raises ``ValueError`` naming it;
loading cannot use memory out of proportion to the file's size."""

from __future__ import annotations

import copy
import json
import os
import stat
import struct

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import nablax as nx

# ---- save: every dtype kind ---------------------------------------------------------------------


def _ml_dtypes() -> list[np.dtype]:
    out = []
    for name in ml_dtypes.__all__:
        try:
            d = np.dtype(getattr(ml_dtypes, name))
        except TypeError:
            continue
        if d.kind != "O":  # finfo / iinfo are classes, not dtypes
            out.append(d)
    return out


def _numpy_dtypes() -> list[np.dtype]:
    out = set()
    for t in set(np.sctypeDict.values()):
        d = np.dtype(t)
        if d.kind in "USV" and d.itemsize == 0:  # flexible: give them a size
            d = np.dtype(f"{d.kind}3")
        if d.kind in "Mm" and np.datetime_data(d)[0] == "generic":
            d = np.dtype(f"{d.kind}8[s]")
        out.add(d)
    out.add(np.dtype([("a", "<f4"), ("b", "<i4")]))
    return sorted(out, key=str)


def _swapped(dtypes):
    return [d.newbyteorder("S") for d in dtypes if d.itemsize > 1 and d.kind in "biufc"]


ALL_DTYPES = list(dict.fromkeys(_numpy_dtypes() + _swapped(_numpy_dtypes()) + _ml_dtypes()))

# what must come back equal (refusing it would be a regression): every number type of NumPy up
# to 64 bits (and complex128), in either byte order, and every ml_dtypes type
ROUND_TRIP_KINDS = set("biuc") | {"f"}
MUST_REFUSE_KINDS = set("USVMmO")


def _values(d: np.dtype) -> np.ndarray:
    """Values of dtype ``d`` that a lossy path would change: 64-bit extremes, NaN, -0.0, 0.1."""
    native = d.newbyteorder("=")
    if d.type.__module__.startswith("ml_dtypes"):
        if d.kind in "iu" or "int" in d.name:
            info = ml_dtypes.iinfo(d)
            return np.array([info.min, 0, info.max], native).astype(d)
        if d.kind == "c" or "complex" in d.name:
            return np.array([1 + 2j, -0.5j, 4], np.complex64).astype(d)
        return np.array([0.5, 1, 2, 4], np.float32).astype(d)
    if d.kind == "b":
        return np.array([True, False, True], d)
    if d.kind in "iu":
        info = np.iinfo(native)
        return np.array([info.min, 0, 1, info.max], native).astype(d)
    if d.kind == "f":
        v = [np.finfo(native).max, np.finfo(native).tiny, -0.0, np.nan, -np.inf, 0.1, 1 / 3]
        return np.array(v, native).astype(d)
    if d.kind == "c":
        big = complex(np.finfo(native).max, 0.1)
        return np.array([big, np.nan, -0.0, 1 / 3], native).astype(d)
    if d.kind in "US":
        return np.array(["ab", "c"], d)
    if d.kind in "Mm":
        return np.array([0, 123456789], d)
    if d.kind == "O":
        return np.array([1, "a"], d)
    return np.zeros(2, d)  # void and structured


def _bits(a: np.ndarray) -> bytes:
    a = np.ascontiguousarray(a)
    return a.astype(a.dtype.newbyteorder("=")).tobytes()


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda d: d.str + "-" + d.name)
def test_save_round_trips_every_dtype_exactly_or_names_the_leaf(tmp_path, dtype):
    """A leaf comes back with its dtype (native byte order) and its exact bits, or save raises a
    TypeError naming the leaf, the dtype and the fix; never a wrong value, never another error
    at load time."""
    path = tmp_path / "x.safetensors"
    a = _values(dtype)
    tree = {"layer": [{"w": a}]}
    is_ml = dtype.type.__module__.startswith("ml_dtypes")
    wide = dtype.kind in "fc" and dtype.itemsize > 8 * (1 + (dtype.kind == "c"))  # long double
    if not is_ml and (dtype.kind in MUST_REFUSE_KINDS or wide):
        with pytest.raises(TypeError, match=r"nx.save: \['layer'\]\[0\]\['w'\] .*Fix"):
            nx.save(path, tree)
        assert not path.exists()
        return
    assert dtype.kind in ROUND_TRIP_KINDS or is_ml
    nx.save(path, tree)
    for back in (nx.load(path), nx.load(path, like=tree)):
        got = back["layer"][0]["w"]
        got_np = got.numpy() if isinstance(got, nx.Tensor) else got
        assert got_np.dtype == dtype.newbyteorder("="), (got_np.dtype, dtype)
        assert got.shape == a.shape
        assert _bits(got_np) == _bits(a)


def test_big_endian_arrays_keep_their_values(tmp_path):
    path = tmp_path / "be.safetensors"
    tree = {"f": np.arange(3, dtype=">f4"), "i": np.arange(3, dtype=">i4"), "h": np.ones(2, ">f2")}
    nx.save(path, tree)
    back = nx.load(path)
    assert back["f"].tolist() == [0.0, 1.0, 2.0] and back["i"].tolist() == [0, 1, 2]
    assert back["h"].tolist() == [1.0, 1.0]


def test_64_bit_arrays_come_back_exact_as_numpy(tmp_path):
    """nablax tensors are 32-bit: an int64/float64 leaf comes back as the NumPy array it was, not
    a tensor that wrapped or rounded it, and like= accepts it."""
    path = tmp_path / "x.safetensors"
    tree = {"big": np.array([2**40, -(2**62)]), "f": np.array([0.1, 1e300]), "t": nx.ones(2)}
    nx.save(path, tree)
    back = nx.load(path, like=tree)
    assert isinstance(back["big"], np.ndarray) and back["big"].dtype == np.int64
    assert back["big"].tolist() == [2**40, -(2**62)] and back["f"].tolist() == [0.1, 1e300]
    assert isinstance(back["t"], nx.Tensor)
    back["f"][0] = 2.0  # a writable array, not a view of the file's bytes
    with pytest.raises(ValueError, match=r"float64\[2\] at \['f'\], where like= has float32\[2\]"):
        nx.load(path, like={"big": tree["big"], "f": nx.ones(2), "t": nx.ones(2)})


def test_scalars_python_cannot_hold_exactly_are_refused(tmp_path):
    path = tmp_path / "s.safetensors"
    third = np.longdouble(1) / 3
    if float(third) != third:  # platforms whose long double is wider than a double
        with pytest.raises(TypeError, match=r"nx.save: \['x'\] .*longdouble.*Fix"):
            nx.save(path, {"x": third})
    nx.save(path, {"x": np.float32(0.1), "y": np.longdouble(0.5), "n": np.nan, "i": 10**30})
    back = nx.load(path)
    assert back["x"] == np.float32(0.1) and back["y"] == 0.5 and back["i"] == 10**30
    assert np.isnan(back["n"])
    with pytest.raises(ValueError, match=r"nx.save: \['i'\] .*digits"):
        nx.save(path, {"i": 10**5000})


def test_masked_arrays_are_refused_not_unmasked(tmp_path):
    a = np.ma.masked_array([1.0, 2.0], mask=[True, False])
    with pytest.raises(TypeError, match=r"nx.save: \['m'\] .*masked.*Fix"):
        nx.save(tmp_path / "m.safetensors", {"m": a})


def test_trees_deeper_than_load_reads_are_refused_at_save(tmp_path):
    path = tmp_path / "d.safetensors"
    ok = nx.zeros(1)
    for _ in range(100):
        ok = [ok]
    nx.save(path, ok)
    back = nx.load(path)
    for _ in range(100):
        back = back[0]
    assert back.tolist() == [0.0]
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ValueError, match=r"nx.save: .*\[0\]\[0\].* nested deeper than"):
        nx.save(path, deep)


# ---- load: malformed files ----------------------------------------------------------------------


def _write(tmp_path, meta, tensors=None, name="bad.safetensors"):
    path = str(tmp_path / name)
    raw = meta if isinstance(meta, str) else json.dumps(meta)
    if isinstance(meta, dict) and isinstance(meta.get("tree"), str) and meta["tree"][:1] == "{":
        raw = raw.replace(json.dumps(meta["tree"]), meta["tree"])  # raw JSON, too deep to build
    save_file(tensors if tensors is not None else {}, path, metadata={"nablax": raw})
    return path


def _good(tmp_path):
    tree = {
        "w": nx.ones((2, 2)),
        "c": np.array([1 + 2j], np.complex64),
        "b": nx.ones(2, dtype=nx.bfloat16),
        "xs": [1, 2.5, "s", True, None, (nx.zeros(1),)],
    }
    path = str(tmp_path / "good.safetensors")
    nx.save(path, tree)
    from safetensors import safe_open

    with safe_open(path, "np") as f:
        meta = json.loads(f.metadata()["nablax"])
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    return meta, tensors


def _expect_value_error(path):
    with pytest.raises(ValueError, match=r"nx.load: " + "(.|\n)*" + os.path.basename(path)):
        nx.load(path)


def test_wrong_types_at_every_level_of_the_metadata(tmp_path):
    """Replace every node and every field of a real file's metadata with a value of each JSON
    type: nx.load returns or raises ValueError naming the file, nothing else."""
    meta, tensors = _good(tmp_path)
    nx.load(_write(tmp_path, meta, tensors))  # the unmodified metadata loads

    def places(obj, where=()):
        yield where
        if isinstance(obj, dict):
            for k, v in obj.items():
                yield from places(v, where + (k,))
        elif isinstance(obj, list):
            for k, v in enumerate(obj):
                yield from places(v, where + (k,))

    junk = [None, True, 3, -1, 2.5, "x", "array", [], [[]], [1, 2], {}, {"t": "none"}]
    n = 0
    for where in list(places(meta)):
        for value in junk:
            bad = copy.deepcopy(meta)
            if not where:
                bad = value
            else:
                parent = bad
                for k in where[:-1]:
                    parent = parent[k]
                parent[where[-1]] = value
            path = _write(tmp_path, bad, tensors)
            try:
                nx.load(path)
            except ValueError as e:
                assert "bad.safetensors" in str(e), str(e)
            n += 1
    assert n > 500


MALFORMED = {
    "not json": "{",
    "a list": [1],
    "no tree": {"format": "nablax.tree/1"},
    "deep json": "[" * 100_000 + "]" * 100_000,
    "deep tree": {
        "format": "nablax.tree/1",
        "tree": '{"t": "list", "items": [' * 300 + '{"t": "none"}' + "]}" * 300,
    },
    "node without t": {"format": "nablax.tree/1", "tree": {"items": []}},
    "int as str": {"format": "nablax.tree/1", "tree": {"t": "int", "v": "3"}},
    "int as bool": {"format": "nablax.tree/1", "tree": {"t": "int", "v": True}},
    "float not a number": {"format": "nablax.tree/1", "tree": {"t": "float", "v": "abc"}},
    "float as list": {"format": "nablax.tree/1", "tree": {"t": "float", "v": [1]}},
    "bool as int": {"format": "nablax.tree/1", "tree": {"t": "bool", "v": 1}},
    "str as int": {"format": "nablax.tree/1", "tree": {"t": "str", "v": 3}},
    "dict items not pairs": {"format": "nablax.tree/1", "tree": {"t": "dict", "items": [["a"]]}},
    "dict key not str": {
        "format": "nablax.tree/1",
        "tree": {"t": "dict", "items": [[1, {"t": "none"}]]},
    },
    "duplicate dict keys": {
        "format": "nablax.tree/1",
        "tree": {"t": "dict", "items": [["a", {"t": "none"}], ["a", {"t": "int", "v": 1}]]},
    },
    "fields and items differ": {
        "format": "nablax.tree/1",
        "tree": {"t": "dataclass", "cls": "C", "fields": ["a", "b"], "items": [{"t": "none"}]},
    },
    "duplicate fields": {
        "format": "nablax.tree/1",
        "tree": {
            "t": "namedtuple",
            "cls": "P",
            "fields": ["a", "a"],
            "items": [{"t": "none"}, {"t": "none"}],
        },
    },
    "array name not str": {"format": "nablax.tree/1", "tree": {"t": "array", "name": 3}},
    "array name unknown": {"format": "nablax.tree/1", "tree": {"t": "array", "name": "nope"}},
    "dtypes not a dict": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "x"},
        "dtypes": ["x"],
    },
    "dtype unknown": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "x"},
        "dtypes": {"x": "float128"},
    },
    "dtype object": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "x"},
        "dtypes": {"x": "object"},
    },
    "dtype not a str": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "x"},
        "dtypes": {"x": 16},
    },
    "complex of odd pairs": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "x"},
        "dtypes": {"x": "complex64"},
    },
    "bfloat16 of bytes": {
        "format": "nablax.tree/1",
        "tree": {"t": "array", "name": "y"},
        "dtypes": {"y": "bfloat16"},
    },
    "dtype for a missing tensor": {
        "format": "nablax.tree/1",
        "tree": {"t": "none"},
        "dtypes": {"nope": "bfloat16"},
    },
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_metadata_raises_value_error_naming_the_file(tmp_path, case):
    tensors = {"x": np.ones(3, np.float32), "y": np.ones(3, np.uint8)}
    _expect_value_error(_write(tmp_path, MALFORMED[case], tensors))


def test_one_tensor_named_many_times_is_refused(tmp_path):
    """200 references to one 4 MB tensor would be 800 MB once loaded: a file names each tensor
    once (nx.save never writes anything else)."""
    items = [{"t": "array", "name": "x"}] * 200
    meta = {"format": "nablax.tree/1", "tree": {"t": "list", "items": items}}
    path = _write(tmp_path, meta, {"x": np.zeros(1 << 20, np.float32)})
    with pytest.raises(ValueError, match=r"bad.safetensors.* names the tensor 'x' twice"):
        nx.load(path)


def test_random_corruption_raises_value_error_naming_the_file(tmp_path):
    """Bytes flipped at random in the header and metadata of a real file (seeded): every load
    returns or raises ValueError naming the file."""
    import random

    meta, tensors = _good(tmp_path)
    data = open(_write(tmp_path, meta, tensors, "good2.safetensors"), "rb").read()
    n = int.from_bytes(data[:8], "little")
    rng, path, failed = random.Random(0), str(tmp_path / "flip.safetensors"), 0
    for _ in range(400):
        b = bytearray(data)
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(0, 8 + n)] = rng.randrange(256)
        with open(path, "wb") as f:
            f.write(bytes(b))
        try:
            nx.load(path)
        except ValueError as e:
            assert "flip.safetensors" in str(e), str(e)
            failed += 1
    assert failed > 300


def test_loading_uses_memory_in_proportion_to_the_file(tmp_path):
    """Host memory traced while loading a 8 MB array: the file's bytes, the arrays safetensors
    reads and the one copy handed back, nothing per reference."""
    import tracemalloc

    path = tmp_path / "big.safetensors"
    nx.save(path, {"a": np.arange(1 << 20, dtype=np.float64)})
    size = os.path.getsize(path)
    tracemalloc.start()
    try:
        back = nx.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert back["a"][-1] == (1 << 20) - 1
    assert peak < 4 * size, (peak, size)


def _raw_file(tmp_path, header: dict, data: bytes) -> str:
    h = json.dumps(header).encode()
    path = str(tmp_path / "raw.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)
    return path


@pytest.mark.parametrize(
    "header, data",
    [
        ({"x": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
        ({"x": {"dtype": "F8_E4M3", "shape": [2], "data_offsets": [0, 2]}}, b"\0" * 2),
        (
            {
                "x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
                "y": {"dtype": "U8", "shape": [2], "data_offsets": [0, 2]},
            },
            b"\0" * 2,
        ),
        ({"x": {"dtype": "U8", "shape": [2], "data_offsets": [0, 200]}}, b"\0" * 2),
        ({"x": {"dtype": "U8", "shape": [0, 2**62, 2**62], "data_offsets": [0, 0]}}, b""),
        ({"x": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x05\x07"),
    ],
    ids=["bf16", "f8", "overlap", "out-of-range", "huge-empty", "bool-bytes"],
)
def test_malformed_tensors_raise_value_error_naming_the_file(tmp_path, header, data):
    meta = {"format": "nablax.tree/1", "tree": {"t": "array", "name": "x"}}
    header = dict(header, __metadata__={"nablax": json.dumps(meta)})
    path = _raw_file(tmp_path, header, data)
    with pytest.raises(ValueError, match=r"nx.load: .*raw.safetensors"):
        nx.load(path)


def test_a_directory_is_not_a_checkpoint(tmp_path):
    with pytest.raises(ValueError, match=r"nx.load: .* is a directory"):
        nx.load(tmp_path)


# ---- save: the file system ----------------------------------------------------------------------


def test_new_files_honour_the_umask_and_replaced_files_keep_their_mode(tmp_path):
    path = tmp_path / "m.safetensors"
    old = os.umask(0o027)
    try:
        nx.save(path, {"w": nx.ones(1)})
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
        os.chmod(path, 0o604)
        nx.save(path, {"w": nx.ones(2)})
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o604
    finally:
        os.umask(old)
    assert nx.load(path)["w"].shape == (2,)


def test_saving_to_a_symlink_writes_through_to_its_target(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "ckpt.safetensors"
    link = tmp_path / "latest.safetensors"
    nx.save(target, {"w": nx.ones(1)})
    link.symlink_to(target)
    nx.save(link, {"w": nx.ones(3)})
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert nx.load(target)["w"].shape == (3,)
    assert sorted(os.listdir(tmp_path / "real")) == ["ckpt.safetensors"]


def test_a_missing_directory_is_reported_with_the_users_path(tmp_path):
    path = str(tmp_path / "no" / "such" / "ckpt.safetensors")
    with pytest.raises(FileNotFoundError) as e:
        nx.save(path, {"w": nx.ones(1)})
    assert path in str(e.value) and ".nablax-save-" not in str(e.value)
    assert "Fix" in str(e.value)
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError) as e:
        nx.save(tmp_path / "d", {"w": nx.ones(1)})
    assert str(tmp_path / "d") in str(e.value) and ".nablax-save-" not in str(e.value)
    assert os.listdir(tmp_path / "d") == [] and sorted(os.listdir(tmp_path)) == ["d"]


def test_bytes_paths_work_like_str_paths(tmp_path):
    path = os.path.join(str(tmp_path), "b.safetensors")
    nx.save(os.fsencode(path), {"w": nx.ones(2)})
    assert nx.load(os.fsencode(path))["w"].tolist() == [1.0, 1.0]
    assert nx.load(path)["w"].shape == (2,)

"""Values leaving the lazy graph: ``nx.block_until_ready`` (wait for a pytree of tensors) and
checkpoints, ``nx.save`` / ``nx.load`` (a pytree of tensors in one ``.safetensors`` file).

The file is a standard safetensors file: every array leaf is one tensor named by its path in the
tree (``['layers'][0]['w']``), stored in its own dtype where safetensors has one. The tree's
structure (dicts, lists, tuples, ``None``, registered dataclasses by class name), the Python
numbers and strings among its leaves, and the true dtype of arrays safetensors cannot hold
(complex: stored as their float pairs) are JSON in the file's metadata under ``"nablax"``. Loading
reads JSON and raw arrays only: it never executes code from the file (no pickle).

What ``save`` accepts, ``load`` returns equal (dtype and bits): an array of a dtype nablax tensors
hold comes back as a tensor; a 64-bit one (``float64``, ``int64``, ``uint64``, ``complex128``, and
the few ml_dtypes XLA cannot hold) as the NumPy array it was, never rounded or wrapped to 32 bits.
Big-endian arrays come back in native byte order. Anything else (text, dates, objects, records,
``longdouble``, masked arrays) is refused at save, naming the leaf. ``load`` checks every field of
the metadata and raises ``ValueError`` naming the file for anything ``save`` does not write; a file
may name each of its tensors once, so a loaded tree never holds more than the file's bytes.

Writes are atomic: the file is written to a temporary file in the same directory, flushed to disk
and renamed over the target, so a crash leaves either the old file or the new one. A new file gets
the mode the umask gives; a replaced file keeps its mode; a symlink is written through (its target
is replaced, the link stays).

>>> import os, tempfile
>>> import nablax as nx
>>> path = os.path.join(tempfile.mkdtemp(), "ckpt.safetensors")
>>> nx.save(path, {"w": nx.ones((2, 3)), "step": 7, "layers": [nx.zeros(2), None]})
>>> back = nx.load(path)
>>> back["w"].shape, back["step"], back["layers"][1]
((2, 3), 7, None)
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any

import jax
import ml_dtypes
import numpy as np

from . import tree as _tree
from ._files import write_atomic as _write_atomic
from .core.realize_api import realize
from .core.tensor import Tensor

_FORMAT = "nablax.tree/1"
_META_KEY = "nablax"
# the deepest tree save writes and load reads (a dict level is 3 JSON levels: far below the
# recursion limits of json and of the decoder)
_MAX_DEPTH = 100


def block_until_ready(tree: Any) -> Any:
    """Compute every pending tensor of ``tree`` (one program) and wait until every tensor and
    ``jax.Array`` leaf is ready, as ``jax.block_until_ready``; returns ``tree``.

    >>> import nablax as nx
    >>> out = nx.block_until_ready({"a": nx.ones(2) * 3, "b": [nx.zeros(1)], "n": 1})
    >>> out["a"].is_realized, out["n"]
    (True, 1)
    """
    realize(tree)
    for leaf in _tree.leaves(tree):
        if isinstance(leaf, Tensor):
            leaf.block_until_ready()
        elif isinstance(leaf, jax.Array):
            leaf.block_until_ready()
    return tree


# ---- the tree's structure as JSON -----------------------------------------------------------------


def _stored_fields(obj: Any) -> tuple[list[str], Any]:
    """The fields of dataclass ``obj`` a checkpoint stores, and ``rebuild({name: value})``.

    A dataclass registered as a pytree stores its children only: static fields (a module's sizes
    and activation function) are structure, restored from ``like=``, and the object is rebuilt
    the way transforms rebuild it (its ``__init__``, which may draw random weights, is not
    called). An unregistered dataclass stores every field and is rebuilt with
    ``dataclasses.replace``.
    """
    flat, treedef = jax.tree_util.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
    if len(flat) == 1 and flat[0][0] == ():  # not a pytree node: JAX sees one leaf
        names = [f.name for f in dataclasses.fields(obj)]
        return names, lambda vals: dataclasses.replace(obj, **vals)
    names = [getattr(p[0], "name", None) for p, _ in flat]
    if None in names or not all(hasattr(obj, n) for n in names):
        raise TypeError(
            f"nx.save: {type(obj).__name__} is a pytree whose children are not its fields; "
            f"checkpoints store dataclasses whose children are named fields"
        )
    return names, lambda vals: jax.tree_util.tree_unflatten(treedef, [vals[n] for n in names])


def _where(path: str) -> str:
    return (path if len(path) <= 80 else path[:60] + "..." + path[-17:]) or "the root"


def _encode(node: Any, path: str, arrays: dict, depth: int = 0) -> Any:
    """JSON of ``node``; array leaves go to ``arrays`` under their path."""
    if depth > _MAX_DEPTH:
        raise ValueError(
            f"nx.save: {_where(path)} is nested deeper than {_MAX_DEPTH} levels, which is as deep "
            f"as nx.load reads. Fix: flatten the tree (e.g. a dict of its leaves)"
        )
    if isinstance(node, np.ma.MaskedArray):
        raise TypeError(
            f"nx.save: {_where(path)} is a masked array, whose mask a checkpoint would drop. "
            f"Fix: store its .data and np.ma.getmaskarray(...) as two leaves"
        )
    if isinstance(node, (Tensor, jax.Array, np.ndarray)):
        arrays[path] = node
        return {"t": "array", "name": path}
    if node is None:
        return {"t": "none"}
    if isinstance(node, (bool, np.bool_)):
        return {"t": "bool", "v": bool(node)}
    if isinstance(node, (int, np.integer)):
        v = int(node)
        limit = getattr(sys, "get_int_max_str_digits", lambda: 0)()
        if limit and v.bit_length() > 3 * limit:
            try:
                str(v)
            except ValueError:
                raise ValueError(
                    f"nx.save: {_where(path)} is an int of about {int(v.bit_length() * 0.30103)} "
                    f"digits, more than JSON reads back (sys.get_int_max_str_digits() is "
                    f"{limit}). Fix: store it as a str leaf, or a uint8 array of its bytes"
                ) from None
        return {"t": "int", "v": v}
    if isinstance(node, (float, np.floating)):
        v = float(node)
        if v != node and not np.isnan(node):
            raise TypeError(
                f"nx.save: {_where(path)} is a {type(node).__name__} scalar {node!r} that a "
                f"Python float cannot hold exactly (a checkpoint stores scalars as floats). Fix: "
                f"cast it to float (float(x)) if its extra precision is not needed"
            )
        return {"t": "float", "v": repr(v)}
    if isinstance(node, str):
        return {"t": "str", "v": node}
    if isinstance(node, dict):
        if not all(isinstance(k, str) for k in node):
            raise TypeError(
                f"nx.save: the dict at {path or 'the root'} has non-string keys "
                f"{[k for k in node if not isinstance(k, str)][:3]}; checkpoints store string "
                f"keys only. Fix: convert the keys with str()"
            )
        return {
            "t": "dict",
            "items": [
                [k, _encode(v, f"{path}[{k!r}]", arrays, depth + 1)] for k, v in node.items()
            ],
        }
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # a namedtuple
        kids = [_encode(v, f"{path}.{f}", arrays, depth + 1) for f, v in zip(node._fields, node)]
        return {
            "t": "namedtuple",
            "cls": type(node).__qualname__,
            "fields": list(node._fields),
            "items": kids,
        }
    if isinstance(node, (list, tuple)):
        kids = [_encode(v, f"{path}[{k}]", arrays, depth + 1) for k, v in enumerate(node)]
        return {"t": type(node).__name__, "items": kids}
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = _stored_fields(node)[0]
        kids = [_encode(getattr(node, n), f"{path}.{n}", arrays, depth + 1) for n in names]
        return {"t": "dataclass", "cls": type(node).__qualname__, "fields": names, "items": kids}
    raise TypeError(
        f"nx.save: cannot store {path or 'the root'}, a {type(node).__name__}: checkpoints hold "
        f"tensors, arrays, Python numbers, strings, None, and dicts, lists, tuples, namedtuples "
        f"and dataclasses of them"
    )


# ---- dtypes ----------------------------------------------------------------------------------------

# dtypes safetensors (and safetensors.numpy) hold as they are
_PLAIN = {
    np.dtype(d)
    for d in "float64 float32 float16 int64 int32 int16 int8 uint8 uint16 uint32 uint64 bool".split()
}
# complex: stored as (..., 2) float pairs
_COMPLEX = {np.dtype("complex64"): np.dtype("float32"), np.dtype("complex128"): np.dtype("float64")}
# ml_dtypes (bfloat16, float8, int4, ...): stored as unsigned integers of their raw bits
_BITS_OF = {1: np.dtype("uint8"), 2: np.dtype("uint16"), 4: np.dtype("uint32")}
_ML = {
    d.name: d
    for d in (np.dtype(t) for t in vars(ml_dtypes).values() if isinstance(t, type))
    if d.type.__module__.startswith("ml_dtypes") and d.itemsize in _BITS_OF
}
# the dtypes a file's metadata may name, by name
_STORED_AS = {**{d.name: d for d in _COMPLEX}, **_ML}
# dtypes nablax tensors do not hold (64-bit: tensors are 32-bit, as JAX's default; the ml_dtypes
# XLA has no type for): such leaves come back as the NumPy arrays they were
_ML_IN_TENSORS = {"bfloat16", "float4_e2m1fn", "int2", "int4", "uint2", "uint4"}
_AS_NUMPY = {np.dtype(d) for d in ("float64", "int64", "uint64", "complex128")} | {
    d for n, d in _ML.items() if n not in _ML_IN_TENSORS and not n.startswith("float8_")
}


def _refusal(d: np.dtype, where: str) -> TypeError:
    if d.kind in "fc":  # longdouble / clongdouble
        to = "float64" if d.kind == "f" else "complex128"
        return TypeError(
            f"nx.save: {where} is an array of {d.name}, wider than any dtype safetensors holds. "
            f"Fix: cast to {to} (a.astype(np.{to})) if its extra precision is not needed"
        )
    if d.kind in "Mm":
        fix = f"store a.astype(np.int64) and its unit ({np.datetime_data(d)[0]}) as a str leaf"
    elif d.kind == "V" and d.names:
        fix = f"store each field as its own leaf ({list(d.names)})"
    else:
        fix = {
            "U": "store the text as Python str leaves (a.tolist())",
            "S": "store the bytes as a uint8 array (np.frombuffer(a.tobytes(), np.uint8))",
            "O": "convert it to an array of numbers (a.astype(np.float32), ...)",
            "V": "store its bytes as a uint8 array (a.view(np.uint8))",
        }.get(d.kind, "cast it to a number dtype")
    return TypeError(
        f"nx.save: {where} is an array of {d.name} ({d.str}), which checkpoints do not hold "
        f"(numbers only). Fix: {fix}"
    )


def _to_storable(a: np.ndarray, where: str) -> tuple[np.ndarray, str | None]:
    """``(array safetensors can hold, original dtype name or None)``; a dtype that would not come
    back equal raises naming the leaf."""
    d = a.dtype
    if not d.isnative and d.kind in "biufc":  # big-endian: the same values, native bytes
        a = a.astype(d.newbyteorder("="))
        d = a.dtype
    # (ascontiguousarray makes a 0-d array 1-d: reshape it back)
    if d in _PLAIN:
        return np.ascontiguousarray(a).reshape(a.shape), None
    if d in _COMPLEX:
        pairs = np.ascontiguousarray(a).view(_COMPLEX[d]).reshape(a.shape + (2,))
        return pairs, d.name
    if _ML.get(d.name) == d:
        return np.ascontiguousarray(a).view(_BITS_OF[d.itemsize]).reshape(a.shape), d.name
    raise _refusal(d, where)


# ---- save / load ------------------------------------------------------------------------------------


def save(path: str | os.PathLike, tree: Any) -> None:
    """Write the pytree ``tree`` (tensors, arrays, Python numbers, strings, ``None``, in dicts,
    lists, tuples, namedtuples, registered dataclasses such as modules and optimizer states) to
    the ``.safetensors`` file ``path``, atomically. Pending tensors are computed first, as one
    program.

    Only what :func:`load` returns equal is accepted: an array of a dtype checkpoints do not hold
    (text, dates, objects, records, ``longdouble``), a masked array, a tree nested deeper than
    100 levels raise ``TypeError``/``ValueError`` naming the leaf and the fix, before any file is
    written. A new file gets the mode the umask gives, a replaced one keeps its mode, and a
    symlink is written through to its target.

    >>> import os, tempfile
    >>> import nablax as nx
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> nx.save(path, [nx.arange(3), nx.ones(2, dtype=nx.bfloat16)])
    >>> [t.tolist() for t in nx.load(path)]
    [[0, 1, 2], [1.0, 1.0]]
    """
    from safetensors.numpy import save as _st_save

    path = os.fsdecode(path)  # (a bytes path too)
    arrays: dict = {}
    structure = _encode(tree, "", arrays)
    realize(*[a for a in arrays.values() if isinstance(a, Tensor)])
    tensors, dtypes = {}, {}
    for name, a in arrays.items():
        value = a.numpy() if isinstance(a, Tensor) else np.asarray(a)
        tensors[name or "[root]"], orig = _to_storable(value, _where(name))
        if orig is not None:
            dtypes[name or "[root]"] = orig
    if "" in arrays:  # the whole tree is one array
        structure["name"] = "[root]"
    meta = {_META_KEY: json.dumps({"format": _FORMAT, "tree": structure, "dtypes": dtypes})}
    _write_atomic(path, _st_save(tensors, metadata=meta))


def load(path: str | os.PathLike, like: Any = None) -> Any:
    """Read a checkpoint written by :func:`save`. With ``like=`` (a pytree of the structure to
    restore, e.g. a freshly initialized model or optimizer state), the result has ``like``'s
    containers and classes, and every leaf is checked against it: structure, shape and dtype.
    Without it, dicts, lists, tuples and ``None`` come back as they were and dataclasses and
    namedtuples as dicts of their fields (classes are never imported from the file). Arrays of
    dtypes tensors hold come back as tensors, 64-bit ones as NumPy arrays of their dtype.

    A missing, truncated, foreign, malformed or mismatched file raises ``ValueError`` naming the
    path and (for a mismatch) the first differing leaf, never another exception; a file naming a
    tensor more than once is malformed.
    """
    from safetensors.numpy import load as _st_load

    path = os.fsdecode(path)  # (a bytes path too)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"nx.load: no checkpoint at {path} (the file does not exist)") from None
    except IsADirectoryError:
        raise ValueError(f"nx.load: {path} is a directory, not a checkpoint file") from None
    try:
        arrays = _st_load(data)
        raw = _read_meta(data)
    except Exception as e:  # the file's bytes are untrusted: any failure to parse them is theirs
        raise ValueError(
            f"nx.load: {path} is not a readable safetensors file (truncated or corrupt?): "
            f"{type(e).__name__}: {e}"
        ) from None
    del data
    if raw is None:
        raise ValueError(
            f"nx.load: {path} is a safetensors file with no nablax metadata; nx.load reads files "
            f"written by nx.save ({_FORMAT}). Fix: read it with the safetensors library directly"
        )
    out = _Decoder(path, arrays).run(raw)
    if like is None:
        return out
    return _restore_like(out, like, "", path)


def _read_meta(data: bytes) -> str | None:
    """The nablax metadata string of a file safetensors has parsed (so its header is valid)."""
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    return (header.get("__metadata__") or {}).get(_META_KEY)


def _short(x: Any) -> str:
    r = repr(x)
    return f"{type(x).__name__} {r if len(r) <= 40 else r[:37] + '...'}"


class _Decoder:
    """The tree of a file's metadata, every field checked; each tensor is materialized once."""

    def __init__(self, file: str, arrays: dict):
        self.file, self.arrays = file, arrays
        self.used: dict[str, str] = {}  # tensor name -> where the tree named it

    def bad(self, path: str | None, what: str) -> ValueError:
        at = "" if path is None else f" at {_where(path)} of its tree"
        return ValueError(
            f"nx.load: {self.file} is malformed{at}: {what} (nx.save does not write this; the "
            f"file is corrupt or was not written by nx.save)"
        )

    def run(self, raw: str) -> Any:
        try:
            meta = json.loads(raw)
        except (ValueError, RecursionError) as e:
            what = f"its metadata is not JSON nablax reads ({type(e).__name__})"
            raise self.bad(None, what) from None
        if not isinstance(meta, dict) or meta.get("format") != _FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else _short(meta)
            raise ValueError(
                f"nx.load: {self.file} is a safetensors file with nablax metadata of format "
                f"{found!r}; nx.load reads files written by nx.save ({_FORMAT})"
            )
        if "tree" not in meta:
            raise self.bad(None, "its metadata has no tree")
        dtypes = meta.get("dtypes", {})
        if not isinstance(dtypes, dict):
            raise self.bad(None, f"'dtypes' is {_short(dtypes)}, not an object")
        for name, orig in dtypes.items():
            self.arrays[name] = self.stored(name, orig)
        return self.decode(meta["tree"], "", 0)

    def stored(self, name: str, orig: Any) -> np.ndarray:
        """The array ``name`` as the dtype ``orig`` the metadata gives it (a view, no copy)."""
        d = _STORED_AS.get(orig) if isinstance(orig, str) else None
        if d is None:
            raise self.bad(None, f"'dtypes' gives the tensor {name!r} the dtype {_short(orig)}")
        a = self.arrays.get(name)
        if a is None:
            raise self.bad(None, f"'dtypes' names the tensor {name!r}, which the file lacks")
        if d in _COMPLEX:
            if a.dtype != _COMPLEX[d] or a.ndim == 0 or a.shape[-1] != 2:
                raise self.bad(None, f"{d.name} tensor {name!r} stored as {a.dtype}{a.shape}")
            return np.ascontiguousarray(a).view(d).reshape(a.shape[:-1])
        if a.dtype != _BITS_OF[d.itemsize]:
            raise self.bad(None, f"{d.name} tensor {name!r} stored as {a.dtype}")
        return a.view(d)

    def leaf(self, spec: dict, path: str) -> Any:
        name = spec.get("name")
        if not isinstance(name, str) or name not in self.arrays:
            raise self.bad(path, f"it names the tensor {_short(name)}, which the file lacks")
        if name in self.used:
            raise self.bad(
                path,
                f"it names the tensor {name!r} twice (also at {_where(self.used[name])}); each "
                f"tensor may be named once",
            )
        self.used[name] = path
        a = self.arrays[name]
        if a.dtype == np.bool_ and a.size and a.view(np.uint8).max() > 1:
            raise self.bad(path, f"the bool tensor {name!r} holds bytes other than 0 and 1")
        if a.dtype in _AS_NUMPY:
            return np.array(a)  # a writable copy, not a view of the file's bytes
        return Tensor(a)

    def value(self, spec: dict, path: str, kind: type) -> Any:
        v = spec.get("v")
        if type(v) is not kind:  # (exact: a JSON true is not an int, 1 is not a bool)
            raise self.bad(path, f"a {spec['t']} node holds {_short(v)}")
        return v

    def items(self, spec: dict, path: str) -> list:
        items = spec.get("items")
        if not isinstance(items, list):
            raise self.bad(path, f"a {spec['t']} node's items are {_short(items)}, not a list")
        return items

    def decode(self, spec: Any, path: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise self.bad(path, f"the tree is nested deeper than {_MAX_DEPTH} levels")
        if not isinstance(spec, dict) or not isinstance(spec.get("t"), str):
            raise self.bad(path, f"a node is {_short(spec)}, not an object with a string 't'")
        t = spec["t"]
        if t == "array":
            return self.leaf(spec, path)
        if t == "none":
            return None
        if t in ("bool", "int", "str"):
            return self.value(spec, path, {"bool": bool, "int": int, "str": str}[t])
        if t == "float":
            try:
                return float(self.value(spec, path, str))
            except ValueError:
                raise self.bad(path, f"a float node holds {_short(spec['v'])}") from None
        if t == "dict":
            out = {}
            for item in self.items(spec, path):
                if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)):
                    raise self.bad(path, f"a dict item is {_short(item)}, not a [str, node] pair")
                k = item[0]
                if k in out:
                    raise self.bad(path, f"the dict has the key {k!r} twice")
                out[k] = self.decode(item[1], f"{path}[{k!r}]", depth + 1)
            return out
        if t in ("list", "tuple"):
            items = self.items(spec, path)
            kids = [self.decode(v, f"{path}[{k}]", depth + 1) for k, v in enumerate(items)]
            return kids if t == "list" else tuple(kids)
        if t in ("namedtuple", "dataclass"):
            # the class is not imported from the file (no code runs): its fields come back as a
            # dict, or as the class of ``like=`` when given (see load)
            items, fields = self.items(spec, path), spec.get("fields")
            if not (
                isinstance(fields, list)
                and all(isinstance(f, str) for f in fields)
                and len(set(fields)) == len(fields) == len(items)
            ):
                raise self.bad(
                    path, f"a {t}'s fields {_short(fields)} are not {len(items)} distinct names"
                )
            return {f: self.decode(v, f"{path}.{f}", depth + 1) for f, v in zip(fields, items)}
        raise ValueError(
            f"nx.load: {self.file} has an unknown tree node kind {t!r} at {_where(path)}"
        )


def _restore_like(got: Any, like: Any, path: str, file: str) -> Any:
    """``got`` (decoded) in the structure of ``like``, checked leaf by leaf."""
    where = path or "the root"
    if isinstance(like, (Tensor, jax.Array, np.ndarray)):
        if not isinstance(got, (Tensor, np.ndarray)):
            raise ValueError(
                f"nx.load: {file} has {_kind(got)} at {where}, where like= has a tensor"
            )
        want = (tuple(like.shape), np.dtype(like.dtype).newbyteorder("="))  # (as save stores)
        have = (tuple(got.shape), np.dtype(got.dtype))
        if want != have:
            raise ValueError(
                f"nx.load: {file} has {have[1].name}{list(have[0])} at {where}, where like= has "
                f"{want[1].name}{list(want[0])}"
            )
        return got
    if isinstance(like, (bool, int, float, str, np.generic)):  # a Python number or string leaf
        if type(got) is not type(like.item() if isinstance(like, np.generic) else like):
            raise ValueError(
                f"nx.load: {file} has {_kind(got)} at {where}, where like= has {_kind(like)}"
            )
        return got
    if dataclasses.is_dataclass(like) and not isinstance(like, type):
        names, rebuild = _stored_fields(like)
        _check_keys(got, names, where, file, type(like).__name__)
        vals = {n: _restore_like(got[n], getattr(like, n), f"{path}.{n}", file) for n in names}
        return rebuild(vals)
    if isinstance(like, tuple) and hasattr(like, "_fields"):
        _check_keys(got, list(like._fields), where, file, type(like).__name__)
        return type(like)(
            *[_restore_like(got[f], v, f"{path}.{f}", file) for f, v in zip(like._fields, like)]
        )
    if isinstance(like, dict):
        _check_keys(got, list(like), where, file, "dict")
        return {k: _restore_like(got[k], like[k], f"{path}[{k!r}]", file) for k in like}
    if isinstance(like, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(like):
            raise ValueError(
                f"nx.load: {file} has {_kind(got)} at {where}, where like= has a "
                f"{type(like).__name__} of {len(like)}"
            )
        kids = [
            _restore_like(g, v, f"{path}[{k}]", file) for k, (g, v) in enumerate(zip(got, like))
        ]
        return kids if isinstance(like, list) else tuple(kids)
    if like is None:
        if got is not None:
            raise ValueError(f"nx.load: {file} has {_kind(got)} at {where}, where like= has None")
        return None
    raise ValueError(
        f"nx.load: like= has a {type(like).__name__} at {where}, which checkpoints do not store"
    )


def _check_keys(got: Any, names: list, where: str, file: str, what: str) -> None:
    if not isinstance(got, dict):
        raise ValueError(f"nx.load: {file} has {_kind(got)} at {where}, where like= has a {what}")
    if set(got) != set(names):
        extra, lack = sorted(set(got) - set(names)), sorted(set(names) - set(got))
        raise ValueError(
            f"nx.load: {file} and like= differ at {where} ({what}): the file has extra keys "
            f"{extra} and lacks {lack}"
        )


def _kind(x: Any) -> str:
    if isinstance(x, Tensor):
        return f"a tensor {np.dtype(x.dtype).name}{list(x.shape)}"
    if isinstance(x, np.ndarray):
        return f"a NumPy array {x.dtype.name}{list(x.shape)}"
    if isinstance(x, dict):
        return f"a mapping with keys {sorted(map(str, x))[:5]}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {x!r}"

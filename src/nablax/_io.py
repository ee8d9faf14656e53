"""Values leaving the lazy graph: ``nx.block_until_ready`` (wait for a pytree of tensors) and
checkpoints, ``nx.save`` / ``nx.load`` (a pytree of tensors in one ``.safetensors`` file).

The file is a standard safetensors file: every array leaf is one tensor named by its path in the
tree (``['layers'][0]['w']``), stored in its own dtype where safetensors has one. The tree's
structure (dicts, lists, tuples, ``None``, registered dataclasses by class name), the Python
numbers and strings among its leaves, and the true dtype of arrays safetensors cannot hold
(complex: stored as their float pairs) are JSON in the file's metadata under ``"nablax"``. Loading
reads JSON and raw arrays only: it never executes code from the file (no pickle).

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
import errno
import json
import os
import secrets
import stat
from typing import Any

import jax
import numpy as np

from . import tree as _tree
from .core.tensor import Tensor, realize

_FORMAT = "nablax.tree/1"
_META_KEY = "nablax"


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


def _encode(node: Any, path: str, arrays: dict) -> Any:
    """JSON of ``node``; array leaves go to ``arrays`` under their path."""
    if isinstance(node, (Tensor, jax.Array, np.ndarray)):
        arrays[path] = node
        return {"t": "array", "name": path}
    if node is None:
        return {"t": "none"}
    if isinstance(node, (bool, np.bool_)):
        return {"t": "bool", "v": bool(node)}
    if isinstance(node, (int, np.integer)):
        return {"t": "int", "v": int(node)}
    if isinstance(node, (float, np.floating)):
        return {"t": "float", "v": repr(float(node))}
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
            "items": [[k, _encode(v, f"{path}[{k!r}]", arrays)] for k, v in node.items()],
        }
    if isinstance(node, tuple) and hasattr(node, "_fields"):  # a namedtuple
        kids = [_encode(v, f"{path}.{f}", arrays) for f, v in zip(node._fields, node)]
        return {
            "t": "namedtuple",
            "cls": type(node).__qualname__,
            "fields": list(node._fields),
            "items": kids,
        }
    if isinstance(node, (list, tuple)):
        kids = [_encode(v, f"{path}[{k}]", arrays) for k, v in enumerate(node)]
        return {"t": type(node).__name__, "items": kids}
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        names = _stored_fields(node)[0]
        kids = [_encode(getattr(node, n), f"{path}.{n}", arrays) for n in names]
        return {"t": "dataclass", "cls": type(node).__qualname__, "fields": names, "items": kids}
    raise TypeError(
        f"nx.save: cannot store {path or 'the root'}, a {type(node).__name__}: checkpoints hold "
        f"tensors, arrays, Python numbers, strings, None, and dicts, lists, tuples, namedtuples "
        f"and dataclasses of them"
    )


def _decode(spec: Any, arrays: dict, like: Any, path: str, file: str) -> Any:
    t = spec["t"]
    if t == "array":
        return Tensor(arrays[spec["name"]])
    if t == "none":
        return None
    if t in ("bool", "int", "str"):
        return {"bool": bool, "int": int, "str": str}[t](spec["v"])
    if t == "float":
        return float(spec["v"])
    if t == "dict":
        return {k: _decode(v, arrays, None, f"{path}[{k!r}]", file) for k, v in spec["items"]}
    if t in ("list", "tuple"):
        kids = [_decode(v, arrays, None, f"{path}[{k}]", file) for k, v in enumerate(spec["items"])]
        return kids if t == "list" else tuple(kids)
    if t in ("namedtuple", "dataclass"):
        # the class is not imported from the file (no code runs): its fields come back as a dict,
        # or as the class of ``like=`` when given (see load)
        return {
            f: _decode(v, arrays, None, f"{path}.{f}", file)
            for f, v in zip(spec["fields"], spec["items"])
        }
    raise ValueError(f"nx.load: {file} has an unknown tree node kind {t!r} at {path or 'the root'}")


# ---- dtypes safetensors cannot hold --------------------------------------------------------------

_STORABLE = {
    np.dtype(d)
    for d in (
        "float64",
        "float32",
        "float16",
        "int64",
        "int32",
        "int16",
        "int8",
        "uint8",
        "uint16",
        "uint32",
        "uint64",
        "bool",
    )
}


def _to_storable(a: np.ndarray) -> tuple[np.ndarray, str | None]:
    """``(array safetensors can hold, original dtype name or None)``."""
    if a.dtype in _STORABLE:  # (ascontiguousarray makes a 0-d array 1-d: reshape it back)
        return np.ascontiguousarray(a).reshape(a.shape), None
    if a.dtype.kind == "c":  # complex: (..., 2) float pairs
        real = np.float32 if a.dtype == np.complex64 else np.float64
        return np.ascontiguousarray(a).view(real).reshape(a.shape + (2,)), a.dtype.name
    # bfloat16 and the other ml_dtypes: their raw bits as unsigned integers of the same width
    bits = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize]
    return np.ascontiguousarray(a).view(bits).reshape(a.shape), a.dtype.name


def _from_storable(a: np.ndarray, name: str | None) -> np.ndarray:
    if name is None:
        return a
    dtype = np.dtype(jax.numpy.dtype(name))
    if dtype.kind == "c":
        return np.ascontiguousarray(a).view(dtype).reshape(a.shape[:-1])
    return a.view(dtype)


# ---- save / load ------------------------------------------------------------------------------------


def save(path: str | os.PathLike, tree: Any) -> None:
    """Write the pytree ``tree`` (tensors, arrays, Python numbers, strings, ``None``, in dicts,
    lists, tuples, namedtuples, registered dataclasses such as modules and optimizer states) to
    the ``.safetensors`` file ``path``, atomically. Pending tensors are computed first, as one
    program. A new file gets the mode the umask gives, a replaced one keeps its mode, and a
    symlink is written through to its target.

    >>> import os, tempfile
    >>> import nablax as nx
    >>> path = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> nx.save(path, [nx.arange(3), nx.ones(2, dtype=nx.bfloat16)])
    >>> [t.tolist() for t in nx.load(path)]
    [[0, 1, 2], [1.0, 1.0]]
    """
    from safetensors.numpy import save as _st_save

    path = os.fspath(path)
    arrays: dict = {}
    structure = _encode(tree, "", arrays)
    realize(*[a for a in arrays.values() if isinstance(a, Tensor)])
    tensors, dtypes = {}, {}
    for name, a in arrays.items():
        value = a.numpy() if isinstance(a, Tensor) else np.asarray(a)
        tensors[name or "[root]"], orig = _to_storable(value)
        if orig is not None:
            dtypes[name or "[root]"] = orig
    if "" in arrays:  # the whole tree is one array
        structure["name"] = "[root]"
    meta = {_META_KEY: json.dumps({"format": _FORMAT, "tree": structure, "dtypes": dtypes})}
    _write_atomic(path, _st_save(tensors, metadata=meta))


def _os_error(e: OSError, path: str, what: str = "") -> OSError:
    """``e`` reported with the user's ``path`` (not the temporary file's)."""
    msg = f"nx.save: cannot write {path}: {what or e.strerror or e}"
    return OSError(e.errno, msg, path) if e.errno is not None else OSError(msg)


def _write_atomic(path: str, data: bytes) -> None:
    """``data`` to ``path`` through a temporary file in the same directory, renamed over it."""
    target = os.path.realpath(path)  # a symlink is written through: its target is replaced
    directory = os.path.dirname(target)
    if not os.path.isdir(directory):
        e = FileNotFoundError(errno.ENOENT, "")
        fix = "Fix: create it first (os.makedirs(..., exist_ok=True))"
        raise _os_error(e, path, f"the directory {directory} does not exist. {fix}")
    if os.path.isdir(target):
        fix = f"Fix: name a file in it, e.g. {os.path.join(path, 'ckpt.safetensors')}"
        raise _os_error(IsADirectoryError(errno.EISDIR, ""), path, f"it is a directory. {fix}")
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)  # a replaced file keeps its mode
    except OSError:
        mode = None  # a new file: 0o666 less the umask, as open() gives
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    for _ in range(100):
        tmp = os.path.join(directory, f".nablax-save-{secrets.token_hex(8)}.tmp")
        try:
            fd = os.open(tmp, flags, 0o666)
            break
        except FileExistsError:
            continue
        except OSError as e:
            raise _os_error(e, path) from None
    else:
        raise _os_error(FileExistsError(errno.EEXIST, "no free temporary name"), path)
    try:
        with os.fdopen(fd, "wb") as f:
            if mode is not None:
                os.chmod(tmp, mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(e, OSError):
            raise _os_error(e, path) from None
        raise
    if hasattr(os, "O_DIRECTORY"):  # make the rename itself durable
        try:
            dfd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:
            pass


def load(path: str | os.PathLike, like: Any = None) -> Any:
    """Read a checkpoint written by :func:`save`. With ``like=`` (a pytree of the structure to
    restore, e.g. a freshly initialized model or optimizer state), the result has ``like``'s
    containers and classes, and every leaf is checked against it: structure, shape and dtype.
    Without it, dicts, lists, tuples and ``None`` come back as they were and dataclasses and
    namedtuples as dicts of their fields (classes are never imported from the file).

    A missing, truncated, foreign or mismatched file raises ``ValueError`` naming the path and
    (for a mismatch) the first differing leaf.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load as _st_load

    path = os.fspath(path)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ValueError(f"nx.load: no checkpoint at {path} (the file does not exist)") from None
    except IsADirectoryError:
        raise ValueError(f"nx.load: {path} is a directory, not a checkpoint file") from None
    try:
        arrays = _st_load(data)
        meta = _read_meta(data)
    except (SafetensorError, ValueError, OSError, UnicodeDecodeError) as e:
        raise ValueError(
            f"nx.load: {path} is not a readable safetensors file (truncated or corrupt?): {e}"
        ) from None
    if meta is None or meta.get("format") != _FORMAT:
        found = "no nablax metadata" if meta is None else f"format {meta.get('format')!r}"
        raise ValueError(
            f"nx.load: {path} is a safetensors file with {found}; nx.load reads files written "
            f"by nx.save ({_FORMAT}). Fix: read it with the safetensors library directly"
        )
    for name, orig in meta.get("dtypes", {}).items():
        if name in arrays:
            arrays[name] = _from_storable(arrays[name], orig)
    missing = [s for s in _array_names(meta["tree"]) if s not in arrays]
    if missing:
        raise ValueError(f"nx.load: {path} lacks the tensor {missing[0]} that its tree names")
    out = _decode(meta["tree"], arrays, None, "", path)
    if like is None:
        return out
    return _restore_like(out, like, "", path)


def _read_meta(data: bytes) -> dict | None:
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    raw = (header.get("__metadata__") or {}).get(_META_KEY)
    return None if raw is None else json.loads(raw)


def _array_names(spec: Any):
    if spec.get("t") == "array":
        yield spec["name"]
    for item in spec.get("items", ()):
        yield from _array_names(item[1] if spec["t"] == "dict" else item)


def _restore_like(got: Any, like: Any, path: str, file: str) -> Any:
    """``got`` (decoded) in the structure of ``like``, checked leaf by leaf."""
    where = path or "the root"
    if isinstance(like, (Tensor, jax.Array, np.ndarray)):
        if not isinstance(got, Tensor):
            raise ValueError(
                f"nx.load: {file} has {_kind(got)} at {where}, where like= has a tensor"
            )
        want = (tuple(like.shape), np.dtype(like.dtype))
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
    if isinstance(x, dict):
        return f"a mapping with keys {sorted(map(str, x))[:5]}"
    if isinstance(x, (list, tuple)):
        return f"a {type(x).__name__} of {len(x)}"
    return f"{type(x).__name__} {x!r}"

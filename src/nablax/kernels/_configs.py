"""Configs <-> JSON, the stored entry records, argument checks and the registry of live caches:
what the memory cache (``cache.py``) and the SQLite cache (``_sqlite.py``) share. ``cache.py``
re-exports the public names; see its docstring for why a stored class name is never imported.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import sys
import typing
import weakref
from typing import Any

SOURCES = ("autotune", "heuristic")
_SCALARS = (int, float, str, bool, type(None))

# Config classes that stored names may resolve to, by "module:qualname": every class cfg_to_json
# stored in this process and every registered one. Names are never imported (see the docstring).
_KNOWN_CLASSES: dict[str, type] = {}

# Every live cache, so that a forked child can drop the connections and locks it inherited.
_LIVE_CACHES: weakref.WeakSet[Any] = weakref.WeakSet()
# A child must never use or close its parent's SQLite connections: they are parked here for good.
_ABANDONED: list[Any] = []


# --- configs <-> JSON ----------------------------------------------------------------------------


def _type_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _storable(v: Any) -> bool:
    # Exact types only: numpy scalars or IntEnums would come back as plain Python values.
    if type(v) in _SCALARS:
        return True
    return type(v) is tuple and all(_storable(x) for x in v)


def _encode(cfg: Any, api: str) -> str:
    cls = type(cfg)
    if not dataclasses.is_dataclass(cfg) or isinstance(cfg, type):
        raise TypeError(
            f"{api}: the config must be an instance of a frozen dataclass, got {cls.__name__} "
            f"{cfg!r:.60}. Fix: declare it with @dataclasses.dataclass(frozen=True)."
        )
    if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(
            f"{api}: config class {cls.__qualname__} is a dataclass but not frozen, so it is not "
            f"a safe cache value. Fix: declare it with @dataclasses.dataclass(frozen=True)."
        )
    fields = {}
    for f in dataclasses.fields(cfg):
        if not f.init:  # rebuilt by the class itself (__post_init__)
            continue
        v = getattr(cfg, f.name)
        if not _storable(v):
            raise TypeError(
                f"{api}: field {f.name!r} of config class {cls.__qualname__} holds "
                f"{type(v).__name__} {v!r:.60}, which cannot be stored. Fix: use int, float, str, "
                f"bool, None or a tuple of them (e.g. int(x) for a numpy integer, tuple(x) for a "
                f"list)."
            )
        fields[f.name] = v
    name = _type_name(cls)
    _KNOWN_CLASSES[name] = cls
    return json.dumps({"type": name, "fields": fields}, sort_keys=True, separators=(",", ":"))


def cfg_to_json(cfg: Any) -> str:
    """Serialize a kernel config (a frozen dataclass instance) to a stable JSON string.

    Keys are sorted, so equal configs give equal strings. Raises ``TypeError`` (naming the class,
    the field and the fix) for anything that could not be rebuilt by :func:`cfg_from_json`.

    >>> import dataclasses
    >>> from nablax.kernels.cache import cfg_to_json, cfg_from_json
    >>> @dataclasses.dataclass(frozen=True)
    ... class TileCfg:
    ...     block: int = 64
    ...     shape: tuple = (8, 8)
    >>> s = cfg_to_json(TileCfg())
    >>> s
    '{"fields":{"block":64,"shape":[8,8]},"type":"...:TileCfg"}'
    >>> cfg_from_json(s) == TileCfg()
    True
    """
    return _encode(cfg, "nablax.kernels.cache.cfg_to_json")


def _tuplify(v: Any) -> Any:
    return tuple(_tuplify(x) for x in v) if isinstance(v, list) else v


def _is_cfg_class(c: Any) -> bool:
    return isinstance(c, type) and dataclasses.is_dataclass(c)


def register_config_class(*classes: type) -> None:
    """Let the caches rebuild stored configs of these classes (frozen dataclasses).

    Needed only for a config class that no kernel declares (as the ``Cfg`` of
    ``Kernel[Cfg, Out]`` or through ``heuristic_cfg``/``candidate_cfgs``) and that this process has
    not stored yet, e.g. when reading a database with :meth:`PersistentCache.entries`.

    >>> import dataclasses
    >>> from nablax.kernels.cache import register_config_class, cfg_from_json
    >>> @dataclasses.dataclass(frozen=True)
    ... class PlanCfg:
    ...     unroll: int = 1
    >>> register_config_class(PlanCfg)
    >>> cfg_from_json('{"fields": {"unroll": 4}, "type": "%s:PlanCfg"}' % PlanCfg.__module__)
    PlanCfg(unroll=4)
    """
    for cls in classes:
        if not (_is_cfg_class(cls) and cls.__dataclass_params__.frozen):  # type: ignore[attr-defined]
            raise TypeError(
                f"nablax.kernels.cache.register_config_class: expected frozen dataclass classes, "
                f"got {cls!r:.60}. Fix: pass the class itself, declared with "
                f"@dataclasses.dataclass(frozen=True)."
            )
        _KNOWN_CLASSES[_type_name(cls)] = cls


def _generic_cfg(cls: type) -> list[type]:
    out = []
    for base in getattr(cls, "__orig_bases__", ()):
        args = typing.get_args(base)
        if args and _is_cfg_class(args[0]):
            out.append(args[0])
    return out


def declared_config_types(kernel: Any = None, inv: Any = None) -> tuple[type, ...]:
    """The config classes ``kernel`` declares: the ``Cfg`` of ``Kernel[Cfg, Out]`` in its class
    bases and, given an invocation, the classes of what its ``heuristic_cfg`` and
    ``candidate_cfgs`` return for it (a hook that raises declares nothing). With no kernel: the
    ``Cfg`` of every ``Kernel`` subclass defined so far.

    >>> from nablax.kernels import library
    >>> from nablax.kernels.cache import declared_config_types
    >>> declared_config_types(library.MATMUL)
    (<class 'nablax.kernels.library.matmul.MatmulCfg'>,)
    """
    found: dict[type, None] = {}
    if kernel is None:
        from .kernel import Kernel

        stack = list(Kernel.__subclasses__())
        while stack:
            cls = stack.pop()
            stack.extend(cls.__subclasses__())
            found.update(dict.fromkeys(_generic_cfg(cls)))
        return tuple(found)
    for cls in type(kernel).__mro__:
        found.update(dict.fromkeys(_generic_cfg(cls)))
    if inv is not None:
        found.update(dict.fromkeys(_hook_classes(kernel, inv)))
    return tuple(found)


def _hook_classes(kernel: Any, inv: Any) -> list[type]:
    from .store.fingerprint import get_device_platform

    plat, sm = get_device_platform(), getattr(inv, "method", None) == "shard_map"
    out: list[type] = []
    for hook in ("heuristic_cfg", "candidate_cfgs"):
        try:
            got = kernel.hook(hook, plat, sm)(inv)
            cfgs = [got] if hook == "heuristic_cfg" else list(got or ())
        except Exception:  # noqa: BLE001 - a failing hook only declares nothing
            continue
        out += [type(c) for c in cfgs if c is not None and _is_cfg_class(type(c))]
    return out


def _resolve_class(name: str, types: Any = None) -> type | None:
    """The declared class stored as ``name``, or None. Never imports anything."""
    cls = _KNOWN_CLASSES.get(name)
    if cls is not None:
        return cls
    for group in (types, declared_config_types):
        if callable(group):
            try:
                group = group()
            except Exception:  # noqa: BLE001 - a failing declaration only declares nothing
                group = ()
        for c in group or ():
            if _is_cfg_class(c) and _type_name(c) == name:
                _KNOWN_CLASSES[name] = c
                return c
    return None


def _parse(s: str, api: str) -> tuple[str, dict]:
    try:
        doc = json.loads(s)
        name = doc["type"]
        fields = doc["fields"] if "fields" in doc else doc.get("value")
        if not isinstance(name, str) or not isinstance(fields, dict):
            raise TypeError("'type' must be a string and 'fields' an object")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(
            f"{api}: {s!r:.80} is not a stored config ({e}). Fix: pass a string made by "
            f"cfg_to_json."
        ) from None
    return name, fields


@dataclasses.dataclass(frozen=True)
class StoredConfig:
    """A stored config as text, without rebuilding its class (what ``nablax cache list`` shows,
    so reading a database never runs code a class name points to).

    >>> from nablax.kernels.cache import StoredConfig
    >>> StoredConfig.from_json('{"fields": {"block": 8, "shape": [2, 2]}, "type": "m:TileCfg"}')
    TileCfg(block=8, shape=(2, 2))
    """

    type_name: str
    fields: tuple[tuple[str, Any], ...]

    @classmethod
    def from_json(cls, s: str) -> StoredConfig:
        """Parse text made by :func:`cfg_to_json` (``ValueError`` for anything else)."""
        name, fields = _parse(s, "nablax.kernels.cache.StoredConfig.from_json")
        return cls(name, tuple((k, _tuplify(v)) for k, v in sorted(fields.items())))

    def __repr__(self) -> str:
        qualname = self.type_name.rpartition(":")[2]
        return f"{qualname}({', '.join(f'{k}={v!r}' for k, v in self.fields)})"


def cfg_from_json(s: str, types: Any = None) -> Any:
    """Rebuild a config written by :func:`cfg_to_json` (JSON lists come back as tuples).

    The stored class name is looked up among declared classes only (see the module docstring),
    plus ``types``: classes, or a function returning them, e.g. a kernel's
    ``declared_config_types``. Raises ``ValueError`` for text that is not such a JSON document and
    ``TypeError`` when the class is not declared or no longer accepts the stored fields (the caches
    then treat the entry as stale).

    >>> from nablax.kernels.cache import cfg_from_json
    >>> cfg_from_json('{"fields": {}, "type": "os:system"}')
    Traceback (most recent call last):
    ...
    TypeError: nablax.kernels.cache.cfg_from_json: config class os:system is not one this ...
    """
    api = "nablax.kernels.cache.cfg_from_json"
    name, fields = _parse(s, api)
    cls = _resolve_class(name, types)
    if cls is None:
        raise TypeError(
            f"{api}: config class {name} is not one this process declared, so the entry is not "
            f"used (nablax never imports a module named by a cache entry). Fix: declare it as the "
            f"Cfg of Kernel[Cfg, Out], call nablax.kernels.cache.register_config_class(...) "
            f"with it, or re-tune."
        )
    try:
        return cls(**{k: _tuplify(v) for k, v in fields.items()})
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{api}: config class {name} no longer accepts the stored fields {sorted(fields)} "
            f"({e}). Fix: re-tune; the stored entry is stale."
        ) from None


# --- entries -------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheEntry:
    """One cached config with where it came from.

    ``timings`` holds ``(cfg_json, seconds, error)`` for every candidate that was timed (``seconds``
    is ``inf`` for a failed candidate, ``error`` its message or ``None``); it is empty for
    heuristic configs. ``signature`` is a human-readable description of the call's shapes.

    >>> from nablax.kernels.cache import CacheEntry
    >>> e = CacheEntry("cpu", "matmul@v1", "k", None, "heuristic", (), "0.1.0", 0.0)
    >>> (e.source, e.timings, e.signature)
    ('heuristic', (), '')
    """

    device: str
    op_id: str
    call_key: str
    cfg: Any
    source: str
    timings: tuple[tuple[str, float, str | None], ...]
    package_version: str
    created: float
    signature: str = ""


def _package_version() -> str:
    v = getattr(sys.modules.get("nablax"), "__version__", None)
    if isinstance(v, str):
        return v
    try:
        return importlib.metadata.version("nablax")
    except importlib.metadata.PackageNotFoundError:
        return "0+unknown"


def _check_args(api: str, device: Any, op_id: Any, call_key: Any, source: str = "autotune") -> None:
    for arg, v in (("device", device), ("op_id", op_id), ("call_key", call_key)):
        if not isinstance(v, str):
            raise TypeError(
                f"{api}: argument {arg!r} must be a str, got {type(v).__name__} {v!r:.60}. "
                f"Fix: pass the device fingerprint, the versioned op id (e.g. 'matmul@v1') and "
                f"Invocation.call_key as strings."
            )
    if source not in SOURCES:
        raise ValueError(f"{api}: source={source!r} is not one of {SOURCES}. Fix: pass one.")


def _norm_timings(
    timings: Any, api: str, encode: Any = None
) -> tuple[tuple[str, float, str | None], ...]:
    """``(cfg_json, seconds, error_text_or_None)`` rows from cfg objects, exceptions, numbers."""
    encode = encode or _encode
    rows = []
    for item in timings or ():
        try:
            c, secs, err = item
            secs = float(secs)
        except (TypeError, ValueError):
            raise TypeError(
                f"{api}: each item of timings must be (cfg, seconds, error), got {item!r:.80}. "
                f"Fix: pass a sequence of 3-tuples, seconds=inf for failed candidates."
            ) from None
        if isinstance(err, BaseException):
            err = f"{type(err).__name__}: {err}"
        err = None if err is None else str(err)
        rows.append((c if isinstance(c, str) else encode(c, api), secs, err))
    return tuple(rows)

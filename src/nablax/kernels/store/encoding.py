"""How stored values are written and read back beyond ``_configs.py``'s config JSON: candidate
timings as JSON (non-finite seconds as strings), configs through a user's ``loader``/``dumper``,
and the lookup of a stored class among the modules this process has already imported (never
importing one)."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
from typing import Any

from .._configs import CacheEntry, StoredConfig, _parse, _resolve_class, _type_name, cfg_from_json

_API = "nablax.kernels.PersistentCache"


def timings_to_json(timings: tuple[tuple[str, float, str | None], ...]) -> str:
    # JSON has no inf/nan: non-finite seconds are stored as the strings "inf" / "nan".
    rows = [[c, s if math.isfinite(s) else str(s), e] for c, s, e in timings]
    return json.dumps(rows, separators=(",", ":"))


def timings_from_json(s: str) -> tuple[tuple[str, float, str | None], ...]:
    return tuple((c, float(secs), err) for c, secs, err in json.loads(s))


def dump_with(dumper: Any, cfg: Any, api: str) -> str:
    try:
        value = dumper(cfg)
        return json.dumps(
            {"type": _type_name(type(cfg)), "value": value},
            sort_keys=True,
            separators=(",", ":"),
            allow_nan=False,
        )
    except (TypeError, ValueError) as e:
        raise TypeError(
            f"{api}: the dumper's result for {type(cfg).__name__} {cfg!r:.60} is not JSON ({e}). "
            f"Fix: make dumper return dicts, lists, strings, finite numbers, bools or None."
        ) from None


def load_with(loader: Any, text: str) -> Any:
    try:
        doc = json.loads(text)
        value = doc["value"] if "value" in doc else doc["fields"]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{_API}: {text!r:.80} is not a stored config ({e}).") from None
    try:
        return loader(value)
    except Exception as e:  # noqa: BLE001 - the user's loader: its failure makes the entry stale
        raise TypeError(
            f"{_API}: the loader failed on {text!r:.80} ({type(e).__name__}: {e}); the entry is "
            f"stale. Fix: make loader accept what dumper returns (or the config's fields), or "
            f"re-tune."
        ) from None


def imported_class(name: str) -> type | None:
    """The frozen dataclass that ``'module:qualname'`` names, if that module is already imported:
    nothing is imported, and no module or class ``__getattr__`` hook runs (plain ``__dict__``
    lookups)."""
    module, _, qualname = name.partition(":")
    obj: Any = sys.modules.get(module)
    if obj is None or not qualname:
        return None
    for part in qualname.split("."):
        obj = vars(obj).get(part) if hasattr(obj, "__dict__") else None
        if obj is None:
            return None
    params = getattr(obj, "__dataclass_params__", None)
    if isinstance(obj, type) and dataclasses.is_dataclass(obj) and params is not None:
        return obj if params.frozen else None
    return None


def decode_config(cfg_json: str, types: Any) -> tuple[Any, str | None]:
    """``(config, None)``; or ``(None, class name)`` when the stored class is neither declared
    (``types``, see ``_configs.py``) nor a frozen dataclass of a module this process imported
    (found in ``sys.modules``, never imported). Raises ``TypeError``/``ValueError`` for a stale
    entry (a declared class the stored fields no longer fit, or text that is not a config)."""
    try:
        return cfg_from_json(cfg_json, types), None
    except TypeError:
        name = _parse(cfg_json, _API)[0]
        if _resolve_class(name, types) is not None:
            raise  # declared, but the stored fields no longer fit it: stale
        cls = imported_class(name)
        if cls is None:
            return None, name
        return cfg_from_json(cfg_json, (cls,)), None


def stored_text(cfg_json: str) -> StoredConfig:
    """The stored config as text, without rebuilding its class (``nablax cache list``)."""
    try:
        return StoredConfig.from_json(cfg_json)
    except ValueError:
        return StoredConfig("?", (("text", cfg_json[:80]),))


def entry_from_row(row: tuple, cfg: Any) -> CacheEntry:
    """A :class:`CacheEntry` from a row of ``schema.SQL_ENTRIES`` and its config."""
    d, op, key, _, source, timings, version, created, sig = row
    return CacheEntry(d, op, key, cfg, source, timings_from_json(timings), version, created, sig)

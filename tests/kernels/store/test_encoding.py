"""Tests of nablax/kernels/store/encoding.py: timings as JSON (non-finite seconds too), configs
through a user's loader/dumper, and the lookup of a stored class among the modules this process
imported, which never imports one and never runs a module's ``__getattr__``."""

from __future__ import annotations

import dataclasses
import math
import sys
import types

import pytest

from nablax.kernels.cache import StoredConfig, cfg_to_json
from nablax.kernels.store import encoding


@dataclasses.dataclass(frozen=True)
class Tile:
    block: int = 8


@dataclasses.dataclass
class Loose:
    block: int = 8


def test_timings_round_trip_keeps_inf_and_nan():
    timings = (("a", 0.25, None), ("b", math.inf, "OOM"), ("c", math.nan, "ValueError: x"))
    text = encoding.timings_to_json(timings)
    assert "Infinity" not in text and "NaN" not in text  # plain JSON
    back = encoding.timings_from_json(text)
    assert back[:2] == timings[:2]
    assert back[2][0] == "c" and math.isnan(back[2][1]) and back[2][2] == "ValueError: x"


def test_imported_class_finds_only_frozen_dataclasses_of_imported_modules(monkeypatch):
    here = __name__
    assert encoding.imported_class(f"{here}:Tile") is Tile
    assert encoding.imported_class(f"{here}:Loose") is None  # not frozen
    assert encoding.imported_class(f"{here}:pytest") is None  # not a class
    assert encoding.imported_class("nablax_never_imported_module:Tile") is None
    assert "nablax_never_imported_module" not in sys.modules
    calls = []
    lazy = types.ModuleType("nablax_lazy_module")
    lazy.__getattr__ = lambda name: calls.append(name) or Tile  # type: ignore[method-assign]
    monkeypatch.setitem(sys.modules, "nablax_lazy_module", lazy)
    assert encoding.imported_class("nablax_lazy_module:Tile") is None and calls == []


def test_decode_config_declared_imported_and_unknown_classes():
    text = cfg_to_json(Tile(16))
    assert encoding.decode_config(text, (Tile,)) == (Tile(16), None)
    assert encoding.decode_config(text, ()) == (Tile(16), None)  # found among imported modules
    unknown = text.replace(f"{__name__}:Tile", "nablax_never_imported_module:Tile")
    assert encoding.decode_config(unknown, ()) == (None, "nablax_never_imported_module:Tile")
    stale = text.replace('"block"', '"blocks"')  # a declared class the fields no longer fit
    with pytest.raises(TypeError):
        encoding.decode_config(stale, (Tile,))


def test_stored_text_never_rebuilds_a_class():
    shown = encoding.stored_text(cfg_to_json(Tile(4)))
    assert isinstance(shown, StoredConfig) and repr(shown) == "Tile(block=4)"
    assert encoding.stored_text("not json at all") == StoredConfig(
        "?", (("text", "not json at all"),)
    )


def test_dumper_and_loader_round_trip_and_errors():
    text = encoding.dump_with(lambda c: {"b": c.block}, Tile(3), "api")
    assert encoding.load_with(lambda v: Tile(v["b"]), text) == Tile(3)
    with pytest.raises(TypeError, match=r"api: the dumper's result for Tile .* is not JSON"):
        encoding.dump_with(lambda c: object(), Tile(3), "api")
    with pytest.raises(TypeError, match=r"the loader failed .* the entry is stale"):
        encoding.load_with(lambda v: 1 / 0, text)
    with pytest.raises(ValueError, match="is not a stored config"):
        encoding.load_with(lambda v: v, "[1, 2]")

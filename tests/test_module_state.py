"""Module-level state of nablax (issue 39): every module-level mutable container is on a list.

Every module under ``src/nablax`` is imported (``pkgutil``), and each name a module assigns at its
top level (read from its source, so names it imports are left to their owner) is checked:

- a mutable container (``dict``, ``list``, ``set``, ``OrderedDict``, ``defaultdict``, ``deque``,
  ``WeakValueDictionary``, ``WeakSet``, any ``MutableMapping``/``MutableSet``/``MutableSequence``)
  or a ``functools.cache``/``lru_cache`` function must be in :data:`ALLOWED`, with a short reason:
  a registry filled at import, a constant table, named process-wide state... A cache is not a
  reason: caches are ``nablax._caches.Cache`` objects (bounded, counted by ``nx.cache_info()``,
  emptied by ``nx.clear_caches()``), or ``nablax._caches.DictCache`` objects on the per-op hot
  paths (a plain dict read without a lock, bounded and registered the same way). The caches not
  converted yet are listed with the reason :data:`TODO`, so that they stay visible;
- an entry for a container that no longer exists fails too: the list says what is there;
- every ``Cache``/``DictCache`` held by a module (or by a module-level state object) is
  registered, so ``nx.cache_info()`` reports it and ``nx.clear_caches()`` empties it.

To add a container: make it a registered ``_caches.Cache`` (or ``DictCache``) if it is a cache,
else add ``"module:name": "why"`` below.
"""

from __future__ import annotations

import ast
import collections
import collections.abc as abc
import functools
import importlib
import importlib.util
import pkgutil
import sys
import types
import weakref
from pathlib import Path

import pytest

import nablax
from nablax import _caches
from nablax.kernels import default_executor

TODO = "TODO(issue 39): unbounded cache"
CONST = "constant table, never changed after import"
REGISTRY = "registry filled at import (one entry per definition)"

ALLOWED: dict[str, str] = {
    # base layer
    "nablax._caches:_registry": "the cache registry itself (one entry per registered cache)",
    "nablax._config:_OPTIONS": REGISTRY + ": the options",
    "nablax._config:_values": "process-wide option values (env at import, nx.config.update)",
    "nablax._config:_sources": "where each option value came from (with _values)",
    "nablax._io:_AS_NUMPY": CONST,
    "nablax._io:_BITS_OF": CONST,
    "nablax._io:_COMPLEX": CONST,
    "nablax._io:_ML": CONST,
    "nablax._io:_ML_IN_TENSORS": CONST,
    "nablax._io:_PLAIN": CONST,
    "nablax._io:_STORED_AS": CONST,
    "nablax.tree:_MODULES": REGISTRY + ": nn.Module classes and their child fields",
    "nablax.tree:_FLATTENED": "flatten memo of live module trees: an entry dies with its root (weak "
    "reference), is checked against every list in the tree at each use, and the memo starts over "
    "past _FLATTENED_MAX entries",
    # core
    "nablax.core.cpu_threads:_changed": "process-wide state: threads nablax moved to SCHED_BATCH",
    "nablax.core.dtypes:_CANON": CONST,
    "nablax.core.dtypes:_WEAK_EXAMPLE": CONST,
    "nablax.core.gc_threshold:_state": "process-wide state: the collector threshold nablax set",
    "nablax.core.host_memory:DEFAULTS": CONST,
    "nablax.core.host_memory:RETAINED": CONST,
    "nablax.core.host_memory:_libc": "lazily found libc function (at most one item)",
    "nablax.core.host_memory:_state": "process-wide state: whether the malloc setting is applied",
    "nablax.core.ops.index:_MODES": CONST,
    "nablax.core.primitive:REGISTRY": REGISTRY + ": every primitive by name",
    "nablax.core.prims._rules:NONDIFFERENTIABLE": CONST,
    "nablax.core.prims.elementwise.table:BINARY": REGISTRY + ": binary element-wise ops",
    "nablax.core.prims.elementwise.table:PRIMS": REGISTRY + ": element-wise primitives",
    "nablax.core.prims.elementwise.table:UNARY": REGISTRY + ": unary element-wise ops",
    "nablax.core.prims.elementwise.table:_fns": REGISTRY + ": element-wise builders",
    "nablax.core.prims.elementwise.dtype_rules:KINDS": CONST,
    "nablax.core.prims.elementwise.builders:_SCALARS": CONST,
    "nablax.core.prims.elementwise.builders:_SCALAR_RULES": REGISTRY + ": each binary op's scalar "
    "cache (DictCaches, reported and cleared together as ops.scalar_rules)",
    "nablax.core.prims.linalg:LAX_PRECISION": CONST,
    "nablax.core.prims.random:_RULES": REGISTRY + ": random primitives' rules",
    "nablax.core.transforms.compile.info:LIVE": "weak registry of live nx.compile functions "
    "(nx.cache_info / nx.clear_caches reach their caches through it)",
    "nablax.core.transforms.compile.scalars:_DTYPE": CONST,
    "nablax.core.transforms.compile.scalars:_ORDER": CONST,
    "nablax.core.transforms.sizes:_SYMBOLS": CONST,
    # kernels
    "nablax.kernels._configs:_ABANDONED": "connections a forked child inherited: kept, never "
    "used or closed (closing would break the parent's)",
    "nablax.kernels._configs:_KNOWN_CLASSES": "registry of config classes declared or stored "
    "(one per class; a stored name resolves only to these)",
    "nablax.kernels._configs:_LIVE_CACHES": "weak registry of live config caches (fork hook, "
    "nx.cache_info / nx.clear_caches)",
    "nablax.kernels.executor:_LIVE": "weak registry of live executors (nx.cache_info / "
    "nx.clear_caches reach their memos through it)",
    "nablax.kernels.library.attention:_CORES": CONST,
    "nablax.kernels.library.attention_ext:DEFAULTS": CONST,
    "nablax.kernels.library.matmul:_IMPLS": CONST,
    "nablax.kernels.selection:_FALLBACK_ALIASES": CONST,
    "nablax.kernels.store.messages:_warned": "warn-once memory: each problem warns once per "
    "process (one entry per distinct problem; clearing it would repeat warnings)",
    "nablax.kernels.store.salvage:_COLUMNS": CONST,
    "nablax.kernels.store.salvage:_KEYS": CONST,
    "nablax.kernels.store.salvage:_KEY_WALKS": CONST,
    "nablax.kernels.store.salvage:_KINDS": CONST,
    "nablax.kernels.store.schema:MIGRATIONS": "the schema migrations (constant; tests add one "
    "in a child process to act as a newer nablax)",
    "nablax.kernels.tuning:_ATTN_SHAPES": CONST,
    "nablax.kernels.tuning:_MATMUL_SHAPES": CONST,
    # nn
    "nablax.nn._module:_SHORT": CONST,
    "nablax.nn.functional:_AUTOCAST_F32": CONST,
    # xcs
    "nablax.xcs.classify.effects:_ARG_DEPENDENT": CONST,
    "nablax.xcs.classify.keywords:_WHOLE": CONST,
    "nablax.xcs.classify.keywords:_WORDS": CONST,
    "nablax.xcs.classify.rules:METHOD_HINTS": CONST,
    "nablax.xcs.classify.rules:MODULE_ALIASES": CONST,
    "nablax.xcs.classify.rules:RULES": CONST,
    "nablax.xcs.classify.verbs:_EXACT": CONST,
    "nablax.xcs.engine:_STORING_BUILTINS": CONST,
    "nablax.xcs.engine:_STORING_METHODS": CONST,
    "nablax.xcs.loopback:_ERROR_TYPES": CONST,
    "nablax.xcs.markers:EPOCH": "process-wide counter (one item), bumped by every marker",
    "nablax.xcs.scheduler:_pools": "process-wide thread pools, one per worker count",
    "nablax.xcs.scheduler:_queue": "process-wide queue of pending work",
    "nablax.xcs.transforms:_HOST": "lazily made singleton (at most one item)",
    "nablax.xcs.transforms:_PREFIXES": CONST,
}

MUTABLE = (
    dict,  # OrderedDict, defaultdict, Counter too
    list,
    set,
    bytearray,
    collections.deque,
    weakref.WeakValueDictionary,
    weakref.WeakKeyDictionary,
    weakref.WeakSet,
    abc.MutableMapping,
    abc.MutableSet,
    abc.MutableSequence,
)


def _assigned_names(tree: ast.Module) -> set[str]:
    """The names a module assigns at its top level (also inside top-level if/try/with)."""
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                targets = [node.target]
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                names.add(node.name)  # a decorated function may be a functools cache
                continue
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for part in ("body", "orelse", "finalbody"):
                    visit(getattr(node, part, []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
                continue
            else:
                continue
            for target in targets:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))

    visit(tree.body)
    return names


def _kind(value: object) -> str | None:
    if isinstance(value, functools._lru_cache_wrapper):
        return "functools cache"
    if isinstance(value, MUTABLE):
        return type(value).__name__
    return None


def containers_of(module: types.ModuleType) -> dict[str, str]:
    """``{"module:name": kind}`` of the mutable containers and functools caches ``module`` keeps
    at its top level (dunder names such as ``__all__`` left out)."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    found = {}
    for name in sorted(_assigned_names(tree)):
        if name.startswith("__") and name.endswith("__"):
            continue
        kind = _kind(vars(module).get(name))
        if kind is not None:
            found[f"{module.__name__}:{name}"] = kind
    return found


CACHES = (_caches.Cache, _caches.DictCache)


def caches_of(module: types.ModuleType) -> dict[str, _caches.Cache | _caches.DictCache]:
    """The ``_caches.Cache``/``DictCache`` objects ``module`` holds: at its top level, or as an
    attribute of a module-level state object (``_S.plans``)."""
    found = {}
    for name, value in vars(module).items():
        if isinstance(value, CACHES):
            found[f"{module.__name__}:{name}"] = value
        elif not isinstance(value, (type, types.ModuleType)) and hasattr(value, "__dict__"):
            for attr, inner in vars(value).items():
                if isinstance(inner, CACHES):
                    found[f"{module.__name__}:{name}.{attr}"] = inner
    return found


def _registered(cache: _caches.Cache) -> bool:
    """Registered by name, with ``info`` of this very object (``Cache(...)``, or
    ``register(name, cache.info, ...)``)."""
    with _caches._registry_lock:
        entries = list(_caches._registry.values())
    return any(getattr(info, "__self__", None) is cache for info, _ in entries)


@functools.cache
def _modules() -> tuple[types.ModuleType, ...]:
    mods = [nablax]
    for info in pkgutil.walk_packages(nablax.__path__, "nablax."):
        mods.append(importlib.import_module(info.name))
    with_files = [m for m in mods if getattr(m, "__file__", None)]
    # Compiled extension modules have no Python source to audit. The only one is the optional
    # nablax.core._graphc (core/_graphc.c): its static state is the classes and the context
    # object setup()/setup_build() hand it once, no container that grows.
    compiled = {m.__name__ for m in with_files if not m.__file__.endswith(".py")}
    assert compiled <= {"nablax.core._graphc"}, f"extension modules nobody audited: {compiled}"
    return tuple(m for m in with_files if m.__file__.endswith(".py"))


@functools.cache
def _found() -> dict[str, str]:
    found: dict[str, str] = {}
    for module in _modules():
        found.update(containers_of(module))
    return found


def test_every_module_is_walked():
    names = {m.__name__ for m in _modules()}
    assert {"nablax._caches", "nablax.kernels.store.persistent", "nablax.core.primitive"} <= names
    assert len(names) > 100


def test_no_module_level_mutable_container_outside_the_allow_list():
    new = {k: v for k, v in _found().items() if k not in ALLOWED}
    assert not new, (
        "module-level mutable containers that are not in tests/test_module_state.py's ALLOWED: "
        + ", ".join(f"{k} ({v})" for k, v in sorted(new.items()))
        + ". Fix: a cache becomes a registered nablax._caches.Cache (bounded, cleared by "
        "nx.clear_caches()); anything else gets an ALLOWED entry that says why."
    )


def test_the_allow_list_names_only_containers_that_exist():
    stale = sorted(set(ALLOWED) - set(_found()))
    assert not stale, (
        f"ALLOWED in tests/test_module_state.py names containers that no longer exist: {stale}. "
        "Fix: remove those entries (or rename them where the module moved)."
    )


def test_every_allow_list_entry_says_why():
    vague = {k: why for k, why in ALLOWED.items() if not isinstance(why, str) or len(why) < 8}
    assert not vague
    assert all(":" in k and k.startswith("nablax") for k in ALLOWED)


def _cleared_by_clear_caches(caches: dict[str, _caches.Cache]) -> dict[str, bool]:
    """Whether ``nx.clear_caches()`` empties each cache (for a cache registered through an
    aggregate, such as every live executor's memos): a marker entry is put in, then looked for."""
    marker = ("test_module_state", object())
    for cache in caches.values():
        cache.put(marker, True)
    nablax.clear_caches()
    return {where: marker not in cache for where, cache in caches.items()}


def test_every_module_level_cache_is_registered():
    default_executor()  # made on first use: its memos are module-level state then
    caches = {where: c for m in _modules() for where, c in caches_of(m).items()}
    indirect = {where: c for where, c in caches.items() if not _registered(c)}
    unregistered = sorted(
        f"{where} ({indirect[where].name!r})"
        for where, cleared in _cleared_by_clear_caches(indirect).items()
        if not cleared
    )
    assert not unregistered, (
        f"nablax._caches.Cache objects that nx.cache_info()/nx.clear_caches() never reach: "
        f"{unregistered}. Fix: Cache(name, maxsize) registers itself; with register=False, call "
        f"_caches.register(name, cache.info, clear) (or register an aggregate, as executor.py)."
    )


def test_a_cache_is_never_allowed_for_another_reason():
    """What is named or built as a cache (``_kind_cache``, ``functools.cache``) may only be listed
    as not converted yet, never as a table or registry."""
    found = _found()
    disguised = sorted(
        k
        for k, why in ALLOWED.items()
        if ("cache" in k.split(":")[1].lower().split("_") or found.get(k) == "functools cache")
        and not why.startswith(TODO)
    )
    assert not disguised, f"caches allowed as something else: {disguised}"


# --- the checks themselves catch what they are meant to ------------------------------------------

_SAMPLE = """
import collections, functools, weakref
from nablax import _caches
from collections import OrderedDict as IMPORTED_ELSEWHERE

__all__ = ["x"]
TABLE = {"a": 1}
ITEMS: list = []
SEEN = set()
ORDER = collections.OrderedDict()
BY_KIND = collections.defaultdict(list)
QUEUE = collections.deque()
REFS = weakref.WeakValueDictionary()
FROZEN = frozenset({1})
PAIR = (1, 2)
if True:
    try:
        NESTED = {}
    except ImportError:
        pass
ok_cache = _caches.Cache("test_module_state.sample_ok", 4)
lost_cache = _caches.Cache("test_module_state.sample_lost", 4, register=False)
ok_dict = _caches.DictCache("test_module_state.sample_ok_dict", 4)
lost_dict = _caches.DictCache("test_module_state.sample_lost_dict", 4, register=False)


class _State:
    def __init__(self):
        self.inner = _caches.Cache("test_module_state.sample_inner", 4, register=False)


_S = _State()


@functools.cache
def memo(x):
    return x


def local():
    inside = {}
    return inside
"""


@pytest.fixture
def sample(tmp_path):
    path = tmp_path / "nablax_module_state_sample.py"
    path.write_text(_SAMPLE, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("nablax_module_state_sample", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]
    with _caches._registry_lock:
        _caches._registry.pop("test_module_state.sample_ok", None)
        _caches._registry.pop("test_module_state.sample_ok_dict", None)


def test_containers_of_finds_each_kind_and_nothing_else(sample):
    found = {k.split(":")[1]: v for k, v in containers_of(sample).items()}
    assert found == {
        "TABLE": "dict",
        "ITEMS": "list",
        "SEEN": "set",
        "ORDER": "OrderedDict",
        "BY_KIND": "defaultdict",
        "QUEUE": "deque",
        "REFS": "WeakValueDictionary",
        "NESTED": "dict",
        "memo": "functools cache",
    }


def test_caches_of_tells_registered_from_lost_ones(sample):
    caches = caches_of(sample)
    registered = {k.split(":")[1]: _registered(c) for k, c in caches.items()}
    expected = {
        "ok_cache": True,
        "lost_cache": False,
        "ok_dict": True,
        "lost_dict": False,
        "_S.inner": False,
    }
    assert registered == expected
    cleared = _cleared_by_clear_caches(caches)
    assert {k.split(":")[1]: v for k, v in cleared.items()} == expected

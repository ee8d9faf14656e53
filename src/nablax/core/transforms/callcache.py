"""Whole-call cache of eager transform calls whose function is provably pure.

An eager training loop calls the same transformed function every step:
``nx.value_and_grad(loss)(params, x, y)`` or ``nx.vmap(nx.grad(loss))(w, xs, ys)``. Each call runs
``loss`` under the transform, which costs far more Python than the program it builds costs to run
when the model is small. ``jax.jit`` avoids that by tracing once; it may, because the user asked for
it and accepted that Python side effects run only while tracing. Eager nablax makes no such request,
so it may skip the user's Python only when skipping it cannot change anything:

1. The first call with a given argument signature runs normally.
2. The second one runs normally too, *recorded*: a ``sys.setprofile`` hook (this thread only) sees
   every Python function that runs and every built-in it calls. The call is **cacheable** only if:

   - the user code that ran (anything outside nablax's own core, in any file) contains no
     instruction that writes outside its own frame (``STORE_GLOBAL``, ``STORE_ATTR``,
     ``STORE_SUBSCR``, ``STORE_DEREF``, deletions, imports, ``yield`` outside generator
     expressions), reads attributes only of modules or of tensors (``x.shape``, ``x.sum``; not
     ``self.w``), and calls only built-ins known to be pure (``len``, ``isinstance``, ``math.*``,
     read-only methods of tuples, lists and dicts; not ``print``, ``list.append``, ``random``) and
     no library code other than nablax;
   - nothing was realized, read back to the host, drawn from the global random key, or marked with
     ``requires_grad_``/``backward`` during the call;
   - every global, closure cell and default value that code read is a module, a function, a class,
     a Python scalar (or tuple of them), a dtype or a tensor (compared by identity), and every
     executed function can be found from the transformed function through those;
   - the outputs are new pending tensors whose graph reads only the arguments (and constants).

   Then the graph the call built (after vmap batching and the backward pass) is stored as slots,
   like :mod:`.plan` does for a backward pass, together with *guards*: the values of those globals,
   cells and defaults.
3. Later calls with the same argument signature whose guards still hold build the same nodes
   directly, without running the function: the same values, the same realization cache key, the
   same laziness (the results can still fuse with what follows). A failed guard (say, a global
   learning rate changed) runs the function again and records anew.
4. When the results of a replay were realized exactly on their own (the program computed those
   outputs and nothing else: ``realize.Group``), the recording keeps that program's binding. A
   later call whose tensor arguments are all computed then starts the program at once
   (asynchronously, as ``jax.jit`` does) and returns computed tensors: nothing was pending beside
   the call's graph last time, so nothing could have fused with it. Calls with a pending argument
   replay lazily as in 3. The option ``call_cache_dispatch`` turns this step off.

The argument signature is the pytree structure, each tensor's shape and dtype, which arguments are
the same tensor, and the value of each non-tensor leaf (Python scalars only; anything else is not
cached). Calls inside other transforms, inside ``nx.compile``, under ``_config.override`` (of any
option but ``call_cache`` and ``call_cache_dispatch``) or while a
profiler or debugger is installed (``sys.getprofile`` / ``sys.gettrace``) always run normally. The
option ``call_cache`` (``NABLAX_CALL_CACHE=0``) turns the cache off.
"""

from __future__ import annotations

import builtins
import dis
import functools
import os
import sys
import sysconfig
import types
import weakref

import numpy as np

from ... import _config
from ... import tree as _tree
from .. import realize as _realize
from ..graph import EFFECTS, SCALAR_TYPES, Const, Node, note_pending, seq_of
from ..tensor import Tensor, TensorImpl
from . import plan as _plan
from .plan import _Lit, _scalar_code
from .trace import _stack
from .vmap import _level

_REFS = (Node, tuple)
_MAX_KEYS = 64  # argument signatures kept per transformed function
_MAX_GUARD_MISSES = 3  # re-recordings after failed guards before a signature is left uncached


class _Stats:
    def __init__(self) -> None:
        self.hits = 0
        self.recordings = 0
        self.declined = 0
        self.generation = 0  # bumped by clear(): every cache entry recorded before is stale
        self.last_reason = ""  # why the last recording was declined (for tests and debugging)


_S = _Stats()
_SEEN = "seen"  # first call of a signature ran; the next one records


def info() -> tuple[int, int, int]:
    """(replays, recordings, declined recordings) since the last :func:`clear`."""
    return _S.hits, _S.recordings, _S.declined


def last_decline_reason() -> str:
    return _S.last_reason


def clear() -> None:
    """Forget every recording (``nx.clear_caches``)."""
    _S.generation += 1
    _S.hits = _S.recordings = _S.declined = 0


# options that an override may set without turning the cache off (every other option may change
# what the function builds, so any override of one makes every call run)
_OWN_OPTIONS = frozenset(("call_cache", "call_cache_dispatch"))


def active() -> bool:
    """Whether a transform call made here may use the cache (outermost, eager, no overrides)."""
    if _stack.traces or _level.depth or _realize._tracing_depth:
        return False
    ov = _config._overrides.get()
    if ov is not None and not ov.keys() <= _OWN_OPTIONS:
        return False
    return _config.get("call_cache")


def wrap(f, run):
    """``run`` as the public function of a transform of ``f``, with a whole-call cache for eager
    calls (``run`` computes a call the ordinary way)."""
    cache: dict = {}

    @functools.wraps(f)
    def wrapped(*args, **kwargs):
        if kwargs or not active():
            return run(*args, **kwargs)
        return call(cache, f, run, args)

    return wrapped


def call(cache: dict, f, run, args: tuple):
    """``run(*args)``, or a replay of its recorded graph (see the module docstring).

    ``cache`` belongs to one transformed function; ``f`` is the user function it transforms.
    """
    key, arrays = _arg_key(args)
    if key is None:
        return run(*args)
    entry = cache.get(key)
    if type(entry) is _Recording and entry.generation == _S.generation:
        if entry.guards_hold():
            _S.hits += 1
            fast = entry.fast
            if (
                fast is not None
                and arrays is not None
                and fast.pattern == entry.tensor_pos  # bound with every tensor argument computed
                and _config.get("call_cache_dispatch")
            ):
                out = entry.dispatch(arrays)
                if out is not None:
                    return out
            return entry.replay(args)
        entry.misses += 1
        if entry.misses > _MAX_GUARD_MISSES:
            cache[key] = None
            return run(*args)
        return _record(cache, key, f, run, args, entry.misses)
    if entry is None and key in cache:  # declined before
        return run(*args)
    if entry is _SEEN or type(entry) is _Recording:  # second call, or a stale recording
        return _record(cache, key, f, run, args, 0)
    if len(cache) >= _MAX_KEYS:
        cache.clear()
    cache[key] = _SEEN
    return run(*args)


# ---- argument signature ----------------------------------------------------------------------


def _arg_key(args: tuple):
    """``(signature, arrays)``: the argument signature (``None``: not cacheable) and the values of
    the tensor arguments in order (``None`` unless every one is computed)."""
    for a in args:
        if type(a) is not Tensor:
            leaves, treedef = _tree.flatten(args)
            parts = [treedef]
            break
    else:  # only tensors: the common ``f(w, x, y)`` needs no pytree flattening
        leaves = args
        parts = [len(args)]
    first: dict = {}
    arrays: list | None = []
    for i, leaf in enumerate(leaves):
        t = type(leaf)
        if t is Tensor:
            impl = leaf._impl
            if impl.batch_shape or impl.sharding is not None:
                return None, None
            ref = impl.src
            if ref is None:
                ref = impl.value
                if arrays is not None:
                    arrays.append(ref)
            elif (ref if type(ref) is Node else ref[0]).trace is not None:
                return None, None  # differentiated (requires_grad_): must build traced nodes
            else:
                arrays = None
            k = id(ref) if type(ref) is not tuple else ref
            parts.append((impl.shape, impl.dtype, first.setdefault(k, i)))
        elif t in SCALAR_TYPES or leaf is None or t is str:
            parts.append(_scalar_code(leaf))
        else:
            return None, None
    return tuple(parts), arrays


def _arg_refs(args: tuple) -> list:
    """The node-input reference of each tensor leaf of ``args`` (``None`` for other leaves)."""
    out = []
    for leaf in _tree.leaves(args):
        if type(leaf) is Tensor:
            impl = leaf._impl
            out.append(impl.src if impl.src is not None else impl.value)
        else:
            out.append(None)
    return out


def _ref_depth(ref) -> int:
    t = type(ref)
    if t is Node:
        return ref.depth
    if t is tuple:
        return ref[0].depth
    return 0


# ---- recording -------------------------------------------------------------------------------


class _Decline(Exception):
    pass


def _record(cache: dict, key, f, run, args: tuple, misses: int):
    if sys.getprofile() is not None or sys.gettrace() is not None:
        cache[key] = _SEEN
        return run(*args)
    epoch, effects = _realize.epoch(), EFFECTS[0]
    watcher = _Watcher()
    sys.setprofile(watcher)
    try:
        out = run(*args)
    finally:
        sys.setprofile(None)
    try:
        if watcher.bad:
            raise _Decline(watcher.bad)
        if _realize.epoch() != epoch:
            raise _Decline("it realized a value (data-dependent Python)")
        if EFFECTS[0] != effects:
            raise _Decline(
                "it read a value, used the global random key, or changed requires_grad/.grad"
            )
        guards = _guards(f, watcher.codes)
        rec = _capture(out, args, guards)
    except _Decline as e:
        _S.declined += 1
        _S.last_reason = str(e)
        cache[key] = None
        return out
    rec.misses = misses
    cache[key] = rec
    _S.recordings += 1
    return out


# Where code lives: nablax's own core is trusted (its functions are pure graph building, and its
# stateful corners bump EFFECTS); user code is analyzed; any other library called from user code
# declines the cache.
_NABLAX_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_UNTRUSTED_NABLAX = (os.path.join(_NABLAX_DIR, "xcs"), os.path.join(_NABLAX_DIR, "kernels"))
_LIB_DIRS = tuple(
    {
        os.path.abspath(p)
        for k in ("stdlib", "platstdlib", "purelib", "platlib")
        if (p := sysconfig.get_paths().get(k))
    }
)
_USER, _TRUSTED, _LIBRARY = 0, 1, 2
_category_memo: dict = {}


def _category(filename: str) -> int:
    c = _category_memo.get(filename)
    if c is None:
        path = os.path.abspath(filename) if not filename.startswith("<") else filename
        if path.startswith(_NABLAX_DIR + os.sep) and not path.startswith(_UNTRUSTED_NABLAX):
            c = _TRUSTED
        elif filename.startswith("<frozen") or path.startswith(_LIB_DIRS + (_NABLAX_DIR,)):
            c = _LIBRARY
        else:
            c = _USER
        _category_memo[filename] = c
    return c


_PURE_BUILTINS = frozenset(
    """abs all any bin callable chr divmod format hasattr hex isinstance issubclass iter len max
    min next oct ord pow repr round sorted sum""".split()
)
_PURE_MODULES = frozenset(("math", "cmath", "operator", "_operator"))
_READONLY_METHODS = frozenset(
    ("get", "keys", "values", "items", "copy", "index", "count", "__getitem__", "__contains__")
)
_IMMUTABLE = (tuple, str, bytes, int, float, complex, bool, frozenset, range, slice, type(None))


def _pure_c(fn) -> bool:
    owner = getattr(fn, "__self__", None)
    name = getattr(fn, "__name__", "")
    if owner is builtins:
        return name in _PURE_BUILTINS
    if isinstance(owner, types.ModuleType):
        return owner.__name__ in _PURE_MODULES
    if isinstance(owner, _IMMUTABLE):
        return True
    if isinstance(owner, (list, dict)):
        return name in _READONLY_METHODS
    return False


class _Watcher:
    """The ``sys.setprofile`` hook of a recording: user code objects run, and the first reason
    the call cannot be cached."""

    __slots__ = ("codes", "bad")

    def __init__(self) -> None:
        self.codes: dict = {}  # code object -> the globals it ran with
        self.bad = ""

    def __call__(self, frame, event, arg) -> None:
        if self.bad:
            return
        if event == "call":
            code = frame.f_code
            cat = _category(code.co_filename)
            if cat == _USER:
                self.codes.setdefault(code, frame.f_globals)
            elif cat == _LIBRARY:
                back = frame.f_back
                if back is not None and _category(back.f_code.co_filename) == _USER:
                    self.bad = f"it calls {code.co_qualname} ({code.co_filename}), outside nablax"
        elif event == "c_call" and _category(frame.f_code.co_filename) == _USER:
            if not _pure_c(arg):
                self.bad = f"it calls the built-in {getattr(arg, '__qualname__', arg)!r}"


# ---- what the user code read: guards ---------------------------------------------------------

_FORBIDDEN = frozenset(
    """STORE_GLOBAL DELETE_GLOBAL STORE_ATTR DELETE_ATTR STORE_SUBSCR DELETE_SUBSCR STORE_DEREF
    DELETE_DEREF IMPORT_NAME IMPORT_FROM IMPORT_STAR LOAD_NAME STORE_NAME DELETE_NAME SETUP_ANNOTATIONS
    YIELD_VALUE SEND GET_AWAITABLE BEFORE_ASYNC_WITH""".split()
)
_IMPURE_TENSOR_ATTRS = frozenset(
    """item numpy tolist to_jax block_until_ready grad requires_grad requires_grad_ backward
    is_realized sharding""".split()
)
_tensor_attrs: frozenset | None = None


def _tensor_attr_ok(name: str) -> bool:
    global _tensor_attrs
    if _tensor_attrs is None:
        _tensor_attrs = frozenset(dir(Tensor)) - _IMPURE_TENSOR_ATTRS
    return name in _tensor_attrs


_MISSING = object()
_IDENTITY_TYPES = (
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    type,
    types.MethodWrapperType,
)


def _value_check(v):
    """``(mode, expected)`` to check ``v`` later: ``"is"`` or ``"eq"``; raises ``_Decline``."""
    if isinstance(v, _IDENTITY_TYPES) or v is _MISSING or v is Ellipsis:
        return ("is", v)
    t = type(v)
    if t in SCALAR_TYPES or v is None or t is str or t is bytes:
        return ("eq", _scalar_code(v))
    if t is tuple or t is frozenset:
        return ("eq", _value_code(v))
    if isinstance(v, np.dtype) or (t is type and issubclass(v, np.generic)):
        return ("eq", (t, v))
    if t is Tensor:
        return ("impl", weakref.ref(v._impl))
    if getattr(v, "__module__", "").startswith("nablax.") and not callable(v):
        return ("is", v)  # nablax singletons such as dtypes
    if callable(v) and getattr(v, "__module__", "").startswith("nablax"):
        return ("is", v)  # nablax functions and primitives
    raise _Decline(f"it reads a {t.__name__}, which cannot be guarded by value")


def _value_code(v):
    t = type(v)
    if t is tuple or t is frozenset:
        return (t, tuple(_value_code(x) for x in v))
    mode, expected = _value_check(v)
    if mode != "eq":
        raise _Decline(f"it reads a tuple holding a {t.__name__}")
    return expected


def _check(mode, expected, v) -> bool:
    if mode == "is":
        return v is expected
    if mode == "impl":
        return type(v) is Tensor and v._impl is expected()
    try:
        return _value_code(v) == expected
    except _Decline:
        return False


def _code_reads(code, fglobals, fn, guards: list, known: dict) -> None:
    """Check ``code``'s instructions; add a guard for every global / module attribute it reads."""
    bgl = fglobals.get("__builtins__", builtins)
    bdict = bgl if isinstance(bgl, dict) else bgl.__dict__
    cells = {}
    if fn is not None and fn.__closure__:
        cells = {
            name: c.cell_contents
            for name, c in zip(fn.__code__.co_freevars, fn.__closure__)
            if _cell_full(c)
        }
    module = None  # the module the previous instruction produced, if any
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op in _FORBIDDEN and not (op == "YIELD_VALUE" and code.co_name == "<genexpr>"):
            raise _Decline(f"{code.co_qualname} executes {op} (it may change state)")
        produced = None
        if op == "LOAD_GLOBAL":
            name = ins.argval
            v = fglobals.get(name, _MISSING)
            guards.append((fglobals, name, *_value_check(v)))
            if v is _MISSING:
                v = bdict.get(name, _MISSING)
                guards.append((bdict, name, *_value_check(v)))
            _note_fn(v, known)
            produced = v
        elif op in ("LOAD_DEREF", "LOAD_CLOSURE", "LOAD_CLASSDEREF"):
            produced = cells.get(ins.argval)
        elif op in ("LOAD_ATTR", "LOAD_METHOD"):
            name = ins.argval
            if module is not None:
                v = getattr(module, name, _MISSING)
                guards.append((module.__dict__, name, *_value_check(v)))
                _note_fn(v, known)
                produced = v
            elif not _tensor_attr_ok(name):
                raise _Decline(
                    f"{code.co_qualname} reads attribute .{name} of an object that is not a "
                    f"module or a tensor (it may change between calls)"
                )
        elif op in ("PRECALL", "CACHE", "EXTENDED_ARG", "NOP", "PUSH_NULL"):
            produced = module  # these do not change the value on top of the stack
        module = produced if isinstance(produced, types.ModuleType) else None


def _cell_full(cell) -> bool:
    try:
        cell.cell_contents  # noqa: B018 - raises ValueError when empty
    except ValueError:
        return False
    return True


def _note_fn(v, known: dict) -> None:
    if isinstance(v, types.FunctionType):
        known.setdefault(v.__code__, v)


def _unwrap(f) -> list:
    """``f`` and the functions it wraps (``functools.wraps``), as far as they go."""
    out = []
    seen = set()
    while f is not None and id(f) not in seen:
        seen.add(id(f))
        out.append(f)
        f = getattr(f, "__wrapped__", None)
    return out


def _guards(f, codes: dict) -> tuple:
    known: dict = {}
    for g in _unwrap(f):
        if isinstance(g, types.MethodType):
            raise _Decline("the transformed function is a bound method (its object may change)")
        if isinstance(g, types.FunctionType):
            known.setdefault(g.__code__, g)
    guards: list = []
    nested = set()
    for code in codes:
        for c in code.co_consts:
            if isinstance(c, types.CodeType):
                nested.add(c)
    pending = list(codes.items())
    done = set()
    while pending:
        progressed = False
        rest = []
        for code, fglobals in pending:
            fn = known.get(code)
            if fn is None and code not in nested:
                rest.append((code, fglobals))
                continue
            progressed = True
            done.add(code)
            if fn is not None:
                _function_guards(fn, guards, known)
            _code_reads(code, fglobals, fn, guards, known)
        pending = rest
        if not progressed:
            code = pending[0][0]
            raise _Decline(f"cannot tell where {code.co_qualname} comes from (to guard its state)")
    return tuple(guards)


def _function_guards(fn, guards: list, known: dict) -> None:
    if fn.__closure__:
        for cell in fn.__closure__:
            v = cell.cell_contents if _cell_full(cell) else _MISSING
            guards.append((cell, None, *_value_check(v)))
            _note_fn(v, known)
    for v in fn.__defaults__ or ():
        _value_check(v)  # defaults are immutable values (checked), fixed with the function
    for v in (fn.__kwdefaults__ or {}).values():
        _value_check(v)


# ---- the recorded graph ----------------------------------------------------------------------


class _Recording:
    """The nodes a call built, as slots over its argument refs, plus its guards."""

    __slots__ = (
        "nodes",
        "outputs",
        "out_treedef",
        "guards",
        "generation",
        "misses",
        "fast",
        "n_args",
        "out_avals",
        "made_slots",
        "bare",
        "tensor_pos",
    )

    def __init__(self, nodes, outputs, out_treedef, guards, n_args: int, tensor_pos) -> None:
        self.n_args = n_args
        # the distinct output slots in order (the order replay makes their tensors in)
        self.out_avals = {o[1]: (o[2], o[3]) for o in outputs if o[0] == "t"}
        self.made_slots = tuple(self.out_avals)
        self.bare = out_treedef.num_nodes == 1 and out_treedef.num_leaves == 1  # one leaf
        self.tensor_pos = tensor_pos  # which argument leaves are tensors
        self.nodes = nodes  # plan.encode_node tuples
        self.outputs = outputs  # per output leaf: ("t", slot, shape, dtype) or ("v", value)
        self.out_treedef = out_treedef
        self.guards = guards
        self.generation = _S.generation
        self.misses = 0
        self.fast = None  # realize.Binding of the program that realized a replay exactly

    def guards_hold(self) -> bool:
        for container, name, mode, expected in self.guards:
            if name is None:  # a closure cell
                try:
                    v = container.cell_contents
                except ValueError:
                    v = _MISSING
            else:
                v = container.get(name, _MISSING)
            if mode == "is":
                if v is not expected:
                    return False
            elif not _check(mode, expected, v):
                return False
        return True

    def dispatch(self, arrays: list):
        """The call's results computed at once by the program its replays were realized with
        (``fast``), given the values of the tensor arguments; ``None`` if that program is gone
        (replay instead). The program runs asynchronously, as ``jax.jit`` would run it."""
        # the result tensors first: little Python between starting the program and returning
        # one tensor per output slot: an output returned twice is the same object, as in a call
        made = {
            slot: Tensor._wrap(TensorImpl(None, None, *aval))
            for slot, aval in self.out_avals.items()
        }
        leaves = [o[1] if o[0] == "v" else made[o[1]] for o in self.outputs]
        out = leaves[0] if self.bare else _tree.unflatten(self.out_treedef, leaves)
        results = _realize.run_bound(self.fast, arrays)
        if results is None:
            self.fast = None
            return None
        for t, value in zip(made.values(), results):
            t._impl.value = value
        return out

    def replay(self, args: tuple):
        env = _arg_refs(args)
        depths = [_ref_depth(r) for r in env]
        built: dict = {}
        max_depth = _plan.build_nodes(self.nodes, env, depths, None, built)
        made: dict = {}  # slot -> impl
        wrapped: dict = {}  # slot -> tensor (one per slot: an output returned twice is one object)
        leaves = []
        for out in self.outputs:
            if out[0] == "v":
                leaves.append(out[1])
                continue
            _, slot, shape, dtype = out
            t = wrapped.get(slot)
            if t is None:
                impl = made[slot] = _plan.bind_output(env[slot], shape, dtype)
                note_pending(_plan.src_out(env[slot]))
                t = wrapped[slot] = Tensor._wrap(impl)
            leaves.append(t)
        if max_depth > _config.get("max_graph_depth"):
            _realize.realize_impls(list(made.values()))
        else:
            pos = [
                i
                for i, r in enumerate(env[: self.n_args])
                if r is not None and type(r) not in _REFS
            ]
            group = _realize.Group(
                self, built, [env[i] for i in pos], tuple(pos), list(made.values())
            )
            _realize.note_group(group)
        return _tree.unflatten(self.out_treedef, leaves)


def _capture(out, args: tuple, guards: tuple) -> _Recording:
    arg_slot: dict = {}  # node, (node, j) or id(array) -> slot
    for i, ref in enumerate(_arg_refs(args)):
        if ref is not None:
            k = id(ref) if type(ref) not in (Node, tuple) else ref
            arg_slot.setdefault(k, i)
    n_args = len(_tree.leaves(args))
    leaves, treedef = _tree.flatten(out)
    roots = []
    for leaf in leaves:
        if type(leaf) is Tensor:
            impl = leaf._impl
            if impl.value is not None or impl.src is None:
                raise _Decline("an output is already computed (not built by this call)")
            if impl.batch_shape or impl.sharding is not None:
                raise _Decline("an output is batched or sharded")
            src = impl.src
            if src in arg_slot:
                raise _Decline("an output is an argument")
            roots.append(src if type(src) is Node else src[0])
        elif not (type(leaf) in SCALAR_TYPES or leaf is None or type(leaf) is str):
            raise _Decline(f"an output is a {type(leaf).__name__}")
    new: dict = dict.fromkeys(roots)
    stack = list(new)
    while stack:
        n = stack.pop()
        if n.values is not None or n.inputs is None:
            raise _Decline("the graph reads a computed value that is not an argument")
        if n.trace is not None and n.trace.alive():
            raise _Decline("the graph belongs to a live transform")
        for inp in n.inputs:
            t = type(inp)
            if t is Node or t is tuple:
                if inp in arg_slot:
                    continue
                m = inp if t is Node else inp[0]
                if m not in new:
                    new[m] = None
                    stack.append(m)
            elif t in SCALAR_TYPES or t is Const:
                continue
            elif id(inp) not in arg_slot:
                raise _Decline("the graph reads an array that is not an argument")
    slot_of: dict = {}
    n_slots = n_args
    nodes = []
    for n in sorted(new, key=seq_of):
        codes = []
        for inp in n.inputs:
            t = type(inp)
            if t is Node or t is tuple:
                s = arg_slot.get(inp)
                if s is None:
                    m, j = (inp, 0) if t is Node else inp
                    s = slot_of[m] + j
                codes.append(s)
            elif t in SCALAR_TYPES or t is Const:
                codes.append(_Lit(inp))
            else:
                codes.append(arg_slot[id(inp)])
        slot_of[n] = n_slots
        n_slots += len(n.outs)
        nodes.append(_plan.encode_node(n, codes, None))
    outputs = []
    for leaf in leaves:
        if type(leaf) is Tensor:
            impl = leaf._impl
            m, j = (impl.src, 0) if type(impl.src) is Node else impl.src
            outputs.append(("t", slot_of[m] + j, impl.shape, impl.dtype))
        else:
            outputs.append(("v", leaf))
    tensor_pos = tuple(i for i, r in enumerate(_arg_refs(args)) if r is not None)
    return _Recording(tuple(nodes), tuple(outputs), treedef, guards, n_args, tensor_pos)

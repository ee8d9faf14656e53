"""State-change cases for ``test_soundness.py``.

Each case is a ``make(env)`` function returning a :class:`Built`: the user's function ``fn(w,
*args)`` (a scalar of ``w``, shape ``(3,)``), the state changes to apply one after another, and
closed-form NumPy oracles (value, gradient, Hessian) that read the state *as it is now* (or as the
last run of ``fn`` recorded it, for draws and counters). Every ``fn`` first calls ``env.tick()``:
a pure no-op in the harness's first pass, a counter in its second, so one case definition checks
both stale results (of a body a purity guess would skip) and exact side-effect counts.
Categories follow the headings below; ``CASES`` maps each case's name to its :class:`Case`.
"""

from __future__ import annotations

import builtins
import contextvars
import dataclasses
import functools
import io
import itertools
import logging
import os
import random
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace as NS

import numpy as np

import nablax as nx

W_A = np.array([0.5, -1.25, 2.0])
W_B = np.array([1.5, 0.25, -0.75])


class Counter:
    def __init__(self) -> None:
        self.n = 0

    def tick(self) -> None:
        self.n += 1


@dataclass
class Built:
    fn: Callable
    value: Callable[[np.ndarray], float]
    grad: Callable[[np.ndarray], np.ndarray]
    hess: Callable[[np.ndarray], np.ndarray]
    mutations: tuple
    args: Callable[[], tuple] = tuple
    raises: Callable[[], type | None] = lambda: None
    check: Callable[[], None] | None = None  # assertions on side effects after each call


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[..., Built]
    no_vmap: str | None = None  # why the case cannot run under vmap
    xfail: str | None = None  # a known bug (strict xfail)


def _no_op() -> None:
    pass


class Env:
    """What a case gets: ``monkeypatch``, finalizers that undo global state changes, ``tick`` (the
    first thing every body calls) and ``made`` (transformed calls the harness has made so far).

    With ``counted=False``, ``tick`` is a pure no-op, so the body stays free of side effects (a
    purity guess could skip it: the results must still be right). With ``counted=True`` it counts,
    and ``runs()`` says how often the body ran."""

    def __init__(self, monkeypatch, counted: bool) -> None:
        self.mp = monkeypatch
        self._undo: list = []
        self.made = 0
        self._runs = Counter()
        self.tick = self._runs.tick if counted else _no_op
        self.counted = counted

    def runs(self) -> int | None:
        return self._runs.n if self.counted else None

    def defer(self, fn, *args) -> None:
        self._undo.append((fn, args))

    def close(self) -> None:
        for fn, args in reversed(self._undo):
            fn(*args)


CASES: dict[str, Case] = {}


def case(no_vmap=None, xfail=None):
    def register(make):
        name = make.__name__.removeprefix("case_")
        CASES[name] = Case(name, make, no_vmap, xfail)
        return make

    return register


def quad(fn, mutations, a=lambda: 1.0, m=lambda: 0.0, b=lambda: 0.0, **kw) -> Built:
    """Oracles of ``sum(a * (w - m) ** 2 + b * w)`` with a, m, b read from the current state."""

    def arr(get):
        return np.asarray(get(), dtype=np.float64)

    def value(w):
        return float(np.sum(arr(a) * (w - arr(m)) ** 2 + arr(b) * w))

    def grad(w):
        return 2.0 * arr(a) * (w - arr(m)) + arr(b) + 0.0 * w

    def hess(w):
        return np.diag(2.0 * arr(a) * np.ones_like(w))

    return Built(fn, value, grad, hess, tuple(mutations), **kw)


def _aligned(n: int, offset_bytes: int = 0) -> np.ndarray:
    """A float32 array whose buffer starts ``offset_bytes`` past a 64-byte boundary."""
    buf = np.zeros(n + 32, np.float32)
    start = (-buf.ctypes.data % 64 + offset_bytes) // 4
    out = buf[start : start + n]
    assert out.ctypes.data % 64 == offset_bytes
    return out


# ---- class attributes, instances, properties, setattr ------------------------------------


@case()
def case_class_attr(env):
    """The issue's repro: a class attribute read by the function."""

    class Norm:
        mean = 0.0

    tick = env.tick

    def f(w):
        tick()
        return ((w - Norm.mean) ** 2).sum()

    def to_five():
        Norm.mean = 5.0

    def to_negative():
        Norm.mean = -2.5

    return quad(f, [to_five, to_negative], m=lambda: Norm.mean)


@case()
def case_class_attr_inherited(env):
    class Base:  # attribute names that are also Tensor methods (`std`, `max`, `mean`) defeat
        std = 2.0  # a bytecode guess that reads `x.<tensor method>` as harmless

    class Child(Base):
        pass

    tick = env.tick

    def f(w):
        tick()
        return (Child.std * w**2).sum()

    def change_base():
        Base.std = 3.0

    def shadow_on_child():
        Child.std = 0.5

    return quad(f, [change_base, shadow_on_child], a=lambda: Child.std)


@case()
def case_class_attr_via_instance(env):
    class Cfg:
        center = 0.0

    cfg, tick = Cfg(), env.tick

    def f(w):
        tick()
        return ((w - cfg.center) ** 2).sum()

    def change_class():
        Cfg.center = 1.5

    def shadow_on_instance():
        cfg.center = -0.5

    return quad(f, [change_class, shadow_on_instance], m=lambda: cfg.center)


@case()
def case_metaclass_attr(env):
    class Meta(type):
        max = 1.0

    class C(metaclass=Meta):
        pass

    tick = env.tick

    def f(w):
        tick()
        return (C.max * w**2).sum()

    def change_meta():
        Meta.max = 4.0

    def shadow_on_class():
        C.max = 0.25

    return quad(f, [change_meta, shadow_on_class], a=lambda: C.max)


@case()
def case_classmethod_exponent(env):
    class Poly:
        p = 2

        @classmethod
        def energy(cls, w):
            return (w**cls.p).sum()

    tick = env.tick

    def f(w):
        tick()
        return Poly.energy(w)

    def cube():
        Poly.p = 3

    def fourth():
        Poly.p = 4

    p = lambda: Poly.p
    return Built(
        f,
        lambda w: float(np.sum(w ** p())),
        lambda w: p() * w ** (p() - 1),
        lambda w: np.diag(p() * (p() - 1) * w ** (p() - 2)),
        (cube, fourth),
    )


@case()
def case_staticmethod_replaced(env):
    class Ops:
        @staticmethod
        def act(w):
            return w * w

    tick = env.tick

    def f(w):
        tick()
        return Ops.act(w).sum()

    st = NS(a=1.0)

    def replace():
        Ops.act = staticmethod(lambda w: 3.0 * w * w)
        st.a = 3.0

    def replace_again():
        Ops.act = staticmethod(lambda w: 0.5 * w * w)
        st.a = 0.5

    return quad(f, [replace, replace_again], a=lambda: st.a)


@case()
def case_instance_attr(env):
    m, tick = NS(scale=1.0, center=0.0), env.tick

    def f(w):
        tick()
        return (m.scale * (w - m.center) ** 2).sum()

    def first():
        m.scale, m.center = 2.0, -1.0

    def second():
        m.scale = 0.5

    return quad(f, [first, second], a=lambda: m.scale, m=lambda: m.center)


@case()
def case_instance_dict_write(env):
    class Obj:
        def __init__(self):
            self.center = 0.0

    o, tick = Obj(), env.tick

    def f(w):
        tick()
        return ((w - o.center) ** 2).sum()

    return quad(
        f,
        [lambda: o.__dict__.__setitem__("center", 3.0), lambda: vars(o).update(center=-0.5)],
        m=lambda: o.center,
    )


@case()
def case_hasattr_instance(env):
    o, tick = NS(), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(o, "extra"):
            out = out + (o.extra * w).sum()
        return out

    def add():
        o.extra = 2.0

    def remove():
        del o.extra

    return quad(f, [add, remove], b=lambda: getattr(o, "extra", 0.0))


@case()
def case_hasattr_class(env):
    class Flags:
        pass

    tick = env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(Flags, "tilt"):
            out = out + (2.0 * w).sum()
        return out

    def add():
        Flags.tilt = True

    def remove():
        del Flags.tilt

    return quad(f, [add, remove], b=lambda: 2.0 if hasattr(Flags, "tilt") else 0.0)


@case()
def case_class_bases_changed(env):
    class Fast:
        pass

    class Plain:
        pass

    class Impl(Plain):
        pass

    tick = env.tick

    def f(w):
        tick()
        if issubclass(Impl, Fast):
            return (4.0 * w**2).sum()
        return (w**2).sum()

    def rebase():
        Impl.__bases__ = (Fast,)

    def rebase_back():
        Impl.__bases__ = (Plain,)

    return quad(f, [rebase, rebase_back], a=lambda: 4.0 if issubclass(Impl, Fast) else 1.0)


@case()
def case_property(env):
    class Cfg:
        def __init__(self):
            self._s = 1.0

        @property
        def s(self):
            return 2.0 * self._s

    cfg, tick = Cfg(), env.tick

    def f(w):
        tick()
        return (cfg.s * w**2).sum()

    def backing_field():
        cfg._s = 3.0

    def replace_property():
        Cfg.s = property(lambda self: -0.5)

    return quad(f, [backing_field, replace_property], a=lambda: cfg.s)


@case()
def case_getattr_hook(env):
    class Table:
        def __init__(self, d):
            self.d = d

        def __getattr__(self, name):
            return self.d[name]

    t, tick = Table({"center": 1.0}), env.tick

    def f(w):
        tick()
        return ((w - t.center) ** 2).sum()

    def new_table():
        t.d = {"center": 0.5}

    return quad(f, [lambda: t.d.update(center=-2.0), new_table], m=lambda: t.d["center"])


@case()
def case_type_setattr(env):
    class K:
        mean = 0.0

    tick = env.tick

    def f(w):
        tick()
        return ((w - K.mean) ** 2).sum()

    muts = [lambda: type.__setattr__(K, "mean", 1.5), lambda: type.__setattr__(K, "mean", -1.0)]
    return quad(f, muts, m=lambda: K.mean)


@case()
def case_setattr_computed_name(env):
    o, tick = NS(scale=1.0), env.tick

    def f(w):
        tick()
        return (getattr(o, "sca" + "le") * w**2).sum()

    muts = [lambda: setattr(o, "sc" + "ale", 2.5), lambda: setattr(o, "scale", 0.25)]
    return quad(f, muts, a=lambda: o.scale)


@case()
def case_object_setattr_frozen(env):
    @dataclasses.dataclass(frozen=True)
    class Frozen:
        a: float = 1.0
        m: float = 0.0

    fz, tick = Frozen(), env.tick

    def f(w):
        tick()
        return (fz.a * (w - fz.m) ** 2).sum()

    muts = [lambda: object.__setattr__(fz, "m", 2.0), lambda: object.__setattr__(fz, "a", 3.0)]
    return quad(f, muts, a=lambda: fz.a, m=lambda: fz.m)


@case()
def case_slots(env):
    class S:
        __slots__ = ("a",)

    s, tick = S(), env.tick
    s.a = 1.0

    def f(w):
        tick()
        return (s.a * w**2).sum()

    def assign():
        s.a = 2.5

    def through_descriptor():
        S.a.__set__(s, 0.5)

    return quad(f, [assign, through_descriptor], a=lambda: s.a)


# ---- closures, defaults, redefinition --------------------------------------------------------


@case()
def case_closure_nonlocal(env):
    tick = env.tick

    def factory():
        m = 0.0

        def f(w):
            tick()
            return ((w - m) ** 2).sum()

        def set_m(v):
            nonlocal m
            m = v

        return f, set_m, lambda: m

    f, set_m, get_m = factory()
    return quad(f, [lambda: set_m(2.0), lambda: set_m(-1.5)], m=get_m)


@case()
def case_closure_cell_write(env):
    tick = env.tick

    def make_f(m):
        def f(w):
            tick()
            return ((w - m) ** 2).sum()

        return f

    f = make_f(1.0)
    cell = f.__closure__[f.__code__.co_freevars.index("m")]

    def write(v):
        cell.cell_contents = v

    return quad(f, [lambda: write(4.0), lambda: write(-1.0)], m=lambda: cell.cell_contents)


@case()
def case_closure_list(env):
    coef, tick = [1.0], env.tick

    def f(w):
        tick()
        return (coef[0] * w**2).sum()

    def set_item():
        coef[0] = 3.0

    return quad(f, [set_item, lambda: coef.insert(0, 0.5)], a=lambda: coef[0])


@case()
def case_closure_nested(env):
    tick = env.tick

    def outer():
        m = 0.0

        def middle():
            def f(w):
                tick()
                return ((w - m) ** 2).sum()

            def bump():
                nonlocal m
                m += 1.5

            return f, bump

        return middle(), lambda: m

    (f, bump), get_m = outer()
    return quad(f, [bump, bump], m=get_m)


@case()
def case_defaults(env):
    tick = env.tick

    def f(w, m=0.0):
        tick()
        return ((w - m) ** 2).sum()

    def first():
        f.__defaults__ = (2.0,)

    def second():
        f.__defaults__ = (-1.0,)

    return quad(f, [first, second], m=lambda: f.__defaults__[0])


@case()
def case_kwdefaults(env):
    tick = env.tick

    def f(w, *, a=1.0):
        tick()
        return (a * w**2).sum()

    def replace():
        f.__kwdefaults__ = {"a": 2.0}

    def in_place():
        f.__kwdefaults__["a"] = 0.5

    return quad(f, [replace, in_place], a=lambda: f.__kwdefaults__["a"])


@case()
def case_mutable_default(env):
    tick = env.tick

    def f(w, cfg=[0.0]):  # noqa: B006 - the shared default list is the state under test
        tick()
        return ((w - cfg[0]) ** 2).sum()

    muts = [
        lambda: f.__defaults__[0].__setitem__(0, 1.0),
        lambda: f.__defaults__[0].insert(0, -2.0),
    ]
    return quad(f, muts, m=lambda: f.__defaults__[0][0])


@case()
def case_helper_redefined(env):
    """A global helper redefined under the same name (the function looks it up each call)."""
    tick = env.tick
    ns = {"tick": tick}
    exec("def helper(w):\n    return (w ** 2).sum()\n", ns)
    exec("def f(w):\n    tick()\n    return helper(w)\n", ns)
    st = NS(a=1.0, m=0.0)

    def redefine():
        exec("def helper(w):\n    return (3.0 * (w - 1.0) ** 2).sum()\n", ns)
        st.a, st.m = 3.0, 1.0

    def redefine_again():
        exec("def helper(w):\n    return (0.5 * (w + 2.0) ** 2).sum()\n", ns)
        st.a, st.m = 0.5, -2.0

    return quad(ns["f"], [redefine, redefine_again], a=lambda: st.a, m=lambda: st.m)


@case()
def case_code_swapped(env):
    tick = env.tick

    def f(w):
        tick()
        return (w * w).sum()

    def g(w):
        tick()
        return (2.0 * (w - 1.0) ** 2).sum()

    def h(w):
        tick()
        return (0.25 * (w + 3.0) ** 2).sum()

    st = NS(a=1.0, m=0.0)

    def swap(other, a, m):
        f.__code__ = other.__code__
        st.a, st.m = a, m

    muts = [lambda: swap(g, 2.0, 1.0), lambda: swap(h, 0.25, -3.0)]
    return quad(f, muts, a=lambda: st.a, m=lambda: st.m)


# ---- modules and globals ---------------------------------------------------------------------

MODULE_CENTER = 0.0
GLOBAL_SCALE = 1.0
_THIS = sys.modules[__name__]


def _set_global_scale(v):
    global GLOBAL_SCALE
    GLOBAL_SCALE = v


@case()
def case_module_type_attr(env):
    mod, tick = types.ModuleType("nablax_soundness_cfg"), env.tick
    mod.scale = 1.0

    def f(w):
        tick()
        return (mod.scale * w**2).sum()

    def set_attr():
        mod.scale = 2.0

    return quad(f, [set_attr, lambda: mod.__dict__.update(scale=0.25)], a=lambda: mod.scale)


@case()
def case_module_hasattr_flag(env):
    mod, tick = types.ModuleType("nablax_soundness_flags"), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if hasattr(mod, "flag"):
            out = out + (3.0 * w).sum()
        return out

    def add():
        mod.flag = True

    def remove():
        del mod.flag

    return quad(f, [add, remove], b=lambda: 3.0 if hasattr(mod, "flag") else 0.0)


@case()
def case_import_statement(env):
    name = "nablax_soundness_imported"
    first, tick = types.ModuleType(name), env.tick
    first.center = 1.0
    env.mp.setitem(sys.modules, name, first)

    def f(w):
        tick()
        import nablax_soundness_imported as cfg

        return ((w - cfg.center) ** 2).sum()

    def replace_module():
        second = types.ModuleType(name)
        second.center = -1.0
        sys.modules[name] = second

    def change_attr():
        sys.modules[name].center = 2.0

    return quad(f, [replace_module, change_attr], m=lambda: sys.modules[name].center)


@case()
def case_real_module_attr(env):
    tick = env.tick
    env.mp.setattr(_THIS, "MODULE_CENTER", 0.0)

    def f(w):
        tick()
        return ((w - _THIS.MODULE_CENTER) ** 2).sum()

    muts = [
        lambda: env.mp.setattr(_THIS, "MODULE_CENTER", 1.0),
        lambda: env.mp.setattr(_THIS, "MODULE_CENTER", -3.0),
    ]
    return quad(f, muts, m=lambda: MODULE_CENTER)


@case()
def case_global_statement_rebind(env):
    tick = env.tick
    env.defer(_set_global_scale, GLOBAL_SCALE)

    def f(w):
        tick()
        return (GLOBAL_SCALE * w**2).sum()

    muts = [lambda: _set_global_scale(2.0), lambda: _set_global_scale(-0.5)]
    return quad(f, muts, a=lambda: GLOBAL_SCALE)


@case()
def case_builtin_then_global_shadow(env):
    tick = env.tick
    ns = {"tick": tick}
    exec("def f(w):\n    tick()\n    return (NX_SOUND_K * w ** 2).sum()\n", ns)
    env.mp.setattr(builtins, "NX_SOUND_K", 1.0, raising=False)

    def change_builtin():
        builtins.NX_SOUND_K = 2.0

    def shadow_with_global():
        ns["NX_SOUND_K"] = -0.5

    muts = [change_builtin, shadow_with_global]
    return quad(ns["f"], muts, a=lambda: ns.get("NX_SOUND_K", builtins.NX_SOUND_K))


# ---- containers, NumPy arrays, tensors -------------------------------------------------------


@case()
def case_dict_item(env):
    cfg, tick = {"a": 1.0, "m": 0.0}, env.tick

    def f(w):
        tick()
        return (cfg["a"] * (w - cfg["m"]) ** 2).sum()

    def set_item():
        cfg["m"] = 2.0

    muts = [set_item, lambda: cfg.update(a=0.5, m=-1.0)]
    return quad(f, muts, a=lambda: cfg["a"], m=lambda: cfg["m"])


@case()
def case_list_slices(env):
    coefs, tick = [1.0, 0.0, 99.0], env.tick

    def f(w):
        tick()
        a, m = coefs[0:2]
        return (a * (w - m) ** 2).sum()

    def slice_assign():
        coefs[0:2] = [2.0, 1.5]

    def slice_insert():
        coefs[:0] = [0.5, -1.0]

    return quad(f, [slice_assign, slice_insert], a=lambda: coefs[0], m=lambda: coefs[1])


@case()
def case_nested_containers(env):
    cfg, tick = {"layers": [{"scale": 1.0}], "center": (0.0,)}, env.tick

    def f(w):
        tick()
        return (cfg["layers"][0]["scale"] * (w - cfg["center"][0]) ** 2).sum()

    def deep_write():
        cfg["layers"][0]["scale"] = 2.0

    def replace_inner():
        cfg["layers"][0] = {"scale": 0.5}
        cfg["center"] = (1.5,)

    a, m = lambda: cfg["layers"][0]["scale"], lambda: cfg["center"][0]
    return quad(f, [deep_write, replace_inner], a=a, m=m)


@case()
def case_set_membership(env):
    modes, tick = set(), env.tick

    def f(w):
        tick()
        out = (w**2).sum()
        if "tilt" in modes:
            out = out + (2.0 * w).sum()
        return out

    muts = [lambda: modes.add("tilt"), lambda: modes.symmetric_difference_update({"tilt", "x"})]
    return quad(f, muts, b=lambda: 2.0 if "tilt" in modes else 0.0)


@case()
def case_numpy_captured_inplace(env):
    center, tick = np.zeros(3, np.float32), env.tick

    def f(w):
        tick()
        return ((w - center) ** 2).sum()

    def write():
        center[:] = [1.0, -1.0, 0.5]

    def add_in_place():
        np.add(center, 2.0, out=center)

    return quad(f, [write, add_in_place], m=lambda: center.copy())


@case()
def case_numpy_argument_inplace(env):
    scale, tick = np.ones(3, np.float32), env.tick

    def f(w, s):
        tick()
        return (w**2 * s).sum()

    def scale_up():
        scale[...] *= 2.0

    def write_one():
        scale[1] = -1.0

    return quad(f, [scale_up, write_one], a=lambda: scale.copy(), args=lambda: (scale,))


def _tensor_before_mutation(offset_bytes):
    def make(env):
        src, tick = _aligned(3, offset_bytes), env.tick
        src[:] = [1.0, -2.0, 0.5]
        old = src.astype(np.float64)
        t = nx.tensor(src)  # copies: later writes to src must not reach t

        def f(w):
            tick()
            return ((w - t) ** 2).sum()

        def fill():
            src[:] = 9.0

        def add_in_place():
            src[...] += 1.0

        return quad(f, [fill, add_in_place], m=lambda: old)

    return make


CASES["tensor_copies_aligned_numpy"] = Case(
    "tensor_copies_aligned_numpy", _tensor_before_mutation(0)
)
CASES["tensor_copies_unaligned_numpy"] = Case(
    "tensor_copies_unaligned_numpy", _tensor_before_mutation(16)
)


# ---- callables: partial, bound methods, __call__ ---------------------------------------------


@case()
def case_partial_mutable_arg(env):
    cfg, tick = {"a": 1.0, "m": 0.0}, env.tick

    def loss(cfg, w):
        tick()
        return (cfg["a"] * (w - cfg["m"]) ** 2).sum()

    muts = [lambda: cfg.update(a=2.0), lambda: cfg.update(m=1.0)]
    fn = functools.partial(loss, cfg)
    return quad(fn, muts, a=lambda: cfg["a"], m=lambda: cfg["m"])


@case()
def case_partial_keywords(env):
    tick = env.tick

    def loss(w, *, m):
        tick()
        return ((w - m) ** 2).sum()

    p = functools.partial(loss, m=0.0)
    muts = [lambda: p.keywords.update(m=1.0), lambda: p.keywords.update(m=-2.0)]
    return quad(p, muts, m=lambda: p.keywords["m"])


@case()
def case_bound_method(env):
    tick = env.tick

    class Model:
        def __init__(self):
            self.center = 0.0

        def loss(self, w):
            tick()
            return ((w - self.center) ** 2).sum()

    model = Model()

    def move():
        model.center = 1.0

    def move_again():
        model.center = -2.0

    return quad(model.loss, [move, move_again], m=lambda: model.center)


@case()
def case_method_replaced(env):
    class Model:
        def penalty(self, w):
            return (w**2).sum()

        def loss(self, w):
            tick()
            return self.penalty(w)

    model, tick, st = Model(), env.tick, NS(a=1.0, m=0.0)

    def on_class():
        Model.penalty = lambda self, w: ((w - 1.0) ** 2).sum()
        st.m = 1.0

    def on_instance():
        model.penalty = lambda w: (3.0 * w**2).sum()
        st.a, st.m = 3.0, 0.0

    return quad(model.loss, [on_class, on_instance], a=lambda: st.a, m=lambda: st.m)


@case()
def case_callable_object(env):
    tick = env.tick

    class Loss:
        def __init__(self):
            self.m, self.a = 0.0, 1.0

        def __call__(self, w):
            tick()
            return (self.a * (w - self.m) ** 2).sum()

    obj = Loss()

    def state():
        obj.m = 2.0

    def new_call(self, w):
        tick()
        return (3.0 * (w - self.m) ** 2).sum()

    def replace_dunder():
        Loss.__call__ = new_call
        obj.a = 3.0

    return quad(obj, [state, replace_dunder], a=lambda: obj.a, m=lambda: obj.m)


# ---- environment, side effects ---------------------------------------------------------------


@case()
def case_environ(env):
    var, tick = "NABLAX_SOUNDNESS_CENTER", env.tick
    env.mp.setenv(var, "0.0")

    def f(w):
        tick()
        return ((w - float(os.environ.get(var, "-1.0"))) ** 2).sum()

    muts = [lambda: env.mp.setenv(var, "1.5"), lambda: env.mp.delenv(var)]
    return quad(f, muts, m=lambda: float(os.environ.get(var, "-1.0")))


@case()
def case_print_fstring(env):
    stream, tick, st = io.StringIO(), env.tick, NS(m=0.0)

    def f(w):
        tick()
        print(f"center={st.m:+.2f} shape={w.shape}", file=stream)
        return ((w - st.m) ** 2).sum()

    def check():
        lines = stream.getvalue().splitlines()
        assert len(lines) == env.made
        assert lines[-1] == f"center={st.m:+.2f} shape=(3,)"

    muts = [lambda: setattr(st, "m", 0.75), lambda: setattr(st, "m", -1.25)]
    return quad(f, muts, m=lambda: st.m, check=check)


@case()
def case_logging(env):
    records = []
    log = logging.getLogger(f"nablax.soundness.{id(records)}")
    handler = logging.Handler()
    handler.emit = records.append
    log.addHandler(handler)
    log.propagate = False
    log.setLevel(logging.DEBUG)
    env.defer(log.removeHandler, handler)
    tick = env.tick

    def f(w):
        tick()
        log.warning("step at center %s", 0.0)
        out = (w**2).sum()
        if log.isEnabledFor(logging.DEBUG):
            out = out + w.sum()
        return out

    def check():
        assert [r.getMessage() for r in records] == ["step at center 0.0"] * env.made

    muts = [lambda: log.setLevel(logging.INFO), lambda: log.setLevel(logging.DEBUG)]
    b = lambda: 1.0 if log.isEnabledFor(logging.DEBUG) else 0.0
    return quad(f, muts, b=b, check=check)


@case()
def case_nonlocal_counter_value(env):
    """The value depends on how often the body ran: a skipped run shows up in the gradient."""
    tick = env.tick

    def factory():
        n = 0

        def f(w):
            nonlocal n
            tick()
            n += 1
            return (n * w**2).sum()

        def reset(v):
            nonlocal n
            n = v

        return f, reset, lambda: n

    f, reset, get_n = factory()
    return quad(f, [lambda: reset(10), lambda: reset(-3)], a=get_n)


_GLOBAL_RUNS = 0


def _global_counter_fn(w, tick):
    global _GLOBAL_RUNS
    tick()
    _GLOBAL_RUNS += 1
    return ((_GLOBAL_RUNS % 4) * w**2).sum()


def _set_global_runs(v):
    global _GLOBAL_RUNS
    _GLOBAL_RUNS = v


@case()
def case_global_statement_counter(env):
    env.defer(_set_global_runs, _GLOBAL_RUNS)

    def reset(v):
        _set_global_runs(v)

    muts = [lambda: reset(101), lambda: reset(6)]
    fn = functools.partial(_global_counter_fn, tick=env.tick)
    return quad(fn, muts, a=lambda: _GLOBAL_RUNS % 4)


@case()
def case_list_append_history(env):
    hist, tick = [], env.tick

    def f(w):
        tick()
        hist.append(len(hist))
        return (0.5 * len(hist) * w**2).sum()

    def refill():
        hist[:] = [0] * 5

    return quad(f, [hist.clear, refill], a=lambda: 0.5 * len(hist))


# ---- randomness, clocks: each call draws anew -----------------------------------------------


def _draws_differ(seen):
    def check():
        if len(seen) >= 2:
            assert not np.array_equal(seen[-1], seen[-2]), "a call reused the previous draw"

    return check


@case()
def case_python_random(env):
    env.defer(random.setstate, random.getstate())
    seen, tick = [], env.tick

    def f(w):
        tick()
        r = random.random()
        seen.append(r)
        return (r * (w - 1.0) ** 2).sum()

    muts = [lambda: random.seed(1234), lambda: random.seed(1234)]
    return quad(f, muts, a=lambda: seen[-1], m=lambda: 1.0, check=_draws_differ(seen))


@case()
def case_numpy_rng(env):
    st, seen, tick = NS(rng=np.random.default_rng(0)), [], env.tick

    def f(w):
        tick()
        v = st.rng.standard_normal(3)
        seen.append(v)
        return (w**2 * v).sum()

    muts = [lambda: setattr(st, "rng", np.random.default_rng(7)), lambda: st.rng.standard_normal(5)]
    return quad(f, muts, a=lambda: seen[-1], check=_draws_differ(seen))


@case()
def case_nx_random_global_key(env):
    env.defer(nx.random.seed, 0)
    seen, tick = [], env.tick

    def f(w):
        tick()
        z = nx.random.normal(shape=(3,))
        seen.append(z)
        return ((w - z) ** 2).sum()

    draws = []

    def check():
        draws.append(seen[-1].numpy())
        _draws_differ(draws)()

    muts = [lambda: nx.random.seed(11), lambda: nx.random.seed(11)]
    return quad(f, muts, m=lambda: seen[-1].numpy(), check=check)


@case()
def case_time_counter(env):
    clock = itertools.count(100)
    env.mp.setattr(time, "time", lambda: next(clock) * 0.5)
    seen, tick = [], env.tick

    def f(w):
        tick()
        t = time.time()
        seen.append(t)
        return ((t % 4.0) * w**2).sum()

    def jump():
        for _ in range(7):
            next(clock)

    return quad(f, [jump, jump], a=lambda: seen[-1] % 4.0, check=_draws_differ(seen))


# ---- exceptions, iterators, interpreter state -------------------------------------------------


@case()
def case_raise_on_state(env):
    st, tick = NS(bad=False, m=0.0), env.tick

    def f(w):
        tick()
        out = ((w - st.m) ** 2).sum()
        if st.bad:
            raise ValueError("state says stop")
        return out

    def recover():
        st.bad, st.m = False, 2.0

    muts = [lambda: setattr(st, "bad", True), recover]
    return quad(f, muts, m=lambda: st.m, raises=lambda: ValueError if st.bad else None)


@case()
def case_keyerror_fallback(env):
    table, tick = {}, env.tick

    def f(w):
        tick()
        try:
            m = table["m"]
        except KeyError:
            m = -1.0
        return ((w - m) ** 2).sum()

    muts = [lambda: table.update(m=2.0), table.clear]
    return quad(f, muts, m=lambda: table.get("m", -1.0))


@case()
def case_generator_next(env):
    st, seen, tick = NS(it=(0.5 * k for k in itertools.count(1))), [], env.tick

    def f(w):
        tick()
        a = next(st.it)
        seen.append(a)
        return (a * w**2).sum()

    muts = [lambda: setattr(st, "it", iter([3.0, -1.0] * 4)), lambda: next(st.it)]
    return quad(f, muts, a=lambda: seen[-1])


@case()
def case_genexpr_over_state(env):
    coefs, tick = [1.0, -5.0], env.tick

    def f(w):
        tick()
        a = sum(x for x in coefs if x > 0)
        return (a * w**2).sum()

    muts = [lambda: coefs.append(2.0), lambda: coefs.__setitem__(0, 0.25)]
    return quad(f, muts, a=lambda: sum(x for x in coefs if x > 0))


@case()
def case_recursion_limit(env):
    old, tick = sys.getrecursionlimit(), env.tick
    env.defer(sys.setrecursionlimit, old)

    def f(w):
        tick()
        return (sys.getrecursionlimit() / old * w**2).sum()

    muts = [lambda: sys.setrecursionlimit(old + old // 2), lambda: sys.setrecursionlimit(old * 2)]
    return quad(f, muts, a=lambda: sys.getrecursionlimit() / old)


@case()
def case_numpy_printoptions(env):
    old, tick = np.get_printoptions()["precision"], env.tick
    env.defer(lambda: np.set_printoptions(precision=old))

    def f(w):
        tick()
        return (np.get_printoptions()["precision"] / 8 * w**2).sum()

    muts = [lambda: np.set_printoptions(precision=4), lambda: np.set_printoptions(precision=12)]
    return quad(f, muts, a=lambda: np.get_printoptions()["precision"] / 8)


@case()
def case_contextvar(env):
    var, tick = contextvars.ContextVar("nablax_soundness_m", default=0.0), env.tick

    def f(w):
        tick()
        return ((w - var.get()) ** 2).sum()

    return quad(f, [lambda: var.set(2.0), lambda: var.set(-1.0)], m=var.get)


@case()
def case_thread_local(env):
    tl, tick = threading.local(), env.tick
    tl.a = 1.0

    def f(w):
        tick()
        return (getattr(tl, "a", 0.25) * w**2).sum()

    muts = [lambda: setattr(tl, "a", 3.0), lambda: delattr(tl, "a")]
    return quad(f, muts, a=lambda: getattr(tl, "a", 0.25))


@case()
def case_weakref_target(env):
    class Anchor:
        m = 1.0

    st, tick = NS(strong=Anchor()), env.tick
    ref = weakref.ref(st.strong)

    def f(w):
        tick()
        target = ref()
        return ((w - (target.m if target is not None else -2.0)) ** 2).sum()

    def move():
        st.strong.m = 3.0

    def drop():
        st.strong = None  # the last strong reference: the weakref dies

    return quad(f, [move, drop], m=lambda: ref().m if ref() is not None else -2.0)


# ---- Python scalars (baked constants), control flow on realized values ------------------------


@case()
def case_scalar_argument(env):
    st, tick = NS(s=2.0), env.tick

    def f(w, s):
        tick()
        return (s * (w - 1.0) ** 2).sum()

    muts = [lambda: setattr(st, "s", -0.5), lambda: setattr(st, "s", 3)]
    return quad(f, muts, a=lambda: st.s, m=lambda: 1.0, args=lambda: (st.s,))


@case()
def case_scalar_exponent(env):
    st, tick = NS(p=2), env.tick

    def f(w, p):
        tick()
        return (w**p).sum()

    p = lambda: st.p
    return Built(
        f,
        lambda w: float(np.sum(w ** p())),
        lambda w: p() * w ** (p() - 1),
        lambda w: np.diag(p() * (p() - 1) * w ** (p() - 2)),
        (lambda: setattr(st, "p", 3), lambda: setattr(st, "p", 2.0)),
        args=lambda: (st.p,),
    )


@case()
def case_scalar_in_creation_op(env):
    st, tick = NS(m=0.0), env.tick

    def f(w):
        tick()
        return ((w - nx.full((3,), st.m)) ** 2).sum()

    muts = [lambda: setattr(st, "m", 1.25), lambda: setattr(st, "m", -0.0)]
    return quad(f, muts, m=lambda: st.m)


@case()
def case_item_branch_on_captured_tensor(env):
    st, tick = NS(gate=nx.tensor([1.0, 1.0, 1.0])), env.tick

    def f(w):
        tick()
        if st.gate.sum().item() > 0:
            return ((w - 1.0) ** 2).sum()
        return (2.0 * w**2).sum()

    def flip():
        st.gate = nx.tensor([-1.0, 0.0, 0.0])

    def flip_back_pending():
        st.gate = st.gate * -3.0  # a pending tensor, realized by .item() inside f

    pos = lambda: float(st.gate.numpy().sum()) > 0
    a, m = lambda: 1.0 if pos() else 2.0, lambda: 1.0 if pos() else 0.0
    return quad(f, [flip, flip_back_pending], a=a, m=m)


@case(no_vmap="a Python `if` on a per-example value cannot run under vmap")
def case_item_branch_on_input(env):
    st, tick = NS(threshold=0.0), env.tick

    def f(w):
        tick()
        if w.sum().item() > st.threshold:
            return ((w - 1.0) ** 2).sum()
        return (0.5 * w**2).sum()

    muts = [lambda: setattr(st, "threshold", 1.1), lambda: setattr(st, "threshold", 5.0)]
    built = quad(f, muts)
    above = lambda w: w.sum() > st.threshold
    built.value = lambda w: float(np.sum((w - 1.0) ** 2 if above(w) else 0.5 * w**2))
    built.grad = lambda w: 2.0 * (w - 1.0) if above(w) else w
    built.hess = lambda w: np.diag((2.0 if above(w) else 1.0) * np.ones_like(w))
    return built


@case()
def case_realized_intermediate(env):
    """Realizing an intermediate inside ``f`` (state-dependent) changes which forward nodes hold
    values: the backward plan must not mix the two structures."""
    st, tick = NS(peek=False, a=1.0), env.tick

    def f(w):
        tick()
        h = st.a * w
        if st.peek:
            nx.realize(h)
        return (h * w).sum()

    def peek():
        st.peek = True

    def both():
        st.peek, st.a = False, 2.0

    return quad(f, [peek, both], a=lambda: st.a)


# ---- newer syntax and opcodes ------------------------------------------------------------------


@case()
def case_walrus(env):
    st, tick = NS(k=0.5), env.tick

    def f(w):
        tick()
        if (k := st.k) > 1.0:
            return (k * w**2).sum()
        return ((w - k) ** 2).sum()

    muts = [lambda: setattr(st, "k", 2.0), lambda: setattr(st, "k", -1.0)]
    big = lambda: st.k > 1.0
    a, m = lambda: st.k if big() else 1.0, lambda: 0.0 if big() else st.k
    return quad(f, muts, a=a, m=m)


@case()
def case_match_statement(env):
    st, tick = NS(mode="plain", want=(1.0, 0.0)), env.tick

    def f(w):
        tick()
        match st.mode:
            case "plain":
                a, m = 1.0, 0.0
            case ("scaled", s):
                a, m = s, 0.0
            case {"center": m0}:
                a, m = 1.0, m0
        return (a * (w - m) ** 2).sum()

    def scaled():
        st.mode, st.want = ("scaled", 2.5), (2.5, 0.0)

    def centered():
        st.mode, st.want = {"center": -1.5}, (1.0, -1.5)

    return quad(f, [scaled, centered], a=lambda: st.want[0], m=lambda: st.want[1])


@case()
def case_fstring_roundtrip(env):
    st, tick = NS(m=0.0), env.tick

    def f(w):
        tick()
        return ((w - float(f"{st.m:.1f}")) ** 2).sum()

    muts = [lambda: setattr(st, "m", 1.26), lambda: setattr(st, "m", -0.74)]
    return quad(f, muts, m=lambda: {0.0: 0.0, 1.26: 1.3, -0.74: -0.7}[st.m])


@case()
def case_list_comprehension(env):
    coefs, tick = [0.5, -1.0], env.tick

    def f(w):
        tick()
        a = sum([x for x in coefs if x > 0])
        return (a * w**2).sum()

    muts = [lambda: coefs.append(1.5), lambda: coefs.__setitem__(slice(None), [-2.0, 0.25])]
    return quad(f, muts, a=lambda: sum(x for x in coefs if x > 0))


# ---- nx.compile helper inside eager transforms ---------------------------------------------------


@case()
def case_compiled_helper_inline(env):
    """A compiled helper called on differentiated/vmapped tensors runs inline: its body (and the
    state it reads) runs on every call."""

    class Cfg:
        m = 0.0

    tick, inner = env.tick, Counter()

    @nx.compile
    def sq(w):
        inner.tick()
        return (w - Cfg.m) ** 2

    def f(w):
        tick()
        return sq(w).sum()

    def check():
        assert inner.n == env.made

    def move():
        Cfg.m = 1.5

    def move_again():
        Cfg.m = -0.5

    return quad(f, [move, move_again], m=lambda: Cfg.m, check=check)
